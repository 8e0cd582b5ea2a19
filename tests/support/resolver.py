"""A DNS resolver answering from a table the test edits: a name maps to IP addresses, or to
the :class:`ResolveError` resolving it raises. It implements the router's ``Resolver`` seam
(the system resolver cannot be told to change its answers), so DNS discovery's reactions to
scaling and failures are tested with the real ``DnsDiscovery`` on top."""

from __future__ import annotations

from services.router.discovery.dns import NameNotFound, ResolveError, format_address


class TableResolver:
    def __init__(self) -> None:
        self.table: dict[str, list[str] | ResolveError] = {}
        self.calls = 0

    async def resolve(self, host: str, port: int) -> list[str]:
        self.calls += 1
        answer = self.table.get(host, NameNotFound(f"{host}: unknown"))
        if isinstance(answer, ResolveError):
            raise answer
        return sorted(format_address(ip, port) for ip in answer)
