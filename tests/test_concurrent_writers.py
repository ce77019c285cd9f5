"""Four processes writing one patient's memory, or ingesting one manifest, at once, on both stores.

Each writer is a real process (``multiprocessing``, spawned) that opens the same directory.
Ingesting the same rows: the database keeps one copy of each ingested row (its episode and its
study's visual record are keyed by the row): every study is stored once, every question once,
no writer fails, and the rows the writers say they stored add up to the manifest. Asking about
one patient with write-back: a write that met another writer's change is staged again, so no
ask fails with a conflict and every answer written is in the store once. The audit chain
verifies afterwards.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from msm_mem import IllegalTransition, MsmMem, WriteConflict
from msm_mem._api.base import CONFLICT_ATTEMPTS, patient_turn, retrying
from msm_mem.datasets.synthetic import generate
from tests.conftest import MemFactory
from tests.helpers import AGENT, AUDITOR, CRITIC, INGEST

pytestmark = [pytest.mark.slow, pytest.mark.system, pytest.mark.cluster]

WRITERS = 4
ASKS = 8  # per writer, all about one patient
DEADLINE_S = 300.0  # ends the wait if a writer hangs; not a pass criterion


def _run(target: Callable[..., None], args: list[tuple[Any, ...]]) -> list[Any]:
    """Run ``target(*a, out)`` for each ``a`` in a spawned process of its own, all at once, and
    return what each put on ``out`` (fails when one does not report in time)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*a, out)) for a in args]
    for p in procs:
        p.start()
    reports: list[Any] = []
    try:
        while len(reports) < len(procs):
            reports.append(out.get(timeout=DEADLINE_S))
    except queue.Empty:
        pytest.fail(f"only {len(reports)} of {len(procs)} writers reported: {reports}")
    finally:
        for p in procs:
            p.join(timeout=30)
    return reports


def _ingest(directory: str, rows: list[Any], out: Any) -> None:
    try:
        with MsmMem.open(Path(directory)) as mem:
            report = mem.ingest(INGEST, rows)
        out.put(("done", report.ingested, report.already_stored, len(report.problems)))
    except BaseException as exc:  # reported, so the parent fails with the reason
        out.put(("crashed", repr(exc), 0, 0))


def test_concurrent_ingests_store_each_row_once(new_mem: MemFactory, tmp_path: Path) -> None:
    rows, _ = generate(tmp_path / "data", patients=30, studies_per_patient=(2, 3), seed=5, size=64)
    mem = new_mem("store")
    directory = mem.directory
    mem.close()
    reports = _run(_ingest, [(str(directory), rows)] * WRITERS)
    assert [r[0] for r in reports] == ["done"] * WRITERS, reports
    assert all(ingested + stored == len(rows) for _, ingested, stored, _ in reports), reports
    assert sum(ingested for _, ingested, _, _ in reports) == len(rows)  # each row stored by one writer
    with MsmMem.open(directory) as mem:
        for patient in sorted({r.patient_id for r in rows}):
            mine = [r for r in rows if r.patient_id == patient]
            episodes = mem.episodes(CRITIC, patient)
            assert Counter((e.study_id, e.question) for e in episodes) == Counter(
                (r.study_id, r.question) for r in mine
            )
            visuals = mem.visuals(CRITIC, patient)
            assert sorted(v.source_episode_id in {e.episode_id for e in episodes} for v in visuals) == [True] * len(
                {r.study_id for r in mine}
            )
        assert mem.verify_audit(AUDITOR).ok


def _ask(directory: str, worker: int, out: Any) -> None:
    try:
        written, failed = [], []
        with MsmMem.open(Path(directory)) as mem:
            for i in range(ASKS):
                image = np.random.default_rng(100 * worker + i).random((16, 16), dtype=np.float32)
                try:
                    answer = mem.ask(AGENT, "P1", image, "What is the impression?", study_id=f"W{worker}S{i}")
                except Exception as exc:  # a conflict the retries did not absorb is a failure here
                    failed.append(f"{type(exc).__name__}: {exc}")
                    continue
                assert answer.gate is not None
                if answer.gate.written:
                    written.append(f"W{worker}S{i}")
        out.put(("done", written, failed))
    except BaseException as exc:
        out.put(("crashed", [], [repr(exc)]))


