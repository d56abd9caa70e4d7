"""GPU probes: the simulated device, and the NVML path driven by a fake pynvml module."""

from __future__ import annotations

import logging
import queue
import threading
import time
from datetime import datetime
from types import SimpleNamespace
from typing import Any

import pytest

from agent.device import NvmlProbe, SimulatedProbe, XidBuffer, open_probe
from agent.faults import gpu_faults
from schemas.events.v1 import GpuMetrics, JobInfo
from tests.waiting import DEADLINE_S

# ---------------------------------------------------------------- simulated


def training(*gpus: int, state: str = "running") -> JobInfo:
    return JobInfo.model_validate(
        {"job_id": "t1", "kind": "training", "state": state, "gpu_indices": list(gpus)}
    )


def inference(*gpus: int) -> JobInfo:
    return JobInfo(job_id="i1", kind="inference", state="running", gpu_indices=list(gpus))


def test_simulated_identity(now: datetime) -> None:
    probe = SimulatedProbe(3, seed=7)
    gpus = probe.read([], now)
    assert probe.source == "simulated"
    assert [g.index for g in gpus] == [0, 1, 2]
    assert all("SIMULATED" in g.uuid and "SIMULATED" in g.name for g in gpus)
    assert len({g.uuid for g in gpus}) == 3
    assert SimulatedProbe(0).read([training(0)], now) == []


def test_simulated_load_follows_jobs(now: datetime) -> None:
    probe = SimulatedProbe(2, seed=1)
    idle = probe.read([], now)
    busy = probe.read([training(0), inference(1)], now)
    hung = probe.read([training(0, state="hung")], now)
    assert all(g.utilization_pct == 0.0 for g in idle)
    assert 80.0 <= busy[0].utilization_pct <= 100.0
    assert 30.0 <= busy[1].utilization_pct <= 50.0
    assert busy[0].memory_used_mib > busy[1].memory_used_mib > idle[1].memory_used_mib
    assert busy[0].power_w > idle[0].power_w
    assert busy[0].temperature_c > idle[0].temperature_c
    # A hung job holds its memory but computes nothing.
    assert hung[0].utilization_pct == 0.0
    assert hung[0].memory_used_mib > idle[0].memory_used_mib


def test_simulated_values_stay_bounded(now: datetime) -> None:
    probe = SimulatedProbe(4, seed=3, noise=25.0)
    jobs = [training(0, 1), inference(1), training(2), inference(2), inference(2)]
    for _ in range(300):
        for gpu in probe.read(jobs, now):
            # Constructing GpuMetrics validates the schema bounds; these are tighter.
            assert 0.0 <= gpu.utilization_pct <= 100.0
            assert 0 <= gpu.memory_used_mib <= gpu.memory_total_mib
            assert 20.0 <= gpu.temperature_c <= 95.0
            assert 0.0 <= gpu.power_w <= 400.0


def test_simulated_is_deterministic_for_a_seed(now: datetime) -> None:
    jobs = [training(0), inference(1)]
    first, second, other = SimulatedProbe(2, seed=5), SimulatedProbe(2, seed=5), SimulatedProbe(2)
    readings = [first.read(jobs, now) for _ in range(5)]
    assert readings == [second.read(jobs, now) for _ in range(5)]
    assert readings != [other.read(jobs, now) for _ in range(5)]


def test_xid_buffer_is_bounded_and_drains() -> None:
    buffer = XidBuffer()
    for _ in range(70):
        buffer.add(0, 13)
    buffer.add(1, 79)
    drained = buffer.drain()
    assert len(drained[0]) == 64
    assert drained[1] == [79]
    assert buffer.dropped == 6
    assert buffer.drain() == {}


# ---------------------------------------------------------------- a fake pynvml


class FakeNVMLError(Exception):
    pass


class FakeLibraryNotFound(FakeNVMLError):
    pass


class FakeDriverNotLoaded(FakeNVMLError):
    pass


class FakeNotSupported(FakeNVMLError):
    pass


class FakeTimeout(FakeNVMLError):
    pass


