"""The alerts' tests use the task store's fixture: a migrated store on each engine."""

from tests.unit.store.conftest import store

__all__ = ["store"]
