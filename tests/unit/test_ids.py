"""The derived-id namespaces: one table (schemas/ids.py), values that never change."""

from __future__ import annotations

import re
from pathlib import Path
from uuid import UUID

from schemas import ids

ROOT = Path(__file__).resolve().parents[2]

# The values every derived id already stored or in flight was made with: changing one would
# make a redelivered event a new one to every deduplicating consumer.
PINNED = {
    "COLLECTOR": "89ebaab6-bfa6-524b-a629-218a08260cd4",
    "POOL_HEALTH": "5f2a14ac-312e-5843-9581-d5821a44c9b8",
    "NEEDS_OFFLINE": "f5a9bd74-8112-5a7d-b2c6-716b4ef08a9d",
    "NEEDS_ONLINE": "3b469013-6be8-53b4-a15a-7a6a359f8a7b",
    "NEEDS_SCALE": "a38d5432-cf16-5a91-89ca-e0760aa26a5d",
    "NEEDS_LOAD_BALANCE": "2b2cd916-ae83-5ad0-b318-3281cd94a437",
    "NEEDS_RESTART_AGENT": "6b735c07-ddda-5b09-8547-bade0a78c3d5",
    "TEMPLATER_TASKS": "30867243-c4cb-5def-ae10-342ef7ac69c6",
    "TASK_EVENTS": "5f07ca15-a4c7-5773-8200-5c84eb4f8870",
    "EXECUTOR": "2cb407d5-1491-5488-b53f-7804cc37a6ce",
    "CENTRE_CHILDREN": "58b2094a-9620-5e4d-8ab4-7053b3b8fafc",
    "BREAKER_ALERTS": "22d77bbc-a43d-598c-aa41-228d08e421c4",
    "BREAKER_RESETS": "f9e7370b-8117-5efd-999d-53f72841d19e",
    "ML_ROUTING": "100bf966-254b-5ac4-8ebc-167f0a09c5ea",
    "SHORT_CIRCUIT_ENDS": "7606ab7b-a916-5aee-acc4-59c4dcdfa017",
}


def table() -> dict[str, UUID]:
    namespaces = {name: getattr(ids, name) for name in ids.__all__}
    assert all(isinstance(value, UUID) for value in namespaces.values())
    return namespaces


def test_the_table_lists_every_namespace_of_the_module() -> None:
    assert set(table()) == {name for name, value in vars(ids).items()
                            if isinstance(value, UUID) and not name.startswith("NAMESPACE_")}


def test_every_namespace_keeps_its_value() -> None:
    assert {name: str(value) for name, value in table().items()} == PINNED


def test_namespaces_are_distinct() -> None:
    assert len(set(table().values())) == len(table())


def test_no_module_makes_a_namespace_of_its_own() -> None:
    made_here = re.compile(r"uuid5\(\s*NAMESPACE_|NAMESPACE_(URL|DNS|OID|X500)\b")
    for package in ("schemas", "common", "services", "agent"):
        for path in (ROOT / package).rglob("*.py"):
            if path == ROOT / "schemas" / "ids.py":
                continue
            assert not made_here.search(path.read_text()), f"{path}: use schemas.ids"
