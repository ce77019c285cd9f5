"""Group commit of audit-only writes: the audit events of concurrent reads share one transaction.

A governed read (a retrieve, a patient's history) writes nothing but its audit events, and
every write signs its new chain head and makes it durable (two fsyncs: the head file and the
database's commit). When several threads of one process finish reads at once, the first to
get the writer's turn (the leader) takes every event waiting at that moment and writes them in
one transaction with one signed checkpoint; the others find their events committed and return.

Never acknowledged early: a caller returns only after the transaction holding its events has
committed. A group that fails is written again one caller at a time, so each caller gets the
outcome of its own events (one caller's failure never fails another's read). Each caller's
events stay together and in order in the chain; a lone caller writes exactly what
:meth:`AuditLog.write` would have written, at the same cost.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

from ..._errors import StoreError
from ..._storage.batch import WriteBatch
from .event import AuditSpec
from .log import AuditLog

__all__ = ["GroupCommit"]


@dataclass(slots=True)
class _Waiting:
    """One caller's events, and what became of them once a leader wrote them."""

    specs: list[AuditSpec]
    done: bool = False
    committed: bool = False
    error: BaseException | None = None


class GroupCommit:
    """Writes the audit-only events of concurrent callers of one :class:`AuditLog` together."""

    def __init__(self, audit: AuditLog) -> None:
        self.audit = audit
        self._turn = threading.Lock()  # held by the one leader writing a group
        self._queue = threading.Lock()  # guards the waiting list only (never held while writing)
        self._waiting: list[_Waiting] = []
        #: transactions written and callers served (for tests and benchmarks)
        self.groups = 0
        self.callers = 0

    def write(self, specs: Sequence[AuditSpec]) -> None:
        """Append ``specs`` to the chain in a committed transaction (possibly shared with
        other callers' events); raises what writing them raised."""
        me = _Waiting(list(specs))
        with self._queue:
            self._waiting.append(me)
        with self._turn:
            if not me.done:  # nobody took our events yet: lead a group of everything waiting
                with self._queue:
                    group, self._waiting = self._waiting, []
                self._commit(group)
        if me.error is not None:
            raise me.error

    def _commit(self, group: list[_Waiting]) -> None:
        try:
            self.audit.write(WriteBatch(), [s for w in group for s in w.specs])
            for w in group:
                w.committed = True
        except Exception as exc:
            if len(group) == 1:
                group[0].error = exc
            else:  # find whose events fail: each caller's events on their own
                for w in group:
                    try:
                        self.audit.write(WriteBatch(), w.specs)
                        w.committed = True
                    except Exception as own:  # handed to that caller, raised in its thread
                        w.error = own
        finally:
            self.groups += 1
            self.callers += len(group)
            for w in group:
                if not w.committed and w.error is None:  # the leader was interrupted
                    w.error = StoreError("the audit write was interrupted before it was acknowledged")
                w.done = True
