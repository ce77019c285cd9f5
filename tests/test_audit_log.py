"""Tests of the audit tier (msm_mem._governance.audit.log): one event per action, no identifiers or
narrative, appends across handles and checkpoints, retention, and the pinned bytes of an event.
The tamper matrices are in ``tests/test_audit_log_tamper.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from msm_mem import Principal, Purpose, Role
from msm_mem._api.mem import MsmMem
from msm_mem._errors import AccessDenied, IllegalTransition, NotFound
from msm_mem._governance.audit.chain import ChainBuilder
from msm_mem._governance.audit.event import AuditSpec
from msm_mem._governance.audit.log import RETENTION_S
from msm_mem._storage.base import WriteBatch
from msm_mem.interfaces.cli import main
from msm_mem.testing import FixedBackbone, FixedClock
from tests.cli_support import ADMIN as ADMIN_FLAGS
from tests.cli_support import AUDITOR as AUDITOR_FLAGS
from tests.cli_support import admin_credential
from tests.conftest import MemFactory
from tests.helpers import ADMIN, AGENT, SYSTEM, audit_events
from tests.helpers import png as _png
from tests.layers import Layers, layers_of, open_layers
from tests.test_audit_vectors import VECTORS

T0 = 1_700_000_000.0
PATIENT = "MRN-PATIENT-998877"
QUESTION = "Does the zebra-striped nodule near the hilum look worse than before?"
ANSWER = "Stable zebrastripe nodule, right hilar region, no pneumonia"
CORRECTION = "Enlarging quokka-shaped nodule, recommend CT for malignancy"


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock(T0)


@pytest.fixture
def mem(tmp_path: Path, clock: FixedClock) -> Iterator[MsmMem]:
    """The store on SQLite, for the command-line test (the CLI is rebuilt on its own branch)."""
    m = MsmMem.init(tmp_path / "s", ADMIN, clock=clock, backbone=FixedBackbone(ANSWER, "follow up in 3 months"))
    yield m
    m.close()


@pytest.fixture
def any_mem(new_mem: MemFactory, clock: FixedClock) -> Iterator[MsmMem]:
    """The store on each backend."""
    m = new_mem("s", clock=clock, backbone=FixedBackbone(ANSWER, "follow up in 3 months"))
    yield m
    m.close()


@pytest.fixture
def layers(any_mem: MsmMem, clock: FixedClock) -> Iterator[Layers]:
    """The audit log under test (and the store), built from ``any_mem``'s directory."""
    with layers_of(any_mem, clock) as built:
        yield built


def _busy(mem: MsmMem, folder: Path, clock: FixedClock) -> None:
    """Asks, a held repeat, a critic verdict, maintenance and decay: many kinds of event."""
    mem.ask(AGENT, PATIENT, _png(folder, 1), QUESTION, study_id="ACC-1")
    mem.ask(AGENT, PATIENT, _png(folder, 1), QUESTION, study_id="ACC-2")
    mem.ask(AGENT, PATIENT, _png(folder, 2), QUESTION, study_id="ACC-3")
    mem.feedback(
        Principal("rad-1", Role.CRITIC, Purpose.TREATMENT), PATIENT, "ACC-3", accept=False, correction=CORRECTION
    )
    clock.advance(2 * 86400)
    mem.maintain(SYSTEM)
    clock.advance(10 * 365 * 86400)
    mem.maintain(SYSTEM)


# what is recorded ----------------------------------------------------------------------------


