"""Model-based testing of the public API: a Hypothesis state machine drives ``MsmMem`` (asks
with write-back, observe and consolidate, critic verdicts, ingest, consent grants and
revocations, shredding, the clock moving forward and maintenance) and checks every read against
a small reference model after every step.

The model predicts from the documented rules and never calls the implementation: the gate
(novel when the image is not among the patient's live records; the answer's length and keyword
are stated in ``tests/strategies.py``), supersession (one active claim per study and one active
semantic version, a bounded impression history ordered by study time), the short-term
lifecycle (TTL, held items retried once at the age threshold), critic verdicts superseding every
record of the judged study (the episode and its visual record by critic copies, the study's
other unverified episodes and visual records, its other held items discarded), decay
(``decay_at`` from the ranking's half-lives and tier weights, counted from the study's clinical
time; active records anonymised, superseded ones and semantic versions retracted, both leaving
the patient), consent (a revoked permit refuses the next call
and the refusal is audited) and shredding (everything refused afterwards). Record ids are
random, so the model names records by the interaction that made them: every question carries
its number (``Q7: ...``).

Examples per run: ``MODEL_EXAMPLES`` per backend; ``MSM_MEM_MODEL_EXAMPLES=N`` runs N examples
of up to ``MSM_MEM_MODEL_STEPS`` (default 40) steps on each backend instead.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from msm_mem import (
    AccessDenied,
    ConsentDenied,
    ConsentRecord,
    ManifestRow,
    MsmMem,
    NotFound,
    Principal,
    Purpose,
    Role,
)
from msm_mem._governance.audit_event import AuditEvent
from msm_mem.plugins.backbones.base import BackboneReply, BackboneRequest
from msm_mem.testing import FixedClock
from tests import strategies as s
from tests.helpers import ADMIN, AGENT, AUDITOR, CLINICIAN, CRITIC, INGEST, SYSTEM, png

T0 = 1_700_000_000.0
DAY = 86_400.0
#: every interaction of a study shares the study's UTC time
STUDY_TIME = {"S1": T0 - 90 * DAY, "S2": T0 - 60 * DAY, "S3": T0 - 30 * DAY}
#: reads every patient's memory for the invariants: role system, purpose operations, permitted on
#: every patient by a consent the machine never revokes (the revocable ones are per role)
CHECKER = Principal("model-checker", Role.SYSTEM, Purpose.OPERATIONS)
READERS = {"agent": AGENT, "clinician": CLINICIAN, "critic": CRITIC}

# the documented decay rule (docs/design.md, "Ranking and decay"): a record decays when
# confidence x tier weight x 0.5 ** (age / half-life) falls below 0.05, aged from its clinical
# time (the study's time; a semantic version's newest impression)
HALF_LIFE_DAYS = {"episodic": 365.0, "visual": 365.0, "claims": 365.0, "semantic": 180.0}
TIER_WEIGHT = {"ground_truth": 1.0, "critic": 0.95, "agent": 0.6}
THRESHOLD = 0.05
STM_TTL = 86_400.0
AGE_THRESHOLD = 3600.0
HISTORY = 5
K = 5  # hits per episodic / visual read


def decays(observed: float, confidence: float, tier: str, kind: str) -> float:
    return observed + HALF_LIFE_DAYS[kind] * DAY * math.log2(confidence * TIER_WEIGHT[tier] / THRESHOLD)


# the model ----------------------------------------------------------------------------------


@dataclass(eq=False)
class Epi:
    qid: int
    image: int
    study: str
    answer: str
    tier: str
    decay: float
    state: str = "active"


@dataclass(eq=False)
class Vis:
    image: int
    tier: str
    decay: float
    episode: Epi | None = None
    state: str = "active"


@dataclass(eq=False)
class Clm:
    key: str
    content: str
    tier: str
    decay: float
    qid: int
    episode: Epi | None
    time: float | None = None  # the study's clinical time, when the claim knows it
    state: str = "active"


@dataclass(eq=False)
class Sem:
    version: int
    impressions: tuple[tuple[float, str], ...]
    tier: str
    created: float
    state: str = "active"

    @property
    def decay(self) -> float:
        return decays(self.impressions[-1][0] if self.impressions else self.created, 1.0, self.tier, "semantic")


@dataclass(eq=False)
class Stm:
    qid: int
    image: int
    study: str
    created: float
    answer: str | None = None
    state: str = "active"

    @property
    def payload(self) -> bool:
        return self.state == "active"


@dataclass
class Patient:
    episodes: list[Epi] = field(default_factory=list)
    visuals: list[Vis] = field(default_factory=list)
    claims: list[Clm] = field(default_factory=list)
    semantic: list[Sem] = field(default_factory=list)
    stm: list[Stm] = field(default_factory=list)
    shredded: bool = False

    def live_images(self) -> set[int]:
        """The images of the patient's live (active) records: what novelty compares against."""
        return {e.image for e in self.episodes if e.state == "active"} | {
            v.image for v in self.visuals if v.state == "active"
        }

    def active_semantic(self) -> Sem | None:
        return next((v for v in self.semantic if v.state == "active"), None)

    def active_claim(self, key: str) -> Clm | None:
        return next((c for c in self.claims if c.key == key and c.state == "active"), None)


