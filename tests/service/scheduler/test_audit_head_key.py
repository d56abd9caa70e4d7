"""The Redis audit stream's keyed head on the real redis-server: a tail cut off with the head
rewritten to match (by whoever can write Redis but does not hold the audit key) fails the
head's MAC, so does another key, an append does not key such a head again, and writers in
several processes still keep one keyed chain."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis
from redis.typing import EncodableT, FieldT

from services.shared.audit import (
    FORGED,
    UNKEYED,
    AuditLog,
    audit_key,
    head_mac,
)
from services.shared.redis_client import Keys, connect_redis, text

KEY = b"a" * 32
OTHER_KEY = b"b" * 32


async def five_entries(log: AuditLog) -> None:
    for n in range(1, 6):
        await log.append(actor=f"admin-{n}", role="admin", action="breaker_reset",
                         target="c1/offline", reason=f"repaired {n}", result="OPEN -> CLOSED")


async def cut_the_tail(redis: Redis, log: AuditLog, entries: int,
                       keep_mac: bool = True) -> None:
    """What a forger who can write Redis does: drop the last entries and point the head at the
    one left last. Without the key the MAC can only be left as it was, or removed."""
    records = await log.read()
    await redis.xdel(log.stream_key(), *(r.id for r in records[-entries:]))
    last = records[-entries - 1]
    await redis.hset(log.head_key(), mapping={"hash": last.hash, "seq": last.entry.seq,
                                              "id": last.id})
    if not keep_mac:
        await redis.hdel(log.head_key(), "mac")


async def test_an_intact_chain_verifies_with_its_head_keyed(redis: Redis, keys: Keys) -> None:
    log = AuditLog(redis, keys, key=KEY)
    await five_entries(log)
    verdict = await log.verify()
    assert (verdict.ok, verdict.entries) == (True, 5)
    [last] = await log.read(1)
    assert await redis.hget(log.head_key(), "mac") == head_mac(
        KEY, keys.audit_log(), last.hash, 5).encode()
    assert log.head_key() == keys.audit_head()


async def test_a_cut_tail_with_a_rewritten_head_fails_the_mac(redis: Redis, keys: Keys) -> None:
    log = AuditLog(redis, keys, key=KEY)
    await five_entries(log)
    await cut_the_tail(redis, log, 2)
    verdict = await log.verify()
    assert (verdict.ok, verdict.entries) == (False, 3)
    assert verdict.reason == FORGED


async def test_a_cut_tail_with_the_mac_removed_is_not_keyed(redis: Redis, keys: Keys) -> None:
    log = AuditLog(redis, keys, key=KEY)
    await five_entries(log)
    await cut_the_tail(redis, log, 2, keep_mac=False)
    verdict = await log.verify()
    assert (verdict.ok, verdict.entries, verdict.reason) == (False, 3, UNKEYED)


async def test_another_key_fails(redis: Redis, keys: Keys) -> None:
    await five_entries(AuditLog(redis, keys, key=KEY))
    verdict = await AuditLog(redis, keys, key=OTHER_KEY).verify()
    assert (verdict.ok, verdict.reason) == (False, FORGED)


async def test_the_default_key_is_the_processs(redis: Redis, keys: Keys) -> None:
    await five_entries(AuditLog(redis, keys))
    assert (await AuditLog(redis, keys, key=audit_key()).verify()).ok
    assert not (await AuditLog(redis, keys, key=OTHER_KEY).verify()).ok


async def test_an_append_does_not_key_a_rewritten_head_again(redis: Redis, keys: Keys) -> None:
    log = AuditLog(redis, keys, key=KEY)
    await five_entries(log)
    await cut_the_tail(redis, log, 2)
    record = await log.append(actor="ops", role="admin", action="breaker_reset",
                              target="c1/offline", reason="after the cut", result="ok")
    assert record.entry.seq == 4  # appended: the action is not held up
    verdict = await log.verify()
    # The cut is not laundered into a chain that verifies.
    assert (verdict.ok, verdict.entries, verdict.reason) == (False, 4, UNKEYED)
    assert await redis.hget(log.head_key(), "mac") == b""


async def test_an_admin_keys_a_checked_head(redis: Redis, keys: Keys) -> None:
    log = AuditLog(redis, keys, key=KEY)
    await five_entries(log)
    await redis.hdel(log.head_key(), "mac")  # a head from before the key
    [last] = await log.read(1)
    refused = await log.key_head("c" * 64)
    assert (refused.ok, refused.entries) == (False, 5)
    assert "the log moved on or was changed" in refused.reason
    assert (await log.verify()).reason == UNKEYED
    assert (await log.key_head(last.hash)).ok
    assert (await log.verify()).ok
    await five_entries(log)  # keyed on from there
    assert (await log.verify()).entries == 10


async def test_a_broken_chain_is_not_keyed(redis: Redis, keys: Keys) -> None:
    log = AuditLog(redis, keys, key=KEY)
    await five_entries(log)
    records = await log.read()
    await redis.xdel(log.stream_key(), records[2].id)
    verdict = await log.key_head(records[-1].hash)
    assert (verdict.ok, verdict.bad_id) == (False, records[3].id)


async def test_a_rollback_to_an_older_keyed_head_is_found_by_the_anchor(
        redis: Redis, keys: Keys) -> None:
    log = AuditLog(redis, keys, key=KEY)
    await five_entries(log)
    older: dict[FieldT, EncodableT] = {
        text(k): text(v) for k, v in (await redis.hgetall(log.head_key())).items()}
    records = await log.read()
    await five_entries(log)
    anchor = (await log.read(1))[0].hash
    # The stream and its head as they were after five entries (a copy restored).
    newer = await log.read()
    await redis.xdel(log.stream_key(), *(r.id for r in newer[5:]))
    await redis.hset(log.head_key(), mapping=older)
    assert (await log.verify()).ok  # the key vouched for that head once
    assert (await log.verify(anchor=records[2].hash)).ok
    found = await log.verify(anchor=anchor)
    assert (found.ok, found.entries) == (False, 5)
    assert f"the anchored head {anchor} is not in the chain" in found.reason


async def test_two_writers_keep_one_keyed_chain(redis_url: str, redis: Redis,
                                                keys: Keys) -> None:
    clients = [connect_redis(redis_url) for _ in range(2)]
    try:
        writers = [AuditLog(client, keys, key=KEY) for client in clients]
        await asyncio.gather(*(
            writer.append(actor=f"ops-{n}", role="operator", action="pause",
                          target=f"task-{i}", reason="investigating", result="paused")
            for i in range(10) for n, writer in enumerate(writers)))
        records = await writers[0].read()
        assert [r.entry.seq for r in records] == list(range(1, 21))
        assert {r.entry.actor for r in records} == {"ops-0", "ops-1"}
        for writer in writers:
            verdict = await writer.verify()
            assert (verdict.ok, verdict.entries) == (True, 20)
    finally:
        for client in clients:
            await client.aclose()
