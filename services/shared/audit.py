"""The audit log: operator actions appended to a Redis stream as a hash chain.

Each entry's hash is h_i = SHA-256(h_{i-1} || canonical entry_i) with h_0 = 64 zeros, and the
entry itself names h_{i-1} and its position. Changing, removing or reordering an entry breaks
the chain from that entry on, which `verify` reports. The head (last hash, count) is kept
beside the stream and moves in the same atomic step as each append, so a cut-off tail is found
too. Whoever can rewrite both the stream and the head can still forge a consistent history:
the chain proves integrity against a head copied elsewhere, not against Redis' own admin.

Appends from several processes stay one chain: an append is written only if the head is still
the one its hash was computed from, and is recomputed otherwise. An append may also carry a
versioned hash write (e.g. a breaker reset), applied in the same step: the change and its
audit entry exist together or not at all.

Nothing trims the stream: verification starts at the first entry.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError
from redis.asyncio import Redis

from common.clock import EpochClock
from schemas.envelope import SHORT_TEXT_MAX, Identifier, Reason, ShortText
from services.shared.redis_client import Keys, text

GENESIS = "0" * 64
APPEND_ATTEMPTS = 50
READ_BATCH = 500

Role = Literal["node", "viewer", "operator", "admin", "service"]
Hash = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
Target = Annotated[str, StringConstraints(min_length=1, max_length=SHORT_TEXT_MAX)]
Result = ShortText

# KEYS[1] stream, KEYS[2] head hash, KEYS[3] guarded hash (ignored without a guard).
# ARGV[1] head hash the entry was chained to ('' = none yet), ARGV[2] the entry's hash,
# ARGV[3] the canonical entry, ARGV[4] its sequence number, ARGV[5] '1' if guarded,
# ARGV[6] the guarded hash's version read, ARGV[7] a member to remove from the set KEYS[4]
# with it ('' none), ARGV[8..] its new field/value pairs.
# Returns {1, id} appended, {0, ''} the head moved on, {-1, ''} the guarded hash moved on.
APPEND = """
local head = redis.call('HGET', KEYS[2], 'hash') or ''
if head ~= ARGV[1] then return {0, ''} end
if ARGV[5] == '1' then
  local version = tonumber(redis.call('HGET', KEYS[3], 'version') or '0')
  if version ~= tonumber(ARGV[6]) then return {-1, ''} end
  if ARGV[7] ~= '' then redis.call('SREM', KEYS[4], ARGV[7]) end
  redis.call('HSET', KEYS[3], 'version', version + 1, unpack(ARGV, 8))
end
local id = redis.call('XADD', KEYS[1], '*', 'entry', ARGV[3], 'hash', ARGV[2])
redis.call('HSET', KEYS[2], 'hash', ARGV[2], 'seq', ARGV[4], 'id', id)
return {1, id}
"""


class AuditEntry(BaseModel):
    """Who did what to which target, why, and what came of it."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    seq: Annotated[int, Field(ge=1)]
    at: float = Field(description="When, in epoch seconds.")
    actor: Identifier
    role: Role
    action: Identifier
    target: Target
    reason: Reason
    result: Result
    prev: Hash = Field(description="The hash of the entry before (GENESIS for the first).")


@dataclass(frozen=True)
class AuditRecord:
    """An entry as stored: its stream id and its chain hash."""

    id: str
    entry: AuditEntry
    hash: str


@dataclass(frozen=True)
class VersionedWrite:
    """A change to a hash that carries a `version` field, made only if the version is unchanged."""

    key: str
    version: int
    fields: Sequence[str]  # field, value, field, value, ...
    unset: tuple[str, str] | None = None  # (set key, member) removed in the same step


@dataclass(frozen=True)
class Verdict:
    """What `verify` found: `ok`, or the first entry that breaks the chain and why."""

    ok: bool
    entries: int
    reason: str = ""
    bad_id: str | None = None


def canonical(entry: AuditEntry) -> bytes:
    """The exact bytes hashed and stored: sorted keys, no spaces, ASCII only.

    ASCII escaping also keeps control characters in a reason from forging lines in any log
    the entry is printed to.
    """
    return json.dumps(entry.model_dump(mode="json"), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=True).encode()


def chain_hash(prev: str, canonical_entry: bytes) -> str:
    """h_i = SHA-256(h_{i-1} || entry_i), hex."""
    return hashlib.sha256(prev.encode() + canonical_entry).hexdigest()


