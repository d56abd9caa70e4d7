"""Pure: the audit table's hash chain, h_i = SHA-256(h_{i-1} || canonical entry_i), and its
keyed head.

The same chain rule, genesis and hash function as the scheduler's Redis audit stream
(services/shared/audit.py); the entry differs (it carries a JSON detail and an ISO time).
The table's `id` is not hashed: PostgreSQL sequences may skip numbers, and the order is
proven by each entry naming its predecessor's hash.

The head row (last hash, count) carries a MAC under the audit key as the stream's head does
(`head_mac` with `CHAIN`, moved in the same transaction as each append), so whoever can write
the store but does not hold the key cannot cut the tail off and rewrite the head to match.
What it does not protect against is the same as there: a holder of the key, and a rollback
to an older keyed head, which only a head exported and kept apart (an anchor) reveals.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from services.shared.audit import GENESIS, chain_hash

__all__ = ["CHAIN", "GENESIS", "Link", "canonical_entry", "chain_hash", "check_link",
           "json_detail"]

# What the table's head MAC names as its log, unlike the stream's (its Redis key): a head keyed
# for one of the two is not one for the other.
CHAIN = "store:audit"


@dataclass(frozen=True)
class Link:
    """An entry as stored, with the hashes that place it in the chain."""

    id: int
    at: datetime
    actor: str
    role: str
    action: str
    target: str
    reason: str
    result: str
    detail: Mapping[str, Any]
    prev_hash: str
    hash: str


def json_detail(detail: Mapping[str, Any] | None) -> dict[str, Any]:
    """`detail` as plain JSON values (what the database hands back), or ValueError."""
    try:
        plain = json.loads(json.dumps(dict(detail or {}), allow_nan=False))
    except TypeError as err:
        raise ValueError(f"audit detail is not JSON: {err}") from err
    if not isinstance(plain, dict):  # pragma: no cover - a dict dumps to an object
        raise ValueError("audit detail must be a JSON object")
    return plain


def canonical_entry(*, at: datetime, actor: str, role: str, action: str, target: str,
                    reason: str, result: str, detail: Mapping[str, Any],
                    prev_hash: str) -> bytes:
    """The exact bytes hashed: sorted keys, no spaces, ASCII only, the time in UTC ISO.

    ASCII escaping also keeps control characters in a reason from forging lines in any log
    an entry is printed to.
    """
    return json.dumps({
        "at": at.astimezone(UTC).isoformat(timespec="microseconds"),
        "actor": actor, "role": role, "action": action, "target": target,
        "reason": reason, "result": result, "detail": detail, "prev_hash": prev_hash,
    }, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def check_link(running: str, link: Link) -> str:
    """Why `link` does not follow the chain whose last hash is `running` ("" if it does)."""
    if link.prev_hash != running:
        return (f"entry {link.id} does not follow the entry before it: removed or "
                "reordered entries")
    body = canonical_entry(at=link.at, actor=link.actor, role=link.role, action=link.action,
                           target=link.target, reason=link.reason, result=link.result,
                           detail=link.detail, prev_hash=link.prev_hash)
    if chain_hash(running, body) != link.hash:
        return f"entry {link.id} was changed"
    return ""
