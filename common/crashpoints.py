"""Test-only fault injection: die as a kill -9 would, at a named point of a service.

`WARDEN_CRASH_AT` names the armed points, comma-separated (e.g.
`analyzer.after_open_need`); unset, as in every deployment, each point costs a set lookup.
The chaos tests (docs/reliability.md) arm one point in one process, watch it die with exit
code 137, restart it unarmed and check that nothing was lost and nothing done twice.
"""

from __future__ import annotations

import functools
import logging
import os

log = logging.getLogger("clusterwarden.crashpoints")

ENV = "WARDEN_CRASH_AT"
EXIT_CODE = 137  # what a shell reports for a process killed by SIGKILL


@functools.cache
def armed() -> frozenset[str]:
    """The points armed for this process (read once: the environment it was started with)."""
    return frozenset(p.strip() for p in os.environ.get(ENV, "").split(",") if p.strip())


def crash_point(name: str) -> None:
    """Exit at once, without cleanup or flushing anything but this line, if `name` is armed."""
    if name in armed():
        log.critical("crash point %s: exiting now", name)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(EXIT_CODE)
