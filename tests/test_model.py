"""Model-based testing of the public API: a Hypothesis state machine drives ``MsmMem`` (asks
with write-back, observe and consolidate, critic verdicts, ingest, consent grants and
revocations, shredding, the clock moving forward and maintenance) and checks every read against
a small reference model after every step.

The model predicts from the documented rules and never calls the implementation: the gate
(novel when the image is not among the patient's live records; the answer's length and keyword
are stated in ``tests/strategies.py``), supersession (one active claim per question about a study and one active
semantic version, a bounded impression history ordered by study time), the short-term
lifecycle (TTL, held items retried once at the age threshold), critic verdicts superseding every
record of the judged study (the episode and its visual record by critic copies, the study's
other unverified episodes and visual records, its other held items discarded), decay
(due once the patient's last activity, its newest long-term write, plus the retention x
confidence x tier weight, a semantic version's the whole retention, has passed, whatever the
study's clinical time; active records
anonymised, superseded ones and semantic versions retracted, both leaving the patient),
consent (a revoked permit refuses the next call and the refusal is audited) and shredding
(everything refused afterwards). Record ids are random, so the model names records by the
interaction that made them: every question carries its number (``Q7: ...``).

Examples per run: ``MODEL_EXAMPLES`` per backend; ``MSM_MEM_MODEL_EXAMPLES=N`` runs N examples
of up to ``MSM_MEM_MODEL_STEPS`` (default 40) steps on each backend instead.

The reference model is ``tests/model_reference.py``; the machine's set-up, its reads projected to
the model's terms and its invariants are ``tests/model_machine.py``; this module holds its rules
and the tests.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule, run_state_machine_as_test

from msm_mem import AccessDenied, ConsentRecord, InvalidInput, ManifestRow, MsmMem, NotFound, claim_key
from msm_mem.testing import FixedClock
from tests import strategies as s
from tests.helpers import ADMIN, AGENT, CLINICIAN, CRITIC, INGEST, SYSTEM, png
from tests.model_machine import READERS, ModelMachine, image_of, qid_of
from tests.model_reference import STUDY_TIME, T0, Epi, K, Stm, Vis, keeps

pytestmark = pytest.mark.slow


class MemoryRules(ModelMachine):
    """The rules: every way the public API changes or reads a memory, each checked against the model."""

    # rules: writes ----------------------------------------------------------------------

    @rule(p=s.patients, image=s.images, study=s.studies, answer=s.answers, write_back=st.booleans())
    def ask(self, p: str, image: int, study: str, answer: str, write_back: bool) -> None:
        self.tick()
        self.backbone.answer = answer
        qid = self.model.qid()
        got = self.attempt(
            p,
            AGENT,
            lambda: self.mem.ask(
                AGENT,
                p,
                self.image(image),
                f"Q{qid}: any change since the last study?",
                timestamp=STUDY_TIME[study],
                study_id=study,
                write_back=write_back,
            ),
        )
        if got is None:
            return
        assert got.answer == answer
        item = Stm(qid, image, study, self.model.now, question=f"Q{qid}: any change since the last study?")
        self.model.patients[p].stm.append(item)
        if write_back:
            written = self.model.consolidate(p, item, answer)
            event(f"ask: {'written' if written else 'held'}")
            assert got.gate is not None and got.gate.written == written, got.gate
        else:
            assert got.gate is None
        # the evidence trail is the patient's own, and other patients' records appear only as
        # population evidence (de-identified copies), of a patient whose consent permits it
        assert {e.id for e in got.evidence if not e.kind.startswith("population-")} <= self.ids[p]
        for e in got.evidence:
            owner = next((q for q, ids in self.ids.items() if q != p and e.id in ids), None)
            if owner is not None:
                assert e.kind.startswith("population-") and self.refused(owner, "agent") is None, (e, owner)

    @rule(p=s.patients, image=s.images, study=s.studies)
    def observe(self, p: str, image: int, study: str) -> None:
        self.tick()
        qid = self.model.qid()
        got = self.attempt(
            p,
            AGENT,
            lambda: self.mem.observe(
                AGENT, p, self.image(image), f"Q{qid}: working note", timestamp=STUDY_TIME[study], study_id=study
            ),
        )
        if got is None:
            return
        assert got.patient_id == p and got.state.value == "active"
        self.model.patients[p].stm.append(Stm(qid, image, study, self.model.now, question=f"Q{qid}: working note"))

    @rule(p=s.patients, pick=st.integers(0, 7), answer=s.answers)
    def consolidate(self, p: str, pick: int, answer: str) -> None:
        """The explicit consolidate of an active item: written when the gate lets it through,
        else held with its answer (for the critic or the age sweep)."""
        self.tick()
        item = self.active_item(p, pick)
        if item is None:
            return
        item_id = self.item_id(p, item)
        got = self.attempt(p, AGENT, lambda: self.mem.consolidate(AGENT, p, item_id, answer))
        if got is None:
            return
        assert got.gate.written == self.model.consolidate(p, item, answer)

    @rule(p=s.patients, other=s.patients, pick=st.integers(0, 7))
    def consolidate_across_patients(self, p: str, other: str, pick: int) -> None:
        """Another patient's short-term item is not found in this patient's scope."""
        self.tick()
        item = self.active_item(other, pick)
        if other == p or item is None or self.refused(p, "agent"):
            return
        item_id = self.item_id(other, item)
        with pytest.raises(NotFound):
            self.mem.consolidate(AGENT, p, item_id, next(iter(s.ANSWERS)))

    @rule(p=s.patients, study=s.studies, accept=st.booleans(), correction=s.corrections, pick=st.integers(0, 7))
    def feedback(self, p: str, study: str, accept: bool, correction: str, pick: int) -> None:
        """A verdict on one question about a study: the question's newest held answer, else
        its active claim, is judged; without a question a study must hold answers to one."""
        self.tick()
        pt = self.model.patients[p]
        # the study's open questions: of its active claims, and of its held (answered) items
        claims = {c.key: c for c in pt.claims if c.state == "active" and c.key.startswith(f"study:{study}|q:")}
        held_items = [i for i in pt.stm if i.state == "active" and i.study == study and i.answer is not None]
        keys = set(claims) | {claim_key(study, i.question) for i in held_items}
        texts = {k: self.model.key_questions[k] for k in claims}
        texts.update({claim_key(study, i.question): i.question for i in held_items})
        ordered = sorted(keys)
        question = None if pick == 7 or not ordered else texts[ordered[pick % len(ordered)]]

        def call() -> Any:
            return self.mem.feedback(CRITIC, p, study, accept=accept, correction=correction, question=question)

        if self.refused(p, "critic") is None and not ordered:
            with pytest.raises(NotFound):
                call()
            return
        if self.refused(p, "critic") is None and question is None and len(ordered) > 1:
            event("feedback: the question must be named")
            with pytest.raises(InvalidInput, match="name the question"):
                call()
            return
        got = self.attempt(p, CRITIC, call)
        if got is None:
            return
        key = ordered[0] if question is None else claim_key(study, question)
        old = claims.get(key)
        held = [i for i in held_items if claim_key(study, i.question) == key]
        item = max(held, key=lambda i: i.created) if held else None
        judged = item.answer if item is not None else old.content if old is not None else None
        assert judged is not None
        text = judged if accept else correction
        # the study's time: the claim's, else where it is known (a live short-term payload or
        # an episode of it); without one the verdict is dated now
        known = any(i.payload and i.study == study for i in pt.stm) or any(e.study == study for e in pt.episodes)
        when = old.time if old is not None and old.time is not None else STUDY_TIME[study] if known else None
        # the records of the judged answer are superseded at the critic's tier (propagation.py):
        # the claim's episode, and the question's other unverified episodes
        epi = old.episode if old is not None else None
        primary = epi if epi is not None and epi.state == "active" and epi in pt.episodes else None
        judged_episodes = [
            e
            for e in pt.episodes
            if e.state == "active"
            and (e is primary or (e.study == study and e.tier == "agent" and claim_key(study, e.question) == key))
        ]
        fixed = None
        for e in judged_episodes:
            e.state = "superseded"
            if e is primary:
                event("feedback: episode superseded by the critic's copy")
                fixed = Epi(e.qid, e.image, e.study, text, "critic", keeps(1.0, "critic"), self.model.now)
                fixed.question = e.question
                pt.episodes.append(fixed)
        for v in list(pt.visuals):
            if v.state == "active" and v.episode in judged_episodes:
                v.state = "superseded"
                if fixed is not None and v.episode is primary:
                    pt.visuals.append(Vis(v.image, "critic", fixed.keep, self.model.now, fixed))
        promoted = None
        if fixed is not None:
            epi = fixed
        elif item is not None:  # the verdict promotes the held item past the gate
            event("feedback: held item promoted")
            epi = self.model.write_records(p, item, text, "critic", 1.0)
            promoted = item
        for i in held_items:  # the question's other held answers: the verdict is their outcome
            if i is not promoted and i.state == "active" and claim_key(study, i.question) == key:
                event("feedback: held item discarded")
                i.state, i.answer = "discarded", None
        qid = old.qid if old is not None else item.qid if item is not None else 0
        self.model.key_questions[key] = texts[key]
        self.model.supersede_claim(p, key, text, "critic", 1.0, qid, epi, when)
        if pt.active_semantic() is not None:
            gone = {judged} | {e.answer for e in judged_episodes}
            at = self.model.now if when is None else when
            self.model.supersede_semantic(p, (at, text), "critic", drop=(when, gone))
        assert (got.key, got.content, got.evidence_tier) == (key, text, "critic")

    @initialize(rows=s.ingest_rows)
    def base_memory(self, rows: list[tuple[str, str, int, str]]) -> None:
        """Every example starts from a small base memory (ground truth)."""
        self.ingest(rows)

    @rule(rows=s.ingest_rows)
    def ingest(self, rows: list[tuple[str, str, int, str]]) -> None:
        self.tick()
        manifest = []
        for p, study, image, answer in rows:
            qid = self.model.study_qid(study)
            manifest.append(ManifestRow(p, study, STUDY_TIME[study], self.image(image), f"Q{qid}: report", answer))
        # a row is stored when its (study, question) is readable, or its study is stored but
        # none of it is readable (retracted); a study already stored keeps its one visual record
        todo, skipped, imaged = [], 0, {p: self.model.studies_stored(p) for p in s.PATIENTS}
        asked = {p: self.model.questions_stored(p) for p in s.PATIENTS}
        for row in sorted(manifest, key=lambda r: (r.timestamp, r.patient_id, r.study_id, r.question)):
            p, key = row.patient_id, (row.study_id, qid_of(row.question))
            unreadable = row.study_id in imaged[p] and row.study_id not in {st for st, _ in asked[p]}
            if key in asked[p] or unreadable:
                skipped += 1
                continue
            asked[p].add(key)
            todo.append(row)
        if any(self.model.patients[r.patient_id].shredded for r in manifest):  # (nothing of theirs to skip)
            with pytest.raises(AccessDenied):
                self.mem.ingest(INGEST, manifest)
            return
        report = self.mem.ingest(INGEST, manifest)
        if skipped:
            event("ingest: already stored")
        assert (report.ingested, report.already_stored, report.problems) == (len(todo), skipped, ())
        for row in todo:
            p = row.patient_id
            item = Stm(qid_of(row.question), image_of(row.image), row.study_id, self.model.now, question=row.question)
            self.model.patients[p].stm.append(item)
            visual = row.study_id not in self.model.studies_stored(p)
            epi = self.model.write_records(p, item, row.answer, "ground_truth", 1.0, visual=visual)
            self.model.supersede_semantic(p, (row.timestamp, row.answer), "ground_truth")
            key = claim_key(row.study_id, row.question)
            self.model.key_questions[key] = row.question
            self.model.supersede_claim(p, key, row.answer, "ground_truth", 1.0, item.qid, epi, row.timestamp)

    # rules: time and maintenance --------------------------------------------------------

    @rule(seconds=s.advances)
    def advance(self, seconds: float) -> None:
        self.tick(seconds)

    @rule(seconds=s.advances)
    def advance_and_maintain(self, seconds: float) -> None:
        self.tick(seconds)
        report = self.mem.maintain(SYSTEM)
        expected = self.model.maintain()
        got = {name: getattr(report, name) for name in expected}
        for name, n in expected.items():
            if n:
                event(f"maintain: {name}")
        assert got == expected

    # rules: consent and erasure ---------------------------------------------------------

    @rule(p=s.patients, role=s.consent_roles)
    def toggle_consent(self, p: str, role: str) -> None:
        """Revoke the patient's treatment permit for ``role``, or grant a new one."""
        self.tick()
        current = self.model.permits.get((p, role))
        if current is not None:
            self.mem.revoke(ADMIN, current)
            self.model.permits[(p, role)] = None
        elif self.model.patients[p].shredded:  # nothing more is recorded about a shredded patient
            record = ConsentRecord("C-late", p, f"role:{role}", "treatment", "permit", ("*",), start=self.model.now)
            with pytest.raises(AccessDenied):
                self.mem.grant(ADMIN, [record])
            assert not [c for c in self.mem.consents(ADMIN, p) if c.consent_id == "C-late"]
        else:
            self.granted += 1
            cid = f"C-{p}-{role}-{self.granted}"
            record = ConsentRecord(cid, p, f"role:{role}", "treatment", "permit", ("*",), start=self.model.now)
            self.mem.grant(ADMIN, [record])
            self.model.permits[(p, role)] = cid

    # one patient at most, so that the others keep the machine busy
    @precondition(lambda self: not any(pt.shredded for pt in self.model.patients.values()))
    @rule(p=s.patients)
    def shred(self, p: str) -> None:
        self.tick()
        pt = self.model.patients[p]
        self.mem.shred(ADMIN, p, "erasure request")
        pt.shredded = True
        for key in [k for k in self.model.permits if k[0] == p]:
            self.model.permits[key] = None  # the patient's consent records are erased with them
        for records in (pt.episodes, pt.visuals, pt.claims, pt.semantic):
            for r in records:
                r.state = "retracted"
        for item in pt.stm:
            if item.state == "active":
                item.state, item.answer = "discarded", None

    # rules: reads -------------------------------------------------------------------------

    @rule(p=s.patients, role=s.consent_roles, which=st.sampled_from(("semantic_state", "episodes", "claims", "stm")))
    def read(self, p: str, role: str, which: str) -> None:
        self.tick()
        principal = READERS[role]
        calls: dict[str, Callable[[], Any]] = {
            "semantic_state": lambda: self.mem.semantic_state(principal, p),
            "episodes": lambda: self.mem.episodes(principal, p),
            "claims": lambda: self.mem.claims(principal, p),
            "stm": lambda: self.mem.stm_items(principal, p),
        }
        got = self.attempt(p, principal, calls[which])
        if got is not None:
            assert getattr(self, f"_{which}")(p, got) == getattr(self, f"_expect_{which}")(p)

    @rule(p=s.patients, image=s.images, population=st.booleans(), role=s.consent_roles)
    def retrieve(self, p: str, image: int, population: bool, role: str) -> None:
        self.tick()
        principal = READERS[role]
        scope = "population" if population else "patient"
        got = self.attempt(p, principal, lambda: self.mem.retrieve(principal, p, self.image(image), scope=scope))
        if got is None:
            return
        pt = self.model.patients[p]
        for item in got.items:
            owner = next((q for q, ids in self.ids.items() if q != p and item.evidence.id in ids), None)
            if owner is not None:  # another patient's record: only under their consent, and only
                # withheld or as a de-identified copy (no patient, no source)
                if item.record is not None:
                    assert item.record.patient_id == "" and getattr(item.record, "source", "") == "", item
                assert population and self.refused(owner, role) is None, (owner, role)
            elif item.record is not None:
                assert item.record.patient_id in (p, ""), "another patient's record in this patient's retrieval"
                if getattr(item.record, "question", None) is not None and item.record.patient_id == p:
                    assert qid_of(item.record.question) in {e.qid for e in pt.episodes}
        if not population:
            assert all(i.record is not None and i.record.patient_id == p for i in got.items)
            kinds = sorted(i.evidence.kind for i in got.items)
            n_epi = min(K, sum(e.state == "active" for e in pt.episodes))
            n_vis = min(K, sum(v.state == "active" for v in pt.visuals))
            n_sem = int(pt.active_semantic() is not None)
            assert kinds == sorted(["episodic"] * n_epi + ["semantic"] * n_sem + ["visual"] * n_vis)


