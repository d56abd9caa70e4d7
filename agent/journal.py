"""The agent's persistent command journal (SQLite): what it did, and what it will not redo.

Replay protection only holds if it survives a restart: executed command ids with their
results, the last accepted seq and the highest epoch are written with synchronous=FULL, in
the same transaction as the node mode (or report interval) they change. A long action
(a migration) is journaled as accepted ("unknown", "in_progress") when it starts, and its row
is completed when it ends; one an agent restart interrupted ends as failed "interrupted".
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from pathlib import Path
from typing import cast
from uuid import UUID, uuid4

from agent.effects import IN_PROGRESS
from schemas.events.v1 import CommandResult, NodeMode
from schemas.events.v1.values import REPORT_CLOCK_SKEW_S

JOURNAL_FILE = "journal.sqlite3"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS commands (
    command_id  TEXT PRIMARY KEY,
    seq         INTEGER,
    epoch       INTEGER,
    action      TEXT,
    outcome     TEXT NOT NULL,
    reason      TEXT NOT NULL,
    result_json TEXT NOT NULL,
    recorded_at TEXT NOT NULL
);
-- Which seqs were accepted: an older seq within the window is taken once (agent/commands.py).
CREATE INDEX IF NOT EXISTS commands_seq ON commands (seq);
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS node (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    mode TEXT NOT NULL CHECK (mode IN ('active', 'draining', 'offline'))
);
CREATE TABLE IF NOT EXISTS config (
    key   TEXT PRIMARY KEY,
    value REAL NOT NULL
);
"""

_MODES: tuple[NodeMode, ...] = ("active", "draining", "offline")


# What a fencing epoch guards. Node actions (drain, offline, ...) share the node's fence; a
# job action fences only its job, so two tasks moving different jobs in and out of one node
# at once (each with its own epoch) do not make each other's commands look stale.
NODE_FENCE = "node"


def fence_key(fence: str) -> str:
    """The meta key of a fence's highest epoch (the node's keeps its original name)."""
    return "max_epoch" if fence == NODE_FENCE else f"max_epoch:{fence}"



@contextmanager
def immediate_transaction(db: sqlite3.Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE ... COMMIT on `db`, rolled back on any error."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")

