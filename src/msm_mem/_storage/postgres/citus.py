"""A store on a Citus cluster: made on the coordinator, its tables distributed at once.

``PostgresStore.create`` asks the server whether the ``citus`` extension is installed in the
database; when it is (a Citus coordinator), the new tables are distributed in the same
transaction that makes them, before any row is written (``schema.citus_ddl``, every table
colocated with ``meta``). Nothing is run by hand. Later tenants of the schema find
the tables distributed already. A patient's rows are distributed by the patient, the tenant's
own (``meta``, ``audit``, ``pseudonyms``) by the tenant (``schema.DISTRIBUTION``): a statement
naming a patient runs on that patient's shard, one naming only the tenant runs on every shard
and Citus merges the results (docs/deploy.md, Citus).
"""

from __future__ import annotations

from typing import Any

import psycopg

from .schema import citus_ddl

__all__ = ["distribute", "is_citus", "patient_distributed"]


def is_citus(conn: psycopg.Connection[Any]) -> bool:
    """Whether the database of ``conn`` has the citus extension (a Citus coordinator)."""
    return conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'citus'").fetchone() is not None


def distribute(conn: psycopg.Connection[Any]) -> None:
    """Distribute the store's new, empty tables (on the session's search path), inside the
    caller's transaction."""
    for statement in citus_ddl().splitlines():
        conn.execute(statement.encode())


def patient_distributed(conn: psycopg.Connection[Any]) -> frozenset[str]:
    """The tables of the session's store (on its search path) distributed by ``patient_id``:
    a row of these cannot change its patient in place (Citus refuses to update a distribution
    column). Empty on a server without Citus, and for a store distributed by ``tenant``."""
    if not is_citus(conn):
        return frozenset()
    rows = conn.execute(
        "SELECT c.relname FROM pg_dist_partition p JOIN pg_class c ON c.oid = p.logicalrelid"
        " WHERE c.relnamespace = to_regnamespace(current_schema())"
        " AND column_to_column_name(p.logicalrelid, p.partkey) = 'patient_id'"
    ).fetchall()
    return frozenset(str(name) for (name,) in rows)
