"""Tests of consent (msm_mem._governance.consent): permits, denies, periods, revocation, audit."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from msm_mem import Principal, Role
from msm_mem._api.mem import MsmMem
from msm_mem._errors import ConsentDenied, InvalidInput
from msm_mem._governance.consent import DATA_CLASSES, ConsentDecision, default_policy, evaluate
from msm_mem._records import new_id
from msm_mem._tier_records import ConsentRecord
from msm_mem.testing import FixedBackbone, FixedClock
from tests.conftest import MemFactory
from tests.helpers import ADMIN, AGENT, audit_events
from tests.layers import Layers, layers_of

pytestmark = pytest.mark.cluster

T0 = 1_700_000_000.0
A1 = Principal("a1", Role.AGENT)  # purpose treatment
ANSWER = "Bilateral lower lobe opacities consistent with pneumonia"


def _png(folder: Path, seed: int) -> Path:
    path = folder / f"img{seed}.png"
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (64, 64), dtype=np.uint8), mode="L").save(path)
    return path


def _consent(
    patient: str = "P1",
    grantee: str = "role:agent",
    purpose: str = "treatment",
    decision: str = "permit",
    classes: tuple[str, ...] = ("*",),
    start: float = 0.0,
    end: float | None = None,
    revoked_at: float | None = None,
) -> ConsentRecord:
    return ConsentRecord(new_id("C"), patient, grantee, purpose, decision, classes, start, end, T0, revoked_at)


def _ask(
    consents: list[ConsentRecord],
    *,
    patient: str = "P1",
    actor: str = "a1",
    role: str = "agent",
    purpose: str = "treatment",
    classes: tuple[str, ...] = DATA_CLASSES,
    when: float = T0,
) -> ConsentDecision:
    return evaluate(consents, patient=patient, actor=actor, role=role, purpose=purpose, classes=classes, when=when)


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(T0)


@pytest.fixture
def bare(new_mem: MemFactory, clock: FixedClock) -> Iterator[MsmMem]:
    """A store with no consent records at all (everything denied)."""
    mem = new_mem("s", clock=clock, policy=[], backbone=FixedBackbone(ANSWER, "treat"))
    yield mem
    mem.close()


@pytest.fixture
def layers(bare: MsmMem, clock: FixedClock) -> Iterator[Layers]:
    """The governed tiers (with their consent checks), store and audit log of ``bare``."""
    with layers_of(bare, clock) as built:
        yield built


# evaluate -----------------------------------------------------------------------------------


def test_no_consent_denies() -> None:
    """Silence denies: no records means no permit and no deciding consent id."""
    decision = _ask([])
    assert decision == ConsentDecision(False, "", "no matching permit")


def test_role_and_actor_grantees_permit() -> None:
    """A permit names a role or a single actor; both match."""
    by_role, by_actor = _consent(grantee="role:agent"), _consent(grantee="actor:a1")
    assert _ask([by_role]) == ConsentDecision(True, by_role.consent_id, "permitted")
    assert _ask([by_actor]).permitted
    assert not _ask([by_actor], actor="a2").permitted
    assert not _ask([by_role], role="clinician").permitted


def test_patient_and_purpose_must_match() -> None:
    """Another patient's permit or another purpose does not match; ``*`` matches any."""
    assert not _ask([_consent(patient="P2")]).permitted
    assert _ask([_consent(patient="*")]).permitted
    assert not _ask([_consent(purpose="research")]).permitted
    assert _ask([_consent(purpose="*")], purpose="research").permitted


@pytest.mark.parametrize("order", ["deny_first", "permit_first"])
def test_deny_wins_over_permit(order: str) -> None:
    """A matching deny wins whatever the record order, and names the deny as the decider."""
    permit, deny = _consent(), _consent(decision="deny", grantee="actor:a1")
    records = [deny, permit] if order == "deny_first" else [permit, deny]
    decision = _ask(records)
    assert decision == ConsentDecision(False, deny.consent_id, "denied by consent")


def test_deny_of_an_untouched_class_does_not_deny() -> None:
    """A deny on visual data does not block a request that touches only semantic data."""
    records = [_consent(), _consent(decision="deny", classes=("visual",))]
    assert _ask(records, classes=("semantic",)).permitted
    assert not _ask(records, classes=("semantic", "visual")).permitted


@pytest.mark.parametrize("cls", DATA_CLASSES)
def test_permit_must_cover_every_requested_class(cls: str) -> None:
    """A permit for some classes does not cover a request that also needs another class."""
    only = _consent(classes=(cls,))
    assert _ask([only], classes=(cls,)).permitted
    assert not _ask([only], classes=DATA_CLASSES).permitted
    assert _ask([_consent(classes=DATA_CLASSES)], classes=DATA_CLASSES).permitted


def test_data_classes_are_the_five_memories() -> None:
    """The data classes are the three LTM memories, short-term memory and claims."""
    assert set(DATA_CLASSES) == {"episodic", "visual", "semantic", "stm", "claims"}


