"""The compact job list the collector keeps in a node's fields, parsed back by the centre's
ClusterView (pure; the pool index on the real redis-server is in
tests/service/executor/test_cluster_view.py)."""

from __future__ import annotations

from services.executor.cluster_view import parse_jobs
from services.executor.planning import JobRef


def test_compact_jobs_parse_back_and_skip_what_they_cannot_read() -> None:
    assert parse_jobs("") == ()
    assert parse_jobs("a:training:running,b:inference:hung,c:weird:running,:training:x") == (
        JobRef("a", "training", "running"), JobRef("b", "inference", "hung"))
