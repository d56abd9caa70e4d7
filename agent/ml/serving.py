"""The ML models an agent serves for routed tasks: small digits classifiers, trained at start.

Three families (softmax logistic regression, a one-hidden-layer MLP, k nearest neighbours),
some in two versions, all trained on the digits that ship with scikit-learn and checked on the
same held-out fifth the jobs use. A task of type `digits` is the 64 pixel counts (0..16) of
one 8x8 image; the answer is the digit and the model's confidence in it.

Everything a router needs to attribute a failure is decided here: a malformed input is
`bad_input`, a model over its concurrency limit `capacity`, a model that is not ready
`unavailable`, an invalid output (NaN, probabilities that do not sum to one) or an exception
in model code `model_fault`. The fault plan's `model_faults` make a model flaky on this node
(its output turns to NaN, which the output check catches as a model fault), make the whole
node fail (`node_fault`), or slow answers down.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol
from uuid import UUID

import numpy as np
from numpy.typing import NDArray

from agent.faults import ModelFault
from agent.ml.data import PIXEL_MAX, Features, Labels, digits, split
from agent.ml.infer import SoftmaxModel
from schemas.envelope import short_text
from schemas.events.v1 import InferenceCause, ModelState, ServedModel

log = logging.getLogger("clusterwarden.agent.ml.serving")

Array = NDArray[np.float64]
DIGITS = "digits"
DIGITS_FEATURES = 64
CLASSES = 10
VERSION_SEP = "@"
# The output check: probabilities must be finite and sum to one within this.
SUM_TOLERANCE = 1e-6


class Classifier(Protocol):
    """What serving needs of a fitted model."""

    def probabilities(self, x: Features) -> Array: ...


@dataclass
class Mlp:
    """64-hidden-10 with ReLU and softmax, fitted by full-batch Adam (deterministic)."""

    w1: Array
    b1: Array
    w2: Array
    b2: Array

    @classmethod
    def fit(cls, x: Features, y: Labels, *, hidden: int, iterations: int,
            learning_rate: float = 0.01, l2: float = 1e-4, seed: int = 0) -> Mlp:
        rng = np.random.default_rng(seed)
        model = cls(rng.normal(0.0, math.sqrt(2.0 / x.shape[1]), (x.shape[1], hidden)),
                    np.zeros(hidden),
                    rng.normal(0.0, math.sqrt(2.0 / hidden), (hidden, CLASSES)),
                    np.zeros(CLASSES))
        params = [model.w1, model.b1, model.w2, model.b2]
        first = [np.zeros_like(p) for p in params]
        second = [np.zeros_like(p) for p in params]
        onehot = np.eye(CLASSES)[y]
        beta1, beta2, eps = 0.9, 0.999, 1e-8
        for step in range(1, iterations + 1):
            hidden_out = np.maximum(x @ model.w1 + model.b1, 0.0)
            grad_logits = (_softmax(hidden_out @ model.w2 + model.b2) - onehot) / len(y)
            grad_hidden = (grad_logits @ model.w2.T) * (hidden_out > 0.0)
            grads = [x.T @ grad_hidden + l2 * model.w1, grad_hidden.sum(axis=0),
                     hidden_out.T @ grad_logits + l2 * model.w2, grad_logits.sum(axis=0)]
            for param, grad, m, v in zip(params, grads, first, second, strict=True):
                m *= beta1
                m += (1.0 - beta1) * grad
                v *= beta2
                v += (1.0 - beta2) * grad * grad
                m_hat = m / (1.0 - beta1**step)
                v_hat = v / (1.0 - beta2**step)
                param -= learning_rate * m_hat / (np.sqrt(v_hat) + eps)
        return model

    def probabilities(self, x: Features) -> Array:
        return _softmax(np.maximum(x @ self.w1 + self.b1, 0.0) @ self.w2 + self.b2)


@dataclass
class Knn:
    """k nearest neighbours (Euclidean), the vote weighted equally; ties go to the nearest."""

    x: Features
    y: Labels
    k: int

    def probabilities(self, x: Features) -> Array:
        distances = ((x[:, None, :] - self.x[None, :, :]) ** 2).sum(axis=2)
        nearest = np.argsort(distances, axis=1, kind="stable")[:, : self.k]
        votes = np.zeros((len(x), CLASSES))
        for rank in range(self.k):
            # A small bonus for nearer neighbours breaks ties towards the nearest one.
            votes[np.arange(len(x)), self.y[nearest[:, rank]]] += 1.0 + 1e-3 * (self.k - rank)
        result: Array = votes / votes.sum(axis=1, keepdims=True)
        return result


def _softmax(logits: Array) -> Array:
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    result: Array = exp / exp.sum(axis=1, keepdims=True)
    return result


Fit = Callable[[Features, Labels], Classifier]


@dataclass(frozen=True)
class ModelSpec:
    """One servable model version: what it is and how to train it."""

    name: str
    version: str
    family: str
    task_type: str
    fit: Fit

    @property
    def key(self) -> str:
        """`<name>@<version>`, as AGENT_MODELS and the fault plan spell it."""
        return f"{self.name}{VERSION_SEP}{self.version}"


def _logreg(iterations: int) -> Fit:
    def fit(x: Features, y: Labels) -> Classifier:
        return SoftmaxModel.fit(x, y, iterations=iterations)
    return fit


def _mlp(hidden: int, iterations: int) -> Fit:
    def fit(x: Features, y: Labels) -> Classifier:
        return Mlp.fit(x, y, hidden=hidden, iterations=iterations)
    return fit


def _knn(k: int) -> Fit:
    def fit(x: Features, y: Labels) -> Classifier:
        return Knn(x, y, k)
    return fit


# Every model an agent can serve, in a fixed order (explicit, not discovered).
CATALOGUE: dict[str, ModelSpec] = {spec.key: spec for spec in (
    ModelSpec("digits-logreg", "1", "logreg", DIGITS, _logreg(100)),  # fewer steps: weaker
    ModelSpec("digits-logreg", "2", "logreg", DIGITS, _logreg(500)),
    ModelSpec("digits-mlp", "1", "mlp", DIGITS, _mlp(32, 200)),
    ModelSpec("digits-mlp", "2", "mlp", DIGITS, _mlp(64, 300)),
    ModelSpec("digits-knn", "1", "knn", DIGITS, _knn(3)),
)}
# What a fleet serves when told to serve "the usual": one version of each family.
STANDARD_MODELS = ("digits-logreg@1", "digits-mlp@1", "digits-knn@1")


def parse_models(text: str) -> tuple[str, ...]:
    """AGENT_MODELS ("name@version,...") checked against the catalogue, each once, in order."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = sorted(set(names) - set(CATALOGUE))
    if unknown:
        raise ValueError(f"unknown models {unknown}; the catalogue has {sorted(CATALOGUE)}")
    return tuple(dict.fromkeys(names))