def test_one_turn_records_every_step(any_mem: MsmMem, layers: Layers, tmp_path: Path) -> None:
    """An answered turn appends consent, STM write, reads, the answer (naming the model),
    consolidation and semantic update events."""
    before = layers.store.audit_head()[0]
    any_mem.ask(AGENT, PATIENT, _png(tmp_path, 1), QUESTION, study_id="ACC-1")
    new = audit_events(layers.store)[before:]
    actions = [e.action for e in new]
    assert actions[:3] == ["consent", "write", "read"] and actions[-3:] == ["answer", "consolidate", "semantic_update"]
    assert set(actions[2:-3]) == {"read"}
    assert new[-3].record_ids[:2] == (new[1].record_ids[0], f"model:{any_mem.backbone_name}")
    assert {e.seq for e in new} == set(range(before + 1, before + 1 + len(new)))
    assert all(e.outcome == "success" and e.actor == "msm-mem-agent" for e in new)
    (item,) = layers.store.stm_list()
    assert new[1].record_ids == (item.item_id,)
    episode = next(layers.store.iter_episodes())
    assert episode.episode_id in new[-2].record_ids


def test_events_hold_no_patient_identifier_or_narrative(
    any_mem: MsmMem, layers: Layers, tmp_path: Path, clock: FixedClock
) -> None:
    """No payload holds the patient id, question, answer, decision or correction; the pseudonym appears."""
    _busy(any_mem, tmp_path, clock)
    payloads = [r.payload for r in layers.store.iter_audit()]
    blob = b"\n".join(payloads)
    pseudonym = layers.audit.pseudonym(PATIENT)
    assert pseudonym.startswith("pt-") and pseudonym.encode() in blob
    for secret in (
        PATIENT,
        "998877",
        QUESTION,
        "zebra",
        ANSWER,
        "zebrastripe",
        CORRECTION,
        "quokka",
        "follow up",
        "ACC-1",
        "ACC-3",
    ):
        assert secret.encode() not in blob, secret
    actions = {e.action for e in audit_events(layers.store)}
    assert {"consent", "write", "read", "consolidate", "hold", "semantic_update", "critic_reject", "decay"} <= actions


def test_pseudonym_is_random_and_stable(any_mem: MsmMem, layers: Layers, tmp_path: Path) -> None:
    """A patient's pseudonym is random, the same after reopening, and differs between patients."""
    first = layers.audit.pseudonym(PATIENT)
    assert first == layers.audit.pseudonym(PATIENT) != layers.audit.pseudonym("OTHER")
    assert PATIENT not in first and "998877" not in first
    any_mem.close()
    layers.close()
    with open_layers(tmp_path / "s") as again:
        assert again.audit.pseudonym(PATIENT) == first


def test_open_handle_continues_after_another_handle_appends(mem: MsmMem, tmp_path: Path) -> None:
    """Events appended through another handle (the CLI) do not break the next turn of an open handle."""
    mem.ask(AGENT, PATIENT, _png(tmp_path, 1), QUESTION)
    admin_credential(mem.directory)
    assert main(["audit", "checkpoint", str(mem.directory), *AUDITOR_FLAGS]) == 0
    assert (
        main(
            [
                "consent",
                "grant",
                str(mem.directory),
                "--patient",
                "*",
                "--grantee",
                "role:auditor",
                "--purpose",
                "treatment",
                *ADMIN_FLAGS,
            ]
        )
        == 0
    )
    with layers_of(mem) as layers:
        head = layers.store.audit_head()[0]
    mem.ask(AGENT, PATIENT, _png(tmp_path, 2), QUESTION)  # would fail if the handle chained after a stale head
    new = audit_events(mem)[head:]
    assert new[0].seq == head + 1 and new[-1].action == "semantic_update"
    assert all(e.outcome == "success" for e in new)
    assert mem.verify_audit(ADMIN).ok


def test_appends_continue_after_verify_and_checkpoint(any_mem: MsmMem, layers: Layers, tmp_path: Path) -> None:
    """A checkpointed chain keeps growing and still verifies, fully and by hashes only."""
    any_mem.ask(AGENT, PATIENT, _png(tmp_path, 1), QUESTION)
    size, head = layers.audit.checkpoint()
    assert (size, head) == layers.store.audit_head()
    any_mem.ask(AGENT, PATIENT, _png(tmp_path, 2), QUESTION)
    assert layers.audit.verify().ok and layers.audit.verify(full=False).ok
    assert layers.audit.verify().count == layers.store.audit_head()[0]


