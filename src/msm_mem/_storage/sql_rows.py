"""The row digests of a SQL store (see :mod:`.row_digest`): kept in ``meta``, maintained by the
write path inside its transaction, recomputed from the rows for verification. A part of the
store (:class:`SqlRowDigests`), built over its tables. A store of several lanes
(:mod:`.lanes`) keeps them by lane: ``rows:<lane>:<table>`` instead of ``rows:<table>``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from .._errors import InvalidInput, StoreError
from .lanes import LaneDigest
from .row_digest import DIGEST_TABLES, RowDigest, TableDigest, empty, select_columns
from .sql_core import ID_CHUNK, PAGE, SqlTables

__all__ = ["UPGRADABLE", "SqlRowDigests", "initial_meta", "schema_problem"]

_PREFIX = "rows:"
#: store schemas :meth:`SqlRowDigests.upgrade_rows` brings to the current one
UPGRADABLE = frozenset({"1", "2"})


def schema_problem(found: str | None, current: str, upgrading: bool) -> str:
    """Why a store of schema ``found`` cannot be opened ("" when it can)."""
    if found == current or (upgrading and found in UPGRADABLE):
        return ""
    if found in UPGRADABLE:
        before = "before row digests" if found == "1" else "before tenants"
        return (
            f"store schema {found} was made by an older msm-mem ({before}); upgrade it once, as an"
            f" admin (audited): msm-mem store upgrade DIR (MsmMem.upgrade)"
        )
    return f"store schema {found!r} is not one this msm-mem reads (expected {current})"


def _key(lanes: int, lane: int, table: str) -> str:
    return f"{_PREFIX}{table}" if lanes == 1 else f"{_PREFIX}{lane}:{table}"


def initial_meta(lanes: int = 1) -> list[tuple[str, str]]:
    """The ``meta`` rows of a new store's digests (no rows yet), by lane in a store of several."""
    return [(_key(lanes, lane, t), d.meta_value()) for lane in range(lanes) for t, d in empty().items()]


