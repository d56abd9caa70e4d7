"""Pure peer-probe decisions: who probes whom, and what the probers' verdicts say.

The collector sees every report, so it reads the peer probes of the whole cluster. For each
target node it keeps the latest verdict of each prober (reached or not, and when the
prober's report was sent). Two readings, each needing a quorum of distinct probers so that
one lying (or itself cut off) node can never decide alone:

* partitioned: a node that still reports, that at least `quorum` fresh probers could not
  reach and none of the fresh ones reached;
* agent dead: a node that stopped reporting while at least `quorum` probers reached it
  since its last report. The node is alive; only its agent is not.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from common.ring import successors
from schemas.events.v1 import MAX_PEERS


@dataclass(frozen=True)
class ProberVerdict:
    """One prober's latest verdict on a target, and when the prober's report was sent."""

    prober: str
    reachable: bool
    sent_at: float  # epoch seconds: the report's occurred_at, never when the centre read it


@dataclass(frozen=True)
class PeerJudgement:
    """What the fresh verdicts on one node say: how many probers reached it, how many not."""

    reached_by: tuple[str, ...]
    unreached_by: tuple[str, ...]

    def partitioned(self, quorum: int) -> bool:
        """Cut off from its peers: a quorum could not reach it and nobody fresh could."""
        return not self.reached_by and len(self.unreached_by) >= max(1, quorum)

    def alive(self, quorum: int) -> bool:
        """Still reached by a quorum of its peers: the node is up, whatever its agent does."""
        return len(self.reached_by) >= max(1, quorum)

    def detail(self) -> str:
        return (f"{len(self.reached_by)} peer(s) reach it, "
                f"{len(self.unreached_by)} cannot")


def judge(verdicts: Iterable[ProberVerdict], now_s: float, max_age_s: float,
          since_s: float | None = None) -> PeerJudgement:
    """The verdicts sent within `max_age_s` of `now_s` (and after `since_s`, if given).

    `since_s` is a silent node's last report: only a probe made after the node went quiet
    says anything about whether it is alive now.
    """
    reached: set[str] = set()
    unreached: set[str] = set()
    for verdict in verdicts:
        if now_s - verdict.sent_at > max_age_s:
            continue
        if since_s is not None and verdict.sent_at <= since_s:
            continue
        (reached if verdict.reachable else unreached).add(verdict.prober)
    return PeerJudgement(tuple(sorted(reached)), tuple(sorted(unreached)))


def parse_verdicts(raw: Mapping[str, str]) -> list[ProberVerdict]:
    """Verdicts as Redis keeps them (prober -> "1|sent_at" or "0|sent_at"); bad ones skipped."""
    verdicts = []
    for prober, value in raw.items():
        flag, _, sent = value.partition("|")
        try:
            verdicts.append(ProberVerdict(prober, flag == "1", float(sent)))
        except ValueError:
            continue
    return verdicts


def assign_ring(nodes: Iterable[str], count: int) -> dict[str, list[str]]:
    """Each node's peers: its `count` successors among the sorted node ids (a ring).

    Every node is then probed by `count` others (fewer in a cluster that small), so a quorum
    up to `count` can be met.
    """
    members = sorted(set(nodes))
    bounded = min(max(0, count), MAX_PEERS)
    return {node: successors(node, members, bounded) for node in members}


def assignment_fingerprint(own_address: str, peers: Sequence[tuple[str, str]]) -> str:
    """What a node was told, in short: its own address (a restarted agent on a new port is
    told again) and its peers with their addresses."""
    text = own_address + "|" + ",".join(f"{node}@{address}" for node, address in peers)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def assignment_due(fingerprint: str, sent: tuple[str, float] | None, now_s: float,
                   resend_s: float) -> bool:
    """Whether a node must be told its peers: never told, told something else, or long ago."""
    if sent is None:
        return True
    told, sent_at = sent
    return told != fingerprint or now_s - sent_at >= resend_s
