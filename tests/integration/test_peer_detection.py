"""Peer probes as two-way detection, on the real broker, Redis and agent processes: agents
probe the peers the collector assigned them at the addresses those advertise; a node its
peers cannot reach but that reports is partitioned (offline); a node that stopped reporting
while its peers reach it has a dead agent, which the local provider starts again."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from redis.asyncio import Redis

from agent import fleet
from agent.peers import PROBE_FILE, EchoListener, read_probe_addr
from common.signing import ensure_signer_keys
from schemas.events.v1 import NodeReport, NodeState, OpsNeed, SampleBatch, now_utc
from schemas.topics import Topic
from services.shared.redis_client import Keys, text
from services.shared.registry import register
from tests.integration.harness import (
    SMALL_POOL_SAFETY,
    Record,
    Tap,
    a_need,
    is_success_of,
    is_up,
    name,
    processed,
    services,
    stack_env,
    tap,
    task_events_for,
    until,
)

NODES = ["node-001", "node-002", "node-003"]
# Each node probes the two others: every node is watched by a quorum of two.
PEERS = {"COLLECTOR_PEER_COUNT": "2", "COLLECTOR_PEER_ASSIGN_PERIOD_S": "1"}


def reports_of(node: str, events: Tap) -> list[NodeReport]:
    return [NodeReport.model_validate_json(r.value) for r in events.records
            if r.topic.endswith(Topic.NODE_REPORTS.value) and r.key == node.encode()]


def probing(node: str, peers: set[str]) -> Callable[[Record], bool]:
    """A report of `node` whose probes name exactly `peers`, every one reached."""
    def check(record: Record) -> bool:
        if not (record.topic.endswith(Topic.NODE_REPORTS.value) and record.key == node.encode()):
            return False
        report = NodeReport.model_validate_json(record.value)
        return ({p.peer_node_id for p in report.peer_probes} == peers
                and all(p.reachable for p in report.peer_probes))
    return check


def sample_of(node: str, skip: int) -> Callable[[Record], bool]:
    """The sample batch carrying `node`'s sample after the first `skip` such batches seen."""
    seen: list[int] = []

    def check(record: Record) -> bool:
        if not (record.topic.endswith(Topic.OPS_SAMPLES.value)
                and any(s.node_id == node
                        for s in SampleBatch.model_validate_json(record.value).samples)):
            return False
        seen.append(record.offset)
        return len(seen) > skip
    return check


def needs_in(events: Tap) -> list[OpsNeed]:
    return [OpsNeed.model_validate_json(r.value) for r in events.records
            if r.topic.endswith(Topic.OPS_NEEDS.value)]


