"""Redis connections with bounded timeouts, and namespaced keys."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, cast

from redis._parsers import _AsyncRESP3Parser
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.typing import ZSetRangeResponse

from common.errors import REDIS_REFUSAL_CODES, RedisRefused
from common.settings import DEFAULT_REDIS_CONNECT_TIMEOUT_S, DEFAULT_REDIS_READ_TIMEOUT_S


class _RefusalParser(_AsyncRESP3Parser):
    """Replies of a Redis that refuses for its own state raise `RedisRefused`, an
    infrastructure error (common/errors.py), instead of a plain reply error that would read
    as a bad message."""

    EXCEPTION_CLASSES = {**_AsyncRESP3Parser.EXCEPTION_CLASSES,
                         **dict.fromkeys(REDIS_REFUSAL_CODES, RedisRefused)}


def connect_redis(url: str, connect_timeout_s: float = DEFAULT_REDIS_CONNECT_TIMEOUT_S,
                  read_timeout_s: float = DEFAULT_REDIS_READ_TIMEOUT_S) -> Redis:
    """A client whose every call fails within its connect and read timeouts (at most 5 s in
    all: ServiceSettings holds them to REDIS_CALL_BOUND_S), so a dead or stalled Redis fails
    closed instead of hanging.

    Nothing is resent: the client would by default retry a call that timed out or lost its
    connection, and a write whose reply was lost may well have been applied (an INCR of a
    command sequence, a token taken from a bucket, a script that moved a task), so resending
    it could apply it twice, and each retry would stretch the bound. A failed call fails the
    handler, the message waits and is delivered again, and the handlers are idempotent.
    No periodic health check either: its PING before a command would add a second wait to
    the bound; a connection Redis dropped fails its next call, which waits the same way.
    """
    return Redis.from_url(
        url,
        socket_timeout=read_timeout_s,
        socket_connect_timeout=connect_timeout_s,
        retry=Retry(NoBackoff(), 0),
        retry_on_timeout=False,
        parser_class=_RefusalParser,
        decode_responses=False,
    )


def text(value: bytes | str) -> str:
    """A reply as text: redis-py types replies `bytes | str`, and `connect_redis` asks for bytes."""
    return value.decode() if isinstance(value, bytes) else value


def members(reply: ZSetRangeResponse) -> list[str]:
    """The members of a sorted-set range read without scores, as text.

    redis-py types every range reply as if it might carry scores; without `withscores` it is a
    flat list of members.
    """
    return [text(member) for member in cast(list[bytes | str], reply)]


class Keys:
    """Every Redis key of the control plane, in one place, prefixed by the namespace."""

    def __init__(self, namespace: str) -> None:
        self.prefix = f"cw:{namespace}:" if namespace else "cw:"

    def node(self, cluster: str, node: str) -> str:
        return f"{self.node_prefix()}{cluster}:{node}"

    def node_prefix(self) -> str:
        return f"{self.prefix}node:"

    def heartbeat_due(self, cluster: str) -> str:
        """ZSET node -> when its heartbeat is next checked (epoch seconds)."""
        return f"{self.prefix}heartbeat-due:{cluster}"

    def pool(self, cluster: str, pool: str) -> str:
        """HASH of a pool's aggregate: nodes per state (n_<state>), utilisation of up nodes."""
        return f"{self.prefix}pool:{cluster}:{pool}"

    def pools(self, cluster: str) -> str:
        return f"{self.prefix}pools:{cluster}"

    def registry(self, cluster: str) -> str:
        """SET of the node ids enrolled in a cluster; reports from others are quarantined."""
        return f"{self.prefix}registry:{cluster}"

    def keys_handed(self, cluster: str) -> str:
        """SET of the node ids whose report key enrolment handed out (services/api/routes/
        enrolment.py): a bootstrap token hands out each node's key once."""
        return f"{self.prefix}keys-handed:{cluster}"

    def cluster_backend(self, cluster: str) -> str:
        """STRING (JSON) of the backend a cluster's node steps go through (registry.py's
        ClusterBackend); none: the local agents."""
        return f"{self.prefix}cluster-backend:{cluster}"

    def breaker_holds(self, cluster: str) -> str:
        """SET of a cluster's node- and cluster-scoped breakers that are not closed (`offline@n1`,
        `offline@*`): the scheduler holds back what they stop, the router avoids their nodes."""
        return f"{self.prefix}breaker-holds:{cluster}"

    def history(self, cluster: str, node: str) -> str:
        """LIST of "<minute>:<mean utilisation>" for a node, newest first."""
        return f"{self.prefix}history:{cluster}:{node}"

    def pool_history(self, cluster: str, pool: str, resolution_s: int) -> str:
        """LIST of "<epoch s>:<mean effective utilisation>" of a pool at one resolution,
        newest first (the analyzer's PoolStore.record_utilization)."""
        return f"{self.pool_history_prefix(cluster, pool)}{resolution_s}"

    def capacity_plan(self, cluster: str, pool: str, hour: str) -> str:
        """STRING: the pool's capacity plan (PoolPlan JSON) made in one UTC hour (YYYYMMDDHH)."""
        return f"{self.prefix}capacity-plan:{cluster}:{pool}:{hour}"

    def demand(self, cluster: str, pool: str) -> str:
        """Queued GPU demand of a pool, as a share of its up GPUs (%), written by the
        analyzer every pool period from the sources (services/shared/demand.py)."""
        return f"{self.prefix}demand:{cluster}:{pool}"

    def demand_sources(self, cluster: str, pool: str) -> str:
        """HASH source -> JSON of its queued work in a pool (services/shared/demand.py)."""
        return f"{self.prefix}demand-src:{cluster}:{pool}"

    def tuning(self, cluster: str, pool: str) -> str:
        """HASH node type -> JSON of the tuner's decayed measure of a pool's nodes of that
        type: delivered job throughput per node, GPUs per node, samples (services/tuner/)."""
        return f"{self.prefix}tuning:{cluster}:{pool}"

    def tuning_pools(self) -> str:
        """SET of `<cluster>:<pool>` the tuner has measured (cluster ids hold no ':')."""
        return f"{self.prefix}tuning-pools"

    def condition(self, need: str, cluster: str, target: str) -> str:
        """A need's condition state for one target (JSON)."""
        return f"{self.prefix}cond:{need}:{cluster}:{target}"

    def probe_due(self, cluster: str) -> str:
        """ZSET node -> when the centre next probes it (epoch seconds)."""
        return f"{self.prefix}probe-due:{cluster}"

    def backend_clusters(self) -> str:
        """SET of the clusters whose `cluster_backend` is not local (kept with it), so the
        executor opens their backends before their first step needs one."""
        return f"{self.prefix}backend-clusters"

    def probes_pending(self) -> str:
        """ZSET probe command id -> its deadline; HASH beside it: command id -> cluster/node."""
        return f"{self.prefix}probes-pending"

    def clusters(self) -> str:
        return f"{self.prefix}clusters"

    def peer_addresses(self, cluster: str) -> str:
        """HASH node -> "host:port|sent_at": where each node answers peer probes, as its
        latest report advertised it (sent_at: that report's occurred_at)."""
        return f"{self.prefix}peer-addr:{cluster}"

    def peer_verdicts(self, cluster: str, target: str) -> str:
        """HASH prober -> "1|sent_at" (reached) or "0|sent_at": each prober's latest verdict
        on `target`; the whole hash expires when no prober reports on it any more."""
        return f"{self.prefix}peer-verdicts:{cluster}:{target}"

    def peer_assigned(self, cluster: str) -> str:
        """HASH node -> "fingerprint|sent_at|peer,peer": what each node was last told to
        probe (set_peers), and when."""
        return f"{self.prefix}peer-assigned:{cluster}"

    def agent_dead(self, cluster: str, node: str, last_report_at: str) -> str:
        """STRING: the node's silence since `last_report_at` was found an agent death (once)."""
        return f"{self.prefix}agent-dead:{cluster}:{node}:{last_report_at}"

    def open_need(self, cluster: str, kind: str, target: str) -> str:
        return f"{self.prefix}need:{cluster}:{kind}:{target}"

    def queue_ready(self) -> str:
        return f"{self.prefix}queue:ready"

    def queue_inflight(self) -> str:
        return f"{self.prefix}queue:inflight"

    def queue_items(self) -> str:
        """HASH task id -> the task's JSON, and `<task id>:trace` -> the trace context it was
        queued in (services/scheduler/queue.py), both kept until the task is acked."""
        return f"{self.prefix}queue:items"

    def queue_scores(self) -> str:
        return f"{self.prefix}queue:scores"

    def queue_known(self) -> str:
        """ZSET task id -> when it was first enqueued (ms, Redis's clock), so a redelivered
        task is not queued twice; entries older than a week are trimmed at each enqueue
        (services/scheduler/queue.py). Named apart from the SET it replaces, which a running
        deployment may still hold (delete `queue:known` once upgraded)."""
        return f"{self.prefix}queue:known-at"

    def lock(self, mutex_key: str) -> str:
        return f"{self.prefix}lock:{mutex_key}"

    def semaphore(self, template: str, cluster: str) -> str:
        """ZSET task id -> when its place lapses (ms): a template's concurrency per cluster."""
        return f"{self.prefix}semaphore:{cluster}:{template}"

    def open_tasks(self, cluster: str) -> str:
        """HASH task id -> its open-task entry (template, pool, target, state, relations):
        what the scheduler's relation gate checks a task against."""
        return f"{self.prefix}open-tasks:{cluster}"

    def open_tasks_version(self, cluster: str) -> str:
        """Bumped at every change of `open_tasks`, so an admission decided on a read of the
        index commits only if nothing changed since."""
        return f"{self.prefix}open-tasks-version:{cluster}"

    def relation_notice(self, task_id: str, blocker: str) -> str:
        """Set once a hold of a task by a relation blocker is in the task's transitions."""
        return f"{self.prefix}relation-notice:{task_id}:{blocker}"

    def task_outcome(self, task_id: str) -> str:
        """A finished task's final state, kept a while for the tasks that depend on it."""
        return f"{self.prefix}task-outcome:{task_id}"

    def epoch(self) -> str:
        return f"{self.prefix}epoch"

    def dispatch(self, task_id: str) -> str:
        """STRING `<epoch>:<task digest>`: the scheduler's record of a task's latest dispatch
        (services/shared/vouchers.py), which the executor checks before acting."""
        return f"{self.prefix}dispatch:{task_id}"

    def control_voucher(self, control_id: str) -> str:
        """STRING: the digest of an operator control the API audited and published
        (services/shared/vouchers.py), which the executor checks before applying it."""
        return f"{self.prefix}control-voucher:{control_id}"

    def workflow(self, task_id: str) -> str:
        return f"{self.prefix}wf:{task_id}"

    def command_index(self, command_id: str) -> str:
        return f"{self.prefix}cmd:{command_id}"

    def command_seq(self, cluster: str, node: str) -> str:
        """Counter: the last command sequence number sent to a node of a cluster."""
        return f"{self.prefix}cmdseq:{cluster}:{node}"

    def workflow_unannounced(self) -> str:
        """ZSET task id -> when its journal ended it (epoch ms), until its final event, lock
        release and parent count are done (services/executor/journal.py FinalNotice)."""
        return f"{self.prefix}wf:unannounced"

    def broker_outage(self) -> str:
        """When an executor last found the broker unreachable (epoch ms): a wait for an agent
        that spans it says nothing about the step (services/executor/broker_health.py)."""
        return f"{self.prefix}wf:broker-outage"

    def workflow_deadlines(self) -> str:
        """ZSET task id -> deadline of its running step."""
        return f"{self.prefix}wf:deadlines"

    def interval_request(self, cluster: str, node: str) -> str:
        """Set once the collector asked a node for a new report interval, for the request's
        window (so a request is not repeated every report)."""
        return f"{self.prefix}interval-request:{cluster}:{node}"

    def centre_result(self, command_id: str) -> str:
        """STRING JSON: what a centre action's run under `command_id` came to (a re-run
        answers from it)."""
        return f"{self.prefix}centre-result:{command_id}"

    def workflow_controls_seen(self, task_id: str) -> str:
        """SET of the operator controls already applied to a task (a redelivered control must
        not act twice)."""
        return f"{self.prefix}wf-control-seen:{task_id}"

    def pool_health(self, cluster: str, pool: str) -> str:
        """STRING JSON: a pool's latest PoolHealth as the scheduler keeps it."""
        return f"{self.prefix}pool-health:{cluster}:{pool}"

    def offline_in_flight(self, cluster: str, pool: str) -> str:
        """ZSET task id -> when its place lapses: the pool's offline budget in use."""
        return f"{self.prefix}offline-in-flight:{cluster}:{pool}"

    def offline_task(self, task_id: str) -> str:
        """STRING: the pool a task holding an offline-budget place counts in."""
        return f"{self.prefix}offline-task:{task_id}"

    def short_circuit_alerted(self, cluster: str, pool: str) -> str:
        """Set while a pool's short-circuit alert stands (one alert a window)."""
        return f"{self.prefix}short-circuit-alerted:{cluster}:{pool}"

    def short_circuit_firing(self, cluster: str, pool: str) -> str:
        """Set from a pool's short-circuit alert until it is resolved."""
        return f"{self.prefix}short-circuit-firing:{cluster}:{pool}"

    def breaker_prefix(self) -> str:
        """`breaker:` and not `breaker-`, so a scan for breakers finds none of their helper
        keys."""
        return f"{self.prefix}breaker:"

    def breaker(self, cluster: str, name: str) -> str:
        """HASH: one circuit breaker's state (services/scheduler/breaker_store.py)."""
        return f"{self.breaker_prefix()}{cluster}:{name}"

    def breaker_recorded(self, task_id: str) -> str:
        """Set once a task's outcome is counted by its breaker (counted once)."""
        return f"{self.prefix}breaker-recorded:{task_id}"

    def breaker_task(self, task_id: str) -> str:
        """STRING: a queued task's cluster, kind, target and breaker, for its outcome event."""
        return f"{self.prefix}breaker-task:{task_id}"

    def breaker_alerted(self, cluster: str, name: str, openings: int) -> str:
        """Set once a breaker's opening was alerted (one alert an opening)."""
        return f"{self.prefix}breaker-alerted:{cluster}:{name}:{openings}"

    def fault_run(self, cluster: str, node: str) -> str:
        """HASH run, last: a node's consecutive faulty samples (the analyzer's)."""
        return f"{self.prefix}faultrun:{cluster}:{node}"

    def gpu_fatal(self, cluster: str, node: str, gpu: int) -> str:
        """ZSET episode id -> when: a GPU's fatal fault episodes in the repeat window."""
        return f"{self.prefix}gpufatal:{cluster}:{node}:{gpu}"

    def pool_history_prefix(self, cluster: str, pool: str) -> str:
        """The prefix of `pool_history` and `pool_history_work` (the downsampling script
        names its lists from it)."""
        return f"{self.prefix}poolhist:{cluster}:{pool}:"

    def pool_history_work(self, cluster: str, pool: str) -> str:
        """HASH: the buckets a pool's utilisation history is being averaged in."""
        return f"{self.pool_history_prefix(cluster, pool)}work"

    def capacity_used(self, cluster: str) -> str:
        """HASH standby node -> the pool it serves (the local capacity provider's)."""
        return f"{self.prefix}capacity-used:{cluster}"

    def outbox(self, owner: str) -> str:
        """ZSET event id -> when it may be relayed (epoch ms): the events a service wrote with
        a state change and the broker has not yet acknowledged (services/shared/outbox.py)."""
        return f"{self.prefix}outbox:{owner}"

    def outbox_events(self, owner: str) -> str:
        """HASH event id -> the topic and body of an event waiting in `outbox(owner)`."""
        return f"{self.prefix}outbox-events:{owner}"

    def sweep_lock(self, name: str) -> str:
        return f"{self.prefix}sweep:{name}"

    def alert_raised(self, dedup_key: str) -> str:
        """Set (with a TTL) once an alert raised from bad input was published, so a flood of
        it raises one alert a window, not one a message."""
        return f"{self.prefix}alert-raised:{dedup_key}"

    # ----------------------------------- pools, capacity, child tasks, controls, rates, audit

    def pool_nodes(self, cluster: str, pool: str) -> str:
        """ZSET node -> GPU utilisation of the pool's up nodes (kept by the collector)."""
        return f"{self.prefix}pool-nodes:{cluster}:{pool}"

    def pool_movable(self, cluster: str, pool: str) -> str:
        """ZSET node -> GPU utilisation of the pool's up nodes running work that could move
        (kept by the collector, beside `pool_nodes`)."""
        return f"{self.prefix}pool-movable:{cluster}:{pool}"

    def capacity_nodes(self, cluster: str, pool: str) -> str:
        """HASH node -> JSON of a node the capacity provider added to a pool."""
        return f"{self.prefix}capacity:{cluster}:{pool}"

    def capacity_request(self, request_id: str) -> str:
        """The outcome of one capacity request (JSON), so a repeated request does nothing."""
        return f"{self.prefix}capacity-req:{request_id}"

    def children(self, parent_task_id: str, step: int) -> str:
        """SET of the child task ids a parent's step waits for."""
        return f"{self.prefix}children:{parent_task_id}:{step}"

    def child_outcomes(self, parent_task_id: str, step: int) -> str:
        """HASH child task id -> its final state."""
        return f"{self.prefix}child-outcomes:{parent_task_id}:{step}"

    def workflow_retries(self) -> str:
        """ZSET task id -> when its failed step is retried (backoff), epoch ms."""
        return f"{self.prefix}wf:retries"

    def workflow_controls(self, task_id: str) -> str:
        """HASH of operator controls that arrived before the workflow did (e.g. pause)."""
        return f"{self.prefix}wf-control:{task_id}"

    def rate_bucket(self, cluster: str, kind: str) -> str:
        """HASH token bucket of disruptive actions of one kind in a cluster."""
        return f"{self.prefix}rate:{cluster}:{kind}"

    def maintenance(self, cluster: str) -> str:
        """HASH of a cluster's maintenance windows: `*` the cluster's, `node:<id>` a node's
        (JSON each; services/shared/maintenance.py)."""
        return f"{self.prefix}maintenance:{cluster}"

    def maintenance_notice(self, window_id: str, task_id: str) -> str:
        """Set once a window's hold of a task is in the task's transitions."""
        return f"{self.prefix}maintenance-notice:{window_id}:{task_id}"

    def audit_log(self) -> str:
        """STREAM of audited operator actions (hash-chained entries)."""
        return f"{self.prefix}audit"

    def audit_head(self) -> str:
        """HASH of the audit stream's head: hash, seq and id of the last entry, and the
        head's MAC under the audit key (services/shared/audit.py)."""
        return f"{self.prefix}audit-head"

    def api_refusals(self, window: int, source: str, reason: str) -> str:
        """STRING count of one source's refused authentications for one reason in one
        window (services/api/refusals.py; expires with the window after next)."""
        return f"{self.prefix}api-refusals:{window}:{reason}:{source}"

    def api_refusal_sources(self, window: int) -> str:
        """STRING count of the (source, reason) pairs refused in one window (same expiry)."""
        return f"{self.prefix}api-refusal-sources:{window}"

    # -------------------------------------------------------- ML task routing

    def ml_registry(self, cluster: str) -> str:
        """HASH node -> JSON of the models it serves, from its latest report (the registry)."""
        return f"{self.prefix}ml:registry:{cluster}"

    def ml_registry_seq(self, cluster: str) -> str:
        """HASH node -> seq of the report the registry holds (older reports are ignored)."""
        return f"{self.prefix}ml:registry-seq:{cluster}"

    def ml_stats(self, cluster: str, stat_key: str) -> str:
        """HASH of one decayed statistics entry of the selector (`arm:...`, `model:...`)."""
        return f"{self.prefix}ml:stats:{cluster}:{stat_key}"

    def ml_stats_prefix(self, cluster: str) -> str:
        return f"{self.prefix}ml:stats:{cluster}:"

    def ml_task(self, task_id: str) -> str:
        """STRING: the router's record of one ML task (JSON, changed by compare-and-set)."""
        return f"{self.prefix}ml:task:{task_id}"

    def ml_due(self) -> str:
        """ZSET task id -> when the router must look at the task again (epoch seconds)."""
        return f"{self.prefix}ml:due"

    def ml_active(self, cluster: str, task_type: str) -> str:
        """ZSET task id -> its deadline: the task type's unfinished tasks (retry budget)."""
        return f"{self.prefix}ml:active:{cluster}:{task_type}"

    def ml_waiting(self, cluster: str) -> str:
        """HASH task id -> "<pool>|<deadline>": tasks no model could take yet (demand)."""
        return f"{self.prefix}ml:waiting:{cluster}"

    def ml_retrying(self, cluster: str, task_type: str) -> str:
        """ZSET '<task>:<attempt>' -> attempt deadline: retries in flight (retry budget)."""
        return f"{self.prefix}ml:retrying:{cluster}:{task_type}"


