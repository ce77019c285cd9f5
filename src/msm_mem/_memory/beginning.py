"""How a governed turn begins: the consent check of one patient, or of a batch of patients.

:class:`TurnBeginning` is a base of :class:`~msm_mem._memory.tiers.GovernedMemory`: it
checks the principal and the patient scope, asks the store to see other connections' commits
(``sync``), evaluates the patient's consent records and audits the decision; a denial is
written at once and raised. :meth:`TurnBeginning.begin_many` does this for the turns of one
batch after one read-ahead of what they will read (``Store.prefetch``).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence

from .._clock import Clock
from .._errors import AccessDenied, ConsentDenied, InvalidInput
from .._governance.audit.event import AuditSpec
from .._governance.audit.log import AuditLog
from .._governance.consent import DATA_CLASSES, evaluate
from .._limits import check_id
from .._principal import Principal
from .._records import Vector
from .._storage.base import Store
from .turn import Turn

__all__ = ["TurnBeginning"]


def _check_begin(principal: Principal, patient_id: str, classes: Sequence[str]) -> None:
    if not isinstance(principal, Principal):
        raise InvalidInput(f"a turn needs a Principal (id, role, purpose), got {type(principal).__name__}")
    if not isinstance(patient_id, str) or not patient_id.strip():
        raise InvalidInput("a turn needs a patient scope (patient_id)")
    check_id("patient_id", patient_id)  # the one door of patient scope: no wildcard, no control characters
    if isinstance(classes, str) or not all(isinstance(c, str) for c in classes):
        raise InvalidInput(f"classes must be a sequence of data class names, got {classes!r}")


class TurnBeginning:
    """The consent check that begins every governed turn (a base of ``GovernedMemory``)."""

    store: Store
    audit: AuditLog
    clock: Clock

    @abstractmethod
    def _write_audit_only(self, specs: list[AuditSpec]) -> None:
        """Write audit events in a transaction of their own (a denial, a failure)."""

    def begin(self, principal: Principal, patient_id: str, classes: Sequence[str] = DATA_CLASSES) -> Turn:
        """Check consent for a turn of ``principal`` (its purpose is the turn's purpose of use)
        on ``patient_id``; a denial is audited and raises :class:`ConsentDenied`."""
        _check_begin(principal, patient_id, classes)
        self.store.sync()
        return self._begin(principal, patient_id, classes)

    def begin_many(
        self,
        principal: Principal,
        patient_ids: Sequence[str],
        classes: Sequence[str] = DATA_CLASSES,
        *,
        novelty: Sequence[tuple[str, object]] = (),
    ) -> list[Turn]:
        """:meth:`begin` for several patients at once, in order: the turns of one batch for
        :meth:`commit_many`. One sync for the batch, then what the turns will read of the store
        (consent, keys, semantic states, claims, entities) is read ahead where that saves round
        trips (``Store.prefetch``: one on a server, whose turns then see the store as it was at
        this call until the batch commits). ``novelty`` names the ``(patient id, image
        embedding)`` of each observation the turns will consolidate: the gate's novelty
        searches of those are read ahead with the rest (an observation not named searches when
        it is consolidated). The first denial is audited and raises :class:`ConsentDenied`, as
        :meth:`begin` does."""
        if isinstance(patient_ids, str):
            raise InvalidInput("patient_ids must be a sequence of patient ids, not one string")
        patients = list(patient_ids)
        for patient_id in patients:
            _check_begin(principal, patient_id, classes)
        if len(set(patients)) != len(patients):
            raise InvalidInput("begin_many takes different patients (one turn each)")
        queries = self._novelty_queries(patients, novelty)
        self.store.sync()
        self.store.prefetch(patients, queries)
        return [self._begin(principal, patient_id, classes) for patient_id in patients]

    def _novelty_queries(
        self, patients: Sequence[str], novelty: Sequence[tuple[str, object]]
    ) -> list[tuple[str, Vector]]:
        """``novelty`` checked: pairs of a patient of the batch and a valid embedding, each
        embedding as the novelty check of its consolidation will search with it."""
        if isinstance(novelty, (str, bytes)) or not isinstance(novelty, Sequence):
            raise InvalidInput("novelty must be a sequence of (patient id, embedding) pairs")
        batch, queries = set(patients), []
        for pair in novelty:
            if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
                raise InvalidInput("novelty must be a sequence of (patient id, embedding) pairs")
            patient_id, z = pair
            if patient_id not in batch:
                raise InvalidInput("novelty names a patient that has no turn in this batch")
            queries.append((patient_id, self._novelty_query(z)))
        return queries

    @abstractmethod
    def _novelty_query(self, z: object) -> Vector:
        """The vector the novelty check of an observation of ``z`` searches with."""

    def _begin(self, principal: Principal, patient_id: str, classes: Sequence[str]) -> Turn:
        role, purpose = principal.role.value, principal.purpose.value
        decision = evaluate(
            self.store.consents(patient_id),
            patient=patient_id,
            actor=principal.id,
            role=role,
            purpose=purpose,
            classes=classes,
            when=self.clock.now(),
        )
        consent = {"actor": principal.id, "role": role, "action": "consent", "purpose": purpose}
        try:
            self.audit.pseudonym(patient_id)
        except AccessDenied:  # crypto-shredded: refuse, and record the refusal without a patient link
            denied = self.audit.spec(
                **consent, source_tier="source", target_tier="ltm", outcome="denied", reason="patient_shredded"
            )
            self._write_audit_only([denied])
            raise
        row = self.audit.spec(
            **consent,
            source_tier="source",
            target_tier="ltm",
            patient=patient_id,
            consent_id=decision.consent_id,
            outcome="success" if decision.permitted else "denied",
            reason="" if decision.permitted else decision.reason,
        )
        if not decision.permitted:
            self._write_audit_only([row])
            raise ConsentDenied(
                f"{role} {principal.id!r} has no consent for {purpose!r} on this patient ({decision.reason})"
            )
        return Turn(principal, patient_id, decision.consent_id, audit=[row])
