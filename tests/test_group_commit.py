"""Tests of the group commit of audit-only writes (msm_mem._governance.audit.group_commit): concurrent
reads' events share a transaction, no caller returns before its events are committed, and a
failing caller's events never fail another's."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from msm_mem import ManifestRow, MsmMem, StoreError
from msm_mem._governance.audit.event import AuditSpec
from msm_mem._governance.audit.group_commit import GroupCommit
from msm_mem._storage.base import WriteBatch
from tests.conftest import MemFactory
from tests.helpers import AGENT, AUDITOR, INGEST, audit_events, png

THREADS = 6


def _spec(actor: str) -> AuditSpec:
    return AuditSpec(1.0, actor, "agent", "read", "ltm", "stm", "treatment", "success", (), "", "", "")


class _HeldLog:
    """An audit log stand-in whose first write waits until ``others`` more callers queue, so a
    group forms deterministically; it records each write's actors, and fails any write holding
    an event of ``bad``."""

    def __init__(self, group: list[GroupCommit], others: int, bad: str = "") -> None:
        self.group, self.others, self.bad = group, others, bad
        self.writes: list[list[str]] = []
        self.first = True
        self.entered = threading.Event()

    def write(self, batch: WriteBatch, specs: Sequence[AuditSpec]) -> None:
        assert not batch
        if self.first:
            self.first = False
            self.entered.set()
            for _ in range(60_000):  # the others queue behind this write (bounded: about a minute)
                if len(self.group[0]._waiting) >= self.others:
                    break
                threading.Event().wait(0.001)
        actors = [s.actor for s in specs]
        if self.bad in actors:
            raise StoreError("refused")
        self.writes.append(actors)


def _run(gc: GroupCommit, log: _HeldLog, actors: list[str]) -> dict[str, BaseException | None]:
    outcome: dict[str, BaseException | None] = {}

    def call(actor: str) -> None:
        try:
            gc.write([_spec(actor), _spec(actor)])
            outcome[actor] = None
        except StoreError as exc:
            outcome[actor] = exc

    first = threading.Thread(target=call, args=(actors[0],))
    first.start()
    assert log.entered.wait(30)
    rest = [threading.Thread(target=call, args=(a,)) for a in actors[1:]]
    for t in rest:
        t.start()
    for t in [first, *rest]:
        t.join(30)
    return outcome


def test_callers_waiting_behind_a_write_share_the_next_transaction() -> None:
    """While one write is in progress, every caller that queues behind it is written in one
    transaction, each caller's events together and in order."""
    holder: list[GroupCommit] = []
    log = _HeldLog(holder, THREADS - 1)
    gc = GroupCommit(log)  # type: ignore[arg-type]
    holder.append(gc)
    actors = [f"a{i}" for i in range(THREADS)]
    outcome = _run(gc, log, actors)
    assert outcome == dict.fromkeys(actors)
    assert log.writes[0] == ["a0", "a0"]
    assert len(log.writes) == 2 and sorted(log.writes[1]) == sorted(a for a in actors[1:] for _ in range(2))
    second = log.writes[1]
    assert all(second[i] == second[i + 1] for i in range(0, len(second), 2))  # pairs stay together
    assert (gc.groups, gc.callers) == (2, THREADS)


def test_a_failing_caller_fails_alone() -> None:
    """A group that fails is written again caller by caller: only the caller whose events fail
    gets the error; the others' events are committed."""
    holder: list[GroupCommit] = []
    log = _HeldLog(holder, THREADS - 1, bad="a3")
    gc = GroupCommit(log)  # type: ignore[arg-type]
    holder.append(gc)
    actors = [f"a{i}" for i in range(THREADS)]
    outcome = _run(gc, log, actors)
    assert isinstance(outcome.pop("a3"), StoreError)
    assert outcome == dict.fromkeys(a for a in actors if a != "a3")
    written = Counter(a for w in log.writes for a in w)
    assert written == {a: 2 for a in actors if a != "a3"}


def test_an_interrupted_leader_acknowledges_no_one() -> None:
    """When the leader's write is interrupted (not an ordinary error), no caller of its group
    returns as if its events were committed."""

    class Interrupting:
        def write(self, batch: WriteBatch, specs: Sequence[AuditSpec]) -> None:
            raise KeyboardInterrupt

    gc = GroupCommit(Interrupting())  # type: ignore[arg-type]
    with pytest.raises(KeyboardInterrupt):
        gc.write([_spec("a")])
    follower: Any = gc._waiting  # nothing is left waiting
    assert follower == []


def _ingested(new_mem: MemFactory, tmp_path: Path) -> tuple[MsmMem, list[str]]:
    mem = new_mem()
    images = tmp_path / "images"
    images.mkdir()
    rows = [
        ManifestRow(f"P{i % 3}", f"S{i}", 1_600_000_000.0 + i, str(png(images, i)), "Impression?", "Clear lungs.")
        for i in range(6)
    ]
    mem.ingest(INGEST, rows)
    return mem, [str(png(images, i)) for i in range(6)]


def test_concurrent_retrieves_are_all_audited_and_the_chain_verifies(new_mem: MemFactory, tmp_path: Path) -> None:
    """Threads retrieving at once through one MsmMem: every call answers, every one of them
    leaves its consent and read events, the sequence has no gap and the chain verifies."""
    mem, images = _ingested(new_mem, tmp_path)
    before = len(audit_events(mem))
    per_thread = 5
    errors: list[BaseException] = []

    def reader(t: int) -> None:
        try:
            for i in range(per_thread):
                found = mem.retrieve(AGENT, f"P{(t + i) % 3}", images[(t + i) % len(images)])
                assert found.items
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(t,)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    events = audit_events(mem)[before:]
    reads = [e for e in events if e.action == "read" and e.actor == AGENT.id]
    consents = [e for e in events if e.action == "consent" and e.actor == AGENT.id]
    assert len(consents) == THREADS * per_thread and len(reads) >= THREADS * per_thread
    seqs = [e.seq for e in audit_events(mem)]
    assert seqs == list(range(1, len(seqs) + 1))
    result = mem.verify_audit(AUDITOR)
    assert result.ok, result
    # the grouping is this handle's own, under its concurrent calls: only its counters show it
    assert mem._gm.reads.callers >= THREADS * per_thread >= mem._gm.reads.groups
