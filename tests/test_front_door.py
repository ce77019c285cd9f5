"""The one front door: nothing public reaches patient data around MsmMem, and every public
operation of MsmMem checks its principal and leaves an audit event, refusals included."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import msm_mem
from msm_mem import AccessDenied, ConsentDenied, ManifestRow, MsmMem, MsmMemError, Principal, Purpose, Role
from msm_mem._agent.agent import MemoryAgent
from msm_mem._governance.audit.log import AuditLog
from msm_mem._governance.crypto import EnvelopeCipher
from msm_mem._memory.maintenance import Maintainer
from msm_mem._memory.msm import Memory
from msm_mem._memory.tiers import GovernedMemory, Turn
from msm_mem._storage.base import Store
from msm_mem.testing import FixedBackbone
from tests.conftest import MemFactory
from tests.helpers import ADMIN, AGENT, AUDITOR, CRITIC, EXPORTER, INGEST, SYSTEM, audit_events, png

pytestmark = pytest.mark.cluster

PRIVATE_TYPES = (Store, EnvelopeCipher, AuditLog, Memory, GovernedMemory, Maintainer, MemoryAgent)

#: an agent acting for a purpose no consent permits
RESEARCHER = Principal("agent-r", Role.AGENT, Purpose.RESEARCH)


def test_no_public_name_is_or_hands_out_a_private_part() -> None:
    """No name in __all__ is (or subclasses) the store, cipher, audit log or memory core."""
    for name in msm_mem.__all__:
        obj = getattr(msm_mem, name)
        assert not isinstance(obj, PRIVATE_TYPES), name
        if inspect.isclass(obj):
            assert not issubclass(obj, PRIVATE_TYPES), name


def test_public_records_are_immutable() -> None:
    """Every public dataclass is frozen: a record handed out cannot be changed."""
    for name in msm_mem.__all__:
        obj = getattr(msm_mem, name)
        if inspect.isclass(obj) and dataclasses.is_dataclass(obj):
            params = obj.__dataclass_params__  # type: ignore[attr-defined]
            assert params.frozen, f"{name} is a mutable dataclass"


def test_msm_mem_exposes_no_private_part(tmp_path: Path) -> None:
    """No public attribute of an open MsmMem is a store, cipher, audit log or memory core."""
    with MsmMem.init(tmp_path / "m", ADMIN) as mem:
        for name in dir(mem):
            if name.startswith("_"):
                continue
            value = getattr(mem, name)
            assert not isinstance(value, PRIVATE_TYPES), name


def test_a_turn_cannot_change_patient() -> None:
    """A turn begun for one patient cannot be pointed at another (frozen)."""
    fields = {f.name for f in dataclasses.fields(Turn)}
    assert {"patient_id", "actor", "consent_id"} <= fields
    assert Turn.__dataclass_params__.frozen  # type: ignore[attr-defined]


@pytest.fixture
def mem(tmp_path: Path, new_mem: MemFactory) -> Any:
    m = new_mem("store", backbone=FixedBackbone("Right lower lobe consolidation noted."))
    rows = [
        ManifestRow(
            "P1",
            f"S{i}",
            1_600_000_000.0 + i * 86_400,
            str(png(tmp_path, i)),
            "What is the impression?",
            "Right lower lobe consolidation.",
            line=i + 1,
        )
        for i in range(3)
    ]
    m.ingest(INGEST, rows)
    return m


def _count(mem: Any) -> int:
    return len(audit_events(mem))


def _denials(mem: Any) -> int:
    return sum(1 for e in audit_events(mem) if e.outcome == "denied")


def _operations(tmp: Path) -> dict[str, tuple[Callable[[Any, Principal], object], Principal, Principal]]:
    """Every public operation of MsmMem: (call, a principal it serves, a principal it refuses)."""
    img = str(tmp / "img99.png")  # written by _prepare, so collecting the tests writes no file

    def consolidate(m: Any, p: Principal) -> object:
        return m.consolidate(p, "P1", PREPARED[id(m)], "Stable right lower lobe consolidation.")

    def record_answer(m: Any, p: Principal) -> object:
        model = {"backbone": "openai", "model": "llava-med"}
        return m.record_answer(p, "P1", PREPARED[id(m)], "Stable right lower lobe consolidation.", model=model)

    def ingest(m: Any, p: Principal) -> object:
        row = ManifestRow("P1", "S-new", 1_700_000_000.0, str(png(tmp, 7)), "What is the impression?", "Clear.")
        return m.ingest(p, [row])

    def grant(m: Any, p: Principal) -> object:
        from msm_mem import ConsentRecord

        c = ConsentRecord("C-x" + p.id, "P1", "role:agent", "research", "permit", ("*",), m.now(), None, m.now())
        return m.grant(p, [c])

    def revoke(m: Any, p: Principal) -> object:
        return m.revoke(p, PREPARED[id(m)])

    return {
        "ingest": (ingest, INGEST, RESEARCHER),
        "ask": (lambda m, p: m.ask(p, "P1", img, "What is the impression?"), AGENT, RESEARCHER),
        "ask_many": (lambda m, p: m.ask_many(p, [msm_mem.Query("P1", img, "Impression?")]), AGENT, RESEARCHER),
        "retrieve": (lambda m, p: m.retrieve(p, "P1", img), AGENT, RESEARCHER),
        "context": (lambda m, p: m.context(p, "P1", img, "What is the impression?"), AGENT, RESEARCHER),
        "record_answer": (record_answer, AGENT, RESEARCHER),
        "observe": (lambda m, p: m.observe(p, "P1", img, "Any change?"), AGENT, RESEARCHER),
        "consolidate": (consolidate, AGENT, RESEARCHER),
        "feedback": (lambda m, p: m.feedback(p, "P1", "S0", accept=True), CRITIC, AGENT),
        "semantic_state": (lambda m, p: m.semantic_state(p, "P1"), AGENT, RESEARCHER),
        "semantic_history": (lambda m, p: m.semantic_history(p, "P1"), AGENT, RESEARCHER),
        "episodes": (lambda m, p: m.episodes(p, "P1"), AGENT, RESEARCHER),
        "visuals": (lambda m, p: m.visuals(p, "P1"), AGENT, RESEARCHER),
        "claims": (lambda m, p: m.claims(p, "P1"), AGENT, RESEARCHER),
        "claim_history": (lambda m, p: m.claim_history(p, "P1", "study:S0"), AGENT, RESEARCHER),
        "stm_items": (lambda m, p: m.stm_items(p, "P1"), AGENT, AUDITOR),
        "grant": (grant, ADMIN, AGENT),
        "revoke": (revoke, ADMIN, AGENT),
        "consents": (lambda m, p: m.consents(p), ADMIN, AGENT),
        "rotate_keys": (lambda m, p: m.rotate_keys(p, "test"), ADMIN, AGENT),
        "shred": (lambda m, p: m.shred(p, "P1", "erasure request"), ADMIN, AGENT),
        "verify_audit": (lambda m, p: m.verify_audit(p), AUDITOR, AGENT),
        "checkpoint": (lambda m, p: m.checkpoint(p), AUDITOR, AGENT),
        "audit_trail": (lambda m, p: m.audit_trail(p), AUDITOR, SYSTEM),
        "export_fhir": (lambda m, p: m.export_fhir(p, tmp / f"fhir-{p.id}.ndjson"), AUDITOR, AGENT),
        "maintain": (lambda m, p: m.maintain(p), SYSTEM, AGENT),
        "export_paper": (lambda m, p: m.export_paper(p, tmp / f"paper-{p.id}"), EXPORTER, AGENT),
        "import_paper": (lambda m, p: m.import_paper(p, tmp / "nowhere"), ADMIN, AGENT),
        # an interface's own refusal: any principal is refused, and the refusal is audited
        "refuse": (lambda m, p: m.refuse(p, "read", "P1"), AGENT, AGENT),
        "break_glass": (lambda m, p: m.break_glass(p, "shred", "P1", "on-call override"), ADMIN, AGENT),
    }


#: what an operation's call needs made first (outside the counted audit events), by store
PREPARED: dict[int, str] = {}
PREPARE: dict[str, Callable[[Any, Path], str]] = {
    "consolidate": lambda m, tmp: m.observe(AGENT, "P1", str(png(tmp, 98)), "Any change?").item_id,
    "record_answer": lambda m, tmp: m.context(AGENT, "P1", str(png(tmp, 98)), "Any change?").context_id,
    "revoke": lambda m, tmp: m.consents(ADMIN)[0].consent_id,
}


def _prepare(mem: Any, tmp: Path, name: str) -> None:
    png(tmp, 99)
    if name in PREPARE:
        PREPARED[id(mem)] = PREPARE[name](mem, tmp)


#: public members that are not operations on patient data or governance
NOT_OPERATIONS = {
    "init",
    "open",
    "upgrade",  # a classmethod like init: admin only, audited (tests/test_upgrade.py)
    "refuse_login",  # an interface's record of a failed login: no principal proven (tests/test_http_limits.py)
    "exists",
    "key_folder",  # where the store's keys are: reads its id only (tests/test_key_home.py)
    "close",
    "directory",
    "settings",
    "encoder_name",
    "dim",
    "backbone_name",
    "tenant",
    "now",
}


def test_every_public_method_is_covered(tmp_path: Path) -> None:
    """Each public member of MsmMem is an operation below or a documented non-operation: a new
    door fails this test until it is added to the table (and so to the refusal checks)."""
    public = {n for n in dir(MsmMem) if not n.startswith("_")}
    assert public == set(_operations(tmp_path)) | NOT_OPERATIONS


@pytest.mark.parametrize("name", sorted(_operations(Path("."))))
def test_each_operation_refuses_the_wrong_principal_and_audits_it(mem: Any, tmp_path: Path, name: str) -> None:
    """Called by a principal without the role or the consent, every operation raises, writes
    nothing but the audited denial."""
    call, _, wrong = _operations(tmp_path)[name]
    _prepare(mem, tmp_path, name)
    before, denied = _count(mem), _denials(mem)
    with pytest.raises((AccessDenied, ConsentDenied)):
        call(mem, wrong)
    assert _denials(mem) == denied + 1
    assert _count(mem) == before + 1, "a refusal writes exactly its denial event"
    assert mem.verify_audit(ADMIN).ok


@pytest.mark.parametrize("name", sorted(set(_operations(Path("."))) - {"verify_audit"}))
def test_each_operation_leaves_an_audit_event(mem: Any, tmp_path: Path, name: str) -> None:
    """Called by the right principal, every operation that reads or writes leaves an audit
    event (verification is read-only: it writes nothing, so it can run on read-only media)."""
    call, right, _ = _operations(tmp_path)[name]
    _prepare(mem, tmp_path, name)
    before = _count(mem)
    try:
        call(mem, right)
    except MsmMemError as exc:  # import into a non-empty store is refused after the role check
        assert name in ("import_paper", "refuse"), exc  # refuse always raises, after its audit event
        if name == "refuse":
            assert _count(mem) > before
        return
    assert _count(mem) > before, f"{name} left no audit event"
    assert mem.verify_audit(ADMIN).ok


def test_verification_writes_nothing(mem: Any) -> None:
    """verify_audit is read-only."""
    before = _count(mem)
    assert mem.verify_audit(AUDITOR).ok
    assert _count(mem) == before


def test_purpose_typos_are_refused() -> None:
    """A purpose outside the closed set is InvalidInput naming the allowed ones."""
    with pytest.raises(msm_mem.InvalidInput, match="treatment"):
        Principal("a", Role.AGENT, "reserch")  # type: ignore[arg-type]
    with pytest.raises(msm_mem.InvalidInput, match="role"):
        Principal("a", "doctor", Purpose.TREATMENT)  # type: ignore[arg-type]


def test_export_leaves_out_patients_without_consent(mem: Any, tmp_path: Path) -> None:
    """export_paper writes only patients whose consent permits the exporter."""
    for c in mem.consents(ADMIN):
        if c.purpose == "export":
            mem.revoke(ADMIN, c.consent_id)
    counts = mem.export_paper(EXPORTER, tmp_path / "out")
    assert counts["episodic"] == 0 and counts["visual"] == 0
    assert not any((tmp_path / "out" / "semantic").iterdir())
