"""The hash-chained audit log on the real redis-server: appends chain, verify finds any
changed, removed or cut-off entry, and concurrent writers keep one chain."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import cast

import pytest
from redis.asyncio import Redis
from redis.typing import EncodableT, FieldT

from services.shared.audit import (
    GENESIS,
    AuditLog,
    VersionedWrite,
    canonical,
    chain_hash,
)
from services.shared.redis_client import Keys, connect_redis, text
from tests.service.scheduler.helpers import Clock


async def three_entries(log: AuditLog) -> None:
    for n, reason in enumerate(("node-7 repaired", "false alarm", "maintenance over"), 1):
        await log.append(actor=f"admin-{n}", role="admin", action="breaker_reset",
                         target="c1/offline", reason=reason, result="OPEN -> CLOSED")


async def rewrite(redis: Redis, log: AuditLog, change: dict[int, dict[str, object]],
                  rehash: bool = False) -> list[str]:
    """Rebuild the stream with some entries' fields changed (what an intruder would do).

    With `rehash` the changed entry's own hash is recomputed too. Returns the new ids.
    """
    rows = cast(list[tuple[bytes, dict[bytes, bytes]]], await redis.xrange(log.stream_key()))
    await redis.delete(log.stream_key())
    ids = []
    for _, fields in rows:
        values: dict[FieldT, EncodableT] = {text(k): text(v) for k, v in fields.items()}
        entry = json.loads(fields[b"entry"])
        if entry["seq"] in change:
            entry |= change[entry["seq"]]
            body = json.dumps(entry, sort_keys=True, separators=(",", ":"))
            values["entry"] = body
            if rehash:
                values["hash"] = chain_hash(entry["prev"], body.encode())
        ids.append(text(await redis.xadd(log.stream_key(), values)))
    return ids


async def test_appended_entries_form_a_chain_that_verifies(redis: Redis, keys: Keys,
                                                           clock: Clock) -> None:
    log = AuditLog(redis, keys, clock=clock)
    await three_entries(log)
    records = await log.read()
    assert [r.entry.seq for r in records] == [1, 2, 3]
    assert records[0].entry.prev == GENESIS
    for before, after in itertools.pairwise(records):
        assert after.entry.prev == before.hash
    assert records[1].hash == chain_hash(records[0].hash, canonical(records[1].entry))
    assert (records[0].entry.at, records[0].entry.actor) == (clock.now, "admin-1")
    verdict = await log.verify()
    assert (verdict.ok, verdict.entries) == (True, 3)


async def test_an_empty_log_verifies(redis: Redis, keys: Keys) -> None:
    verdict = await AuditLog(redis, keys).verify()
    assert (verdict.ok, verdict.entries) == (True, 0)


async def test_verify_finds_a_changed_entry(redis: Redis, keys: Keys) -> None:
    log = AuditLog(redis, keys)
    await three_entries(log)
    ids = await rewrite(redis, log, {2: {"reason": "nothing to see"}})
    verdict = await log.verify()
    assert (verdict.ok, verdict.bad_id, verdict.entries) == (False, ids[1], 1)
    assert "entry 2 was changed" in verdict.reason


async def test_verify_finds_a_changed_entry_even_with_its_hash_recomputed(
        redis: Redis, keys: Keys) -> None:
    log = AuditLog(redis, keys)
    await three_entries(log)
    ids = await rewrite(redis, log, {2: {"actor": "somebody-else"}}, rehash=True)
    verdict = await log.verify()
    # Entry 2 now hashes consistently, but entry 3 was chained to its old hash.
    assert (verdict.ok, verdict.bad_id) == (False, ids[2])


async def test_verify_finds_a_removed_entry(redis: Redis, keys: Keys) -> None:
    log = AuditLog(redis, keys)
    await three_entries(log)
    records = await log.read()
    await redis.xdel(log.stream_key(), records[1].id)
    verdict = await log.verify()
    assert (verdict.ok, verdict.bad_id) == (False, records[2].id)
    assert "removed or reordered" in verdict.reason


async def test_verify_finds_a_cut_off_tail(redis: Redis, keys: Keys) -> None:
    log = AuditLog(redis, keys)
    await three_entries(log)
    records = await log.read()
    await redis.xdel(log.stream_key(), records[2].id)
    verdict = await log.verify()
    assert (verdict.ok, verdict.entries) == (False, 2)
    assert "cut off" in verdict.reason


async def test_verify_finds_a_garbled_entry(redis: Redis, keys: Keys) -> None:
    log = AuditLog(redis, keys)
    await three_entries(log)
    ids = await rewrite(redis, log, {3: {"role": "god"}})
    verdict = await log.verify()
    assert (verdict.ok, verdict.bad_id) == (False, ids[2])
    assert "unreadable" in verdict.reason


async def test_concurrent_writers_keep_one_chain(redis_url: str, redis: Redis,
                                                 keys: Keys) -> None:
    clients = [connect_redis(redis_url) for _ in range(3)]
    try:
        logs = [AuditLog(client, keys) for client in clients]
        await asyncio.gather(*(
            log.append(actor="ops", role="operator", action="pause", target=f"task-{i}",
                       reason="investigating", result="paused")
            for i, log in enumerate(logs * 6)))
        records = await logs[0].read()
        assert [r.entry.seq for r in records] == list(range(1, 19))
        assert (await logs[0].verify()).ok
    finally:
        for client in clients:
            await client.aclose()


async def test_a_guarded_append_writes_the_change_and_the_entry_together(
        redis: Redis, keys: Keys) -> None:
    log = AuditLog(redis, keys)
    guarded = f"{keys.prefix}guarded"
    await redis.hset(guarded, mapping={"version": "4", "status": "OPEN"})
    stale = await log.append_guarded(actor="root", role="admin", action="breaker_reset",
                                     target="c1/offline", reason="r", result="OPEN -> CLOSED",
                                     guard=VersionedWrite(guarded, 3, ["status", "CLOSED"]))
    assert stale is None
    assert await redis.xlen(log.stream_key()) == 0
    assert await redis.hget(guarded, "status") == b"OPEN"
    record = await log.append_guarded(actor="root", role="admin", action="breaker_reset",
                                      target="c1/offline", reason="r", result="OPEN -> CLOSED",
                                      guard=VersionedWrite(guarded, 4, ["status", "CLOSED"]))
    assert record is not None
    assert record.entry.seq == 1
    assert await redis.hgetall(guarded) == {b"version": b"5", b"status": b"CLOSED"}
    assert (await log.verify()).ok


async def test_bad_fields_are_refused_before_anything_is_written(redis: Redis,
                                                                 keys: Keys) -> None:
    log = AuditLog(redis, keys)
    with pytest.raises(ValueError, match="reason"):
        await log.append(actor="a", role="admin", action="x", target="t", reason="",
                         result="ok")
    assert await redis.exists(log.stream_key()) == 0
