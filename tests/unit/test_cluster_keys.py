"""Two clusters never share a key: every lock name, Redis key, command sequence and checkpoint
path built from a node or a job is scoped by its cluster (two clusters may both have a
`node-001` running `node-001.train`)."""

from __future__ import annotations

import inspect
from datetime import UTC, datetime
from pathlib import Path
from typing import get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.store import checkpoint_dir
from schemas.envelope import CLUSTER_ID_PATTERN, IDENTIFIER_MAX
from schemas.events.v1 import NeedKind
from services.shared.locks import job_lock, node_lock
from services.shared.redis_client import Keys
from services.templater.templates import load_templates, plan
from tests.unit.templater.test_builtin_templates import need

clusters = st.from_regex(CLUSTER_ID_PATTERN, fullmatch=True)
names = st.from_regex(rf"^[A-Za-z0-9_.-]{{1,{IDENTIFIER_MAX}}}$", fullmatch=True)
# Dotted names are the ones that could run into another cluster's lock name.
dotted = st.lists(st.sampled_from(["east", "west", "a", "b", "node-001", "1"]), min_size=1,
                  max_size=4).map(".".join)
two_clusters = st.tuples(clusters, clusters).filter(lambda pair: pair[0] != pair[1])
# Every key builder of Keys that is given a cluster, with its other arguments.
CLUSTER_KEYS = [
    (name, [p for p in inspect.signature(method).parameters if p != "self"])
    for name, method in inspect.getmembers(Keys, inspect.isfunction)
    if "cluster" in inspect.signature(method).parameters
]


@given(two_clusters, names | dotted, names | dotted)
def test_node_and_job_locks_of_two_clusters_differ_whatever_the_names(
    pair: tuple[str, str], one: str, other: str
) -> None:
    east, west = pair
    locks = {node_lock(east, one), node_lock(west, other), job_lock(east, one),
             job_lock(west, other)}
    assert len(locks) == 4


@given(two_clusters, st.sampled_from(["offline", "scale_out", "a-b_c"]))
def test_template_semaphores_and_open_tasks_of_two_clusters_differ(
    pair: tuple[str, str], template: str
) -> None:
    east, west = pair
    keys = Keys("t")
    assert keys.semaphore(template, east) != keys.semaphore(template, west)
    assert keys.open_tasks(east) != keys.open_tasks(west)


def test_every_key_built_from_a_node_or_a_job_takes_the_cluster() -> None:
    for name, method in inspect.getmembers(Keys, inspect.isfunction):
        params = set(inspect.signature(method).parameters)
        if params & {"node", "node_id", "job", "job_id", "target", "pool"}:
            assert "cluster" in params, f"Keys.{name} is not scoped by cluster"
    assert {"node", "command_seq", "history", "condition", "open_need"} <= {
        name for name, _ in CLUSTER_KEYS}


@pytest.mark.parametrize(("name", "params"), CLUSTER_KEYS, ids=[n for n, _ in CLUSTER_KEYS])
@settings(max_examples=25)  # one run per builder: many builders, one shape
@given(pair=two_clusters, value=names)
def test_redis_keys_of_two_clusters_differ(
    name: str, params: list[str], pair: tuple[str, str], value: str
) -> None:
    keys = Keys("ns")
    build = getattr(keys, name)
    east, west = ({p: cluster if p == "cluster" else value for p in params} for cluster in pair)
    assert build(**east) != build(**west)


@given(two_clusters, names)
def test_command_sequences_of_the_same_node_name_are_two_counters(
    pair: tuple[str, str], node: str
) -> None:
    keys = Keys("")
    assert keys.command_seq(pair[0], node) != keys.command_seq(pair[1], node)


@given(two_clusters)
def test_checkpoints_of_the_same_job_in_two_clusters_are_two_directories(
    pair: tuple[str, str]
) -> None:
    root = Path("/store")
    east, west = (checkpoint_dir(root, cluster, "node-001.train") for cluster in pair)
    assert east != west
    assert east.parent.parent == west.parent.parent == root


@pytest.mark.parametrize("kind", sorted(get_args(NeedKind)))
def test_built_in_templates_lock_nothing_the_same_need_in_another_cluster_locks(
    kind: NeedKind
) -> None:
    template = load_templates()[kind]
    now = datetime(2026, 12, 1, tzinfo=UTC)
    east = plan(template, need(kind, cluster_id="east"), now, "templater")
    west = plan(template, need(kind, cluster_id="west"), now, "templater")
    assert east.target == west.target
    assert not set(east.mutex_keys) & set(west.mutex_keys), (east.mutex_keys, west.mutex_keys)
