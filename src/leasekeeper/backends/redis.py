"""RedisStreamsBackend: leasekeeper on a Redis stream and its consumer group (Redis >= 6.2).

::

    import leasekeeper

    backend = leasekeeper.connect("redis://localhost:6379/0?stream=jobs&group=workers")
    with leasekeeper.LeaseManager(backend, visibility_timeout=30) as manager:
        for held in manager.receive(max_messages=10, wait_seconds=5):
            with held:  # leased from the moment it arrived
                handle(held.message.body)

A message is a stream entry; its body is the entry's field ``body`` and its other
fields are its attributes. How a consumer group maps onto the backend contract
(docs/backends/redis.md, docs/backend-semantics.md):

- ``receive`` is one server-side script: XAUTOCLAIM of the entries idle longer than
  the visibility timeout (left by a consumer that died or released them), then
  XREADGROUP of new ones. The receipt is the consumer the entry was delivered to
  and its delivery count (XPENDING's), so ``receive_count`` is that count.
- ``extend`` resets the entry's idle time with XCLAIM ... JUSTID (which counts no
  delivery), ``release`` sets it so that the entry is reclaimable after the delay,
  and ``delete`` is XACK + XDEL: each in a script that first checks the entry is
  still pending for that consumer with that delivery count, and still exists. So
  an entry another consumer reclaimed is reported ``lost``, never stolen back.
- The visibility timeout is the *group's*: XAUTOCLAIM reclaims what has been idle
  longer than it, so every consumer of the group must use the same value
  (``visibility_timeout=``, whole seconds). It is also ``max_visibility``: an
  extend can only reset the idle time, and a shorter visibility is an idle time
  set ahead (a release with delay ``d`` sets it to ``visibility_timeout - d``).
- XDEL removes an entry for every group of the stream: one group per stream.
- There is no cap on a lease (``max_lease_age`` is ``math.inf``) and no delayed
  delivery (``send(delay=...)`` > 0 is a ValueError).
"""

from __future__ import annotations

import logging
import os
import re
import socket
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, NamedTuple
from urllib.parse import quote

try:
    import redis
    from redis import exceptions as errors
except ImportError as _exc:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "leasekeeper.backends.redis needs redis-py, which is not installed: "
        "pip install 'redis>=4.5' (what leasekeeper's redis extra brings)"
    ) from _exc

from leasekeeper.backends.cloud import CloudBackend
from leasekeeper.backends.contract import Handle, Message, Outcome, QueueCounts
from leasekeeper.backends.rebuild import redis_renewal_problem, redis_secrets, redis_settings
from leasekeeper.backends.shared import ErrorTable, chunked, clean_code, text_body
from leasekeeper.backends.spec import URLSpec
from leasekeeper.clock import SYSTEM_CLOCK, Clock, DrivenClock
from leasekeeper.errors import ConfigError

__all__ = ["DEFAULT_GROUP", "RedisEntry", "RedisStreamsBackend"]

log = logging.getLogger("leasekeeper.backends.redis")

MAX_BATCH = 100  # handles one script call checks and extends
MAX_RECEIVE = 100
DEFAULT_GROUP = "leasekeeper"
# An idle receive blocks in slices this long, looking for reclaimable entries in
# between: XREADGROUP's BLOCK wakes for new entries only, not for released ones.
RECLAIM_EVERY = 1.0

ERRORS = ErrorTable(
    retry="BUSY LOADING MASTERDOWN TRYAGAIN CLUSTERDOWN READONLY OOM",
    fatal="NOGROUP WRONGTYPE NOPERM NOAUTH WRONGPASS",
    bug="ERR",
)

# Receive: reclaim what is idle >= ARGV[4] ms, then read new entries, each as {id,
# delivery count, fields}, and hide them ARGV[5] ms less long; with the stream's last
# id (to wait for a newer one). Redis 6.2 answers a pending entry that was deleted
# with a bare nil (7.0 lists it apart and drops it): then this consumer's pending
# entries that no longer exist are acknowledged, so they stop coming back.
_RECEIVE = """
local stream, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local count, reset = tonumber(ARGV[3]), ARGV[5]
local out, dead = {}, false
local claimed = redis.call('XAUTOCLAIM', stream, group, consumer, ARGV[4], '0-0', 'COUNT', count)
for _, entry in ipairs(claimed[2]) do
  if entry then
    local p = redis.call('XPENDING', stream, group, entry[1], entry[1], 1)
    out[#out + 1] = {entry[1], p[1][4], entry[2]}
  else
    dead = true
  end
end
if dead then
  for _, p in ipairs(redis.call('XPENDING', stream, group, '-', '+', count, consumer)) do
    if #redis.call('XRANGE', stream, p[1], p[1]) == 0 then
      redis.call('XACK', stream, group, p[1])
    end
  end
end
if #out < count then
  local read = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', count - #out,
                          'STREAMS', stream, '>')
  if read then
    for _, entry in ipairs(read[1][2]) do out[#out + 1] = {entry[1], 1, entry[2]} end
  end
end
if tonumber(reset) > 0 then
  for _, entry in ipairs(out) do
    redis.call('XCLAIM', stream, group, consumer, 0, entry[1], 'IDLE', reset, 'JUSTID')
  end
end
local last = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)
return {out, last[1] and last[1][1] or '0-0'}
"""

