"""Tests for msm_mem._governance.audit.parallel: full verification with worker processes finds
exactly what the full check of every row finds, first bad seq and reason included, and goes on
in one process when the workers cannot start or die."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import pytest

from msm_mem._errors import InvalidInput
from msm_mem._governance.audit import parallel as audit_parallel
from msm_mem._governance.audit.chain import ChainBuilder
from msm_mem._governance.audit.event import GENESIS, Row
from msm_mem._governance.audit.parallel import verify_chain_parallel
from msm_mem._governance.audit.verify import (
    VerifyResult,
    verify_chain_in_batches,
)
from msm_mem._storage.base import AUDIT_PAGE_ROWS, WriteBatch
from msm_mem.interfaces.cli import main
from msm_mem.testing import FixedClock
from tests.cli_support import AUDITOR as AUDITOR_FLAGS
from tests.helpers import ADMIN, AUDITOR, audit_fields, copy_store, raw_db, rehashed, verify_row_by_row
from tests.helpers import audit_rows as chain

# verification with workers, over rows in memory ------------------------------------------------

N, PAGE_ROWS, CHUNK = 120, 9, 25  # pages of 9 rows grouped into chunks of 27: chunks start at 1, 28, 55, ...


def _pages(rows: list[Row]) -> list[list[Row]]:
    return [rows[i : i + PAGE_ROWS] for i in range(0, len(rows), PAGE_ROWS)]


def _flip(rows: list[Row], k: int) -> list[Row]:
    seq, payload, digest = rows[k - 1]
    flipped = bytearray(payload)
    flipped[len(flipped) // 2] ^= 1
    return [*rows[: k - 1], (seq, bytes(flipped), digest), *rows[k:]]


def _relink(rows: list[Row], k: int) -> list[Row]:
    """Event k's link pointed elsewhere, its hash recomputed."""
    seq, payload, _ = rows[k - 1]
    at = payload.index(b'"prev_hash":"') + 13
    return [*rows[: k - 1], rehashed(seq, payload[:at] + b"f" * 64 + payload[at + 64 :]), *rows[k:]]


def _fork(rows: list[Row], k: int) -> list[Row]:
    """Events k.. replaced by a valid chain from a forged link: every row is intact and linked
    to the one before it except event k (at a chunk's first row only the parent can tell)."""
    forged = _relink(rows, k)[k - 1]
    return [*rows[: k - 1], forged, *chain(len(rows) - k, k, forged[2])]


def _canonical_break(rows: list[Row], k: int) -> list[Row]:
    """Event k rehashed with a space after its first brace: hash and link fine, not canonical."""
    seq, payload, _ = rows[k - 1]
    return [*rows[: k - 1], rehashed(seq, b"{ " + payload[1:]), *rows[k:]]


#: tampering of event k -> the first bad seq
ROW_TAMPER: dict[str, tuple[Callable[[list[Row], int], list[Row]], int]] = {
    "bit_flip": (_flip, 0),
    "relinked": (_relink, 0),
    "forked": (_fork, 0),
    "not_canonical": (_canonical_break, 0),
    "deleted": (lambda r, k: r[: k - 1] + r[k:], 0),
    "duplicated": (lambda r, k: r[:k] + [r[k - 1]] + r[k:], 1),
    "swapped": (lambda r, k: [*r[: k - 1], r[k], r[k - 1], *r[k + 1 :]], 0),
    "seq_gap": (lambda r, k: r[: k - 1] + [(s + 1, p, h) for s, p, h in r[k - 1 :]], 0),
    "payload_missing": (lambda r, k: [*r[: k - 1], (k, None, r[k - 1][2]), *r[k:]], 0),  # type: ignore[list-item]
}
#: the first event, inside the first chunk, the last of a chunk, the first of the next, the middle, the last
WHERE = [1, 13, 27, 28, 64, N - 1]


