"""The audit tier: an append-only, hash-chained log of every read, write, transition and
consent decision, with signed checkpoints kept outside the database.

Events hold ids only: record ids, a random per-patient pseudonym (its link to the patient is
encrypted with the patient's data key, so crypto-shredding the patient unlinks it), the actor,
role, purpose, consent id and outcome. Never narrative, never a patient identifier.

Checkpoints (Ed25519 over origin, size and head hash) are appended to
``DIR/audit/checkpoints.jsonl`` every ``checkpoint_every`` events or ``checkpoint_seconds``
seconds, and on demand; the signing key is ``DIR/keys/checkpoint.key`` (mode 0600). A
truncated tail or a recomputed chain no longer matches a checkpoint.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import secrets
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from .. import _transitions as tr
from .._clock import Clock
from .._errors import AccessDenied, InvalidInput, NotFound
from .._principal import as_role
from .._storage.base import Store, WriteBatch
from .._tier_records import AuditRow
from .audit_chain import ChainBuilder, VerifyResult, verify_chain, verify_hashes_in_batches
from .audit_event import AuditEvent, AuditSpec
from .checkpoint import CheckpointLog, CheckpointSigner, verify_against_checkpoints
from .crypto import EnvelopeCipher
from .deid import find_identifiers

__all__ = ["RETENTION_S", "AuditLog"]

#: audit events are kept at least six years (the HIPAA documentation floor)
RETENTION_S = 6 * 365.25 * 86400
#: tries of one write whose chain another writer overtook (each retry follows a write that committed)
_CHAIN_TRIES = 64


@functools.lru_cache(maxsize=4096)
def _plain_reason(reason: str) -> bool:
    """Whether a reason is short and free of identifiers (reasons repeat: cached)."""
    return len(reason) <= 120 and not find_identifiers(reason)


class AuditLog:
    """Builds audit rows for write batches and verifies the stored chain."""

    def __init__(
        self,
        store: Store,
        cipher: EnvelopeCipher,
        directory: Path,
        clock: Clock,
        *,
        origin: str = "msm-mem",
        checkpoint_every: int = 10_000,
        checkpoint_seconds: float = 3600.0,
    ) -> None:
        self.store = store
        self.cipher = cipher
        self.clock = clock
        self.origin = origin
        self.signer = CheckpointSigner.load_or_create(directory / "keys" / "checkpoint.key")
        (directory / "audit").mkdir(parents=True, exist_ok=True)
        self.log = CheckpointLog(directory / "audit" / "checkpoints.jsonl")
        self.checkpoint_every = checkpoint_every
        self.checkpoint_seconds = checkpoint_seconds
        self._lock = threading.RLock()
        self._pseudonyms: dict[str, str] = {}
        self._head: tuple[int, str] | None = None  # chain head after our last write
        last = self.log.latest()
        self._last_checkpoint = (last.size, last.time) if last else (0, clock.now())

    # pseudonyms ----------------------------------------------------------------------------

    def pseudonym(self, patient_id: str) -> str:
        """The patient's random pseudonym ("" for none, "*" for every patient); created once."""
        if patient_id in ("", "*"):
            return patient_id
        with self._lock:
            keys = self.store.keys()
            key = keys.get(patient_id)
            if key is not None and key.shredded:  # checked first: the shred may come from another handle
                self._pseudonyms.pop(patient_id, None)
                raise AccessDenied("this patient's keys were shredded; nothing more is recorded about them")
            cached = self._pseudonyms.get(patient_id)
            if cached is not None:
                return cached
            found = keys.pseudonym(key.key_id) if key is not None else None
            if found is None:
                pseudonym = "pt-" + secrets.token_hex(12)
                # encrypting the link creates the patient's data key when there is none yet
                token = self.cipher.encrypt_field(patient_id, "pseudonyms", pseudonym, "patient_ref", patient_id)
                key = keys.get(patient_id)
                if key is None:
                    raise NotFound("no data key after encrypting for this patient")
                keys.put_pseudonym(key.key_id, pseudonym, token)
                found = (pseudonym, token)
            self._pseudonyms[patient_id] = found[0]
            return found[0]

    def forget(self, patient_id: str) -> None:
        """Drop the cached pseudonym of a shredded patient."""
        with self._lock:
            self._pseudonyms.pop(patient_id, None)

    # appending -----------------------------------------------------------------------------

    def spec(
        self,
        *,
        actor: str,
        role: str,
        action: str,
        source_tier: str,
        target_tier: str,
        purpose: str,
        outcome: str = "success",
        record_ids: Sequence[str] = (),
        patient: str = "",
        consent_id: str = "",
        reason: str = "",
    ) -> AuditSpec:
        """An event to append later: fields fixed now (time, pseudonym), seq and hashes at write.

        ``reason`` is a short code or phrase (at most 120 characters) and must hold no patient
        identifier (checked with the Safe Harbor scanner): the audit tier carries no narrative.
        """
        if reason and not _plain_reason(reason):
            raise InvalidInput("an audit reason must be a short phrase (<= 120 characters) without identifiers")
        return AuditSpec(
            time=self.clock.now(),
            actor=actor,
            role=role,
            action=action,
            source_tier=source_tier,
            target_tier=target_tier,
            purpose=purpose,
            outcome=outcome,
            record_ids=tuple(record_ids),
            patient=self.pseudonym(patient),
            consent_id=consent_id,
            reason=reason,
        )

    def write(self, batch: WriteBatch, specs: Sequence[AuditSpec]) -> None:
        """Chain the events after the stored head and write them with ``batch`` atomically.

        Chaining and writing happen under one lock, so concurrent turns never fork the chain; a
        failed write leaves the head where the store has it.
        """
        with self._lock:
            head = self._head if self._head is not None else self.store.audit_head()
            for attempt in range(_CHAIN_TRIES):
                builder = ChainBuilder(*head)
                batch.audit = [AuditRow(*builder.next_row_of(spec)) for spec in specs]
                try:
                    self.store.write(batch)
                except BaseException:
                    self._head = None  # re-read from the store next time
                    # another handle (the CLI, another process or worker) appended after the head
                    # this batch was chained on, a cached one or one read just now but before the
                    # write took its locks: the batch rolled back, so chain it once more after the
                    # stored head (a bounded number of times under contention)
                    stored = self.store.audit_head()
                    if stored == head or attempt == _CHAIN_TRIES - 1:
                        raise
                    head = stored
                    continue
                break
            self._head = (builder.head_seq, builder.head_hash)
        self.committed()

    def committed(self) -> None:
        """Call after a batch with audit rows committed: checkpoints when one is due."""
        seq, _ = self._head if self._head is not None else self.store.audit_head()
        size, when = self._last_checkpoint
        if seq - size >= self.checkpoint_every or (seq > size and self.clock.now() - when >= self.checkpoint_seconds):
            self.checkpoint()

    def checkpoint(self) -> tuple[int, str]:
        """Sign the current head and append it to the checkpoint log; returns (size, hash)."""
        with self._lock:
            size, head = self.store.audit_head()
            cp = self.signer.sign(self.origin, size, head, self.clock.now())
            self.log.append(cp)
            self._last_checkpoint = (size, cp.time)
            return size, head

    # verification --------------------------------------------------------------------------

    def verify(self, *, full: bool = True) -> VerifyResult:
        """Verify the stored chain (fully, or hashes and links only) and the checkpoints."""
        base_seq, base_hash = self.store.audit_base()
        checkpoints = [c for c in self.log.all() if c.size > base_seq]
        sizes = sorted({c.size for c in checkpoints})
        seen: dict[int, str] = {}

        def batches() -> Iterator[list[tuple[int, bytes, str]]]:
            for rows in self.store.iter_audit_batches(base_seq + 1):
                # note the stored hash at each checkpoint size; a page whose seqs do not run
                # on from its first one fails the walk before the checkpoints are read
                first = rows[0][0]
                for size in sizes[bisect.bisect_left(sizes, first) : bisect.bisect_left(sizes, first + len(rows))]:
                    if rows[size - first][0] == size:
                        seen[size] = rows[size - first][2]
                yield rows

        if full:
            result = verify_chain(
                itertools.chain.from_iterable(batches()), start_seq=base_seq + 1, start_prev=base_hash
            )
        else:
            result = verify_hashes_in_batches(batches(), start_seq=base_seq + 1, start_prev=base_hash)
        if not result.ok:
            return result
        size = base_seq + result.count
        cp = verify_against_checkpoints(checkpoints, self.signer.public_key, seen.get, size, origin=self.origin)
        if not cp.ok:
            return cp
        return VerifyResult(True, size, result.head_hash, None, "")

    def purge(self, through_seq: int, *, actor: str, role: str, reason: str) -> int:
        """Delete events up to ``through_seq``: admin only, with a reason, refused while any of
        them is younger than the 6-year retention period; the purge itself is audited."""
        tr.check(tr.AUDIT, tr.AUDIT, tr.Trigger.PURGE_EXPIRED, as_role(role), reason=reason)
        base = self.store.audit_base()[0]
        if through_seq <= base:
            raise InvalidInput(f"events up to {base} are purged already")
        cutoff = self.clock.now() - RETENTION_S
        for row in self.store.iter_audit(base + 1):
            if row.seq > through_seq:
                break
            if AuditEvent.from_row(row.seq, row.payload, row.event_hash).time > cutoff:
                raise AccessDenied(f"audit event {row.seq} is younger than the 6-year retention period")
        spec = self.spec(
            actor=actor,
            role=role,
            action="purge_expired",
            source_tier="audit",
            target_tier="audit",
            purpose="operations",
            reason=reason,
        )
        with self._lock:
            count = self.store.audit_purge(through_seq)
            self.write(WriteBatch(), [spec])
        return count
