"""The Location Store in Redis: the store of node processes on several machines.

``RedisLocationStore`` keeps exactly the semantics of ``InMemoryLocationStore`` (``location.py``,
execution-model §14) in one Redis server (``store="redis://HOST:PORT/DB"``, python-api §10),
with the same errors and messages.

Guarantees / assumes:
* Every fenced write (a claim, ``release``, ``transfer``, ``register_node``, ``renew_node``,
  ``unregister_node``) is one Lua script, so the check and the change it guards run as one
  step on the server. It compares-and-sets on owner node, owner incarnation and authority
  generation, and on the writer's live lease (for a transfer also the target's), and refuses a
  stale writer with the same ``Unavailable`` as the in-memory store: a refused write changes
  nothing. Scripts run with ``EVALSHA`` (redis-py ``register_script``), loaded again when the
  server answers ``NOSCRIPT`` (after ``SCRIPT FLUSH`` or a restart).
* ``reserve`` of a Spot that already has a live owner answers from a script that only reads;
  only a claim runs the claim script (which looks again).
* Leases are measured on the server's clock (``TIME`` inside the scripts, in seconds), the one
  clock every node process shares. Needs Redis 7 or later (a script that reads ``TIME`` and
  then writes is replicated by its effects; tested with 7.0). A ``clock`` given to the
  constructor replaces the server's clock (the scripts take ``now`` as an argument): for tests
  only, with a manual clock; nodes on several machines would disagree on it.
* ``object_generation`` and the node ``incarnation`` come from counters that are never handed
  out twice, also when Redis restarts empty or from an older snapshot (data loss): each value
  is at least the server's ``TIME`` in microseconds, so it is above every value handed out
  before, unless more than one million a second were, or the server's clock went back.
* Redis must not lose writes it acknowledged (``appendonly yes`` with ``appendfsync always``;
  no failover to an asynchronous replica). A restart that lost everything is seen (below); one
  that lost only the last writes is not: a claim lost that way can be granted again to
  another node while its first owner still serves it, for up to one lease.
* Values are integers below 2**53 (exact in Lua's numbers): a ``known_incarnation`` at or
  above it is ``InvalidArgument``.
* Data loss is seen as in the other stores: a node registers giving the incarnation it had
  (``known_incarnation``); if this store's data never handed it out, claims (reserve, transfer)
  are refused for one lease. "Never handed out" is above the counter, as in the other stores,
  or at or below where the counter started (a store whose counter started from ``TIME`` has
  handed out nothing below that).
* The durable first record of an Instance Spot's claim (execution-model §14) lives in its
  location hash (``first_type``, ``first_payload``), written by the claim script, kept by a
  takeover, and cleared by a fenced script once its handler ended.
* Keys live under ``PREFIX:`` (constructor ``prefix``, default ``"zlink"``): hashes
  ``PREFIX:loc:<spot>`` and ``PREFIX:node:<id>``, the set ``PREFIX:nodes``, the counters
  ``PREFIX:ctr:object_generation``, ``PREFIX:ctr:incarnation`` (and where it started,
  ``PREFIX:ctr:incarnation:base``), ``PREFIX:claims_after`` and ``PREFIX:schema``. Meshes that
  share one Redis database need prefixes of their own (or another database of the server).
* One Redis server (or the primary of a replicated one), not Redis Cluster: a script reaches
  keys named by what it reads (a Spot owner's node record).
* The server is checked at construction (``PING``, and the ``schema`` mark of the prefix): no
  answer is ``Unavailable``; a prefix written by another schema version is ``InvalidArgument``.
* Every Redis failure (no connection, a socket timeout, an error reply) is ``Unavailable``
  raised from the original error. Each command waits at most ``timeout`` seconds for the
  server (connect and read) and is never retried by the client (a retried claim whose first
  try ran could not tell it won): a Redis outage holds no caller longer than about
  ``timeout``. A connection the server closed (a restart) is replaced when it is next taken
  from the pool.
* Calls come from several threads (a node's store thread, its start and stop, status
  readers): redis-py's client and connection pool are thread-safe. ``close()`` closes the
  pool's connections (one in use is closed when its call ends); every later call is
  ``Unavailable``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.commands.core import Script
from redis.retry import Retry

from ..errors import InvalidArgument, Unavailable
from ..executor import Clock
from .location import (
    Location,
    NodeRecord,
    Reservation,
    check_counter,
    check_fence,
    check_lease,
    no_lease,
    no_target,
    recovering,
    refuse_other_mesh,
)

SCHEMA_VERSION = 1  # the value of ``PREFIX:schema``; a prefix marked with another is refused

_T = TypeVar("_T")

# -- the scripts --------------------------------------------------------------------------------
# ARGV[1] is the key prefix ("zlink:"), ARGV[2] the time ("" = the server's TIME). Every value
# goes back to Python as a string: Redis would cut a Lua number to an integer, and Lua's own
# tostring keeps only 14 digits (too few for TIME with microseconds).
_PRELUDE = """
local P = ARGV[1]
local function now_of(given)
  if given ~= '' then return tonumber(given) end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local function micros()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function float(x) return string.format('%.17g', x) end
