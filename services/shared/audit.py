"""The audit log: operator actions appended to a Redis stream as a hash chain with a keyed head.

Each entry's hash is h_i = SHA-256(h_{i-1} || canonical entry_i) with h_0 = 64 zeros, and the
entry itself names h_{i-1} and its position. Changing, removing or reordering an entry breaks
the chain from that entry on, which `verify` reports. The head (last hash, count) is kept
beside the stream and moves in the same atomic step as each append, so a cut-off tail is found
too.

Whoever can write Redis could still cut the tail off and rewrite the head to match. The head
therefore also carries a MAC under a key Redis never sees (`head_mac`):

    HMAC-SHA256(audit key, "clusterwarden-audit-head-v1" NUL chain NUL "<hash>:<count>")

`verify` recomputes the chain and checks the MAC against the recomputed last hash and count: a
head without one, or with one the key does not give, fails. An append checks the head it
chains to the same way. One that fails is not keyed again, since that would make a cut log
verify: the entry is appended and the new head left without a MAC, failing until an admin has
checked the log and keys it (`key_head`). The key is WARDEN_AUDIT_KEY, else a file in the state
folder made on first use (`audit_key`); every process that appends or verifies needs the same.

What the key does not protect against: whoever holds it (a process that appends, its host, a
copy of the key) can key any history. Nor a rollback: an older keyed head restored with the
stream as it was then (from a backup, or both emptied back to a new log's head, which needs no
MAC) verifies, since the key vouches for every head it ever keyed. A head exported and kept
apart catches that (`verify`'s `anchor`: the chain must still hold that entry; the store's
audit log records each breaker reset's hash here as `redis_audit_hash`).

Appends from several processes stay one chain: an append is written only if the head is still
the one its hash was computed from, and is recomputed otherwise. An append may also carry a
versioned hash write (e.g. a breaker reset), applied in the same step: the change and its
audit entry exist together or not at all.

Nothing trims the stream: verification starts at the first entry.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal, cast
from uuid import uuid4

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError
from redis.asyncio import Redis

from common.clock import EpochClock
from common.settings import AUDIT_KEY_MIN_CHARS, ServiceSettings
from schemas.envelope import SHORT_TEXT_MAX, Identifier, Reason, ShortText
from services.shared.redis_client import Keys, text

log = logging.getLogger("clusterwarden.audit")

GENESIS = "0" * 64
APPEND_ATTEMPTS = 50
READ_BATCH = 500
HEAD_MAC_DOMAIN = b"clusterwarden-audit-head-v1"
AUDIT_KEY_FILE = "audit.key"
# Why a head fails its MAC: the start of a Verdict's reason, for the store's chain too.
UNKEYED = ("head is not keyed by the audit key (no MAC: written before the key was set, by an "
           "append that found the head already failing, or the MAC was removed)")
FORGED = ("log cut or head rewritten: the head's MAC is not the one the audit key gives (or "
          "the log was verified with another key)")

Role = Literal["node", "viewer", "operator", "admin", "service"]
Hash = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
Target = Annotated[str, StringConstraints(min_length=1, max_length=SHORT_TEXT_MAX)]
Result = ShortText

# KEYS[1] stream, KEYS[2] head hash, KEYS[3] guarded hash (ignored without a guard).
# ARGV[1] head hash the entry was chained to ('' = none yet), ARGV[2] that head's MAC as read
# ('' none), ARGV[3] the entry's hash, ARGV[4] the canonical entry, ARGV[5] its sequence
# number, ARGV[6] the new head's MAC ('' leaves it unkeyed), ARGV[7] '1' if guarded, ARGV[8]
# the guarded hash's version read, ARGV[9] a member to remove from the set KEYS[4] with it
# ('' none), ARGV[10..] its new field/value pairs.
# Returns {1, id} appended, {0, ''} the head moved on, {-1, ''} the guarded hash moved on.
# The MAC is compared too: the append's judgement of the head (keyed or not) was made on it.
APPEND = """
local head = redis.call('HGET', KEYS[2], 'hash') or ''
local mac = redis.call('HGET', KEYS[2], 'mac') or ''
if head ~= ARGV[1] or mac ~= ARGV[2] then return {0, ''} end
if ARGV[7] == '1' then
  local version = tonumber(redis.call('HGET', KEYS[3], 'version') or '0')
  if version ~= tonumber(ARGV[8]) then return {-1, ''} end
  if ARGV[9] ~= '' then redis.call('SREM', KEYS[4], ARGV[9]) end
  redis.call('HSET', KEYS[3], 'version', version + 1, unpack(ARGV, 10))
