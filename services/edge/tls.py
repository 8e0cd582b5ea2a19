"""TLS termination: the server context the edge listens with.

Modern floor: TLS 1.2 at least (1.3 negotiated whenever the client has it, which is every
current client), and for 1.2 only forward-secret AEAD suites (ECDHE with AES-GCM or
ChaCha20-Poly1305); no compression, no renegotiation. ALPN offers ``http/1.1``, the only
protocol the edge speaks. Certificates are read from files named in config (a self-signed pair
for local use comes from :mod:`services.edge.selfsigned`).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

_TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsConfig:
    cert_file: Path
    key_file: Path
    min_version: str = "1.2"

    def __post_init__(self) -> None:
        if self.min_version not in ("1.2", "1.3"):
            raise ValueError("min_version must be '1.2' or '1.3'")


def server_context(config: TlsConfig) -> ssl.SSLContext:
    """An SSL context for the listening socket; ValueError (naming the files) if unusable."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = (
        ssl.TLSVersion.TLSv1_3 if config.min_version == "1.3" else ssl.TLSVersion.TLSv1_2
    )
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    ctx.options |= ssl.OP_NO_RENEGOTIATION
    ctx.set_ciphers(_TLS12_CIPHERS)
    ctx.set_alpn_protocols(["http/1.1"])
    try:
        ctx.load_cert_chain(config.cert_file, config.key_file)
    except (OSError, ssl.SSLError) as err:
        raise ValueError(
            f"cannot load the TLS certificate {config.cert_file} and key {config.key_file}: {err}"
        ) from None
    return ctx