class AuditLog:
    """Appends to and verifies the hash-chained audit stream."""

    def __init__(self, redis: Redis, keys: Keys,
                 clock: EpochClock = time.time) -> None:
        self.redis = redis
        self.keys = keys
        self.clock = clock
        self._append = redis.register_script(APPEND)

    def stream_key(self) -> str:
        return self.keys.audit_log()

    def head_key(self) -> str:
        """HASH hash, seq, id of the last entry."""
        return f"{self.keys.audit_log()}-head"

    async def append(self, actor: str, role: Role, action: str, target: str, reason: str,
                     result: str) -> AuditRecord:
        """Append one entry (raises ValidationError on bad fields)."""
        record = await self._append_entry(actor, role, action, target, reason, result, None)
        if record is None:  # only a guarded append can be refused
            raise RuntimeError("unguarded audit append refused")
        return record

    async def append_guarded(self, actor: str, role: Role, action: str, target: str,
                             reason: str, result: str,
                             guard: VersionedWrite) -> AuditRecord | None:
        """Append one entry and apply `guard` in the same atomic step.

        None (nothing written) if the guarded hash's version moved on: the caller reads it
        again, recomputes the change and its result, and retries.
        """
        return await self._append_entry(actor, role, action, target, reason, result, guard)

    async def _append_entry(self, actor: str, role: Role, action: str, target: str,
                            reason: str, result: str,
                            guard: VersionedWrite | None) -> AuditRecord | None:
        for _ in range(APPEND_ATTEMPTS):
            head = await self._head()
            prev = head.get("hash", "")
            entry = AuditEntry(
                seq=int(head.get("seq", "0")) + 1, at=self.clock(), actor=actor, role=role,
                action=action, target=target, reason=reason, result=result,
                prev=prev or GENESIS,
            )
            body = canonical(entry)
            digest = chain_hash(entry.prev, body)
            status, stream_id = await self._append(
                keys=[self.stream_key(), self.head_key(),
                      guard.key if guard else self.head_key(),
                      guard.unset[0] if guard and guard.unset else self.head_key()],
                args=[prev, digest, body, entry.seq, "1" if guard else "0",
                      guard.version if guard else 0,
                      guard.unset[1] if guard and guard.unset else "",
                      *(guard.fields if guard else ())],
            )
            if int(status) == 1:
                return AuditRecord(id=text(stream_id), entry=entry, hash=digest)
            if int(status) == -1:
                return None
            # Another writer appended first: chain to its entry instead.
        raise RuntimeError("audit log head kept moving; append abandoned")

    async def _head(self) -> dict[str, str]:
        return {text(k): text(v) for k, v in (await self.redis.hgetall(self.head_key())).items()}

    async def read(self, count: int = 100) -> list[AuditRecord]:
        """The last `count` entries, oldest first (not verified: see `verify`)."""
        rows = _rows(await self.redis.xrevrange(self.stream_key(), count=count))
        return [AuditRecord(id=stream_id,
                            entry=AuditEntry.model_validate_json(fields.get("entry", b"")),
                            hash=text(fields.get("hash", b"")))
                for stream_id, fields in reversed(rows)]

    async def verify(self) -> Verdict:
        """Recompute the chain from the first entry and compare it with the head."""
        running, count, start = GENESIS, 0, "-"
        while True:
            rows = _rows(await self.redis.xrange(self.stream_key(), min=start,
                                                 count=READ_BATCH))
            for stream_id, fields in rows:
                body_bytes = fields.get("entry")
                stored = fields.get("hash")
                if body_bytes is None or stored is None:
                    return Verdict(False, count, "entry without body or hash", stream_id)
                try:
                    entry = AuditEntry.model_validate_json(body_bytes)
                except ValidationError as err:
                    return Verdict(False, count, f"unreadable entry: {err.error_count()} "
                                                 "error(s)", stream_id)
                count += 1
                if entry.seq != count or entry.prev != running:
                    return Verdict(False, count - 1, f"entry {entry.seq} does not follow entry "
                                   f"{count - 1}: removed or reordered entries", stream_id)
                running = chain_hash(running, body_bytes)
                if text(stored) != running:
                    return Verdict(False, count - 1, f"entry {entry.seq} was changed", stream_id)
            if len(rows) < READ_BATCH:
                break
            start = f"({rows[-1][0]}"
        head = await self._head()
        if head.get("hash", GENESIS) != running or int(head.get("seq", "0")) != count:
            return Verdict(False, count, f"head says {head.get('seq', '0')} entries, the "
                                         f"stream holds {count}: entries cut off or head changed")
        return Verdict(True, count)


def _rows(reply: object) -> list[tuple[str, dict[str, bytes]]]:
    """A stream range reply as (id, {field: raw bytes}).

    redis-py types range replies loosely (ids and fields may be None for entries deleted
    under a consumer group); an audit stream read by range has neither, but a row without
    fields is kept, empty, so `verify` reports it instead of skipping it.
    """
    rows: list[tuple[str, dict[str, bytes]]] = []
    for stream_id, fields in cast(list[tuple[bytes | str, dict[bytes | str, bytes | str] | None]],
                                  reply or []):
        rows.append((text(stream_id), {
            text(k): v if isinstance(v, bytes) else v.encode()
            for k, v in (fields or {}).items()}))
    return rows
