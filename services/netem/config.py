"""What one emulated link looks like (``LinkProfile``) and one proxied route (``Route``), plus
the parser for the command line's route syntax.

Route syntax (one ``--route`` each)::

    NAME:LISTEN_HOST:LISTEN_PORT=UPSTREAM_HOST:UPSTREAM_PORT,delay_ms=40[,jitter_ms=2,loss=0.01,rto_ms=200,seed=7]

``delay_ms`` is required (a route whose distance was forgotten should not silently be local);
the rest default to a clean link. IPv6 hosts go in brackets: ``kr:[::1]:0=[::1]:50051,...``.
Every error is an :class:`~services.common.errors.InvalidRequest` whose ``param`` names the
route and key (``route[kr].delay_ms``), so the CLI can say exactly what is wrong.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TypeVar

from services.common.errors import InvalidRequest

DEFAULT_RTO_MS = 200.0
"""Linux's minimum TCP retransmission timeout: what one lost segment costs a live stream."""

_Num = TypeVar("_Num", int, float)
_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
_LINK_KEYS = ("delay_ms", "jitter_ms", "loss", "rto_ms", "seed")


MAX_DELAY_MS = 60_000.0
"""The longest delay, jitter or retransmission timeout a link may have: a minute one way is
already no network at all (a cut link is ``loss=1``), and 1e12 ms froze the link for good."""


