"""The namespaces of derived ids: one table, one namespace per kind of derived id.

A derived id is `uuid5(namespace, key)`: the same input always gives the same id, so a
redelivered or replayed message yields the same events, and every consumer deduplicates on
it (the task store's transitions and ML events are unique by event id, agents answer a
command id they have seen with their cached answer). A key names what it is derived from;
the namespace keeps keys of different kinds apart.

A value here must never change: ids already stored or in flight would stop matching the ones
derived again from the same input after an upgrade, and a redelivered event would be
recorded, or a command executed, a second time. tests/unit/test_ids.py pins every value.
"""

from typing import Final
from uuid import NAMESPACE_URL, UUID, uuid5


def _namespace(name: str) -> UUID:
    return uuid5(NAMESPACE_URL, f"clusterwarden/{name}")


COLLECTOR: Final = _namespace("collector")
"""The collector's events, keyed `<kind>:<parts>`: a report's sample (`sample:<report id>`) and
node-state change (`state:<report id>`), a batch of samples (`batch:<sample ids>`), and the
state change of a silent node (`silent:<cluster>:<node>:<last report at>:<state>`)."""

POOL_HEALTH: Final = _namespace("analyzer")
"""A pool's health at one analysis period: `health:<cluster>:<pool>:<epoch seconds, ms>`."""

NEEDS_OFFLINE: Final = _namespace("needs/offline")
"""An offline need from a fault or a down node: `<cluster>:<node>:<source event id>`."""

NEEDS_ONLINE: Final = _namespace("needs/online")
"""An online need, keyed by its episode, `<cluster>/<pool>/<target>/<kind>/<since>`
(`services.analyzer.needs.hysteresis.episode_id`)."""

NEEDS_SCALE: Final = _namespace("needs/scale")
"""A scale-out or scale-in need, keyed by its episode (as NEEDS_ONLINE)."""

NEEDS_LOAD_BALANCE: Final = _namespace("needs/load_balance")
"""A load-balance need, keyed by its episode (as NEEDS_ONLINE)."""

NEEDS_RESTART_AGENT: Final = _namespace("needs/restart_agent")
"""A restart-agent need for a silent node its peers reach: `<cluster>:<node>:<source event id>`
(the agent-dead node-state event)."""

TEMPLATER_TASKS: Final = _namespace("templater")
"""A task made from a need, `task:<need id>:<template>:<version>`, and the task event that
carries it, `event:<task id>`."""

TASK_EVENTS: Final = _namespace("task-events")
"""The transitions of an ops task that the templater and the scheduler publish: the
templater's `<task id>:created`, the scheduler's `<task id>:<state>:<discriminator>` and its
hand-over to the executor, `<task id>:scheduled:<epoch>`.

The two services were given the same string; their keys never coincide (the templater's has
one colon, the scheduler's two or more), so they share one entry. It stays one value because
it cannot be split without changing ids already stored: a need or task redelivered after an
upgrade would make a second `created` or `queued` transition in the task store."""

EXECUTOR: Final = _namespace("executor")
"""The executor's commands and events: a step attempt's command,
`<task id>:<step>:<attempt>[:r<run>]` (agents dedupe on it); the status query and cancel of a
command, `query:<command id>:<n>` and `cancel:<command id>`; a control forwarded to a child,
`<control id>:<child id>`; the event of an operator's control (applied, refused, or not
applicable yet), `control:<control id>`; and the transitions it publishes,
`<task id>:<state>:<step>:<step state>:<command id>...`, and a child's `<child id>:created`."""

CENTRE_CHILDREN: Final = _namespace("executor/centre")
"""The child tasks a centre step plans:
`<parent id>:<step>:<command id>:<kind>:<job or node>`, and each child task's own event id,
`<child id>:created`."""

BREAKER_ALERTS: Final = _namespace("breaker-alerts")
"""A circuit breaker's open alert, once per opening: `<dedup key>:<openings>`."""

BREAKER_RESETS: Final = _namespace("breaker-resets")
"""The alert of an operator's breaker reset (it resolves the open alert), keyed by the audit
entry's hash."""

SHORT_CIRCUIT_ENDS: Final = _namespace("short-circuit-ends")
"""The alert that resolves a pool's short-circuit: `<dedup key>:<pool health event id>`."""

ML_ROUTING: Final = _namespace("ml-routing")
"""The router's run_inference command of an ML attempt, `<task id>:<attempt>:command`, and the
attempt's outcome event, `<task id>:<attempt>:outcome:<final 0 or 1>`."""

__all__ = [
    "BREAKER_ALERTS",
    "BREAKER_RESETS",
    "CENTRE_CHILDREN",
    "COLLECTOR",
    "EXECUTOR",
    "ML_ROUTING",
    "NEEDS_LOAD_BALANCE",
    "NEEDS_OFFLINE",
    "NEEDS_ONLINE",
    "NEEDS_RESTART_AGENT",
    "NEEDS_SCALE",
    "POOL_HEALTH",
    "SHORT_CIRCUIT_ENDS",
    "TASK_EVENTS",
    "TEMPLATER_TASKS",
]
