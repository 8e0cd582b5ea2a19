"""The mutual-TLS files are checked at start-up, each failure one line naming the flag; the
services' command lines refuse bad ones with exit code 2 before listening."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from services.common import grpc_tls
from services.common.devca import Issued, write_dev_ca
from services.common.grpc_tls import BadTlsFiles, GrpcTls
from services.edge import main as edge_main
from services.router import main as router_main
from services.worker import main as worker_main


@pytest.fixture
def issued(tmp_path: Path) -> dict[str, Issued]:
    return write_dev_ca(tmp_path / "ca", names=("edge", "worker"))


def test_files_the_dev_ca_wrote_are_accepted(issued: dict[str, Issued]) -> None:
    files = issued["worker"]
    tls = GrpcTls.from_files(cert=files.cert, key=files.key, ca=files.ca, server_name="w.local")
    assert tls.channel_options() == [("grpc.ssl_target_name_override", "w.local")]
    assert "PRIVATE" not in repr(tls)  # no key material in logs or tracebacks
    assert files.key.stat().st_mode & 0o077 == 0


def test_a_key_that_is_not_the_certificates_is_refused(issued: dict[str, Issued]) -> None:
    with pytest.raises(BadTlsFiles, match=r"--grpc-tls-key .*worker.key: not the key of the"):
        GrpcTls.from_files(cert=issued["edge"].cert, key=issued["worker"].key, ca=issued["edge"].ca)


def test_a_certificate_another_ca_signed_is_refused(
    issued: dict[str, Issued], tmp_path: Path
) -> None:
    other = write_dev_ca(tmp_path / "other", names=("x",))["x"]
    with pytest.raises(BadTlsFiles, match=r"--grpc-tls-cert .*x.crt: not signed by the CA"):
        GrpcTls.from_files(cert=other.cert, key=other.key, ca=issued["edge"].ca)


@pytest.mark.parametrize(
    ("which", "content", "says"),
    [
        ("cert", "hello", r"--grpc-tls-cert .*: not a PEM certificate"),
        ("key", "hello", r"--grpc-tls-key .*: not a PEM private key"),
        ("ca", "-----BEGIN CERTIFICATE-----\nxx\n", r"--grpc-tls-ca .*: not a PEM certificate"),
        ("cert", b"\xff\xfe", r"--grpc-tls-cert .*: not UTF-8 text"),
    ],
)
def test_a_file_that_is_not_pem_names_its_flag(
    issued: dict[str, Issued], tmp_path: Path, which: str, content: str | bytes, says: str
) -> None:
    bad = tmp_path / "bad.pem"
    bad.write_bytes(content.encode() if isinstance(content, str) else content)
    files = {"cert": issued["edge"].cert, "key": issued["edge"].key, "ca": issued["edge"].ca}
    files[which] = bad
    with pytest.raises(BadTlsFiles, match=says):
        GrpcTls.from_files(cert=files["cert"], key=files["key"], ca=files["ca"])


def test_a_missing_file_names_its_flag(issued: dict[str, Issued], tmp_path: Path) -> None:
    with pytest.raises(BadTlsFiles, match=r"--grpc-tls-ca .*nope.pem: No such file"):
        GrpcTls.from_files(
            cert=issued["edge"].cert, key=issued["edge"].key, ca=tmp_path / "nope.pem"
        )


def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    grpc_tls.add_arguments(parser)
    return parser.parse_args(list(flags))


def test_no_flags_is_plaintext_and_some_of_them_is_an_error(issued: dict[str, Issued]) -> None:
    assert grpc_tls.from_arguments(parse()) is None
    with pytest.raises(BadTlsFiles, match="all three files: --grpc-tls-key, --grpc-tls-ca missing"):
        grpc_tls.from_arguments(parse("--grpc-tls-cert", str(issued["edge"].cert)))
    with pytest.raises(BadTlsFiles, match="--grpc-tls-server-name needs"):
        grpc_tls.from_arguments(parse("--grpc-tls-server-name", "x"))


@pytest.mark.parametrize(
    ("main", "argv"),
    [
        (worker_main.main, ["--worker-id", "w", "--region", "kr"]),
        (router_main.main, ["--worker", "127.0.0.1:1"]),
        (
            edge_main.main,
            ["--plain-http", "--router", "127.0.0.1:1", "--redis-url", "redis://127.0.0.1:1"],
        ),
    ],
    ids=["worker", "router", "edge"],
)
def test_every_service_refuses_a_bad_tls_flag_before_listening(
    main: object,
    argv: list[str],
    issued: dict[str, Issued],
    capsys: pytest.CaptureFixture[str],
) -> None:
    files = issued["edge"]
    bad = [
        "--grpc-tls-cert",
        str(files.cert),
        "--grpc-tls-key",
        str(issued["worker"].key),
        "--grpc-tls-ca",
        str(files.ca),
    ]
    with pytest.raises(SystemExit) as exited:
        main(argv + bad)  # type: ignore[operator]
    assert exited.value.code == 2
    assert "not the key of the certificate" in capsys.readouterr().err


def test_the_dev_ca_keeps_a_complete_valid_folder_and_renews_anything_less(
    tmp_path: Path,
) -> None:
    """``--keep-existing`` (what compose runs on every ``up``): a folder with every file,
    signed by its CA and valid for another day, is left alone; one missing a name, or whose
    certificate another CA signed, or expiring, is written anew."""
    from services.common import devca

    out = tmp_path / "certs"
    argv = ["--out", str(out), "--name", "edge", "--name", "router", "--keep-existing"]
    assert devca.main(argv) == 0
    first = (out / "ca.crt").read_bytes()
    assert devca.main(argv) == 0
    assert (out / "ca.crt").read_bytes() == first  # kept
    assert devca.main([*argv, "--name", "worker"]) == 0
    renewed = (out / "ca.crt").read_bytes()
    assert renewed != first  # a name was missing: all written anew
    other = tmp_path / "other"
    devca.write_dev_ca(other, names=["router"])
    (out / "router.crt").write_bytes((other / "router.crt").read_bytes())
    assert not devca.still_valid(out, ["edge", "router", "worker"])
    assert devca.still_valid(out, ["edge", "worker"])
    assert not devca.still_valid(out, ["edge"], for_s=31 * 86_400)  # 30 days by default