# retention --------------------------------------------------------------------------------------


def test_purge_refused_within_six_years(any_mem: MsmMem, layers: Layers, tmp_path: Path, clock: FixedClock) -> None:
    """Events younger than 6 years cannot be purged; nothing is deleted."""
    any_mem.ask(AGENT, PATIENT, _png(tmp_path, 1), QUESTION)
    head = layers.store.audit_head()[0]
    clock.advance(RETENTION_S - 1)
    with pytest.raises(AccessDenied, match="retention"):
        layers.audit.purge(head, actor="root", role="admin", reason="retention expired")
    assert layers.store.audit_head()[0] == head and layers.store.audit_base()[0] == 0
    assert RETENTION_S >= 6 * 365 * 86400


def test_purge_after_retention_keeps_the_chain_verifiable(
    any_mem: MsmMem, layers: Layers, tmp_path: Path, clock: FixedClock
) -> None:
    """Past 6 years old events go; verify still passes and new events continue the chain."""
    any_mem.ask(AGENT, PATIENT, _png(tmp_path, 1), QUESTION)
    layers.audit.checkpoint()
    old_head = layers.store.audit_head()
    clock.advance(RETENTION_S + 86400)
    any_mem.ask(AGENT, PATIENT, _png(tmp_path, 2), QUESTION)  # young events stay
    with pytest.raises(AccessDenied):
        layers.audit.purge(layers.store.audit_head()[0], actor="root", role="admin", reason="retention expired")
    assert layers.audit.purge(old_head[0], actor="root", role="admin", reason="retention expired") == old_head[0]
    assert layers.store.audit_base() == old_head
    assert [r.seq for r in layers.store.iter_audit()][0] == old_head[0] + 1
    assert layers.audit.verify().ok
    any_mem.ask(AGENT, PATIENT, _png(tmp_path, 3), QUESTION)
    layers.audit.checkpoint()
    assert layers.audit.verify().ok and layers.audit.verify(full=False).ok
    clock.advance(RETENTION_S + 86400)
    with pytest.raises(NotFound):
        layers.audit.purge(10**6, actor="root", role="admin", reason="retention expired")


def test_purge_is_itself_audited(any_mem: MsmMem, layers: Layers, tmp_path: Path, clock: FixedClock) -> None:
    """A purge leaves an event naming who purged and why."""
    any_mem.ask(AGENT, PATIENT, _png(tmp_path, 1), QUESTION)
    head = layers.store.audit_head()[0]
    clock.advance(RETENTION_S + 86400)
    with pytest.raises(IllegalTransition):
        layers.audit.purge(head, actor="agent-1", role="agent", reason="retention expired")
    with pytest.raises(IllegalTransition):
        layers.audit.purge(head, actor="root", role="admin", reason=" ")
    layers.audit.purge(head, actor="root", role="admin", reason="retention expired")
    (event,) = audit_events(layers.store)
    assert (event.action, event.actor, event.role, event.reason) == (
        "purge_expired",
        "root",
        "admin",
        "retention expired",
    )
    assert layers.audit.verify().ok


def test_a_spec_is_a_typed_event_with_the_pinned_bytes(layers: Layers, clock: FixedClock) -> None:
    """spec() gives a frozen AuditSpec that, once written, is stored as the pinned vector's bytes."""
    fields, payload, digest = VECTORS[1]
    clock.advance(fields["time"] - clock.now())
    spec = layers.audit.spec(**{k: v for k, v in fields.items() if k != "time"})
    assert isinstance(spec, AuditSpec) and spec.time == fields["time"] and spec.record_ids == ()
    assert ChainBuilder(1, VECTORS[0][2]).next_row_of(spec) == (2, payload, digest)
    before = layers.store.audit_head()[0]
    layers.audit.write(WriteBatch(), [spec])
    stored = audit_events(layers.store)[before]
    assert (stored.action, stored.reason, stored.outcome) == ("purge_expired", fields["reason"], "denied")
    assert layers.audit.verify().ok