def test_period_bounds() -> None:
    """A consent is in force from start (inclusive) to end (exclusive)."""
    c = _consent(start=T0, end=T0 + 100)
    assert not _ask([c], when=T0 - 1).permitted
    assert _ask([c], when=T0).permitted
    assert _ask([c], when=T0 + 99.5).permitted
    assert not _ask([c], when=T0 + 100).permitted


def test_revoked_consent_denies_from_revocation_on() -> None:
    """A revoked permit still covered the time before its revocation, not after."""
    c = _consent(revoked_at=T0 + 10)
    assert _ask([c], when=T0 + 9).permitted
    assert not _ask([c], when=T0 + 10).permitted


def test_revoked_deny_no_longer_denies() -> None:
    """Revoking a deny lets the permit through again."""
    records = [_consent(), _consent(decision="deny", revoked_at=T0 - 1)]
    assert _ask(records).permitted


@pytest.mark.parametrize(
    "kwargs",
    [
        {"decision": "maybe"},
        {"grantee": "agent"},
        {"grantee": "role:"},
        {"purpose": ""},
        {"patient": ""},
        {"classes": ()},
        {"start": T0, "end": T0},
    ],
)
def test_malformed_consent_records_are_refused(kwargs: dict[str, object]) -> None:
    """Consent records validate decision, grantee, purpose, patient, classes and period."""
    with pytest.raises(InvalidInput):
        _consent(**kwargs)  # type: ignore[arg-type]


def test_default_policy_is_treatment_and_operations_only() -> None:
    """The demo policy permits the care team for treatment and the system for operations, nothing else."""
    policy = default_policy(T0)
    assert _ask(policy, role="agent").permitted
    assert _ask(policy, role="critic").permitted
    assert _ask(policy, role="clinician", purpose="export").permitted
    assert _ask(policy, role="system", purpose="operations").permitted
    assert not _ask(policy, role="agent", purpose="research").permitted
    assert not _ask(policy, role="auditor").permitted
    assert not _ask(policy, role="admin").permitted
    assert not _ask(policy, role="system", purpose="treatment").permitted


# governed turns ------------------------------------------------------------------------------


def test_begin_without_permit_raises_and_audits_denial(layers: Layers) -> None:
    """No permit: ConsentDenied, nothing in STM, and one 'consent' event with outcome denied."""
    before = layers.store.audit_head()[0]
    with pytest.raises(ConsentDenied, match="no matching permit"):
        layers.gm.begin(A1, "P1")
    new = audit_events(layers.store)[before:]
    assert len(new) == 1
    event = new[0]
    assert (event.action, event.outcome, event.consent_id) == ("consent", "denied", "")
    assert event.reason == "no matching permit"
    assert event.actor == "a1" and event.role == "agent" and event.purpose == "treatment"
    assert event.patient.startswith("pt-") and "P1" not in event.patient
    assert layers.store.stm_list() == []
    assert layers.audit.verify().ok


def test_deny_record_names_itself_in_the_audit(bare: MsmMem, layers: Layers) -> None:
    """A deny that wins is the deciding consent id of the audited denial."""
    permit, deny = _consent(), _consent(decision="deny")
    bare.grant(ADMIN, [permit, deny])
    with pytest.raises(ConsentDenied, match="denied by consent"):
        layers.gm.begin(A1, "P1")
    last = audit_events(layers.store)[-1]
    assert (last.outcome, last.consent_id, last.reason) == ("denied", deny.consent_id, "denied by consent")


def test_permit_is_audited_with_its_consent_id(bare: MsmMem, layers: Layers) -> None:
    """A permitted turn carries the deciding consent id into every event it writes."""
    permit = _consent()
    bare.grant(ADMIN, [permit])
    bare.ask(AGENT, "P1", _png(bare.directory.parent, 1), "Any consolidation?")
    turn_events = [e for e in audit_events(layers.store) if e.action != "consent_grant"]
    assert turn_events and all(e.consent_id == permit.consent_id for e in turn_events)
    assert turn_events[0].action == "consent" and turn_events[0].outcome == "success"


def test_ask_without_consent_writes_nothing(bare: MsmMem, layers: Layers) -> None:
    """The agent's turn is refused before any STM or LTM write."""
    with pytest.raises(ConsentDenied):
        bare.ask(AGENT, "P1", _png(bare.directory.parent, 1), "Any consolidation?")
    assert layers.store.stm_list() == []
    assert layers.store.count("episodic") == layers.store.count("visual") == layers.store.count("semantic") == 0
    assert layers.store.claims_active("P1") == []


def test_revocation_denies_the_next_turn(bare: MsmMem, layers: Layers, clock: FixedClock) -> None:
    """After revoke() the same actor is denied; the revocation itself is audited."""
    permit = _consent()
    bare.grant(ADMIN, [permit])
    layers.gm.begin(A1, "P1")
    clock.advance(60)
    bare.revoke(ADMIN, permit.consent_id)
    assert audit_events(layers.store)[-1].action == "consent_revoke"
    assert audit_events(layers.store)[-1].record_ids == (permit.consent_id,)
    with pytest.raises(ConsentDenied):
        layers.gm.begin(A1, "P1")
    assert layers.store.consents("P1")[0].revoked_at == clock.now()


