"""Tests of the Python API (msm_mem._api.mem) beyond what the CLI tests reach through it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from msm_mem import ConsentRecord, IllegalTransition, ImageError, InvalidInput, MsmMem, StoreError
from msm_mem._governance.audit.event import AuditEvent
from msm_mem._storage.base import Store
from tests.helpers import ADMIN, AGENT, CLINICIAN, CRITIC, EXPORTER, SYSTEM, audit_events, png
from tests.layers import Views, layers_of
from tests.strategies import png_declaring


@pytest.fixture
def views() -> Iterator[Views]:
    """Handles of their own on the stores a test opens (``tests/layers.py``), closed after it."""
    with Views() as opened:
        yield opened


def test_api_ask_refuses_unknown_options(tmp_path: Path) -> None:
    """MsmMem.ask names an unknown keyword option instead of failing with a TypeError."""
    with MsmMem.init(tmp_path / "s", ADMIN) as mem, pytest.raises(InvalidInput, match="studyid"):
        mem.ask(AGENT, "P1", np.zeros((8, 8), dtype=np.float32), "q?", studyid="S1")


def test_api_import_is_audited(tmp_path: Path, views: Views) -> None:
    """After an API import the records are there, the audit chain verifies and its last event is
    the import."""
    from msm_mem.testing import FixedBackbone

    answer = FixedBackbone("Right lower lobe consolidation, unchanged.")  # passes the write-back gate
    with MsmMem.init(tmp_path / "a", ADMIN, backbone=answer) as src:
        src.ask(AGENT, "P1", np.random.default_rng(0).random((16, 16), dtype=np.float32), "Any consolidation?")
        exported = src.export_paper(EXPORTER, tmp_path / "out")
    assert exported["episodic"] == exported["visual"] == 1
    with MsmMem.init(tmp_path / "b", ADMIN) as dst:
        counts = dst.import_paper(ADMIN, tmp_path / "out")
        assert counts["episodic"] == views(dst).store.count("episodic") == 1
        last = list(views(dst).store.iter_audit())[-1]
        assert AuditEvent.from_row(*last).action == "import" and dst.verify_audit(ADMIN).ok


def test_retrieve_lists_evidence_of_equal_rank_by_study_not_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Retrieve lists evidence of equal rank (one image as two studies of one day) later study
    first, as ingestion orders them, whatever the random ids: S2's ids are made to sort last."""
    from msm_mem import ManifestRow
    from msm_mem._agent import offline

    real = offline.keyed_id

    def reversed_ids(prefix: str, key: bytes, *parts: str) -> str:
        return f"{prefix}-{'z' if parts[2] == 'S2' else 'a'}{real(prefix, key, *parts)}"

    monkeypatch.setattr(offline, "keyed_id", reversed_ids)
    image = str(png(tmp_path, 1))
    rows = [ManifestRow("P1", s, 1.6e9, image, "Findings?", "Left lower lobe consolidation") for s in ("S1", "S2")]
    with MsmMem.init(tmp_path / "s", ADMIN) as mem:
        mem.ingest(SYSTEM, rows)
        found = mem.retrieve(AGENT, "P1", image, at=1.6e9)
    episodic = [i for i in found.items if i.evidence.kind == "episodic"]
    assert len({i.evidence.score for i in episodic}) == 1
    assert [getattr(i.record, "study_id", "") for i in episodic] == ["S2", "S1"]


def _kek_ids(store: Store) -> set[str]:
    return {k.kek_id for k in store.keys().all() if not k.shredded}


def test_key_rotation_and_its_audit_event_commit_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, views: Views
) -> None:
    """A rotation whose transaction fails stores neither the rewrapped keys nor its event (and
    every record stays readable); a rotation that commits stores both."""
    from msm_mem._storage.sql_write import SqlWriter

    with MsmMem.init(tmp_path / "s", ADMIN) as mem:
        mem.ask(AGENT, "P1", png(tmp_path, 1), "What is the impression?")
        answers = [e.answer for e in mem.episodes(AGENT, "P1")]
        before_keks, before_events = _kek_ids(views(mem).store), len(audit_events(mem))

        def broken(self: object, audit: object, head_seq: int | None = None) -> None:
            raise StoreError("disk full")

        with monkeypatch.context() as m:
            m.setattr(SqlWriter, "_append_audit", broken)
            with pytest.raises(StoreError):
                mem.rotate_keys(ADMIN, "scheduled rotation")
        assert _kek_ids(views(mem).store) == before_keks
        assert len(audit_events(mem)) == before_events
        assert [e.answer for e in mem.episodes(AGENT, "P1")] == answers
        count = mem.rotate_keys(ADMIN, "scheduled rotation")
        assert count >= 1 and len(_kek_ids(views(mem).store)) == 1 and _kek_ids(views(mem).store) != before_keks
        assert audit_events(mem)[-1].action == "key_rotate"
    with MsmMem.open(tmp_path / "s") as mem:
        assert [e.answer for e in mem.episodes(AGENT, "P1")] == answers


