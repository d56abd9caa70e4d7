"""docs/reliability.md §Command verification and S17 on the real broker with a real agent
process: of a valid drain, its replay, an expired command, one for another node, one with a
used seq, one signed by an unknown key and one with a tampered payload, only the valid drain
is executed; the replay is answered from the journal, the expired, misaddressed and stale
ones are rejected, the badly signed ones are dead-lettered unanswered. Rewinding the agent's
consumer group to the earliest command (a replay flood after a restart) executes nothing new
either."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from uuid import UUID, uuid4

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from agent import fleet
from agent.journal import JOURNAL_FILE
from common.messaging import ensure_topics
from common.signing import (
    CommandSigner,
    b64url,
    ensure_keypair,
    key_id,
    signer_from_file,
    unb64url,
)
from schemas.events.v1 import (
    Action,
    Command,
    CommandPayload,
    CommandResult,
    DrainNode,
    NodeReport,
    OfflineNode,
    QueryStatus,
    UndrainNode,
    now_utc,
)
from schemas.topics import PARTITIONS, Topic, dead_letter_name
from tests.integration.harness import Record, Tap, name, producer, tap

NODE = "node-001"
CLUSTER = "itest"
TTL = timedelta(seconds=240)  # inside the agent's 300 s limit, and longer than the test


def payload(action: Action, seq: int, *, node: str = NODE, epoch: int = 1,
            age: timedelta = timedelta(0), ttl: timedelta = TTL,
            cluster: str = CLUSTER) -> CommandPayload:
    issued = now_utc() - age
    return CommandPayload(command_id=uuid4(), cluster_id=cluster, node_id=node, seq=seq,
                          epoch=epoch, issued_at=issued, expires_at=issued + ttl, action=action)


def results(events: Tap) -> list[CommandResult]:
    return [CommandResult.model_validate_json(r.value) for r in events.records
            if r.topic.endswith(Topic.NODE_COMMAND_RESULTS.value)]


def answers_to(events: Tap, command_id: UUID) -> list[CommandResult]:
    return [r for r in results(events) if r.command_id == command_id]


def answered(events: Tap, command_id: UUID, count: int = 1) -> Callable[[Record], bool]:
    return lambda _: len(answers_to(events, command_id)) >= count


def dead_letters(events: Tap) -> list[Record]:
    return [r for r in events.records if r.topic.endswith(".dlt")]


def modes(events: Tap) -> list[str]:
    """The node's reported modes in order, repeats left out."""
    seen: list[str] = []
    for record in events.records:
        if record.topic.endswith(Topic.NODE_REPORTS.value) and record.key == NODE.encode():
            mode = NodeReport.model_validate_json(record.value).mode
            if not seen or seen[-1] != mode:
                seen.append(mode)
    return seen


def report_after(events: Tap, seen: int) -> Callable[[Record], bool]:
    """True once a report arrived after the first `seen` records."""
    return lambda _: any(r.topic.endswith(Topic.NODE_REPORTS.value)
                         for r in events.records[seen:])


def journal_rows(state_dir: Path) -> list[tuple[str, str, str, str]]:
    """(command_id, action, outcome, reason) of every row of the agent's journal."""
    path = fleet.agent_dir(state_dir, NODE) / JOURNAL_FILE
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return [(str(r[0]), str(r[1]), str(r[2]), str(r[3])) for r in db.execute(
            "SELECT command_id, action, outcome, reason FROM commands ORDER BY recorded_at")]
    finally:
        db.close()


