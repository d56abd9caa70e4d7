"""The text edits and checks every template save makes (pure; the save path on a real store
is in tests/service/store/test_template_versions.py, the endpoints in
tests/service/api/test_api_templates.py)."""

from __future__ import annotations

import pytest

from services.templater.templates import TEMPLATE_DIR
from services.templater.validation import (
    TemplateInvalid,
    check_set,
    check_text,
    unified_diff,
    with_parameter,
    with_version,
)

BUILT_IN = (TEMPLATE_DIR / "load_balance.yaml").read_text()


def test_the_version_line_is_set_and_the_rest_of_the_text_kept() -> None:
    bumped = with_version(BUILT_IN, 7)
    assert check_text(bumped).label == "load_balance.v7"
    assert bumped.replace("version: 7", "version: 1") == BUILT_IN
    with pytest.raises(TemplateInvalid) as caught:
        with_version("name: x\n", 2)
    assert caught.value.problems[0].field == "version"


def test_a_parameter_is_set_on_its_own_line_or_by_writing_the_document_again() -> None:
    block = "name: t\nparameters:\n  jobs: 2   # two at a time\n  other: 1\n"
    assert with_parameter(block, "jobs", 1) == block.replace("jobs: 2", "jobs: 1")
    flow = "name: t\nparameters: {jobs: 2, other: 1}\n"
    assert "jobs: 1" in with_parameter(flow, "jobs", 1)


def test_a_diff_names_both_versions_and_is_empty_for_equal_texts() -> None:
    changed = BUILT_IN.replace("jobs_per_run: 1", "jobs_per_run: 2")
    diff = unified_diff(BUILT_IN, changed, "load_balance.v1", "load_balance.v2")
    assert diff.startswith("--- load_balance.v1\n+++ load_balance.v2\n")
    assert "-  jobs_per_run: 1\n+  jobs_per_run: 2\n" in diff
    assert unified_diff(BUILT_IN, BUILT_IN, "a", "b") == ""


def test_a_set_is_checked_as_the_templater_loads_a_folder() -> None:
    texts = {p.stem: p.read_text() for p in TEMPLATE_DIR.glob("*.yaml")}
    assert set(check_set(texts)) == {"offline", "online", "scale_out", "scale_in",
                                     "load_balance", "restart_agent"}
    texts["balance_two"] = BUILT_IN.replace("name: load_balance", "name: balance_two")
    with pytest.raises(TemplateInvalid) as caught:
        check_set(texts)
    assert "a second template for need" in caught.value.problems[0].message