@pytest.mark.parametrize("k", WHERE)
@pytest.mark.parametrize("name", sorted(ROW_TAMPER))
def test_workers_find_a_break_in_any_chunk_as_one_process_does(name: str, k: int) -> None:
    """A break at the first event, inside a chunk, at either side of a chunk boundary, in the
    middle and at the end: workers give exactly the one-process result."""
    tamper, offset = ROW_TAMPER[name]
    rows = tamper(chain(N), k)
    one = verify_chain_in_batches(_pages(rows))
    assert one == verify_row_by_row(rows)
    assert not one.ok and one.first_bad_seq == k + offset and one.reason.startswith(f"seq {k + offset}:")
    assert verify_chain_parallel(_pages(rows), start_prev=GENESIS, processes=2, chunk_rows=CHUNK) == one


def test_workers_verify_an_intact_chain_and_a_suffix(caplog: pytest.LogCaptureFixture) -> None:
    """An intact chain and a suffix of it (a purged store) verify with workers as in one process
    (and the workers did start)."""
    rows = chain(N)
    whole = verify_chain_parallel(_pages(rows), start_prev=GENESIS, processes=3, chunk_rows=CHUNK)
    assert whole == verify_chain_in_batches(_pages(rows)) == VerifyResult(True, N, rows[-1][2], None, "")
    suffix = _pages(rows[40:])
    one = verify_chain_in_batches(suffix, start_seq=41, start_prev=rows[39][2])
    assert verify_chain_parallel(suffix, start_seq=41, start_prev=rows[39][2], processes=2, chunk_rows=CHUNK) == one
    assert one.ok and one.count == N - 40
    wrong = verify_chain_parallel(suffix, start_seq=41, start_prev="e" * 64, processes=2, chunk_rows=CHUNK)
    assert wrong == verify_chain_in_batches(suffix, start_seq=41, start_prev="e" * 64)
    assert wrong.first_bad_seq == 41 and not wrong.ok
    assert verify_chain_parallel([], start_prev=GENESIS, processes=2) == VerifyResult(True, 0, GENESIS, None, "")
    assert not [r for r in caplog.records if "one process" in r.getMessage()]


class _BrokenPool:
    """A pool whose workers died: every chunk's result raises BrokenProcessPool."""

    def __init__(self) -> None:
        self.shut = False

    def submit(self, *args: object) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_exception(BrokenProcessPool("a worker died"))
        return future

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        self.shut = True


@pytest.mark.parametrize("pool", ["none", "broken"])
def test_without_workers_the_parent_verifies_alone(monkeypatch: pytest.MonkeyPatch, pool: str) -> None:
    """Where no worker can start, or the workers die, the parent verifies every chunk itself:
    the same result."""
    broken = _BrokenPool()
    monkeypatch.setattr(audit_parallel, "_pool", lambda processes: None if pool == "none" else broken)
    rows = chain(N)
    for tampered in (rows, _flip(rows, 64), _fork(rows, 28)):
        one = verify_chain_in_batches(_pages(tampered))
        assert verify_chain_parallel(_pages(tampered), start_prev=GENESIS, processes=2, chunk_rows=CHUNK) == one
    assert broken.shut is (pool == "broken")


@pytest.mark.parametrize(
    ("cores", "events", "processes", "workers"),
    [
        (2, 10**6, None, None),  # two cores: one process is faster
        (4, 10**6, None, 4),
        (4, 10**5, None, None),  # a short chain: starting workers costs more
        (2, 10, 3, 3),  # asked for: workers, however short the chain
        (8, 10**6, 1, None),
    ],
)
def test_the_default_takes_a_worker_per_core_for_long_chains(
    monkeypatch: pytest.MonkeyPatch, cores: int, events: int, processes: int | None, workers: int | None
) -> None:
    """By default, workers (one per core) verify a chain of 200,000 events or more on 3 cores or
    more; a count asked for is taken as given; every choice gives the same result."""
    chosen: list[int] = []

    def spy(batches: Any, **options: Any) -> VerifyResult:
        chosen.append(options["processes"])
        return verify_chain_in_batches(batches, start_seq=options["start_seq"], start_prev=options["start_prev"])

    monkeypatch.setattr(audit_parallel, "default_processes", lambda: cores)
    monkeypatch.setattr(audit_parallel, "verify_chain_parallel", spy)
    rows = chain(5)
    found = audit_parallel.verify_full([rows], start_seq=1, start_prev=GENESIS, events=events, processes=processes)
    assert found == verify_chain_in_batches([rows]) and found.ok
    assert chosen == ([] if workers is None else [workers])
    with pytest.raises(InvalidInput, match="processes"):
        audit_parallel.verify_full([rows], start_seq=1, start_prev=GENESIS, events=events, processes=0)


