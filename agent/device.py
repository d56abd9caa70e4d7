"""GPU probes: NVML where a driver exists, otherwise a simulated device driven by its jobs."""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Literal, Protocol, TypeVar

from schemas.envelope import short_text
from schemas.events.v1 import GpuMetrics, GpuSource, JobInfo

log = logging.getLogger("clusterwarden.agent.device")

T = TypeVar("T")

MIB = 1024 * 1024
MAX_XIDS_PER_GPU = 64  # the schema's bound on GpuMetrics.xid_events


class GpuProbe(Protocol):
    """Reads every GPU of the node once per report."""

    @property
    def source(self) -> GpuSource: ...

    @property
    def uuids(self) -> Sequence[str]:
        """Each GPU's UUID by index, as NVML reports it (what device plugins name GPUs by)."""
        ...

    def read(
        self, jobs: Sequence[JobInfo], now: datetime, load_pct: float | None = None
    ) -> list[GpuMetrics]: ...

    def close(self) -> None: ...


# ---------------------------------------------------------------- NVML


class XidBuffer:
    """XIDs seen by the event thread since the last read, per GPU index (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: dict[int, list[int]] = {}
        self.dropped = 0

    def add(self, index: int, xid: int) -> None:
        with self._lock:
            seen = self._events.setdefault(index, [])
            # An XID storm must not make the report invalid; the count of what was lost is kept.
            if len(seen) >= MAX_XIDS_PER_GPU:
                self.dropped += 1
                return
            seen.append(xid)

    def pending(self) -> bool:
        """True if XIDs arrived since the last read (the agent then reports at once)."""
        with self._lock:
            return bool(self._events)

    def drain(self) -> dict[int, list[int]]:
        with self._lock:
            events, self._events = self._events, {}
        return events


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class NvmlProbe:
    """GPU metrics from NVML, with XID events collected by a background thread."""

    def __init__(self, nvml: Any, *, event_timeout_ms: int = 500) -> None:
        self._nvml = nvml
        self._event_timeout_ms = event_timeout_ms
        self._xids = XidBuffer()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._event_set: Any = None
        nvml.nvmlInit()
        try:
            count = int(nvml.nvmlDeviceGetCount())
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self.names = [_text(nvml.nvmlDeviceGetName(h)) for h in self._handles]
            self.uuids = [_text(nvml.nvmlDeviceGetUUID(h)) for h in self._handles]
            self._start_events()
        except BaseException:
            nvml.nvmlShutdown()
            raise

    @property
    def source(self) -> Literal["nvml"]:
        return "nvml"

    @property
    def gpu_count(self) -> int:
        return len(self._handles)

    def has_urgent_events(self) -> bool:
        """XID events are waiting: a fault must not wait for the next report interval."""
        return self._xids.pending()

    def _start_events(self) -> None:
        nvml = self._nvml
        wanted = int(nvml.nvmlEventTypeXidCriticalError)
        try:
            event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError_NotSupported:
            log.warning("NVML events are not supported: XIDs will not be reported")
            return
        registered = 0
        for index, handle in enumerate(self._handles):
            try:
                mask = wanted & int(nvml.nvmlDeviceGetSupportedEventTypes(handle))
                if mask:
                    nvml.nvmlDeviceRegisterEvents(handle, mask, event_set)
                    registered += 1
            except nvml.NVMLError_NotSupported:
                log.warning("GPU %d cannot report XID events", index)
        if not registered:
            nvml.nvmlEventSetFree(event_set)
            return
        self._event_set = event_set
        self._thread = threading.Thread(target=self._watch, name="nvml-events", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        nvml = self._nvml
        while not self._stop.is_set():
            try:
                # Blocks for at most the timeout, so close() is never kept waiting long.
                data = nvml.nvmlEventSetWait_v2(self._event_set, self._event_timeout_ms)
            except nvml.NVMLError_Timeout:
                continue
            except nvml.NVMLError as err:
                log.warning("waiting for NVML events failed: %s", err)
                self._stop.wait(1.0)
                continue
            if not int(data.eventType) & int(nvml.nvmlEventTypeXidCriticalError):
                continue
            try:
                index = int(nvml.nvmlDeviceGetIndex(data.device))
            except nvml.NVMLError:
                index = 0  # the XID still counts; it is better misplaced than lost
            xid = int(data.eventData)
            log.warning("GPU %d raised XID %d", index, xid)
            self._xids.add(index, xid)

    def _optional(self, call: Callable[[], T]) -> T | None:
        try:
            return call()
        except self._nvml.NVMLError_NotSupported:
            return None

    def _ecc(self, handle: Any, error_type: int, counter: int) -> int | None:
        read = self._nvml.nvmlDeviceGetTotalEccErrors
        value = self._optional(lambda: read(handle, error_type, counter))
        return None if value is None else int(value)

    def _power_mw(self, handle: Any) -> int | None:
        read = self._nvml.nvmlDeviceGetPowerUsage
        value = self._optional(lambda: read(handle))
        return None if value is None else int(value)

    def _throttle_reasons(self, handle: Any) -> int:
        nvml = self._nvml
        # The call was renamed ("clocks event reasons"); older bindings only have the old name.
        read = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if read is None:
            read = nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        value = self._optional(lambda: read(handle))
        return 0 if value is None else int(value)

    def read(
        self, jobs: Sequence[JobInfo], now: datetime, load_pct: float | None = None
    ) -> list[GpuMetrics]:
        """Read every GPU now; `jobs` and `load_pct` are unused: NVML measures what really runs."""
        nvml = self._nvml
        xids = self._xids.drain()
        gpus: list[GpuMetrics] = []
        for index, handle in enumerate(self._handles):
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            power_mw = self._power_mw(handle)
            gpus.append(
                GpuMetrics(
                    index=index,
                    uuid=short_text(self.uuids[index]),
                    name=short_text(self.names[index]),
                    utilization_pct=float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                    memory_used_mib=int(memory.used) // MIB,
                    memory_total_mib=int(memory.total) // MIB,
                    temperature_c=float(
                        nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
                    ),
                    power_w=0.0 if power_mw is None else float(power_mw) / 1000.0,
                    ecc_corrected_volatile=self._ecc(
                        handle, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_VOLATILE_ECC
                    ),
                    ecc_uncorrected_volatile=self._ecc(
                        handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
                    ),
                    ecc_corrected_aggregate=self._ecc(
                        handle, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_AGGREGATE_ECC
                    ),
                    ecc_uncorrected_aggregate=self._ecc(
                        handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_AGGREGATE_ECC
                    ),
                    xid_events=xids.get(index, []),
                    throttle_reasons=self._throttle_reasons(handle),
                )
            )
        return gpus

    def close(self) -> None:
        """Stop the event thread and release NVML."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._event_timeout_ms / 1000.0 + 2.0)
        nvml = self._nvml
        try:
            if self._event_set is not None:
                nvml.nvmlEventSetFree(self._event_set)
                self._event_set = None
        finally:
            nvml.nvmlShutdown()


