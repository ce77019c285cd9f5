"""A write transaction of the server store in psycopg's pipeline mode: statements are sent as
they come, and the client waits for the server only where it needs an answer.

Inside :meth:`~msm_mem._storage.postgres.connection.PgDialect.transaction` every statement
is queued on the connection's pipeline: the inserts and updates of a batch (``executemany``
rides the same pipeline) cost no round trip of their own; a read (``fetchone``, ``fetchall``)
flushes what is queued and waits for its rows; :class:`Pending` makes ``rowcount`` wait for
its statement too; the end of the pipeline (a sync) waits for every statement before the
``COMMIT`` is sent, so an error of any statement is raised before anything commits and rolls
the whole transaction back, as without a pipeline. Where the shared write path needs an error
raised at its statement (a refused insert it reports as another error), it calls
the dialect's ``flush`` (:meth:`~msm_mem._storage.sql_core.Dialect.flush`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg

__all__ = ["Pending"]


class Pending:
    """The cursor of a statement queued on a pipeline (the ``Rows`` of the SQL store's ``_q``)."""

    __slots__ = ("_cur", "_pipe")

    def __init__(self, cur: psycopg.Cursor[Any], pipe: psycopg.Pipeline) -> None:
        self._cur = cur
        self._pipe = pipe

    @property
    def rowcount(self) -> int:
        self._pipe.sync()  # the statement's result has arrived after the sync
        return self._cur.rowcount

    def fetchone(self) -> Any:
        return self._cur.fetchone()

    def fetchall(self) -> list[Any]:
        return self._cur.fetchall()

    def __iter__(self) -> Iterator[Any]:
        return iter(self._cur)
