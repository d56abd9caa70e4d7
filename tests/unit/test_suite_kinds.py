"""The suite's own rules (tests/suite.py, tests/conftest.py), tried on small suites of their own:
a missing service fails the test that needs it, and a complete run (`--complete`, as `make test`
runs) fails when a kind ran nothing or a test was skipped."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

CONFTEST = """
from tests.conftest import chromium, kafka_bootstrap, redis_url  # noqa: F401
"""

EVERY_KIND = {
    "tests/unit/test_pure.py": "def test_pure():\n    assert 1 + 1 == 2\n",
    "tests/service/test_redis.py": "def test_redis(redis_url):\n    assert redis_url\n",
    "tests/integration/test_slice.py": "def test_slice(kafka_bootstrap, redis_url):\n"
                                       "    assert kafka_bootstrap\n",
    "tests/integration/test_page.py": "def test_page(chromium, kafka_bootstrap):\n"
                                      "    assert chromium\n",
}


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
          tmp_path_factory: pytest.TempPathFactory) -> pytest.Pytester:
    """An empty suite that loads this project's plugin, with every service "available"."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    browser = tmp_path_factory.mktemp("bin") / "chromium"
    browser.write_text("#!/bin/sh\n")
    browser.chmod(0o755)
    for variable, value in (("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1"),
                            ("REDIS_URL", "redis://127.0.0.1:1/0"),
                            ("CHROMIUM", str(browser))):
        monkeypatch.setenv(variable, value)
    pytester.makeconftest(CONFTEST)
    return pytester


def write(suite: pytest.Pytester, files: dict[str, str]) -> None:
    for name, body in files.items():
        path = suite.path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)


def run(suite: pytest.Pytester, *args: str) -> pytest.RunResult:
    return suite.runpytest_subprocess("-p", "tests.suite", "-p", "no:cacheprovider", *args)


def test_each_test_is_counted_under_its_kind_and_a_complete_run_passes(
        suite: pytest.Pytester) -> None:
    write(suite, EVERY_KIND)
    result = run(suite, "--complete")
    result.assert_outcomes(passed=4)
    result.stdout.re_match_lines([r"unit:\s+1 ran \(1 passed\)", r"service:\s+1 ran",
                                  r"integration:\s+2 ran", r"browser:\s+1 ran"])
    assert "INCOMPLETE" not in result.stdout.str()


def test_a_missing_service_fails_the_test_that_needs_it_instead_of_skipping_it(
        suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDIS_URL")
    write(suite, EVERY_KIND)
    result = run(suite)
    result.assert_outcomes(passed=2, errors=2)
    result.stdout.fnmatch_lines(["*redis-server is needed and REDIS_URL is not set*"])


def test_a_complete_run_fails_when_a_kind_ran_no_test(suite: pytest.Pytester) -> None:
    write(suite, {k: v for k, v in EVERY_KIND.items() if "page" not in k})
    result = run(suite, "--complete")
    result.assert_outcomes(passed=3)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["INCOMPLETE RUN: no browser test ran"])
    # Without --complete (a developer's partial run) the same suite passes.
    assert run(suite).ret == pytest.ExitCode.OK


def test_a_complete_run_fails_on_a_skip_or_xfail_without_a_reviewed_reason(
        suite: pytest.Pytester) -> None:
    write(suite, {**EVERY_KIND, "tests/unit/test_skips.py": (
        "import pytest\n"
        "def test_skipped():\n    pytest.skip('no time today')\n"
        "@pytest.mark.xfail(reason='known bug')\n"
        "def test_xfailed():\n    assert False\n")})
    result = run(suite, "--complete")
    result.assert_outcomes(passed=4, skipped=1, xfailed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([
        "INCOMPLETE RUN: skipped without a reviewed reason: *test_skipped (no time today)",
        "INCOMPLETE RUN: skipped without a reviewed reason: *test_xfailed (xfail: known bug)"])


def test_markers_select_the_pure_tests_and_the_summary_counts_what_was_left_out(
        suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("KAFKA_BOOTSTRAP_SERVERS", "REDIS_URL", "CHROMIUM"):
        monkeypatch.delenv(variable)
    write(suite, EVERY_KIND)
    result = run(suite, "-m", "unit")
    result.assert_outcomes(passed=1, deselected=3)
    result.stdout.re_match_lines([r"unit:\s+1 ran \(1 passed\)$",
                                  r"service:\s+0 ran \(0 passed\); 1 left out",
                                  r"integration:\s+0 ran \(0 passed\); 2 left out"])
