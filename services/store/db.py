"""Engines, sessions and schema migrations of the task store (SQLite or PostgreSQL)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final, TypeVar

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, event, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from common.errors import InfrastructureUnavailable
from common.observability import instrument_engine

log = logging.getLogger("clusterwarden.store")
T = TypeVar("T")

MIGRATIONS_DIR: Final = Path(__file__).resolve().parent / "migrations"
# Any constant will do; every process that migrates uses the same one.
_PG_MIGRATION_LOCK: Final = 0x5741_5244_454E  # "WARDEN" in ASCII
# How long a SQLite writer waits for another's lock before failing ("database is locked"):
# the recorder and the API write to the same file.
SQLITE_BUSY_TIMEOUT_S: Final = 30.0


def is_unavailable(err: BaseException) -> bool:
    """True if `err` says the database cannot be reached or is busy, not that a query is bad.

    OperationalError covers a refused or cut connection and SQLite's "database is locked";
    an OSError can come straight from the driver's connect.
    """
    if isinstance(err, sa_exc.DBAPIError) and err.connection_invalidated:
        return True
    return isinstance(err, (sa_exc.OperationalError, sa_exc.InterfaceError,
                            sa_exc.DisconnectionError, sa_exc.TimeoutError, OSError))


async def fail_closed(work: Awaitable[T]) -> T:
    """`work`, with an unreachable or busy database raised as InfrastructureUnavailable: a
    consumer then leaves its message uncommitted, delivered again once the database is back
    (any other error is the message's own and goes on as it is)."""
    try:
        return await work
    except Exception as err:
        if is_unavailable(err):
            raise InfrastructureUnavailable(f"task store: {err!r}"[:500]) from err
        raise


def create_engine_for(url: str) -> AsyncEngine:
    """An async engine with the settings each database needs (see the comments)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        # A pooled connection may have been cut by a server restart; check before use.
        return create_async_engine(url, pool_pre_ping=True)
    database = parsed.database or ""
    in_memory = database in ("", ":memory:") or database.startswith("file::memory:")
    if not in_memory:
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_async_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S})

    @event.listens_for(engine.sync_engine, "connect")
    def _pragmas(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        # SQLite leaves foreign keys unchecked unless asked, per connection.
        cursor.execute("PRAGMA foreign_keys=ON")
        if not in_memory:
            # WAL: the API reads while the recorder writes, without either waiting.
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    return engine


class Store:
    """The task store's engine and a session factory."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)

    @asynccontextmanager
    async def session(self) -> AsyncIterator[AsyncSession]:
        """One unit of work: committed when the block ends, rolled back if it raises."""
        async with self._sessions() as session, session.begin():
            yield session

    async def close(self) -> None:
        await self.engine.dispose()


def open_store(url: str) -> Store:
    """A store on `url` (no connection is made until first use; run `migrate` first), its
    queries traced and its connections measured in a service (common/observability.py)."""
    store = Store(create_engine_for(url))
    instrument_engine(store.engine)
    return store


def alembic_config(url: str | None = None) -> Config:
    """Alembic's configuration, without an ini file: the scripts ship inside the package."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        # Config values go through ConfigParser interpolation: a '%' in a password must be
        # doubled.
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def _upgrade(connection: Connection, revision: str) -> None:
    config = alembic_config()
    # env.py runs the migrations on this connection, inside our transaction.
    config.attributes["connection"] = connection
    command.upgrade(config, revision)


async def migrate(url: str, revision: str = "head") -> None:
    """Bring the schema at `url` up to `revision`; safe to run from several processes at once.

    The first process takes a lock for the whole migration (PostgreSQL: an advisory lock;
    SQLite: the write lock) and the others wait for it, then find nothing left to do.
    """
    engine = create_engine_for(url)
    try:
        async with engine.connect() as conn:
            if conn.dialect.name == "sqlite":
                # The write lock at once; a plain BEGIN would read the schema version first
                # and race another process to create the tables.
                await conn.exec_driver_sql("BEGIN IMMEDIATE")
            elif conn.dialect.name == "postgresql":
                await conn.execute(text("SELECT pg_advisory_xact_lock(:key)"),
                                   {"key": _PG_MIGRATION_LOCK})
            await conn.run_sync(_upgrade, revision)
            await conn.commit()
    finally:
        await engine.dispose()
    log.info("task store schema at %s on %s", revision,
             make_url(url).render_as_string(hide_password=True))
