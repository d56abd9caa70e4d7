"""The collector's pure peer-probe policy: the ring, freshness, quorum and both verdicts."""

from __future__ import annotations

import pytest

from services.collector.peer_policy import (
    PeerJudgement,
    ProberVerdict,
    assign_ring,
    assignment_due,
    assignment_fingerprint,
    judge,
    parse_verdicts,
)

NOW = 1_000.0
MAX_AGE = 30.0


def v(prober: str, reachable: bool, age_s: float = 1.0) -> ProberVerdict:
    return ProberVerdict(prober, reachable, NOW - age_s)


def test_the_ring_gives_every_node_as_many_watchers_as_it_watches() -> None:
    nodes = [f"node-{n:03d}" for n in (5, 1, 3, 2, 4)]
    ring = assign_ring(nodes, 2)
    assert ring["node-001"] == ["node-002", "node-003"]
    assert ring["node-005"] == ["node-001", "node-002"]  # wraps around
    watchers = {n: sum(n in peers for peers in ring.values()) for n in ring}
    assert set(watchers.values()) == {2}
    assert all(node not in peers for node, peers in ring.items())


def test_the_ring_is_bounded_and_small_clusters_get_what_there_is() -> None:
    assert assign_ring(["a", "b"], 3) == {"a": ["b"], "b": ["a"]}
    assert assign_ring(["a"], 3) == {"a": []}
    assert assign_ring(["a", "b", "c"], 0) == {"a": [], "b": [], "c": []}
    many = [f"n{i:02d}" for i in range(40)]
    assert {len(p) for p in assign_ring(many, 99).values()} == {16}  # the schema's bound
    assert assign_ring(many, 3) == assign_ring(list(reversed(many)), 3)  # order-free


@pytest.mark.parametrize(
    ("verdicts", "partitioned", "alive"),
    [
        pytest.param([v("a", False), v("b", False)], True, False, id="a quorum cannot reach it"),
        pytest.param([v("a", False)], False, False, id="one lying node alone never decides"),
        pytest.param([v("a", False), v("b", False), v("c", True)], False, False,
                     id="one fresh prober reaches it: not cut off"),
        pytest.param([v("a", False), v("b", False), v("c", True, age_s=60)], True, False,
                     id="a stale reach does not count"),
        pytest.param([v("a", False, age_s=31), v("b", False)], False, False,
                     id="a stale miss does not count"),
        pytest.param([v("a", True), v("b", True)], False, True, id="reached by a quorum"),
        pytest.param([v("a", True), v("b", True), v("c", False)], False, True,
                     id="reached by a quorum, missed by one"),
        pytest.param([v("a", True)], False, False, id="one reach is not a quorum"),
        pytest.param([], False, False, id="nothing known"),
    ],
)
def test_verdicts(verdicts: list[ProberVerdict], partitioned: bool, alive: bool) -> None:
    judgement = judge(verdicts, NOW, MAX_AGE)
    assert judgement.partitioned(2) == partitioned
    assert judgement.alive(2) == alive


def test_a_silent_node_counts_only_probes_made_after_its_last_report() -> None:
    verdicts = [v("a", True, age_s=20), v("b", True, age_s=5), v("c", True, age_s=2)]
    assert judge(verdicts, NOW, MAX_AGE, since_s=NOW - 10).reached_by == ("b", "c")
    assert not judge(verdicts, NOW, MAX_AGE, since_s=NOW - 3).alive(2)


def test_the_quorum_is_at_least_one_and_the_detail_counts() -> None:
    judgement = PeerJudgement(reached_by=(), unreached_by=("a",))
    assert judgement.partitioned(0)
    assert judgement.partitioned(1)
    assert not judgement.partitioned(2)
    assert judgement.detail() == "0 peer(s) reach it, 1 cannot"


def test_verdicts_parse_from_redis_and_bad_ones_are_skipped() -> None:
    assert parse_verdicts({"a": "1|990.5", "b": "0|991", "c": "1|soon", "d": "x"}) == [
        ProberVerdict("a", True, 990.5), ProberVerdict("b", False, 991.0)]


def test_an_assignment_is_sent_when_it_changes_or_is_old() -> None:
    told = assignment_fingerprint("127.0.0.1:4001", [("b", "127.0.0.2:4002")])
    assert told == assignment_fingerprint("127.0.0.1:4001", [("b", "127.0.0.2:4002")])
    moved = assignment_fingerprint("127.0.0.1:4001", [("b", "127.0.0.2:4999")])
    restarted = assignment_fingerprint("127.0.0.1:4555", [("b", "127.0.0.2:4002")])
    assert len({told, moved, restarted}) == 3
    assert assignment_due(told, None, NOW, 300.0)
    assert not assignment_due(told, (told, NOW - 10), NOW, 300.0)
    assert assignment_due(moved, (told, NOW - 10), NOW, 300.0)
    assert assignment_due(told, (told, NOW - 300), NOW, 300.0)
