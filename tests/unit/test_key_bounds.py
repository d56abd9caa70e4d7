"""Every Redis key family of `Keys` has a documented bound (a TTL, a trim, one per node or
pool, removed when done), so none grows with traffic unnoticed (services/shared/redis_client.py
KEY_BOUNDS; the bounds on the real redis-server: tests/service/router/test_router.py and
tests/service/scheduler/test_queue_known.py)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from services.shared.redis_client import KEY_BOUNDS, Keys


def families() -> set[str]:
    return {name for name, member in inspect.getmembers(Keys, inspect.isfunction)
            if not name.startswith("_")}


def test_every_key_family_has_a_documented_bound() -> None:
    assert families() - KEY_BOUNDS.keys() == set(), "add the new family's bound to KEY_BOUNDS"


def test_no_bound_is_left_for_a_family_that_is_gone() -> None:
    assert KEY_BOUNDS.keys() - families() == set()


def test_every_bound_says_what_it_is() -> None:
    assert all(bound.why.strip() for bound in KEY_BOUNDS.values())


def test_no_key_family_is_built_outside_keys() -> None:
    """A key made by hand from the namespace's prefix escapes KEY_BOUNDS: every key comes from
    a `Keys` method."""
    root = Path(__file__).resolve().parents[2]
    by_hand = re.compile(r"keys\.prefix\}[A-Za-z]|keys\.prefix\s*\+")  # not a scan of all
    offenders = [f"{path.relative_to(root)}:{number}"
                 for folder in ("services", "agent", "common", "warden", "bench")
                 for path in sorted((root / folder).rglob("*.py"))
                 if path.name != "redis_client.py"
                 for number, line in enumerate(path.read_text().splitlines(), start=1)
                 if by_hand.search(line)]
    assert offenders == []
