"""The ML half of `warden demo`: the share table of model@node from ML task records, and the
records it reads through the API client (a retried task in full, with its attempts)."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs
from uuid import uuid4

import httpx

from services.api.client import ApiClient, ClientSettings
from warden.demo_ml import attempts_by_arm, busiest, recent_tasks, share_table


def row(state: str, model: str | None = "digits-mlp", node: str | None = "node-001",
        attempts: int = 1) -> dict[str, Any]:
    """A task as `GET /api/v1/ml/tasks` lists it (the latest attempt only)."""
    return {"task_id": str(uuid4()), "state": state, "model": model, "version": "1" if model
            else None, "node_id": node, "attempts": attempts}


def attempt(model: str, node: str, outcome: str | None) -> dict[str, Any]:
    return {"model": model, "version": "1", "node_id": node, "outcome": outcome}


def retried(first: tuple[str, str, str], then: tuple[str, str, str]) -> dict[str, Any]:
    """A task that ended as `then` after failing, or not, as `first` (its detail)."""
    task = row(then[2], then[0], then[1], attempts=2)
    task["attempt_list"] = [attempt(*first), attempt(*then)]
    return task


def cells(table: str) -> dict[str, list[str]]:
    """model -> its cells, each 'N RATE'."""
    lines = table.splitlines()[2:]
    out = {}
    for line in lines:
        parts = line.split()
        out[parts[0]] = [f"{n} {r}" for n, r in zip(parts[1::2], parts[2::2], strict=True)]
    return out


def test_each_attempt_counts_where_it_ran_and_unfinished_tasks_not_at_all() -> None:
    assert attempts_by_arm(row("succeeded")) == [("digits-mlp@1", "node-001", True)]
    assert attempts_by_arm(row("failed", node="node-002")) == [
        ("digits-mlp@1", "node-002", False)]
    assert attempts_by_arm(row("running")) == []
    assert attempts_by_arm(row("failed", model=None, node=None)) == []  # nothing took it
    task = retried(("digits-mlp", "node-003", "failed"), ("digits-knn", "node-001", "succeeded"))
    assert attempts_by_arm(task) == [("digits-mlp@1", "node-003", False),
                                     ("digits-knn@1", "node-001", True)]


def test_share_table_says_how_many_tasks_ran_on_each_model_at_node_and_how_well() -> None:
    tasks = [
        *(row("succeeded", "digits-knn", "node-001") for _ in range(3)),
        row("succeeded", "digits-mlp", "node-003"),
        retried(("digits-mlp", "node-003", "failed"), ("digits-knn", "node-002", "succeeded")),
        retried(("digits-mlp", "node-003", "failed"), ("digits-mlp", "node-001", "failed")),
        row("running", "digits-knn", "node-002"),
    ]
    table = share_table(tasks, models=["digits-logreg@1"], nodes=["node-001", "node-004"],
                        window_s=30)
    summary, header = table.splitlines()[:2]
    assert summary.startswith("ML tasks, last 30 s: 6 finished, 83% succeeded, 2 after a retry")
    assert header.split() == ["model", "node-001", "node-002", "node-003", "node-004"]
    assert cells(table) == {
        "digits-knn@1": ["3 100%", "1 100%", "0 -", "0 -"],
        "digits-logreg@1": ["0 -", "0 -", "0 -", "0 -"],  # known, and nothing ran there
        "digits-mlp@1": ["1 0%", "0 -", "3 33%", "0 -"],
    }


def test_a_rate_is_rounded_down_so_100_percent_means_no_failure() -> None:
    tasks = [*(row("succeeded") for _ in range(199)), row("failed")]
    table = share_table(tasks)
    assert "200 finished, 99% succeeded" in table
    assert cells(table) == {"digits-mlp@1": ["200 99%"]}


def test_nothing_yet_is_a_table_too() -> None:
    table = share_table([], models=["digits-mlp@1"], nodes=["node-001"])
    assert "0 finished, - succeeded" in table
    assert cells(table) == {"digits-mlp@1": ["0 -"]}


def test_the_flaky_fault_goes_to_the_busiest_model_at_node_of_the_spare_nodes() -> None:
    tasks = [
        *(row("succeeded", "digits-knn", "node-002") for _ in range(5)),  # the ops victim
        row("succeeded", "digits-knn", "node-003"),
        retried(("digits-mlp", "node-001", "failed"), ("digits-mlp", "node-001", "succeeded")),
        row("running", "digits-mlp", "node-001"),
    ]
    assert busiest(tasks, ["node-001", "node-003"]) == ("digits-mlp@1", "node-001")
    assert busiest(tasks, ["node-004"]) is None


def test_recent_tasks_read_the_window_and_a_retried_task_in_full() -> None:
    plain = row("succeeded")
    again = row("succeeded", attempts=2)
    busy = row("running", attempts=2)
    detail = {**again, "attempt_list": [attempt("digits-mlp", "node-003", "failed"),
                                        attempt("digits-mlp", "node-001", "succeeded")]}
    asked: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(request)
        if request.url.path == "/api/v1/ml/tasks":
            return httpx.Response(200, json={"items": [plain, again, busy], "total": 3,
                                             "limit": 500, "offset": 0})
        assert request.url.path == f"/api/v1/ml/tasks/{again['task_id']}"
        return httpx.Response(200, json=detail)

    http = httpx.Client(transport=httpx.MockTransport(answer), base_url="http://api")
    with ApiClient(ClientSettings(url="http://api"), http=http) as client:
        assert recent_tasks(client, window_s=30) == [plain, detail, busy]
    query = parse_qs(asked[0].url.query.decode())
    assert query["task_type"] == ["digits"]
    assert query["limit"] == ["500"]
    assert query["since"][0].endswith("+00:00")  # an aware UTC time, '+' kept
    assert len(asked) == 2