# Extend, release or delete entries (ARGV[4..]: id, consumer, delivery count) only
# while each is pending for that consumer with that count, and exists: "ok",
# "gone" (acknowledged or deleted) or "taken" (delivered again since).
_CHANGE = """
local stream, group, mode, idle = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local out = {}
for i = 4, #ARGV, 3 do
  local id, consumer, count = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local p = redis.call('XPENDING', stream, group, id, id, 1)
  local state = 'ok'
  if #p == 0 then
    state = 'gone'
  elseif p[1][2] ~= consumer or p[1][4] ~= count then
    state = 'taken'
  elseif #redis.call('XRANGE', stream, id, id) == 0 then
    redis.call('XACK', stream, group, id)
    state = 'gone'
  elseif mode == 'delete' then
    redis.call('XACK', stream, group, id)
    redis.call('XDEL', stream, id)
  else
    redis.call('XCLAIM', stream, group, consumer, 0, id, 'IDLE', idle, 'JUSTID')
  end
  out[#out + 1] = state
end
return out
"""
_STATES = {
    "ok": Outcome("ok"),
    "gone": Outcome("lost", detail="not pending: acknowledged or deleted"),
    "taken": Outcome("lost", detail="delivered again since: reclaimed by a consumer"),
}
_UNKNOWN = Outcome("retry", detail="unknown answer")
_SCRIPT_ERROR = re.compile(r"@user_script:\d+: (\S+)")


class RedisEntry(NamedTuple):
    """What ``Message.raw`` holds: a stream entry as it was delivered."""

    id: str
    fields: Mapping[str, bytes | str]  # by name: body and the attributes
    consumer: str  # the consumer it was delivered to
    delivery_count: int


def _text(value: bytes | str) -> str:
    return value if isinstance(value, str) else value.decode("utf-8", "replace")