async def test_agents_probe_the_peers_the_collector_assigned_at_their_addresses(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    env = stack_env(kafka_bootstrap, redis_url, namespace, tmp_path, AGENT_JOBS="", **PEERS)
    trusted = ensure_signer_keys(tmp_path / "keys")
    # node-003 lives elsewhere: its own state directory (no sibling of the others') and its
    # own loopback address, so the others can only know it from the collector, and it them.
    elsewhere = tmp_path / "elsewhere"
    async with services(env, tmp_path, ("collector",)):
        await register(redis_url, namespace, "itest", NODES)
        fleet.fleet_up(2, 1, "itest", namespace, tmp_path, env, trusted, 1.0)
        fleet.fleet_up(1, 1, "itest", namespace, elsewhere,
                       {**env, "AGENT_PROBE_HOST": "127.0.0.2"}, trusted, 1.0, first=3)
        try:
            async with tap(kafka_bootstrap, name(Topic.NODE_REPORTS, namespace)) as watch:
                for node in NODES:
                    others = set(NODES) - {node}
                    await watch.wait_for(probing(node, others), 90,
                                         f"{node} probing {sorted(others)}, all reached")
                third = reports_of("node-003", watch)[-1]
                assert third.probe_address is not None
                assert third.probe_address.startswith("127.0.0.2:"), third.probe_address
                first = reports_of("node-001", watch)[-1].probe_address
                assert first is not None
                assert first.startswith("127.0.0.1:"), first
            # The collector keeps what each node advertised, and what it told each node.
            redis = Redis.from_url(redis_url)
            try:
                keys = Keys(namespace)
                addresses = {text(k): text(v).partition("|")[0] for k, v in
                             (await redis.hgetall(keys.peer_addresses("itest"))).items()}
                assert addresses["node-003"] == third.probe_address
                told = {text(k): text(v).split("|")[2] for k, v in
                        (await redis.hgetall(keys.peer_assigned("itest"))).items()}
                assert told == {"node-001": "node-002,node-003", "node-002": "node-003,node-001",
                                "node-003": "node-001,node-002"}
            finally:
                await redis.aclose()
        finally:
            fleet.fleet_down(tmp_path)
            fleet.fleet_down(elsewhere)


async def test_a_node_its_peers_cannot_reach_but_that_reports_is_taken_offline(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    env = stack_env(kafka_bootstrap, redis_url, namespace, tmp_path, AGENT_JOBS="",
                    ANALYZER_ENABLED_NEEDS='["offline", "restart_agent"]', **PEERS)
    trusted = ensure_signer_keys(tmp_path / "keys")
    async with services(env, tmp_path, ("collector", "analyzer")):
        await register(redis_url, namespace, "itest", NODES)
        fleet.fleet_up(3, 1, "itest", namespace, tmp_path, env, trusted, 1.0)
        try:
            async with tap(kafka_bootstrap, name(Topic.NODE_REPORTS, namespace),
                           name(Topic.OPS_NEEDS, namespace),
                           name(Topic.OPS_SAMPLES, namespace)) as watch:
                for node in NODES:
                    await watch.wait_for(probing(node, set(NODES) - {node}), 90,
                                         f"{node} probing its assigned peers")
                # Cut off: its listener drops its peers' probes, and its own probes fail; it
                # goes on reporting.
                fleet.inject_fault(tmp_path, "node-002", partitioned=True)
                record = await watch.wait_for(a_need("offline", "node-002"), 90,
                                              "an offline need for the partitioned node")
                need = OpsNeed.model_validate_json(record.value)
                assert need.evidence[0].metric == "node_fault_count"
                assert "partitioned [0 peer(s) reach it, 2 cannot (quorum 2)]" in (
                    need.evidence[0].detail), need.evidence[0].detail
                # node-002 says it cannot reach node-001 or node-003, but it is one prober
                # against a quorum of two: the others are not partitioned. Judged once the
                # analyzer has handled samples of theirs published after the need.
                mark = len(watch.records)
                later = [await watch.wait_for(sample_of(node, after), 60,
                                              f"sample {after + 1} of {node} after the need",
                                              start=mark)
                         for node in ("node-001", "node-003") for after in range(2)]
                await until(lambda: processed(kafka_bootstrap, f"{namespace}.analyzer-samples",
                                              later), 60, "the analyzer past those samples")
                await watch.catch_up()
                assert [n.target for n in needs_in(watch)] == ["node-002"]
                assert any(not p.reachable for r in reports_of("node-002", watch)
                           for p in r.peer_probes)
        finally:
            fleet.fleet_down(tmp_path)


async def test_a_dead_agent_on_a_live_node_is_restarted_not_taken_offline(
    kafka_bootstrap: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    env = stack_env(kafka_bootstrap, redis_url, namespace, tmp_path, AGENT_JOBS="",
                    COLLECTOR_DOWN_AFTER_S="6", CAPACITY_PROVIDER="local",
                    CAPACITY_RESTART_TIMEOUT_S="90", WARDEN_LOG_LEVEL="INFO",
                    ANALYZER_ENABLED_NEEDS='["offline", "restart_agent"]',
                    **PEERS, **SMALL_POOL_SAFETY)
    trusted = ensure_signer_keys(tmp_path / "keys")
    stand_in: EchoListener | None = None
    async with services(env, tmp_path, ("collector", "analyzer", "templater", "scheduler",
                                        "executor", "store")):
        await register(redis_url, namespace, "itest", NODES)
        fleet.fleet_up(3, 1, "itest", namespace, tmp_path, env, trusted, 1.0)
        try:
            async with tap(kafka_bootstrap, name(Topic.NODE_REPORTS, namespace),
                           name(Topic.OPS_NEEDS, namespace), name(Topic.OPS_NODE_STATE, namespace),
                           name(Topic.OPS_TASK_EVENTS, namespace)) as watch:
                for node in NODES:
                    await watch.wait_for(is_up(node), 90, f"{node} up")
                    await watch.wait_for(probing(node, set(NODES) - {node}), 90,
                                         f"{node} probing its assigned peers")
                # The agent dies; the node does not: something on it still answers its
                # peers' probes where the agent listened (as a live host would).
                address = read_probe_addr(fleet.agent_dir(tmp_path, "node-002") / PROBE_FILE)
                assert address is not None
                old_pid = fleet.read_pid(tmp_path, "node-002")
                assert fleet.kill_agent(tmp_path, "node-002")
                killed_at = now_utc()
                stand_in = EchoListener(tmp_path / "stand-in", port=address[1], host=address[0])
                await stand_in.start()
                mark = len(watch.records)

                def agent_dead(record: Record) -> bool:
                    if not (record.topic.endswith(Topic.OPS_NODE_STATE.value)
                            and record.key == b"node-002"):
                        return False
                    state = NodeState.model_validate_json(record.value)
                    return state.agent_dead and state.occurred_at > killed_at

                state = NodeState.model_validate_json(
                    (await watch.wait_for(agent_dead, 90, "node-002 found agent dead",
                                          start=mark)).value)
                assert state.state == "suspect", state
                assert "agent dead: 2 peer(s) reach it" in state.reason, state
                need = OpsNeed.model_validate_json((await watch.wait_for(
                    a_need("restart_agent", "node-002"), 60, "a restart_agent need",
                    start=mark)).value)
                assert need.evidence[0].metric == "agent_dead"
                await watch.wait_for(is_success_of(watch, "node-002"), 180,
                                     "the restart_agent task to succeed")
                # A new agent process, reporting again.
                new_pid = fleet.read_pid(tmp_path, "node-002")
                assert new_pid is not None
                assert new_pid != old_pid
                assert fleet.is_alive(new_pid)
                await watch.wait_for(
                    lambda r: r.topic.endswith(Topic.NODE_REPORTS.value)
                    and r.key == b"node-002"
                    and NodeReport.model_validate_json(r.value).occurred_at > killed_at,
                    60, "a report from the restarted agent", start=mark)
                await watch.wait_for(is_up("node-002"), 60, "node-002 up again", start=mark)
                events = task_events_for(watch, "node-002")
                created = next(e.task for e in events if e.task is not None)
                assert [s.action.action for s in created.steps] == ["restart_agent"]
                done = [e for e in events if e.step_state == "completed"]
                assert done, events
                assert done[-1].outputs.get("restarted") is True, done
                # Never taken offline: no offline need, and it was never down.
                await watch.catch_up()
                assert not [n for n in needs_in(watch) if n.kind == "offline"]
                assert not [r for r in watch.records[mark:]
                            if r.topic.endswith(Topic.OPS_NODE_STATE.value)
                            and r.key == b"node-002" and b'"state":"down"' in r.value]
        finally:
            if stand_in is not None:
                await stand_in.close()
            fleet.fleet_down(tmp_path)
