"""Pure planning of the centre's own actions: guards, capacity changes, job moves.

Capacity is measured in GPUs, not nodes: a pool's work is the sum over its up nodes of
utilisation x GPUs (GPU-percent), so a standby node with more GPUs than the pool's average
covers more of it, and fewer of them are added ("nodes got faster: add one, not two").
Nothing here reads Redis or a clock; the centre gathers a `PoolView` and acts on the plan.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, NamedTuple

from schemas.envelope import short_text
from schemas.events.v1 import Guard, OutputValue
from schemas.ranges import Band
from services.capacity.provider import NodeOffer

Direction = Literal["out", "in"]
JobKind = Literal["training", "inference"]

# A job that can be checkpointed and moved; one checkpointing, hung or ended cannot.
MOVABLE_JOB_STATES: frozenset[str] = frozenset({"running", "starting"})
# A leaving node's jobs must go wherever they stand: one its mode stopped (an offline node
# stops every job, which checkpoints as it exits) still belongs to the node until it is
# migrated out, and the agent thaws a hung one before asking it to checkpoint. Only a job
# that ended or failed on its own stays where it is: restarting it is not a migration.
EVACUABLE_JOB_STATES: frozenset[str] = MOVABLE_JOB_STATES | {"checkpointing", "hung", "stopped"}
# Jobs that hold a share of their node's GPUs (and keep a node from being released).
ACTIVE_JOB_STATES: frozenset[str] = frozenset({"starting", "running", "checkpointing", "hung"})
# Shown for the utilisation of work with no capacity at all (the schema forbids inf).
UNBOUNDED_PCT = 1e6


@dataclass(frozen=True)
class JobRef:
    """A job as its node last reported it."""

    job_id: str
    kind: JobKind
    state: str

    @property
    def movable(self) -> bool:
        return self.state in MOVABLE_JOB_STATES


@dataclass(frozen=True)
class NodeView:
    """A node as the collector last saw it."""

    node_id: str
    pool: str
    state: str
    mode: str
    util_pct: float
    gpus: int
    jobs: tuple[JobRef, ...] = ()
    job_count: int = 0

    @property
    def active(self) -> bool:
        """Up and accepting work: the only kind of node a job may move to."""
        return self.state == "up" and self.mode == "active"

    @property
    def load(self) -> float:
        """The node's work in GPU-percent."""
        return self.util_pct * self.gpus

    @property
    def movable_jobs(self) -> tuple[JobRef, ...]:
        return tuple(job for job in self.jobs if job.movable)

    @property
    def jobs_to_move(self) -> tuple[JobRef, ...]:
        """The jobs a move of this node's work takes: every owned job of a leaving node, only
        the running ones of a node in service."""
        states = MOVABLE_JOB_STATES if self.active else EVACUABLE_JOB_STATES
        return tuple(job for job in self.jobs if job.state in states)

    @property
    def active_jobs(self) -> int:
        listed = sum(1 for job in self.jobs if job.state in ACTIVE_JOB_STATES)
        # Only the first jobs are listed; the count covers the rest (assumed active).
        return listed + max(0, self.job_count - len(self.jobs))

    @property
    def owned_jobs(self) -> int:
        """Jobs the node still owns, wherever they stand: a drain stops serving jobs, and a
        stopped job is gone for good if its node is released before it is moved out."""
        listed = sum(1 for job in self.jobs if job.state in EVACUABLE_JOB_STATES)
        return listed + max(0, self.job_count - len(self.jobs))


@dataclass(frozen=True)
class PoolView:
    """A pool's up nodes, its nodes per state, queued demand and work about to move in."""

    cluster: str
    pool: str
    nodes: tuple[NodeView, ...]
    counts: Mapping[str, int] = field(default_factory=dict)
    demand_pct: float = 0.0
    # GPU-percent of work on a node leaving the pool that its jobs bring to the others.
    incoming_load: float = 0.0
    incoming_from: str = ""

    @property
    def gpus(self) -> int:
        return sum(node.gpus for node in self.nodes)

    @property
    def load(self) -> float:
        """All the work the pool must carry, GPU-percent: usage, incoming jobs, queued demand."""
        used = sum(node.load for node in self.nodes)
        # Demand is kept as a share of the current capacity; as work it does not shrink or
        # grow with the capacity that will carry it.
        return used + self.incoming_load + self.demand_pct * self.gpus

    @property
    def util_pct(self) -> float:
        """Effective utilisation (usage plus demand plus incoming work), GPU-weighted."""
        return utilisation(self.load, self.gpus)

    @property
    def mean_gpus(self) -> float:
        return self.gpus / len(self.nodes) if self.nodes else 0.0

    def node(self, node_id: str) -> NodeView | None:
        return next((n for n in self.nodes if n.node_id == node_id), None)

    def with_incoming(self, leaving: NodeView | None) -> PoolView:
        """This pool expecting the jobs of a node of it that is leaving (drained, offline)."""
        if leaving is None or leaving.pool != self.pool or leaving.active:
            return self
        if not leaving.active_jobs:
            return self
        return replace(self, incoming_load=estimated_load(leaving, self),
                       incoming_from=leaving.node_id)