# verification of a store with workers ----------------------------------------------------------

SIZE = 2 * AUDIT_PAGE_ROWS + 600  # three pages; chunks of two pages: events 1..2000 and 2001..2600
BOUNDARY = 2 * AUDIT_PAGE_ROWS  # the last event of the first chunk


@pytest.fixture(scope="module")
def long_store(
    tmp_path_factory: pytest.TempPathFactory, module_backend: str, init_options: Callable[..., dict[str, Any]]
) -> Path:
    """A store of SIZE events, signed at every commit: events 500, 1000, ..., SIZE."""
    from msm_mem._api.mem import MsmMem
    from tests.layers import open_layers

    directory = tmp_path_factory.mktemp("long") / "s"
    MsmMem.init(directory, ADMIN, **init_options(module_backend, clock=FixedClock(1.7e9))).close()
    with open_layers(directory, clock=FixedClock(1.7e9)) as layers:
        while (head := layers.store.audit_head()[0]) < SIZE:
            specs = [
                layers.audit.spec(
                    actor="rad-1",
                    role="clinician",
                    action="read",
                    source_tier="ltm",
                    target_tier="stm",
                    purpose="treatment",
                    record_ids=[f"E-{head + i}"],
                )
                for i in range(min(500 - head % 500, SIZE - head))
            ]
            layers.audit.write(WriteBatch(), specs)
    return directory