local function int(x) return string.format('%d', x) end
local function lease_of(node, incarnation)
  -- the lease end of node at incarnation (a string), or nil: no record, another incarnation
  local rec = redis.call('HMGET', P .. 'node:' .. node, 'incarnation', 'lease_until')
  if rec[1] and rec[1] == incarnation then return rec[2] end
  return nil
end
local function owner_lease(node, incarnation)
  -- lease_of, or for an earlier incarnation the latest lease end of those (registering
  -- again keeps it)
  local rec = redis.call('HMGET', P .. 'node:' .. node, 'incarnation', 'lease_until',
    'retired_incarnation', 'retired_lease_until')
  if rec[1] and rec[1] == incarnation then return rec[2] end
  if rec[3] and tonumber(incarnation) <= tonumber(rec[3]) then return rec[4] end
  return nil
end
local function live(node, incarnation, now)
  local lease = lease_of(node, incarnation)
  return lease ~= nil and tonumber(lease) >= now
end
local function location(spot, now)
  -- {kind, type, owner, incarnation, authority, generation, lease_until, live, first_type,
  -- first_payload} or nil ('' for no first record)
  local f = redis.call('HMGET', P .. 'loc:' .. spot, 'kind', 'type_name', 'owner_node',
    'owner_incarnation', 'authority_generation', 'object_generation', 'first_type',
    'first_payload')
  if not f[1] then return nil end
  local out = {f[1], f[2], f[3], f[4], f[5], f[6], '0', '0', f[7] or '', f[8] or ''}
  local lease = owner_lease(f[3], f[4])
  if lease ~= nil then
    out[7] = lease
    out[8] = tonumber(lease) >= now and '1' or '0'
  end
  return out
end
local function writable(spot, node, incarnation, authority, now, missing)
  -- spot's location if node at incarnation and authority may write it; else nil and the
  -- answer: {missing}, {'stale', location} or {'no_lease'}
  local found = location(spot, now)
  if not found then return nil, {missing} end
  if found[3] ~= node or found[4] ~= incarnation or found[5] ~= authority then
    return nil, {'stale', found}
  end
  if not live(node, incarnation, now) then return nil, {'no_lease'} end
  return found, nil
end
local function claims_left(now)
  -- the seconds a store that lost its data still grants no claim, or nil
  local after = redis.call('GET', P .. 'claims_after')
  if after and now < tonumber(after) then return float(tonumber(after) - now) end
  return nil
end
"""

# ARGV: P, now, spot
_LOOKUP = """
local found = location(ARGV[3], now_of(ARGV[2]))
if found then return found end
return false
"""

# ARGV: P, now, spot, kind, type_name, node, incarnation, first_type, first_payload
_CLAIM = """
local now = now_of(ARGV[2])
local spot, node, incarnation = ARGV[3], ARGV[6], ARGV[7]
local found = location(spot, now)
if found and found[8] == '1' then return {'owned', found} end
local lease = lease_of(node, incarnation)
if lease == nil or tonumber(lease) < now then return {'no_lease'} end
local left = claims_left(now)
if left then return {'recovering', left} end
local key = P .. 'ctr:object_generation'
local last = redis.call('GET', key)
if last then last = tonumber(last) else last = micros() end
-- never below the server's clock: a store restored from an older snapshot (that lost only
-- its last writes) still hands out no generation twice
local generation = int(math.max(last + 1, micros()))
redis.call('SET', key, generation)
local authority = '1'
if found then authority = int(tonumber(found[5]) + 1) end
local first_type, first_payload = ARGV[8], ARGV[9]
if found and found[9] ~= '' then  -- a record the previous owner left: kept, replayed once
  first_type, first_payload = found[9], found[10]
