"""``python -m services.common.healthcheck``: a container health check for Meridian's own
endpoints, exit 0 when healthy and 1 when not (2 for bad arguments), one line on stderr.

    python -m services.common.healthcheck http http://127.0.0.1:8080/readyz
    python -m services.common.healthcheck grpc 127.0.0.1:50061 [--service meridian.v1.Worker]
    python -m services.common.healthcheck tcp 127.0.0.1:7001 127.0.0.1:7002

- ``http``: a GET answered 2xx (the edge's ``/readyz``: Redis answers, a model is servable);
- ``grpc``: the standard gRPC health service says SERVING (a worker says NOT_SERVING while
  its model loads; the router once it listens);
- ``tcp``: every address accepts a connection (the delay proxy, which has no protocol).

Compose runs it every few seconds in every container, so it is kept cheap: the standard
library only, except ``grpc`` (imported for that kind alone).
"""

from __future__ import annotations

import argparse
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import TYPE_CHECKING

from services.common import cli

if TYPE_CHECKING:
    from services.common.grpc_tls import GrpcTls


def check_http(url: str, timeout_s: float) -> str | None:
    """None when healthy, else why not."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # our URL
            return None if 200 <= resp.status < 300 else f"{url}: HTTP {resp.status}"
    except urllib.error.HTTPError as err:
        return f"{url}: HTTP {err.code}"
    except (urllib.error.URLError, OSError) as err:
        return f"{url}: {getattr(err, 'reason', err)}"


def check_grpc(
    address: str, service: str, timeout_s: float, tls: GrpcTls | None = None
) -> str | None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    if tls is None:
        channel = grpc.insecure_channel(address)
    else:
        channel = grpc.secure_channel(
            address, tls.channel_credentials(), options=tls.channel_options()
        )
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            request = health_pb2.HealthCheckRequest(service=service)
            reply = stub.Check(request, timeout=timeout_s)  # type: ignore[attr-defined]
        except grpc.RpcError as err:
            return f"{address}: {err.code().name}"
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        return f"{address}: {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}"
    return None


def check_tcp(addresses: Sequence[str], timeout_s: float) -> str | None:
    for address in addresses:
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
                pass
        except OSError as err:
            return f"{address}: {err.strerror or err}"
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m services.common.healthcheck",
        description="Exit 0 if a Meridian endpoint is healthy, 1 if not.",
    )
    parser.add_argument("--timeout-s", type=cli.positive_float, default=2.0)
    kinds = parser.add_subparsers(dest="kind", required=True)
    http = kinds.add_parser("http", help="a GET answered 2xx")
    http.add_argument("url")
    grpc_parser = kinds.add_parser("grpc", help="the gRPC health service says SERVING")
    grpc_parser.add_argument("address", type=cli.address, metavar="HOST:PORT")
    grpc_parser.add_argument("--service", default="", help="health service name ('' = server)")
    # The services' mutual-TLS flags (services/common/grpc_tls.py), named here so that an
    # http or tcp check does not import grpc or cryptography.
    for flag in ("cert", "key", "ca", "server-name"):
        grpc_parser.add_argument(f"--grpc-tls-{flag}", help="as on the services")
    tcp = kinds.add_parser("tcp", help="every address accepts a TCP connection")
    tcp.add_argument("addresses", nargs="+", type=cli.address, metavar="HOST:PORT")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.kind == "http":
        if not args.url.startswith(("http://", "https://")):
            build_parser().error(f"url {args.url!r}: expected http:// or https://")
        problem = check_http(args.url, args.timeout_s)
    elif args.kind == "grpc":
        from services.common.grpc_tls import from_arguments

        try:
            tls = from_arguments(args)
        except ValueError as err:
            build_parser().error(str(err))
        problem = check_grpc(args.address, args.service, args.timeout_s, tls)
    else:
        problem = check_tcp(args.addresses, args.timeout_s)
    if problem is not None:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