async def rewind(bootstrap: str, group: str, topic: str) -> None:
    """Set an (empty) consumer group's offsets on `topic` to 0: everything is read again."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                                enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in range(PARTITIONS[Topic.NODE_COMMANDS])]
        consumer.assign(partitions)
        await consumer.commit({tp: 0 for tp in partitions})
    finally:
        await consumer.stop()


@asynccontextmanager
async def agent_log_on_failure(state_dir: Path) -> AsyncIterator[None]:
    try:
        yield
    except BaseException:
        text = fleet.log_path(state_dir, NODE).read_text(errors="replace")
        print(f"----- {NODE} log (last 80 lines) -----")
        print("\n".join(text.splitlines()[-80:]))
        raise


async def test_only_a_valid_command_executes_once_on_the_real_agent(
    kafka_bootstrap: str, namespace: str, tmp_path: Path
) -> None:
    env = {"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "WARDEN_LOG_LEVEL": "INFO",
           "AGENT_JOBS": "", "AGENT_PEER_PROBES": "0"}
    private, public = ensure_keypair(tmp_path / "keys", "executor")
    signer = signer_from_file(private)
    stranger_key = Ed25519PrivateKey.generate()
    stranger = CommandSigner(stranger_key, key_id(stranger_key.public_key()))
    commands = name(Topic.NODE_COMMANDS, namespace)
    await ensure_topics(kafka_bootstrap, namespace)

    async def send(prod: AIOKafkaProducer, command: Command) -> bytes:
        body = command.model_dump_json().encode()
        await prod.send_and_wait(commands, body, key=command.subject.encode())
        return body

    fleet.fleet_up(1, 1, CLUSTER, namespace, tmp_path, env, [public], 1.0)
    try:
        async with (agent_log_on_failure(tmp_path), producer(kafka_bootstrap) as prod,
                    tap(kafka_bootstrap, name(Topic.NODE_COMMAND_RESULTS, namespace),
                        name(Topic.NODE_REPORTS, namespace),
                        dead_letter_name(commands)) as watch):
            await watch.wait_for(
                lambda r: r.topic.endswith(Topic.NODE_REPORTS.value) and r.key == NODE.encode(),
                60, f"{NODE} reporting")

            drain = payload(DrainNode(node_id=NODE), seq=1)
            drain_command = signer.sign(drain, "itest")
            await send(prod, drain_command)
            await watch.wait_for(answered(watch, drain.command_id), 30, "the drain's answer")
            # The very same bytes again: a replay.
            await send(prod, drain_command)
            # Issued 200 s ago for 100 s: expired beyond the 30 s leeway.
            expired = payload(OfflineNode(node_id=NODE), seq=2, age=timedelta(seconds=200),
                              ttl=timedelta(seconds=100))
            await send(prod, signer.sign(expired, "itest"))
            # For node-002, but published under this node's subject (and key).
            elsewhere = payload(UndrainNode(node_id="node-002"), seq=3, node="node-002")
            await send(prod, signer.sign(elsewhere, "itest").model_copy(
                update={"subject": NODE}))
            # For the node of the same name in another cluster (its own seq: higher than
            # any here), published under this cluster's envelope.
            other = payload(OfflineNode(node_id=NODE), seq=99, cluster="other-cluster")
            await send(prod, signer.sign(other, "itest").model_copy(
                update={"cluster_id": CLUSTER}))
            # Signed by a key the agent does not trust.
            unknown = payload(OfflineNode(node_id=NODE), seq=4)
            unknown_body = await send(prod, stranger.sign(unknown, "itest"))
            # Signed as an undrain, then turned into an offline on the way.
            tampered = payload(UndrainNode(node_id=NODE), seq=5)
            signed = signer.sign(tampered, "itest")
            forged = unb64url(signed.payload).replace(b'"undrain_node"', b'"offline_node"')
            assert forged != unb64url(signed.payload)
            tampered_body = await send(prod, signed.model_copy(
                update={"payload": b64url(forged)}))
            # Fresh and well signed, but with a seq already used: an old command re-signed.
            stale = payload(OfflineNode(node_id=NODE), seq=1)
            await send(prod, signer.sign(stale, "itest"))
            # Commands to one node are processed in order: once this is answered, every one
            # before it was handled.
            sentinel = payload(QueryStatus(node_id=NODE, command_id=drain.command_id), seq=0)
            await send(prod, signer.sign(sentinel, "itest"))
            await watch.wait_for(answered(watch, sentinel.command_id), 60,
                                 "the answer to the closing status query")
            await watch.wait_for(lambda _: len(dead_letters(watch)) >= 2, 30,
                                 "both badly signed commands dead-lettered")

            first, replayed = answers_to(watch, drain.command_id)
            assert (first.outcome, first.duplicate, first.outputs.get("mode")) == (
                "succeeded", False, "draining")
            assert (replayed.outcome, replayed.duplicate) == ("succeeded", True)
            assert replayed.outputs == first.outputs
            assert [(r.outcome, r.reason) for r in answers_to(watch, expired.command_id)] == [
                ("rejected", "expired")]
            assert [(r.outcome, r.reason, r.node_id)
                    for r in answers_to(watch, elsewhere.command_id)] == [
                ("rejected", "wrong_audience", NODE)]
            assert [(r.outcome, r.reason) for r in answers_to(watch, other.command_id)] == [
                ("rejected", "wrong_audience")]
            assert [(r.outcome, r.reason) for r in answers_to(watch, stale.command_id)] == [
                ("rejected", "stale_seq")]
            assert answers_to(watch, unknown.command_id) == []
            assert answers_to(watch, tampered.command_id) == []
            [status] = answers_to(watch, sentinel.command_id)
            assert (status.outcome, status.outputs.get("queried_command_id")) == (
                "succeeded", str(drain.command_id))

            letters = {r.value: {k: v.decode() for k, v in r.headers}
                       for r in dead_letters(watch)}
            assert letters[unknown_body]["dlt-reason"] == "unknown_kid"
            assert letters[tampered_body]["dlt-reason"] == "bad_signature"
            assert all(h["dlt-original-topic"] == commands for h in letters.values())

            executed = [(row[0], row[1]) for row in journal_rows(tmp_path)
                        if row[2] != "rejected"]
            assert executed == [(str(drain.command_id), "drain_node"),
                                (str(sentinel.command_id), "query_status")]
            before_rewind = journal_rows(tmp_path)

            # A report after all of it: the only mode change is the valid drain's.
            await watch.wait_for(report_after(watch, len(watch.records)), 30, "a later report")
            assert modes(watch) == ["active", "draining"]

            # S17: the agent restarts with its command consumer group rewound to the
            # earliest offset, and reads every command above again.
            assert fleet.stop_agent(tmp_path, NODE)
            await rewind(kafka_bootstrap, f"{namespace}.agent-{CLUSTER}-{NODE}", commands)
            fleet.fleet_up(1, 1, CLUSTER, namespace, tmp_path, env, [public], 1.0)
            after = payload(QueryStatus(node_id=NODE, command_id=drain.command_id), seq=0)
            await send(prod, signer.sign(after, "itest"))
            await watch.wait_for(answered(watch, after.command_id), 90,
                                 "the status query sent after the rewind")
            await watch.wait_for(lambda _: len(dead_letters(watch)) >= 4, 30,
                                 "both badly signed commands dead-lettered again")

            replays = answers_to(watch, drain.command_id)[2:]
            assert [(r.outcome, r.duplicate) for r in replays] == [("succeeded", True)] * 2
            assert [(r.outcome, r.reason) for r in answers_to(watch, expired.command_id)] == [
                ("rejected", "expired")] * 2
            assert [r.reason for r in answers_to(watch, elsewhere.command_id)] == [
                "wrong_audience"] * 2
            assert [r.reason for r in answers_to(watch, other.command_id)] == [
                "wrong_audience"] * 2
            assert [r.reason for r in answers_to(watch, stale.command_id)] == [
                "stale_seq"] * 2
            assert [r.duplicate for r in answers_to(watch, sentinel.command_id)] == [
                False, True]
            assert answers_to(watch, unknown.command_id) == []
            assert answers_to(watch, tampered.command_id) == []
            # Nothing new in the journal but the new query: the replays left no trace.
            assert journal_rows(tmp_path)[:-1] == before_rewind
            assert journal_rows(tmp_path)[-1][:3] == (
                str(after.command_id), "query_status", "succeeded")

            await watch.wait_for(report_after(watch, len(watch.records)), 30, "a report after it")
            assert modes(watch) == ["active", "draining"]
            meta = sqlite3.connect(
                f"file:{fleet.agent_dir(tmp_path, NODE) / JOURNAL_FILE}?mode=ro", uri=True)
            try:
                stored = dict(meta.execute("SELECT key, value FROM meta").fetchall())
            finally:
                meta.close()
            assert (stored["last_seq"], stored["max_epoch"]) == (1, 1), json.dumps(stored)
    finally:
        fleet.fleet_down(tmp_path)