class Journal:
    """One agent's journal; every write is one durable transaction."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE ... COMMIT).
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        # FULL: a commit is on disk before the result leaves, even if the machine dies.
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)

    @classmethod
    def open(cls, state_dir: Path) -> Journal:
        """The journal in an agent's state directory."""
        return cls(state_dir / JOURNAL_FILE)

    def close(self) -> None:
        self._db.close()

    # ------------------------------------------------------------ reads

    def _meta(self, key: str) -> int | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else int(row[0])

    @property
    def last_seq(self) -> int | None:
        """The seq of the last command that passed the seq and epoch checks."""
        return self._meta("last_seq")

    def seq_accepted(self, seq: int) -> bool:
        """Whether a command with this seq passed the checks before (a rejection does not
        count: its seq was never used)."""
        return self._db.execute(
            "SELECT 1 FROM commands WHERE seq = ? AND outcome != 'rejected' LIMIT 1", (seq,)
        ).fetchone() is not None

    @property
    def max_epoch(self) -> int | None:
        """The highest fencing epoch accepted so far for the node itself (its mode)."""
        return self._meta("max_epoch")

    def max_epoch_for(self, fence: str) -> int | None:
        """The highest fencing epoch accepted so far for one fenced target (see `fence_key`)."""
        return self._meta(fence_key(fence))

    @property
    def mode(self) -> NodeMode:
        row = self._db.execute("SELECT mode FROM node WHERE id = 1").fetchone()
        if row is None or row[0] not in _MODES:
            return "active"
        return cast(NodeMode, row[0])

    @property
    def interval_s(self) -> float | None:
        """The report interval the centre set, if it ever set one."""
        row = self._db.execute("SELECT value FROM config WHERE key = 'interval_s'").fetchone()
        return None if row is None else float(row[0])

    def cached_result(self, command_id: UUID) -> CommandResult | None:
        """The result recorded for `command_id`, if the command was ever seen."""
        row = self._db.execute(
            "SELECT result_json FROM commands WHERE command_id = ?", (str(command_id),)
        ).fetchone()
        return None if row is None else CommandResult.model_validate_json(row[0])

    def command_count(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM commands").fetchone()[0])

    # ------------------------------------------------------------ writes

    def record(
        self,
        result: CommandResult,
        *,
        seq: int | None,
        epoch: int | None,
        accepted: bool,
        mode: NodeMode | None = None,
        interval_s: float | None = None,
        fence: str = NODE_FENCE,
        now: datetime,
    ) -> bool:
        """Journal a result (advancing seq, and the epoch of `fence`, if `accepted`); False if
        already journaled."""
        # The first result is the one that counts: a later rejection of the same command id
        # (a replay after expiry, say) must never overwrite what was executed.
        with self._transaction():
            inserted = self._db.execute(
                "INSERT OR IGNORE INTO commands"
                " (command_id, seq, epoch, action, outcome, reason, result_json, recorded_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    str(result.command_id),
                    seq,
                    epoch,
                    result.action,
                    result.outcome,
                    result.reason,
                    result.model_dump_json(),
                    now.isoformat(),
                ),
            ).rowcount
            if not inserted:
                return False
            if accepted and seq is not None and epoch is not None:
                self._raise_meta("last_seq", seq)
                self._raise_meta(fence_key(fence), epoch)
            if mode is not None:
                self._set_mode(mode)
            if interval_s is not None:
                self._set_interval(interval_s)
        return True

    def complete(self, result: CommandResult) -> bool:
        """Replace a long action's in-progress mark by its result; False if it had none."""
        with self._transaction():
            updated = self._db.execute(
                "UPDATE commands SET outcome = ?, reason = ?, result_json = ?"
                " WHERE command_id = ? AND outcome = 'unknown' AND reason = ?",
                (result.outcome, result.reason, result.model_dump_json(),
                 str(result.command_id), IN_PROGRESS),
            ).rowcount
        return bool(updated)

    def in_progress(self) -> list[UUID]:
        """The long actions journaled as accepted and not finished."""
        rows = self._db.execute(
            "SELECT command_id FROM commands WHERE outcome = 'unknown' AND reason = ?",
            (IN_PROGRESS,),
        ).fetchall()
        return [UUID(row[0]) for row in rows]

    def interrupt_in_progress(self, now: datetime, reason: str = "interrupted") -> list[UUID]:
        """Fail every long action left in progress (by an agent that stopped or died)."""
        interrupted = []
        with self._transaction():
            rows = self._db.execute(
                "SELECT result_json FROM commands WHERE outcome = 'unknown' AND reason = ?",
                (IN_PROGRESS,),
            ).fetchall()
            for (body,) in rows:
                pending = CommandResult.model_validate_json(body)
                failed = pending.model_copy(
                    update={"event_id": uuid4(), "occurred_at": now, "outcome": "failed",
                            "reason": reason}
                )
                self._db.execute(
                    "UPDATE commands SET outcome = ?, reason = ?, result_json = ?"
                    " WHERE command_id = ?",
                    (failed.outcome, failed.reason, failed.model_dump_json(),
                     str(failed.command_id)),
                )
                interrupted.append(failed.command_id)
        return interrupted

    def set_mode(self, mode: NodeMode) -> None:
        """Set the node mode outside a command (operator tooling, tests)."""
        with self._transaction():
            self._set_mode(mode)

    def set_interval(self, interval_s: float) -> None:
        """Set the report interval outside a command (operator tooling, tests)."""
        with self._transaction():
            self._set_interval(interval_s)

    def next_report_seq(self, now_ms: int) -> int:
        """The next report seq: above the last one, and at least the wall clock in ms, but
        never further ahead of the clock than the collector believes (REPORT_CLOCK_SKEW_S)."""
        # The clock keeps seq rising if the journal file is lost; the stored value keeps it
        # rising if the clock steps back a little. After a clock that ran far ahead is set
        # right, a seq kept rising from the stored value would be refused as implausible
        # until the clock caught up; held to the clock's limit, at most one report is old.
        ahead_limit = now_ms + int(REPORT_CLOCK_SKEW_S * 1000)
        with self._transaction():
            last = self._meta("report_seq")
            seq = max(min(0 if last is None else last + 1, ahead_limit), now_ms)
            self._db.execute(
                "INSERT INTO meta (key, value) VALUES ('report_seq', ?)"
                " ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                (seq,),
            )
        return seq

    def _raise_meta(self, key: str, value: int) -> None:
        self._db.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?)"
            " ON CONFLICT(key) DO UPDATE SET value = max(value, excluded.value)",
            (key, value),
        )

    def _set_mode(self, mode: NodeMode) -> None:
        self._db.execute(
            "INSERT INTO node (id, mode) VALUES (1, ?)"
            " ON CONFLICT(id) DO UPDATE SET mode = excluded.mode",
            (mode,),
        )

    def _set_interval(self, interval_s: float) -> None:
        self._db.execute(
            "INSERT INTO config (key, value) VALUES ('interval_s', ?)"
            " ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (interval_s,),
        )

    def _transaction(self) -> AbstractContextManager[None]:
        return immediate_transaction(self._db)
