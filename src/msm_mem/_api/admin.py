"""Governance operations of :class:`~msm_mem.MsmMem`: consent, keys, audit, maintenance,
export and import. Each checks the principal's role (see :mod:`.access`) and writes its audit
event itself, with the change where there is one; the auditor never sees patient data."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from .._errors import AccessDenied, AuditChainBroken, InvalidInput, NotFound, StoreError
from .._governance.audit.erasure import ErasureReceipt
from .._governance.audit.verify import VerifyResult
from .._governance.consent import check_record, evaluate
from .._governance.upgrade import upgrade_store
from .._limits import check_id
from .._memory.maintenance import MaintenanceReport
from .._principal import Principal, Purpose, Role
from .._storage.base import WriteBatch
from .._storage.paper_layout import export_paper, read_paper
from .._tier_records import ConsentRecord
from .access import Operation
from .base import _Base, stated_reason
from .reads import RecordPage, _check_page

__all__: list[str] = []


class _Admin(_Base):
    # consent -------------------------------------------------------------------------------

    def grant(self, principal: Principal, consents: list[ConsentRecord]) -> None:
        """Store consent records (admin only; audited, one event each, in one transaction with
        the records). Each is validated first: unknown data classes, roles or purposes are
        refused, and nothing is stored."""
        p = self._allow(principal, Operation.CONSENT_GRANT)
        consents = list(consents)
        for c in consents:
            if not isinstance(c, ConsentRecord):
                raise InvalidInput(f"grant takes ConsentRecord objects, got {type(c).__name__}")
            check_record(c)
        specs = [
            self._audit.spec(
                actor=p.id,
                role=p.role.value,
                action="consent_grant",
                source_tier="source",
                target_tier="ltm",
                purpose=c.purpose,
                record_ids=[c.consent_id],
                patient=c.patient_id,
                consent_id=c.consent_id,
            )
            for c in consents
        ]
        self._audit.write(WriteBatch(consents=consents), specs)

    def revoke(self, principal: Principal, consent_id: str) -> None:
        """Revoke a consent from now on (admin only; audited with the revocation)."""
        p = self._allow(principal, Operation.CONSENT_REVOKE)
        if not any(c.consent_id == consent_id for c in self._store.consents()):
            raise NotFound(f"no consent {consent_id!r}")
        self._event(
            p,
            "consent_revoke",
            "source",
            "ltm",
            batch=WriteBatch(revocations=[(consent_id, self._clock.now())]),
            record_ids=(consent_id,),
            consent_id=consent_id,
        )

    def consents(
        self,
        principal: Principal,
        patient_id: str | None = None,
        *,
        within: Iterable[str] | None = None,
        offset: int = 0,
        limit: int | None = None,
    ) -> RecordPage[ConsentRecord]:
        """The consent records (of one patient, or all; with ``within``, only those of these
        patients and of every patient, ``*``), one page of them: ``offset`` and ``limit`` (None:
        every record) as for every read. The auditor sees each patient as the pseudonym of the
        audit trail, never the patient id. Audited: the event names the page's consents."""
        offset, limit = _check_page(offset, limit)
        p = self._allow(principal, Operation.CONSENT_LIST, tier="audit")
        if patient_id is not None:
            check_id("patient_id", patient_id)
        self._store.sync()
        records = self._store.consents(patient_id)
        if within is not None:
            scope = set(within)
            records = [c for c in records if c.patient_id == "*" or c.patient_id in scope]
        listed = records[offset : None if limit is None else offset + limit]
        if p.role is Role.AUDITOR:
            listed = [replace(c, patient_id=self._pseudonym_or_shredded(c.patient_id)) for c in listed]
        self._event(p, "consent_list", "ltm", "source", record_ids=tuple(c.consent_id for c in listed))
        return RecordPage(listed, offset, len(records))

    def _pseudonym_or_shredded(self, patient_id: str) -> str:
        try:
            return self._audit.pseudonym(patient_id)
        except AccessDenied:  # crypto-shredded: no link to the patient is left to show
            return "shredded"

    # keys ----------------------------------------------------------------------------------

    def rotate_keys(self, principal: Principal, reason: str) -> int:
        """A new key-encryption key; every data key rewrapped under it and stored with the audit
        event in one transaction (admin only). Returns how many data keys were rewrapped."""
        p = self._allow(principal, Operation.KEY_ROTATE)
        reason = stated_reason(reason, "key rotation")
        self._store.sync()  # every data key another handle stored or shredded since is rewrapped as it is now
        keys = self._cipher.rewrap_all()
        note = f"{len(keys)} data keys rewrapped; {reason}"[:120]
        self._event(p, "key_rotate", "ltm", "ltm", batch=WriteBatch(rewrapped=keys), reason=note)
        self._cipher.rotated()
        self._cipher.retire_unused()  # committed: the old KEKs wrap nothing stored any more
        return len(keys)

    def shred(self, principal: Principal, patient_id: str, reason: str) -> ErasureReceipt:
        """Erase a patient (admin only, with a reason; one transaction, one audit event for the
        patient): every row of theirs destroyed (records, vectors, claims, the knowledge graph,
        short-term items, consent records), the data key destroyed and its pseudonym unlinked,
        and every record other patients' answers derived from theirs retracted. The embedded
        store's vector caches are rebuilt without them and its WAL emptied. Returns the signed
        :class:`ErasureReceipt` (rows destroyed per table, the audit seq of the event), which
        :meth:`verify_audit` checks against the chain."""
        p = self._allow(principal, Operation.SHRED)
        # not check_id: an id stored before ids were checked (control characters) can still be
        # shredded; only the wildcard and a blank id are refused
        if not isinstance(patient_id, str) or not patient_id.strip() or "*" in patient_id:
            raise InvalidInput(f"shredding needs one patient id (no '*' wildcard), got {patient_id!r}")
        self._store.sync()  # a key another handle shredded since is seen as shredded
        return self._maintainer().shred(p, patient_id, stated_reason(reason, "shredding a patient"))

    # audit ---------------------------------------------------------------------------------

    def verify_audit(
        self,
        principal: Principal,
        *,
        full: bool = True,
        processes: int | None = None,
        receipt: ErasureReceipt | None = None,
    ) -> VerifyResult:
        """Verify the hash chain (fully, or hashes and links only) and the signed checkpoints
        (auditor or admin). Read-only: verification writes nothing. A full verification of a
        long chain checks its rows in ``processes`` worker processes that hold no key (None:
        one per core, from 200,000 events and 3 cores; 1: one process); the result is the same.

        With an erasure ``receipt`` (of :meth:`shred`) the result is also not ok unless the
        receipt's signature verifies under the checkpoint key, its audit event is in the chain
        as it names it (the erasure of that pseudonym, one record id per row destroyed) and
        the episodic and visual rows the event names hold nothing any more."""
        self._allow(principal, Operation.AUDIT_VERIFY, tier="audit")
        if receipt is None:
            return self._audit.verify(full=full, processes=processes)
        if not isinstance(receipt, ErasureReceipt):
            raise InvalidInput(f"receipt must be an ErasureReceipt, got {type(receipt).__name__}")
        return self._audit.verify_erasure(receipt, full=full, processes=processes)

    def checkpoint(self, principal: Principal) -> tuple[int, str]:
        """Sign the current head of the chain (auditor, admin or system); returns (size, head)."""
        p = self._allow(principal, Operation.AUDIT_CHECKPOINT, tier="audit")
        size, head = self._audit.checkpoint()
        self._event(p, "checkpoint", "audit", "audit", reason=f"signed size {size}")
        return size, head

    def export_fhir(self, principal: Principal, out: str | Path) -> int:
        """Write every audit event as a FHIR R5 AuditEvent (IHE BALP), one JSON object a line
        (auditor or admin). Events hold ids and pseudonyms only, never PHI. A broken chain is
        refused. The export is audited. Returns the number of resources."""
        from .._governance.audit.fhir import export_fhir

        p = self._allow(principal, Operation.AUDIT_EXPORT, tier="audit")
        result = self._audit.verify()
        if not result.ok:
            raise AuditChainBroken(f"refusing to export a broken chain: {result.reason}", result.first_bad_seq)
        count = export_fhir(self._store, out)
        self._event(p, "export", "audit", "source", reason=f"fhir audit events: {count}")
        return count

    def _upgrade(self, p: Principal, *, keys_moved: int = 0) -> dict[str, int]:
        """The upgrade of :meth:`MsmMem.upgrade`, on a store opened for it (its keys already in
        the key home: ``keys_moved`` files moved there). A store at the current schema whose
        keys moved gets one audited event saying so; one with nothing to do is StoreError."""
        before = self._store.schema_version
        if before == self._store.CURRENT_SCHEMA:
            if not keys_moved:
                raise StoreError(f"the store is at schema {before} already, its keys outside it: nothing to upgrade")
            self._event(p, "store_upgrade", "ltm", "ltm", reason=f"{keys_moved} key files moved to the key home")
            tags, signed = 0, self._store.audit_head()[0]
        else:
            spec = self._audit.spec(
                actor=p.id,
                role=p.role.value,
                action="store_upgrade",
                source_tier="ltm",
                target_tier="ltm",
                purpose=p.purpose.value,
                reason=f"store schema {before} to {self._store.CURRENT_SCHEMA}",
            )
            tags, signed = upgrade_store(self._audit, self._cipher, spec)
        return {
            "from_schema": int(before),
            "to_schema": int(self._store.schema_version),
            "visual_tags_encrypted": tags,
            "events_signed": signed,
            "keys_moved": keys_moved,
        }

    # maintenance ---------------------------------------------------------------------------

    def maintain(self, principal: Principal, *, at: float | None = None, dry_run: bool = False) -> MaintenanceReport:
        """Expire STM, consolidate aged STM, decay LTM, checkpoint the audit chain, as
        ``principal`` (role system), as of the UTC time ``at`` (default: the store's clock;
        for replays and tests). The audit events carry the store's clock.

        Decay: a long-term record is due when its patient's last activity (newest long-term
        write) plus ``Settings.retention_s x confidence x tier_weight`` has passed; the report's
        ``decay`` lists each record, its last activity, retention and due time. With
        ``dry_run`` nothing is written but one audit event (action ``read``, naming no patient
        or record, its reason the counts): the report says what decay would do now."""
        p = self._allow(principal, Operation.MAINTAIN)
        if at is not None and (isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at)):
            raise InvalidInput(f"at must be a finite number of UTC seconds, got {at!r}")
        if not isinstance(dry_run, bool):
            raise InvalidInput(f"dry_run must be true or false, got {dry_run!r}")
        r = self._maintainer(p, None if at is None else float(at)).run(dry_run=dry_run)
        if dry_run:
            summary = f"maintain dry run: would anonymise {r.anonymized}, retract {r.retracted}"
            self._event(p, "read", "ltm", "ltm", reason=summary[:120])
            return r
        summary = f"expired {r.expired}, consolidated {r.consolidated}, decayed {r.anonymized + r.retracted}"
        self._event(p, "maintain", "ltm", "ltm", reason=summary[:120])
        return r

    # the paper's layout --------------------------------------------------------------------

    def export_paper(self, principal: Principal, out: str | Path) -> dict[str, int]:
        """Write the paper's layout (decrypted) into ``out`` (clinician or admin, purpose
        export): only patients whose consent permits this principal to export are written
        (anonymised records, which have no patient, always are). Audited."""
        p = self._allow(principal, Operation.EXPORT)
        if p.purpose is not Purpose.EXPORT:
            raise InvalidInput(f"exporting patient data needs purpose 'export', got {p.purpose.value!r}")
        self._store.sync()
        now = self._clock.now()
        allowed: dict[str, bool] = {"": True}

        def permitted(patient_id: str) -> bool:
            if patient_id not in allowed:
                allowed[patient_id] = evaluate(
                    self._store.consents(patient_id),
                    patient=patient_id,
                    actor=p.id,
                    role=p.role.value,
                    purpose=p.purpose.value,
                    classes=("episodic", "visual", "semantic"),
                    when=now,
                ).permitted
            return allowed[patient_id]

        counts = export_paper(self._store, out, include=permitted)
        refused = sum(1 for ok in allowed.values() if not ok)
        self._event(p, "export", "ltm", "source", reason=f"paper layout; {refused} patients without consent left out")
        return counts

    def import_paper(self, principal: Principal, src: str | Path) -> dict[str, int]:
        """Read the paper's layout from ``src`` into this (empty) store (admin or system); the
        records and the audit event are written in one transaction."""
        p = self._allow(principal, Operation.IMPORT)
        batch = read_paper(self._store, src)
        self._event(p, "import", "source", "ltm", batch=batch, reason="paper layout")
        return {"episodic": len(batch.episodes), "visual": len(batch.visuals), "semantic": len(batch.semantic)}
