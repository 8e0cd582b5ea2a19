"""``python -m services.edge.tenancy``: manage tenants and API keys through an edge's admin
API.

    export MERIDIAN_ADMIN_TOKEN=…            # or --admin-token-file
    python -m services.edge.tenancy --admin-url http://127.0.0.1:9090 \\
        tenant create acme --tier high --region kr --region jp --rpm 600 --tpm 200000
    python -m services.edge.tenancy key create acme --name ci
    python -m services.edge.tenancy key rotate 3f2a9c01b7de --grace-s 3600
    python -m services.edge.tenancy key revoke 3f2a9c01b7de

Every command prints the admin API's JSON answer. ``key create`` and ``key rotate`` print the
raw key once (field ``key``); it is stored nowhere. Errors go to stderr, exit code 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from services.common import cli
from services.edge.tenancy.tenants import Tier

ADMIN_URL_ENV = "MERIDIAN_ADMIN_URL"
ADMIN_TOKEN_ENV = "MERIDIAN_ADMIN_TOKEN"
_LIMITS = ("rpm", "tpm", "max_streams")


def _nonneg_int(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value!r}")
    return int(value)


def _add_limits(p: argparse.ArgumentParser, *, key_limits: bool) -> None:
    p.add_argument("--rpm", type=_nonneg_int, help="requests per minute")
    p.add_argument("--tpm", type=_nonneg_int, help="tokens per minute")
    p.add_argument("--max-streams", type=_nonneg_int, help="concurrent streams")
    if key_limits:
        p.add_argument("--key-rpm", type=_nonneg_int, help="per key: requests per minute")
        p.add_argument("--key-tpm", type=_nonneg_int, help="per key: tokens per minute")
        p.add_argument("--key-max-streams", type=_nonneg_int, help="per key: concurrent streams")


def _add_policy(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tier", choices=[t.value for t in Tier])
    p.add_argument("--model", action="append", dest="models", help="allowed model (repeat)")
    p.add_argument("--region", action="append", dest="regions", help="allowed region (repeat)")
    _add_limits(p, key_limits=True)


def _admin_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"{value!r}: expected http(s)://HOST:PORT")
    return value.rstrip("/")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m services.edge.tenancy",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--admin-url",
        type=_admin_url,
        default=os.environ.get(ADMIN_URL_ENV, "http://127.0.0.1:9090"),
        help=f"the edge's admin API (else ${ADMIN_URL_ENV})",
    )
    p.add_argument("--admin-token-file", type=Path, help=f"else ${ADMIN_TOKEN_ENV}")
    groups = p.add_subparsers(dest="group", required=True)

    tenant = groups.add_parser("tenant", help="tenants").add_subparsers(
        dest="action", required=True
    )
    create = tenant.add_parser("create")
    create.add_argument("tenant")
    _add_policy(create)
    tenant.add_parser("list")
    for action in ("get", "delete"):
        tenant.add_parser(action).add_argument("tenant")
    update = tenant.add_parser("update")
    update.add_argument("tenant")
    _add_policy(update)
    state = update.add_mutually_exclusive_group()
    state.add_argument("--disable", action="store_true")
    state.add_argument("--enable", action="store_true")

    key = groups.add_parser("key", help="API keys").add_subparsers(dest="action", required=True)
    kcreate = key.add_parser("create")
    kcreate.add_argument("tenant")
    kcreate.add_argument("--name", default="")
    kcreate.add_argument("--expires-in-s", type=_nonneg_int)
    _add_limits(kcreate, key_limits=False)
    key.add_parser("list").add_argument("tenant")
    for action in ("get", "revoke"):
        key.add_parser(action).add_argument("key_id")
    rotate = key.add_parser("rotate")
    rotate.add_argument("key_id")
    rotate.add_argument("--grace-s", type=cli.non_negative_float, default=0.0)
    return p


def _limits(args: argparse.Namespace, prefix: str = "") -> dict[str, int]:
    return {
        name: getattr(args, prefix + name)
        for name in _LIMITS
        if getattr(args, prefix + name, None) is not None
    }


def _policy(args: argparse.Namespace, current: dict[str, Any] | None) -> dict[str, Any]:
    """The tenant fields the flags set; limits merge into ``current``'s (PATCH replaces them)."""
    out: dict[str, Any] = {}
    if args.tier:
        out["tier"] = args.tier
    if args.models:
        out["allowed_models"] = args.models
    if args.regions:
        out["allowed_regions"] = args.regions
    for field, prefix in (("limits", ""), ("key_limits", "key_")):
        given = _limits(args, prefix)
        if given:
            out[field] = {**((current or {}).get(field) or {}), **given}
    return out


