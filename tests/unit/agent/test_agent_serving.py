"""Model serving on the agent: real models, the run_inference command, causes and faults."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import numpy as np
import pytest

from agent.commands import CommandExecutor
from agent.faults import FaultPlan, ModelFault, write_faults
from agent.journal import Journal
from agent.ml.data import digits, split
from agent.ml.serving import (
    CATALOGUE,
    STANDARD_MODELS,
    ModelServer,
    check_input,
    check_output,
    parse_models,
)
from agent.settings import AgentSettings
from schemas.events.v1 import CommandResult, InferenceOutput, RunInference
from tests.unit.agent.conftest import CLUSTER, NODE, NOW, Centre

SERVED = ("digits-logreg@1", "digits-mlp@1", "digits-knn@1", "digits-mlp@2")


@pytest.fixture(scope="module")
def server() -> ModelServer:
    served = ModelServer(SERVED, max_concurrency=2)
    served.load()
    return served


@pytest.fixture(scope="module")
def test_digits() -> tuple[Any, Any]:
    _, _, x_test, y_test = split(*digits())
    return x_test, y_test


def pixels(x_row: Any) -> list[float]:
    """A held-out digit as a task's input: pixel counts 0..16."""
    return [float(v) for v in np.round(x_row * 16.0)]


def test_every_served_model_is_ready_and_learnt_the_digits(server: ModelServer) -> None:
    served = {f"{m.model}@{m.version}": m for m in server.served()}
    assert set(served) == set(SERVED)
    for model in served.values():
        assert model.state == "ready"
        assert model.task_type == "digits"
        assert model.max_concurrency == 2
        assert model.accuracy is not None
        assert model.accuracy > 0.85, model
    assert {m.family for m in served.values()} == {"logreg", "mlp", "knn"}


def test_the_catalogue_and_the_setting_agree() -> None:
    assert set(STANDARD_MODELS) <= set(CATALOGUE)
    assert parse_models(" digits-mlp@1, digits-knn@1 ,digits-mlp@1") == ("digits-mlp@1",
                                                                        "digits-knn@1")
    with pytest.raises(ValueError, match="unknown models"):
        parse_models("digits-transformer@9")
    settings = AgentSettings(node_id="n1", models="digits-knn@1,digits-mlp@2")
    assert settings.model_names() == ("digits-knn@1", "digits-mlp@2")
    assert AgentSettings(node_id="n1").model_names() == ()


@pytest.mark.parametrize(
    ("task_type", "values", "why"),
    [
        ("digits", [0.0] * 63, "64 pixel counts"),
        ("digits", [17.0] * 64, "0..16"),
        ("digits", [-1.0] * 64, "0..16"),
        ("speech", [0.0] * 64, "no model here"),
    ],
)
def test_bad_inputs_are_named(task_type: str, values: list[float], why: str) -> None:
    found = check_input(task_type, values)
    assert found is not None
    assert why in found


def test_invalid_outputs_are_caught() -> None:
    assert check_output(np.full((1, 10), 0.1)) is None
    assert "finite" in (check_output(np.full((1, 10), np.nan)) or "")
    assert "distribution" in (check_output(np.full((1, 10), 0.2)) or "")


def test_predictions_are_right_on_held_out_digits(server: ModelServer,
                                                  test_digits: tuple[Any, Any]) -> None:
    x_test, y_test = test_digits
    for name in SERVED:
        model, version = name.split("@")
        loaded, refusal = server.admit("digits", model, version, pixels(x_test[0]))
        assert loaded is not None
        assert refusal is None
        try:
            correct = 0
            for row, label in zip(x_test[:50], y_test[:50], strict=True):
                answer = server.run(loaded, pixels(row), None, uuid4())
                assert answer.cause is None
                assert answer.confidence is not None
                correct += answer.prediction == int(label)
        finally:
            server.release(loaded)
        assert correct >= 42, name


def test_a_model_over_its_limit_refuses_with_capacity(server: ModelServer) -> None:
    held = [server.admit("digits", "digits-knn", "1", [0.0] * 64)[0] for _ in range(2)]
    try:
        loaded, refusal = server.admit("digits", "digits-knn", "1", [0.0] * 64)
        assert loaded is None
        assert refusal is not None
        assert refusal.cause == "capacity"
    finally:
        for one in held:
            assert one is not None
            server.release(one)
    assert server.admit("digits", "digits-knn", "1", [0.0] * 64)[0] is not None


def test_a_model_still_loading_is_unavailable() -> None:
    fresh = ModelServer(("digits-knn@1",))
    assert [m.state for m in fresh.served()] == ["loading"]
    loaded, refusal = fresh.admit("digits", "digits-knn", "1", [0.0] * 64)
    assert loaded is None
    assert refusal is not None
    assert refusal.cause == "unavailable"


# ---------------------------------------------------------------- the command


@pytest.fixture
def serving(centre: Centre, journal: Journal, state_dir: Path,
            server: ModelServer) -> CommandExecutor:
    from agent.faults import read_faults

    return CommandExecutor(NODE, CLUSTER, centre.verifier, journal,
                           fault_plan=lambda: read_faults(state_dir), models=server)


def run_inference(model: str = "digits-mlp", version: str = "1",
                  values: list[float] | None = None, **fields: Any) -> RunInference:
    return RunInference(node_id=NODE, task_id=uuid4(), attempt=1, task_type="digits",
                        model=model, version=version, input=values or [0.0] * 64, **fields)