end
local id = redis.call('XADD', KEYS[1], '*', 'entry', ARGV[4], 'hash', ARGV[3])
redis.call('HSET', KEYS[2], 'hash', ARGV[3], 'seq', ARGV[5], 'id', id, 'mac', ARGV[6])
return {1, id}
"""

# KEYS[1] head hash. ARGV[1] hash, ARGV[2] seq, ARGV[3] MAC, as checked; ARGV[4] the new MAC.
# Returns 1 keyed, 0 the head moved on since it was checked.
KEY_HEAD = """
if (redis.call('HGET', KEYS[1], 'hash') or '') ~= ARGV[1]
   or (redis.call('HGET', KEYS[1], 'seq') or '0') ~= ARGV[2]
   or (redis.call('HGET', KEYS[1], 'mac') or '') ~= ARGV[3] then return 0 end
redis.call('HSET', KEYS[1], 'mac', ARGV[4])
return 1
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


def head_mac(key: bytes, chain: str, head_hash: str, count: int) -> str:
    """The head's MAC, hex: HMAC-SHA256(key, domain NUL chain NUL "<hash>:<count>").

    `chain` names the log (the stream's key, the store's table), so a head keyed for one log
    is not one for another log keyed with the same key; the domain keeps the key's MACs apart
    from anything else it might ever be used for.
    """
    message = b"\0".join((HEAD_MAC_DOMAIN, chain.encode(), f"{head_hash}:{count}".encode()))
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def head_fault(key: bytes, chain: str, head_hash: str, count: int, mac: str | None) -> str:
    """Why the head (head_hash, count, mac) is not one `key` vouches for; "" if it is.

    A new log's head (GENESIS, 0) needs no MAC: nothing has been appended that could key it.
    """
    if not mac:
        return "" if (head_hash, count) == (GENESIS, 0) else UNKEYED
    # Bytes: compare_digest refuses a str that is not ASCII, and a forged MAC may be anything.
    if not hmac.compare_digest(mac.encode(), head_mac(key, chain, head_hash, count).encode()):
        return FORGED
    return ""


def audit_key_path(state_dir: str | Path) -> Path:
    return Path(state_dir) / "keys" / AUDIT_KEY_FILE


def audit_key(settings: ServiceSettings | None = None) -> bytes:
    """The audit key: WARDEN_AUDIT_KEY, else `<state_dir>/keys/audit.key` (made if missing).

    Without `settings`, this process's: read from its environment once, so every code path
    that appends or verifies finds the same key. A new key needs a restart (and `key_head`,
    since the old heads are not the new key's).
    """
    if settings is None:
        return _process_key()
    return _resolved_key(settings.audit_key.get_secret_value(), settings.state_dir)


@lru_cache(maxsize=1)
def _process_key() -> bytes:
    # Once: reading the settings from the environment takes milliseconds, and every append
    # and verification asks for the key.
    return audit_key(ServiceSettings())


@lru_cache(maxsize=8)
def _resolved_key(configured: str, state_dir: str) -> bytes:
    return configured.encode() if configured else ensure_audit_key_file(audit_key_path(state_dir))


def ensure_audit_key_file(path: Path) -> bytes:
    """The key in `path`, made (random, owner-only) if missing.

    The demo's and the tests' default: the processes sharing a state folder share the key.
    Two processes making it at once both read the one that was linked first.
    """
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid4().hex}.tmp")
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as out:
            out.write(secrets.token_urlsafe(32) + "\n")
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    key = path.read_text().strip()
    if len(key) < AUDIT_KEY_MIN_CHARS:
        raise ValueError(f"{path}: an audit key needs at least {AUDIT_KEY_MIN_CHARS} characters")
    return key.encode()


