"""An inference job: fits a softmax regression on the digits, then serves held-out digits.

`python -m agent.ml.infer --job-id J --job-dir D`. The model is fitted at start (well under a
second) and then answers batches of held-out digits in a loop, reporting predictions per
second and accuracy in D/status.json. SIGTERM stops it cleanly (exit 0).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from agent.ml.data import Features, Labels, digits, split
from agent.ml.runtime import (
    EXIT_PARENT_GONE,
    ParentWatch,
    RateMeter,
    StatusFile,
    StopFlag,
    job_parser,
    lower_priority,
)

log = logging.getLogger("clusterwarden.agent.ml.infer")

CLASSES = 10


@dataclass
class SoftmaxModel:
    """Multinomial logistic regression: one weight matrix and a bias per class."""

    weights: NDArray[np.float64]
    bias: NDArray[np.float64]

    @classmethod
    def fit(
        cls,
        x: Features,
        y: Labels,
        *,
        iterations: int = 500,
        learning_rate: float = 2.0,
        l2: float = 1e-4,
    ) -> SoftmaxModel:
        """Full-batch gradient descent on the cross-entropy (deterministic: no sampling)."""
        model = cls(np.zeros((x.shape[1], CLASSES)), np.zeros(CLASSES))
        onehot = np.eye(CLASSES)[y]
        for _ in range(iterations):
            grad = (model.probabilities(x) - onehot) / len(y)
            model.weights -= learning_rate * (x.T @ grad + l2 * model.weights)
            model.bias -= learning_rate * grad.sum(axis=0)
        return model

    def probabilities(self, x: Features) -> NDArray[np.float64]:
        logits = x @ self.weights + self.bias
        logits -= logits.max(axis=1, keepdims=True)
        exp = np.exp(logits)
        result: NDArray[np.float64] = exp / exp.sum(axis=1, keepdims=True)
        return result

    def predict(self, x: Features) -> Labels:
        labels: Labels = self.probabilities(x).argmax(axis=1).astype(np.int64)
        return labels


def run(argv: Sequence[str] | None = None) -> int:
    """Fit the model, then serve until stopped (SIGTERM: exit 0) or orphaned."""
    parser = job_parser(__doc__ or "")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--fit-iterations", type=int, default=500)
    parser.set_defaults(step_sleep=0.1)
    args = parser.parse_args(argv)
    stop = StopFlag().install()
    parent = ParentWatch()
    lower_priority(args.nice)

    args.job_dir.mkdir(parents=True, exist_ok=True)
    status = StatusFile(args.job_dir, args.job_id, "inference")
    status.write("starting", step=0, progress_pct=0.0, throughput=0.0)

    x_train, y_train, x_test, y_test = split(*digits())
    fit_started = time.monotonic()
    model = SoftmaxModel.fit(x_train, y_train, iterations=args.fit_iterations)
    fit_s = time.monotonic() - fit_started
    log.info("%s: model fitted in %.2f s", args.job_id, fit_s)

    batches = served = correct = 0
    cursor = 0
    meter = RateMeter()

    def report(state: str) -> None:
        status.write(
            state,
            step=batches,
            served=served,
            progress_pct=0.0,  # a service has no end to make progress towards
            throughput=round(meter.rate(), 3),
            accuracy=round(correct / served, 4) if served else None,
            fit_s=round(fit_s, 3),
        )

    report("running")
    clock = time.monotonic
    next_status = clock() + args.status_every
    while not (stop.requested or parent.gone):
        index = np.arange(cursor, cursor + args.batch_size) % len(y_test)
        cursor = int(index[-1]) + 1
        predicted = model.predict(x_test[index])
        batches += 1
        served += len(index)
        correct += int(np.sum(predicted == y_test[index]))
        meter.add(len(index))
        now = clock()
        if now >= next_status:
            report("running")
            next_status = now + args.status_every
        time.sleep(args.step_sleep)

    report("stopped")
    log.info("%s stopped after %d predictions", args.job_id, served)
    return EXIT_PARENT_GONE if parent.gone and not stop.requested else 0


def main() -> None:
    """Entry point of `python -m agent.ml.infer`."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    sys.exit(run())


if __name__ == "__main__":
    main()