def make_machine(backend: str, options: Callable[..., dict[str, Any]]) -> type[RuleBasedStateMachine]:
    """The state machine class for one store backend (each example makes a new store)."""

    class MemoryMachine(MemoryRules):
        def __init__(self) -> None:
            super().__init__(backend, options)

    return MemoryMachine


# the tests --------------------------------------------------------------------------------------

#: examples and steps per backend in the suite (a PostgreSQL store costs a schema per example)
MODEL_EXAMPLES = {"sqlite": 25, "postgres": 10}
MODEL_STEPS = {"sqlite": 20, "postgres": 15}
_LONG = int(os.environ.get("MSM_MEM_MODEL_EXAMPLES", "0") or 0)
_LONG_STEPS = int(os.environ.get("MSM_MEM_MODEL_STEPS", "40") or 40)


@pytest.mark.parametrize("backend", [pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)])
def test_memory_matches_the_model(backend: str, init_options: Callable[..., dict[str, Any]]) -> None:
    """Over any sequence of writes, verdicts, consent changes, shredding, clock moves and
    maintenance, every read equals the reference model, no read crosses patients, a shredded
    patient is unreadable and the audit chain verifies after every step."""
    if backend == "postgres" and os.environ.get("MSM_MEM_SKIP_POSTGRES", "") not in ("", "0"):
        pytest.skip("MSM_MEM_SKIP_POSTGRES is set")
    run_state_machine_as_test(
        make_machine(backend, init_options),
        settings=settings(
            max_examples=_LONG or MODEL_EXAMPLES[backend],
            stateful_step_count=_LONG_STEPS if _LONG else MODEL_STEPS[backend],
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


# what the machine found -------------------------------------------------------------------------


def test_an_item_held_by_consolidate_keeps_its_answer(new_mem: Callable[..., MsmMem], tmp_path: Path) -> None:
    """An observed item that consolidate() holds at the gate keeps the answer it was held with,
    so the age sweep retries it once (and discards it) instead of leaving it to expire."""
    clock = FixedClock(T0)
    mem = new_mem(clock=clock)
    item = mem.observe(AGENT, "P1", str(png(tmp_path, 1)), "Q1: working note", study_id="S1")
    result = mem.consolidate(AGENT, "P1", item.item_id, "Consolidation.")  # one word: held
    assert not result.gate.written
    (held,) = mem.stm_items(CLINICIAN, "P1")
    assert held.state.value == "active" and held.payload is not None
    assert held.payload.answer == "Consolidation."
    clock.advance(2 * 3600.0)
    assert mem.maintain(SYSTEM).discarded == 1
