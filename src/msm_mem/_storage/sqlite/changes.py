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

A second mark, ``vectors_moved``, follows updates and deletes of vector rows (episodic,
visual): a position's scope or id may have changed. Its value is a random epoch and a ``|``,
then one ``e<pos>,`` or ``v<pos>,`` per row updated since; a delete, an update that moves a
row's position, or a value grown past :data:`MOVED_LIMIT` characters starts a new epoch. A
handle whose last value is a prefix of the current one re-reads only the positions named after
it (and the rows appended past its index's end, which write-back adds); any other change of
epoch re-reads the scope and id of every position.

A store without the rows (one opened read-only before a writer installed the triggers) falls
back to ``data_version`` itself: every commit of another connection counts as a change of both.
"""

from __future__ import annotations

import sqlite3

__all__ = ["CACHED_TABLES", "MARK_KEY", "MOVED_KEY", "MOVED_LIMIT", "ChangeMark", "install", "moved_positions"]

#: the tables whose rows an open store caches in some form (vectors, read cache, consents, keys)
CACHED_TABLES: tuple[str, ...] = ("episodic", "visual", "semantic", "entities", "consents", "keys", "pseudonyms")
#: the ``meta`` keys of the marks: any change of a cached table; an update or delete of a vector row
MARK_KEY = "changes"
MOVED_KEY = "vectors_moved"
_VECTOR_TABLES = ("episodic", "visual")
_EVENTS = (("INSERT", "NEW"), ("UPDATE", "NEW"), ("DELETE", "OLD"))
_NEW = "lower(hex(randomblob(8)))"


#: past this many characters the moved mark starts a new epoch (its followers re-read everything)
MOVED_LIMIT = 16384
_EPOCH = f"{_NEW} || '|'"


def _moved(table: str, event: str) -> str:
    """The new value of the moved mark after one row of a vector table changed."""
    if event == "DELETE":
        return _EPOCH
    tag = table[0]  # "e" (episodic) or "v" (visual)
    return (
        f"CASE WHEN length(value) > {MOVED_LIMIT} OR OLD.pos IS NOT NEW.pos THEN {_EPOCH}"
        f" ELSE value || '{tag}' || NEW.pos || ',' END"
    )


def _triggers() -> list[str]:
    out = []
    for table in CACHED_TABLES:
        for event, row in _EVENTS:
            sets = [(MARK_KEY, _NEW)]
            if table in _VECTOR_TABLES and event != "INSERT":
                sets.append((MOVED_KEY, _moved(table, event)))
            body = " ".join(
                f"UPDATE meta SET value = {value} WHERE tenant = {row}.tenant AND key = '{key}';" for key, value in sets
            )
            name = f"msm_changes_{table}_{event.lower()}"
            out.append(f"CREATE TRIGGER IF NOT EXISTS {name} AFTER {event} ON {table} BEGIN {body} END")
    return out


def moved_positions(seen: object, now: object) -> dict[str, list[int]] | None:
    """The positions of each vector table (``episodic``, ``visual``) updated between two values
    of the moved mark, ``seen`` then ``now``; None when that cannot be told (another epoch, no
    mark, or a value not of the triggers' form), so every position must be read again."""
    if not isinstance(seen, str) or not isinstance(now, str) or not now.startswith(seen) or "|" not in seen:
        return None
    out: dict[str, list[int]] = {"episodic": [], "visual": []}
    tables = {"e": "episodic", "v": "visual"}
    for item in now[len(seen) :].split(","):
        if not item:
            continue
        if item[0] not in tables or not (item[1:].isascii() and item[1:].isdigit()):
            return None
        out[tables[item[0]]].append(int(item[1:]))
    return out


def installed(conn: sqlite3.Connection, tenant: str) -> bool:
    """Whether the store has its mark rows and every trigger (reads only)."""
    names = {f"msm_changes_{t}_{e.lower()}" for t in CACHED_TABLES for e, _ in _EVENTS}
    found = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
    rows = conn.execute(
        "SELECT count(*) FROM meta WHERE tenant = ? AND key IN (?, ?)", (tenant, MARK_KEY, MOVED_KEY)
    ).fetchone()
    return int(rows[0]) == 2 and names <= found


def install(conn: sqlite3.Connection, tenant: str) -> None:
    """Create the mark row and the triggers where missing, in one transaction (the caller
    holds no transaction; a store made before them gets them on its first writable open)."""
    if installed(conn, tenant):
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        for statement in _triggers():
            conn.execute(statement)
        for key, value in ((MARK_KEY, _NEW), (MOVED_KEY, _EPOCH)):
            conn.execute(
                f"INSERT INTO meta (key, value, tenant) VALUES (?, {value}, ?) ON CONFLICT (tenant, key) DO NOTHING",
                (key, tenant),
            )
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


class ChangeMark:
    """The generation of what other connections changed of the cached tables, and the moved
    mark of the vector rows, for one connection (the caller holds its lock). Caches remember
    the generation they were filled under and empty themselves when it moved."""

    __slots__ = ("_conn", "_generation", "_moved", "_tenant", "_value", "_version")

    def __init__(self, conn: sqlite3.Connection, tenant: str | None) -> None:
        """``tenant``: the store's; None for a store of schema 2 opened for its upgrade (no
        tenant column, no mark: every commit elsewhere counts as a change)."""
        self._conn = conn
        self._tenant = tenant
        self._version: int | None = None
        self._value: object = None
        self._moved: object = None
        self._generation = 0

    def _version_now(self) -> int:
        return int(self._conn.execute("PRAGMA data_version").fetchone()[0])

    def _read(self, version: int) -> tuple[int, object, object]:
        found: dict[str, str] = {}
        if self._tenant is not None:
            rows = self._conn.execute(
                "SELECT key, value FROM meta WHERE tenant = ? AND key IN (?, ?)", (self._tenant, MARK_KEY, MOVED_KEY)
            )
            found = {str(k): str(v) for k, v in rows}
        if len(found) < 2:  # no marks (yet): every commit elsewhere changes everything
            return version, ("data_version", version), ("data_version", version)
        return version, found[MARK_KEY], found[MOVED_KEY]

    def current(self) -> int:
        """The generation: it moves whenever another connection has committed a change to a
        cached table since the last call; one ``PRAGMA`` when nothing was committed since."""
        version = self._version_now()
        if version != self._version:
            self._take(self._read(version))
        return self._generation

    def moved(self) -> object:
        """The moved mark as :meth:`current` last read it (call that first); compare two with
        :func:`moved_positions`."""
        return self._moved

    def _take(self, seen: tuple[int, object, object]) -> None:
        version, value, self._moved = seen
        if value != self._value:
            self._generation += 1
            self._value = value
        self._version = version

    def seen(self) -> tuple[int, object, object]:
        """Inside this connection's write transaction, before its ``COMMIT``: what the database
        will say once it commits (no other connection can commit in between)."""
        return self._read(self._version_now())

    def committed(self, seen: tuple[int, object, object]) -> None:
        """After this connection's own commit (``seen`` from :meth:`seen`): its own changes do
        not move the generation (the caches followed them). Sound because the transaction
        called :meth:`current` after it began, so every earlier change of another connection
        had already moved it. (The vector index reads its own updated positions once more at
        its next follow: the moved mark names them too.)"""
        self._version, self._value, self._moved = seen