class Model:
    """What the store should hold, from the documented rules alone."""

    def __init__(self) -> None:
        self.now = T0
        self.patients = {p: Patient() for p in s.PATIENTS}
        self.permits: dict[tuple[str, str], str | None] = {}
        self.next_qid = 0

    def qid(self) -> int:
        self.next_qid += 1
        return self.next_qid

    def novel(self, p: str, image: int) -> bool:
        return image not in self.patients[p].live_images()

    def passes(self, p: str, image: int, answer: str) -> bool:
        return self.novel(p, image) and s.ANSWERS[answer]

    def write_records(
        self, p: str, item: Stm, answer: str, tier: str, confidence: float, *, visual: bool = True
    ) -> Epi:
        pt = self.patients[p]
        when = STUDY_TIME[item.study]
        epi = Epi(item.qid, item.image, item.study, answer, tier, decays(when, confidence, tier, "episodic"))
        pt.episodes.append(epi)
        if visual:  # another question about a study whose image has a visual record shares it
            pt.visuals.append(Vis(item.image, tier, decays(when, confidence, tier, "episodic"), epi))
        item.state, item.answer = "consolidated", None
        return epi

    def supersede_semantic(
        self, p: str, impression: tuple[float, str], tier: str, *, drop: float | None = None
    ) -> None:
        pt = self.patients[p]
        current = pt.active_semantic()
        previous = current.impressions if current else ()
        kept = [i for i in previous if drop is None or i[0] != drop]
        merged = tuple(sorted([*kept, impression], key=lambda i: i[0])[-HISTORY:])
        if current:
            current.state = "superseded"
        pt.semantic.append(Sem(current.version + 1 if current else 1, merged, tier, self.now))

    def supersede_claim(
        self,
        p: str,
        key: str,
        content: str,
        tier: str,
        confidence: float,
        qid: int,
        epi: Epi | None,
        when: float | None,
    ):
        pt = self.patients[p]
        old = pt.active_claim(key)
        if old:
            old.state = "superseded"
        claim = Clm(
            key, content, tier, decays(self.now if when is None else when, confidence, tier, "claims"), qid, epi
        )
        claim.time = when
        pt.claims.append(claim)
        return claim

    def consolidate(self, p: str, item: Stm, answer: str) -> bool:
        """STM -> LTM through the gate (agent tier); the semantic state and the claim follow."""
        written = self.passes(p, item.image, answer)
        epi = self.write_records(p, item, answer, "agent", 0.6) if written else None
        if not written:
            item.answer = answer  # a held item keeps its answer for the critic or the age sweep
        self.supersede_semantic(p, (STUDY_TIME[item.study], answer), "agent")
        self.supersede_claim(p, f"study:{item.study}", answer, "agent", 0.6, item.qid, epi, STUDY_TIME[item.study])
        return written

    def studies_stored(self, p: str) -> set[str]:
        return {e.study for e in self.patients[p].episodes}

    def questions_stored(self, p: str) -> set[tuple[str, int]]:
        """(study, question) of the patient's readable (active or superseded) episodes."""
        return {(e.study, e.qid) for e in self.patients[p].episodes if e.state in ("active", "superseded")}

    def study_qid(self, study: str) -> int:
        """The one question a manifest asks about ``study`` here (so re-ingesting it is skipped)."""
        return 10_000 + s.STUDIES.index(study)

    def maintain(self) -> dict[str, int]:
        counts = dict.fromkeys(("expired", "consolidated", "discarded", "anonymized", "retracted"), 0)
        for pt in self.patients.values():
            for item in pt.stm:
                if item.state == "active" and item.created + STM_TTL <= self.now:
                    item.state, item.answer = "expired", None
                    counts["expired"] += 1
        for p, pt in self.patients.items():
            for item in sorted(pt.stm, key=lambda i: i.created):
                if item.state != "active" or item.answer is None or item.created > self.now - AGE_THRESHOLD:
                    continue
                if self.passes(p, item.image, item.answer):
                    self.write_records(p, item, item.answer, "agent", 0.6)
                    counts["consolidated"] += 1
                else:
                    item.state, item.answer = "discarded", None
                    counts["discarded"] += 1
        for pt in self.patients.values():
            if pt.shredded:
                continue
            for records in (pt.episodes, pt.visuals, pt.claims, pt.semantic):
                for r in list(records):
                    if r.state in ("active", "superseded") and r.decay <= self.now:
                        active = r.state == "active" and not isinstance(r, Sem)
                        counts["anonymized" if active else "retracted"] += 1
                        records.remove(r)  # either way it leaves the patient (no patient id any more)
        return counts