class SqlRowDigests:
    """The key, the stored sums and the two ways of computing them."""

    def __init__(self, tables: SqlTables) -> None:
        self._t = tables
        self._row_key: bytes | None = None
        #: the writing thread and the digests its write in progress leaves (set by :meth:`save`
        #: inside the transaction, cleared by the writer when it ends (:meth:`forget_saved`);
        #: one writer at a time, and only its own thread is answered with them: SQLite's
        #: writer of audit rows alone does not hold the lock other threads read under)
        self._saved_digests: tuple[int, dict[int, dict[str, TableDigest]]] | None = None

    def use_row_key(self, key: bytes) -> None:
        """The key of the row digests (at least 32 bytes; the governed API derives it from the
        checkpoint signing key). Until it is given, every write is refused."""
        if not isinstance(key, bytes) or len(key) < 32:
            raise InvalidInput("a row digest key is at least 32 bytes")
        self._row_key = key

    def _digest_key(self) -> bytes:
        if self._row_key is None:
            raise StoreError("this store has no row digest key: call use_row_key first (MsmMem derives it)")
        return self._row_key

    def _stored_digests(self) -> dict[int, dict[str, TableDigest]]:
        """The sums ``meta`` holds, by lane (call inside the write transaction to read the latest)."""
        rows = dict(
            self._t.dialect.q(
                "SELECT key, value FROM meta WHERE tenant = ? AND substr(key, 1, 5) = 'rows:'", (self._t.tenant,)
            ).fetchall()
        )
        lanes = self._t.lanes
        missing = [
            _key(lanes, lane, t) for lane in range(lanes) for t in DIGEST_TABLES if _key(lanes, lane, t) not in rows
        ]
        if missing:
            raise StoreError(f"meta lacks the row digests {missing[:3]} (a store made before them: upgrade it)")
        return {
            lane: {t: TableDigest.from_meta(t, rows[_key(lanes, lane, t)]) for t in DIGEST_TABLES}
            for lane in range(lanes)
        }

    def row_digests(self) -> dict[str, TableDigest]:
        """The stored digests of every governed table (what the last commit left; inside a
        write's ``before_commit``, what that write saved, without reading them back); in a
        store of several lanes, :meth:`lane_digests`."""
        if self._t.lanes != 1:
            raise StoreError("a store of several lanes keeps its row digests by lane (lane_digests)")
        return self.lane_digests()[0]

    def lane_digests(self) -> dict[int, dict[str, TableDigest]]:
        """The stored digests by lane; inside a write's ``before_commit``, those of the lanes that
        write saved (every table of each), without reading them back."""
        with self._t.dialect.db():
            saved = self._saved_digests
            if saved is not None and saved[0] == threading.get_ident():
                return {lane: dict(d) for lane, d in saved[1].items()}
            return self._stored_digests()

    def begin(self, lanes: Sequence[int] = (0,)) -> RowDigest:
        """Inside a write transaction: the running sums, from what ``meta`` holds (in a store
        of several lanes, of the ``lanes`` the write locked)."""
        stored = self._stored_digests()
        if self._t.lanes == 1:
            return RowDigest(self._digest_key(), stored[0])
        return LaneDigest(self._digest_key(), self._t.lanes, {lane: stored[lane] for lane in lanes})

    def save(self, digest: RowDigest) -> None:
        """Inside the write transaction: store the sums of the tables the write changed."""
        lanes = self._t.lanes
        results = digest.lane_results() if isinstance(digest, LaneDigest) else {0: digest.result()}
        self._saved_digests = (threading.get_ident(), results)
        changed = digest.by_lane if isinstance(digest, LaneDigest) else {0: digest}
        for lane, result in sorted(results.items()):
            for table in sorted(changed[lane].changed):
                self._t.dialect.q(
                    "UPDATE meta SET value = ? WHERE tenant = ? AND key = ?",
                    (result[table].meta_value(), self._t.tenant, _key(lanes, lane, table)),
                )

    def forget_saved(self) -> None:
        """The write has committed or rolled back: ``meta`` holds the truth again."""
        self._saved_digests = None

    def _digest_rows(self, table: str, ids: Sequence[str]) -> list[Any]:
        """The digested columns of the rows of ``ids`` that exist (inside the transaction)."""
        found: list[Any] = []
        unique = list(dict.fromkeys(ids))
        for start in range(0, len(unique), ID_CHUNK):
            part = unique[start : start + ID_CHUNK]
            marks = ",".join("?" * len(part))
            found += self._t.dialect.q(
                f"SELECT {select_columns(table)} FROM {table} WHERE tenant = ? AND id IN ({marks})",
                (self._t.tenant, *part),
            ).fetchall()
        return found

    def track(
        self, digest: RowDigest, table: str, before: Sequence[str], after: Sequence[str] | None = None
    ) -> Callable[[], None]:
        """Uncount the rows ``before`` now; the returned call counts the rows ``after`` (default:
        the same ids) once the statement that changes them has run."""
        digest.remove(table, self._digest_rows(table, before))
        return lambda: digest.add(table, self._digest_rows(table, before if after is None else after))

    def computed_row_digests(self) -> dict[str, TableDigest]:
        """The digests recomputed from every stored row (a full read; verification); in a store
        of several lanes, :meth:`computed_lane_digests`."""
        if self._t.lanes != 1:
            raise StoreError("a store of several lanes keeps its row digests by lane (computed_lane_digests)")
        return self.computed_lane_digests()[0]

    def computed_lane_digests(self) -> dict[int, dict[str, TableDigest]]:
        """The digests recomputed from every stored row, by lane (every lane, 0 for a store of one)."""
        lanes = self._t.lanes
        empty_lanes = {lane: empty() for lane in range(lanes)}
        digest = RowDigest(self._digest_key()) if lanes == 1 else LaneDigest(self._digest_key(), lanes, empty_lanes)
        d = self._t.dialect
        for table in DIGEST_TABLES:
            after: tuple[str, ...] = ()  # the first page has no bound: a row with id '' counts too
            while True:
                where = " AND id > ?" if after else ""
                with d.db():
                    rows = d.q(
                        f"SELECT {select_columns(table)} FROM {table} WHERE tenant = ?{where} ORDER BY id LIMIT {PAGE}",
                        (self._t.tenant, *after),
                    ).fetchall()
                digest.add(table, rows)
                if len(rows) < PAGE:
                    break
                after = (rows[-1][self._id_at(table)],)
        if isinstance(digest, LaneDigest):
            return {lane: d.result() for lane, d in digest.by_lane.items()}
        return {0: digest.result()}

    @staticmethod
    def _id_at(table: str) -> int:
        return 1 if table in ("episodic", "visual") else 0
