"""The audit log's canonical form of an entry: stable, one line, read back as it was written
(pure; the hash-chained log on the real redis-server is in
tests/service/scheduler/test_audit.py)."""

from __future__ import annotations

from services.shared.audit import GENESIS, AuditEntry, canonical


def test_the_canonical_form_is_stable_and_escapes_control_characters() -> None:
    entry = AuditEntry(seq=1, at=1.5, actor="a", role="admin", action="x", target="t",
                       reason="line one\nFAKE line two", result="ok", prev=GENESIS)
    body = canonical(entry)
    assert b"\n" not in body
    assert body.startswith(b'{"action":"x","actor":"a","at":1.5,')
    assert canonical(AuditEntry.model_validate_json(body)) == body