def _finite_non_negative(value: float, param: str) -> None:
    if not math.isfinite(value) or not 0 <= value <= MAX_DELAY_MS:
        raise InvalidRequest(
            f"{param} must be a finite number >= 0 and <= {MAX_DELAY_MS:g}, got {value!r}",
            param=param,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkProfile:
    """One direction's impairments; both directions of a route use the same profile.

    - ``delay_ms``: one-way delay added to every chunk (the RTT grows by twice this).
    - ``jitter_ms``: each chunk's delay is ``delay_ms + U(-jitter_ms, +jitter_ms)``, clamped at
      0; a chunk is never released before the one ahead of it, so jitter never reorders bytes.
    - ``loss``: probability in [0, 1] that a chunk suffers a retransmission stall. Bytes cannot
      be dropped inside a TCP stream, so loss shows up the way it does to a TCP application: the
      chunk (and, head-of-line, everything behind it) arrives ``rto_ms`` late.
    - ``rto_ms``: the stall one loss costs.
    - ``seed``: jitter and loss are drawn from a PRNG seeded with this, the route and the
      connection's ordinal, so a run is reproducible.
    """

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss: float = 0.0
    rto_ms: float = DEFAULT_RTO_MS
    seed: int = 0

    def __post_init__(self) -> None:
        _finite_non_negative(self.delay_ms, "delay_ms")
        _finite_non_negative(self.jitter_ms, "jitter_ms")
        _finite_non_negative(self.rto_ms, "rto_ms")
        if not (math.isfinite(self.loss) and 0.0 <= self.loss <= 1.0):
            raise InvalidRequest(f"loss must be within [0, 1], got {self.loss!r}", param="loss")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise InvalidRequest(f"seed must be an integer, got {self.seed!r}", param="seed")


def _check_port(port: int, param: str, *, allow_zero: bool) -> None:
    low = 0 if allow_zero else 1
    if isinstance(port, bool) or not isinstance(port, int) or not low <= port <= 65535:
        raise InvalidRequest(
            f"{param} must be an integer in [{low}, 65535], got {port!r}", param=param
        )


def _check_host(host: str, param: str) -> None:
    if not host or any(c.isspace() for c in host):
        raise InvalidRequest(f"{param} must be a host name or address, got {host!r}", param=param)


@dataclass(frozen=True, slots=True, kw_only=True)
class Route:
    """One proxied route: listen here, forward to upstream, impair with ``link``.

    ``listen_port`` 0 asks the OS for a free port; the proxy reports the port it bound. Give
    ``listen_host`` as an address: a name that resolves to several (``localhost``: 127.0.0.1
    and ::1) is bound on each, on different free ports, and only the first is reported.
    """

    name: str
    upstream_host: str
    upstream_port: int
    listen_host: str = "127.0.0.1"
    listen_port: int = 0
    link: LinkProfile = field(default_factory=LinkProfile)

    def __post_init__(self) -> None:
        if not _NAME_RE.fullmatch(self.name):
            raise InvalidRequest(
                f"route name must match {_NAME_RE.pattern}, got {self.name!r}", param="name"
            )
        _check_host(self.listen_host, "listen_host")
        _check_host(self.upstream_host, "upstream_host")
        _check_port(self.listen_port, "listen_port", allow_zero=True)
        _check_port(self.upstream_port, "upstream_port", allow_zero=False)


def _split_host_port(text: str, what: str, route: str) -> tuple[str, str]:
    """``host:port`` or ``[v6]:port`` → (host, port text)."""
    param = f"route[{route}].{what}"
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise InvalidRequest(f"{param}: expected [HOST]:PORT, got {text!r}", param=param)
        return host, rest[1:]
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise InvalidRequest(f"{param}: expected HOST:PORT, got {text!r}", param=param)
    return host, port


def _parse_value(route: str, key: str, text: str, kind: type[_Num]) -> _Num:
    try:
        return kind(text)
    except ValueError:
        param = f"route[{route}].{key}"
        what = "an integer" if kind is int else "a number"
        raise InvalidRequest(f"{param}: not {what}: {text!r}", param=param) from None


def parse_route(text: str) -> Route:
    """Parse one ``--route`` value (syntax in the module docstring).

    Raises ``InvalidRequest`` with ``param`` = ``route[NAME].KEY`` (or ``route`` while the name
    is not known yet) and a message that repeats it.
    """
    name, sep, rest = text.partition(":")
    if not sep or not name:
        raise InvalidRequest(
            f"route: expected NAME:LISTEN_HOST:LISTEN_PORT=UPSTREAM_HOST:UPSTREAM_PORT,"
            f"delay_ms=MS[,...], got {text!r}",
            param="route",
        )
    if not _NAME_RE.fullmatch(name):
        raise InvalidRequest(
            f"route.name must match {_NAME_RE.pattern}, got {name!r}", param="route.name"
        )
    addresses, _, options_text = rest.partition(",")
    listen_text, sep, upstream_text = addresses.partition("=")
    if not sep:
        raise InvalidRequest(
            f"route[{name}].upstream: missing '=UPSTREAM_HOST:UPSTREAM_PORT' in {text!r}",
            param=f"route[{name}].upstream",
        )
    listen_host, listen_port_text = _split_host_port(listen_text, "listen", name)
    upstream_host, upstream_port_text = _split_host_port(upstream_text, "upstream", name)

    options: dict[str, str] = {}
    for item in options_text.split(",") if options_text else ():
        key, eq, value = item.partition("=")
        key = key.strip()
        param = f"route[{name}].{key}"
        if not eq or not key or not value.strip():
            raise InvalidRequest(
                f"route[{name}]: expected KEY=VALUE, got {item!r}", param=f"route[{name}]"
            )
        if key not in _LINK_KEYS:
            raise InvalidRequest(
                f"{param}: unknown key {key!r} (known: {', '.join(_LINK_KEYS)})", param=param
            )
        if key in options:
            raise InvalidRequest(f"{param}: given twice", param=param)
        options[key] = value.strip()
    if "delay_ms" not in options:
        param = f"route[{name}].delay_ms"
        raise InvalidRequest(f"{param}: missing (use delay_ms=0 for a local link)", param=param)

    try:
        link = LinkProfile(
            delay_ms=_parse_value(name, "delay_ms", options["delay_ms"], float),
            jitter_ms=_parse_value(name, "jitter_ms", options.get("jitter_ms", "0"), float),
            loss=_parse_value(name, "loss", options.get("loss", "0"), float),
            rto_ms=_parse_value(name, "rto_ms", options.get("rto_ms", str(DEFAULT_RTO_MS)), float),
            seed=_parse_value(name, "seed", options.get("seed", "0"), int),
        )
        return Route(
            name=name,
            listen_host=listen_host,
            listen_port=_parse_value(name, "listen_port", listen_port_text, int),
            upstream_host=upstream_host,
            upstream_port=_parse_value(name, "upstream_port", upstream_port_text, int),
            link=link,
        )
    except InvalidRequest as err:
        if err.param is None or err.param.startswith("route"):
            raise
        param = f"route[{name}].{err.param}"
        raise InvalidRequest(f"route[{name}].{err.message}", param=param) from None
