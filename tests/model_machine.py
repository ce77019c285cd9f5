"""The system under test of ``tests/test_model.py``: the state machine's set-up (a store per
example, a scripted backbone, the consent policy), its helpers, the reads projected to what the
reference model predicts (``tests/model_reference.py``), and the invariants checked after every
step. The rules that drive it are in ``tests/test_model.py``."""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event
from hypothesis.stateful import RuleBasedStateMachine, invariant

from msm_mem import AccessDenied, ConsentDenied, ConsentRecord, MsmMem, Principal, Purpose, Role
from msm_mem._governance.audit.event import AuditEvent
from msm_mem.plugins.backbones.base import BackboneReply, BackboneRequest
from msm_mem.testing import FixedClock
from tests import strategies as s
from tests.helpers import ADMIN, AGENT, AUDITOR, CLINICIAN, CRITIC, png
from tests.layers import layers_of
from tests.model_reference import T0, Model, Stm

#: reads every patient's memory for the invariants: role system, purpose operations, permitted on
#: every patient by a consent the machine never revokes (the revocable ones are per role)
CHECKER = Principal("model-checker", Role.SYSTEM, Purpose.OPERATIONS)
READERS = {"agent": AGENT, "clinician": CLINICIAN, "critic": CRITIC}


class ScriptedBackbone:
    """Answers with whatever the machine set last."""

    name = "scripted"

    def __init__(self) -> None:
        self.answer = next(iter(s.ANSWERS))

    def generate(self, request: BackboneRequest) -> BackboneReply:
        return BackboneReply(self.answer, source=self.name)


_Q = re.compile(r"^Q(\d+):")
_IMG = re.compile(r"img(\d+)\.png$")


def qid_of(question: str) -> int:
    """The number a question of the machine carries (``Q7: ...`` is 7)."""
    found = _Q.match(question)
    assert found, f"a question the machine did not ask: {question!r}"
    return int(found.group(1))


def image_of(path: str) -> int:
    """The seed of an image the machine wrote (``.../img3.png`` is 3)."""
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


class ModelMachine(RuleBasedStateMachine):
    """A new store per example on one backend, read back against the model after every step."""

    def __init__(self, backend: str, options: Callable[..., dict[str, Any]]) -> None:
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
        #: another handle on the store, to read its audit chain around the governed API
        self.view = layers_of(self.mem, self.clock)
        self.model = Model()
        self.model.permits = {(c.patient_id, c.grantee[5:]): c.consent_id for c in policy()[:-1]}
        self.granted = 0
        #: every record id each patient's reads ever returned (to find them in another's)
        self.ids: dict[str, set[str]] = {p: set() for p in s.PATIENTS}

    def teardown(self) -> None:
        self.view.close()
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
        before = self.view.store.audit_head()[0]
        with pytest.raises(error):
            call()
        new = [AuditEvent.from_row(*row) for row in self.view.store.iter_audit(before + 1)]
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
            if i.payload is not None and qid_of(i.payload.question) == item.qid
        ]
        assert len(found) == 1, f"Q{item.qid} should be one active item of {p}"
        return found[0]

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
            (qid_of(e.question), e.answer, e.state.value, e.evidence_tier, e.study_id, image_of(e.media_path))
            for e in self._own(p, got)
        )

    def _expect_episodes(self, p: str) -> list[tuple[Any, ...]]:
        return sorted((e.qid, e.answer, e.state, e.tier, e.study, e.image) for e in self.model.patients[p].episodes)

    def _visuals(self, p: str, got: list[Any]) -> list[tuple[Any, ...]]:
        return sorted((image_of(v.media_path), v.state.value, v.evidence_tier) for v in self._own(p, got))

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
            out.append((i.state.value, qid_of(pay.question) if pay else None, pay.answer if pay else None))
        return sorted(out, key=repr)

    def _expect_stm(self, p: str) -> list[tuple[Any, ...]]:
        out = [
            (i.state, i.qid if i.payload else None, i.answer if i.payload else None) for i in self.model.patients[p].stm
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
