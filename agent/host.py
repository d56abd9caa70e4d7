"""Host metrics through psutil: CPU, memory, disk and network rates."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import psutil

from schemas.events.v1 import HostMetrics

MIB = 1024 * 1024
MAX_MIB = 4_194_304  # the schema's bound on a MiB field
MAX_RATE = 1e12


@dataclass(frozen=True)
class NetCounters:
    """Cumulative network byte counters at one moment."""

    at: datetime
    rx_bytes: int
    tx_bytes: int


def net_rates(previous: NetCounters | None, current: NetCounters) -> tuple[float, float]:
    """(rx, tx) bytes per second between two counter readings; 0 when it cannot be known."""
    if previous is None:
        return 0.0, 0.0
    elapsed = (current.at - previous.at).total_seconds()
    if elapsed <= 0.0:
        return 0.0, 0.0
    # Counters go backwards when an interface is reset or wraps; a negative rate is noise.
    rx = max(0, current.rx_bytes - previous.rx_bytes) / elapsed
    tx = max(0, current.tx_bytes - previous.tx_bytes) / elapsed
    return min(rx, MAX_RATE), min(tx, MAX_RATE)


def _mib(value: int) -> int:
    return min(MAX_MIB, max(0, value // MIB))


class HostSampler:
    """Reads host metrics; keeps the last network counters to turn them into rates."""

    def __init__(self, disk_path: str = "/") -> None:
        self.disk_path = disk_path
        self._last_net: NetCounters | None = None
        # The first cpu_percent(None) call only starts the measurement window.
        psutil.cpu_percent(interval=None)

    def read(self, now: datetime) -> HostMetrics:
        """Host metrics now; network rates cover the time since the previous read."""
        memory = psutil.virtual_memory()
        net = psutil.net_io_counters()
        counters = NetCounters(now, int(net.bytes_recv), int(net.bytes_sent))
        rx, tx = net_rates(self._last_net, counters)
        self._last_net = counters
        total = _mib(int(memory.total))
        return HostMetrics(
            cpu_pct=min(100.0, max(0.0, float(psutil.cpu_percent(interval=None)))),
            memory_used_mib=min(total, _mib(int(memory.total - memory.available))),
            memory_total_mib=total,
            disk_used_pct=min(100.0, max(0.0, float(psutil.disk_usage(self.disk_path).percent))),
            net_rx_bytes_per_s=rx,
            net_tx_bytes_per_s=tx,
        )