end
local key = P .. 'loc:' .. spot
redis.call('HSET', key, 'kind', ARGV[4], 'type_name', ARGV[5],
  'owner_node', node, 'owner_incarnation', incarnation, 'authority_generation', authority,
  'object_generation', generation)
if first_type ~= '' then
  redis.call('HSET', key, 'first_type', first_type, 'first_payload', first_payload)
else
  redis.call('HDEL', key, 'first_type', 'first_payload')
end
local claimed = {ARGV[4], ARGV[5], node, incarnation, authority, generation, lease, '1',
  first_type, first_payload}
if found then return {'claimed', claimed, found} end
return {'claimed', claimed}
"""

# ARGV: P, now, spot, node, incarnation, authority
_RELEASE = """
local spot = ARGV[3]
local found, refused = writable(spot, ARGV[4], ARGV[5], ARGV[6], now_of(ARGV[2]), 'none')
if refused then return refused end
redis.call('DEL', P .. 'loc:' .. spot)
return {'done'}
"""

# ARGV: P, now, spot, node, incarnation, authority, target, target_incarnation, keep_first
_TRANSFER = """
local now = now_of(ARGV[2])
local spot, target = ARGV[3], ARGV[7]
local found, refused = writable(spot, ARGV[4], ARGV[5], ARGV[6], now, 'no_location')
if refused then return refused end
local to = redis.call('HMGET', P .. 'node:' .. target, 'incarnation', 'lease_until')
if not to[1] or tonumber(to[2]) < now or tonumber(to[1]) ~= tonumber(ARGV[8]) then
  return {'no_target'}
end
local left = claims_left(now)
if left then return {'recovering', left} end
local authority = int(tonumber(found[5]) + 1)
redis.call('HSET', P .. 'loc:' .. spot, 'owner_node', target, 'owner_incarnation', to[1],
  'authority_generation', authority)
if ARGV[9] == '1' then  -- the first record moves with its message (LocationStore.transfer)
  return {'moved', {found[1], found[2], target, to[1], authority, found[6], to[2], '1',
    found[9], found[10]}}
end
redis.call('HDEL', P .. 'loc:' .. spot, 'first_type', 'first_payload')
return {'moved', {found[1], found[2], target, to[1], authority, found[6], to[2], '1', '', ''}}
"""

# ARGV: P, now, spot, node, incarnation, authority
_CLEAR_FIRST = """
local spot = ARGV[3]
local found, refused = writable(spot, ARGV[4], ARGV[5], ARGV[6], now_of(ARGV[2]), 'none')
if refused then return refused end
if found[9] == '' then return {'none'} end
redis.call('HDEL', P .. 'loc:' .. spot, 'first_type', 'first_payload')
return {'done'}
"""

# ARGV: P, now, node, endpoint, lease_seconds, known_incarnation
_REGISTER = """
local now = now_of(ARGV[2])
local node, lease_seconds, known = ARGV[3], tonumber(ARGV[5]), tonumber(ARGV[6])
local key, base_key = P .. 'ctr:incarnation', P .. 'ctr:incarnation:base'
local last, base = redis.call('GET', key), nil
if last then
  last = tonumber(last)
  base = tonumber(redis.call('GET', base_key) or '0')
else
  last = micros()
  base = last
  redis.call('SET', base_key, int(base))
end
local lease_until = now + lease_seconds
if known > last or (known > 0 and known <= base) then
  -- an incarnation this store's data never handed out: it lost its data
  local after = redis.call('GET', P .. 'claims_after')
  if not after or tonumber(after) < lease_until then
    redis.call('SET', P .. 'claims_after', float(lease_until))
  end