class RedisStreamsBackend(CloudBackend):
    """Leases on one Redis stream's consumer group (see the module docstring).

    ``client`` is a ``redis.Redis`` (thread-safe; built with ``decode_responses``
    False, the default); ``stream`` and ``group`` name the stream and its group,
    created (from id 0, so no entry written earlier is skipped) if missing.
    ``consumer`` names this consumer: by default this host and process,
    ``<hostname>-<pid>``, looked up at each receive (a forked child is a consumer of
    its own). ``visibility_timeout`` is the group's, whole seconds >= 1, the same
    for every consumer of the group. A failed receive or send raises ``ReceiveError``.
    """

    service = "Redis Streams"
    receipt_name = "delivery"
    logger = log
    bad_argument_code = "ERR"
    min_receive_visibility = 1
    min_release = 0
    carries_attributes = True

    max_batch = MAX_BATCH
    rotates_receipts = False
    max_receive = MAX_RECEIVE

    def __init__(
        self,
        client: redis.Redis,
        stream: str,
        group: str = DEFAULT_GROUP,
        *,
        consumer: str | None = None,
        visibility_timeout: float = 30.0,
        clock: Clock | None = None,
    ) -> None:
        if not isinstance(client, redis.Redis):
            raise TypeError(f"RedisStreamsBackend takes a redis.Redis, got {type(client).__name__}")
        for name, value in (("stream", stream), ("group", group), ("consumer", consumer or "-")):
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a non-empty str, got {value!r}")
        if not (isinstance(visibility_timeout, (int, float)) and visibility_timeout >= 1) or (
            visibility_timeout != int(visibility_timeout)
        ):
            raise ValueError(
                f"visibility_timeout must be whole seconds >= 1, got {visibility_timeout!r}"
            )
        self.client, self.stream, self.group = client, stream, group
        self._consumer = consumer
        self.max_visibility = float(visibility_timeout)
        self.clock: Clock = clock if clock is not None else SYSTEM_CLOCK
        self._receive_script = client.register_script(_RECEIVE)
        self._change_script = client.register_script(_CHANGE)
        self.call("connect", self._create_group)

    def _create_group(self) -> None:
        version = str(self.client.info("server").get("redis_version", "0"))
        if tuple(int(part) for part in version.split(".")[:2]) < (6, 2):
            raise ConfigError(f"Redis Streams leases need Redis >= 6.2 (XAUTOCLAIM), got {version}")
        try:
            self.client.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except errors.ResponseError as exc:
            if not str(exc).startswith("BUSYGROUP"):
                raise

    @property
    def consumer(self) -> str:
        """This consumer's name: the one given, else ``<hostname>-<pid>``."""
        return self._consumer or f"{socket.gethostname()}-{os.getpid()}"

    def spec(self) -> URLSpec:
        """This server (host, port, db, TLS, user, client name), stream and group by
        URL, without the password: the other process takes it from ``REDIS_PASSWORD``
        (see ``leasekeeper.backends.schemes.redis``), the renewer process from
        ``secret_options()``."""
        pool = self.client.connection_pool
        kwargs = pool.connection_kwargs
        scheme = "rediss" if issubclass(pool.connection_class, redis.SSLConnection) else "redis"
        user = f"{quote(kwargs['username'], safe='')}@" if kwargs.get("username") else ""
        name = kwargs.get("client_name")
        return URLSpec.of(
            f"{scheme}://{user}{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
            f"/{kwargs.get('db', 0)}?stream={self.stream}&group={self.group}"
            + (f"&client_name={quote(name, safe='')}" if name else ""),
            {
                "visibility_timeout": self.max_visibility,
                "consumer": self._consumer,
                **redis_settings(self.client),  # a unix socket, TLS given in code
            },
        )

    def secret_options(self) -> dict[str, Any]:
        """The client's password (and its key's): for the renewer process only."""
        return redis_secrets(self.client)

    def credentials_problem(self) -> str | None:
        return redis_renewal_problem(self.client)

    def sibling(self, name: str, *, create: bool = True) -> RedisStreamsBackend:
        """The stream ``name`` on the same server, with a group of the same name and
        timeout (a stream and its group are made on first use)."""
        return RedisStreamsBackend(
            self.client,
            name,
            self.group,
            consumer=self._consumer,
            visibility_timeout=self.max_visibility,
            clock=self.clock,
        )

    def __repr__(self) -> str:
        return f"RedisStreamsBackend(stream={self.stream!r}, group={self.group!r})"

    def close(self) -> None:
        """Forget this consumer in the group if it holds no entry (its name is this
        process's: nobody else will use it). The client you passed stays open."""
        consumer = self.consumer
        try:
            if not self.client.xpending_range(self.stream, self.group, "-", "+", 1, consumer):
                self.client.xgroup_delconsumer(self.stream, self.group, consumer)
        except Exception as exc:  # best effort: a closing backend raises nothing
            log.debug("could not remove consumer %s: %s", consumer, type(exc).__name__)

    def queue_counts(self) -> QueueCounts:
        """Exactly: entries not yet delivered (XLEN less the pending ones: a delete
        removes its entry) and pending ones (XPENDING); no delayed delivery."""
        pipe = self.client.pipeline(transaction=True)
        pipe.xlen(self.stream)
        pipe.xpending(self.stream, self.group)
        length, pending = self.call("counts", pipe.execute)
        held = int(pending["pending"])
        return QueueCounts(max(0, int(length) - held), held, 0)

    # ------------------------------------------------------------------ receiving

    def receive_messages(self, count: int, wait: float, visibility: float | None) -> list[Message]:
        vis = self.max_visibility if visibility is None else visibility
        # Hidden for vis: an idle time set ahead by max_visibility - vis (rounded down).
        args: list[Any] = [self.group, self.consumer, count, int(self.max_visibility * 1000)]
        args.append(max(0, int((self.max_visibility - vis) * 1000)))
        deadline = self.clock.now() + wait
        while True:
            received_at = self.clock.now()  # just before the request: rule 1
            found, last = self.call("receive", partial(self._receive_script, [self.stream], args))
            if found:
                return [self._message(entry, args[1], received_at, vis) for entry in found]
            left = deadline - self.clock.now()
            if left <= 0 or isinstance(self.clock, DrivenClock):
                return []
            # Wait for an entry newer than the last one (XREAD consumes nothing), or for
            # RECLAIM_EVERY: a released or abandoned entry wakes no blocked read.
            block = max(1, int(min(left, RECLAIM_EVERY) * 1000))
            self.call("receive", partial(self.client.xread, {self.stream: last}, 1, block))

    def _message(self, entry: Any, consumer: str, received_at: float, vis: float) -> Message:
        entry_id, count, fields = entry
        if not isinstance(fields, Mapping):  # a script's flat [name, value, ...] list
            fields = dict(zip(fields[::2], fields[1::2], strict=True))
        named = {_text(name): value for name, value in fields.items()}
        raw = RedisEntry(_text(entry_id), named, consumer, int(count))
        return self.new_message(
            id=raw.id,
            receipt=f"{raw.delivery_count}:{consumer}",
            body=text_body(named.get("body", b""), decode=True),
            raw=raw,
            received_at=received_at,
            visibility=vis,
            count=raw.delivery_count,
            attributes={name: _text(v) for name, v in named.items() if name != "body"},
        )

    def adopt(self, raw: Any, visibility_timeout: float | None = None) -> Message:
        """A Message for a ``RedisEntry`` (``message.raw``), counted from now for
        ``visibility_timeout`` (None: the group's)."""
        if not isinstance(raw, RedisEntry):
            raise TypeError(f"RedisStreamsBackend.adopt() takes a RedisEntry, got {raw!r}")
        vis = self.max_visibility if visibility_timeout is None else visibility_timeout
        seconds = self.adopt_visibility(vis)
        entry = (raw.id, raw.delivery_count, raw.fields)
        return self._message(entry, raw.consumer, self.clock.now(), seconds)

    # ------------------------------------------------------------------ producing

    def send_message(self, body: str | bytes, attributes: dict[str, str], delay: int) -> str:
        if "body" in attributes:
            raise ValueError("an attribute cannot be named 'body': that field is the body")
        fields: dict[Any, Any] = {"body": body, **attributes}
        return _text(self.call("send", lambda: self.client.xadd(self.stream, fields)))

    # ------------------------------------------------------------------ the manager's calls

    def send_extend(self, handles: Sequence[Handle], seconds: int) -> list[Outcome]:
        return self._run("extend", handles, int((self.max_visibility - seconds) * 1000))

    def send_release(self, handles: Sequence[Handle], seconds: int) -> list[Outcome]:
        return self._run("release", handles, int((self.max_visibility - seconds) * 1000))

    def send_delete(self, handles: Sequence[Handle]) -> list[Outcome]:
        return self._run("delete", handles, 0)

    def _run(self, operation: str, handles: Sequence[Handle], idle_ms: int) -> list[Outcome]:
        def send(batch: Sequence[Handle]) -> list[Outcome]:
            entries = []
            for handle in batch:
                count, _, consumer = handle.receipt.partition(":")
                entries.append((handle.message_id, consumer, int(count)))
            return self._change(operation, entries, idle_ms)

        out: list[Outcome] = []
        for chunk in chunked(handles, MAX_BATCH):
            out.extend(self.whole_call(operation, chunk, send))
        return out

    def _change(
        self, operation: str, entries: list[tuple[str, str, int]], idle_ms: int
    ) -> list[Outcome]:
        args: list[Any] = [self.group, "delete" if operation == "delete" else "idle", idle_ms]
        for entry in entries:
            args.extend(entry)
        states = self._change_script([self.stream], args)
        return [_STATES.get(_text(state), _UNKNOWN) for state in states]

    # ------------------------------------------------------------------ errors

    def classify(self, exc: BaseException, receipts: Sequence[str] = ()) -> Outcome:
        """An error of redis-py: "fatal" for refused credentials and the errors in
        ``ERRORS`` (NOGROUP: the stream or its group is gone), "retry" for connection
        errors, timeouts and the rest. The detail is the error's code, never its text."""
        name = type(exc).__name__
        if isinstance(exc, (errors.AuthenticationError, errors.AuthorizationError)):
            return Outcome("fatal", detail=f"{name}: the credentials were refused")
        if isinstance(exc, errors.ResponseError):
            # Redis 6.2 wraps a script's error: "... @user_script:5: NOGROUP ..."
            text = str(exc)
            inner = _SCRIPT_ERROR.search(text)
            code = clean_code(inner.group(1) if inner else text.split(" ", 1)[0]) or name
            kind = ERRORS.kind(code) or "retry"
            return Outcome(kind, detail=code)
        if isinstance(exc, ConfigError):
            return Outcome("fatal", detail=str(exc))
        return Outcome("retry", detail=name)