# the system under test ------------------------------------------------------------------------


class ScriptedBackbone:
    """Answers with whatever the machine set last."""

    name = "scripted"

    def __init__(self) -> None:
        self.answer = next(iter(s.ANSWERS))

    def generate(self, request: BackboneRequest) -> BackboneReply:
        return BackboneReply(self.answer, source=self.name)


_Q = re.compile(r"^Q(\d+):")
_IMG = re.compile(r"img(\d+)\.png$")


def _qid(question: str) -> int:
    found = _Q.match(question)
    assert found, f"a question the machine did not ask: {question!r}"
    return int(found.group(1))


def _image(path: str) -> int:
    found = _IMG.search(path)
    assert found, f"a media path the machine did not give: {path!r}"
    return int(found.group(1))


def policy() -> list[ConsentRecord]:
    """Per-patient treatment permits for the revocable roles; system operations on every patient."""
    records = [
        ConsentRecord(f"C-{p}-{role}-0", p, f"role:{role}", "treatment", "permit", ("*",), start=0.0)
        for p in s.PATIENTS
        for role in s.CONSENT_ROLES
    ]
    records.append(ConsentRecord("C-system", "*", "role:system", "operations", "permit", ("*",), start=0.0))
    return records


def make_machine(backend: str, options: Callable[..., dict[str, Any]]) -> type[RuleBasedStateMachine]:
    """The state machine class for one store backend (each example makes a new store)."""

    class MemoryMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.tmp = Path(tempfile.mkdtemp(prefix="msm-mem-model-"))
            self.images = self.tmp / "images"
            self.images.mkdir()
            self.clock = FixedClock(T0)
            self.backbone = ScriptedBackbone()
            self.mem = MsmMem.init(
                self.tmp / "store",
                ADMIN,
                **options(backend, clock=self.clock, policy=policy(), backbone=self.backbone),
            )
            self.model = Model()
            self.model.permits = {(c.patient_id, c.grantee[5:]): c.consent_id for c in policy()[:-1]}
            self.granted = 0
            #: every record id each patient's reads ever returned (to find them in another's)
            self.ids: dict[str, set[str]] = {p: set() for p in s.PATIENTS}

        def teardown(self) -> None:
            self.mem.close()
            shutil.rmtree(self.tmp, ignore_errors=True)

        # helpers --------------------------------------------------------------------------

        def tick(self, seconds: float = 1.0) -> None:
            """Every rule moves time a little, so no two writes share a creation time."""
            self.model.now = self.clock.advance(seconds)

        def image(self, seed: int) -> str:
            return str(png(self.images, seed))

        def refused(self, p: str, role: str) -> type[Exception] | None:
            """The error the model expects for ``role`` acting on ``p`` (None: allowed)."""
            if self.model.patients[p].shredded:
                return AccessDenied
            if role in s.CONSENT_ROLES and self.model.permits.get((p, role)) is None:
                return ConsentDenied
            return None

        def expect_refusal(self, error: type[Exception], principal: Principal, call: Callable[[], object]) -> None:
            before = self.mem._store.audit_head()[0]
            with pytest.raises(error):
                call()
            new = [AuditEvent.from_row(*row) for row in self.mem._store.iter_audit(before + 1)]
            assert new, "a refusal must be audited"
            last = new[-1]
            assert (last.action, last.outcome, last.actor, last.role) == (
                "consent",
                "denied",
                principal.id,
                principal.role.value,
            )
            if error is AccessDenied:
                assert last.reason == "patient_shredded" and last.patient == ""

        def attempt(self, p: str, principal: Principal, call: Callable[[], Any]) -> Any:
            """Run ``call`` as ``principal`` on ``p``: refused when the model says so (checking the
            audited refusal and returning None), else its result."""
            error = self.refused(p, principal.role.value)
            if error is not None:
                event(f"refused: {error.__name__}")
                self.expect_refusal(error, principal, call)
                return None
            return call()

        def active_item(self, p: str, pick: int) -> Stm | None:
            active = [i for i in self.model.patients[p].stm if i.state == "active"]
            return active[pick % len(active)] if active else None

        def item_id(self, p: str, item: Stm) -> str:
            found = [
                i.item_id
                for i in self.mem.stm_items(CHECKER, p)
                if i.payload is not None and _qid(i.payload.question) == item.qid
            ]
            assert len(found) == 1, f"Q{item.qid} should be one active item of {p}"
            return found[0]

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
            item = Stm(qid, image, study, self.model.now)
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
            self.model.patients[p].stm.append(Stm(qid, image, study, self.model.now))

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

        @rule(p=s.patients, study=s.studies, accept=st.booleans(), correction=s.corrections)
        def feedback(self, p: str, study: str, accept: bool, correction: str) -> None:
            self.tick()
            key = f"study:{study}"
            pt = self.model.patients[p]
            old = pt.active_claim(key)
            if self.refused(p, "critic") is None and old is None:
                with pytest.raises(NotFound):
                    self.mem.feedback(CRITIC, p, study, accept=accept, correction=correction)
                return
            got = self.attempt(
                p, CRITIC, lambda: self.mem.feedback(CRITIC, p, study, accept=accept, correction=correction)
            )
            if got is None:
                return
            assert old is not None
            text = old.content if accept else correction
            # the study's time: the claim's, else where it is known (a live short-term payload or
            # an episode of it); without one the verdict is dated now
            known = any(i.payload and i.study == study for i in pt.stm) or any(e.study == study for e in pt.episodes)
            when = old.time if old.time is not None else STUDY_TIME[study] if known else None
            # every record of the judged study is superseded at the critic's tier (propagation.py)
            epi = old.episode
            primary = epi if epi is not None and epi.state == "active" and epi in pt.episodes else None
            judged = [
                e
                for e in pt.episodes
                if e.state == "active" and (e is primary or (e.study == study and e.tier == "agent"))
            ]
            fixed = None
            for e in judged:
                e.state = "superseded"
                if e is primary:
                    event("feedback: episode superseded by the critic's copy")
                    fixed = Epi(
                        e.qid, e.image, e.study, text, "critic", decays(STUDY_TIME[e.study], 1.0, "critic", "episodic")
                    )
                    pt.episodes.append(fixed)
            for v in list(pt.visuals):
                if v.state == "active" and v.episode in judged:
                    v.state = "superseded"
                    if fixed is not None and v.episode is primary:
                        pt.visuals.append(Vis(v.image, "critic", fixed.decay, fixed))
            if fixed is not None:
                epi = fixed
            elif epi is None:
                held = next((i for i in pt.stm if i.qid == old.qid and i.state == "active"), None)
                if held is not None:  # the verdict promotes the held item past the gate
                    event("feedback: held item promoted")
                    epi = self.model.write_records(p, held, text, "critic", 1.0)
            for i in pt.stm:  # the study's other held answers: the verdict is their outcome
                if i.state == "active" and i.study == study and i.answer is not None and i.qid != old.qid:
                    event("feedback: held item discarded")
                    i.state, i.answer = "discarded", None
            self.model.supersede_claim(p, key, text, "critic", 1.0, old.qid, epi, when)
            if pt.active_semantic() is not None:
                self.model.supersede_semantic(p, (self.model.now if when is None else when, text), "critic", drop=when)
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
                p, key = row.patient_id, (row.study_id, _qid(row.question))
                unreadable = row.study_id in imaged[p] and row.study_id not in {st for st, _ in asked[p]}
                if key in asked[p] or unreadable:
                    skipped += 1
                    continue
                asked[p].add(key)
                todo.append(row)
            if any(self.model.patients[r.patient_id].shredded for r in todo):
                with pytest.raises(AccessDenied):
                    self.mem.ingest(INGEST, manifest)
                return
            report = self.mem.ingest(INGEST, manifest)
            if skipped:
                event("ingest: already stored")
            assert (report.ingested, report.already_stored, report.problems) == (len(todo), skipped, ())
            for row in todo:
                p = row.patient_id
                item = Stm(_qid(row.question), _image(row.image), row.study_id, self.model.now)
                self.model.patients[p].stm.append(item)
                visual = row.study_id not in self.model.studies_stored(p)
                epi = self.model.write_records(p, item, row.answer, "ground_truth", 1.0, visual=visual)
                self.model.supersede_semantic(p, (row.timestamp, row.answer), "ground_truth")
                self.model.supersede_claim(
                    p, f"study:{row.study_id}", row.answer, "ground_truth", 1.0, item.qid, epi, row.timestamp
                )

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
            for records in (pt.episodes, pt.visuals, pt.claims, pt.semantic):
                for r in records:
                    r.state = "retracted"
            for item in pt.stm:
                if item.state == "active":
                    item.state, item.answer = "discarded", None

        # rules: reads -------------------------------------------------------------------------

        @rule(
            p=s.patients, role=s.consent_roles, which=st.sampled_from(("semantic_state", "episodes", "claims", "stm"))
        )
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
                        assert _qid(item.record.question) in {e.qid for e in pt.episodes}
            if not population:
                assert all(i.record is not None and i.record.patient_id == p for i in got.items)
                kinds = sorted(i.evidence.kind for i in got.items)
                n_epi = min(K, sum(e.state == "active" for e in pt.episodes))
                n_vis = min(K, sum(v.state == "active" for v in pt.visuals))
                n_sem = int(pt.active_semantic() is not None)
                assert kinds == sorted(["episodic"] * n_epi + ["semantic"] * n_sem + ["visual"] * n_vis)

        # reads and their expectations ---------------------------------------------------------

        def _own(self, p: str, records: list[Any]) -> list[Any]:
            for r in records:
                assert r.patient_id == p, f"a record of {r.patient_id!r} in a read of {p!r}"
            return records

        def _semantic_state(self, p: str, got: list[Any]) -> list[tuple[Any, ...]]:
            return [(v.version, tuple((i.timestamp, i.text) for i in v.impressions)) for v in self._own(p, got)]

        def _expect_semantic_state(self, p: str) -> list[tuple[Any, ...]]:
            v = self.model.patients[p].active_semantic()
            return [(v.version, v.impressions)] if v else []

        def _semantic_history(self, p: str, got: list[Any]) -> list[tuple[Any, ...]]:
            return [
                (v.version, v.state.value, v.evidence_tier, tuple((i.timestamp, i.text) for i in v.impressions))
                for v in self._own(p, got)
            ]

        def _expect_semantic_history(self, p: str) -> list[tuple[Any, ...]]:
            versions = sorted(self.model.patients[p].semantic, key=lambda v: v.version)
            return [(v.version, v.state, v.tier, v.impressions) for v in versions]

        def _episodes(self, p: str, got: list[Any]) -> list[tuple[Any, ...]]:
            return sorted(
                (_qid(e.question), e.answer, e.state.value, e.evidence_tier, e.study_id, _image(e.media_path))
                for e in self._own(p, got)
            )

        def _expect_episodes(self, p: str) -> list[tuple[Any, ...]]:
            return sorted((e.qid, e.answer, e.state, e.tier, e.study, e.image) for e in self.model.patients[p].episodes)

        def _visuals(self, p: str, got: list[Any]) -> list[tuple[Any, ...]]:
            return sorted((_image(v.media_path), v.state.value, v.evidence_tier) for v in self._own(p, got))

        def _expect_visuals(self, p: str) -> list[tuple[Any, ...]]:
            return sorted((v.image, v.state, v.tier) for v in self.model.patients[p].visuals)

        def _claims(self, p: str, got: list[Any]) -> list[tuple[Any, ...]]:
            return sorted((c.key, c.content, c.evidence_tier) for c in self._own(p, got))

        def _expect_claims(self, p: str) -> list[tuple[Any, ...]]:
            return sorted((c.key, c.content, c.tier) for c in self.model.patients[p].claims if c.state == "active")

        def _claim_history(self, p: str, got: list[Any]) -> list[tuple[Any, ...]]:
            return [(c.content, c.evidence_tier, c.state.value) for c in self._own(p, got)]

        def _expect_claim_history(self, p: str, key: str) -> list[tuple[Any, ...]]:
            return [(c.content, c.tier, c.state) for c in self.model.patients[p].claims if c.key == key]

        def _stm(self, p: str, got: list[Any]) -> list[tuple[Any, ...]]:
            out = []
            for i in self._own(p, got):
                pay = i.payload
                out.append((i.state.value, _qid(pay.question) if pay else None, pay.answer if pay else None))
            return sorted(out, key=repr)

        def _expect_stm(self, p: str) -> list[tuple[Any, ...]]:
            out = [
                (i.state, i.qid if i.payload else None, i.answer if i.payload else None)
                for i in self.model.patients[p].stm
            ]
            return sorted(out, key=repr)

        # invariants ---------------------------------------------------------------------------

        @invariant()
        def reads_equal_the_model(self) -> None:
            for p, pt in self.model.patients.items():
                if pt.shredded:
                    continue
                m = self.mem
                got = {
                    "semantic_state": m.semantic_state(CHECKER, p),
                    "semantic_history": m.semantic_history(CHECKER, p),
                    "episodes": m.episodes(CHECKER, p),
                    "visuals": m.visuals(CHECKER, p),
                    "claims": m.claims(CHECKER, p),
                    "stm": m.stm_items(CHECKER, p),
                }
                for name, records in got.items():
                    assert getattr(self, f"_{name}")(p, records) == getattr(self, f"_expect_{name}")(p), (p, name)
                # a claim under a key the model does not know would show in claims() while active
                for key in sorted({c.key for c in pt.claims}):
                    history = m.claim_history(CHECKER, p, key)
                    assert self._claim_history(p, history) == self._expect_claim_history(p, key), (p, key)
                    self.ids[p] |= {c.claim_id for c in history}
                self.ids[p] |= {e.episode_id for e in got["episodes"]} | {v.visual_id for v in got["visuals"]}
                self.ids[p] |= {v.state_id for v in got["semantic_history"]} | {i.item_id for i in got["stm"]}
            for p, ids in self.ids.items():
                others = set().union(*(other for q, other in self.ids.items() if q != p))
                assert not ids & others, f"a record id read as {p}'s and as another patient's"

        @invariant()
        def a_shredded_patient_is_unreadable(self) -> None:
            for p, pt in self.model.patients.items():
                if not pt.shredded:
                    continue
                m = self.mem
                for read in (m.semantic_state, m.semantic_history, m.episodes, m.visuals, m.claims, m.stm_items):
                    self.expect_refusal(AccessDenied, CHECKER, partial(read, CHECKER, p))
                self.expect_refusal(AccessDenied, CHECKER, partial(m.claim_history, CHECKER, p, "study:S1"))

        @invariant()
        def the_chain_verifies(self) -> None:
            result = self.mem.verify_audit(AUDITOR)
            assert result.ok, result.reason

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
