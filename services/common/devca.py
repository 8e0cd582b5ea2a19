"""A development CA and service certificates for the services' mutual TLS (see
:mod:`services.common.grpc_tls`): the local stack, tests, a first try of the flags.

    python -m services.common.devca --out DIR [--name edge --name router ...] [--host H ...]
        [--days N] [--keep-existing]

writes ``DIR/ca.crt`` (and ``DIR/ca.key``) and, for each ``--name``, ``DIR/NAME.crt`` and
``DIR/NAME.key``, signed by that CA, valid for client and server use, with the given hosts
(default ``localhost``, ``127.0.0.1``, ``::1``) as subject alternative names. Keys are written
0600. ECDSA P-256. ``--keep-existing`` leaves a folder that already holds the CA and every
named certificate, signed by it and valid for another day, as it is (the compose stack runs
this on every ``up``: services still running keep trusting what they loaded). For
production, use the CA your organisation already runs (cert-manager, Vault, a mesh's CA):
this one's key sits in a plain file next to the certificates.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")
DEFAULT_NAMES = ("service",)


@dataclass(frozen=True, slots=True)
class Issued:
    """Where one service's files are."""

    cert: Path
    key: Path
    ca: Path


def subject_name(host: str) -> x509.GeneralName:
    """A subject alternative name: an IP address if ``host`` is one, else a DNS name."""
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def alternative_names(hosts: Sequence[str]) -> x509.SubjectAlternativeName:
    """The extension clients check a server's name against (never the common name)."""
    return x509.SubjectAlternativeName([subject_name(h) for h in hosts])


def key_usage(*, ca: bool) -> x509.KeyUsage:
    """Digital signature for a leaf; certificate and CRL signing too for a CA."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def write_private_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    """``key`` as unencrypted PKCS#8 PEM, the file created 0600 (never readable by others)."""
    data = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def write_dev_ca(
    out: Path,
    *,
    names: Sequence[str] = DEFAULT_NAMES,
    hosts: Sequence[str] = DEFAULT_HOSTS,
    days: int = 30,
    ca_name: str = "Meridian development CA",
) -> dict[str, Issued]:
    """Write a CA and one certificate per name into ``out``; returns each name's files."""
    if not names or not hosts:
        raise ValueError("at least one name and one host are needed")
    for name in names:
        if not name or "/" in name or name.startswith(".") or name == "ca":
            raise ValueError(f"bad certificate name {name!r}")
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ca_name)])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_subject)
        .issuer_name(ca_subject)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_file = out / "ca.crt"
    ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    write_private_key(out / "ca.key", ca_key)
    issued: dict[str, Issued] = {}
    for name in names:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(alternative_names(hosts), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(key_usage(ca=False), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
            )
            .sign(ca_key, hashes.SHA256())
        )
        cert_file, key_file = out / f"{name}.crt", out / f"{name}.key"
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        write_private_key(key_file, key)
        issued[name] = Issued(cert_file, key_file, ca_file)
    return issued


def still_valid(out: Path, names: Sequence[str], *, for_s: float = 86_400.0) -> bool:
    """``out`` holds the CA and each name's certificate and key, each certificate signed by
    that CA and valid for at least ``for_s`` more seconds."""
    try:
        ca = x509.load_pem_x509_certificate((out / "ca.crt").read_bytes())
        certs = [x509.load_pem_x509_certificate((out / f"{n}.crt").read_bytes()) for n in names]
        if not all((out / f"{n}.key").is_file() for n in names):
            return False
    except (OSError, ValueError):
        return False
    until = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=for_s)
    try:
        for cert in certs:
            cert.verify_directly_issued_by(ca)  # this CA's, not an earlier one's of its name
    except (ValueError, TypeError, InvalidSignature):
        return False
    return all(c.not_valid_after_utc > until for c in (ca, *certs))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m services.common.devca",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", type=Path, required=True, help="the folder to write into")
    p.add_argument("--name", action="append", dest="names", help="a certificate (repeatable)")
    p.add_argument("--host", action="append", dest="hosts", help="a SAN (repeatable)")
    p.add_argument("--days", type=int, default=30)
    p.add_argument(
        "--keep-existing",
        action="store_true",
        help="leave --out as it is when it already holds every file, valid for another day",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if not 1 <= args.days <= 825:
        p.error("--days must be 1..825")
    if args.out.exists() and not args.out.is_dir():
        p.error(f"--out {args.out}: not a folder")
    names = args.names or DEFAULT_NAMES
    if args.keep_existing and still_valid(args.out, names):
        print(f"{args.out}: the CA and {', '.join(names)} are still valid; kept")
        return 0
    try:
        issued = write_dev_ca(
            args.out,
            names=names,
            hosts=args.hosts or DEFAULT_HOSTS,
            days=args.days,
        )
    except (ValueError, OSError) as err:
        p.error(str(err))
    for name, files in issued.items():
        flags = f"--grpc-tls-cert {files.cert} --grpc-tls-key {files.key}"
        print(f"{name}: {flags} --grpc-tls-ca {files.ca}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