# ---------------------------------------------------------------- simulated

SIM_MEMORY_TOTAL_MIB = 81_920
SIM_IDLE_MEMORY_MIB = 512
SIM_IDLE_POWER_W = 60.0
SIM_MAX_POWER_W = 400.0
SIM_IDLE_TEMP_C = 32.0

# What one running job asks of a GPU it uses: (utilisation %, share of memory). A starting
# job has not loaded it yet.
JOB_LOAD: dict[str, tuple[float, float]] = {"training": (90.0, 0.70), "inference": (40.0, 0.25)}


def job_load(jobs: Sequence[JobInfo], index: int) -> tuple[float, float]:
    """(utilisation %, memory share) the jobs put on GPU `index`, before noise."""
    utilization, memory_share = 0.0, 0.0
    for job in jobs:
        if index not in job.gpu_indices or job.state in ("stopped", "failed", "starting"):
            continue
        util, share = JOB_LOAD[job.kind]
        # A job split over several GPUs loads each of them; a hung job holds its memory
        # but computes nothing.
        utilization += 0.0 if job.state == "hung" else util
        memory_share += share
    return min(utilization, 100.0), min(memory_share, 0.95)


def simulated_uuid(seed: int, index: int) -> str:
    """The UUID of simulated GPU `index` of the device seeded `seed`."""
    return f"GPU-SIMULATED-{seed:08x}-{index:04d}"


