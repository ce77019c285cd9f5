"""Full verification of a long audit chain with worker processes.

The parent reads the pages of rows from the store, as the one-process walk does, groups them
into chunks of :data:`CHUNK_ROWS` and hands each chunk to a worker, which runs the fast path
of every check of full verification over it (:func:`.scan.scan_chunk`: seq column,
hash, canonical payload, payload seq, the links inside the chunk) and returns three values:
how many rows passed, the first row's link and the last row's hash. The parent takes the
chunks in order and accepts one when all its rows passed and its first link is the hash the
chunk before ended with. Any other chunk (a break anywhere in it, at its first row, or a link
across chunks) it verifies again itself with the one-process walk, from the seq and hash the
chunks before it left: so the verdict, count, head, first bad seq and reason are exactly those
of :func:`~.verify.verify_chain_in_batches`. Signatures, checkpoints and row digests stay
in the parent (:meth:`.log.AuditLog.verify`).

The workers hold no key. They come from a forkserver: a fresh interpreter that imports this
module's dependencies and never sees the parent's memory, so neither the key-encryption key,
the patients' data keys, the row-digest key nor the checkpoint signing key is in them, and no
database connection; each drops the ``MSM_MEM_*`` and ``PG*`` variables (a database URL, an
API key) from the environment it inherited. They get audit rows (ids and pseudonyms, never
patient data) and nothing else. If the processes cannot start or die, the walk goes on in the
parent alone, with the same result.
"""

from __future__ import annotations

import collections
import logging
import multiprocessing
import os
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from ..._errors import InvalidInput
from .event import Row
from .scan import scan_chunk
from .verify import VerifyResult, check_start, fits, verify_chain_in_batches

__all__ = [
    "CHUNK_ROWS",
    "PARALLEL_MIN_CORES",
    "PARALLEL_MIN_EVENTS",
    "default_processes",
    "verify_chain_parallel",
    "verify_full",
]

#: rows handed to a worker at a time (a few MiB of payloads)
CHUNK_ROWS = 20_000
#: below this many events, starting the workers costs more than they save
PARALLEL_MIN_EVENTS = 200_000
#: with fewer cores the parent's reading and sending competes with the workers, which gain
#: little or lose on a busy machine (docs/performance.md), so the default takes workers only
#: from this many cores
PARALLEL_MIN_CORES = 3
_log = logging.getLogger("msm_mem")
_Chunk = tuple[int, list[Row], "Future[tuple[int, str, str, int]] | None"]


def default_processes() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def verify_full(
    batches: Iterable[Sequence[Row]],
    *,
    start_seq: int,
    start_prev: str,
    events: int,
    processes: int | None,
    step: int = 1,
) -> VerifyResult:
    """Full verification of the ``events`` rows of ``batches``, in one process or with workers.

    ``processes``: None for a worker per core available, used for a chain of at least
    :data:`PARALLEL_MIN_EVENTS` events on at least :data:`PARALLEL_MIN_CORES` cores; 1 for one
    process; N > 1 for N workers.
    """
    if processes is not None and (type(processes) is not int or processes < 1):
        raise InvalidInput(f"processes must be an integer >= 1, got {processes!r}")
    if processes is None:
        workers = default_processes()
        wanted = workers >= PARALLEL_MIN_CORES and events >= PARALLEL_MIN_EVENTS
    else:
        workers, wanted = processes, processes > 1
    if wanted:
        return verify_chain_parallel(
            batches, start_seq=start_seq, start_prev=start_prev, processes=workers, chunk_rows=CHUNK_ROWS, step=step
        )
    return verify_chain_in_batches(batches, start_seq=start_seq, start_prev=start_prev, step=step)


def _drop_secrets() -> None:
    """A worker's initializer: forget the environment's connection strings and API keys."""
    for name in [n for n in os.environ if n.startswith(("MSM_MEM_", "PG"))]:
        del os.environ[name]


def _pool(processes: int) -> ProcessPoolExecutor | None:
    """Workers from a forkserver (see the module docstring), or None where none can start."""
    try:
        context = multiprocessing.get_context("forkserver")
        # the server (started once per parent process) imports these; each worker forks from it
        context.set_forkserver_preload(["__main__", __name__])
        return ProcessPoolExecutor(processes, mp_context=context, initializer=_drop_secrets)
    except (OSError, ValueError, ImportError) as exc:
        _log.warning("audit verification runs in one process: no worker processes (%s)", exc)
        return None


