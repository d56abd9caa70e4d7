"""A training job: a small MLP learns the digits by minibatch SGD, checkpointing as it goes.

`python -m agent.ml.train --job-id J --job-dir D [--resume]`. The full state (weights,
momentum, step, the epoch's shuffle and the RNG) is saved atomically to
D/checkpoint.npz every few seconds and on SIGTERM, so a resumed run continues the same step
count and the same loss trajectory as one that was never stopped.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
import zipfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from io import BytesIO
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from agent.ml.data import Features, Labels, digits, split
from agent.ml.runtime import (
    CHECKPOINT_FILE,
    EXIT_PARENT_GONE,
    ParentWatch,
    RateMeter,
    StatusFile,
    StopFlag,
    atomic_write,
    job_parser,
    lower_priority,
    utc_now,
)

log = logging.getLogger("clusterwarden.agent.ml.train")

Array = NDArray[np.float64]
PARAMS = ("w1", "b1", "w2", "b2")
CLASSES = 10


@dataclass(frozen=True)
class TrainConfig:
    """What shapes a run; kept in the checkpoint, so a resume uses the same."""

    hidden: int = 32
    batch_size: int = 32
    learning_rate: float = 0.05
    momentum: float = 0.9
    epochs: int = 500
    seed: int = 0


class Trainer:
    """A 64-hidden-10 MLP with ReLU and softmax, trained by SGD with momentum."""

    def __init__(self, x: Features, y: Labels, config: TrainConfig) -> None:
        self.x, self.y, self.config = x, y, config
        self.rng = np.random.default_rng(config.seed)
        inputs = x.shape[1]
        # He initialisation for the ReLU layer.
        self.params: dict[str, Array] = {
            "w1": self.rng.normal(0.0, math.sqrt(2.0 / inputs), (inputs, config.hidden)),
            "b1": np.zeros(config.hidden),
            "w2": self.rng.normal(0.0, math.sqrt(2.0 / config.hidden), (config.hidden, CLASSES)),
            "b2": np.zeros(CLASSES),
        }
        self.velocity = {name: np.zeros_like(value) for name, value in self.params.items()}
        self.step = 0
        self.samples = 0  # seen by this process (throughput), not saved
        self.order = np.arange(len(y))
        self.loss_ema = math.nan

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(len(self.y) / self.config.batch_size)

    @property
    def total_steps(self) -> int:
        return self.config.epochs * self.steps_per_epoch

    @property
    def epoch(self) -> int:
        return self.step // self.steps_per_epoch

    @property
    def done(self) -> bool:
        return self.step >= self.total_steps

    @property
    def progress_pct(self) -> float:
        return min(100.0, 100.0 * self.step / self.total_steps) if self.total_steps else 100.0

    def _forward(self, x: Features) -> tuple[Array, Array]:
        p = self.params
        hidden = np.maximum(x @ p["w1"] + p["b1"], 0.0)
        logits = hidden @ p["w2"] + p["b2"]
        logits -= logits.max(axis=1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(axis=1, keepdims=True)
        return hidden, probs

    def train_step(self) -> float:
        """One minibatch step; returns the batch's loss before the update."""
        batch = self.config.batch_size
        position = self.step % self.steps_per_epoch
        if position == 0:
            self.order = self.rng.permutation(len(self.y))  # a fresh shuffle every epoch
        index = self.order[position * batch : (position + 1) * batch]
        x, y = self.x[index], self.y[index]
        rows = np.arange(len(y))
        hidden, probs = self._forward(x)
        loss = float(-np.mean(np.log(probs[rows, y] + 1e-12)))

        grad_logits = probs
        grad_logits[rows, y] -= 1.0
        grad_logits /= len(y)
        grad_hidden = grad_logits @ self.params["w2"].T
        grad_hidden[hidden <= 0.0] = 0.0
        grads = {
            "w2": hidden.T @ grad_logits,
            "b2": grad_logits.sum(axis=0),
            "w1": x.T @ grad_hidden,
            "b1": grad_hidden.sum(axis=0),
        }
        for name in PARAMS:
            self.velocity[name] = (
                self.config.momentum * self.velocity[name]
                - self.config.learning_rate * grads[name]
            )
            self.params[name] = self.params[name] + self.velocity[name]
        self.step += 1
        self.samples += len(y)
        self.loss_ema = loss if math.isnan(self.loss_ema) else 0.95 * self.loss_ema + 0.05 * loss
        return loss

    def accuracy(self, x: Features, y: Labels) -> float:
        """The share of `x` classified correctly, 0..1."""
        _, probs = self._forward(x)
        return float(np.mean(probs.argmax(axis=1) == y))

    # ------------------------------------------------------------ checkpoints

    def state(self) -> dict[str, NDArray[Any]]:
        """Everything needed to continue exactly where this run is."""
        arrays: dict[str, NDArray[Any]] = {name: value for name, value in self.params.items()}
        arrays |= {f"velocity_{name}": value for name, value in self.velocity.items()}
        arrays |= {
            "step": np.array(self.step, dtype=np.int64),
            "order": self.order,
            "loss_ema": np.array(self.loss_ema),
            # Plain strings, so loading needs no pickle.
            "rng_state": np.array(json.dumps(self.rng.bit_generator.state)),
            "config": np.array(json.dumps(asdict(self.config))),
        }
        return arrays

    def save(self, path: Path) -> None:
        """Write the checkpoint atomically (temporary file, then rename)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        buffer = BytesIO()
        # Typed loosely: savez's keyword arguments are the arrays, next to its own options.
        arrays: dict[str, Any] = self.state()
        np.savez(buffer, **arrays)
        atomic_write(path, buffer.getvalue())

    @classmethod
    def load(cls, path: Path, x: Features, y: Labels) -> Trainer:
        """A trainer continuing from the checkpoint at `path`, with the config saved in it."""
        with np.load(path, allow_pickle=False) as saved:
            config = TrainConfig(**json.loads(str(saved["config"])))
            trainer = cls(x, y, config)
            for name in PARAMS:
                trainer.params[name] = np.array(saved[name], dtype=np.float64)
                trainer.velocity[name] = np.array(saved[f"velocity_{name}"], dtype=np.float64)
            trainer.step = int(saved["step"])
            trainer.order = np.array(saved["order"], dtype=np.int64)
            trainer.loss_ema = float(saved["loss_ema"])
            trainer.rng.bit_generator.state = json.loads(str(saved["rng_state"]))
        return trainer


def checkpoint_step(path: Path) -> int:
    """The step a checkpoint file was saved at (raises OSError or ValueError if unreadable)."""
    try:
        with np.load(path, allow_pickle=False) as saved:
            return int(saved["step"])
    except (KeyError, zipfile.BadZipFile) as err:
        raise ValueError(f"{path} is not a training checkpoint: {err}") from err


# ---------------------------------------------------------------- the job process


def run(argv: Sequence[str] | None = None) -> int:
    """Train until done, stopped (SIGTERM: checkpoint, exit 0) or orphaned."""
    parser = job_parser(__doc__ or "")
    parser.add_argument("--checkpoint-every", type=float, default=5.0, help="seconds")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the job's checkpoint if it has one")
    parser.add_argument("--epochs", type=int, default=TrainConfig.epochs)
    parser.add_argument("--batch-size", type=int, default=TrainConfig.batch_size)
    parser.add_argument("--hidden", type=int, default=TrainConfig.hidden)
    args = parser.parse_args(argv)
    stop = StopFlag().install()
    parent = ParentWatch()
    lower_priority(args.nice)

    job_dir: Path = args.job_dir
    job_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = job_dir / CHECKPOINT_FILE
    status = StatusFile(job_dir, args.job_id, "training")
    status.write("starting", step=0, progress_pct=0.0, throughput=0.0)

    x_train, y_train, x_test, y_test = split(*digits())
    resumed_from: int | None = None
    if args.resume and checkpoint.exists():
        trainer = Trainer.load(checkpoint, x_train, y_train)
        resumed_from = trainer.step
        log.info("resumed %s from step %d", args.job_id, trainer.step)
    else:
        config = TrainConfig(hidden=args.hidden, batch_size=args.batch_size,
                             epochs=args.epochs, seed=args.seed)
        trainer = Trainer(x_train, y_train, config)

    last_checkpoint_at: str | None = None
    meter = RateMeter()

    def report(state: str) -> None:
        status.write(
            state,
            step=trainer.step,
            total_steps=trainer.total_steps,
            epoch=trainer.epoch,
            progress_pct=round(trainer.progress_pct, 3),
            throughput=round(meter.rate(), 3),
            loss=None if math.isnan(trainer.loss_ema) else round(trainer.loss_ema, 6),
            test_accuracy=round(trainer.accuracy(x_test, y_test), 4),
            last_checkpoint_at=last_checkpoint_at,
            resumed_from_step=resumed_from,
        )

    def save() -> None:
        nonlocal last_checkpoint_at
        trainer.save(checkpoint)
        last_checkpoint_at = utc_now()

    report("running")
    clock = time.monotonic
    next_checkpoint = clock() + args.checkpoint_every
    next_status = clock() + args.status_every
    while not (stop.requested or parent.gone or trainer.done):
        seen = trainer.samples
        trainer.train_step()
        meter.add(trainer.samples - seen)
        now = clock()
        if now >= next_checkpoint:
            save()
            next_checkpoint = now + args.checkpoint_every
        if now >= next_status:
            report("running")
            next_status = now + args.status_every
        time.sleep(args.step_sleep)

    report("checkpointing")
    save()
    if trainer.done:
        report("completed")
        log.info("%s completed %d steps", args.job_id, trainer.step)
        return 0
    report("stopped")
    log.info("%s stopped at step %d (checkpoint saved)", args.job_id, trainer.step)
    return EXIT_PARENT_GONE if parent.gone and not stop.requested else 0


def main() -> None:
    """Entry point of `python -m agent.ml.train`."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    sys.exit(run())


if __name__ == "__main__":
    main()