def utilisation(load: float, gpus: float) -> float:
    if gpus > 0:
        return load / gpus
    return 0.0 if load <= 0 else UNBOUNDED_PCT


def job_load(node: NodeView, pool: PoolView) -> float:
    """The GPU-percent one job of `node` is assumed to use (its node's share per job).

    A node reports utilisation, not per-job figures: its jobs share it equally. A node that
    stopped computing (offline by a fault) reports none, so its jobs are assumed as busy as
    the pool's average job.
    """
    jobs = node.active_jobs
    if node.load > 0 and jobs:
        return node.load / jobs
    pool_jobs = sum(n.active_jobs for n in pool.nodes)
    pool_load = sum(n.load for n in pool.nodes)
    return pool_load / pool_jobs if pool_jobs else 0.0


def estimated_load(node: NodeView, pool: PoolView) -> float:
    """The GPU-percent a node's jobs would bring wherever they go."""
    return job_load(node, pool) * node.active_jobs


def default_target(band: Band, direction: Direction) -> float:
    """What a capacity change aims at: the range's exit threshold on the side it leaves.

    The smallest change that brings the pool back inside its range with the hysteresis
    margin (5 nodes at 85% -> 6 nodes at about 71%), not the middle of the range (9 nodes at
    about 47%): capacity costs, and the other side of the range is guarded anyway.
    """
    return band.high_exit if direction == "out" else band.low_exit


# ---------------------------------------------------------------- guards


def guard_holds(
    guard: Guard, pool: PoolView, node: NodeView | None, pool_band: Band,
    node_band: Band,
) -> tuple[bool, str]:
    """Whether a step's guard holds on this fresh state, and why (the reason is recorded)."""
    if guard == "pool_above_range":
        return _pool_above(pool, pool_band)
    if guard == "pool_below_range":
        return _pool_below(pool, pool_band)
    if guard == "nodes_out_of_range":
        return _nodes_out(pool, node_band)
    return _node_has_jobs(node)


def _pool_text(pool: PoolView) -> str:
    text = f"pool {pool.pool} at {pool.util_pct:.1f}% ({len(pool.nodes)} nodes up"
    if pool.incoming_load:
        text += f", with the jobs of {pool.incoming_from}"
    if pool.demand_pct:
        text += f", {pool.demand_pct:.1f}% demand"
    return text + ")"


def _pool_above(pool: PoolView, band: Band) -> tuple[bool, str]:
    if not pool.gpus:
        if pool.load > 0:
            return True, f"pool {pool.pool} has no GPU up for its work"
        return False, f"pool {pool.pool} has no node up and no work"
    above = pool.util_pct > band.high_enter
    word = "above" if above else "not above"
    return above, f"{_pool_text(pool)} {word} {band.high_enter:g}%"


def _pool_below(pool: PoolView, band: Band) -> tuple[bool, str]:
    if not pool.nodes:
        return False, f"pool {pool.pool} has no node up"
    below = pool.util_pct < band.low_enter
    word = "below" if below else "not below"
    return below, f"{_pool_text(pool)} {word} {band.low_enter:g}%"


def _nodes_out(pool: PoolView, band: Band) -> tuple[bool, str]:
    out = out_of_range(pool, band)
    if not out:
        return False, (f"all {len(pool.nodes)} up nodes of pool {pool.pool} inside "
                       f"{band.low_enter:g}-{band.high_enter:g}%")
    shown = "; ".join(
        f"{n.node_id} at {n.util_pct:.0f}% "
        f"{'above' if n.util_pct > band.high_enter else 'below'} "
        f"{band.high_enter if n.util_pct > band.high_enter else band.low_enter:g}%"
        for n in out[:4]
    )
    more = f" and {len(out) - 4} more" if len(out) > 4 else ""
    return True, f"{shown}{more}"


