"""Bad commands (B5, B6, B9, B11, B17..B25 at the agent): the envelope at the strict decoder
the agent subscribes with, then the real CommandExecutor with its SQLite journal
(docs/reliability.md §Command verification), and, for the rejections a task's step receives
(B20, B25), the executor on the real redis-server: its step fails for good, nothing retried.

"Nothing executed" is read from the journal: the node's mode, its last accepted seq and its
fences stay as they were, and no answer but a rejection is journaled.
"""

from __future__ import annotations

import ast
import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from redis.asyncio import Redis

import agent
from agent.app import COMMAND_LIMIT_BYTES
from agent.commands import CommandExecutor
from agent.journal import Journal
from common.errors import PermanentError
from common.signing import CommandVerifier, KeyRegistry, b64url, verifier_from_files
from schemas.events.v1 import (
    Command,
    CommandResult,
    DrainNode,
    MigrateJob,
    OnlineNode,
    SetResources,
    StopJob,
    UndrainNode,
)
from services.shared.redis_client import Keys
from tests.bad_input.corpus import nested, refusal
from tests.service.executor.test_handlers import drain_offline, make_harness
from tests.unit.agent.conftest import CLUSTER, NODE, Centre
from tests.unit.agent.test_agent_commands import signed_raw


def untouched(journal: Journal) -> None:
    """Nothing was executed: the mode, the command order and every fence are as new."""
    assert (journal.mode, journal.last_seq, journal.max_epoch, journal.interval_s) == (
        "active", None, None, None)


def envelope(centre: Centre, **changes: object) -> bytes:
    """A genuine command's envelope as it travels, with `changes` to its JSON."""
    data = json.loads(centre.command().model_dump_json()) | changes
    return json.dumps(data).encode()


def payload_data(centre: Centre, **changes: object) -> dict[str, Any]:
    """A genuine drain's payload as JSON data, with `changes`."""
    data: dict[str, Any] = json.loads(centre.payload(seq=1).model_dump_json())
    return data | changes


def rejected(result: CommandResult | None, reason: str) -> CommandResult:
    """`result` is an answer that refuses the command for `reason` (and did nothing)."""
    assert result is not None
    assert (result.outcome, result.reason) == ("rejected", reason)
    return result


# ---------------------------------------------------------------- the envelope


