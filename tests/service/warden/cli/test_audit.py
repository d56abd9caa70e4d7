"""`warden audit head`, `warden audit verify --head` and `warden audit key-head` through the
real API (in process)."""

from __future__ import annotations

from sqlalchemy import update

from services.store.db import Store
from services.store.models import AuditHead
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
    alone = warden.run("audit", "verify", role="admin")  # consistent, but the MAC is stale
    assert alone.exit_code == 1
    assert "log cut or head rewritten" in alone.output
    broken = warden.run("audit", "verify", "--head", anchor)
    assert broken.exit_code == 1
    assert "not in the chain" in broken.output
    bad = warden.run("audit", "verify", "--head", "abc")
    assert bad.exit_code == 2


async def unkey(store: Store) -> None:
    async with store.session() as session:
        await session.execute(update(AuditHead).values(mac=None))


def test_key_head_keys_a_checked_head_through_the_api(warden: Cli) -> None:
    _forbidden(warden, 2)
    warden.server.call(unkey, warden.runtime.store)  # a head from before the key
    unkeyed = warden.run("audit", "verify", role="admin")
    assert unkeyed.exit_code == 1
    assert "not keyed by the audit key" in unkeyed.output
    other = warden.run("audit", "key-head", "--head", "a" * 64, "--reason", "checked")
    assert other.exit_code == 1
    assert "the log moved on or was changed" in other.output
    # The refusal was audited, so the head to key is the one after it.
    checked, count = warden.run("audit", "head").output.split()
    keyed = warden.run("audit", "key-head", "--head", checked, "--reason", "checked it")
    assert keyed.exit_code == 0, keyed.output
    new_head, new_count = keyed.output.split()
    assert int(new_count) == int(count) + 1  # the keying, audited
    assert warden.run("audit", "verify", "--head", new_head).exit_code == 0
    assert warden.run("audit", "key-head", "--head", "abc", "--reason", "r").exit_code == 2
