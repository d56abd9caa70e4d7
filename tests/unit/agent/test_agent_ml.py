"""The ML jobs: the data, a training run that resumes exactly, inference, and the processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.ml.data import digits, shipped_csv, split
from agent.ml.infer import SoftmaxModel
from agent.ml.runtime import CHECKPOINT_FILE, STATUS_FILE, RateMeter, atomic_write
from agent.ml.train import TrainConfig, Trainer
from tests.waiting import DEADLINE_S, wait_until

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def data() -> tuple[Any, Any, Any, Any]:
    return split(*digits())


def test_digits_come_from_the_package_and_match_load_digits() -> None:
    assert shipped_csv() is not None  # no download: the file ships in the wheel
    x, y = digits()
    assert x.shape == (1_797, 64)
    assert (x.min(), x.max()) == (0.0, 1.0)
    assert sorted(set(y.tolist())) == list(range(10))
    from sklearn.datasets import load_digits  # type: ignore[import-untyped]

    official_x, official_y = load_digits(return_X_y=True)
    assert np.array_equal(x * 16.0, official_x)
    assert np.array_equal(y, official_y)


def test_split_is_fixed_and_disjoint(data: tuple[Any, Any, Any, Any]) -> None:
    x_train, y_train, x_test, y_test = data
    assert (len(y_train), len(y_test)) == (1_438, 359)
    again = split(*digits())
    assert np.array_equal(again[0], x_train)
    assert np.array_equal(again[3], y_test)
    rows = {row.tobytes() for row in x_train}
    # Digits repeat in the data set, so "disjoint" is about positions: most test rows are new.
    assert sum(row.tobytes() not in rows for row in x_test) > 0.9 * len(x_test)


def test_training_learns(data: tuple[Any, Any, Any, Any]) -> None:
    x_train, y_train, x_test, y_test = data
    trainer = Trainer(x_train, y_train, TrainConfig(epochs=5))
    before = trainer.accuracy(x_test, y_test)
    losses = [trainer.train_step() for _ in range(trainer.total_steps)]
    assert trainer.done
    assert trainer.progress_pct == 100.0
    assert trainer.epoch == 5
    assert np.mean(losses[-20:]) < np.mean(losses[:20]) / 3
    assert before < 0.3 < 0.9 < trainer.accuracy(x_test, y_test)


def test_resume_continues_the_same_trajectory(
    data: tuple[Any, Any, Any, Any], tmp_path: Path
) -> None:
    x_train, y_train, _, _ = data
    config = TrainConfig(epochs=3, seed=7)
    straight = Trainer(x_train, y_train, config)
    expected = [straight.train_step() for _ in range(100)]

    first = Trainer(x_train, y_train, config)
    # 60 steps crosses an epoch boundary (45 steps each), so the reshuffle is covered too.
    losses = [first.train_step() for _ in range(60)]
    first.save(tmp_path / CHECKPOINT_FILE)
    resumed = Trainer.load(tmp_path / CHECKPOINT_FILE, x_train, y_train)
    assert (resumed.step, resumed.config) == (60, config)
    losses += [resumed.train_step() for _ in range(40)]

    assert losses == expected  # bit for bit: weights, momentum, shuffle and RNG all restored
    for name, value in straight.params.items():
        assert np.array_equal(value, resumed.params[name])
    assert resumed.loss_ema == straight.loss_ema


def test_checkpoint_is_written_atomically(tmp_path: Path, data: tuple[Any, Any, Any, Any]) -> None:
    trainer = Trainer(data[0], data[1], TrainConfig(epochs=1))
    trainer.save(tmp_path / CHECKPOINT_FILE)
    trainer.train_step()
    trainer.save(tmp_path / CHECKPOINT_FILE)
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKPOINT_FILE]  # no leftovers
    with np.load(tmp_path / CHECKPOINT_FILE, allow_pickle=False) as saved:
        assert int(saved["step"]) == 1


def test_inference_model_is_real(data: tuple[Any, Any, Any, Any]) -> None:
    x_train, y_train, x_test, y_test = data
    model = SoftmaxModel.fit(x_train, y_train)
    assert float(np.mean(model.predict(x_test) == y_test)) > 0.9
    probabilities = model.probabilities(x_test[:5])
    assert np.allclose(probabilities.sum(axis=1), 1.0)


def test_helpers(tmp_path: Path) -> None:
    atomic_write(tmp_path / "a.json", b"{}")
    atomic_write(tmp_path / "a.json", b'{"x": 1}')
    assert json.loads((tmp_path / "a.json").read_text()) == {"x": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]
    ticks = iter([0.0, 2.0, 3.0])
    meter = RateMeter(clock=lambda: next(ticks))
    meter.add(10)
    meter.add(30)
    assert meter.rate() == 20.0
    assert meter.rate() == 0.0


# ---------------------------------------------------------------- the processes


def run_job(module: str, job_dir: Path, *args: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(REPO), OPENBLAS_NUM_THREADS="1")
    return subprocess.Popen(
        [sys.executable, "-m", module, "--job-id", job_dir.name, "--job-dir", str(job_dir),
         "--status-every", "0.1", "--nice", "0", *args],
        env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )


def wait_status(job_dir: Path, check: Any, timeout_s: float = DEADLINE_S) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            status = json.loads((job_dir / STATUS_FILE).read_text())
        except FileNotFoundError:
            status = {}
        if status and check(status):
            return status
        time.sleep(0.05)
    raise AssertionError(f"status never matched: {status}")


def test_training_process_checkpoints_on_sigterm_and_resumes(tmp_path: Path) -> None:
    job_dir = tmp_path / "node-001.train"
    args = ("--step-sleep", "0.002", "--checkpoint-every", "0.3")
    process = run_job("agent.ml.train", job_dir, *args)
    try:
        running = wait_status(job_dir, lambda s: s["state"] == "running" and s["step"] >= 50)
        assert running["pid"] == process.pid
        assert running["kind"] == "training"
        assert running["throughput"] > 0.0
        assert 0.0 < running["progress_pct"] < 100.0
        wait_status(job_dir, lambda s: s["last_checkpoint_at"] is not None)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=DEADLINE_S) == 0
    finally:
        process.kill()
        process.wait()
        assert process.stderr is not None
        process.stderr.close()
    stopped = json.loads((job_dir / STATUS_FILE).read_text())
    assert stopped["state"] == "stopped"
    with np.load(job_dir / CHECKPOINT_FILE, allow_pickle=False) as saved:
        assert int(saved["step"]) == stopped["step"]  # the final checkpoint is the last step

    resumed = run_job("agent.ml.train", job_dir, *args, "--resume")
    try:
        status = wait_status(job_dir, lambda s: s["pid"] == resumed.pid and s["state"] == "running")
        assert status["resumed_from_step"] == stopped["step"]
        assert status["step"] >= stopped["step"]
    finally:
        resumed.send_signal(signal.SIGTERM)
        assert resumed.wait(timeout=DEADLINE_S) == 0
        assert resumed.stderr is not None
        resumed.stderr.close()


def test_training_process_completes(tmp_path: Path) -> None:
    job_dir = tmp_path / "short.train"
    process = run_job("agent.ml.train", job_dir, "--epochs", "1", "--step-sleep", "0")
    assert process.wait(timeout=2 * DEADLINE_S) == 0
    assert process.stderr is not None
    process.stderr.close()
    done = json.loads((job_dir / STATUS_FILE).read_text())
    assert (done["state"], done["progress_pct"], done["step"]) == ("completed", 100.0, 45)


def test_inference_process_serves_and_stops(tmp_path: Path) -> None:
    job_dir = tmp_path / "node-001.infer"
    process = run_job("agent.ml.infer", job_dir, "--step-sleep", "0.01")
    try:
        serving = wait_status(job_dir, lambda s: s["state"] == "running" and s["served"] > 100)
        assert serving["accuracy"] > 0.85
        assert serving["fit_s"] >= 0.0  # reported, in seconds (how many is the machine's)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=DEADLINE_S) == 0
    finally:
        process.kill()
        process.wait()
        assert process.stderr is not None
        process.stderr.close()
    assert json.loads((job_dir / STATUS_FILE).read_text())["state"] == "stopped"


def test_a_job_whose_agent_dies_stops_too(tmp_path: Path) -> None:
    job_dir = tmp_path / "orphan.train"
    # A stand-in agent that starts the job and is then killed, as `warden fleet kill` does.
    launcher = (
        "import subprocess, sys, time\n"
        "job = subprocess.Popen([sys.executable, '-m', 'agent.ml.train', '--job-id', 'o',"
        f" '--job-dir', {str(job_dir)!r}, '--status-every', '0.1', '--nice', '0'])\n"
        "print(job.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", launcher], env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=REPO,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )
    assert parent.stdout is not None
    job_pid = int(parent.stdout.readline())
    parent.stdout.close()
    try:
        wait_status(job_dir, lambda s: s["state"] == "running")
    finally:
        parent.kill()
        parent.wait()
    stopped = wait_status(job_dir, lambda s: s["state"] == "stopped")
    assert stopped["pid"] == job_pid

    def exited() -> bool:
        # Gone, or a zombie its new parent has not reaped yet (an empty command line).
        try:
            return not Path(f"/proc/{job_pid}/cmdline").read_bytes()
        except FileNotFoundError:
            return True

    wait_until(exited, f"the orphaned job (pid {job_pid}) exits", poll_s=0.05)