class AuditLog:
    """Appends to and verifies the hash-chained audit stream and its keyed head."""

    def __init__(self, redis: Redis, keys: Keys, clock: EpochClock = time.time,
                 key: bytes | None = None) -> None:
        """`key`: the audit key; None: this process's (`audit_key`)."""
        self.redis = redis
        self.keys = keys
        self.clock = clock
        self._key = audit_key() if key is None else key
        self._append = redis.register_script(APPEND)
        self._key_head = redis.register_script(KEY_HEAD)

    def stream_key(self) -> str:
        return self.keys.audit_log()

    def head_key(self) -> str:
        """HASH hash, seq, id of the last entry, and the head's MAC."""
        return self.keys.audit_head()

    def _mac(self, head_hash: str, count: int) -> str:
        return head_mac(self._key, self.stream_key(), head_hash, count)

    def _fault(self, head_hash: str, count: int, mac: str | None) -> str:
        return head_fault(self._key, self.stream_key(), head_hash, count, mac)

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
            prev, read_mac = head.get("hash", ""), head.get("mac", "")
            entry = AuditEntry(
                seq=int(head.get("seq", "0")) + 1, at=self.clock(), actor=actor, role=role,
                action=action, target=target, reason=reason, result=result,
                prev=prev or GENESIS,
            )
            body = canonical(entry)
            digest = chain_hash(entry.prev, body)
            # The action is not refused for a head that fails (the audited change would
            # wait on whoever broke the log), but its head is not keyed: that would launder
            # a cut log into one that verifies.
            fault = self._fault(entry.prev, entry.seq - 1, read_mac)
            status, stream_id = await self._append(
                keys=[self.stream_key(), self.head_key(),
                      guard.key if guard else self.head_key(),
                      guard.unset[0] if guard and guard.unset else self.head_key()],
                args=[prev, read_mac, digest, body, entry.seq,
                      "" if fault else self._mac(digest, entry.seq),
                      "1" if guard else "0", guard.version if guard else 0,
                      guard.unset[1] if guard and guard.unset else "",
                      *(guard.fields if guard else ())],
            )
            if int(status) == 1:
                if fault:
                    log.error("audit stream %s: entry %d appended to a head that fails its "
                              "MAC (%s); the head is left unkeyed until an admin checks the "
                              "log and keys it", self.stream_key(), entry.seq, fault)
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

    async def verify(self, anchor: str | None = None) -> Verdict:
        """Recompute the chain from the first entry, compare it with the head, and check the
        head's MAC against the recomputed last hash and count.

        `anchor`: a hash read earlier and kept apart from Redis; the chain must still hold
        its entry (this finds a rollback to an older keyed head, which the MAC cannot).
        """
        verdict, head = await self._chain_verdict(anchor)
        if not verdict.ok:
            return verdict
        fault = self._fault(head.get("hash", GENESIS), verdict.entries, head.get("mac"))
        return Verdict(False, verdict.entries, fault) if fault else verdict

    async def key_head(self, expected_hash: str) -> Verdict:
        """Key the head after an admin has checked the log: one from before the key was set,
        or left unkeyed by an append that found it failing.

        Done only if the chain recomputes to the head and the head's hash is `expected_hash`
        (the one the admin checked, e.g. against a head kept apart): whatever tail was cut
        before is keyed too, so this is an admin's decision, never an append's.
        """
        verdict, head = await self._chain_verdict(None)
        if not verdict.ok:
            return verdict
        last = head.get("hash", GENESIS)
        if last != expected_hash:
            return Verdict(False, verdict.entries, f"the head is {last}, not {expected_hash}: "
                                                   "the log moved on or was changed")
        if verdict.entries == 0:
            return verdict  # a new log's head needs no MAC
        keyed = await self._key_head(
            keys=[self.head_key()],
            args=[last, head.get("seq", "0"), head.get("mac", ""),
                  self._mac(last, verdict.entries)])
        if int(keyed) != 1:
            return Verdict(False, verdict.entries, "the head moved on while the log was "
                                                   "checked: check it again")
        return verdict

    async def _chain_verdict(self, anchor: str | None) -> tuple[Verdict, dict[str, str]]:
        """The chain recomputed and compared with the head (not its MAC), and the head."""
        running, count, start = GENESIS, 0, "-"
        anchored = anchor is None or anchor == GENESIS
        while True:
            rows = _rows(await self.redis.xrange(self.stream_key(), min=start,
                                                 count=READ_BATCH))
            for stream_id, fields in rows:
                body_bytes = fields.get("entry")
                stored = fields.get("hash")
                if body_bytes is None or stored is None:
                    return Verdict(False, count, "entry without body or hash", stream_id), {}
                try:
                    entry = AuditEntry.model_validate_json(body_bytes)
                except ValidationError as err:
                    return Verdict(False, count, f"unreadable entry: {err.error_count()} "
                                                 "error(s)", stream_id), {}
                count += 1
                if entry.seq != count or entry.prev != running:
                    return Verdict(False, count - 1, f"entry {entry.seq} does not follow entry "
                                   f"{count - 1}: removed or reordered entries", stream_id), {}
                running = chain_hash(running, body_bytes)
                if text(stored) != running:
                    return Verdict(False, count - 1, f"entry {entry.seq} was changed",
                                   stream_id), {}
                anchored = anchored or running == anchor
            if len(rows) < READ_BATCH:
                break
            start = f"({rows[-1][0]}"
        head = await self._head()
        if head.get("hash", GENESIS) != running or head.get("seq", "0") != str(count):
            return Verdict(False, count, f"head says {head.get('seq', '0')} entries, the "
                                         f"stream holds {count}: entries cut off or head "
                                         "changed"), head
        if not anchored:
            return Verdict(False, count, f"the anchored head {anchor} is not in the chain: "
                                         "entries cut off and the head rewritten to match"), head
        return Verdict(True, count), head


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
