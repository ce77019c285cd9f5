"""Tests of the governed tiers that fail a turn: a commit that fails, a backbone that fails, an
unreadable image, an empty question. Each writes nothing but its audit events."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from msm_mem._api.mem import MsmMem
from msm_mem._errors import BackendError, IllegalTransition, ImageError, InvalidInput
from msm_mem.plugins.backbones.base import BackboneReply, BackboneRequest
from msm_mem.testing import FixedBackbone, FixedClock
from tests.conftest import MemFactory
from tests.helpers import audit_events
from tests.helpers import png as _png
from tests.layers import Layers, layers_of
from tests.tiers_support import AGENT, ANSWER, T0, _counts, _z


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(T0)


@pytest.fixture
def mem(new_mem: MemFactory, clock: FixedClock) -> Iterator[MsmMem]:
    m = new_mem("s", clock=clock, backbone=FixedBackbone(ANSWER, "treat"))
    yield m
    m.close()


@pytest.fixture
def layers(mem: MsmMem, clock: FixedClock) -> Iterator[Layers]:
    """The governed tiers (and the store and audit log) of ``mem``'s directory."""
    with layers_of(mem, clock) as built:
        yield built


def test_failed_commit_audits_reads_and_error_only(layers: Layers, tmp_path: Path) -> None:
    """Two racing turns of one patient: the second commit fails, stores nothing, audits consent, reads, error."""
    g = layers.gm
    turns = []
    for seed in (1, 2):
        turn = g.begin(AGENT, "P1")
        z = _z(layers, tmp_path, seed)
        item = g.observe(turn, z, "Any consolidation?", study_id=f"S{seed}")
        g.retrieve(turn, z)
        g.consolidate(turn, item, ANSWER)
        turns.append(turn)
    g.commit(turns[0])
    counts, before = _counts(layers.store), layers.store.audit_head()[0]
    with pytest.raises(IllegalTransition):
        g.commit(turns[1])
    assert _counts(layers.store) == counts
    new = audit_events(layers.store)[before:]
    assert [(e.action, e.outcome) for e in new] == [("consent", "success"), ("read", "success"), ("turn", "error")]
    assert new[-1].reason == "WriteConflict"  # the store found the patient's state moved
    assert layers.audit.verify().ok


class FailingBackbone:
    """A backbone that answers as the fixture's does until :attr:`exc` is set, then fails with it."""

    name = "failing"

    def __init__(self) -> None:
        self.exc: Exception | None = None

    def generate(self, request: BackboneRequest) -> BackboneReply:
        if self.exc is not None:
            raise self.exc
        return FixedBackbone(ANSWER, "treat").generate(request)


@pytest.mark.parametrize("exc", [BackendError("upstream timeout"), TimeoutError("read timed out")])
def test_backbone_failure_writes_nothing_but_audits_reads(
    new_mem: MemFactory, clock: FixedClock, tmp_path: Path, exc: Exception
) -> None:
    """A failing backbone raises BackendError; STM/LTM are unchanged; consent, reads and the error are audited."""
    backbone = FailingBackbone()
    mem = new_mem("f", clock=clock, backbone=backbone)
    mem.ask(AGENT, "P1", _png(tmp_path, 1), "Any consolidation?", study_id="S1")
    with layers_of(mem, clock) as layers:
        counts, before = _counts(layers.store), layers.store.audit_head()[0]
        backbone.exc = exc
        with pytest.raises(BackendError):
            mem.ask(AGENT, "P1", _png(tmp_path, 2), "Any change?", study_id="S2")
        assert _counts(layers.store) == counts
        new = audit_events(layers.store)[before:]
        actions = [e.action for e in new]
        assert actions[0] == "consent" and actions[-1] == "turn" and set(actions[1:-1]) == {"read"}
        reads = [e for e in new if e.action == "read"]
        assert any(reads[0].record_ids)  # the reads that happened name what was read
        assert (new[-1].outcome, new[-1].reason) == ("error", "BackendError")
        assert "write" not in actions
        assert layers.audit.verify().ok


def test_unreadable_image_writes_nothing(mem: MsmMem, layers: Layers, tmp_path: Path) -> None:
    """A corrupt image raises ImageError before any read; only consent and the error are audited."""
    bad = tmp_path / "corrupt.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"garbage" * 10)
    counts, before = _counts(layers.store), layers.store.audit_head()[0]
    with pytest.raises(ImageError):
        mem.ask(AGENT, "P1", bad, "Any consolidation?")
    assert _counts(layers.store) == counts
    new = audit_events(layers.store)[before:]
    expected = [("consent", "success", ""), ("turn", "error", "ImageError")]
    assert [(e.action, e.outcome, e.reason) for e in new] == expected


def test_empty_question_is_refused_before_the_turn(mem: MsmMem, layers: Layers, tmp_path: Path) -> None:
    """An empty question is InvalidInput before consent: nothing is written or audited."""
    counts, before = _counts(layers.store), layers.store.audit_head()[0]
    for question in ("", "   "):
        with pytest.raises(InvalidInput):
            mem.ask(AGENT, "P1", _png(tmp_path, 1), question)
    assert _counts(layers.store) == counts and layers.store.audit_head()[0] == before
