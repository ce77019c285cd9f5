"""The audit tier: an append-only, hash-chained log of every read, write, transition and
consent decision, with signed checkpoints kept outside the database.

Events hold ids only: record ids, a random per-patient pseudonym (its link to the patient is
encrypted with the patient's data key, so crypto-shredding the patient unlinks it), the actor,
role, purpose, consent id and outcome. Never narrative, never a patient identifier.

Every commit that appends audit rows signs the new chain head (Ed25519 over origin, size,
head hash, time and the chain's base) before the write is acknowledged: inside the
transaction, just before it commits, the signed head replaces ``checkpoints.head`` (fsynced);
after the commit it is appended to ``checkpoints.jsonl`` and to the witness, if there is one.
A commit that fails leaves a head file naming a chain the store does not have, which the next
write replaces; a process killed after its commit leaves a head file that matches the store,
and the next write copies it into the log. Either way a truncated tail, a forged append, an
edited and rehashed event or a deleted head with a forged base no longer matches (see
:mod:`.coverage`). A write refuses to continue a chain whose head no checkpoint signs.

Where they live: by default ``DIR/audit/``, elsewhere when named (:class:`CheckpointPlace`);
the signing key is the caller's (a key home outside the directory, or a
:class:`~.checkpoint_signer.SigningKey`). The witness gets its own signed head before each
commit too, so verification refuses a witness that is behind the store (rolled back) as well
as one that is ahead of it (the store rolled back or truncated). Verification only reads.

A store of several patient lanes (``msm_mem._storage.lanes``) keeps a chain per lane: a
commit signs its chain's new head with every chain's head (the root) and the row digests of
the lanes it wrote, into that chain's own head file (``checkpoints.<c>.head``; chain 0's is
``checkpoints.head``), and the log and witness hold every chain's lines; writers of different
lanes do not wait for one another, in this process or others. Verification: :mod:`.chains`.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import logging
import secrets
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

from ... import _transitions as tr
from ..._clock import Clock
from ..._errors import AccessDenied, AuditChainBroken, CanonicalJSONError, InvalidInput, NotFound
from ..._principal import as_role
from ..._storage.base import AuditChainer, Store, WriteBatch
from ..._storage.erase import is_erased
from ..._storage.lanes import chain_of
from ..._tier_records import AuditRow
from ..crypto import EnvelopeCipher
from ..deid import find_identifiers
from .chain import ChainBuilder
from .chains import check_lane_rows, check_roots, walk_chains
from .checkpoint import Checkpoint, CheckpointLog, heads_root
from .checkpoint_files import CheckpointPlace, publish, read_head, read_tail, write_head
from .checkpoint_signer import CheckpointSigner
from .coverage import check_coverage
from .erasure import DOMAIN as ERASURE_DOMAIN
from .erasure import ErasureReceipt, check_receipt, erased_ids
from .event import GENESIS, AuditEvent, AuditSpec
from .jcs import loads_strict
from .links import LinkScan, check_links
from .parallel import verify_full
from .row_check import check_rows, covering, signed_rows
from .verify import VerifyResult, verify_hashes_in_batches

__all__ = ["RETENTION_S", "AuditLog"]

#: audit events are kept at least six years (the HIPAA documentation floor)
RETENTION_S = 6 * 365.25 * 86400
_log = logging.getLogger("msm_mem")


@functools.lru_cache(maxsize=4096)
def _plain_reason(reason: str) -> bool:
    """Whether a reason is short and free of identifiers (reasons repeat: cached)."""
    return len(reason) <= 120 and not find_identifiers(reason)


class AuditLog:
    """Builds audit rows for write batches, signs the head at every commit, verifies the chain."""

    def __init__(
        self,
        store: Store,
        cipher: EnvelopeCipher,
        directory: Path,
        clock: Clock,
        *,
        signer: CheckpointSigner,
        origin: str = "msm-mem",
        place: CheckpointPlace | None = None,
    ) -> None:
        self.store = store
        self.cipher = cipher
        self.clock = clock
        self.origin = origin
        self.signer = signer
        self.place = place if place is not None else CheckpointPlace.of(directory, None, None)
        self.log = CheckpointLog(self.place.log)
        self._lock = threading.RLock()
        self._pseudonym_lock = threading.RLock()  # apart: a read's pseudonym never waits for a write
        self._pseudonyms: dict[str, str] = {}
        self._head: tuple[int, str] | None = None  # chain head after our last write
        self._signed: dict[int, tuple[int, str]] = {}  # by chain: the last head this object saw signed
        #: the store's audit chains (patient lanes, ``msm_mem._storage.lanes``): 1 unless made with more
        self.chains = store.audit_chains()

    # pseudonyms ----------------------------------------------------------------------------

    def pseudonym(self, patient_id: str) -> str:
        """The patient's random pseudonym ("" for none, "*" for every patient); created once."""
        if patient_id in ("", "*"):
            return patient_id
        with self._pseudonym_lock:
            keys = self.store.keys()
            key = keys.get(patient_id)
            # checked first: the shred may come from another handle (its key row then keeps only
            # a keyed digest of the patient id: the cipher finds it)
            if key.shredded if key is not None else self.cipher.is_shredded(patient_id):
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
                found = keys.pseudonym(key.key_id) or (pseudonym, token)  # another process's may have won
            self._pseudonyms[patient_id] = found[0]
            return found[0]

    def forget(self, patient_id: str) -> None:
        """Drop the cached pseudonym of a shredded patient."""
        with self._pseudonym_lock:
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
            lane_key=patient,
        )

    def write(self, batch: WriteBatch, specs: Sequence[AuditSpec]) -> tuple[int, str] | None:
        """Chain the events after the stored head and write them with ``batch`` atomically;
        ``(seq, event_hash)`` of the last event written (None for no events).

        The head is read inside the store's write transaction (``Store.write``'s ``chain``), under its
        write lock, so concurrent writers (threads, handles or processes) never fork the chain
        nor collide on a sequence number; a failed write leaves the head where the store has it.
        """
        if self.chains > 1:
            batch.patients.extend(spec.lane_key for spec in specs)
        return self.commit(lambda chain, sign: self.store.write(batch, chain, before_commit=sign), specs)

    def commit(
        self,
        apply: Callable[[AuditChainer, Callable[[], None]], object],
        specs: Sequence[AuditSpec],
        *,
        adopt: bool = False,
    ) -> tuple[int, str] | None:
        """:meth:`write` for any write of the store: ``apply(chain, sign)`` runs one transaction
        that calls ``chain(seq, prev)`` for the audit rows and ``sign()`` just before it commits;
        returns ``(seq, event_hash)`` of the last of them (None for no events).
        ``adopt`` signs the new head even if no checkpoint signed the one it continues (a store
        upgrade, once its chain was checked: :mod:`msm_mem._governance.upgrade`)."""
        # with several chains the store's lane locks order the writers of each chain: writers
        # of other lanes, in this process too, go on
        with self._lock if self.chains == 1 else contextlib.nullcontext():
            heads: list[tuple[int, str]] = []
            started: list[tuple[int, str]] = []
            builders: list[ChainBuilder] = []

            def chain(seq: int, prev: str, after: int = 0) -> list[AuditRow]:
                # called inside the write transaction, under the store's write lock: the head
                # another process may have moved is read there, so sequence numbers never collide
                builder = ChainBuilder(seq, prev, self.chains, after)
                rows = [AuditRow(*builder.next_row_of(spec)) for spec in specs]
                started[:], builders[:] = [(seq, prev)], [builder]
                heads[:] = [(builder.head_seq, builder.head_hash)]
                return rows

            signed: list[Checkpoint] = []

            def sign() -> None:
                if builders:
                    self._sign_commit(started[0], builders[0], signed, adopt)

            try:
                apply(chain, sign)
            except BaseException:
                self._head = None  # re-read from the store next time
                raise
            self._head = heads[0] if heads else None
            if signed:
                self._publish(signed[-1])
            return self._head

    # signing the head at every commit (kept apart from the chaining above) -----------------

    def _sign_commit(
        self, head: tuple[int, str], builder: ChainBuilder, out: list[Checkpoint], adopt: bool = False
    ) -> None:
        """Inside the write transaction, before it commits: the chain continued from ``head``
        must be signed (unless adopted); sign the new head and make it durable in the head file."""
        c = chain_of(builder.head_seq, self.chains)
        if not adopt:
            self._require_signed(head, c)
        base = self.store.audit_base(c)
        now = self.clock.now()
        if self.chains == 1:
            cp = self.signer.sign_head(
                self.origin, builder.head_seq, builder.head_hash, now, base, signed_rows(self.store)
            )
        else:
            lanes = tuple(
                (lane, tuple((t, d.count, d.digest) for t, d in sorted(digests.items())))
                for lane, digests in sorted(self.store.lane_digests().items())
            )
            heads = self.store.audit_heads()
            cp = self.signer.sign_head(
                self.origin, builder.head_seq, builder.head_hash, now, base, chain=c, heads=heads, lanes=lanes
            )
        write_head(self.place.head_of(c), cp)
        witness_head = self.place.witness_head_of(c)
        if witness_head is not None:
            write_head(witness_head, cp)
        out.append(cp)

    def _require_signed(self, head: tuple[int, str], c: int = 0) -> None:
        """Refuse to sign over events no checkpoint covers (they were not written through here).

        A head signed in the head file but missing from the log (its writer was killed after
        the commit) is copied into the log first, since the head file is about to be replaced.
        """
        if head == self._signed.get(c) or head == (c, GENESIS):
            return
        if head == self.store.audit_base(c):  # everything before the head was purged by a signed write
            return
        pending = read_head(self.place.head_of(c))
        if pending is not None and self._covers(pending, head):
            for place in (self.place.log, self.place.witness):
                if place is None:
                    continue
                tail = read_tail(place)
                if tail is None or (tail.size, tail.head_hash) != head:
                    # raises (the write fails, nothing stored) rather than replace the only
                    # signed record of the stored head when the log cannot take it (a full disk)
                    publish(place, pending)
            self._signed[c] = head
            return
        tail = read_tail(self.place.log)
        if self.chains > 1:  # the log's last line may be another chain's: its last of this chain
            tail = next((cp for cp in reversed(CheckpointLog(self.place.log).all()) if cp.chain == c), None)
        if tail is not None and self._covers(tail, head):
            self._signed[c] = head
            return
        first = tail.size + self.chains if tail is not None and tail.size < head[0] else c + self.chains
        raise AuditChainBroken(
            f"events up to {head[0]} are covered by no signed checkpoint: verify the audit tier"
            " (an admin's or auditor's checkpoint signs the head of a store made before per-commit checkpoints)",
            seq=first,
        )

    def _covers(self, cp: Checkpoint, head: tuple[int, str]) -> bool:
        return cp.origin == self.origin and (cp.size, cp.head_hash) == head and cp.verify(self.signer.public_key)

    def _publish(self, cp: Checkpoint) -> None:
        """After the commit: the signed head into the log and the witness. The head file (fsynced
        before the commit) already covers it, so a failure here loses nothing: the next write
        copies the head file into the log."""
        try:
            publish(self.place.log, cp)
            if self.place.witness is not None:
                publish(self.place.witness, cp)
        except OSError:
            self._signed.pop(cp.chain or 0, None)
            return
        self._signed[cp.chain or 0] = (cp.size, cp.head_hash)

    def checkpoint(self) -> tuple[int, str]:
        """Sign the current head and append it to the log and the witness; returns (size, hash).

        Every commit signs its head already; this signs a head that nothing signed, such as
        that of a store made before per-commit checkpoints (audited by the caller)."""
        with self._lock:
            if self.chains > 1:
                return self._checkpoint_chains()
            size, head = self.store.audit_head()
            rows = signed_rows(self.store)
            cp = self.signer.sign_head(self.origin, size, head, self.clock.now(), self.store.audit_base(), rows)
            publish(self.place.log, cp)
            if self.place.witness is not None:
                publish(self.place.witness, cp)
            self._signed[0] = (size, head)
            return size, head

    def _checkpoint_chains(self) -> tuple[int, str]:
        """:meth:`checkpoint` of a store of several chains: each chain that holds events signed
        with every chain's head (no row digests: the commits sign those); returns the newest
        seq and :func:`~.checkpoint.heads_root` of the heads."""
        heads = self.store.audit_heads()
        for c, (size, head) in enumerate(heads):
            if size == c:
                continue  # an empty chain
            base = self.store.audit_base(c)
            cp = self.signer.sign_head(self.origin, size, head, self.clock.now(), base, chain=c, heads=heads, lanes=())
            publish(self.place.log, cp)
            if self.place.witness is not None:
                publish(self.place.witness, cp)
            self._signed[c] = (size, head)
        return max(size for size, _ in heads), heads_root(heads)

    # verification --------------------------------------------------------------------------

    def _checkpoint_lines(self, chain_empty: bool) -> tuple[list[tuple[str, Checkpoint]], str]:
        """Every checkpoint line of the log and the witness, with where it came from; a reason
        (and no lines) when one of them is missing or unreadable."""
        lines: list[tuple[str, Checkpoint]] = []
        sources = [("checkpoint log", self.place.log)]
        if self.place.witness is not None:
            sources.append(("witness", self.place.witness))
        for name, path in sources:
            if not path.is_file():
                if chain_empty:
                    continue
                return [], (
                    f"the {name} {path.name} is missing: deleted, or never written (an older msm-mem"
                    " checkpointed every 10,000 events; an admin's or auditor's checkpoint signs the head)"
                )
            try:
                lines.extend((name, c) for c in CheckpointLog(path).all())
            except (CanonicalJSONError, InvalidInput) as exc:
                return [], f"the {name} {path.name} is unreadable: {exc}"
        return lines, ""

    def verify(self, *, full: bool = True, processes: int | None = None) -> VerifyResult:
        """Verify the stored chain (fully, or hashes and links only) against the signed
        checkpoints of the log, the witness and the head file; a full verification also
        recomputes the row digests from every governed row and compares them with those the
        checkpoint of the head signed (:mod:`.row_check`), and checks the pseudonym and key
        tables against the events (:mod:`.links`). Reads only: no file, folder or lock is
        created, so a store on read-only media verifies.

        A full verification of a long chain checks the rows in worker processes that hold no
        key (:mod:`.parallel`; same result): ``processes`` None for one per core (from
        200,000 events and 3 cores), 1 for one process, N for N workers. Hash-only
        verification runs in one process. A store of several chains walks each apart, side by
        side (:mod:`.chains`; ``processes`` then applies to each walk, default 1)."""
        if self.chains > 1:
            return self._verify_chains(full, processes)
        base_seq, base_hash = self.store.audit_base()
        stored_head = self.store.audit_head()
        lines, problem = self._checkpoint_lines(stored_head[0] == base_seq)
        if problem:
            return VerifyResult(False, 0, base_hash, base_seq + 1, f"seq {base_seq + 1}: {problem}")
        head_file = read_head(self.place.head)
        checkpoints = [c for _, c in lines if c.size > base_seq]
        if head_file is not None:
            checkpoints.append(head_file)
        sizes = sorted({c.size for c in checkpoints})
        seen: dict[int, str] = {}
        scan = LinkScan()

        def batches() -> Iterator[list[tuple[int, bytes, str]]]:
            for rows in self.store.iter_audit_batches(base_seq + 1):
                if full:
                    for row in rows:
                        scan.add(bytes(row[1]))
                # note the stored hash at each checkpoint size; a page whose seqs do not run
                # on from its first one fails the walk before the checkpoints are read
                first = rows[0][0]
                for size in sizes[bisect.bisect_left(sizes, first) : bisect.bisect_left(sizes, first + len(rows))]:
                    if rows[size - first][0] == size:
                        seen[size] = rows[size - first][2]
                yield rows

        if full:
            events = stored_head[0] - base_seq
            result = verify_full(
                batches(), start_seq=base_seq + 1, start_prev=base_hash, events=events, processes=processes
            )
        else:
            result = verify_hashes_in_batches(batches(), start_seq=base_seq + 1, start_prev=base_hash)
        if not result.ok:
            return result
        size = base_seq + result.count
        chain = (size, result.head_hash)
        key = self.signer.public_key
        result = check_coverage(lines, head_file, key, seen, chain, (base_seq, base_hash), origin=self.origin)
        if result.ok:
            result = self._check_current(lines, head_file, chain, result)
        if not result.ok or not full:
            return result
        result = check_rows(self.store, covering(lines, head_file, key, chain, self.origin), result)
        return check_links(scan, self.store, self.cipher, result) if result.ok else result

    def _verify_chains(self, full: bool, processes: int | None) -> VerifyResult:
        """:meth:`verify` of a store of several chains (see :mod:`.chains`)."""
        n = self.chains
        heads = self.store.audit_heads()
        lines, problem = self._checkpoint_lines(all(size == c for c, (size, _) in enumerate(heads)))
        if problem:
            return VerifyResult(False, 0, GENESIS, None, problem)
        head_files = {c: read_head(self.place.head_of(c)) for c in range(n)}
        key = self.signer.public_key
        walks = walk_chains(self.store, lines, head_files, key, self.origin, full=full, processes=processes)
        for walk in walks:
            if not walk.result.ok:
                return walk.result
            mine = [(w, cp) for w, cp in lines if cp.chain == walk.chain]
            current = self._check_current(mine, head_files[walk.chain], walk.head, walk.result, walk.chain)
            if not current.ok:
                return replace(current, reason=f"chain {walk.chain}: {current.reason}")
        checkpoints = [cp for _, cp in lines] + [h for h in head_files.values() if h is not None]
        result = check_roots(walks, checkpoints, key)
        if not result.ok or not full:
            return result
        result = check_lane_rows(self.store, checkpoints, key, self.origin, result)
        if not result.ok:
            return result
        scan = LinkScan()
        for walk in walks:
            scan.named |= walk.links.named
            scan.erased |= walk.links.erased
        return check_links(scan, self.store, self.cipher, result)

    def _check_current(
        self,
        lines: Sequence[tuple[str, Checkpoint]],
        head_file: Checkpoint | None,
        chain: tuple[int, str],
        result: VerifyResult,
        c: int = 0,
    ) -> VerifyResult:
        """With a witness, both places must sign the stored head ``chain`` (a line, or the
        head file each gets before every commit, so neither lags an acknowledged write): the
        store's own checkpoints (else they were rolled back or replaced by older copies while
        the witness still covers the store) and the witness (else it is behind the store).
        Without one, the coverage check has judged the log already."""
        witness_head = self.place.witness_head_of(c)
        if witness_head is None or chain[0] == self.store.audit_base(c)[0]:
            return result
        places = (
            (
                "checkpoint log",
                head_file,
                f"the checkpoint log {self.place.log.name} and its head file",
                "the store's checkpoints were rolled back or replaced by older copies",
            ),
            (
                "witness",
                read_head(witness_head),
                f"the witness {self.place.witness}",
                "the witness is behind (rolled back or replaced by an older copy), or another process wrote without it",
            ),
        )
        for where, pending, name, why in places:
            heads = [cp for w, cp in lines if w == where] + ([pending] if pending is not None else [])
            if any(self._covers(cp, chain) for cp in heads):
                continue
            newest = max((cp.size for cp in heads if cp.origin == self.origin), default=c)
            reason = f"{name} sign {newest} events, the store holds {chain[0]}: {why}"
            first = newest + self.chains
            return VerifyResult(False, result.count, result.head_hash, first, f"seq {first}: {reason}")
        return result

    def sign_receipt(self, receipt: ErasureReceipt) -> ErasureReceipt:
        """``receipt`` signed with the checkpoint key (see :mod:`.erasure`)."""
        return replace(receipt, signature=self.signer.sign_bytes(ERASURE_DOMAIN, receipt.message()))

    def verify_erasure(
        self, receipt: ErasureReceipt, *, full: bool = True, processes: int | None = None
    ) -> VerifyResult:
        """:meth:`verify`, then the erasure ``receipt`` against the verified chain
        (:func:`.erasure.check_receipt`) and the store: each episodic and visual row its event
        names is an empty row now. Reads only."""
        result = self.verify(full=full, processes=processes)
        if not result.ok:
            return result
        pages = self.store.iter_audit_batches(receipt.seq)
        try:
            rows = next(pages, [])
        finally:
            close = getattr(pages, "close", None)  # the first page only: the read ends here
            if close is not None:
                close()
        row = rows[0] if rows else None
        problem = check_receipt(receipt, self.signer.public_key, row)
        if not problem and row is not None:
            ids = erased_ids(receipt, list(loads_strict(bytes(row[1]))["record_ids"]))
            found = self.store.find_episodes(ids.get("episodic", []))
            try:
                visuals = {v.visual_id: v for v in self.store.get_visuals(ids.get("visual", []))}
            except NotFound:
                visuals = {}
            for kind, records in (("episodic", found), ("visual", visuals)):
                for rid in ids.get(kind, []):
                    record = records.get(rid)
                    if record is None or not is_erased(record):
                        problem = f"{kind} record {rid} is not the empty row an erasure leaves"
                        break
                if problem:
                    break
        if problem:
            return VerifyResult(False, result.count, result.head_hash, receipt.seq, f"seq {receipt.seq}: {problem}")
        return result

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
