"""Property tests: generated malformed reports, commands and operator controls thrown at the
validators and at the real handlers. Whatever the input, nothing crashes (only the documented
refusals come out: dead-letter reasons, agent rejections, HTTP 4xx) and nothing is acted on
(no node state, no sample, no journaled execution, no vouched control).

Deterministic (`derandomize=True`: the same examples every run) and bounded in examples, so
the module runs in seconds; no example database is written.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final, Literal, get_args
from uuid import UUID, uuid4

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from agent.app import COMMAND_LIMIT_BYTES
from agent.commands import CommandExecutor
from agent.journal import Journal
from common.errors import PermanentError
from common.signing import b64url
from schemas.events.v1 import (
    Command,
    DrainNode,
    GpuMetrics,
    HostMetrics,
    JobInfo,
    NodeReport,
    TaskControl,
    now_utc,
)
from services.api.auth import Role
from services.shared.redis_client import Keys
from services.shared.vouchers import ControlVouchers
from tests.bad_input.collector_harness import CollectorHarness, collector_harness
from tests.bad_input.corpus import (
    EVENT_LIMIT,
    NODE,
    OTHER_NODE,
    PARSE_REASONS,
    REPORT_REASONS,
    refusal,
)
from tests.bad_input.strategies import Shape, broken
from tests.bad_input.test_api import REASON, recorded, state_of, vouchers
from tests.bad_input.test_commands import untouched
from tests.contracts.examples import example
from tests.integration.test_dead_letters import fresh_report
from tests.service.api.conftest import TOKENS, Api
from tests.service.executor.test_handlers import drain_offline, make_harness
from tests.unit.agent.conftest import CLUSTER, Centre
from tests.unit.agent.conftest import NODE as AGENT_NODE


def bounded(examples: int) -> settings:
    """Deterministic runs of `examples` examples. The fixtures are shared by the examples on
    purpose: what one example leaves behind is what the next must find untouched."""
    return settings(derandomize=True, max_examples=examples, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


REPORT: Final = Shape.of(
    example("node_report", NodeReport),
    identifiers=[("node_id",), ("subject",), ("source",), ("pool",), ("cluster_id",),
                 ("jobs", 0, "job_id"), ("peer_probes", 0, "peer_node_id"),
                 ("models", 0, "model")],
    limit=EVENT_LIMIT,
    nested=[(("gpus", 0), GpuMetrics), (("host",), HostMetrics), (("jobs", 0), JobInfo)])
CONTROL: Final = Shape.of(
    example("task_control", TaskControl),
    identifiers=[("source",), ("subject",), ("actor",), ("cluster_id",)], limit=EVENT_LIMIT)


# ---------------------------------------------------------------- reports


@bounded(400)
@given(case=broken(REPORT))
def test_a_malformed_report_is_refused_with_a_documented_reason(case: tuple[str, bytes]) -> None:
    """B1..B9, B11, B24 generated: any report broken in one place is refused by the strict
    decoder with a documented reason, never accepted and never another exception."""
    defect, body = case
    event(defect)
    assert refusal(NodeReport, body, NODE.encode(), EVENT_LIMIT) in PARSE_REASONS, defect


Forgery = Literal["unsigned", "another_nodes_mac", "changed_after_signing", "unknown_master",
                  "two_macs", "foreign_key"]
FORGERIES: Final[tuple[Forgery, ...]] = get_args(Forgery)


def forged(bench: CollectorHarness, forgery: Forgery) -> tuple[bytes, bytes,
                                                             tuple[tuple[str, bytes], ...]]:
    """A well-formed, fresh report of node-002 that is not node-002's own to send."""
    key, body, headers = bench.sign(fresh_report())
    if forgery == "unsigned":
        return key, body, ()
    if forgery == "another_nodes_mac":
        return bench.sign(fresh_report(), as_node=OTHER_NODE)
    if forgery == "changed_after_signing":
        changed = body.replace(b'"utilization_pct":71.5', b'"utilization_pct":0.5')
        assert changed != body
        return key, changed, headers
    if forgery == "unknown_master":
        return key, body, tuple((k, b"rk-AAAAAAAAAAAAAAAA" if k == "report-kid" else v)
                                for k, v in headers)
    if forgery == "two_macs":
        return key, body, (*headers, headers[0])
    return OTHER_NODE.encode(), body, headers  # foreign_key


