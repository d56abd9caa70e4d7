"""Command answers authenticated per node, on the real broker with a real collector and real
agents: an answer to a probe of a node that never answers, forged by whoever reads the
commands topic, is dead-lettered and the probe still fails; a node's own key cannot answer
for another node."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from uuid import uuid4

from redis.asyncio import Redis

from agent import fleet
from common.reportauth import UNAUTHENTICATED_RESULT, WRONG_SENDER, read_node_key
from common.signing import ensure_signer_keys, unb64url
from schemas.events.v1 import Command, CommandPayload, CommandResult, ProbeNode, now_utc
from schemas.topics import Topic, dead_letter_name
from services.shared.redis_client import Keys
from services.shared.registry import register
from tests.integration.harness import Record, name, producer, services, stack_env, tap, until
from tests.integration.test_dead_letters import holds_more_than

CLUSTER = "itest"


def is_probe_of(node: str) -> Callable[[Record], bool]:
    def check(record: Record) -> bool:
        if not record.topic.endswith(Topic.NODE_COMMANDS.value) or record.key != node.encode():
            return False
        payload = CommandPayload.model_validate_json(
            unb64url(Command.model_validate_json(record.value).payload))
        return isinstance(payload.action, ProbeNode)
    return check


def answer(payload: CommandPayload, node: str) -> CommandResult:
    """A "succeeded" answer to `payload` in `node`'s name, as a forger would write it."""
    return CommandResult(
        event_id=uuid4(), source=f"agent-{node}", occurred_at=now_utc(), cluster_id=CLUSTER,
        subject=node, command_id=payload.command_id, node_id=node, action="probe_node",
        outcome="succeeded", outputs={"mode": "active", "interval_s": 1.0})


async def test_forged_answers_to_a_probe_are_dead_lettered_and_the_probe_still_fails(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    env = stack_env(kafka_bootstrap, redis_url, namespace, tmp_path,
                    COLLECTOR_PROBE_PERIOD_S="2", COLLECTOR_PROBE_DEADLINE_S="3")
    results_topic = name(Topic.NODE_COMMAND_RESULTS, namespace)
    trusted = ensure_signer_keys(tmp_path / "keys")
    async with services(env, tmp_path, ("collector",)):
        # node-001 answers; node-002 trusts no key, so it refuses every command unread: it
        # reports (signed), but never answers a probe.
        healthy = fleet.fleet_up(1, 1, CLUSTER, namespace, tmp_path, env, trusted, 1.0)
        deaf = fleet.fleet_up(1, 1, CLUSTER, namespace, tmp_path, env, [], 1.0, first=2)
        await register(redis_url, namespace, CLUSTER, [a.node_id for a in healthy + deaf])
        redis = Redis.from_url(redis_url)
        node2 = Keys(namespace).node(CLUSTER, "node-002")
        try:
            async with tap(kafka_bootstrap, name(Topic.NODE_COMMANDS, namespace)) as commands:
                record = await commands.wait_for(is_probe_of("node-002"), 60,
                                                 "a probe of node-002")
            probe = CommandPayload.model_validate_json(
                unb64url(Command.model_validate_json(record.value).payload))
            # Three answers, each "succeeded": unsigned; in node-002's name with node-001's
            # key; and node-001's own, genuinely sealed, answering node-002's probe.
            key1 = read_node_key(fleet.report_key_path(tmp_path, "node-001"))
            unsigned = answer(probe, "node-002")
            impostor = answer(probe, "node-002")
            bystander = answer(probe, "node-001")
            attempts = [(unsigned, False), (impostor, True), (bystander, True)]
            async with tap(kafka_bootstrap, dead_letter_name(results_topic)) as dlt:
                async with producer(kafka_bootstrap) as prod:
                    for result, sealed in attempts:
                        body = result.model_dump_json().encode()
                        headers = ([(k, v.encode()) for k, v in key1.headers(body).items()]
                                   if sealed else [])
                        await prod.send_and_wait(results_topic, body,
                                                 key=result.subject.encode(), headers=headers)
                await dlt.wait_for(holds_more_than(dlt, 2), 60, "three dead letters")
            reasons = {json.loads(r.value)["event_id"]: dict(r.headers)["dlt-reason"].decode()
                       for r in dlt.records}
            assert reasons == {str(unsigned.event_id): UNAUTHENTICATED_RESULT,
                               str(impostor.event_id): UNAUTHENTICATED_RESULT,
                               str(bystander.event_id): WRONG_SENDER}

            # The probe was not taken as answered: it fails at its deadline, as the next do.
            async def failed() -> bool:
                return int(await redis.hget(node2, "probe_failures") or 0) >= 1

            await until(failed, 30, "node-002's probe to fail")
            assert await redis.hget(node2, "probe_ok_at") is None

            # node-001's own probes are still answered (its answers are sealed and its own).
            async def answered() -> bool:
                return bool(await redis.hget(Keys(namespace).node(CLUSTER, "node-001"),
                                             "probe_ok_at"))

            await until(answered, 30, "node-001 to answer a probe")
        finally:
            await redis.aclose()
            fleet.fleet_down(tmp_path)