BoundKind = Literal["ttl", "trimmed", "per_entity", "until_done", "prefix", "kept"]


@dataclass(frozen=True)
class KeyBound:
    """Why a key family of `Keys` cannot grow without bound.

    ttl: every key expires; trimmed: a list, stream or sorted set cut to a length or an age
    as it is written; per_entity: one key (or entry) per node, pool, cluster, breaker or
    window, so it grows with the fleet, not with traffic; until_done: entries removed when
    the task, probe or step they track ends (and the task's own keys expire); prefix: not a
    key; kept: grows, on purpose, at a rate no traffic sets (said why).
    """

    kind: BoundKind
    why: str


# Every family of `Keys`, with its bound: a new method without one fails
# tests/unit/test_key_bounds.py, so a family that grows with traffic cannot slip in unbounded.
KEY_BOUNDS: dict[str, KeyBound] = {
    "node": KeyBound("per_entity", "one hash per node"),
    "node_prefix": KeyBound("prefix", "the prefix of `node`"),
    "heartbeat_due": KeyBound("per_entity", "one member per node"),
    "pool": KeyBound("per_entity", "one hash per pool"),
    "pools": KeyBound("per_entity", "one member per pool"),
    "registry": KeyBound("per_entity", "one member per enrolled node"),
    "keys_handed": KeyBound("per_entity", "one member per enrolled node"),
    "cluster_backend": KeyBound("per_entity", "one per cluster"),
    "backend_clusters": KeyBound("per_entity", "one member per cluster with a backend"),
    "breaker_holds": KeyBound("per_entity", "one member per breaker not closed"),
    "history": KeyBound("trimmed", "LTRIM to the collector's history length"),
    "pool_history": KeyBound("trimmed", "LTRIM to the analyzer's history length"),
    "capacity_plan": KeyBound("ttl", "EX the planner's cache TTL"),
    "demand": KeyBound("ttl", "EX one day"),
    "demand_sources": KeyBound("ttl", "EXPIRE ten source periods"),
    "tuning": KeyBound("per_entity", "one hash per pool, one field per node type"),
    "tuning_pools": KeyBound("per_entity", "one member per pool"),
    "condition": KeyBound("ttl", "EX the need's condition TTL"),
    "probe_due": KeyBound("per_entity", "one member per node"),
    "probes_pending": KeyBound("until_done", "removed when the probe answers or expires"),
    "clusters": KeyBound("per_entity", "one member per cluster"),
    "peer_addresses": KeyBound("per_entity", "one field per node"),
    "peer_verdicts": KeyBound("ttl", "EXPIRE when no prober reports on the target"),
    "peer_assigned": KeyBound("per_entity", "one field per node"),
    "agent_dead": KeyBound("ttl", "SET NX EX"),
    "open_need": KeyBound("ttl", "SET NX EX the open-need TTL"),
    "queue_ready": KeyBound("until_done", "removed when the task is claimed"),
    "queue_inflight": KeyBound("until_done", "removed at ack, requeued when its lease ends"),
    "queue_items": KeyBound("until_done", "removed at ack"),
    "queue_scores": KeyBound("until_done", "removed at ack"),
    "queue_known": KeyBound("trimmed", "entries older than a week trimmed at each enqueue"),
    "lock": KeyBound("ttl", "SET PX the task's lock TTL"),
    "semaphore": KeyBound("trimmed", "places past their lapse removed at each take"),
    "open_tasks": KeyBound("until_done", "removed when the task ends"),
    "open_tasks_version": KeyBound("per_entity", "one counter per cluster"),
    "relation_notice": KeyBound("ttl", "EX a week"),
    "task_outcome": KeyBound("ttl", "EX a week"),
    "epoch": KeyBound("per_entity", "one counter"),
    "dispatch": KeyBound("ttl", "SET PX as long as the task's locks"),
    "control_voucher": KeyBound("ttl", "PX a day"),
    "workflow": KeyBound("ttl", "EXPIRE a week once finished"),
    "command_index": KeyBound("ttl", "EX a day"),
    "command_seq": KeyBound("per_entity", "one counter per node"),
    "workflow_deadlines": KeyBound("until_done", "removed when the step ends"),
    "sweep_lock": KeyBound("ttl", "SET NX PX the sweep period"),
    "interval_request": KeyBound("ttl", "SET NX PX the request window"),
    "centre_result": KeyBound("ttl", "EX the executor's result TTL"),
    "workflow_controls_seen": KeyBound("ttl", "EXPIRE with the workflow"),
    "pool_health": KeyBound("ttl", "EX the scheduler's health TTL"),
    "offline_in_flight": KeyBound("trimmed", "places past their lapse removed at each take"),
    "offline_task": KeyBound("ttl", "EX a week"),
    "short_circuit_alerted": KeyBound("ttl", "EX the alert window"),
    "short_circuit_firing": KeyBound("per_entity", "one per pool, removed when resolved"),
    "breaker_prefix": KeyBound("prefix", "the prefix of `breaker`"),
    "breaker": KeyBound("per_entity", "one hash per breaker (cluster, kind or scope)"),
    "breaker_recorded": KeyBound("ttl", "PX a week"),
    "breaker_task": KeyBound("ttl", "EX a week"),
    "breaker_alerted": KeyBound("ttl", "EX a week"),
    "fault_run": KeyBound("ttl", "EXPIRE the analyzer's run TTL; deleted on a healthy sample"),
    "gpu_fatal": KeyBound("ttl", "EXPIRE the repeat window; trimmed to it too"),
    "pool_history_prefix": KeyBound("prefix", "the prefix of `pool_history`"),
    "pool_history_work": KeyBound("per_entity", "one hash per pool"),
    "capacity_used": KeyBound("per_entity", "one field per standby node"),
    "outbox": KeyBound("until_done", "removed once the broker acknowledged the event"),
    "outbox_events": KeyBound("until_done", "removed with its `outbox` entry"),
    "broker_outage": KeyBound("ttl", "EX the outage memory (an hour)"),
    "workflow_unannounced": KeyBound("until_done", "removed once the task's end is announced"),
    "alert_raised": KeyBound("ttl", "SET NX PX the alert window"),
    "pool_nodes": KeyBound("per_entity", "one member per up node"),
    "pool_movable": KeyBound("per_entity", "one member per up node"),
    "capacity_nodes": KeyBound("per_entity", "one field per node the provider added, "
                               "removed when it is taken away"),
    "capacity_request": KeyBound("ttl", "EX the capacity result TTL"),
    "children": KeyBound("ttl", "EXPIRE with the parent's workflow"),
    "child_outcomes": KeyBound("ttl", "EXPIRE with the parent's workflow"),
    "workflow_retries": KeyBound("until_done", "removed when the step is retried or ends"),
    "workflow_controls": KeyBound("ttl", "EXPIRE with the workflow"),
    "rate_bucket": KeyBound("ttl", "PEXPIRE once it would have refilled"),
    "maintenance": KeyBound("per_entity", "one field per node and one per cluster"),
    "maintenance_notice": KeyBound("ttl", "EX a week"),
    "audit_log": KeyBound("kept", "the hash-chained record of operator actions: grows at the "
                          "operators' rate (refused authentications are counted per window, "
                          "not audited one by one); trimming it would break the chain"),
    "audit_head": KeyBound("per_entity", "one hash: the audit stream's head"),
    "api_refusals": KeyBound("ttl", "EXPIRE with the window after next"),
    "api_refusal_sources": KeyBound("ttl", "EXPIRE with the window after next"),
    "ml_registry": KeyBound("per_entity", "one field per node"),
    "ml_registry_seq": KeyBound("per_entity", "one field per node"),
    "ml_stats": KeyBound("ttl", "EXPIRE the router's stats TTL"),
    "ml_stats_prefix": KeyBound("prefix", "the prefix of `ml_stats`"),
    "ml_task": KeyBound("ttl", "EX record_ttl_s; finished: finished_record_ttl_s past the "
                        "deadline (services/router/records.py)"),
    "ml_due": KeyBound("until_done", "removed when the task is final"),
    "ml_active": KeyBound("until_done", "removed when final; past the deadline trimmed"),
    "ml_waiting": KeyBound("until_done", "removed when the task is final"),
    "ml_retrying": KeyBound("trimmed", "attempts past their deadline trimmed"),
}
