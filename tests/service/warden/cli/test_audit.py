"""`warden audit head` and `warden audit verify --head` through the real API (in process)."""

from __future__ import annotations

from tests.service.api.test_api_audit import cut_the_tail
from tests.service.warden.cli.conftest import Cli


def _forbidden(warden: Cli, count: int) -> None:
    for _ in range(count):
        assert warden.run("audit", "head", role="viewer").exit_code == 1


def test_verify_against_an_exported_head_finds_a_cut_off_tail(warden: Cli) -> None:
    _forbidden(warden, 4)  # four 403s: four audit entries
    head = warden.run("audit", "head", role="admin")
    assert head.exit_code == 0, head.output
    anchor, count = head.output.split()
    assert count == "4"
    ok = warden.run("audit", "verify", "--head", anchor)
    assert ok.exit_code == 0, ok.output
    assert "intact" in ok.output
    _forbidden(warden, 1)

    warden.server.call(cut_the_tail, warden.runtime.store, 2)
    assert warden.run("audit", "verify", role="admin").exit_code == 0  # consistent alone
    broken = warden.run("audit", "verify", "--head", anchor)
    assert broken.exit_code == 1
    assert "not in the chain" in broken.output
    bad = warden.run("audit", "verify", "--head", "abc")
    assert bad.exit_code == 2