def check_input(task_type: str, values: Sequence[float]) -> str | None:
    """Why `values` is not a valid input of `task_type`, or None."""
    if task_type != DIGITS:
        return f"no model here serves task type {task_type!r}"
    if len(values) != DIGITS_FEATURES:
        return f"a digits input is {DIGITS_FEATURES} pixel counts, not {len(values)}"
    if any(not 0.0 <= v <= PIXEL_MAX for v in values):
        return f"pixel counts are 0..{PIXEL_MAX:g}"
    return None


def check_output(probabilities: Array) -> str | None:
    """Why a model's output is invalid (NaN, not a distribution), or None."""
    if probabilities.shape != (1, CLASSES) or not np.all(np.isfinite(probabilities)):
        return "the model's output is not finite"
    if np.any(probabilities < 0.0) or abs(float(probabilities.sum()) - 1.0) > SUM_TOLERANCE:
        return "the model's output is not a probability distribution"
    return None


@dataclass(frozen=True)
class Answer:
    """How one inference went: a prediction, or the cause of its failure."""

    cause: InferenceCause | None
    latency_ms: float
    prediction: int | None = None
    confidence: float | None = None
    detail: str = ""
    family: str | None = None


@dataclass
class Loaded:
    """A model version on this node: its state, and once ready its fitted classifier."""

    spec: ModelSpec
    state: ModelState = "loading"
    model: Classifier | None = None
    accuracy: float | None = None
    inflight: int = 0
    detail: str = ""


def _draw(command_id: UUID, salt: str) -> float:
    """A number in [0, 1) fixed by the command: a redelivered command meets the same fate."""
    return random.Random(f"{command_id}:{salt}").random()


def fault_for(faults: Sequence[ModelFault], spec: ModelSpec) -> ModelFault | None:
    """The first fault of the plan that applies to `spec` (a model, or every model)."""
    for fault in faults:
        if fault.model is None or fault.model in (spec.name, spec.key):
            return fault
    return None