def test_a_batch_cannot_create_or_revive_a_data_key(tmp_path: Path, views: Views) -> None:
    """Rewrapped keys in a batch must be existing live keys of the same patient."""
    from dataclasses import replace

    from msm_mem._storage.batch import WriteBatch

    with MsmMem.init(tmp_path / "s", ADMIN) as mem:
        mem.ask(AGENT, "P1", png(tmp_path, 1), "What is the impression?")
        live = next(k for k in views(mem).store.keys().all() if k.patient_ref == "P1")
        for forged in (replace(live, key_id="K-" + "0" * 32), replace(live, patient_ref="P2")):
            with pytest.raises(IllegalTransition, match="rewrapped"):
                views(mem).store.write(WriteBatch(rewrapped=[forged]))
        mem.shred(ADMIN, "P1", "erasure request")
        dead = next(k for k in views(mem).store.keys().all() if k.key_id == live.key_id)  # its row names no patient
        with pytest.raises(IllegalTransition, match="rewrapped"):
            views(mem).store.write(WriteBatch(rewrapped=[replace(dead, shredded=False, wrapped=live.wrapped)]))


def test_maintain_runs_as_of_an_explicit_time(tmp_path: Path) -> None:
    """maintain(at=T) expires what is due at T while the store's clock stays put; its audit
    events carry the store's clock (when the sweep really ran)."""
    from msm_mem import FixedClock, StmState

    clock = FixedClock(1_700_000_000.0)
    with MsmMem.init(tmp_path / "s", ADMIN, clock=clock) as mem:
        item = mem.observe(AGENT, "P1", png(tmp_path, 1), "Any change?")
        assert mem.maintain(SYSTEM).expired == 0
        later = item.expires_at + 1
        report = mem.maintain(SYSTEM, at=later)
        assert report.expired == 1 and mem.now() == 1_700_000_000.0
        assert [i.state for i in mem.stm_items(AGENT, "P1")] == [StmState.EXPIRED]
        assert audit_events(mem)[-1].time == 1_700_000_000.0
        with pytest.raises(InvalidInput, match="UTC seconds"):
            mem.maintain(SYSTEM, at=float("nan"))


# bad input is refused with a clear error, and nothing is written -------------------------------

BAD_IDS = ["*", "\x00retired", "P\n1", "P1\r\nX", "", " ", "x" * 257]


def _written(mem: MsmMem) -> tuple[int, int, int]:
    """Audit events, short-term items and episodes in the store (read through a handle of its own)."""
    with layers_of(mem) as layers:
        s = layers.store
        return len(list(s.iter_audit())), len(s.stm_list()), s.count("episodic")


@pytest.mark.parametrize("patient", BAD_IDS)
def test_api_refuses_bad_patient_ids_and_writes_nothing(tmp_path: Path, patient: str) -> None:
    """ask, observe, retrieve, reads and feedback refuse a wildcard, control or overlong id."""
    img = np.zeros((8, 8), dtype=np.float32)
    with MsmMem.init(tmp_path / "s", ADMIN) as mem:
        before = _written(mem)
        calls = [
            lambda: mem.ask(AGENT, patient, img, "What is seen?"),
            lambda: mem.observe(AGENT, patient, img, "What is seen?"),
            lambda: mem.retrieve(AGENT, patient, img),
            lambda: mem.episodes(CLINICIAN, patient),
            lambda: mem.semantic_state(CLINICIAN, patient),
            lambda: mem.feedback(CRITIC, patient, "S1", accept=True),
        ]
        for call in calls:
            with pytest.raises(InvalidInput, match="patient"):
                call()
        assert _written(mem) == before


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"question": "q" * 20_000_000}, "question is longer than 16,384"),
        ({"study_id": "S\n1"}, "study_id"),
        ({"study_id": "*"}, "wildcard"),
        ({"visual_tag": "t" * 1000}, "visual_tag"),
        ({"question": "What \x1b[2J is seen?"}, r"question .*U\+001B"),
        ({"visual_tag": "P\u202eA"}, r"visual_tag .*U\+202E"),
    ],
)
def test_api_refuses_oversized_or_bad_fields_and_writes_nothing(
    tmp_path: Path, changes: dict[str, str], match: str
) -> None:
    """A 20 MB question, a bad study id or an overlong tag is refused before the turn begins."""
    img = np.zeros((8, 8), dtype=np.float32)
    args = {"question": "What is seen?", **changes}
    question = args.pop("question")
    with MsmMem.init(tmp_path / "s", ADMIN) as mem:
        before = _written(mem)
        with pytest.raises(InvalidInput, match=match):
            mem.ask(AGENT, "P1", img, question, **args)
        with pytest.raises(InvalidInput, match=match):
            mem.observe(AGENT, "P1", img, question, **args)
        assert _written(mem) == before


