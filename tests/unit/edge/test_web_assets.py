"""Static files: content types, versioned references, ETags, gzip negotiation."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.edge.web.assets import (
    CSP,
    STATIC_DIR,
    AssetStore,
    accepts_gzip,
    etag_matches,
)


@pytest.mark.parametrize(
    ("header", "ok"),
    [
        ("gzip", True),
        ("gzip, deflate, br", True),
        ("br;q=1.0, gzip;q=0.5", True),
        ("gzip;q=0", False),
        ("*", True),
        ("identity", False),
        ("", False),
        ("GZIP", True),
    ],
)
def test_gzip_is_used_when_the_client_accepts_it(header: str, ok: bool) -> None:
    assert accepts_gzip(header) is ok


@pytest.mark.parametrize(
    ("header", "ok"),
    [('"abc"', True), ('W/"abc"', True), ('"x", "abc"', True), ("*", True), ('"abcd"', False)],
)
def test_if_none_match_compares_tags_weakly(header: str, ok: bool) -> None:
    assert etag_matches(header, '"abc"') is ok


def test_pages_refer_to_assets_by_version(tmp_path: Path) -> None:
    (tmp_path / "a.js").write_text("console.log(1)")
    (tmp_path / "p.html").write_text('<script src="/static/a.js"></script>')
    store = AssetStore(tmp_path)
    js, page = store.get("a.js"), store.get("p.html")
    assert js is not None
    assert page is not None
    assert page.body.decode() == f'<script src="/static/a.js?v={js.version}"></script>'
    assert store.url("a.js") == f"/static/a.js?v={js.version}"


def test_a_page_that_names_a_missing_asset_stops_the_edge_at_start(tmp_path: Path) -> None:
    (tmp_path / "p.html").write_text('<link href="/static/gone.css">')
    with pytest.raises(ValueError, match=r"gone\.css"):
        AssetStore(tmp_path)


def test_a_file_without_a_known_content_type_is_refused(tmp_path: Path) -> None:
    (tmp_path / "tool.exe").write_bytes(b"MZ")
    with pytest.raises(ValueError, match="content type"):
        AssetStore(tmp_path)


def test_small_or_incompressible_files_are_not_gzipped(tmp_path: Path) -> None:
    (tmp_path / "tiny.js").write_text("1")
    (tmp_path / "big.js").write_text("x = 1;\n" * 500)
    store = AssetStore(tmp_path)
    tiny, big = store.get("tiny.js"), store.get("big.js")
    assert tiny is not None
    assert big is not None
    assert tiny.gzipped is None
    assert big.gzipped is not None
    assert len(big.gzipped) < len(big.body)
    assert big.etag("gzip") != big.etag("")


def test_the_shipped_pages_load_and_the_policy_allows_no_inline_code() -> None:
    store = AssetStore(STATIC_DIR)
    names = store.names()
    for page in ("index.html", "console.html", "login.html"):
        assert page in names
        html = store.get(page)
        assert html is not None
        assert b"<script>" not in html.body  # scripts come from files only
        assert b" style=" not in html.body
    assert "vendor/purify.min.js" in names
    assert "world.json" in names
    assert "'unsafe-inline'" not in CSP
    assert "'unsafe-eval'" not in CSP
    assert "default-src 'none'" in CSP