class AdminError(Exception):
    pass


class AdminClient:
    def __init__(self, session: aiohttp.ClientSession, url: str, token: str) -> None:
        self._session = session
        self._url = url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"}

    async def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        async with self._session.request(
            method, self._url + path, json=body, headers=self._headers
        ) as resp:
            try:
                data = await resp.json(content_type=None)
            except (json.JSONDecodeError, aiohttp.ContentTypeError):
                raise AdminError(f"HTTP {resp.status}: not a JSON answer") from None
            if resp.status >= 400:
                error = data.get("error") if isinstance(data, dict) else None
                message = error.get("message") if isinstance(error, dict) else error
                shown = message or resp.reason or "no error message"
                raise AdminError(f"HTTP {resp.status}: {str(shown)[:500]}")
            return data


async def run(args: argparse.Namespace, token: str) -> Any:
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        admin = AdminClient(session, args.admin_url, token)
        if args.group == "tenant":
            return await _tenant(admin, args)
        return await _key(admin, args)


async def _tenant(admin: AdminClient, args: argparse.Namespace) -> Any:
    path = f"/admin/tenants/{getattr(args, 'tenant', '')}"
    if args.action == "list":
        return await admin.call("GET", "/admin/tenants")
    if args.action == "get":
        return await admin.call("GET", path)
    if args.action == "delete":
        return await admin.call("DELETE", path)
    if args.action == "create":
        return await admin.call(
            "POST", "/admin/tenants", {"tenant_id": args.tenant, **_policy(args, None)}
        )
    current = await admin.call("GET", path)
    patch = _policy(args, current)
    if args.disable or args.enable:
        patch["disabled"] = bool(args.disable)
    return await admin.call("PATCH", path, patch)


async def _key(admin: AdminClient, args: argparse.Namespace) -> Any:
    if args.action == "create":
        body: dict[str, Any] = {"name": args.name}
        limits = _limits(args)
        if limits:
            body["limits"] = limits
        if args.expires_in_s:
            body["expires_in_s"] = args.expires_in_s
        return await admin.call("POST", f"/admin/tenants/{args.tenant}/keys", body)
    if args.action == "list":
        return await admin.call("GET", f"/admin/tenants/{args.tenant}/keys")
    path = f"/admin/keys/{args.key_id}"
    if args.action == "get":
        return await admin.call("GET", path)
    if args.action == "revoke":
        return await admin.call("DELETE", path)
    return await admin.call("POST", path + "/rotate", {"grace_s": args.grace_s})


def _token(args: argparse.Namespace) -> str:
    if args.admin_token_file is not None:
        return cli.read_text(args.admin_token_file, flag="--admin-token-file").strip()
    token = os.environ.get(ADMIN_TOKEN_ENV, "").strip()
    if not token:
        raise ValueError(f"give --admin-token-file or set ${ADMIN_TOKEN_ENV}")
    return token


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        token = _token(args)
        answer = asyncio.run(run(args, token))
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except AdminError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except aiohttp.ClientError as err:
        print(f"error: cannot reach the admin API at {args.admin_url}: {err}", file=sys.stderr)
        return 1
    print(json.dumps(answer, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
