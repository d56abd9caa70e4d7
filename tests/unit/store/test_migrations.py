"""Migrations build the schema the models describe, on an empty database of either engine."""

from __future__ import annotations

import asyncio

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection, inspect, text

from services.store.db import alembic_config, create_engine_for, migrate
from services.store.models import Base

TABLES = {"tasks", "steps", "transitions", "audit", "audit_head", "ml_tasks", "ml_attempts",
          "ml_events", "alerts", "capacity_plans", "template_versions", "template_state",
          "alembic_version"}


def _differences(connection: Connection) -> list[object]:
    context = MigrationContext.configure(connection, opts={"compare_type": True})
    return list(compare_metadata(context, Base.metadata))


async def test_migrations_apply_on_an_empty_database(database_url: str) -> None:
    await migrate(database_url)
    await migrate(database_url)  # again: nothing left to do
    engine = create_engine_for(database_url)
    try:
        async with engine.connect() as conn:
            tables = set(await conn.run_sync(lambda c: inspect(c).get_table_names()))
            assert tables == TABLES
            version = (await conn.execute(text("SELECT version_num FROM alembic_version"))
                       ).scalar_one()
            assert version == "0006"
            head = (await conn.execute(text("SELECT hash, count, mac FROM audit_head"))).one()
            assert tuple(head) == ("0" * 64, 0, None)  # a new log's head needs no MAC
            # The migrations and the models describe the same schema.
            assert await conn.run_sync(_differences) == []
    finally:
        await engine.dispose()


async def test_processes_migrating_at_once_leave_one_schema(database_url: str) -> None:
    await asyncio.gather(*(migrate(database_url) for _ in range(4)))
    engine = create_engine_for(database_url)
    try:
        async with engine.connect() as conn:
            assert await conn.run_sync(_differences) == []
    finally:
        await engine.dispose()


async def test_downgrade_to_nothing_and_up_again(database_url: str) -> None:
    await migrate(database_url)
    engine = create_engine_for(database_url)

    def downgrade(connection: Connection) -> None:
        config = alembic_config()
        config.attributes["connection"] = connection
        command.downgrade(config, "base")

    try:
        async with engine.begin() as conn:
            await conn.run_sync(downgrade)
        async with engine.connect() as conn:
            tables = set(await conn.run_sync(lambda c: inspect(c).get_table_names()))
            assert tables <= {"alembic_version"}
    finally:
        await engine.dispose()
    await migrate(database_url)
