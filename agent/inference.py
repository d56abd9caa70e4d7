"""The run_inference action: one ML task on one of the node's models.

Deciding checks what can be checked without side effects (the node takes work, the model is
here and ready, the input is valid): a refusal is answered at once with its cause. Running
takes one of the model's concurrency slots, predicts and checks the output; with a slow
model in the fault plan it runs in the background (a long action) and answers when done, or
gives up with `timeout` after the action's `timeout_s`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from functools import partial
from uuid import UUID

from agent.effects import Effect
from agent.faults import FaultPlan
from agent.ml.serving import Answer, ModelServer, check_input, fault_for
from schemas.events.v1 import InferenceOutput, NodeMode, RunInference


def _output(action: RunInference, answer: Answer) -> InferenceOutput:
    return InferenceOutput(
        task_id=action.task_id, attempt=action.attempt, task_type=action.task_type,
        model=action.model, version=action.version, family=answer.family,
        cause=answer.cause, latency_ms=min(answer.latency_ms, 3_600_000.0),
        prediction=answer.prediction, confidence=answer.confidence,
        detail=answer.detail[:256])


def answer_effect(action: RunInference, answer: Answer) -> Effect:
    """The command's effect for an answer: succeeded with a prediction, or failed with a cause.

    The cause is also the result's reason, so `warden events` and the journal show it.
    """
    if answer.cause is None:
        return Effect("succeeded", inference=_output(action, answer))
    return Effect("failed", answer.cause, inference=_output(action, answer))


class InferenceActions:
    """Decides and runs run_inference on one node's model server."""

    def __init__(self, models: ModelServer | None,
                 fault_plan: Callable[[], FaultPlan] = FaultPlan) -> None:
        self.models = models
        self.fault_plan = fault_plan

    def decide(self, action: RunInference, mode: NodeMode, command_id: UUID) -> Effect:
        """The refusal now, or the effect that runs the task (nothing is changed yet)."""
        if mode != "active":
            return answer_effect(action, Answer("unavailable", 0.0,
                                                detail=f"the node is {mode}"))
        models = self.models
        loaded = models.find(action.model, action.version) if models is not None else None
        if models is None or loaded is None or loaded.spec.task_type != action.task_type:
            return answer_effect(action, Answer(
                "unavailable", 0.0,
                detail=f"{action.model}@{action.version} is not served here for "
                       f"{action.task_type}"))
        if loaded.state != "ready":
            return answer_effect(action, Answer("unavailable", 0.0, family=loaded.spec.family,
                                                detail=f"the model is {loaded.state}"))
        why = check_input(action.task_type, action.input)
        if why is not None:
            return answer_effect(action, Answer("bad_input", 0.0, family=loaded.spec.family,
                                                detail=why))
        fault = fault_for(self.fault_plan().model_faults, loaded.spec)
        plan = f"predict with {loaded.spec.key}"
        if fault is not None and fault.latency_ms > 0.0:
            return Effect("succeeded", run=partial(self._run_slow, action, models, command_id,
                                                   fault.latency_ms / 1000.0), plan=plan)
        return Effect("succeeded", apply=partial(self._run, action, models, command_id),
                      plan=plan)

    def _run(self, action: RunInference, models: ModelServer, command_id: UUID) -> Effect:
        loaded, refusal = models.admit(action.task_type, action.model, action.version,
                                       action.input)
        if loaded is None:
            return answer_effect(action, refusal or Answer("unavailable", 0.0))
        try:
            fault = fault_for(self.fault_plan().model_faults, loaded.spec)
            return answer_effect(action, models.run(loaded, action.input, fault, command_id))
        finally:
            models.release(loaded)

    async def _run_slow(self, action: RunInference, models: ModelServer, command_id: UUID,
                        delay_s: float) -> Effect:
        started = time.monotonic()
        loaded, refusal = models.admit(action.task_type, action.model, action.version,
                                       action.input)
        if loaded is None:
            return answer_effect(action, refusal or Answer("unavailable", 0.0))
        try:
            if delay_s >= action.timeout_s:
                await asyncio.sleep(action.timeout_s)
                return answer_effect(action, Answer(
                    "timeout", (time.monotonic() - started) * 1000.0,
                    family=loaded.spec.family,
                    detail=f"no answer within {action.timeout_s:g} s"))
            await asyncio.sleep(delay_s)
            fault = fault_for(self.fault_plan().model_faults, loaded.spec)
            answer = models.run(loaded, action.input, fault, command_id)
            return answer_effect(action, Answer(
                answer.cause, (time.monotonic() - started) * 1000.0, answer.prediction,
                answer.confidence, answer.detail, answer.family))
        finally:
            models.release(loaded)