def _node_has_jobs(node: NodeView | None) -> tuple[bool, str]:
    if node is None:
        return False, "node unknown"
    movable = node.jobs_to_move
    if movable:
        return True, f"{node.node_id} has {len(movable)} job(s) to move"
    return False, f"{node.node_id} has no job to move"


def out_of_range(pool: PoolView, band: Band) -> list[NodeView]:
    """Active nodes outside the node range, busiest first."""
    return sorted(
        (n for n in pool.nodes
         if n.active and (n.util_pct > band.high_enter or n.util_pct < band.low_enter)),
        key=lambda n: (-n.util_pct, n.node_id),
    )


# ---------------------------------------------------------------- capacity


@dataclass(frozen=True)
class CapacityPlan:
    """What a capacity change means to do: from where, to where, with which nodes, why."""

    direction: Direction
    initial_nodes: int
    initial_gpus: int
    initial_util_pct: float
    target_nodes: int
    target_gpus: int
    target_util_pct: float
    nodes: tuple[str, ...]
    reason: str

    def outputs(self) -> dict[str, OutputValue]:
        """The step's recorded initial and target resources."""
        return {
            "direction": self.direction,
            "initial_nodes": self.initial_nodes,
            "initial_gpus": self.initial_gpus,
            "initial_util_pct": round(self.initial_util_pct, 1),
            "target_nodes": self.target_nodes,
            "target_gpus": self.target_gpus,
            "target_util_pct": round(self.target_util_pct, 1),
            "nodes": short_text(",".join(self.nodes)),
            "reason": short_text(self.reason),
        }


def capacity_plan(
    pool: PoolView, offers: Sequence[NodeOffer], band: Band, direction: Direction,
    fixed_count: int = 0, *, target_pct: float | None = None,
) -> CapacityPlan:
    """Which of `offers` to add ("out") or remove ("in").

    For "out", offers are standby nodes, of any sizes; for "in", the pool's own nodes in
    removal order (see `removal_order`), taken in that order. The change is the one that
    brings the pool's utilisation nearest the target (`default_target`, unless set)
    while inside the range's exit thresholds, so it does not trip the opposite need; among
    equals, the fewest nodes. `fixed_count` > 0 takes exactly that many (largest first when
    adding, as far as there are). A pool still inside its range on the side of the change
    is left alone.
    """
    target = default_target(band, direction) if target_pct is None else target_pct
    load, gpus, n0 = pool.load, pool.gpus, len(pool.nodes)
    u0 = utilisation(load, gpus)
    sign = 1 if direction == "out" else -1
    if direction == "out":
        offers = standby_order(offers)
        if fixed_count <= 0:
            # The best choice first: the plan below then takes it as a prefix.
            chosen = _best_selection(load, gpus, offers, band, target)
            offers = [*chosen, *(o for o in offers if o not in chosen)]
    # Scaling in never removes the last up node.
    limit = len(offers) if direction == "out" else min(len(offers), max(0, n0 - 1))
    sizes = [0, *(offer.gpus for offer in offers[:limit])]
    capacity = [gpus + sign * sum(sizes[: k + 1]) for k in range(limit + 1)]
    util = [utilisation(load, c) for c in capacity]

    def plan(k: int, reason: str) -> CapacityPlan:
        return CapacityPlan(
            direction, n0, gpus, _shown(u0), n0 + sign * k, capacity[k], _shown(util[k]),
            tuple(o.node_id for o in offers[:k]), reason,
        )

    start = f"{n0} nodes at {_shown(u0):.0f}%"
    if fixed_count > 0:
        k = min(fixed_count, limit)
        short = f" (asked for {fixed_count}, {limit} available)" if k < fixed_count else ""
        return plan(k, f"{start} -> {_verb(direction, k)} (fixed count){short} -> "
                       f"{n0 + sign * k} nodes at about {_shown(util[k]):.0f}%")
    needed = u0 > band.high_exit if direction == "out" else u0 < band.low_exit
    if not needed:
        side = "above" if direction == "out" else "below"
        return plan(0, f"{start}: not {side} the range {band.low_exit:g}-{band.high_exit:g}%, "
                       "nothing to change")
    if limit == 0:
        if direction == "out":
            return plan(0, f"{start}: no standby capacity")
        return plan(0, f"{start}: no node can be removed")
    k = _best_count(util, band, target)
    if k == 0:
        return plan(0, f"{start}: no change brings it nearer {target:g}%")
    reason = (f"{start} -> {_verb(direction, k)} ({_sizes(sizes[1:k + 1])}, pool average "
              f"{pool.mean_gpus:g}) -> {n0 + sign * k} nodes at about {_shown(util[k]):.0f}%")
    if direction == "out":
        reason += _size_effect(pool, load, k, band, target)
        if util[k] > band.high_exit:
            reason += "; not enough standby capacity to reach the range"
    return plan(k, reason)


