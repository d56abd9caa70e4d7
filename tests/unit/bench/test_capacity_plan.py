"""The capacity-plan backtest's quick mode runs on the real traces and scores both methods."""

from __future__ import annotations

from typing import Any, cast

from bench.capacity_plan import run


def test_the_quick_backtest_scores_the_plan_and_persistence_on_both_traces() -> None:
    results = cast(list[dict[str, Any]], run(quick=True)["results"])
    assert [r["series"] for r in results] == ["philly", "titan"]
    for result in results:
        assert result["origins"] == 2
        for method in ("plan", "persistence"):
            scores = result[method]
            assert scores, f"{result['series']} {method}: nothing scored"
            for row in scores.values():
                assert row["n"] == 2
                assert row["mae"] >= 0.0
                assert 0.0 <= row["coverage_80"] <= 1.0
                assert 0.0 <= row["coverage_95"] <= 1.0