@dataclass
class ModelServer:
    """The models of one node: loaded in the background, served one input at a time."""

    names: tuple[str, ...]
    max_concurrency: int = 4
    clock: Callable[[], float] = time.perf_counter
    _models: dict[str, Loaded] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        for name in self.names:
            self._models[name] = Loaded(CATALOGUE[name])

    def load(self) -> None:
        """Train every model (blocking: run it in a thread); failures leave the model failed."""
        if not self._models:
            return
        x_train, y_train, x_test, y_test = split(*digits())
        for name, loaded in self._models.items():
            started = time.monotonic()
            try:
                model = loaded.spec.fit(x_train, y_train)
                accuracy = float(np.mean(model.probabilities(x_test).argmax(axis=1) == y_test))
            except Exception as err:
                log.exception("loading model %s failed", name)
                with self._lock:
                    loaded.state, loaded.detail = "failed", short_text(repr(err))
                continue
            with self._lock:
                loaded.model, loaded.accuracy, loaded.state = model, accuracy, "ready"
            log.info("model %s ready in %.2f s (held-out accuracy %.3f)", name,
                     time.monotonic() - started, accuracy)

    def served(self) -> list[ServedModel]:
        """What the node serves, for its report."""
        with self._lock:
            return [ServedModel(task_type=m.spec.task_type, model=m.spec.name,
                                version=m.spec.version, family=m.spec.family, state=m.state,
                                max_concurrency=self.max_concurrency,
                                accuracy=None if m.accuracy is None else round(m.accuracy, 4))
                    for m in self._models.values()]

    def find(self, model: str, version: str) -> Loaded | None:
        return self._models.get(f"{model}{VERSION_SEP}{version}")

    def admit(self, task_type: str, model: str, version: str,
              values: Sequence[float]) -> tuple[Loaded | None, Answer | None]:
        """The model to run on, taken (in flight + 1), or the answer refusing the task."""
        loaded = self.find(model, version)
        if loaded is None or loaded.spec.task_type != task_type:
            return None, Answer("unavailable", 0.0,
                                detail=f"{model}@{version} is not served here for {task_type}")
        family = loaded.spec.family
        with self._lock:
            if loaded.state != "ready" or loaded.model is None:
                return None, Answer("unavailable", 0.0, family=family,
                                    detail=f"{loaded.spec.key} is {loaded.state}")
            why = check_input(task_type, values)
            if why is not None:
                return None, Answer("bad_input", 0.0, family=family, detail=why)
            if loaded.inflight >= self.max_concurrency:
                return None, Answer("capacity", 0.0, family=family,
                                    detail=f"{loaded.inflight} tasks already run on "
                                           f"{loaded.spec.key}")
            loaded.inflight += 1
        return loaded, None

    def release(self, loaded: Loaded) -> None:
        with self._lock:
            loaded.inflight = max(loaded.inflight - 1, 0)

    def run(self, loaded: Loaded, values: Sequence[float], fault: ModelFault | None,
            command_id: UUID) -> Answer:
        """One prediction on an admitted model (the caller releases it)."""
        spec = loaded.spec
        started = self.clock()

        def elapsed_ms() -> float:
            return round(max(self.clock() - started, 0.0) * 1000.0, 3)

        model = loaded.model
        if model is None:  # admitted models are ready; a guard for the type checker
            return Answer("unavailable", 0.0, family=spec.family, detail="not ready")
        hit = fault is not None and _draw(command_id, spec.key) < fault.failure_rate
        if hit and fault is not None and fault.cause == "node_fault":
            return Answer("node_fault", elapsed_ms(), family=spec.family,
                          detail="injected: device error on this node")
        try:
            x = np.asarray(values, dtype=np.float64).reshape(1, -1) / PIXEL_MAX
            probabilities = model.probabilities(x)
            if hit:
                # The flaky model: its output turns to NaN, as a diverged model's does.
                probabilities = np.full_like(probabilities, np.nan)
        except Exception as err:
            log.exception("model %s failed on an input", spec.key)
            return Answer("model_fault", elapsed_ms(), family=spec.family,
                          detail=short_text(f"exception in model code: {err!r}"))
        why = check_output(probabilities)
        if why is not None:
            return Answer("model_fault", elapsed_ms(), family=spec.family, detail=why)
        row = probabilities[0]
        prediction = int(row.argmax())
        return Answer(None, elapsed_ms(), prediction=prediction,
                      confidence=round(float(row[prediction]), 6), family=spec.family)