@bounded(60)
@given(data=st.data())
async def test_malformed_and_forged_reports_reach_no_node_state(
        redis: Redis, keys: Keys, data: st.DataObject) -> None:
    """B1..B9, B11, B16, B17, B24 generated: a batch of malformed and forged reports through
    the collector's handler; each one is dead-lettered with a documented reason, and no
    sample, state change or node hash follows (only the one alert per node and window that
    forged ones raise)."""
    bench = await collector_harness(redis, keys, [OTHER_NODE, NODE])
    malformed = st.tuples(st.just(NODE.encode()), broken(REPORT).map(lambda c: c[1]))
    batch = data.draw(st.lists(st.one_of(
        malformed, st.sampled_from(FORGERIES).map(lambda forgery: forged(bench, forgery))),
        min_size=1, max_size=4))
    await bench.feed(*batch)
    assert len(bench.letters) == len(batch)
    assert set(bench.reasons()) <= REPORT_REASONS - {"unknown_node", "implausible_seq"}
    assert bench.samples() == []
    assert bench.state_changes() == []
    assert {alert.kind for alert in bench.alerts()} <= {"unauthenticated_report"}
    assert (await bench.node(NODE), await bench.node(OTHER_NODE)) == ({}, {})
    assert await bench.enrolled() == [OTHER_NODE, NODE]


# ---------------------------------------------------------------- commands

PAYLOAD_LIMIT: Final = 12_000  # a payload this large still fits the 16 KiB command once encoded
REJECTIONS: Final = frozenset({"invalid_payload", "wrong_audience", "action_not_allowed",
                               "revoked_kid", "expired", "not_yet_valid", "ttl_too_long",
                               "stale_seq", "stale_epoch"})
UNANSWERED: Final = frozenset({"bad_signature", "unknown_kid", "alg_mismatch"}) | PARSE_REASONS
B64URL: Final = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
CommandDefect = Literal["payload", "expired", "not_yet_valid", "ttl_too_long",
                        "another_node", "another_cluster", "foreign_signer", "forged_sig",
                        "swapped_payload", "unknown_kid", "undecodable_payload"]


def payload_shape(centre: Centre) -> Shape:
    return Shape.of(centre.payload(seq=1),
                    identifiers=[("cluster_id",), ("node_id",), ("action", "node_id")],
                    limit=PAYLOAD_LIMIT, nested=[(("action",), DrainNode)])


def signed_bytes(centre: Centre, raw: bytes) -> Command:
    """A command whose payload is exactly `raw`, correctly signed by the executor's key."""
    good = centre.command()
    return good.model_copy(update={"payload": b64url(raw),
                                   "sig": b64url(centre.signer.key.sign(raw))})


def bad_command(centre: Centre, now: datetime, defect: CommandDefect,
                data: st.DataObject) -> Command:
    """A command with one defect: a broken payload (correctly signed), a time, audience or
    signer the agent refuses, or a signature, key or payload encoding that does not verify."""
    if defect == "payload":
        return signed_bytes(centre, data.draw(broken(payload_shape(centre)))[1])
    if defect == "expired":
        return centre.command(issued_at=now - timedelta(seconds=data.draw(
            st.floats(60 + 30 + 0.001, 1e7))), ttl_s=60)
    if defect == "not_yet_valid":
        return centre.command(issued_at=now + timedelta(seconds=data.draw(
            st.floats(30.001, 1e7))))
    if defect == "ttl_too_long":
        return centre.command(ttl_s=data.draw(st.floats(300.001, 1e6)))
    if defect == "another_node":
        other = data.draw(st.sampled_from(["node-002", "node-0010", "NODE-001"]))
        return centre.command(DrainNode(node_id=other), node=other).model_copy(
            update={"subject": AGENT_NODE})
    if defect == "another_cluster":
        return centre.sign(centre.payload(cluster="other-cluster")).model_copy(
            update={"cluster_id": CLUSTER})
    if defect == "foreign_signer":
        return centre.sign(centre.payload(), role=data.draw(st.sampled_from(["collector",
                                                                             "router"])))
    command = centre.command()
    if defect == "forged_sig":
        return command.model_copy(update={"sig": b64url(data.draw(st.binary(min_size=1,
                                                                             max_size=80)))})
    if defect == "swapped_payload":
        return command.model_copy(update={"payload": centre.command(seq=2).payload})
    if defect == "unknown_kid":
        return command.model_copy(update={"kid": data.draw(st.sampled_from(
            ["cw-AAAAAAAAAAAAAAAA", "executor", command.kid + "x"]))})
    # undecodable_payload: any text of the alphabet the envelope's pattern allows
    return command.model_copy(update={"payload": data.draw(st.text(B64URL, min_size=1,
                                                                   max_size=40))})