end
if known > last then last = known end
local incarnation = int(math.max(last + 1, micros()))  -- (as generations: see _CLAIM)
redis.call('SET', key, incarnation)
local node_key = P .. 'node:' .. node
local old = redis.call('HMGET', node_key, 'incarnation', 'lease_until', 'retired_lease_until')
if old[1] then  -- registering again: the earlier incarnations' leases still stand for their
  -- Spots, until the latest of them ends
  local until_ = math.max(tonumber(old[2]), tonumber(old[3] or '0'))
  redis.call('HSET', node_key, 'retired_incarnation', old[1], 'retired_lease_until',
    float(until_))
end
redis.call('HSET', node_key, 'endpoint', ARGV[4], 'incarnation', incarnation,
  'lease_until', float(lease_until))
redis.call('SADD', P .. 'nodes', node)
return {incarnation, float(lease_until)}
"""

# ARGV: P, now, node, incarnation, lease_seconds
_RENEW = """
local now = now_of(ARGV[2])
local key = P .. 'node:' .. ARGV[3]
local rec = redis.call('HMGET', key, 'endpoint', 'incarnation', 'lease_until')
if not rec[2] or rec[2] ~= ARGV[4] or tonumber(rec[3]) < now then return {'no_lease'} end
local lease_until = float(now + tonumber(ARGV[5]))
redis.call('HSET', key, 'lease_until', lease_until)
return {'renewed', rec[1], lease_until}
"""

# ARGV: P, now, node, incarnation
_UNREGISTER = """
local key = P .. 'node:' .. ARGV[3]
local rec = redis.call('HMGET', key, 'incarnation', 'lease_until', 'retired_lease_until')
if rec[1] ~= ARGV[4] or tonumber(rec[2]) <= 0 then return 0 end  -- (0: it left already)
local retired = rec[3]
if retired and tonumber(retired) >= now_of(ARGV[2]) then
  -- an earlier incarnation's lease still holds: kept (its Spots are its own until it ends)
  redis.call('HSET', key, 'lease_until', '0')
  return 1
