"""`warden maintenance` against the real API (in process) and its Redis."""

from __future__ import annotations

from tests.service.warden.cli.conftest import Cli


def test_maintenance_of_a_node_starts_is_listed_and_ends(warden: Cli) -> None:
    started = warden.run("maintenance", "start", "--cluster", "c1", "--node", "node-002",
                         "--reason", "replace the PSU", role="operator")
    assert started.exit_code == 0, started.output
    assert "maintenance started: c1" in started.output
    assert "node node-002" in started.output
    listed = warden.run("maintenance", "list", role="viewer")
    assert "replace the PSU" in listed.output
    again = warden.run("maintenance", "start", "--cluster", "c1", "--node", "node-002",
                       "--reason", "again", role="operator")
    assert again.exit_code == 1
    assert "error (409)" in again.output
    ended = warden.run("maintenance", "end", "--cluster", "c1", "--node", "node-002",
                       "--reason", "PSU in", role="operator")
    assert ended.exit_code == 0, ended.output
    assert "no maintenance in force" in warden.run("maintenance", "list").output


def test_a_viewer_cannot_start_maintenance(warden: Cli) -> None:
    result = warden.run("maintenance", "start", "--cluster", "c1", "--reason", "x",
                        role="viewer")
    assert result.exit_code == 1
    assert "error (403)" in result.output
