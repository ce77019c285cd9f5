"""The audit rows of one patient's view, selected on the server (``Store.iter_audit_naming``):
the rows whose payload holds the pseudonym or no longer matches its hash, found with the
server's ``position`` and ``sha256`` so only those rows cross the network. One statement per
:data:`NAMING_SPAN` sequence numbers, so the store's connection is never held for long."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import psycopg

from ..._tier_records import AuditRow

__all__ = ["NAMING_SPAN", "rows_naming"]

#: sequence numbers one statement looks through
NAMING_SPAN = 50_000

_NAMING = (
    "SELECT seq, payload, event_hash FROM audit WHERE tenant = %s AND seq >= %s AND seq < %s"
    " AND (position(%s::bytea IN payload) > 0 OR encode(sha256(payload), 'hex') <> event_hash) ORDER BY seq"
)


def rows_naming(
    db: Callable[[], AbstractContextManager[psycopg.Connection[Any]]],
    tenant: str,
    needle: bytes,
    first: int,
    last: int,
) -> Iterator[AuditRow]:
    """The rows of ``tenant`` from seq ``first`` through ``last`` (the head when asked) that
    name ``needle`` or fail their hash, ascending; ``db`` gives the store's connection."""
    for seq in range(first, last + 1, NAMING_SPAN):
        with db() as conn:
            rows = conn.execute(_NAMING, (tenant, seq, seq + NAMING_SPAN, needle)).fetchall()
        yield from (AuditRow(int(r[0]), bytes(r[1]), r[2]) for r in rows)