def test_expired_period_denies(bare: MsmMem, layers: Layers, clock: FixedClock) -> None:
    """A consent whose period ended no longer permits once the clock passes its end."""
    bare.grant(ADMIN, [_consent(start=T0, end=T0 + 3600)])
    layers.gm.begin(A1, "P1")
    clock.advance(3600)
    with pytest.raises(ConsentDenied):
        layers.gm.begin(A1, "P1")


def test_turn_requests_every_class_by_default(bare: MsmMem, layers: Layers) -> None:
    """A turn needs every data class; a permit for fewer is refused, a narrower request is not."""
    bare.grant(ADMIN, [_consent(classes=("episodic", "visual", "semantic"))])
    with pytest.raises(ConsentDenied):
        layers.gm.begin(A1, "P1")
    turn = layers.gm.begin(A1, "P1", classes=("episodic", "semantic"))
    assert turn.consent_id


def test_other_patients_permit_does_not_leak(bare: MsmMem, layers: Layers) -> None:
    """A permit for P2 does not let anyone act on P1."""
    bare.grant(ADMIN, [_consent(patient="P2")])
    layers.gm.begin(A1, "P2")
    with pytest.raises(ConsentDenied):
        layers.gm.begin(A1, "P1")


def test_turn_needs_a_patient_scope(layers: Layers) -> None:
    """A turn without a patient id is invalid input, before any consent check."""
    for patient in ("", "  "):
        with pytest.raises(InvalidInput):
            layers.gm.begin(A1, patient)


def test_grant_is_audited_with_pseudonym(bare: MsmMem, layers: Layers) -> None:
    """Granting consent appends one event per record naming the consent id and the pseudonym."""
    c = _consent(patient="P-secret-42")
    bare.grant(ADMIN, [c])
    event = audit_events(layers.store)[-1]
    assert (event.action, event.record_ids, event.consent_id) == ("consent_grant", (c.consent_id,), c.consent_id)
    assert event.patient.startswith("pt-")
    assert b"P-secret-42" not in next(iter(reversed(list(layers.store.iter_audit())))).payload


def test_population_prior_respects_other_patients_deny(new_mem: MemFactory, tmp_path: Path, clock: FixedClock) -> None:
    """A patient who denied the agent must not feed another patient's answer."""
    mem = new_mem("s", clock=clock, policy=[], backbone=FixedBackbone(ANSWER, "treat"))
    try:
        mem.grant(ADMIN, [_consent(patient="*")])
        mem.ask(AGENT, "P2", _png(tmp_path, 2), "Any consolidation?")
        mem.grant(ADMIN, [_consent(patient="P2", decision="deny")])
        answer = mem.ask(AGENT, "P1", _png(tmp_path, 3), "Any consolidation?")
        with layers_of(mem) as layers:
            p2_ids = set(layers.store.record_ids("episodic", "P2")) | set(layers.store.record_ids("visual", "P2"))
        read = {i for e in audit_events(mem) if e.action == "read" for i in e.record_ids}
        assert not (p2_ids & read), "P2's records were read in P1's turn despite P2's deny"
        assert answer.answer
    finally:
        mem.close()


def test_grant_refuses_unknown_classes_and_roles(new_mem: MemFactory) -> None:
    """A consent naming an unknown data class or role is refused and nothing is stored."""
    from msm_mem._errors import InvalidInput as _Invalid

    mem = new_mem("g", policy=[])
    try:
        before = len(mem.consents(ADMIN))
        for bad in (
            ConsentRecord("C-x", "P1", "role:agent", "treatment", "permit", ("episodc",), 0.0),
            ConsentRecord("C-y", "P1", "role:clinican", "treatment", "permit", ("*",), 0.0),
        ):
            with pytest.raises(_Invalid):
                mem.grant(ADMIN, [bad])
        assert len(mem.consents(ADMIN)) == before
    finally:
        mem.close()


def test_grant_refuses_an_actor_grantee_outside_the_id_grammar(new_mem: MemFactory) -> None:
    """Grantee actor:evil one is refused naming the actor id rule, and nothing is stored."""
    mem = new_mem("g", policy=[])
    try:
        bad = ConsentRecord("C-z", "P1", "actor:evil one", "treatment", "permit", ("*",), 0.0)
        with pytest.raises(InvalidInput, match=r"grantee actor:<id> must be .*no spaces"):
            mem.grant(ADMIN, [bad])
        bad_id = ConsentRecord("C-\u202ez", "P1", "actor:a1", "treatment", "permit", ("*",), 0.0)
        with pytest.raises(InvalidInput, match=r"consent_id .*U\+202E"):
            mem.grant(ADMIN, [bad_id])
        assert not any(c.grantee == "actor:evil one" for c in mem.consents(ADMIN))
    finally:
        mem.close()
