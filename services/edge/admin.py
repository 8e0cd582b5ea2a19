"""The admin API: tenants, keys and the edge's counters, on a port of its own.

Never mounted on the public application; it listens on ``--admin-host``/``--admin-port``
(loopback by default) and every request must carry ``Authorization: Bearer <admin token>``.
The token is compared in constant time (SHA-256 of both sides through ``hmac.compare_digest``,
so neither content nor length leaks through timing).

    GET    /admin/stats                      counters and gauges (JSON)
    GET    /admin/tenants                    every tenant
    POST   /admin/tenants                    create one (body: a tenant; 409 if it exists)
    GET    /admin/tenants/{tenant}
    PATCH  /admin/tenants/{tenant}           change some fields (body: the fields)
    DELETE /admin/tenants/{tenant}           revoke its keys and delete it
    GET    /admin/tenants/{tenant}/keys      its keys (records, never the keys)
    POST   /admin/tenants/{tenant}/keys      new key (body: name, limits, expires_in_s);
                                             the raw key is in this answer and nowhere else
    GET    /admin/keys/{key_id}
    POST   /admin/keys/{key_id}/rotate       new key; the old one ends after grace_s (body)
    DELETE /admin/keys/{key_id}              revoke now (every replica within seconds)

Errors use the public API's OpenAI-style format.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from aiohttp import web
from aiohttp.typedefs import Handler
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from services.common.errors import AuthenticationFailed, InvalidRequest, Unavailable
from services.common.httpapp import hide_version_banner
from services.edge.counters import EdgeCounters
from services.edge.middleware.error_boundary import error_boundary, expect_handler
from services.edge.redisconn import REDIS_FAILURES
from services.edge.request_body import content_coding, decode_body
from services.edge.tenancy.apikeys import KeyRecord
from services.edge.tenancy.directory import MAX_GRACE_S, Directory
from services.edge.tenancy.tenants import Limits, Tenant, TenantPatch

MIN_ADMIN_TOKEN_CHARS = 16
_MAX_BODY = 64 * 1024
_NO_STORE = {"Cache-Control": "no-store"}

Model = TypeVar("Model", bound=BaseModel)


class NewKey(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    name: Annotated[str, Field(max_length=256)] = ""
    limits: Limits | None = None
    expires_in_s: Annotated[int, Field(ge=1, le=10 * 365 * 24 * 3600)] | None = None


class Rotation(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    grace_s: Annotated[float, Field(ge=0, le=MAX_GRACE_S)] = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class AdminDeps:
    directory: Directory
    counters: EdgeCounters
    gauges: Callable[[], dict[str, Any]]
    token_sha256: bytes
    now_ms: Callable[[], int]


ADMIN = web.AppKey("admin", AdminDeps)


def token_digest(token: str) -> bytes:
    if len(token) < MIN_ADMIN_TOKEN_CHARS:
        raise ValueError(f"the admin token must be at least {MIN_ADMIN_TOKEN_CHARS} characters")
    return hashlib.sha256(token.encode()).digest()


@web.middleware
async def redis_unavailable(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Redis down or hung: the admin API answers 503 with Retry-After (it was a 500 and a
    traceback), as the console does; the chat API is unaffected."""
    try:
        return await handler(request)
    except REDIS_FAILURES:
        raise Unavailable(
            "The admin API cannot reach Redis right now; try again shortly.", retry_after_s=2.0
        ) from None


@web.middleware
async def admin_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    # aiohttp decodes header bytes that are not UTF-8 as lone surrogates; surrogateescape
    # gives the bytes back, so such a header is a wrong token (401), never a 500.
    given_sha = hashlib.sha256(given.strip().encode("utf-8", "surrogateescape")).digest()
    expected = request.app[ADMIN].token_sha256
    if not (hmac.compare_digest(given_sha, expected) and scheme.lower() == "bearer"):
        raise AuthenticationFailed("a valid admin token is required", code="invalid_admin_token")
    return await handler(request)


