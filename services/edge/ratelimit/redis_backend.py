"""The limit algorithm (see :mod:`.types`) in Redis: one atomic Lua script per admission, so
every edge replica shares exact windows, and concurrent requests cannot both take the last
slot (Redis runs scripts one at a time). One round trip per request (EVALSHA; the script is
loaded once per connection pool), one more when the request ends (settle). All scripts are
safe to run twice for one request id (a retry after a lost reply): an admitted request is
not charged again, a settle sets the used tokens rather than adding them. A third script,
*charge*, writes into the windows a request that this edge admitted on its own windows while
Redis was out (fail-open), at the time it was admitted, so the requests and tokens of an
outage still count against the limits for the rest of their window once Redis is back.

Redis layout, per scope (``{…}`` is the tenant, a Redis Cluster hash tag, so a key's and its
tenant's state always live on one shard and the script may touch both)::

    meridian:rl:{tenant}:t:w          zset   request id -> admitted at (ms): the window log
    meridian:rl:{tenant}:t:n          hash   request id -> tokens (reserved, then used);
                                             field "#sum" holds their total
    meridian:rl:{tenant}:t:c          zset   request id -> lease expiry (ms): live streams
    meridian:rl:{tenant}:k:{key_id}:… the same three for each key of the tenant

Every key expires on its own once idle (window + lease), so abandoned state never piles up.
Time comes from the caller (the edge's clock), so windows are deterministic in tests; replicas'
wall clocks must be NTP-synchronised (a skew of d shifts one replica's window edge by d).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from redis.asyncio.cluster import RedisCluster

from services.edge.ratelimit.types import Ask, Reason, Scope, ScopeState, Verdict, limit_args
from services.edge.redisconn import RedisClient, primary_of

RL_PREFIX = "meridian:rl:"

# KEYS: for each scope i: window log, token hash, lease set (3 per scope).
# ARGV[1]: request id; ARGV[2]: "now_ms window_ms lease_ms tokens", then for each scope
# "rpm tpm streams" (0: unlimited). Numbers travel as one string and the answer comes back as
# one string: the client's encoding and parsing, not Redis, is what costs at this rate.
ADMIT_LUA = """
local rid = ARGV[1]
local nums = {}
for v in string.gmatch(ARGV[2], '%d+') do nums[#nums + 1] = tonumber(v) end
local now, window, lease, need = nums[1], nums[2], nums[3], nums[4]
local n = #KEYS / 3
local cutoff = now - window

local function purge(w, t)
  while true do
    local old = redis.call('ZRANGEBYSCORE', w, '-inf', cutoff, 'LIMIT', 0, 256)
    if #old == 0 then return end
    local vals = redis.call('HMGET', t, unpack(old))
    local freed = 0
    for _, v in ipairs(vals) do
      if v then freed = freed + tonumber(v) end
    end
    redis.call('ZREM', w, unpack(old))
    redis.call('HDEL', t, unpack(old))
    if freed ~= 0 then redis.call('HINCRBY', t, '#sum', -freed) end
  end
end

local function oldest(w)
  local first = redis.call('ZRANGE', w, 0, 0, 'WITHSCORES')
  if #first == 0 then return nil end
  return tonumber(first[2])
end

local function tokens_retry(w, t, used, tpm)
  local excess = used + need - tpm
  local freed = 0
  local start = 0
  while true do
    local batch = redis.call('ZRANGE', w, start, start + 255, 'WITHSCORES')
    if #batch == 0 then return window end
    local ids = {}
    for j = 1, #batch, 2 do ids[#ids + 1] = batch[j] end
    local vals = redis.call('HMGET', t, unpack(ids))
    for j = 1, #ids do
      if vals[j] then freed = freed + tonumber(vals[j]) end
      if freed >= excess then return tonumber(batch[2 * j]) + window - now end
    end
    start = start + 256
  end
end

local reason = ''
local reason_scope = -1
local retry = 0
local function deny(r, i, ms)
  if reason == '' then reason = r; reason_scope = i - 1 end
  if ms > retry then retry = ms end
end

-- A request already admitted (this call is a retry whose first reply was lost: a timeout or a
-- dropped connection after Redis ran the script) keeps its admission and is not charged twice.
local again = false
for i = 1, n do
  if redis.call('ZSCORE', KEYS[3 * i - 2], rid) or redis.call('ZSCORE', KEYS[3 * i], rid) then
    again = true
  end
end

local state = {}
for i = 1, n do
  local w, t, c = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local base = 4 + 3 * (i - 1)
  local rpm = nums[base + 1]
  local tpm = nums[base + 2]
  local smax = nums[base + 3]
  local count, used, streams = 0, 0, 0
  if rpm > 0 or tpm > 0 then
    purge(w, t)
    count = redis.call('ZCARD', w)
    used = tonumber(redis.call('HGET', t, '#sum') or '0')
  end
  if smax > 0 then
    redis.call('ZREMRANGEBYSCORE', c, '-inf', now)
    streams = redis.call('ZCARD', c)
  end
  if again then
    -- the counts already hold this request
  elseif tpm > 0 and need > tpm then
    deny('too_large', i, 0)
  else
    if rpm > 0 and count + 1 > rpm then deny('requests', i, oldest(w) + window - now) end
    if tpm > 0 and used + need > tpm then deny('tokens', i, tokens_retry(w, t, used, tpm)) end
  end
  if smax > 0 and not again and streams + 1 > smax then deny('streams', i, 1000) end
  state[i] = {count, used, streams, rpm, tpm, smax}
end

if reason == '' and not again then
  for i = 1, n do
    local w, t, c = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
    local s = state[i]
    if s[4] > 0 or s[5] > 0 then
      redis.call('ZADD', w, now, rid)
      redis.call('HSET', t, rid, need)
      redis.call('HINCRBY', t, '#sum', need)
      redis.call('PEXPIRE', w, window + lease)
      redis.call('PEXPIRE', t, window + lease)
      s[1] = s[1] + 1
      s[2] = s[2] + need
    end
    if s[6] > 0 then
      redis.call('ZADD', c, now + lease, rid)
      redis.call('PEXPIRE', c, lease)
      s[3] = s[3] + 1
    end
  end
end

-- "reason scope retry_ms" then per scope " requests tokens streams reset_ms"
local out = {reason == '' and '-' or reason, reason_scope, retry}
for i = 1, n do
  local s = state[i]
  local reset = 0
  if s[4] > 0 or s[5] > 0 then
    local o = oldest(KEYS[3 * i - 2])
    if o then reset = o + window - now end
  end
  out[#out + 1] = string.format('%d %d %d %d', s[1], s[2], s[3], reset)
end
return table.concat(out, ' ')
"""

# KEYS: as for admit. ARGV: request id, tokens used.
SETTLE_LUA = """
local rid = ARGV[1]
local used = tonumber(ARGV[2])
for i = 1, #KEYS / 3 do
  local t, c = KEYS[3 * i - 1], KEYS[3 * i]
  local old = redis.call('HGET', t, rid)
  if old then
    redis.call('HSET', t, rid, used)
    redis.call('HINCRBY', t, '#sum', used - tonumber(old))
  end
  redis.call('ZREM', c, rid)
end
return 1
"""


# KEYS: as for admit. ARGV[1]: request id; ARGV[2]: "at_ms now_ms window_ms lease_ms tokens
# live" then for each scope "windowed streams" (1: the scope limits requests or tokens /
# streams). ``at_ms`` is when the request was admitted (its place in the window); ``live`` 1
# also takes a stream slot (a stream still running), 0 frees it (the request has ended).
# Running it twice writes the same state: the entry is added once, its tokens are set.
CHARGE_LUA = """
local rid = ARGV[1]
local nums = {}
for v in string.gmatch(ARGV[2], '%d+') do nums[#nums + 1] = tonumber(v) end
local at, now, window, lease, tokens, live = nums[1], nums[2], nums[3], nums[4], nums[5], nums[6]
for i = 1, #KEYS / 3 do
  local w, t, c = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  if nums[5 + 2 * i] == 1 and at > now - window then
    if redis.call('ZADD', w, 'NX', at, rid) == 1 then
      redis.call('HSET', t, rid, tokens)
      redis.call('HINCRBY', t, '#sum', tokens)
    else
      local old = redis.call('HGET', t, rid)
      if old then
        redis.call('HSET', t, rid, tokens)
        redis.call('HINCRBY', t, '#sum', tokens - tonumber(old))
      end
    end
    redis.call('PEXPIRE', w, window + lease)
    redis.call('PEXPIRE', t, window + lease)
  end
  if nums[6 + 2 * i] == 1 then
    if live == 1 then
      redis.call('ZADD', c, now + lease, rid)
      redis.call('PEXPIRE', c, lease)
    else
      redis.call('ZREM', c, rid)
    end
  end
end
return 1
"""


@dataclass(frozen=True, slots=True)
class Charge:
    """A request admitted while Redis was out, to be written into its windows (CHARGE_LUA)."""

    ask: Ask
    tokens: int  # used (the request ended) or reserved (still running)
    admitted_ms: int
    live: bool  # still running: it takes a stream slot too


def scope_keys(scope: Scope) -> tuple[str, str, str]:
    base = RL_PREFIX + scope.id
    return (f"{base}:w", f"{base}:n", f"{base}:c")


def _keys(ask: Ask) -> list[str]:
    return [k for scope in ask.scopes for k in scope_keys(scope)]


class RedisBackend:
    name = "redis"

    def __init__(self, *, redis: RedisClient, window_ms: int, lease_ms: int) -> None:
        if window_ms < 1 or lease_ms < 1:
            raise ValueError("window_ms and lease_ms must be >= 1")
        self._redis = redis
        self._window_ms = window_ms
        self._lease_ms = lease_ms
        #: Which server takes our writes now (see :func:`primary_of`): the limiter sends
        #: recent settles again when it changes.
        self.primary = primary_of(redis)
        self._admit = redis.register_script(ADMIT_LUA)
        self._settle = redis.register_script(SETTLE_LUA)
        self._charge = redis.register_script(CHARGE_LUA)

    async def admit(self, ask: Ask, now_ms: int) -> Verdict:
        keys: list[str] = []
        numbers = [now_ms, self._window_ms, self._lease_ms, ask.tokens]
        for scope in ask.scopes:
            keys.extend(scope_keys(scope))
            numbers.extend(limit_args(scope.limits))
        raw = await self._admit(keys=keys, args=[ask.request_id, " ".join(map(str, numbers))])
        fields = (raw.decode() if isinstance(raw, bytes) else str(raw)).split()
        reason_text, scope_index, retry = fields[0], int(fields[1]), int(fields[2])
        values = [int(v) for v in fields[3:]]
        states = tuple(ScopeState(*values[j : j + 4]) for j in range(0, len(values), 4))
        if reason_text == "-":
            return Verdict(True, states)
        return Verdict(False, states, Reason(reason_text), scope_index, retry)

    async def settle(self, ask: Ask, used_tokens: int, now_ms: int) -> None:
        await self.settle_many([(ask, used_tokens)], now_ms)

    async def settle_many(self, items: Sequence[tuple[Ask, int]], now_ms: int) -> None:
        """Settle several requests in one pipelined round trip (each settle stays atomic)."""
        if len(items) == 1 or isinstance(self._redis, RedisCluster):
            # A Cluster pipeline cannot load a script its shard lacks (NOSCRIPT after a
            # failover), so there each settle is its own call, all at once.
            await asyncio.gather(*(self._settle_one(ask, used) for ask, used in items))
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for ask, used in items:
                await self._settle(keys=_keys(ask), args=[ask.request_id, used], client=pipe)
            await pipe.execute()

    async def _settle_one(self, ask: Ask, used: int) -> None:
        await self._settle(keys=_keys(ask), args=[ask.request_id, used])

    async def charge_many(self, items: Sequence[Charge], now_ms: int) -> None:
        """Write requests admitted during an outage into the windows, in one pipelined round
        trip (one call each on a Cluster, as for settles)."""
        if not items:
            return
        if len(items) == 1 or isinstance(self._redis, RedisCluster):
            await asyncio.gather(
                *(self._charge(keys=_keys(c.ask), args=self._charge_args(c, now_ms)) for c in items)
            )
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for charge in items:
                await self._charge(
                    keys=_keys(charge.ask), args=self._charge_args(charge, now_ms), client=pipe
                )
            await pipe.execute()

    def _charge_args(self, charge: Charge, now_ms: int) -> list[str]:
        numbers = [
            charge.admitted_ms,
            now_ms,
            self._window_ms,
            self._lease_ms,
            max(0, charge.tokens),
            int(charge.live),
        ]
        for scope in charge.ask.scopes:
            rpm, tpm, streams = limit_args(scope.limits)
            numbers.extend((int(bool(rpm or tpm)), int(bool(streams))))
        return [charge.ask.request_id, " ".join(map(str, numbers))]

    async def renew(self, asks: Sequence[Ask], now_ms: int) -> None:
        """Extend the leases of live streams (one pipelined round trip for all of them)."""
        if not asks:
            return
        until = now_ms + self._lease_ms
        async with self._redis.pipeline(transaction=False) as pipe:
            for ask in asks:
                for scope in ask.scopes:
                    if scope.limits.max_streams:
                        lease_set = scope_keys(scope)[2]
                        pipe.zadd(lease_set, {ask.request_id: until}, xx=True)
                        pipe.pexpire(lease_set, self._lease_ms)
            await pipe.execute()
