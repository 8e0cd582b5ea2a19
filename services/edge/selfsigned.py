"""A self-signed certificate and key for local HTTPS (the local stack, tests).

    python -m services.edge.selfsigned --cert edge.crt --key edge.key [--host localhost ...]

ECDSA P-256, valid for ``days`` days, with the given host names and IP addresses as subject
alternative names (clients check those, not the common name). The key file is written 0600.
Never for production: clients can only trust it by pinning this very certificate.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from services.common.devca import alternative_names, key_usage, write_private_key

DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")


def write_self_signed(
    cert_file: Path, key_file: Path, *, hosts: Sequence[str] = DEFAULT_HOSTS, days: int = 30
) -> None:
    if not hosts:
        raise ValueError("at least one host is needed")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(alternative_names(hosts), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_file.parent.mkdir(parents=True, exist_ok=True)
    cert_file.parent.mkdir(parents=True, exist_ok=True)
    write_private_key(key_file, key)
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m services.edge.selfsigned",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--cert", type=Path, required=True)
    p.add_argument("--key", type=Path, required=True)
    p.add_argument("--host", action="append", dest="hosts", help="repeatable")
    p.add_argument("--days", type=int, default=30)
    args = p.parse_args(argv)
    if not 1 <= args.days <= 825:
        p.error("--days must be 1..825")
    write_self_signed(args.cert, args.key, hosts=args.hosts or DEFAULT_HOSTS, days=args.days)
    print(f"wrote {args.cert} and {args.key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