def answer(executor: CommandExecutor, centre: Centre, action: RunInference,
           command_id: UUID | None = None) -> CommandResult:
    result = executor.handle(centre.command(action, seq=0, command_id=command_id), NOW)
    assert result is not None
    return result


def inference_of(result: CommandResult) -> InferenceOutput:
    assert result.inference is not None
    return result.inference


def test_run_inference_answers_with_the_prediction(
        serving: CommandExecutor, centre: Centre, test_digits: tuple[Any, Any]) -> None:
    x_test, y_test = test_digits
    action = run_inference(values=pixels(x_test[3]))
    result = answer(serving, centre, action)
    assert (result.outcome, result.action) == ("succeeded", "run_inference")
    out = inference_of(result)
    assert out.cause is None
    assert out.prediction == int(y_test[3])
    assert (out.task_id, out.attempt, out.model, out.version, out.family) == (
        action.task_id, 1, "digits-mlp", "1", "mlp")
    assert out.latency_ms >= 0.0


@pytest.mark.parametrize(
    ("action", "cause"),
    [
        (run_inference(values=[99.0] * 64), "bad_input"),
        (run_inference(model="digits-logreg", version="2"), "unavailable"),
        (run_inference(model="nothing"), "unavailable"),
    ],
)
def test_refusals_carry_their_cause(serving: CommandExecutor, centre: Centre,
                                    action: RunInference, cause: str) -> None:
    result = answer(serving, centre, action)
    assert (result.outcome, result.reason, inference_of(result).cause) == ("failed", cause, cause)


def test_inference_is_outside_the_command_order(serving: CommandExecutor, centre: Centre,
                                                journal: Journal) -> None:
    """The router's commands neither need nor move the node's sequence and epochs."""
    answer(serving, centre, run_inference())
    assert journal.last_seq is None
    assert journal.max_epoch is None


def test_a_drained_node_takes_no_tasks(serving: CommandExecutor, centre: Centre,
                                       journal: Journal) -> None:
    journal.set_mode("draining")
    out = inference_of(answer(serving, centre, run_inference()))
    assert out.cause == "unavailable"
    assert "draining" in out.detail


def test_a_flaky_model_fails_by_its_rate_and_the_same_command_the_same_way(
        serving: CommandExecutor, centre: Centre, state_dir: Path) -> None:
    write_faults(state_dir, FaultPlan(model_faults=[ModelFault(model="digits-mlp@1",
                                                               failure_rate=0.5)]))
    causes = [inference_of(answer(serving, centre, run_inference())).cause for _ in range(60)]
    failed = causes.count("model_fault")
    assert 15 <= failed <= 45
    assert set(causes) == {None, "model_fault"}
    # Another model on the node is not affected.
    others = {inference_of(answer(serving, centre, run_inference("digits-knn"))).cause
              for _ in range(10)}
    assert others == {None}
    # A redelivered command is a duplicate: the cached answer.
    command_id = uuid4()
    first = answer(serving, centre, run_inference(), command_id)
    again = answer(serving, centre, run_inference(), command_id)
    assert again.duplicate
    assert again.inference == first.inference


def test_a_node_fault_fails_every_model_as_the_node(serving: CommandExecutor, centre: Centre,
                                                    state_dir: Path) -> None:
    write_faults(state_dir, FaultPlan(model_faults=[ModelFault(cause="node_fault")]))
    for model in ("digits-mlp", "digits-knn"):
        out = inference_of(answer(serving, centre, run_inference(model)))
        assert out.cause == "node_fault"


async def test_a_slow_model_answers_later_or_times_out(
        centre: Centre, journal: Journal, state_dir: Path, server: ModelServer) -> None:
    from agent.faults import read_faults

    published: list[CommandResult] = []

    async def publish(result: CommandResult) -> None:
        published.append(result)

    executor = CommandExecutor(NODE, CLUSTER, centre.verifier, journal,
                               fault_plan=lambda: read_faults(state_dir), models=server,
                               publish=publish)
    write_faults(state_dir, FaultPlan(model_faults=[ModelFault(model="digits-knn",
                                                               failure_rate=0.0,
                                                               latency_ms=50.0)]))
    for timeout_s, cause in ((5.0, None), (0.01, "timeout")):
        command_id = uuid4()
        command = centre.command(run_inference("digits-knn", timeout_s=timeout_s), seq=0,
                                 command_id=command_id)
        assert executor.handle(command, NOW) is None  # a long action: answered later
        result = await executor.running()[command_id]
        out = inference_of(result)
        assert out.cause == cause
        assert published[-1] == result
    assert journal.last_seq is None


def test_the_report_lists_the_served_models_from_loading_to_ready(journal: Journal) -> None:
    from agent.device import SimulatedProbe
    from agent.host import HostSampler
    from agent.jobs.simulated import SimulatedJobs
    from agent.report import Reporter

    models = ModelServer(("digits-knn@1", "digits-logreg@1"))
    source = Reporter(node_id=NODE, cluster_id=CLUSTER, pool="default", interval_s=2.0,
                      probe=SimulatedProbe(1, seed=1), host=HostSampler(), journal=journal,
                      jobs=SimulatedJobs(NODE, 1, NOW), models=models.served)
    before = source.build(NOW, FaultPlan())
    assert [(m.model, m.state) for m in before.models] == [("digits-knn", "loading"),
                                                           ("digits-logreg", "loading")]
    models.load()
    after = source.build(NOW, FaultPlan())
    assert {m.state for m in after.models} == {"ready"}
    assert all(m.accuracy is not None for m in after.models)