end
redis.call('DEL', key)
redis.call('SREM', P .. 'nodes', ARGV[3])
return 1
"""

# ARGV: P, now
_NODES = """
local now = now_of(ARGV[2])
local out = {}
for _, node in ipairs(redis.call('SMEMBERS', P .. 'nodes')) do
  local rec = redis.call('HMGET', P .. 'node:' .. node, 'endpoint', 'incarnation', 'lease_until')
  if rec[3] and tonumber(rec[3]) >= now then
    out[#out + 1] = {node, rec[1], rec[2], rec[3]}
  end
end
return out
"""


# ARGV: P, now, spot, node, incarnation, authority (a new object generation, fenced)
_NEW_GENERATION = """
local spot = ARGV[3]
local found, refused = writable(spot, ARGV[4], ARGV[5], ARGV[6], now_of(ARGV[2]), 'none')
if refused then return refused end
local key = P .. 'ctr:object_generation'
local last = redis.call('GET', key)
if last then last = tonumber(last) else last = micros() end
local generation = int(math.max(last + 1, micros()))
redis.call('SET', key, generation)
redis.call('HSET', P .. 'loc:' .. spot, 'object_generation', generation)
found[6] = generation
return {'done', found}
"""

# ARGV: P, now, lapsed_for, spot... (retention: each spot whose owner's lease lapsed before
# now - lapsed_for goes, but one holding a first record; returns how many went)
_PRUNE = """
local now = now_of(ARGV[2])
local before = now - tonumber(ARGV[3])
local gone = 0
for i = 4, #ARGV do
  local found = location(ARGV[i], now)
  if found and found[9] == '' and tonumber(found[7]) < before then
    redis.call('DEL', P .. 'loc:' .. ARGV[i])
    gone = gone + 1
  end
end
return gone
"""

# ARGV: P, now, lapsed_for (retention: node records whose lease lapsed before now - lapsed_for)
_PRUNE_NODES = """
local before = now_of(ARGV[2]) - tonumber(ARGV[3])
local gone = 0
for _, node in ipairs(redis.call('SMEMBERS', P .. 'nodes')) do
  local rec = redis.call('HMGET', P .. 'node:' .. node, 'lease_until', 'retired_lease_until')
  if not rec[1] or (tonumber(rec[1]) < before and tonumber(rec[2] or '0') < before) then
    redis.call('DEL', P .. 'node:' .. node)
    redis.call('SREM', P .. 'nodes', node)
    gone = gone + 1
  end
end
return gone
"""
_PRUNE_BATCH = 500  # spots per script run: the server serves others between runs


class RedisLocationStore:
    """The Location Store in Redis (see the module docstring).

    ``url`` is ``redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]`` or ``rediss://...`` (TLS);
    ``timeout`` bounds each command (seconds); ``clock`` is for tests only (leases follow it
    instead of the server's ``TIME``). ``prefix`` names the mesh's keys (``PREFIX:...``),
    without a ``:`` (an audit found a mesh under ``zlink:loc`` read and swept by the one
    under ``zlink``). ``existing``: a store there already, to look at (``zlink mesh``):
    nothing is written, and a prefix with no schema mark is ``InvalidArgument``."""

    def __init__(
        self,
        url: str,
        clock: Clock | None = None,
        *,
        prefix: str = "zlink",
        timeout: float = 2.0,
        existing: bool = False,
    ) -> None:
        if not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0):
            raise InvalidArgument(f"timeout is a positive number of seconds: {timeout!r}")
        if not isinstance(prefix, str) or not prefix or prefix != prefix.strip() or ":" in prefix:
            raise InvalidArgument(
                f"a Redis store prefix is a non-empty name without ':': {prefix!r}"
            )
        self._existing = existing
        self._where = _checked_url(url)
        self._prefix = prefix + ":"
        self._now: Callable[[], float] | None = None if clock is None else clock.now
        try:
            self._redis: redis.Redis = redis.Redis.from_url(
                url,
                socket_timeout=timeout,
                socket_connect_timeout=timeout,
                retry=Retry(NoBackoff(), 0),  # never run a command twice (see the docstring)
                health_check_interval=0,  # a closed connection is seen when taken from the pool
                decode_responses=True,
            )
        except ValueError as exc:
            raise InvalidArgument(f"a bad Redis store URL {self._where!r}: {exc}") from exc
        self._scripts: dict[str, Script] = {
            name: self._redis.register_script(_PRELUDE + body)
            for name, body in (
                ("lookup", _LOOKUP), ("claim", _CLAIM), ("release", _RELEASE),
                ("transfer", _TRANSFER), ("register", _REGISTER), ("renew", _RENEW),
                ("unregister", _UNREGISTER), ("nodes", _NODES), ("clear_first", _CLEAR_FIRST),
                ("prune", _PRUNE), ("prune_nodes", _PRUNE_NODES),
                ("new_generation", _NEW_GENERATION),
            )
        }  # fmt: skip
        self._lock = threading.Lock()  # a leaf: guards _closed and _calls
        self._closed = False
        self._calls = 0  # calls under way (close() leaves their connections to the last one)
        try:
            self._check()
        except BaseException:
            self._redis.close()
            raise

    @property
    def prefix(self) -> str:
        """The prefix of every key of this store (without the final ``:``)."""
        return self._prefix[:-1]

    def __repr__(self) -> str:
        return f"RedisLocationStore({self._where!r}, prefix={self.prefix!r})"

    # -- membership -----------------------------------------------------------------------------
    def join_mesh(self, mesh: str) -> None:
        """(``LocationStore.join_mesh``) The mesh is the key ``PREFIX:mesh``, set once."""
        key = self._prefix + "mesh"

        def join() -> Any:
            self._redis.set(key, mesh, nx=True)
            return self._redis.get(key)

        theirs = str(self._call(join))  # (the client decodes responses)
        refuse_other_mesh(f"the Location Store {self._where}, prefix {self.prefix!r},", theirs,
                          mesh)  # fmt: skip

    def register_node(
        self, node_id: str, endpoint: str, lease_seconds: float, known_incarnation: int = 0
    ) -> NodeRecord:
        """Register ``node_id`` with a new incarnation, higher than any handed out and than
        ``known_incarnation`` (the one it had: a store whose data never gave it lost its
        data, and then grants no claims for one lease)."""
        known = check_counter(known_incarnation, "known_incarnation")
        incarnation, lease_until = self._run(
            "register", node_id, endpoint, _seconds(check_lease(lease_seconds)), str(known)
        )
        return NodeRecord(node_id, endpoint, int(incarnation), float(lease_until))

    def renew_node(self, node_id: str, incarnation: int, lease_seconds: float) -> NodeRecord:
        """Extend the lease of ``node_id`` at ``incarnation``; refused if it is not the
        current incarnation or its lease lapsed (the node must register again)."""
        answer = self._run(
            "renew", node_id, _int(incarnation), _seconds(check_lease(lease_seconds))
        )
        if answer[0] != "renewed":
            raise no_lease(node_id, incarnation)
        return NodeRecord(node_id, answer[1], incarnation, float(answer[2]))

    def unregister_node(self, node_id: str, incarnation: int) -> bool:
        """Remove ``node_id`` (it stopped); only its current incarnation may."""
        return bool(self._run("unregister", node_id, _int(incarnation)))

    def now(self) -> float:
        """The server's clock (``TIME``), which its leases are on; a test's clock if given."""
        if self._now is not None:
            return self._now()
        seconds, micros = self._call(self._redis.time)
        return float(seconds) + micros / 1_000_000

    def nodes(self) -> list[NodeRecord]:
        """The members: registered nodes whose lease has not lapsed, by id."""
        rows = self._run("nodes")
        try:
            records = [
                NodeRecord(n, endpoint, int(inc), float(until)) for n, endpoint, inc, until in rows
            ]
        except (TypeError, ValueError) as exc:  # (a review found a bare ValueError escape)
            raise Unavailable(
                f"the location store {self._where} holds a node record this version did not"
                f" write: {exc}"
            ) from exc
        return sorted(records, key=lambda r: r.node_id)

    def owned(self) -> dict[tuple[str, int], int]:
        """How many Spots and Actors each node incarnation owns (``zlink mesh``; it scans
        every location key of the prefix, so it is for operators, not for a hot path)."""

        def count() -> dict[tuple[str, int], int]:
            keys = list(self._redis.scan_iter(match=_glob(self._prefix + "loc:") + "*", count=1000))
            counts: dict[tuple[str, int], int] = {}
            for start in range(0, len(keys), 1000):
                pipe = self._redis.pipeline(transaction=False)
                for key in keys[start : start + 1000]:
                    pipe.hmget(key, "owner_node", "owner_incarnation")
                for owner, incarnation in pipe.execute():
                    if owner is not None and incarnation is not None:  # (released since)
                        at = (owner, int(incarnation))
                        counts[at] = counts.get(at, 0) + 1
            return counts

        return self._call(count)

    def new_generation(
        self, spot_id: str, node: str, incarnation: int, authority_generation: int
    ) -> Location:
        """See ``LocationStore.new_generation``: one script."""
        answer = self._run(
            "new_generation", spot_id, node, _int(incarnation), _int(authority_generation)
        )
        if answer[0] == "none":
            raise Unavailable(f"{spot_id!r} has no location")
        _refuse(spot_id, answer, node, incarnation, authority_generation)
        return _location(spot_id, answer[1])

    def prune(self, lapsed_for: float) -> tuple[int, int]:
        """See ``LocationStore.prune``: a scan of the prefix's location keys (for a
        retention sweep, not a hot path), each batch judged and deleted by one script, then
        the node records."""
        pattern = _glob(self._prefix + "loc:") + "*"
        start = len(self._prefix) + len("loc:")
        keys = self._call(lambda: list(self._redis.scan_iter(match=pattern, count=1000)))
        spots = [key[start:] for key in keys]
        rows = 0
        for at in range(0, len(spots), _PRUNE_BATCH):
            rows += int(self._run("prune", _seconds(lapsed_for), *spots[at : at + _PRUNE_BATCH]))
        nodes = int(self._run("prune_nodes", _seconds(lapsed_for)))
        return rows, nodes

    # -- locations ------------------------------------------------------------------------------
    def reserve(
        self, spot_id: str, kind: str, type_name: str, node: str, incarnation: int,
        first: tuple[str, str] | None = None,
    ) -> Reservation:  # fmt: skip
        """Claim ``spot_id`` for ``node`` at ``incarnation`` if nobody owns it, or its owner's
        lease lapsed (re-homing: a new authority and object generation); else say who owns
        it. The claimer must hold a live lease. ``first``: the durable first record, written
        with the claim (a record left by the previous owner is kept instead)."""
        found = self.lookup(spot_id)  # the usual answer: a read, nothing written
        if found is not None and found.owner_live:
            return Reservation(found, created=False)
        first_type, first_payload = ("", "") if first is None else first
        if first is not None and not first_type:
            raise InvalidArgument("a first record names its message type")
        answer = self._run("claim", spot_id, kind, type_name, node, _int(incarnation),
                           first_type, first_payload)  # fmt: skip
        verdict = answer[0]
        if verdict == "owned":
            return Reservation(_location(spot_id, answer[1]), created=False)
        if verdict == "no_lease":
            raise no_lease(node, incarnation)
        if verdict == "recovering":
            raise recovering(float(answer[1]))
        previous = _location(spot_id, answer[2]) if len(answer) > 2 else None
        return Reservation(_location(spot_id, answer[1]), created=True, previous=previous)

    def clear_first(
        self, spot_id: str, node: str, incarnation: int, authority_generation: int
    ) -> bool:
        """The first record's handler ended: forget the record (fenced like any write);
        ``False`` if there was none."""
        answer = self._run(
            "clear_first", spot_id, node, _int(incarnation), _int(authority_generation)
        )
        verdict = answer[0]
        _refuse(spot_id, answer, node, incarnation, authority_generation)
        return bool(verdict == "done")

    def lookup(self, spot_id: str) -> Location | None:
        """The current location of ``spot_id``, or ``None``."""
        fields = self._run("lookup", spot_id)
        return None if fields is None else _location(spot_id, fields)

    def release(self, spot_id: str, node: str, incarnation: int, authority_generation: int) -> bool:
        """Forget ``spot_id`` (it closed); refused for anyone but its current owner, and for
        an owner whose lease lapsed."""
        answer = self._run("release", spot_id, node, _int(incarnation), _int(authority_generation))
        verdict = answer[0]
        _refuse(spot_id, answer, node, incarnation, authority_generation)
        return bool(verdict == "done")

    def transfer(
        self, spot_id: str, node: str, incarnation: int, authority_generation: int, target: str,
        target_incarnation: int, keep_first: bool = False,
    ) -> Location:  # fmt: skip
        """See ``LocationStore.transfer``."""
        answer = self._run(
            "transfer",
            spot_id,
            node,
            _int(incarnation),
            _int(authority_generation),
            target,
            _int(target_incarnation),
            "1" if keep_first else "",
        )
        verdict = answer[0]
        if verdict == "no_location":
            raise Unavailable(f"{spot_id!r} has no location to transfer")
        _refuse(spot_id, answer, node, incarnation, authority_generation)
        if verdict == "no_target":
            raise no_target(spot_id, target, target_incarnation)
        if verdict == "recovering":
            raise recovering(float(answer[1]))
        return _location(spot_id, answer[1])

    # -- the server -----------------------------------------------------------------------------
    def close(self) -> None:
        """Close the connections; later calls are ``Unavailable`` (idempotent)."""
        with self._lock:
            self._closed = True
            idle = self._calls == 0
        # the idle ones now; one in use is closed by its call as it ends (see _call)
        self._redis.connection_pool.disconnect(inuse_connections=idle)

    def __enter__(self) -> RedisLocationStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, script: str, *args: str) -> Any:
        """Run one of the scripts (loaded again if the server lost it)."""
        now = "" if self._now is None else repr(float(self._now()))
        call = self._scripts[script]
        return self._call(lambda: call(args=(self._prefix, now, *args)))

    def _call(self, body: Callable[[], _T]) -> _T:
        """Run ``body`` against the server: a Redis failure is ``Unavailable``."""
        with self._lock:
            if self._closed:
                raise Unavailable(f"the location store {self._where} is closed")
            self._calls += 1
        try:
            return body()
        except (redis.RedisError, OSError) as exc:
            raise Unavailable(f"the location store {self._where} failed: {exc}") from exc
        finally:
            with self._lock:
                self._calls -= 1
                last = self._closed and self._calls == 0
            if last:  # close() came while calls ran: the last one closes every connection
                self._redis.connection_pool.disconnect()

    def _check(self) -> None:
        """Construction: the server answers, and the prefix holds this schema (or nothing:
        then it is marked)."""
        key = self._prefix + "schema"

        def check() -> Any:
            self._redis.ping()
            if not self._existing:  # (looking writes nothing)
                self._redis.set(key, str(SCHEMA_VERSION), nx=True)  # a mark never changes
            return self._redis.get(key)

        try:
            found = self._call(check)
        except Unavailable as exc:
            cause = exc.__cause__
            if isinstance(cause, redis.ResponseError) and str(cause).startswith("WRONGTYPE"):
                raise InvalidArgument(
                    f"{self._where} holds {key!r}, which is not a ZLink location store mark"
                    f" ({cause})"
                ) from cause
            raise
        if found is None and self._existing:
            raise InvalidArgument(
                f"no Location Store at {self._where} under the prefix {self.prefix!r}"
            )
        if found is not None and found != str(SCHEMA_VERSION):
            raise InvalidArgument(
                f"the location store {self._where} (prefix {self.prefix!r}) has schema version"
                f" {found!r}; this ZLink reads version {SCHEMA_VERSION} only"
            )


def _location(spot_id: str, fields: Sequence[str]) -> Location:
    """A script's location (see ``location`` in the prelude). A row of another shape (written
    under the prefix by another tool or version) is ``Unavailable``, as any store failure:
    an audit found a bare ``ValueError`` reach the caller."""
    try:
        (kind, type_name, owner, incarnation, authority, generation, lease_until, live,
         first_type, first_payload) = fields  # fmt: skip
        first = (first_type, first_payload) if first_type else None
        return Location(spot_id, kind, type_name, owner, int(incarnation), int(authority),
                        int(generation), float(lease_until), live == "1", first)  # fmt: skip
    except (TypeError, ValueError) as exc:
        raise Unavailable(
            f"the location store's row of {spot_id!r} is not one this version wrote: {exc}"
        ) from exc


def _refuse(
    spot_id: str, answer: Sequence[Any], node: str, incarnation: int, authority: int
) -> None:
    """Raise what a fenced script's ``stale`` or ``no_lease`` answer means (else nothing)."""
    if answer[0] == "stale":
        check_fence(_location(spot_id, answer[1]), node, incarnation, authority)
    if answer[0] == "no_lease":
        raise no_lease(node, incarnation)