def _sql_flip(con: Any, k: int) -> None:
    payload, _ = con.execute("SELECT payload, event_hash FROM audit WHERE seq = ?", (k,)).fetchone()
    data = bytearray(bytes(payload))
    data[len(data) // 2] ^= 1
    con.execute("UPDATE audit SET payload = ? WHERE seq = ?", (bytes(data), k))


def _sql_relink(con: Any, k: int) -> None:
    payload = bytes(con.execute("SELECT payload FROM audit WHERE seq = ?", (k,)).fetchone()[0])
    at = payload.index(b'"prev_hash":"') + 13
    forged = payload[:at] + b"f" * 64 + payload[at + 64 :]
    con.execute("UPDATE audit SET payload = ?, event_hash = ? WHERE seq = ?", (forged, rehashed(k, forged)[2], k))


def _sql_recompute(con: Any, k: int) -> None:
    """Events k.. rewritten with valid hashes and links: only the checkpoints tell."""
    builder = ChainBuilder(
        k - 1, str(con.execute("SELECT event_hash FROM audit WHERE seq = ?", (k - 1,)).fetchone()[0])
    )
    for (seq,) in con.execute("SELECT seq FROM audit WHERE seq >= ? ORDER BY seq", (k,)).fetchall():
        _, payload, digest = builder.next_row(**audit_fields(seq, actor="mallory"))
        con.execute("UPDATE audit SET payload = ?, event_hash = ? WHERE seq = ?", (payload, digest, seq))


#: tampering of the store at event k -> (k, first bad seq)
STORE_TAMPER: dict[str, tuple[Callable[[Any, int], object], int, int]] = {
    "first_event": (_sql_flip, 1, 1),
    "page_boundary": (_sql_flip, AUDIT_PAGE_ROWS + 1, AUDIT_PAGE_ROWS + 1),
    "chunk_end": (_sql_flip, BOUNDARY, BOUNDARY),
    "chunk_start": (_sql_flip, BOUNDARY + 1, BOUNDARY + 1),
    "link_across_chunks": (_sql_relink, BOUNDARY + 1, BOUNDARY + 1),
    "last_event": (_sql_flip, SIZE, SIZE),
    "deleted": (lambda con, k: con.execute("DELETE FROM audit WHERE seq = ?", (k,)), BOUNDARY, BOUNDARY),
    "truncated": (lambda con, k: con.execute("DELETE FROM audit WHERE seq >= ?", (k,)), SIZE - 10, SIZE - 10),
    "recomputed": (_sql_recompute, BOUNDARY + 1, BOUNDARY + 1),
}


@pytest.fixture
def two_page_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(audit_parallel, "CHUNK_ROWS", 2 * AUDIT_PAGE_ROWS)


@pytest.mark.usefixtures("two_page_chunks")
@pytest.mark.parametrize("name", sorted(STORE_TAMPER))
def test_a_store_verified_with_workers_names_what_one_process_names(
    long_store: Path, tmp_path: Path, name: str
) -> None:
    """Tampering at the first event, at a page or chunk boundary, across chunks, at the end, a
    deletion, a truncated tail, a recomputed chain: the same finding with workers."""
    from msm_mem._api.mem import MsmMem

    directory = copy_store(long_store, tmp_path / "copy")
    tamper, k, bad = STORE_TAMPER[name]
    with raw_db(directory) as con:
        tamper(con, k)
    with MsmMem.open(directory) as mem:
        one = mem.verify_audit(AUDITOR, processes=1)
        assert (one.ok, one.first_bad_seq) == (False, bad), one
        assert mem.verify_audit(AUDITOR, processes=2) == one


@pytest.mark.usefixtures("two_page_chunks")
def test_an_intact_store_verifies_with_workers_and_from_the_command_line(
    long_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """An intact store verifies with workers (they did start) as in one process; the CLI takes
    --processes and refuses a count below one."""
    from msm_mem._api.mem import MsmMem

    directory = copy_store(long_store, tmp_path / "copy")
    with MsmMem.open(directory) as mem:
        one = mem.verify_audit(AUDITOR, processes=1)
        assert one.ok and one.count == SIZE
        assert mem.verify_audit(AUDITOR, processes=2) == mem.verify_audit(AUDITOR) == one
        assert not [r for r in caplog.records if "one process" in r.getMessage()]
        with pytest.raises(InvalidInput, match="processes"):
            mem.verify_audit(AUDITOR, processes=0)
    assert main(["audit", "verify", str(directory), "--processes", "2", *AUDITOR_FLAGS]) == 0
    assert f"{SIZE} events" in capsys.readouterr().out
    assert main(["audit", "verify", str(directory), "--processes", "0", *AUDITOR_FLAGS]) == 2
    assert "--processes: expected an integer >= 1" in capsys.readouterr().err


def test_workers_verify_a_chain_with_gaps_as_one_process_does() -> None:
    """A chain of one residue of a store of several chains (seqs with gaps, step 4) verifies
    with workers exactly as in one process, intact and with an event edited in any chunk."""
    from tests.test_audit_verify import chain_of_lane

    rows = chain_of_lane(N)
    start = {"start_seq": 6, "start_prev": GENESIS, "step": 4}
    one = verify_chain_in_batches(_pages(rows), **start)  # type: ignore[arg-type]
    assert one == VerifyResult(True, N, rows[-1][2], None, "")
    assert verify_chain_parallel(_pages(rows), processes=2, chunk_rows=CHUNK, **start) == one  # type: ignore[arg-type]
    for k in (1, 30, N - 1):
        bad = _flip(rows, k)
        alone = verify_chain_in_batches(_pages(bad), **start)  # type: ignore[arg-type]
        assert not alone.ok and alone.first_bad_seq == rows[k - 1][0]  # the k-th event
        assert verify_chain_parallel(_pages(bad), processes=2, chunk_rows=CHUNK, **start) == alone  # type: ignore[arg-type]
