"""Alembic environment of the task store.

`services.store.db.migrate` runs the migrations on a connection it passes in (the usual
way); the Alembic command line works too, with an async engine on `sqlalchemy.url`.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import Connection

from services.store.db import create_engine_for
from services.store.models import Base

config = context.config
target_metadata = Base.metadata


def run_on(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot alter most of a table in place: later migrations copy the table.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


async def run_with_own_engine(url: str) -> None:
    engine = create_engine_for(url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(run_on)
    finally:
        await engine.dispose()


def main() -> None:
    if context.is_offline_mode():
        context.configure(url=config.get_main_option("sqlalchemy.url"),
                          target_metadata=target_metadata, literal_binds=True)
        with context.begin_transaction():
            context.run_migrations()
        return
    connection = config.attributes.get("connection")
    if connection is not None:
        run_on(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no connection given and no sqlalchemy.url set")
    asyncio.run(run_with_own_engine(url))


main()
