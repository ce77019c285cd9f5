"""Keeping the server's table statistics up with a store that grows faster than autovacuum.

psycopg prepares a statement on the server after a few executions, and the server then keeps
one generic plan for it, costed with the table statistics of that moment: that saves parsing
and planning every later execution (tens of microseconds each on a small CPU, several times a
turn). A store's tables start empty, so the plans kept from its first turns were costed for
empty tables: a patient's search would read every row of the grown table through an index,
its cost growing with the table instead of the patient's rows, until the next ANALYZE.
Autovacuum runs one eventually (its naptime is a minute), but a busy store can multiply its
rows many times within that minute.

So a store checks, after the commit that brings the statements and rows it wrote inside
transactions since its last check to :data:`CHECK_EVERY` (about a hundred turns), which
tables of its schema have had at least as many rows inserted, updated or deleted since their
last ANALYZE as they held then (never fewer than :data:`MIN_CHANGED`), and analyzes those. A
table is analyzed each time it doubles: a few times in its life, each a sampled read of at
most 30,000 rows. An ANALYZE changes the table's statistics, which makes every session drop
the plans it kept for that table and cost them again with the new figures.

Planning every execution instead (``plan_cache_mode = force_custom_plan``, or sending the
searches unprepared) would pay the planner on every statement of every request, also where the
tables do not grow (a service's reads), so the statements stay prepared.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

__all__ = ["CHECK_EVERY", "MIN_CHANGED", "analyze_grown"]

CHECK_EVERY = 1000
MIN_CHANGED = 200

_GROWN = (
    "SELECT s.relname FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid"
    " WHERE s.schemaname = %s AND s.n_mod_since_analyze >= GREATEST(%s, c.reltuples)"
    " ORDER BY s.relname"
)


def analyze_grown(conn: psycopg.Connection[Any], schema: str) -> list[str]:
    """ANALYZE the tables of ``schema`` whose rows changed by at least as many as they held at
    their last ANALYZE (:data:`MIN_CHANGED` at least); returns the names of those it asked for.

    ``conn`` is an autocommit connection outside any transaction. The server reports a
    session's row counts at most once a second; this session's own are reported first. A
    table being analyzed or vacuumed by another session at that moment is skipped (its
    statistics are being renewed already), as is, with a warning from the server, a table the
    role may not analyze."""
    if conn.info.server_version >= 150000:  # (pg_stat_force_next_flush is new in PostgreSQL 15)
        conn.execute("SELECT pg_stat_force_next_flush()")
    grown = [row[0] for row in conn.execute(_GROWN, (schema, MIN_CHANGED)).fetchall()]
    for table in grown:
        conn.execute(sql.SQL("ANALYZE (SKIP_LOCKED) {}.{}").format(sql.Identifier(schema), sql.Identifier(table)))
    return grown


def analyze_erased(conn: psycopg.Connection[Any], schema: str, tables: list[str]) -> None:
    """ANALYZE ``tables`` of ``schema`` after an erasure committed: the planner's statistics
    (``pg_statistic``: most common values, histogram bounds) are sampled from rows, so values of
    the erased patient's rows may stand there until the next ANALYZE; this one samples the rows
    left. ``conn`` as for :func:`analyze_grown`."""
    for table in tables:
        conn.execute(sql.SQL("ANALYZE {}.{}").format(sql.Identifier(schema), sql.Identifier(table)))