def test_concurrent_asks_on_one_patient_wait_for_each_other(new_mem: MemFactory, tmp_path: Path) -> None:
    rows, _ = generate(tmp_path / "data", patients=1, studies_per_patient=(3, 3), seed=2, size=64)
    mem = new_mem("store")
    directory = mem.directory
    mem.ingest(INGEST, [replace(r, patient_id="P1") for r in rows])  # a history the answers draw on
    mem.close()
    reports = _run(_ask, [(str(directory), w) for w in range(WRITERS)])
    assert [r[2] for r in reports] == [[]] * WRITERS, reports  # no ask failed
    written = sorted(s for _, studies, _ in reports for s in studies)
    assert written  # some answers passed the gate, so the count below could be wrong
    with MsmMem.open(directory) as mem:
        stored = sorted(e.study_id for e in mem.episodes(CRITIC, "P1") if e.study_id.startswith("W"))
        assert stored == written
        assert mem.verify_audit(AUDITOR).ok


def _answer_own(directory: str, worker: int, out: Any) -> None:
    """An agent with its own model: a context, then its answer recorded, ASKS times."""
    try:
        written, failed = [], []
        with MsmMem.open(Path(directory)) as mem:
            for i in range(ASKS):
                image = np.random.default_rng(500 + 100 * worker + i).random((16, 16), dtype=np.float32)
                study = f"R{worker}S{i}"
                try:
                    ctx = mem.context(AGENT, "P1", image, "What is the impression?", study_id=study)
                    answer = f"Right lower lobe consolidation, worker {worker} study {i}, unchanged effusion."
                    done = mem.record_answer(
                        AGENT, "P1", ctx.context_id, answer, model={"backbone": "openai", "model": "own-vlm"}
                    )
                except Exception as exc:  # a conflict the retries did not absorb is a failure here
                    failed.append(f"{type(exc).__name__}: {exc}")
                    continue
                if done.gate is not None and done.gate.written:
                    written.append(study)
        out.put(("done", written, failed))
    except BaseException as exc:
        out.put(("crashed", [], [repr(exc)]))


def test_concurrent_recorded_answers_on_one_patient_wait_for_each_other(new_mem: MemFactory, tmp_path: Path) -> None:
    """Four agents recording their own model's answers about one patient: none fails with a
    conflict, and every answer written is in the store once."""
    rows, _ = generate(tmp_path / "data", patients=1, studies_per_patient=(3, 3), seed=3, size=64)
    mem = new_mem("store")
    directory = mem.directory
    mem.ingest(INGEST, [replace(r, patient_id="P1") for r in rows])
    mem.close()
    reports = _run(_answer_own, [(str(directory), w) for w in range(WRITERS)])
    assert [r[2] for r in reports] == [[]] * WRITERS, reports
    written = sorted(s for _, studies, _ in reports for s in studies)
    assert written
    with MsmMem.open(directory) as mem:
        stored = sorted(e.study_id for e in mem.episodes(CRITIC, "P1") if e.study_id.startswith("R"))
        assert stored == written
        assert mem.verify_audit(AUDITOR).ok


def test_a_conflict_is_staged_again_then_raised() -> None:
    """retrying runs the write again after each WriteConflict (nothing was written) and raises
    the conflict once its attempts are spent; other errors pass at once."""
    calls: list[int] = []

    def twice_then_ok() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise WriteConflict("another writer first")
        return "written"

    assert retrying(twice_then_ok) == "written" and len(calls) == 3
    calls.clear()

    def always() -> str:
        calls.append(1)
        raise WriteConflict("another writer first")

    with pytest.raises(WriteConflict):
        retrying(always)
    assert len(calls) == CONFLICT_ATTEMPTS
    calls.clear()

    def refused() -> str:
        calls.append(1)
        raise IllegalTransition("not in the table")

    with pytest.raises(IllegalTransition):
        retrying(refused)
    assert len(calls) == 1


def test_writers_of_one_patient_take_turns(tmp_path: Path) -> None:
    """While one writer holds a patient's turn, another writer of that patient waits; a writer
    of another patient does not."""
    order: list[str] = []
    held = threading.Event()

    def first() -> None:
        with patient_turn(tmp_path, "store", "P1"):
            held.set()
            time.sleep(0.3)
            order.append("first done")

    thread = threading.Thread(target=first)
    thread.start()
    held.wait(5)
    with patient_turn(tmp_path, "store", "P2"):
        order.append("other patient")
    with patient_turn(tmp_path, "store", "P1"):
        order.append("second")
    thread.join()
    assert order == ["other patient", "first done", "second"]
