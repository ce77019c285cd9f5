"""The row digests of a SQL store (see :mod:`.row_digest`): kept in ``meta``, maintained by the
write path inside its transaction, recomputed from the rows for verification. A part of the
store (:class:`SqlRowDigests`), built over its tables."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from .._errors import InvalidInput, StoreError
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


def initial_meta() -> list[tuple[str, str]]:
    """The ``meta`` rows of a new store's digests (no rows yet)."""
    return [(_PREFIX + t, d.meta_value()) for t, d in empty().items()]


class SqlRowDigests:
    """The key, the stored sums and the two ways of computing them."""

    def __init__(self, tables: SqlTables) -> None:
        self._t = tables
        self._row_key: bytes | None = None
        #: the writing thread and the digests its write in progress leaves (set by :meth:`save`
        #: inside the transaction, cleared by the writer when it ends (:meth:`forget_saved`);
        #: one writer at a time, and only its own thread is answered with them: SQLite's
        #: writer of audit rows alone does not hold the lock other threads read under)
        self._saved_digests: tuple[int, dict[str, TableDigest]] | None = None

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

    def _stored_digests(self) -> dict[str, TableDigest]:
        """The sums ``meta`` holds (call inside the write transaction to read the latest)."""
        rows = dict(
            self._t.dialect.q(
                "SELECT key, value FROM meta WHERE tenant = ? AND substr(key, 1, 5) = 'rows:'", (self._t.tenant,)
            ).fetchall()
        )
        missing = [t for t in DIGEST_TABLES if _PREFIX + t not in rows]
        if missing:
            raise StoreError(f"meta lacks the row digests of {missing} (a store made before them: upgrade it)")
        return {t: TableDigest.from_meta(t, rows[_PREFIX + t]) for t in DIGEST_TABLES}

    def row_digests(self) -> dict[str, TableDigest]:
        """The stored digests of every governed table (what the last commit left; inside a
        write's ``before_commit``, what that write saved, without reading them back)."""
        with self._t.dialect.db():
            saved = self._saved_digests
            if saved is not None and saved[0] == threading.get_ident():
                return dict(saved[1])
            return self._stored_digests()

    def begin(self) -> RowDigest:
        """Inside a write transaction: the running sums, from what ``meta`` holds."""
        return RowDigest(self._digest_key(), self._stored_digests())

    def save(self, digest: RowDigest) -> None:
        """Inside the write transaction: store the sums of the tables the write changed."""
        result = digest.result()
        self._saved_digests = (threading.get_ident(), result)
        for table in sorted(digest.changed):
            self._t.dialect.q(
                "UPDATE meta SET value = ? WHERE tenant = ? AND key = ?",
                (result[table].meta_value(), self._t.tenant, _PREFIX + table),
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
        """The digests recomputed from every stored row (a full read; verification)."""
        digest = RowDigest(self._digest_key())
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
        return digest.result()

    @staticmethod
    def _id_at(table: str) -> int:
        return 1 if table in ("episodic", "visual") else 0