@bounded(200)
@given(data=st.data())
def test_a_malformed_or_forged_command_is_never_executed(
        executor: CommandExecutor, centre: Centre, journal: Journal, now: datetime,
        data: st.DataObject) -> None:
    """B5, B20..B24 generated: each command with one defect (its payload broken and signed,
    its time, audience or signer refused, its signature, key or payload encoding wrong) is
    rejected with a documented reason or dead-lettered unanswered (PermanentError); the
    journal never records an execution."""
    defect: CommandDefect = data.draw(st.sampled_from(
        ["payload", "payload", "payload", "expired", "not_yet_valid", "ttl_too_long",
         "another_node", "another_cluster", "foreign_signer", "forged_sig",
         "swapped_payload", "unknown_kid", "undecodable_payload"]))
    event(defect)
    command = bad_command(centre, now, defect, data)
    outcome, reason = answer(executor, command, now)
    if outcome == "unanswered":
        assert reason in UNANSWERED, (defect, reason)
    else:
        assert (outcome, reason in REJECTIONS) == ("rejected", True), (defect, outcome, reason)
    untouched(journal)


def answer(executor: CommandExecutor, command: Command, now: datetime) -> tuple[str, str]:
    """What the agent does with `command`: (outcome, reason) of its answer, ("unanswered",
    reason) for one it dead-letters, ("ignored", "") for one it leaves to another node."""
    try:
        result = executor.handle(command, now)
    except PermanentError as err:
        return "unanswered", err.reason
    if result is None:
        return "ignored", ""
    return result.outcome, result.reason


@bounded(200)
@given(data=st.data())
def test_a_malformed_command_envelope_is_refused_with_a_documented_reason(
        centre: Centre, data: st.DataObject) -> None:
    """B5, B6, B9, B11, B22 generated at the agent's strict decoder: a broken envelope is
    dead-lettered with a documented reason before any check of the executor."""
    shape = Shape.of(centre.command(), identifiers=[("kid",), ("source",), ("subject",),
                                                     ("cluster_id",)],
                     limit=COMMAND_LIMIT_BYTES)
    defect, body = data.draw(broken(shape))
    event(defect)
    reason = refusal(Command, body, AGENT_NODE.encode(), COMMAND_LIMIT_BYTES)
    assert reason in PARSE_REASONS, defect


# ---------------------------------------------------------------- operator controls


@bounded(300)
@given(case=broken(CONTROL))
def test_a_malformed_control_is_refused_with_a_documented_reason(
        case: tuple[str, bytes]) -> None:
    """B5, B6, B9, B11, B24 generated for operator controls (TaskControl) on their topic:
    refused by the strict decoder with a documented reason."""
    defect, body = case
    event(defect)
    subject = str(CONTROL.base["subject"]).encode()
    assert refusal(TaskControl, body, subject, EVENT_LIMIT) in PARSE_REASONS, defect


ControlAction = Literal["pause", "resume", "retry", "terminate", "jump", "restart"]
CONTROL_ACTIONS: Final[list[ControlAction]] = ["pause", "resume", "retry", "terminate", "jump",
                                               "restart"]


@st.composite
def controls(draw: st.DrawFn, task_id: UUID) -> TaskControl:
    """A well-formed control of `task_id` (any action, actor and reason)."""
    action = draw(st.sampled_from(CONTROL_ACTIONS))
    return TaskControl(
        event_id=uuid4(), source="api", occurred_at=now_utc(), cluster_id="c1",
        subject=str(task_id), task_id=task_id, action=action,
        step_index=draw(st.integers(0, 63)) if action == "jump" else None,
        actor=draw(st.sampled_from(["alice", "bob", "ops.on-call"])),
        reason=draw(st.text(min_size=1, max_size=40)))


@bounded(50)
@given(data=st.data())
async def test_a_control_the_api_did_not_vouch_for_changes_no_task(
        redis: Redis, keys: Keys, tmp_path: Path, data: st.DataObject) -> None:
    """A well-formed control nobody vouched for (published past the API), or one the API
    vouched for and that was changed on the way, is dead-lettered `unvouched_control` by the
    executor: the task's workflow and everything published stay as they were (B32, the
    executor's side of B28 and B29)."""
    harness = make_harness(redis, keys, tmp_path / str(uuid4()))
    task = drain_offline()
    await harness.dispatch(task)
    before, published = await harness.wf(task), len(harness.bus.published)
    control = data.draw(controls(task.task_id))
    change = data.draw(st.sampled_from(["none", "action", "reason", "actor", "step_index"]))
    event(f"changed: {change}")
    if change != "none":
        await ControlVouchers(redis, keys).vouch(control)
        control = changed(control, change)
    with pytest.raises(PermanentError) as refused:
        await harness.executor.on_control(control)
    assert refused.value.reason == "unvouched_control"
    assert await harness.wf(task) == before
    assert len(harness.bus.published) == published