def _int(value: int) -> str:
    """An integer argument as the scripts compare it (the decimal digits of the stored one):
    within ``0 .. 2**53 - 1``, exact in Lua's numbers, else ``InvalidArgument``."""
    return str(check_counter(value, "an incarnation or generation"))


def _seconds(value: float) -> str:
    """A number of seconds as the scripts read it (``repr``: exact in Lua's ``tonumber``)."""
    return repr(float(value))


def _glob(text: str) -> str:
    """``text`` matched literally by a Redis glob pattern (``SCAN ... MATCH``)."""
    return "".join("\\" + c if c in "\\*?[]" else c for c in text)


def _checked_url(url: str) -> str:
    """``url`` checked (``InvalidArgument``), and shown without its user and password (error
    messages and ``repr`` show this one)."""
    forms = "redis://HOST[:PORT][/DB] or rediss://HOST[:PORT][/DB]"
    try:
        parts = urlsplit(url)
        port = parts.port
    except (TypeError, ValueError) as exc:  # not shown: it may hold a password
        raise InvalidArgument(f"a Redis store URL is {forms}; this one is not ({exc})") from None
    host = parts.hostname or ""
    shown = f"{parts.scheme}://{f'[{host}]' if ':' in host else host}"
    shown += f"{'' if port is None else f':{port}'}{parts.path}"
    if parts.scheme.lower() not in ("redis", "rediss"):
        raise InvalidArgument(f"a Redis store URL is {forms}: {shown!r}")
    if not host:
        raise InvalidArgument(f"a Redis store URL names its host: {shown!r}; use {forms}")
    if parts.query or parts.fragment:
        raise InvalidArgument(
            f"a Redis store URL takes no options: {shown!r} (timeout and prefix are arguments"
            " of RedisLocationStore)"
        )
    if parts.path not in ("", "/") and not (parts.path[1:].isascii() and parts.path[1:].isdigit()):
        raise InvalidArgument(f"a Redis store URL ends with a database number: {shown!r}")
    return shown