# Above this many combinations of standby sizes, adding takes them largest first instead.
_MAX_COMBINATIONS = 20_000


def _best_selection(load: float, gpus: int, offers: Sequence[NodeOffer], band: Band,
                    target: float) -> list[NodeOffer]:
    """The standby nodes that bring the pool nearest the target: inside the range first,
    then nearest, then the fewest nodes (nodes of one size are interchangeable, so only how
    many of each size is searched)."""
    by_size: dict[int, list[NodeOffer]] = {}
    for offer in offers:
        by_size.setdefault(offer.gpus, []).append(offer)
    sizes = sorted(by_size, reverse=True)
    if math.prod(len(by_size[s]) + 1 for s in sizes) > _MAX_COMBINATIONS:
        return []

    def score(counts: tuple[int, ...]) -> tuple[bool, float, int]:
        util = utilisation(load, gpus + sum(c * s for c, s in zip(counts, sizes, strict=True)))
        return (not band.low_exit <= util <= band.high_exit, abs(util - target), sum(counts))

    best = min(itertools.product(*(range(len(by_size[s]) + 1) for s in sizes)), key=score)
    return [offer for count, size in zip(best, sizes, strict=True)
            for offer in by_size[size][:count]]


def _best_count(util: list[float], band: Band, target: float) -> int:
    """The count whose utilisation is nearest the target, preferring those inside the range."""
    inside = [k for k, u in enumerate(util) if band.low_exit <= u <= band.high_exit]
    candidates = inside or list(range(len(util)))
    return min(candidates, key=lambda k: (abs(util[k] - target), k))


def _size_effect(pool: PoolView, load: float, k: int, band: Band, target: float) -> str:
    """Says when the offers' size changed the count, against nodes of the pool's average."""
    mean = pool.mean_gpus
    if mean <= 0:
        return ""
    util = [utilisation(load, pool.gpus + mean * j) for j in range(65)]
    same_size = _best_count(util, band, target)
    if same_size > k:
        return (f"; bigger standby nodes mean fewer added: {k} instead of {same_size} of "
                f"the pool's average size")
    if same_size < k:
        return (f"; smaller standby nodes mean more added: {k} instead of {same_size} of "
                f"the pool's average size")
    return ""


def _verb(direction: Direction, k: int) -> str:
    return f"{'add' if direction == 'out' else 'remove'} {k} node{'s' if k != 1 else ''}"


def _sizes(sizes: Iterable[int]) -> str:
    distinct = sorted(set(sizes))
    return f"{distinct[0]} GPUs" if len(distinct) == 1 else "+".join(map(str, sizes)) + " GPUs"


def _shown(util: float) -> float:
    return min(util, UNBOUNDED_PCT)


def standby_order(offers: Iterable[NodeOffer]) -> list[NodeOffer]:
    """Standby nodes largest first: the fewest nodes that cover the work."""
    return sorted(offers, key=lambda o: (-o.gpus, o.node_id))


def removal_order(pool: PoolView, owned_by_provider: Iterable[str]) -> list[NodeView]:
    """The pool's active nodes in the order to remove them: the provider's own first (it
    can stop them), then those with the fewest jobs to move, then the least busy."""
    owned = set(owned_by_provider)
    return sorted(
        (n for n in pool.nodes if n.active),
        key=lambda n: (n.node_id not in owned, n.active_jobs, n.util_pct, n.node_id),
    )


def nodes_to_remove(pool: PoolView, owned_by_provider: Iterable[str], count: int) -> list[str]:
    return [n.node_id for n in removal_order(pool, owned_by_provider)[:max(0, count)]]


# ---------------------------------------------------------------- job moves


class Move(NamedTuple):
    """One job to move: checkpoint it on `src`, start it from the checkpoint on `dst`."""

    job: JobRef
    src: str
    dst: str


