"""docs/security.md on the real broker with a real agent process: the executor's, the
collector's and the router's commands, each signed with the key its service makes
(`<state>/keys/<role>.key`), are executed; a drain signed with the collector's key is
rejected `action_not_allowed` and changes nothing; a new executor key dropped into the
trusted folder is taken without a restart, the old one revoked is answered `revoked_kid`;
and a replay of the executed drain after its expiry is answered `duplicate`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from uuid import UUID, uuid4

from agent import fleet
from common.messaging import ensure_topics
from common.signing import ensure_keypair, local_signer, signer_from_file, unb64url
from schemas.events.v1 import (
    Command,
    CommandPayload,
    CommandResult,
    DrainNode,
    NodeReport,
    ProbeNode,
    QueryStatus,
    RunInference,
    SetReportInterval,
    UndrainNode,
)
from schemas.topics import Topic, dead_letter_name
from tests.integration.harness import Record, name, producer, tap
from tests.integration.test_command_security import (
    CLUSTER,
    NODE,
    agent_log_on_failure,
    answered,
    answers_to,
    dead_letters,
    journal_rows,
    modes,
    payload,
    report_after,
)

LEEWAY_S = 1.0  # the agent's: a short-lived command expires within the test


def serving(node: str) -> Callable[[Record], bool]:
    """True for a report of `node` with every model it serves ready."""
    def ready(record: Record) -> bool:
        if not record.topic.endswith(Topic.NODE_REPORTS.value) or record.key != node.encode():
            return False
        models = NodeReport.model_validate_json(record.value).models
        return bool(models) and all(m.state == "ready" for m in models)
    return ready


def command_id(command: Command) -> UUID:
    """The command id inside a command's signed payload."""
    return CommandPayload.model_validate_json(unb64url(command.payload)).command_id


async def test_each_signer_does_only_its_actions_with_rotation_and_revocation(
    kafka_bootstrap: str, namespace: str, tmp_path: Path
) -> None:
    keys, revoked = tmp_path / "keys", tmp_path / "revoked-kids"
    executor, collector, router = (local_signer("", str(tmp_path), role)
                                   for role in ("executor", "collector", "router"))
    env = {"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "WARDEN_LOG_LEVEL": "INFO",
           "AGENT_JOBS": "", "AGENT_PEER_PROBES": "0", "AGENT_REVOKED_KIDS": str(revoked),
           "AGENT_COMMAND_LEEWAY_S": str(LEEWAY_S)}
    commands = name(Topic.NODE_COMMANDS, namespace)
    await ensure_topics(kafka_bootstrap, namespace)
    # The agent trusts the folder: whatever public key is put there, for the role its name
    # gives it.
    fleet.fleet_up(1, 1, CLUSTER, namespace, tmp_path, env, [keys], 1.0,
                   models="digits-logreg@1")
    try:
        async with (agent_log_on_failure(tmp_path), producer(kafka_bootstrap) as prod,
                    tap(kafka_bootstrap, name(Topic.NODE_COMMAND_RESULTS, namespace),
                        name(Topic.NODE_REPORTS, namespace),
                        dead_letter_name(commands)) as watch):

            async def ask(command: Command) -> CommandResult:
                """Send `command`; the answer to it."""
                sent = len(answers_to(watch, command_id(command)))
                await prod.send_and_wait(commands, command.model_dump_json().encode(),
                                         key=command.subject.encode())
                await watch.wait_for(answered(watch, command_id(command), sent + 1), 60,
                                     "the answer")
                return answers_to(watch, command_id(command))[-1]

            await watch.wait_for(serving(NODE), 60, f"{NODE} reporting its model ready")

            # The collector's key, real and trusted, for a drain: refused, nothing changes.
            forged = await ask(collector.sign(
                payload(DrainNode(node_id=NODE), seq=1), "collector"))
            assert (forged.outcome, forged.reason) == ("rejected", "action_not_allowed")

            # Each signer's own actions (inference first: a draining node takes none).
            probe = await ask(collector.sign(
                payload(ProbeNode(node_id=NODE), seq=0), "collector"))
            interval = await ask(collector.sign(
                payload(SetReportInterval(node_id=NODE, interval_s=1.0), seq=0), "collector"))
            inference = await ask(router.sign(payload(RunInference(
                node_id=NODE, task_id=uuid4(), attempt=1, task_type="digits",
                model="digits-logreg", version="1", input=[4.0] * 64), seq=0), "router"))
            assert [r.outcome for r in (probe, interval, inference)] == ["succeeded"] * 3
            assert inference.inference is not None
            # The drain takes seq 1, which the refusal left free.
            drain = executor.sign(payload(DrainNode(node_id=NODE), seq=1,
                                          ttl=timedelta(seconds=5)), "executor")
            drained = await ask(drain)
            assert (drained.outcome, drained.outputs.get("mode")) == ("succeeded", "draining")
            await watch.wait_for(lambda _: modes(watch)[-1:] == ["draining"], 30,
                                 "a report of the drain")

            # A late replay of the executed drain: past its 5 s and the leeway.
            await asyncio.sleep(5 + LEEWAY_S + 1.0)
            late = await ask(drain)
            assert (late.outcome, late.duplicate, late.outputs) == (
                "succeeded", True, drained.outputs)

            # Rotation: the new executor key beside the old, taken without a restart.
            rotated = signer_from_file(ensure_keypair(keys, "executor.next")[0])
            undrained = await ask(rotated.sign(
                payload(UndrainNode(node_id=NODE), seq=2), "executor"))
            assert (undrained.outcome, undrained.outputs.get("mode")) == ("succeeded", "active")
            # Then the old one revoked: refused, whatever it asks.
            revoked.write_text(f"{executor.kid}\n")
            stale_key = await ask(executor.sign(
                payload(DrainNode(node_id=NODE), seq=3), "executor"))
            assert (stale_key.outcome, stale_key.reason) == ("rejected", "revoked_kid")
            status = await ask(rotated.sign(payload(
                QueryStatus(node_id=NODE, command_id=command_id(drain)), seq=0),
                "executor"))
            assert (status.outcome, status.outputs.get("queried_action")) == (
                "succeeded", "drain_node")

            # The only mode changes are the executor's drain and the new key's undrain.
            await watch.wait_for(report_after(watch, len(watch.records)), 30, "a later report")
            assert modes(watch) == ["active", "draining", "active"]
            assert dead_letters(watch) == []
            executed = [row[1] for row in journal_rows(tmp_path) if row[2] != "rejected"]
            assert executed == ["probe_node", "set_report_interval", "drain_node",
                                "undrain_node", "query_status"]
    finally:
        fleet.fleet_down(tmp_path)
