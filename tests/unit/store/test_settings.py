"""The database URL: DATABASE_URL, else a SQLite file in the state directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.store.settings import StoreSettings


def test_default_is_a_sqlite_file_in_the_state_dir(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setenv("WARDEN_STATE_DIR", str(tmp_path))
    assert StoreSettings().database_url == f"sqlite+aiosqlite:///{tmp_path}/warden.db"


def test_database_url_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    url = "postgresql+asyncpg://postgres@127.0.0.1:15432/warden"
    monkeypatch.setenv("DATABASE_URL", url)
    assert StoreSettings().database_url == url