class SimulatedProbe:
    """A deterministic stand-in device whose load comes from the jobs the agent runs."""

    def __init__(self, gpus: int, seed: int = 0, noise: float = 2.0) -> None:
        self.gpus = gpus
        self.seed = seed
        self.noise = noise
        self._rng = random.Random(seed)

    @property
    def source(self) -> Literal["simulated"]:
        return "simulated"

    @property
    def uuids(self) -> list[str]:
        return [simulated_uuid(self.seed, index) for index in range(self.gpus)]

    def _jitter(self, value: float, low: float, high: float, scale: float = 1.0) -> float:
        return min(high, max(low, value + self._rng.gauss(0.0, self.noise * scale)))

    def read(
        self, jobs: Sequence[JobInfo], now: datetime, load_pct: float | None = None
    ) -> list[GpuMetrics]:
        """One reading per GPU; `load_pct` (a fault plan's) overrides the jobs' utilisation."""
        # The same seed, jobs and load give the same values.
        gpus: list[GpuMetrics] = []
        for index in range(self.gpus):
            target_util, memory_share = job_load(jobs, index)
            if load_pct is not None:
                target_util = load_pct
                # A GPU held busy holds memory too, whatever the jobs say.
                memory_share = max(memory_share, load_pct / 100.0 * JOB_LOAD["training"][1])
            util = self._jitter(target_util, 0.0, 100.0) if target_util else 0.0
            if load_pct is not None:
                # A held load stays within a few points, so "held at 85%" never reads as 79%.
                spread = 1.5 * self.noise
                util = min(100.0, max(0.0, min(load_pct + spread, max(load_pct - spread, util))))
            used = SIM_IDLE_MEMORY_MIB + memory_share * SIM_MEMORY_TOTAL_MIB
            memory_used = int(self._jitter(used, 0.0, SIM_MEMORY_TOTAL_MIB, scale=64.0))
            power = SIM_IDLE_POWER_W + util / 100.0 * (SIM_MAX_POWER_W - SIM_IDLE_POWER_W)
            temperature = SIM_IDLE_TEMP_C + util * 0.5
            gpus.append(
                GpuMetrics(
                    index=index,
                    uuid=simulated_uuid(self.seed, index),
                    name="SIMULATED GPU (80 GiB)",
                    utilization_pct=round(util, 2),
                    memory_used_mib=memory_used,
                    memory_total_mib=SIM_MEMORY_TOTAL_MIB,
                    temperature_c=round(self._jitter(temperature, 20.0, 95.0), 1),
                    power_w=round(self._jitter(power, 0.0, SIM_MAX_POWER_W, scale=2.0), 1),
                    ecc_corrected_volatile=0,
                    ecc_uncorrected_volatile=0,
                    ecc_corrected_aggregate=0,
                    ecc_uncorrected_aggregate=0,
                )
            )
        return gpus

    def close(self) -> None:
        """Nothing to release."""


# ---------------------------------------------------------------- choosing


def open_probe(gpus: int, module: Any | None = None, *, seed: int = 0) -> GpuProbe:
    """NVML if a driver answers; otherwise `gpus` simulated GPUs (said loudly in the log)."""
    nvml: Any = module
    if nvml is None:
        try:
            import pynvml

            nvml = pynvml
        except ImportError:
            log.warning("GPU source: SIMULATED (%d GPUs); nvidia-ml-py is not installed", gpus)
            return SimulatedProbe(gpus, seed=seed)
    try:
        probe = NvmlProbe(nvml)
    except (nvml.NVMLError_LibraryNotFound, nvml.NVMLError_DriverNotLoaded) as err:
        log.warning("GPU source: SIMULATED (%d GPUs); NVML is unavailable: %s", gpus, err)
        return SimulatedProbe(gpus, seed=seed)
    log.info("GPU source: NVML (%d GPUs: %s)", probe.gpu_count, ", ".join(probe.names) or "none")
    return probe