@pytest.mark.parametrize(("case", "changes", "reason"), [
    ("B5", {"cmd": "rm -rf /"}, "extra_forbidden"),
    ("B6", {"schema_version": 99}, "unsupported_version"),
    ("B9", {"pad": "x" * COMMAND_LIMIT_BYTES}, "oversize"),
    ("B22", {"alg": "hs256"}, "literal_error"),
    ("B22", {"sig": ""}, "string_too_short"),
    ("B22", {"payload": "not base64: $(reboot)"}, "string_pattern_mismatch"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_a_bad_envelope_is_dead_lettered_before_any_check_B5_B6_B9_B22(
        centre: Centre, case: str, changes: dict[str, object], reason: str) -> None:
    """The agent subscribes with a 16 KiB limit and the strict Command model: a bad envelope
    never reaches the executor (dead-lettered with the reason)."""
    assert refusal(Command, envelope(centre), NODE.encode(), COMMAND_LIMIT_BYTES) is None
    body = envelope(centre, **changes)
    assert refusal(Command, body, NODE.encode(), COMMAND_LIMIT_BYTES) == reason, case


def test_an_unsigned_command_is_dead_lettered_B22(centre: Centre) -> None:
    data = json.loads(envelope(centre))
    del data["sig"]
    assert refusal(Command, json.dumps(data).encode(), NODE.encode(),
                   COMMAND_LIMIT_BYTES) == "missing"


def test_deep_nesting_and_a_foreign_key_are_dead_lettered_B11_B17(centre: Centre) -> None:
    assert refusal(Command, nested(8_000), NODE.encode(), COMMAND_LIMIT_BYTES) == "json_invalid"
    assert refusal(Command, envelope(centre), b"node-002",
                   COMMAND_LIMIT_BYTES) == "key_mismatch"


# ---------------------------------------------------------------- the executor's checks


def test_an_unknown_field_in_the_payload_is_rejected_and_nothing_runs_B5(
        executor: CommandExecutor, centre: Centre, journal: Journal, now: datetime) -> None:
    for data in (payload_data(centre, cmd="rm -rf /"),
                 payload_data(centre, action={"action": "drain_node", "node_id": NODE,
                                              "cmd": "rm -rf /"})):
        result = rejected(executor.handle(signed_raw(centre, data), now), "invalid_payload")
        assert result.outputs["error"] == "extra_forbidden"
    untouched(journal)


def test_a_replayed_command_is_answered_from_the_journal_and_not_run_again_B18(
        executor: CommandExecutor, centre: Centre, journal: Journal, now: datetime) -> None:
    drain = centre.command(DrainNode(node_id=NODE), seq=1)
    first = executor.handle(drain, now)
    assert first is not None
    assert first.outcome == "succeeded"
    undrain = executor.handle(centre.command(UndrainNode(node_id=NODE), seq=2), now)
    assert undrain is not None
    # The drain again, long after: had it run, the node would be draining.
    again = executor.handle(drain, now + timedelta(hours=1))
    assert again is not None
    assert (again.duplicate, again.outcome, again.outputs) == (True, "succeeded", first.outputs)
    assert (journal.mode, journal.last_seq, journal.command_count()) == ("active", 2, 2)


def test_old_commands_after_a_restart_are_refused_B19(
        centre: Centre, state_dir: Path, now: datetime) -> None:
    """B19: the journal survives the agent: after a restart the executed drain is a
    duplicate, and old commands under fresh ids are refused by seq, epoch or time."""
    first = Journal.open(state_dir)
    drain = centre.command(DrainNode(node_id=NODE), seq=300, epoch=5)
    assert CommandExecutor(NODE, CLUSTER, centre.verifier, first).handle(drain, now) is not None
    first.close()

    journal = Journal.open(state_dir)
    try:
        restarted = CommandExecutor(NODE, CLUSTER, centre.verifier, journal)
        replay = restarted.handle(drain, now)
        assert replay is not None
        assert replay.duplicate
        rejected(restarted.handle(centre.command(UndrainNode(node_id=NODE), seq=300, epoch=5),
                                  now), "stale_seq")
        rejected(restarted.handle(centre.command(UndrainNode(node_id=NODE), seq=301, epoch=4),
                                  now), "stale_epoch")
        old = centre.command(OnlineNode(node_id=NODE), seq=302, epoch=5,
                             issued_at=now - timedelta(hours=1))
        rejected(restarted.handle(old, now), "expired")
        assert (journal.mode, journal.last_seq, journal.max_epoch) == ("draining", 300, 5)
    finally:
        journal.close()


@pytest.mark.parametrize(("offset_s", "ttl_s", "reason"), [
    (60 + 30 + 1, 60, "expired"),  # past expires_at and the 30 s leeway
    (0, 301, "ttl_too_long"),  # valid longer than max_command_ttl_s
])
def test_an_expired_or_too_long_lived_command_is_rejected_B20(
        executor: CommandExecutor, centre: Centre, journal: Journal, now: datetime,
        offset_s: float, ttl_s: float, reason: str) -> None:
    command = centre.command(seq=1, ttl_s=ttl_s)
    rejected(executor.handle(command, now + timedelta(seconds=offset_s)), reason)
    untouched(journal)


@pytest.mark.parametrize(("outcome", "reason"), [("rejected", "expired"),
                                                 ("rejected", "ttl_too_long"),
                                                 ("rejected", "stale_epoch")])
async def test_a_rejected_step_fails_its_task_without_a_retry_B20_B25(
        redis: Redis, keys: Keys, tmp_path: Path, outcome: str, reason: str) -> None:
    """B20, B25 at the executor: an agent's rejection (expired, too long lived, a lost lease's
    stale epoch) is final for the step; the task fails with cause `rejected` (which no
    breaker counts) and no attempt is sent again."""
    harness = make_harness(redis, keys, tmp_path)
    task = drain_offline()
    await harness.dispatch(task)
    drain = harness.last_command()
    await harness.answer(drain, outcome, reason)
    await harness.retry_now(task)
    final = harness.final(task)
    assert (final.state, final.outputs["cause"]) == ("failed", "rejected")
    assert harness.commands() == [drain]
    assert await harness.journal.due_retries(10**15) == []


def test_a_command_for_another_node_is_ignored_or_rejected_B21(
        executor: CommandExecutor, centre: Centre, journal: Journal, now: datetime) -> None:
    """B21: addressed to another node it is not ours (no answer, nothing journaled); the
    envelope readdressed here over a payload signed for node-002, or for node-001 of another
    cluster, is rejected `wrong_audience`."""
    other = centre.command(DrainNode(node_id="node-002"), node="node-002", seq=1)
    assert executor.handle(other, now) is None
    assert journal.command_count() == 0
    readdressed = other.model_copy(update={"subject": NODE})
    rejected(executor.handle(readdressed, now), "wrong_audience")
    elsewhere = centre.sign(centre.payload(seq=1, cluster="other-cluster"))
    rejected(executor.handle(elsewhere.model_copy(update={"cluster_id": CLUSTER}), now),
             "wrong_audience")
    untouched(journal)


def test_bad_signatures_unknown_keys_and_foreign_signers_execute_nothing_B22(
        executor: CommandExecutor, centre: Centre, journal: Journal, now: datetime,
        tmp_path: Path) -> None:
    """B22: a forged signature, a payload changed after signing and an unknown key are
    dead-lettered unanswered (PermanentError); a genuine signature of a signer whose role may
    not drain, or of a revoked key, is rejected. Nothing runs, nothing is journaled as done."""
    command = centre.command(seq=1)
    forged = command.model_copy(update={"sig": b64url(Ed25519PrivateKey.generate().sign(b"x"))})
    changed = command.model_copy(
        update={"payload": centre.command(OnlineNode(node_id=NODE), seq=1).payload})
    for bad, reason in ((forged, "bad_signature"), (changed, "bad_signature")):
        with pytest.raises(PermanentError) as refused:
            executor.handle(bad, now)
        assert refused.value.reason == reason
    stranger = CommandExecutor(NODE, CLUSTER, CommandVerifier(KeyRegistry()), journal)
    with pytest.raises(PermanentError) as unknown:
        stranger.handle(command, now)
    assert unknown.value.reason == "unknown_kid"
    assert journal.command_count() == 0

    rejected(executor.handle(centre.sign(centre.payload(seq=1), role="collector"), now),
             "action_not_allowed")
    revoked_file = tmp_path / "revoked-kids"
    revoked_file.write_text(f"{centre.signer.kid}\n")
    revoking = CommandExecutor(NODE, CLUSTER, verifier_from_files(centre.public_keys,
                                                                  revoked_file), journal)
    rejected(revoking.handle(centre.command(seq=1), now), "revoked_kid")
    untouched(journal)


def test_a_payload_that_is_not_base64url_is_a_bad_signature_B22(
        executor: CommandExecutor, centre: Centre, journal: Journal, now: datetime) -> None:
    """B22: a payload the schema's alphabet allows but that decodes to nothing (a length of
    4n+1 characters) cannot carry a valid signature: it must be dead-lettered
    `bad_signature` like any forged one, not escape as an unforeseen error (which the
    dead-letter policy logs with a traceback as `unhandled_error`)."""
    command = centre.command(seq=1)
    # A genuine payload is 4n, 4n+2 or 4n+3 characters long: padded to 4n+1, it decodes no more.
    for payload in ("A", command.payload + "A" * ((1 - len(command.payload)) % 4)):
        assert len(payload) % 4 == 1
        with pytest.raises(PermanentError) as refused:
            executor.handle(command.model_copy(update={"payload": payload}), now)
        assert refused.value.reason == "bad_signature"
    assert journal.command_count() == 0


def test_an_action_outside_the_allow_list_is_rejected_before_dispatch_B23(
        executor: CommandExecutor, centre: Centre, journal: Journal, now: datetime) -> None:
    """B23: `exec_shell` is rejected `invalid_payload` (union_tag_invalid) when the command
    id can be read, and dead-lettered when it cannot."""
    data = payload_data(centre, action={"action": "exec_shell", "node_id": NODE,
                                        "argv": ["/bin/sh", "-c", "reboot"]})
    result = rejected(executor.handle(signed_raw(centre, data), now), "invalid_payload")
    assert result.outputs["error"] == "union_tag_invalid"
    del data["command_id"]
    with pytest.raises(PermanentError):
        executor.handle(signed_raw(centre, data), now)
    untouched(journal)


@pytest.mark.parametrize("job_id", ["j1; rm -rf /", "../../etc", "j1\nreboot", "$(reboot)",
                                    "j" * 129, ""])
def test_an_injected_identifier_is_rejected_B24(
        executor: CommandExecutor, centre: Centre, journal: Journal, now: datetime,
        job_id: str) -> None:
    """B24: identifiers must match ^[A-Za-z0-9_.-]{1,128}$: a shell fragment, a path, a
    newline is `string_pattern_mismatch`, for every action that names a job."""
    for action in (StopJob(node_id=NODE, job_id="j1"), MigrateJob(node_id=NODE, job_id="j1"),
                   SetResources(node_id=NODE, job_id="j1", gpus=1, memory_mib=1)):
        data = payload_data(centre, action=json.loads(action.model_dump_json()) | {
            "job_id": job_id})
        result = rejected(executor.handle(signed_raw(centre, data), now), "invalid_payload")
        assert result.outputs["error"] == "string_pattern_mismatch"
    untouched(journal)


def test_the_agent_never_runs_a_shell_B24() -> None:
    """B24's second line: even an identifier that slipped through would be an argv item,
    never shell text. No call in the agent's code runs a shell (shell=True, os.system,
    os.popen, create_subprocess_shell)."""
    shell_calls = {"system", "popen", "create_subprocess_shell", "getoutput",
                   "getstatusoutput"}
    found: list[str] = []
    sources = sorted(Path(agent.__file__).parent.rglob("*.py"))
    assert len(sources) > 10
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            shell = any(k.arg == "shell" and not (isinstance(k.value, ast.Constant)
                                                  and k.value.value is False)
                        for k in node.keywords)
            if called in shell_calls or shell:
                found.append(f"{path}:{node.lineno}")
    assert found == []


def test_a_command_with_an_older_epoch_is_rejected_B25(
        executor: CommandExecutor, centre: Centre, journal: Journal, now: datetime) -> None:
    assert executor.handle(centre.command(seq=1, epoch=7), now) is not None
    rejected(executor.handle(centre.command(UndrainNode(node_id=NODE), seq=2, epoch=6), now),
             "stale_epoch")
    # The job's fence too: a job action under an older epoch than its job saw.
    assert executor.handle(centre.command(StopJob(node_id=NODE, job_id="a"), seq=3, epoch=9),
                           now) is not None
    rejected(executor.handle(centre.command(StopJob(node_id=NODE, job_id="a"), seq=4,
                                            epoch=8), now), "stale_epoch")
    assert (journal.mode, journal.last_seq, journal.max_epoch) == ("draining", 3, 7)
    assert journal.max_epoch_for("job:a") == 9
