"""Task store settings (env prefix STORE_; the database URL is DATABASE_URL)."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, model_validator
from pydantic_settings import SettingsConfigDict

from common.settings import ServiceSettings

DATABASE_FILE = "warden.db"


def default_database_url(state_dir: str) -> str:
    """The embedded default: a SQLite file in the state directory (nothing to run)."""
    return f"sqlite+aiosqlite:///{Path(state_dir).resolve() / DATABASE_FILE}"


class StoreSettings(ServiceSettings):
    """Where the task store lives. `database_url` is always a full URL once made."""

    model_config = SettingsConfigDict(env_prefix="STORE_", extra="ignore", frozen=True)

    database_url: str = Field(
        default="",
        validation_alias=AliasChoices("DATABASE_URL", "database_url"),
        description="sqlite+aiosqlite:///<file> or postgresql+asyncpg://user@host:port/db; "
        "empty: <state_dir>/warden.db.",
    )

    @model_validator(mode="after")
    def _default_url(self) -> StoreSettings:
        if not self.database_url:
            # Frozen model: the default depends on state_dir, so it is filled in here, once,
            # and every reader of `database_url` sees the URL actually used.
            object.__setattr__(self, "database_url", default_database_url(self.state_dir))
        return self


class TaskStoreUser(ServiceSettings):
    """Settings of a service that reads or writes the task store beside its own work (the
    templater and the tuner: template versions): the same DATABASE_URL and default."""

    database_url: str = Field(
        default="", validation_alias=AliasChoices("DATABASE_URL", "database_url"),
        description="The task store; empty: <state_dir>/warden.db.")

    @model_validator(mode="after")
    def _default_url(self) -> TaskStoreUser:
        if not self.database_url:
            object.__setattr__(self, "database_url", default_database_url(self.state_dir))
        return self