def _param(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.startswith(("function-", "tagged-")) or part in {"int", "str", "none", "bool"}:
            continue
        else:
            out += f".{part}" if out else part
    return out


async def _body(request: web.Request, model: type[Model], *, empty_ok: bool = False) -> Model:
    """The JSON body as ``model``, decoded from its Content-Encoding (the admin listener, like
    the public one, leaves that to :mod:`services.edge.request_body`); 400 names the field."""
    coding = content_coding(request)
    raw = decode_body(await request.read(), coding, max_bytes=_MAX_BODY)
    if not raw.strip() and empty_ok:
        raw = b"{}"
    try:
        return model.model_validate_json(raw)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        param = _param(tuple(first["loc"])) or None
        raise InvalidRequest(
            f"Invalid value for '{param or 'body'}': {first['msg']}.", param=param
        ) from None


def _key_answer(raw: str, record: KeyRecord, status: int) -> web.Response:
    return web.json_response({"key": raw, **record.public()}, status=status, headers=_NO_STORE)


async def stats(request: web.Request) -> web.Response:
    deps = request.app[ADMIN]
    return web.json_response({"counters": deps.counters.snapshot(), "gauges": deps.gauges()})


async def list_tenants(request: web.Request) -> web.Response:
    tenants = await request.app[ADMIN].directory.list_tenants()
    return web.json_response({"tenants": [t.model_dump(mode="json") for t in tenants]})


async def create_tenant(request: web.Request) -> web.Response:
    tenant = await _body(request, Tenant)
    created = await request.app[ADMIN].directory.create_tenant(tenant)
    return web.json_response(created.model_dump(mode="json"), status=201)


async def get_tenant(request: web.Request) -> web.Response:
    tenant = await request.app[ADMIN].directory.require_tenant(request.match_info["tenant"])
    return web.json_response(tenant.model_dump(mode="json"))


async def update_tenant(request: web.Request) -> web.Response:
    patch = await _body(request, TenantPatch)
    tenant = await request.app[ADMIN].directory.update_tenant(request.match_info["tenant"], patch)
    return web.json_response(tenant.model_dump(mode="json"))


async def delete_tenant(request: web.Request) -> web.Response:
    await request.app[ADMIN].directory.delete_tenant(request.match_info["tenant"])
    return web.json_response({"deleted": request.match_info["tenant"]})


async def list_keys(request: web.Request) -> web.Response:
    keys = await request.app[ADMIN].directory.list_keys(request.match_info["tenant"])
    return web.json_response({"keys": [k.public() for k in keys]})


async def create_key(request: web.Request) -> web.Response:
    spec = await _body(request, NewKey, empty_ok=True)
    deps = request.app[ADMIN]
    expires = deps.now_ms() + spec.expires_in_s * 1000 if spec.expires_in_s else None
    raw, record = await deps.directory.create_key(
        request.match_info["tenant"], name=spec.name, limits=spec.limits, expires_ms=expires
    )
    return _key_answer(raw, record, 201)


async def get_key(request: web.Request) -> web.Response:
    record = await request.app[ADMIN].directory.get_key(request.match_info["key_id"])
    return web.json_response(record.public())


async def rotate_key(request: web.Request) -> web.Response:
    spec = await _body(request, Rotation, empty_ok=True)
    directory = request.app[ADMIN].directory
    old_id = request.match_info["key_id"]
    raw, record = await directory.rotate_key(old_id, grace_s=spec.grace_s)
    answer = {"key": raw, **record.public(), "replaces": (await directory.get_key(old_id)).public()}
    return web.json_response(answer, status=201, headers=_NO_STORE)


async def revoke_key(request: web.Request) -> web.Response:
    record = await request.app[ADMIN].directory.revoke_key(request.match_info["key_id"])
    return web.json_response(record.public())


def build_admin_app(deps: AdminDeps) -> web.Application:
    app = hide_version_banner(
        web.Application(
            middlewares=[error_boundary, admin_auth, redis_unavailable],
            client_max_size=_MAX_BODY,
        )
    )
    app[ADMIN] = deps
    r = app.router
    r.add_get("/admin/stats", stats, expect_handler=expect_handler)
    r.add_get("/admin/tenants", list_tenants, expect_handler=expect_handler)
    r.add_post("/admin/tenants", create_tenant, expect_handler=expect_handler)
    r.add_get("/admin/tenants/{tenant}", get_tenant, expect_handler=expect_handler)
    r.add_patch("/admin/tenants/{tenant}", update_tenant, expect_handler=expect_handler)
    r.add_delete("/admin/tenants/{tenant}", delete_tenant, expect_handler=expect_handler)
    r.add_get("/admin/tenants/{tenant}/keys", list_keys, expect_handler=expect_handler)
    r.add_post("/admin/tenants/{tenant}/keys", create_key, expect_handler=expect_handler)
    r.add_get("/admin/keys/{key_id}", get_key, expect_handler=expect_handler)
    r.add_post("/admin/keys/{key_id}/rotate", rotate_key, expect_handler=expect_handler)
    r.add_delete("/admin/keys/{key_id}", revoke_key, expect_handler=expect_handler)
    return app
