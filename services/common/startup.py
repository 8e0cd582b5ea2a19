"""Start-up failures an operator fixes, not debugs: a port already taken, an address that is
not this machine's, a dependency that does not answer. The service prints one line naming the
problem (``python -m services.edge: error: cannot listen on 127.0.0.1:8080 for the public API:
address already in use``) and exits with status 1, instead of a traceback
(:func:`services.common.runtime.run` does the printing).
"""

from __future__ import annotations

import os

import grpc
from aiohttp import web

from services.common.grpc_tls import GrpcTls


class StartupError(Exception):
    """The service cannot start; the message says why, in the operator's terms."""


def listen_failed(what: str, host: str, port: int, err: OSError) -> StartupError:
    reason = os.strerror(err.errno) if err.errno else str(err)
    return StartupError(f"cannot listen on {host}:{port} for {what}: {reason.lower()}")


def bind_grpc(
    server: grpc.aio.Server, host: str, port: int, what: str, tls: GrpcTls | None = None
) -> int:
    """``server.add_insecure_port`` (``add_secure_port`` with mutual TLS) with a clear error
    (gRPC only says "Failed to bind")."""
    try:
        if tls is not None:
            return server.add_secure_port(f"{host}:{port}", tls.server_credentials())
        return server.add_insecure_port(f"{host}:{port}")
    except RuntimeError:
        raise StartupError(
            f"cannot listen on {host}:{port} for {what}: the port is taken, or the address "
            "is not one of this machine's"
        ) from None


async def start_site(site: web.TCPSite, what: str, host: str, port: int) -> None:
    """``site.start()`` with a clear error."""
    try:
        await site.start()
    except OSError as err:
        raise listen_failed(what, host, port, err) from None
