"""What other connections changed of the tables a store caches: a mark that triggers keep.

An open store keeps caches beside its connection (the vector indexes' positions, decoded
semantic states and entities, consent records, data keys), and each must be emptied or
followed when another connection changes what it holds. SQLite's ``PRAGMA data_version``
says that another connection committed, not what: most such commits in a service are the
audit events of the other worker processes' reads, which change nothing cached. Following
every one of them re-read every vector position's scope and id, and reloaded consents and
keys, at every read of every worker.

So the store keeps a **change mark**: the ``changes`` row of ``meta``, replaced with a new
random value by triggers on every insert, update and delete of the cached tables
(:data:`CACHED_TABLES`), whoever writes (another process, the CLI, an older msm-mem: the
triggers live in the database). :meth:`ChangeMark.current` reads ``data_version`` (no I/O)
and reads the row again only when that changed; the caches compare the mark, so a commit that
wrote only audit rows changes nothing they hold. A random value rather than a counter: a
database restored from a copy never brings back a mark a cache was filled under.

A store without the row (one opened read-only before a writer installed the triggers) falls
back to ``data_version`` itself: every commit of another connection counts as a change.
"""

from __future__ import annotations

import sqlite3

__all__ = ["CACHED_TABLES", "MARK_KEY", "ChangeMark", "install"]

#: the tables whose rows an open store caches in some form (vectors, read cache, consents, keys)
CACHED_TABLES: tuple[str, ...] = ("episodic", "visual", "semantic", "entities", "consents", "keys", "pseudonyms")
#: the ``meta`` key of the mark
MARK_KEY = "changes"
_NEW = "lower(hex(randomblob(8)))"


def _triggers() -> list[str]:
    return [
        f"CREATE TRIGGER IF NOT EXISTS msm_changes_{table}_{event.lower()} AFTER {event} ON {table}"
        f" BEGIN UPDATE meta SET value = {_NEW} WHERE tenant = {row}.tenant AND key = '{MARK_KEY}'; END"
        for table in CACHED_TABLES
        for event, row in (("INSERT", "NEW"), ("UPDATE", "NEW"), ("DELETE", "OLD"))
    ]


def installed(conn: sqlite3.Connection, tenant: str) -> bool:
    """Whether the store has its mark row and every trigger (reads only)."""
    names = {f"msm_changes_{t}_{e}" for t in CACHED_TABLES for e in ("insert", "update", "delete")}
    found = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
    row = conn.execute("SELECT 1 FROM meta WHERE tenant = ? AND key = ?", (tenant, MARK_KEY)).fetchone()
    return row is not None and names <= found


def install(conn: sqlite3.Connection, tenant: str) -> None:
    """Create the mark row and the triggers where missing, in one transaction (the caller
    holds no transaction; a store made before them gets them on its first writable open)."""
    if installed(conn, tenant):
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        for statement in _triggers():
            conn.execute(statement)
        conn.execute(
            f"INSERT INTO meta (key, value, tenant) VALUES (?, {_NEW}, ?) ON CONFLICT (tenant, key) DO NOTHING",
            (MARK_KEY, tenant),
        )
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


class ChangeMark:
    """The generation of what other connections changed of the cached tables, for one
    connection (the caller holds its lock). Caches remember the generation they were filled
    under and empty themselves when it moved."""

    __slots__ = ("_conn", "_generation", "_tenant", "_value", "_version")

    def __init__(self, conn: sqlite3.Connection, tenant: str | None) -> None:
        """``tenant``: the store's; None for a store of schema 2 opened for its upgrade (no
        tenant column, no mark: every commit elsewhere counts as a change)."""
        self._conn = conn
        self._tenant = tenant
        self._version: int | None = None
        self._value: object = None
        self._generation = 0

    def _read(self) -> tuple[int, object]:
        version = int(self._conn.execute("PRAGMA data_version").fetchone()[0])
        row = None
        if self._tenant is not None:
            row = self._conn.execute(
                "SELECT value FROM meta WHERE tenant = ? AND key = ?", (self._tenant, MARK_KEY)
            ).fetchone()
        return version, (("data_version", version) if row is None else str(row[0]))

    def current(self) -> int:
        """The generation: it moves whenever another connection has committed a change to a
        cached table since the last call; one ``PRAGMA`` when nothing was committed since."""
        version = int(self._conn.execute("PRAGMA data_version").fetchone()[0])
        if version != self._version:
            version, value = self._read()
            if value != self._value:
                self._generation += 1
                self._value = value
            self._version = version
        return self._generation

    def seen(self) -> tuple[int, object]:
        """Inside this connection's write transaction, before its ``COMMIT``: what the database
        will say once it commits (no other connection can commit in between)."""
        return self._read()

    def committed(self, seen: tuple[int, object]) -> None:
        """After this connection's own commit (``seen`` from :meth:`seen`): its own changes do
        not move the generation (the caches followed them). Sound because the transaction
        called :meth:`current` after it began, so every earlier change of another connection
        had already moved it."""
        self._version, self._value = seen