def test_api_refuses_oversized_answer_and_correction(tmp_path: Path) -> None:
    """consolidate and feedback bound the answer, decision and correction they bring in."""
    with MsmMem.init(tmp_path / "s", ADMIN) as mem:
        item = mem.observe(AGENT, "P1", np.ones((8, 8), dtype=np.float32), "What is seen?")
        before = _written(mem)
        with pytest.raises(InvalidInput, match="answer is longer"):
            mem.consolidate(CLINICIAN, "P1", item.item_id, "a" * 200_000)
        with pytest.raises(InvalidInput, match="correction is longer"):
            mem.feedback(CRITIC, "P1", "S1", accept=False, correction="c" * 200_000)
        with pytest.raises(InvalidInput, match="study_id"):
            mem.feedback(CRITIC, "P1", "S\x001", accept=True)
        with pytest.raises(InvalidInput, match=r"item_id .*U\+001B"):
            mem.consolidate(CLINICIAN, "P1", "M\x1b", "fine")
        with pytest.raises(InvalidInput, match=r"decision .*U\+0085"):
            mem.consolidate(CLINICIAN, "P1", item.item_id, "fine", decision="x\x85")
        assert _written(mem) == before


def test_observed_text_is_stored_in_nfc(tmp_path: Path) -> None:
    """A decomposed question and tag are stored composed: one spelling per text."""
    with MsmMem.init(tmp_path / "s", ADMIN) as mem:
        item = mem.observe(
            AGENT, "P1", np.ones((8, 8), dtype=np.float32), "Is the re\u0301sume\u0301 clear?", visual_tag="A\u030a"
        )
        (stored,) = mem.stm_items(AGENT, "P1")
        assert stored.item_id == item.item_id
        assert (stored.payload.question, stored.payload.visual_tag) == ("Is the r\u00e9sum\u00e9 clear?", "\u00c5")


def test_api_image_path_is_bounded(tmp_path: Path, views: Views) -> None:
    """A FIFO, a device or a huge declared image given to ask is an ImageError, at once, and
    no memory is written (the failed turn is audited as a failure)."""
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.png"
    huge.write_bytes(png_declaring(9000, 9000))
    with MsmMem.init(tmp_path / "s", ADMIN) as mem:
        for image, match in ((fifo, "not a regular file"), ("/dev/zero", "not a regular file"), (huge, "too large")):
            with pytest.raises(ImageError, match=match):
                mem.ask(AGENT, "P1", str(image), "What is seen?")
            with pytest.raises(ImageError, match=match):
                mem.observe(AGENT, "P1", image, "What is seen?")
        assert len(views(mem).store.stm_list()) == 0 and views(mem).store.count("episodic") == 0
        with pytest.raises(ImageError, match="exceeds the limit"):
            mem.retrieve(AGENT, "P1", np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), (9000, 9000), (0, 0)))


def test_consent_grant_checks_the_patient_id(tmp_path: Path) -> None:
    """A consent names one valid patient or the wildcard '*'; a control character is refused."""
    with MsmMem.init(tmp_path / "s", ADMIN) as mem:
        before = _written(mem)
        bad = ConsentRecord("C-1", "\x00retired", "role:agent", "treatment", "permit", ("*",), 0.0)
        with pytest.raises(InvalidInput, match="consent patient_id"):
            mem.grant(ADMIN, [bad])
        assert _written(mem) == before
        mem.grant(ADMIN, [ConsentRecord("C-2", "*", "role:critic", "treatment", "permit", ("*",), 0.0)])


def test_an_auditor_lists_consents_of_a_shredded_patient_without_a_link(tmp_path: Path) -> None:
    """The auditor's consent listing shows pseudonyms; after a shred it lists the others, and
    none of the shredded patient's (erased with them), instead of failing."""
    from msm_mem import Principal

    auditor = Principal("aud-1", "auditor", "audit")
    with MsmMem.init(tmp_path / "s", ADMIN) as mem:
        mem.ask(AGENT, "P1", png(tmp_path, 1), "What is the impression?")
        now = mem.now()
        mem.grant(ADMIN, [ConsentRecord("C-p1", "P1", "role:clinician", "research", "permit", ("*",), now, None, now)])
        before = {c.consent_id: c.patient_id for c in mem.consents(auditor)}
        assert before["C-p1"].startswith("pt-")
        mem.shred(ADMIN, "P1", "erasure request")
        after = {c.consent_id: c.patient_id for c in mem.consents(auditor)}
        assert "C-p1" not in after  # the patient's consent records are erased with them
        assert "P1" not in after.values()