def _chunks(batches: Iterable[Sequence[Row]], size: int) -> Iterator[list[Row]]:
    chunk: list[Row] = []
    for rows in batches:
        chunk.extend(rows)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class _Walk:
    """The parent's side: the seq and hash the chunks accepted so far end with."""

    def __init__(self, start_seq: int, start_prev: str, step: int) -> None:
        self.start_seq = start_seq
        self.seq = start_seq
        self.head = start_prev
        self.step = step
        self.count = 0

    def settle(self, rows: list[Row], outcome: tuple[int, str, str, int] | None) -> VerifyResult | None:
        """Accept the next chunk from the worker's ``outcome``, or verify it here; a failure
        (counted from the start of the whole walk) or None."""
        if outcome is not None:
            accepted, first_link, last, after = outcome
            if accepted == len(rows) and first_link == self.head and fits(rows[0][0], self.seq, self.step):
                self.seq = after
                self.count += accepted
                self.head = last
                return None
        result = verify_chain_in_batches((rows,), start_seq=self.seq, start_prev=self.head, step=self.step)
        if not result.ok:
            done = self.count
            return VerifyResult(False, done + result.count, result.head_hash, result.first_bad_seq, result.reason)
        self.count += result.count
        self.seq = rows[-1][0] + self.step
        self.head = result.head_hash
        return None

    def result(self) -> VerifyResult:
        return VerifyResult(True, self.count, self.head, None, "")


def verify_chain_parallel(
    batches: Iterable[Sequence[Row]],
    *,
    start_seq: int = 1,
    start_prev: str,
    processes: int,
    chunk_rows: int = CHUNK_ROWS,
    step: int = 1,
) -> VerifyResult:
    """:func:`~.verify.verify_chain_in_batches` of ``batches`` with ``processes`` workers:
    the same result, first bad seq and reason included (see the module docstring)."""
    check_start(start_seq, start_prev, step)
    walk = _Walk(start_seq, start_prev, step)
    pending: collections.deque[_Chunk] = collections.deque()
    pool = _pool(processes)
    try:
        for chunk in _chunks(batches, chunk_rows):
            # without gaps each chunk's first slot is known; with them, its first row's seq
            # (the parent checks that it fits after the chunk before)
            start = walk.seq + sum(len(rows) for _, rows, _ in pending) if step == 1 else chunk[0][0]
            if type(start) is not int or start < 1:
                start = walk.seq
            future = None
            if pool is not None:
                try:
                    future = pool.submit(scan_chunk, start, chunk, step)
                except (BrokenProcessPool, RuntimeError) as exc:
                    _give_up(pool, pending, exc)
                    pool = None
            pending.append((start, chunk, future))
            while len(pending) > (2 * processes if pool is not None else 0):
                failure, pool = _settle_next(walk, pending, pool)
                if failure is not None:
                    return failure
        while pending:
            failure, pool = _settle_next(walk, pending, pool)
            if failure is not None:
                return failure
        return walk.result()
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _settle_next(
    walk: _Walk, pending: collections.deque[_Chunk], pool: ProcessPoolExecutor | None
) -> tuple[VerifyResult | None, ProcessPoolExecutor | None]:
    """Settle the oldest pending chunk; without workers any more if they broke."""
    _, rows, future = pending.popleft()
    outcome = None
    if future is not None:
        try:
            outcome = future.result()
        except (BrokenProcessPool, OSError) as exc:
            _give_up(pool, pending, exc)
            pool = None
        except Exception:  # noqa: BLE001 - whatever went wrong there, the parent checks the chunk itself
            outcome = None
    return walk.settle(rows, outcome), pool


def _give_up(pool: ProcessPoolExecutor | None, pending: collections.deque[_Chunk], exc: BaseException) -> None:
    """Go on without workers: the chunks still pending are verified in the parent."""
    _log.warning("audit verification goes on in one process: the worker processes failed (%s)", exc)
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)
    for i, (start, chunk, _) in enumerate(pending):
        pending[i] = (start, chunk, None)
