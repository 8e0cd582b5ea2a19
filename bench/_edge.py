"""What the benchmarks that start the local stack share."""

from __future__ import annotations

#: Every benchmark's load comes from one client IP: lift the edge's per-IP abuse limits
#: (requests/s, streams, connections), which would otherwise throttle the load generator.
ONE_CLIENT_EDGE_ARGS: tuple[str, ...] = (
    "--ip-requests-per-s",
    "0",
    "--max-streams-per-ip",
    "10000",
    "--max-connections-per-ip",
    "10000",
)