def changed(control: TaskControl, field: str) -> TaskControl:
    """`control` with `field` changed (still well formed), as someone on the way would."""
    if field == "action":
        action = "terminate" if control.action != "terminate" else "pause"
        return control.model_copy(update={"action": action, "step_index": None})
    if field == "reason":
        return control.model_copy(update={"reason": control.reason + "!"})
    if field == "actor":
        return control.model_copy(update={"actor": control.actor + "x"})
    return control.model_copy(update={"action": "jump", "step_index": (
        (control.step_index or 0) + 1) % 64})


ApiDefect = Literal["token", "role", "body", "state", "unknown_task", "oversize"]
EXPECTED: Final[dict[ApiDefect, int]] = {"token": 401, "role": 403, "body": 422, "state": 409,
                                          "unknown_task": 404, "oversize": 413}


def malformed_bodies() -> st.SearchStrategy[bytes]:
    """Control bodies the API must refuse: no reason, a blank or too long one, another type,
    an unknown field, JSON that is not an object, bytes that are not JSON."""
    reason = {"reason": "checking"}
    as_json: st.SearchStrategy[Any] = st.one_of(
        st.just({}),
        st.builds(lambda blank: {"reason": blank}, st.text(" \t\n", max_size=5)),
        st.builds(lambda n: {"reason": "x" * n}, st.integers(501, 2_000)),
        st.builds(lambda v: {"reason": v}, st.one_of(st.integers(), st.booleans(),
                                                     st.none(), st.lists(st.text(),
                                                                         max_size=2))),
        st.builds(lambda name: reason | {name: "rm -rf /"},
                  st.text(min_size=1, max_size=8).filter(lambda n: n != "reason")),
        st.one_of(st.lists(st.integers(), max_size=2), st.text(max_size=8), st.integers()),
    )
    return st.one_of(as_json.map(lambda body: json.dumps(body).encode()),
                     st.binary(max_size=40).filter(lambda raw: not _json_object(raw)))


def _json_object(raw: bytes) -> bool:
    try:
        return isinstance(json.loads(raw), dict)
    except ValueError:
        return False


@bounded(40)
@given(data=st.data())
async def test_a_malformed_or_illegal_control_call_is_refused_and_vouches_for_nothing(
        api: Api, data: st.DataObject) -> None:
    """B27, B28, B29 generated: control calls with one defect each (token, role, body, the
    task's state, an unknown task, size) get exactly their 4xx; the running task stays
    running, and no control is vouched for, so the executor would apply none."""
    task = await recorded(api, "running")
    defect: ApiDefect = data.draw(st.sampled_from(list(EXPECTED)))
    event(defect)
    action: ControlAction = data.draw(st.sampled_from(CONTROL_ACTIONS))
    role: Role = "admin"
    body = json.dumps(REASON | ({"step_index": 0} if action == "jump" else {})).encode()
    target = task.task_id
    headers: dict[str, str] = {}
    if defect == "token":
        headers = data.draw(st.sampled_from([
            {}, {"Authorization": "Bearer not-a-configured-token"},
            {"Authorization": f"Basic {TOKENS['admin']}"},
            {"Authorization": f"Bearer {TOKENS['admin']}x"}]))
    elif defect == "role":
        role = "operator" if action == "jump" else "viewer"
    elif defect == "body":
        body = data.draw(malformed_bodies())
        if action == "jump" and data.draw(st.booleans()):  # a step beyond every task's
            body = json.dumps(REASON | {"step_index": data.draw(st.one_of(
                st.integers(64, 10**6), st.integers(-10**6, -1)))}).encode()
    elif defect == "state":
        action = data.draw(st.sampled_from(["resume", "retry", "restart", "jump"]))
        body = json.dumps(REASON | ({"step_index": 1} if action == "jump" else {})).encode()
    elif defect == "unknown_task":
        target = uuid4()
    else:
        body = json.dumps(REASON | {"pad": "x" * 300_000}).encode()
    if defect != "token":
        headers = {"Authorization": f"Bearer {TOKENS[role]}"}
    response = await api.client.post(f"/api/tasks/{target}/{action}", content=body,
                                      headers=headers | {"Content-Type": "application/json"})
    assert response.status_code == EXPECTED[defect], (defect, action, body[:200],
                                                      response.text)
    assert await state_of(api, task) == "running"
    assert await vouchers(api) == 0
    assert not [e for e in await api.audit() if e.result == "accepted"]

