"""Reports authenticated per node, on the real broker with real agent processes: a report in
node-002's name without node-002's key is dead-lettered `unauthenticated_report` and changes
nothing; the agents' own reports, signed with the keys enrolment gave them, are applied."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from uuid import uuid4

from agent import fleet
from common.reportauth import KID_HEADER, MAC_HEADER, read_node_key
from common.signing import ensure_signer_keys
from schemas.events.v1 import NodeReport, now_utc
from schemas.topics import Topic, dead_letter_name
from services.shared.redis_client import text
from services.shared.registry import register
from tests.integration.harness import Record, name, producer, services, stack_env, tap, until
from tests.integration.test_dead_letters import holds_more_than, node_hash

CLUSTER = "itest"


def a_report_of(node: str) -> Callable[[Record], bool]:
    def check(record: Record) -> bool:
        return record.topic.endswith(Topic.NODE_REPORTS.value) and record.key == node.encode()
    return check


def is_up(node: str) -> Callable[[Record], bool]:
    def check(record: Record) -> bool:
        return (record.topic.endswith(Topic.OPS_NODE_STATE.value)
                and record.key == node.encode() and b'"state":"up"' in record.value)
    return check


async def test_a_report_forged_in_a_nodes_name_is_dead_lettered_and_the_agents_own_count(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    env = stack_env(kafka_bootstrap, redis_url, namespace, tmp_path)
    reports_topic = name(Topic.NODE_REPORTS, namespace)
    trusted = ensure_signer_keys(tmp_path / "keys")
    async with services(env, tmp_path, ("collector",)):
        agents = fleet.fleet_up(2, 1, CLUSTER, namespace, tmp_path, env, trusted, 1.0)
        await register(redis_url, namespace, CLUSTER, [a.node_id for a in agents])
        try:
            async with tap(kafka_bootstrap, reports_topic,
                           name(Topic.OPS_NODE_STATE, namespace)) as watch:
                # The genuine agents' reports, signed by their keys, are applied: both up.
                for node in ("node-001", "node-002"):
                    await watch.wait_for(is_up(node), 90, f"{node} up")
                genuine = await watch.wait_for(a_report_of("node-002"), 30, "a report")
                headers = dict(genuine.headers)
                assert headers[MAC_HEADER]
                assert headers[KID_HEADER]

                # Three forgeries in node-002's name, each taking it offline with a seq
                # ahead of its own: unsigned; signed with node-001's key (a node owns only
                # its own); and node-002's genuine MAC carried over to changed bytes.
                template = NodeReport.model_validate_json(genuine.value)

                def forged() -> NodeReport:
                    return template.model_copy(update={
                        "event_id": uuid4(), "occurred_at": now_utc(), "mode": "offline",
                        "seq": template.seq + 5_000})

                other_key = read_node_key(fleet.report_key_path(tmp_path, "node-001"))
                attempts: list[tuple[NodeReport, list[tuple[str, bytes]]]] = []
                unsigned = forged()
                attempts.append((unsigned, []))
                impostor = forged()
                attempts.append((impostor, [
                    (k, v.encode()) for k, v in
                    other_key.headers(impostor.model_dump_json().encode()).items()]))
                attempts.append((forged(), list(genuine.headers)))
                async with producer(kafka_bootstrap) as prod:
                    for report, mac in attempts:
                        await prod.send_and_wait(reports_topic, report.model_dump_json().encode(),
                                                 key=b"node-002", headers=mac)
                sent_at, before = now_utc(), list(watch.records)

                async with tap(kafka_bootstrap, dead_letter_name(reports_topic)) as dlt:
                    await dlt.wait_for(holds_more_than(dlt, 2), 60, "three dead letters")
                forged_ids = {str(report.event_id) for report, _ in attempts}
                refused = [r for r in dlt.records
                           if json.loads(r.value)["event_id"] in forged_ids]
                assert len(refused) == 3
                for record in refused:
                    reasons = {k: v.decode() for k, v in record.headers}
                    assert reasons["dlt-reason"] == "unauthenticated_report"

                # Nothing of them was adopted. The agent's reports share their partition
                # (same key), so once one it built after them is applied, they were handled.
                async def later_applied() -> bool:
                    reports = [NodeReport.model_validate_json(r.value)
                               for r in watch.records[len(before):]
                               if a_report_of("node-002")(r)]
                    later = [r for r in reports if r.occurred_at > sent_at]
                    if not later:
                        await watch.catch_up(10)
                        return False
                    state = await node_hash(redis_url, namespace, "node-002")
                    return int(text(state[b"seq"])) >= later[0].seq

                await until(later_applied, 60, "a genuine report after them applied")
                stored = await node_hash(redis_url, namespace, "node-002")
                assert text(stored[b"state"]) == "up"
                assert text(stored[b"mode"]) == "active"
                assert text(stored[b"last_event_id"]) not in forged_ids
                await watch.catch_up()
                assert not [r for r in watch.records
                            if r.topic.endswith(Topic.OPS_NODE_STATE.value)
                            and json.loads(r.value).get("correlation_id") in forged_ids]
        finally:
            fleet.fleet_down(tmp_path)
