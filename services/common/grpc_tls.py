"""Mutual TLS between the services: edge → router, edge → worker, router → worker.

Every internal gRPC API (Generate, Route, WatchLoad …) trusts its caller: whoever reaches a
worker's port can generate without an API key or a rate limit. Network policy is one fence
(``deploy/k8s/networkpolicy.yaml``); this is the other, for networks that are not private
end to end. With ``--grpc-tls-cert``, ``--grpc-tls-key`` and ``--grpc-tls-ca`` a service
serves gRPC over TLS only, **requires** its callers to present a certificate signed by that
CA, and presents its own certificate when it calls another service, checking the callee's
against the same CA. One CA for the whole deployment; each service its own certificate (or one
shared, for a small fleet), with the names callers dial as subject alternative names — or, when
workers are dialled by addresses no certificate can list (pod IPs), ``--grpc-tls-server-name``:
the name callers expect in every peer's certificate instead of the address they dialled.

Files are read and checked once, at start-up, so a wrong path, a key that is not the
certificate's or a certificate the CA did not sign stops the service with one line naming the
flag (``services.common.runtime``), not a handshake failure on the first request.
``python -m services.common.devca`` writes a CA and a certificate for local use.
"""

from __future__ import annotations

import argparse
import datetime
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from services.common.cli import UnreadableFile, read_text

_MAX_PEM_BYTES = 1024 * 1024


class BadTlsFiles(ValueError):
    """The TLS files a service was given cannot work; the message names the flag and why."""


@dataclass(frozen=True, slots=True, repr=False)
class GrpcTls:
    """The PEM bytes a service needs for mutual TLS (``repr`` shows no key material)."""

    cert_chain: bytes
    private_key: bytes
    ca: bytes
    #: The name expected in peers' certificates instead of the dialled address's host.
    server_name: str | None = None

    def __repr__(self) -> str:
        return f"GrpcTls(server_name={self.server_name!r})"

    @classmethod
    def from_files(
        cls,
        *,
        cert: str | Path,
        key: str | Path,
        ca: str | Path,
        server_name: str | None = None,
    ) -> GrpcTls:
        """Read and check the three files: each PEM, the key the certificate's, the
        certificate signed by the CA and valid now. Raises :class:`BadTlsFiles`."""
        cert_pem = _read(cert, "--grpc-tls-cert")
        key_pem = _read(key, "--grpc-tls-key")
        ca_pem = _read(ca, "--grpc-tls-ca")
        try:
            chain = x509.load_pem_x509_certificates(cert_pem)
        except ValueError:
            raise BadTlsFiles(f"--grpc-tls-cert {cert}: not a PEM certificate") from None
        try:
            authorities = x509.load_pem_x509_certificates(ca_pem)
        except ValueError:
            raise BadTlsFiles(f"--grpc-tls-ca {ca}: not a PEM certificate") from None
        try:
            private = serialization.load_pem_private_key(key_pem, password=None)
        except TypeError:  # "Password was not given but private key is encrypted"
            raise BadTlsFiles(f"--grpc-tls-key {key}: encrypted; give it unencrypted") from None
        except ValueError:
            raise BadTlsFiles(f"--grpc-tls-key {key}: not a PEM private key") from None
        leaf = chain[0]
        if _public_bytes(private.public_key()) != _public_bytes(leaf.public_key()):
            raise BadTlsFiles(
                f"--grpc-tls-key {key}: not the key of the certificate in --grpc-tls-cert {cert}"
            )
        now = datetime.datetime.now(datetime.UTC)
        if not leaf.not_valid_before_utc <= now <= leaf.not_valid_after_utc:
            raise BadTlsFiles(
                f"--grpc-tls-cert {cert}: valid from {leaf.not_valid_before_utc:%Y-%m-%d} to "
                f"{leaf.not_valid_after_utc:%Y-%m-%d}, not now"
            )
        top = chain[-1]  # the leaf, or the last intermediate given with it
        if not any(top == a or _signed_by(top, a) for a in authorities):
            raise BadTlsFiles(
                f"--grpc-tls-cert {cert}: not signed by the CA in --grpc-tls-ca {ca} "
                "(peers would refuse it)"
            )
        if server_name is not None and not server_name.strip():
            raise BadTlsFiles("--grpc-tls-server-name must not be empty")
        return cls(cert_pem, key_pem, ca_pem, server_name)

    def server_credentials(self) -> grpc.ServerCredentials:
        """Serve TLS only, and require a client certificate the CA signed."""
        return grpc.ssl_server_credentials(
            [(self.private_key, self.cert_chain)],
            root_certificates=self.ca,
            require_client_auth=True,
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Check the callee against the CA; present this service's certificate."""
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca,
            private_key=self.private_key,
            certificate_chain=self.cert_chain,
        )

    def channel_options(self) -> list[tuple[str, str]]:
        if self.server_name is None:
            return []
        return [("grpc.ssl_target_name_override", self.server_name)]


def _read(path: str | Path, flag: str) -> bytes:
    try:
        return read_text(path, flag=flag, max_bytes=_MAX_PEM_BYTES).encode()
    except UnreadableFile as err:
        raise BadTlsFiles(str(err)) from None


def _public_bytes(key: object) -> bytes:
    return key.public_bytes(  # type: ignore[attr-defined, no-any-return]
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _signed_by(cert: x509.Certificate, authority: x509.Certificate) -> bool:
    """Whether ``authority`` issued ``cert`` (its name and key): the only check that matters
    here, that peers holding this CA will accept it."""
    try:
        cert.verify_directly_issued_by(authority)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The four flags, in their own group, identical on every service."""
    group = parser.add_argument_group(
        "internal gRPC security (mutual TLS; all three files or none)"
    )
    group.add_argument(
        "--grpc-tls-cert", metavar="PEM", help="this service's certificate (chain), PEM"
    )
    group.add_argument("--grpc-tls-key", metavar="PEM", help="its private key, PEM, unencrypted")
    group.add_argument(
        "--grpc-tls-ca",
        metavar="PEM",
        help="the CA that signs every service's certificate; peers must present one it signed",
    )
    group.add_argument(
        "--grpc-tls-server-name",
        metavar="NAME",
        help="the name expected in peers' certificates instead of the dialled host "
        "(for workers dialled by IP)",
    )


def from_arguments(args: argparse.Namespace) -> GrpcTls | None:
    """The TLS the flags ask for, or None; :class:`BadTlsFiles` if they cannot work."""
    files = (args.grpc_tls_cert, args.grpc_tls_key, args.grpc_tls_ca)
    if not any(files):
        if args.grpc_tls_server_name is not None:
            raise BadTlsFiles("--grpc-tls-server-name needs --grpc-tls-cert, -key and -ca")
        return None
    if not all(files):
        flags = ("--grpc-tls-cert", "--grpc-tls-key", "--grpc-tls-ca")
        missing = [flag for flag, value in zip(flags, files, strict=True) if not value]
        raise BadTlsFiles(f"mutual TLS needs all three files: {', '.join(missing)} missing")
    return GrpcTls.from_files(
        cert=args.grpc_tls_cert,
        key=args.grpc_tls_key,
        ca=args.grpc_tls_ca,
        server_name=args.grpc_tls_server_name,
    )
