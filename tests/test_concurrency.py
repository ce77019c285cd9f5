"""Several processes writing one embedded store through the public API at once.

Each writer is a real process (``multiprocessing``, spawned) that opens the same directory and
runs a fixed number of asks with write-back and observations, reporting every acknowledged
write to the parent before it moves on. Afterwards every acknowledged write is in the store
exactly once, nothing else is, and the audit chain and checkpoints verify.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
from pathlib import Path
from typing import Any

import numpy as np

from msm_mem import MsmMem, MsmMemError
from tests.helpers import ADMIN, AGENT, AUDITOR
from tests.layers import layers_of

WRITERS = 4
OPS = 12  # per writer
DEADLINE_S = 240.0  # ends the wait if a writer hangs; not a pass criterion


def _image(worker: int, i: int) -> Any:
    return np.random.default_rng(1000 * worker + i).random((16, 16), dtype=np.float32)


def _writer(directory: str, worker: int, ops: int, out: Any) -> None:
    """Asks (write-back on) for its own patients, observations for a patient all writers share."""
    try:
        mem = MsmMem.open(directory)
        for i in range(ops):
            patient, study = f"W{worker}P{i % 2}", f"W{worker}S{i}"
            try:
                if i % 3 == 2:
                    item = mem.observe(AGENT, "SHARED", _image(worker, i), "Any change?", study_id=study)
                    out.put(("observe", "SHARED", item.item_id))
                else:
                    answer = mem.ask(AGENT, patient, _image(worker, i), "What is the impression?", study_id=study)
                    assert answer.gate is not None
                    out.put(("ask", patient, study, answer.gate.written))
            except MsmMemError as exc:
                out.put(("failed", worker, f"{type(exc).__name__}: {exc}"))
        # this process's own vector index following the others: only its handle shows it
        store = mem._store
        with store._db():  # type: ignore[attr-defined]
            store.sync()
            rows = [r[0] for r in store._conn.execute("SELECT id FROM episodic ORDER BY pos")]  # type: ignore[attr-defined]
            out.put(("index", worker, store._vectors._ids["episodic"][: len(rows)] == rows))  # type: ignore[attr-defined]
        mem.close()
    except BaseException as exc:  # reported, so the parent fails with the reason
        out.put(("crashed", worker, repr(exc)))
    out.put(("done", worker))


def test_concurrent_writer_processes_lose_nothing(tmp_path: Path) -> None:
    """4 writer processes on one embedded store: every call succeeds, every acknowledged write
    is stored exactly once, the processes' vector indexes follow each other, the chain verifies."""
    directory = tmp_path / "store"
    MsmMem.init(directory, ADMIN).close()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(str(directory), w, OPS, out)) for w in range(WRITERS)]
    for p in procs:
        p.start()
    reports: list[tuple[Any, ...]] = []
    done, deadline = 0, time.monotonic() + DEADLINE_S
    while done < WRITERS and time.monotonic() < deadline:
        try:
            report = out.get(timeout=1.0)
        except queue.Empty:
            continue
        reports.append(report)
        done += report[0] == "done"
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
    assert done == WRITERS, f"writers did not finish: {reports}"
    assert [r for r in reports if r[0] in ("failed", "crashed")] == []
    assert [r[2] for r in reports if r[0] == "index"] == [True] * WRITERS

    asks = [r for r in reports if r[0] == "ask"]
    observed = [r[2] for r in reports if r[0] == "observe"]
    assert len(asks) + len(observed) == WRITERS * OPS
    with MsmMem.open(directory) as mem:
        stored: dict[str, list[str]] = {}
        for patient in {r[1] for r in asks}:
            stored[patient] = [e.study_id for e in mem.episodes(AGENT, patient)]
        for _, patient, study, written in asks:
            assert stored[patient].count(study) == (1 if written else 0)
        assert sum(len(v) for v in stored.values()) == sum(1 for r in asks if r[3])
        items = [i.item_id for i in mem.stm_items(AGENT, "SHARED")]
        assert sorted(items) == sorted(observed)
        with layers_of(mem) as layers:
            assert layers.store.count("episodic") == sum(1 for r in asks if r[3])
        result = mem.verify_audit(AUDITOR)
        assert result.ok, result.reason
