"""A worker of the Citus cluster killed (``pg_ctl stop -m immediate``) and restarted while a
governed store spread over it takes writes: every write acknowledged before, during and after
is stored, nothing is half-written (each stored study has its episode, its visual and its
audit events; the audit chain and the row digests verify), the calls while the worker is down
fail with a StoreError that says so, and writes go on once it is back (synthetic data only).

The patient written is on the other worker than the hospital's ``meta`` row and audit chain,
so each of its writes is a distributed transaction over both workers, committed by Citus in
two phases; the test checks that no prepared transaction is left on any node once Citus's
recovery has run."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from msm_mem import MsmMemError, StoreError
from tests.helpers import AGENT, AUDITOR, CRITIC
from tests.test_citus import on_cluster

pytestmark = [pytest.mark.citus, pytest.mark.system, pytest.mark.slow]

QUESTION = "What is the impression?"
ANSWER = "Small right pleural effusion, stable since the prior study"


def _wait(predicate: Any, what: str, crashed: list[BaseException], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if crashed:
            raise AssertionError(f"the writer raised while waiting for {what}") from crashed[0]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_a_worker_killed_mid_writes_loses_no_acknowledged_write(cluster: Any, tmp_path: Path) -> None:
    """Writes of a patient whose shard is on one worker while the hospital's audit chain is on
    the other (two-phase commits), before, during and after an immediate stop of the patient's
    worker: every acknowledged write is stored once, failed ones say the worker is unreachable,
    the audit chain verifies, and no prepared transaction is left on any node."""
    schema = f"f{uuid.uuid4().hex[:12]}"
    mem = on_cluster(cluster, tmp_path / "s", schema, ANSWER)
    home, _ = cluster.shard_of(f"{schema}.meta", mem.tenant)
    (worker,) = (n.name for n in cluster.workers() if n.name != home)
    patient = cluster.value_on(f"{schema}.episodic", worker, "P-")
    near = cluster.value_on(f"{schema}.episodic", home, "P-")
    acknowledged: list[str] = []
    failed: list[tuple[str, Exception]] = []
    crashed: list[BaseException] = []  # anything but the library's errors ends the writer
    stop = threading.Event()

    def write() -> None:
        rng = np.random.default_rng(7)
        i = 0
        while not stop.is_set():
            study = f"S{i}"
            try:
                answer = mem.ask(AGENT, patient, rng.random((16, 16), dtype=np.float32), QUESTION, study_id=study)
                assert answer.gate is not None and answer.gate.written, answer.gate
                acknowledged.append(study)
            except MsmMemError as exc:
                failed.append((study, exc))
                time.sleep(0.05)
            except BaseException as exc:
                crashed.append(exc)
                return
            i += 1

    writer = threading.Thread(target=write, daemon=True)
    # one BLAS thread: OpenBLAS shuts its thread pool down before each fork (pg_ctl below), which
    # hangs a matrix product that the writer (the image encoder) has in flight on that pool
    limits = threadpool_limits(limits=1)
    images = np.random.default_rng(99).random((2, 16, 16), dtype=np.float32)
    assert mem.ask(AGENT, near, images[0], QUESTION, study_id="S-near").gate is not None
    writer.start()
    try:
        _wait(lambda: len(acknowledged) >= 5, "five writes before the stop", crashed)
        cluster.stop_node(worker, "immediate")
        _wait(lambda: len(failed) >= 3, "three failed writes while the worker is down", crashed)
        down = len(acknowledged)
        # a write of a patient on the live worker fails too: every write asks every shard
        with pytest.raises(StoreError, match="nothing was written"):
            mem.ask(AGENT, near, images[1], QUESTION, study_id="S-near-2")
        time.sleep(0.5)
        assert len(acknowledged) <= down + 1  # at most the one in flight when the worker stopped
        cluster.start_node(worker)
        _wait(lambda: len(acknowledged) >= down + 5, "five writes after the restart", crashed)
        assert mem.ask(AGENT, near, images[1], QUESTION, study_id="S-near-2").gate is not None
    finally:
        stop.set()
        writer.join(timeout=60)
        limits.restore_original_limits()
    assert not writer.is_alive() and not crashed, crashed

    assert all(isinstance(exc, StoreError) for _, exc in failed), failed
    # the calls while it is down name the worker they could not reach (the one in flight when it
    # stopped may say only that its connection was lost)
    address = f"127.0.0.1:{cluster.nodes[worker].port}"
    assert sum(address in str(exc) and "nothing was written" in str(exc) for _, exc in failed) >= len(failed) - 1, (
        failed
    )
    episodes = mem.episodes(CRITIC, patient)
    stored = [e.study_id for e in episodes]
    assert len(stored) == len(set(stored))  # each once
    assert set(acknowledged) <= set(stored)  # no acknowledged write lost
    assert set(stored) - set(acknowledged) <= {s for s, _ in failed}  # nothing from nowhere
    visuals = mem.visuals(CRITIC, patient)
    assert sorted(v.source_episode_id for v in visuals) == sorted(e.episode_id for e in episodes)  # none half-written
    assert mem.verify_audit(AUDITOR).ok
    assert sorted(e.study_id for e in mem.episodes(CRITIC, near)) == ["S-near", "S-near-2"]
    mem.close()

    cluster.query("coordinator", "SELECT recover_prepared_transactions()")
    for name in cluster.nodes:
        assert cluster.query(name, "SELECT gid FROM pg_prepared_xacts") == [], name