class FakeNvml:
    """Just enough of pynvml: two GPUs, ECC on GPU 0 only, XIDs emitted on demand."""

    NVMLError = FakeNVMLError
    NVMLError_LibraryNotFound = FakeLibraryNotFound
    NVMLError_DriverNotLoaded = FakeDriverNotLoaded
    NVMLError_NotSupported = FakeNotSupported
    NVMLError_Timeout = FakeTimeout
    NVML_TEMPERATURE_GPU = 0
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_AGGREGATE_ECC = 1
    nvmlEventTypeSingleBitEccError = 1
    nvmlEventTypeDoubleBitEccError = 2
    nvmlEventTypeXidCriticalError = 8

    # (error type, counter type) -> count on GPU 0
    ECC = {(0, 0): 5, (1, 0): 2, (0, 1): 50, (1, 1): 3}

    def __init__(self, init_error: type[Exception] | None = None) -> None:
        self.init_error = init_error
        self.events: queue.Queue[SimpleNamespace] = queue.Queue()
        self.registered: list[tuple[int, int]] = []
        self.freed = False
        self.shut_down = False
        self.waiting = threading.Event()

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error()

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"handle-{index}"

    def nvmlDeviceGetIndex(self, handle: str) -> int:
        return int(handle.rsplit("-", 1)[1])

    def nvmlDeviceGetName(self, handle: str) -> bytes:
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, handle: str) -> str:
        return f"GPU-fake-{self.nvmlDeviceGetIndex(handle)}"

    def nvmlDeviceGetUtilizationRates(self, handle: str) -> SimpleNamespace:
        return SimpleNamespace(gpu=97 if handle == "handle-0" else 3, memory=40)

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> SimpleNamespace:
        total = 80 * 1024**3
        return SimpleNamespace(total=total, used=20 * 1024**3, free=total - 20 * 1024**3)

    def nvmlDeviceGetTemperature(self, handle: str, sensor: int) -> int:
        assert sensor == self.NVML_TEMPERATURE_GPU
        return 71

    def nvmlDeviceGetPowerUsage(self, handle: str) -> int:
        if handle == "handle-1":
            raise FakeNotSupported()
        return 350_500  # mW

    def nvmlDeviceGetTotalEccErrors(self, handle: str, error_type: int, counter: int) -> int:
        if handle == "handle-1":
            raise FakeNotSupported()  # a consumer GPU without ECC
        return self.ECC[(error_type, counter)]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: str) -> int:
        return 0x40 if handle == "handle-0" else 0

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceGetSupportedEventTypes(self, handle: str) -> int:
        return 0xFF

    def nvmlDeviceRegisterEvents(self, handle: str, mask: int, event_set: str) -> None:
        self.registered.append((self.nvmlDeviceGetIndex(handle), mask))

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> SimpleNamespace:
        self.waiting.set()
        try:
            return self.events.get(timeout=timeout_ms / 1000.0)
        except queue.Empty:
            raise FakeTimeout() from None

    def nvmlEventSetFree(self, event_set: str) -> None:
        self.freed = True

    def emit(self, index: int, event_type: int, data: int) -> None:
        self.events.put(
            SimpleNamespace(eventType=event_type, eventData=data, device=f"handle-{index}")
        )


def read_until(
    probe: Any, now: datetime, wanted: int, timeout_s: float = DEADLINE_S
) -> list[GpuMetrics]:
    """Read until some GPU shows an XID (the event thread delivers asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        gpus: list[GpuMetrics] = probe.read([], now)
        if any(wanted in g.xid_events for g in gpus):
            return gpus
        time.sleep(0.01)
    raise AssertionError(f"XID {wanted} never showed up")


def test_nvml_path_reports_xid_and_ecc(now: datetime) -> None:
    fake = FakeNvml()
    probe = open_probe(2, module=fake)
    try:
        assert isinstance(probe, NvmlProbe)
        assert probe.source == "nvml"
        assert fake.registered == [(0, 8), (1, 8)]  # XID events only, masked by support
        assert fake.waiting.wait(DEADLINE_S), "the event thread never waited for events"
        fake.emit(0, FakeNvml.nvmlEventTypeSingleBitEccError, 0)  # not an XID: ignored
        fake.emit(0, FakeNvml.nvmlEventTypeXidCriticalError, 79)

        gpu0, gpu1 = read_until(probe, now, 79)
        assert gpu0.xid_events == [79]
        assert gpu0.name == "NVIDIA H100 80GB HBM3"
        assert gpu0.uuid == "GPU-fake-0"
        assert gpu0.utilization_pct == 97.0
        assert (gpu0.memory_used_mib, gpu0.memory_total_mib) == (20 * 1024, 80 * 1024)
        assert gpu0.temperature_c == 71.0
        assert gpu0.power_w == pytest.approx(350.5)
        assert gpu0.ecc_corrected_volatile == 5
        assert gpu0.ecc_uncorrected_volatile == 2
        assert gpu0.ecc_corrected_aggregate == 50
        assert gpu0.ecc_uncorrected_aggregate == 3
        assert gpu0.throttle_reasons == 0x40
        # Not supported is None, not zero: "no ECC" differs from "no ECC errors".
        assert gpu1.ecc_uncorrected_volatile is None
        assert gpu1.ecc_corrected_aggregate is None
        assert gpu1.power_w == 0.0
        assert gpu1.xid_events == []

        faults = gpu_faults([gpu0, gpu1])
        assert [(f.kind, f.code, f.gpu_index) for f in faults] == [
            ("xid", 79, 0),
            ("ecc", None, 0),
        ]
        # Drained: the same XID is not reported twice.
        assert probe.read([], now)[0].xid_events == []
    finally:
        probe.close()
    assert fake.freed
    assert fake.shut_down


@pytest.mark.parametrize("error", [FakeLibraryNotFound, FakeDriverNotLoaded])
def test_falls_back_to_simulated(
    error: type[Exception], now: datetime, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="clusterwarden.agent.device"):
        probe = open_probe(3, module=FakeNvml(init_error=error), seed=11)
    assert isinstance(probe, SimulatedProbe)
    assert probe.source == "simulated"
    assert len(probe.read([], now)) == 3
    assert "SIMULATED" in caplog.text


def test_other_nvml_errors_are_not_hidden() -> None:
    # Only "no driver" means "simulate"; any other failure is a real problem.
    with pytest.raises(FakeNVMLError):
        open_probe(2, module=FakeNvml(init_error=FakeNVMLError))


def test_a_starting_job_does_not_load_its_gpu_yet(now: datetime) -> None:
    probe = SimulatedProbe(1, seed=1)
    assert probe.read([training(0, state="starting")], now)[0].utilization_pct == 0.0
    assert probe.read([training(0, state="checkpointing")], now)[0].utilization_pct > 80.0