def pick_destination(pool: PoolView, exclude: Iterable[str] = ()) -> NodeView | None:
    """The least-loaded active node of the pool, other than those excluded."""
    skip = set(exclude)
    candidates = [n for n in pool.nodes if n.active and n.gpus > 0 and n.node_id not in skip]
    return min(candidates, key=lambda n: (n.util_pct, n.node_id), default=None)


def rebalance_moves(
    pool: PoolView, node_band: Band, max_jobs: int, from_node: str | None = None
) -> list[Move]:
    """Moves from busy to idle nodes until every node is in range (or no move helps).

    Greedy, as the descheduler's utilisation balancing: each move takes a job from the
    busiest node that has one to the least busy that can take it. A move must help a node
    out of range (relieve one above it, or fill one below it without dropping the giver
    below it), must leave the receiver less busy than the giver was (no ping-pong) and not
    above the exit threshold (no new hot spot): shuffling jobs among idle nodes of an idle
    pool helps nobody. With `from_node`, the moves start there: out of it if it is busy,
    into it if it is idle, and stop once it is back in range.
    """
    nodes = {n.node_id: n for n in pool.nodes if n.active and n.gpus > 0}
    loads = {name: n.load for name, n in nodes.items()}
    share = {name: job_load(n, pool) for name, n in nodes.items()}
    jobs = {name: sorted(n.movable_jobs, key=lambda j: j.job_id) for name, n in nodes.items()}
    band = node_band
    moves: list[Move] = []

    def util(name: str, extra: float = 0.0) -> float:
        return (loads[name] + extra) / nodes[name].gpus

    def useful(src: str, dst: str) -> bool:
        src_after = util(src, -share[src])
        if src == from_node:
            return True
        if dst == from_node:
            return src_after >= band.low_enter
        return util(src) > band.high_enter or (util(dst) < band.low_enter
                                               and src_after >= band.low_enter)

    def best_move(givers: list[str], takers: list[str]) -> Move | None:
        for src in sorted((g for g in givers if jobs[g]), key=lambda g: (-util(g), g)):
            for dst in sorted((t for t in takers if t != src), key=lambda t: (util(t), t)):
                after = util(dst, share[src])
                if after < util(src) and after <= band.high_exit and useful(src, dst):
                    return Move(jobs[src][0], src, dst)
        return None

    givers, takers = list(nodes), list(nodes)
    if from_node is not None:
        if from_node not in nodes:
            return []
        others = [n for n in nodes if n != from_node]
        # Its episode holds until it passes the exit threshold (the need's hysteresis).
        if util(from_node) > band.high_exit:
            givers, takers = [from_node], others
        elif util(from_node) < band.low_exit:
            givers, takers = others, [from_node]
        else:
            return []
    while len(moves) < max_jobs:
        if from_node is not None:
            if band.low_exit <= util(from_node) <= band.high_exit:
                break
        elif all(band.low_enter <= util(n) <= band.high_enter for n in nodes):
            break
        move = best_move(givers, takers)
        if move is None:
            break
        job, src, dst = move
        moves.append(move)
        jobs[src].remove(job)
        loads[src] -= share[src]
        loads[dst] += share[src]
    return moves


def evacuation_moves(pool: PoolView, node: NodeView, max_jobs: int) -> tuple[list[Move], int]:
    """Where each movable job of a leaving node goes, and how many found no place.

    The jobs must leave whatever the load (the node is going out of service), so each one
    goes to the least busy active node as the earlier moves leave them; overload is the next
    capacity step's business.
    """
    takers = {n.node_id: n for n in pool.nodes
              if n.active and n.gpus > 0 and n.node_id != node.node_id}
    loads = {name: n.load for name, n in takers.items()}
    each = job_load(node, pool)
    moves: list[Move] = []
    # Every owned job, even if the node's last report still shows it in service (the report
    # may predate the drain or offline step just before the move).
    movable = sorted((j for j in node.jobs if j.state in EVACUABLE_JOB_STATES),
                     key=lambda j: j.job_id)
    for job in movable[:max_jobs]:
        if not takers:
            break
        dst = min(takers, key=lambda t: (loads[t] / takers[t].gpus, t))
        moves.append(Move(job, node.node_id, dst))
        loads[dst] += each
    return moves, len(movable[:max_jobs]) - len(moves)


def moves_text(moves: Sequence[Move]) -> str:
    """Moves as recorded in outputs: "job:src>dst,..." (bounded like every output)."""
    return short_text(",".join(f"{m.job.job_id}:{m.src}>{m.dst}" for m in moves))
