"""The write path of both SQL stores, written once: one batch, one transaction.

:meth:`SqlWriter.write` checks the batch against the transition table (:mod:`.guard`) and the
vectors, then inside one transaction inserts the records, applies the state changes (the row
must be in the expected state), the short-term changes, the supersession of claims and
semantic states, consent, erases patients (:mod:`.erase`), appends the audit rows and keeps
the row digests (:mod:`.sql_rows`) in step; any error rolls all of it back. A connection lost
while the commit was sent is resolved from the write's last audit row
(:meth:`SqlWriter._after_lost_commit`). The backend then follows the commit (the ``committed``
call it gave: the FAISS index, read caches).

The writer is a part of the store, built over the other parts it writes through: the tables
(the dialect, the tenant, the codec), the row digests, the audit rows' head, the key table and
the vector part (:class:`VectorRows`: where new vectors go and how they are stored).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

from .._errors import IllegalTransition, InvalidInput, NotFound, StoreError, WriteConflict
from .._records import SemanticState, State
from .._tier_records import AuditRow, Claim, StmItem
from . import rows as r
from . import tier_rows as g
from .base import AuditChainer, VectorKind, WrappedKeyTable
from .batch import StateChange, WriteBatch
from .erase import erase_patient
from .guard import check_batch
from .lanes import chain_of, lane_of
from .row_digest import RowDigest
from .sql_core import ID_CHUNK, UPSERT_META, CommitLost, SqlTables, insert_sql
from .sql_rows import SqlRowDigests
from .sql_tiers import SqlAudit

__all__ = ["Committed", "Moved", "SqlWriter", "VectorRows"]

V = TypeVar("V", SemanticState, Claim)


@dataclass(frozen=True, slots=True)
class Moved:
    """A state change applied to a row with a vector (the backend's index may follow it)."""

    kind: VectorKind
    pos: int
    old_patient_id: str
    expect: State
    new_patient_id: str
    to: State
    new_id: str


#: follows a batch the store has just committed, with the state changes of its vector rows
Committed = Callable[[WriteBatch, list[Moved]], None]


def _marks(n: int) -> str:
    return ",".join("?" * n)


class VectorRows(Protocol):
    """What the write path asks of a store's vector part."""

    def positions(self, lane: int, lanes: int) -> dict[VectorKind, int]:
        """The next vector position of each kind in ``lane`` of the store's ``lanes`` (called
        inside the write transaction, with the lane locked; a batch's rows take it and the
        positions ``lanes`` apart after it: see ``lanes.py``)."""
        ...

    def vector_rows(self, kind: VectorKind, rows: list[tuple[Any, ...]]) -> Sequence[Sequence[Any]]:
        """Rows as the driver takes them (the ``z`` blob as the backend stores vectors)."""
        ...

    def vectors_added(self, kind: VectorKind, start: int, rows: list[tuple[Any, ...]]) -> None:
        """Inside the transaction, after inserting vector rows at ``start``."""
        ...

    def vectors_erased(self, kind: VectorKind) -> None:
        """Inside the transaction, after an erasure replaced vectors of ``kind`` by zeros."""
        ...


class SqlWriter:
    """:meth:`write` and :meth:`upgrade`: one batch, one transaction, over the store's parts."""

    def __init__(
        self,
        tables: SqlTables,
        digests: SqlRowDigests,
        audit: SqlAudit,
        keys: WrappedKeyTable,
        vectors: VectorRows,
        committed: Committed,
        *,
        dim: int,
        store_id: str,
        schema_version: str,
        current_schema: str,
    ) -> None:
        """``committed`` follows each batch once it is committed (caches, indexes); ``dim`` is
        the vectors' size; ``schema_version`` the store's schema as opened, ``current_schema``
        the one this msm-mem writes (an older store takes only :meth:`upgrade`)."""
        self._t = tables
        self._digests = digests
        self._audit = audit
        self._keys = keys
        self._vectors = vectors
        self._committed = committed
        self.dim = dim
        self.store_id = store_id
        self.schema_version = schema_version
        self.current_schema = current_schema

    def _after_lost_commit(self, batch: WriteBatch, lost: CommitLost) -> None:
        """Whether a write whose commit reply was lost is stored: returns when its last audit
        row is (the server committed it), raises :class:`StoreError` saying what is known
        otherwise. A write is never reported done unless it was committed."""
        last = batch.audit[-1] if batch.audit else None
        d = self._t.dialect
        unreachable: tuple[type[Exception], ...] = (StoreError, *d.disconnected)
        try:
            d.reconnect_after_loss()
            found = None
            if last is not None:
                found = d.q("SELECT event_hash FROM audit WHERE tenant = ? AND seq = ?", (self._t.tenant, last.seq))
            row = None if found is None else found.fetchone()
        except unreachable as exc:
            where = f" (its audit event would be seq {last.seq})" if last is not None else ""
            raise StoreError(
                f"the connection was lost while this write was committed and the server cannot be asked yet: it may"
                f" or may not be stored{where}; read it back once the server is up ({lost}; {exc})"
            ) from exc
        if last is None or row is None or row[0] != last.event_hash:
            raise StoreError(
                f"the connection was lost at the commit and the write is not stored, nothing was written: {lost}"
            )

    def write(
        self,
        batch: WriteBatch,
        chain: AuditChainer | None = None,
        *,
        before_commit: Callable[[], None] | None = None,
    ) -> None:
        if self.schema_version != self.current_schema:
            raise StoreError(f"store schema {self.schema_version} is opened for its upgrade only: nothing is written")
        check_batch(batch)
        for e in batch.episodes:
            r.check_vector(e.z, self.dim, f"episode {e.episode_id}")
        for v in batch.visuals:
            r.check_vector(v.z, self.dim, f"visual {v.visual_id}")
        d = self._t.dialect
        with d.writer_turn(), d.db():
            try:
                with d.transaction():
                    moved = self._apply(batch, chain)
                    if before_commit is not None:
                        before_commit()
            except CommitLost as exc:
                self._after_lost_commit(batch, exc)  # returns only when the write is stored
            finally:
                self._digests.forget_saved()  # committed or rolled back: meta holds the truth again
            self._committed(batch, moved)

    def upgrade(
        self,
        chain: AuditChainer,
        reencode: Callable[[str, str, str], str | None],
        *,
        before_commit: Callable[[], None],
        check: Callable[[], None] | None = None,
    ) -> int:
        """Bring a store of an older schema to the current one in one transaction: the tables
        get the tenant column (:meth:`Dialect.add_tenant`, every row the store's tenant's), ``check``
        runs (the audit layer verifies the chain there), each visual tag for which
        ``reencode(visual_id, patient_id, stored)`` returns a new stored form is replaced
        (clear text encrypted), the row digests are computed from the rows, the schema is
        recorded, the audit rows of ``chain`` appended and ``before_commit`` run. Any error
        rolls all of it back. Returns the number of tags replaced."""
        current = self.current_schema
        if self.schema_version == current:
            raise StoreError(f"the store is at schema {current} already: nothing to upgrade")
        t, d = self._t.tenant, self._t.dialect
        with d.db():
            with d.transaction():
                found = d.q("SELECT value FROM meta WHERE key = 'schema'").fetchone()
                if found is None or found[0] == current:
                    raise StoreError("the store was upgraded meanwhile (by another process): nothing to do")
                d.add_tenant(t)
                if check is not None:
                    check()
                tags = d.q("SELECT id, patient_id, visual_tag FROM visual WHERE tenant = ?", (t,)).fetchall()
                new = [(value, t, rid) for rid, pid, tag in tags if (value := reencode(rid, pid, tag)) is not None]
                if new:
                    d.many("UPDATE visual SET visual_tag = ? WHERE tenant = ? AND id = ?", new)
                digests = self._digests.computed_row_digests().items()
                meta = [(f"rows:{name}", digest.meta_value(), t) for name, digest in digests]
                meta += [("schema", current, t), ("store_id", self.store_id, t)]
                d.many(UPSERT_META, meta)
                d.q("DELETE FROM meta WHERE tenant = ? AND key = 'tenant'", (t,))  # now store_id
                self._append_audit(chain(*self._audit.audit_head()))
                before_commit()
            self.schema_version = current
        return len(new)

    def _lanes_of(self, batch: WriteBatch) -> list[int]:
        """The lanes of every patient ``batch`` names or whose rows it changes (those changed by
        id read first: a row whose patient changes before the lock fails the write later)."""
        n = self._t.lanes
        patients = set(batch.patients)
        for records in (batch.episodes, batch.visuals, batch.semantic, batch.stm, batch.claims):
            patients.update(r.patient_id for r in records)
        for others in (batch.entities, batch.relationships, batch.consents, batch.erase):
            patients.update(r.patient_id for r in others)
        patients.update(batch.shred_keys)
        if batch.erase:  # an erased episode or visual stays as an empty row without a patient
            patients.add("")
        patients.update(c.new_patient_id for c in batch.changes if c.new_patient_id is not None)
        by_table: dict[str, list[str]] = {}
        for c in batch.changes:
            by_table.setdefault(c.table, []).append(c.record_id)
        by_table.setdefault("stm", []).extend(c.item_id for c in batch.stm_changes)
        by_table.setdefault("consents", []).extend(consent_id for consent_id, _ in batch.revocations)
        named = sorted(patients)
        for table, ids in by_table.items():
            # first among the patients the batch names (a statement on their shards alone on
            # Citus), then the rest by id alone
            unique = list(dict.fromkeys(ids))
            found = self._patients_of(table, unique, named) if 0 < len(named) <= ID_CHUNK // 4 else {}
            found.update(self._patients_of(table, [i for i in unique if i not in found], []))
            patients.update(found.values())
        return sorted({lane_of(p, n) for p in patients}) or [0]

    def _patients_of(self, table: str, ids: list[str], among: list[str]) -> dict[str, str]:
        """``id -> patient`` of the rows of ``ids`` that exist (of the patients ``among``, if any)."""
        found: dict[str, str] = {}
        who = f" AND patient_id IN ({_marks(len(among))})" if among else ""
        for start in range(0, len(ids), ID_CHUNK):
            part = ids[start : start + ID_CHUNK]
            rows = self._t.dialect.q(
                f"SELECT id, patient_id FROM {table} WHERE tenant = ?{who} AND id IN ({_marks(len(part))})",
                (self._t.tenant, *among, *part),
            ).fetchall()
            found.update((str(row[0]), str(row[1])) for row in rows)
        return found

    def _apply(self, batch: WriteBatch, chain: AuditChainer | None = None) -> list[Moved]:
        # read under the write lock: the key table, the positions and the audit head are what
        # the last commit of any writer left, so concurrent writers cannot collide on them
        self._check_rewrapped(batch)
        lanes = [0]
        if self._t.lanes > 1:  # the lanes' locks, in lane order: writers of other lanes go on
            lanes = self._lanes_of(batch)
            self._t.dialect.lock_lanes(lanes)
        home = lanes[0]  # the chain the audit rows join and the positions' lane
        head: int | None = None  # the stored audit head's seq, when read here
        if chain is not None:
            head_seq, head_hash = self._audit.audit_head(home)
            if self._t.lanes == 1:
                batch.audit = chain(head_seq, head_hash)
            else:  # the first seqs of the chain's residue above every seq stored
                batch.audit = chain(head_seq, head_hash, self._audit.audit_last())
            head = head_seq
        d = self._digests.begin(lanes)
        codec, sql, tenant = self._t.codec, self._t.dialect, self._t.tenant
        # (a batch without vectors places none: an audit-only write spares the two reads)
        pos = self._vectors.positions(home, self._t.lanes) if batch.episodes or batch.visuals else {}
        step = self._t.lanes
        vectors: tuple[tuple[VectorKind, list[tuple[Any, ...]]], ...] = (
            (
                "episodic",
                [r.episode_to_row(e, pos["episodic"] + i * step, codec) for i, e in enumerate(batch.episodes)],
            ),
            ("visual", [r.visual_to_row(v, pos["visual"] + i * step, codec) for i, v in enumerate(batch.visuals)]),
        )
        for kind, rows in vectors:
            if rows:
                sql.many(insert_sql(kind), [(*row, tenant) for row in self._vectors.vector_rows(kind, rows)])
                self._vectors.vectors_added(kind, pos[kind], rows)
                d.add_full(kind, rows)
        moved = [m for c in batch.changes if (m := self._apply_change(c, d)) is not None]
        self._apply_stm(batch.stm, batch.stm_changes, d)
        self._insert_versions("claims", "key", batch.claims, lambda c: g.claim_to_row(c, codec), batch.restore, d)
        inserts = (
            ("entities", [g.entity_to_row(e, codec) for e in batch.entities]),
            ("relationships", [g.relationship_to_row(x) for x in batch.relationships]),
            ("consents", [g.consent_to_row(c) for c in batch.consents]),
        )
        for table, rows in inserts:
            if rows:
                sql.many(insert_sql(table), [(*row, tenant) for row in rows])
                d.add_full(table, rows)
        for consent_id, when in batch.revocations:
            done = self._digests.track(d, "consents", [consent_id])
            cur = sql.q(
                "UPDATE consents SET revoked_at = ? WHERE tenant = ? AND id = ? AND revoked_at IS NULL",
                (when, tenant, consent_id),
            )
            if cur.rowcount != 1:
                raise NotFound(f"no unrevoked consent {consent_id!r}")
            done()
        self._append_audit(batch.audit, head)
        self._insert_versions(
            "semantic", "category", batch.semantic, lambda s: r.semantic_to_row(s, codec), batch.restore, d
        )
        for erasure in batch.erase:
            erase_patient(erasure, self._t, self._digests, self._vectors, d, self.dim)
        self._digests.save(d)
        for key in batch.rewrapped:  # the key table joins this transaction
            self._keys.put(key)
        for patient_ref in batch.shred_keys:
            self._keys.shred(patient_ref)
        for erasure in batch.erase:
            self._keys.shred(erasure.patient_id, erasure.key_ref)
        return moved

    def _check_rewrapped(self, batch: WriteBatch) -> None:
        """A batch may only rewrap data keys that exist: never create, re-patient or revive one."""
        for key in batch.rewrapped:
            stored = self._keys.get_by_id(key.key_id)
            if stored is None or stored.shredded or key.shredded or stored.patient_ref != key.patient_ref:
                raise IllegalTransition(f"data key {key.key_id!r} can only be rewrapped, not created or revived")

    def _apply_change(self, c: StateChange, d: RowDigest) -> Moved | None:
        table, sql, tenant = c.table, self._t.dialect, self._t.tenant
        vector = table in ("episodic", "visual")
        row = sql.q(
            f"SELECT patient_id, state{', pos' if vector else ''} FROM {table} WHERE tenant = ? AND id = ?",
            (tenant, c.record_id),
        ).fetchone()
        if row is None:
            raise NotFound(f"no {table} record {c.record_id!r}")
        if row[1] != c.expect.value:
            # the record moved since the write read it: another writer changed it first
            raise WriteConflict(f"{table} record {c.record_id!r} is {row[1]}, expected {c.expect.value}")
        sets = r.change_sets(c, row[0], self._t.codec)
        done = self._digests.track(d, table, [c.record_id], [str(sets["id"])])
        sql.rewrite(table, sets, tenant, c.record_id, str(row[0]))
        done()
        if not vector:
            return None
        kind: VectorKind = "episodic" if table == "episodic" else "visual"
        return Moved(kind, int(row[2]), row[0], c.expect, str(sets["patient_id"]), c.to, str(sets["id"]))

    def _apply_stm(self, items: list[StmItem], stm_changes: Sequence[Any], d: RowDigest) -> None:
        sql, tenant, codec = self._t.dialect, self._t.tenant, self._t.codec
        changes = {c.item_id: c for c in stm_changes}
        rows = []
        for item in items:
            c = changes.pop(item.item_id, None)
            if c is not None:  # born and changed in this batch: store the final row at once
                if c.expect != item.state:
                    raise IllegalTransition(
                        f"short-term item {item.item_id!r} is {item.state.value}, expected {c.expect.value}"
                    )
                item = replace(
                    item,
                    state=c.to,
                    expires_at=c.expires_at or item.expires_at,
                    payload=None if c.purge else (c.payload or item.payload),
                    z=None if c.purge else item.z,
                )
            rows.append(g.stm_to_row(item, codec))
        if rows:
            sql.many(insert_sql("stm"), [(*row, tenant) for row in rows])
            d.add_full("stm", rows)
        done = self._digests.track(d, "stm", list(changes))
        for c in changes.values():
            sets: list[str] = ["state = ?"]
            args: list[object] = [c.to.value]
            if c.expires_at is not None:
                sets.append("expires_at = ?")
                args.append(c.expires_at)
            if c.purge:
                sets.append("payload = '', z = NULL")
            if c.payload is not None:  # the content's AAD binds the item's patient
                owner = sql.q("SELECT patient_id FROM stm WHERE tenant = ? AND id = ?", (tenant, c.item_id)).fetchone()
                if owner is None:
                    raise NotFound(f"no short-term item {c.item_id!r}")
                sets.append("payload = ?")
                args.append(codec.encode("stm", c.item_id, "payload", owner[0], c.payload.to_json()))
            cur = sql.q(
                f"UPDATE stm SET {', '.join(sets)} WHERE tenant = ? AND id = ? AND state = ?",
                (*args, tenant, c.item_id, c.expect.value),
            )
            if cur.rowcount != 1:
                row = sql.q("SELECT state FROM stm WHERE tenant = ? AND id = ?", (tenant, c.item_id)).fetchone()
                if row is None:
                    raise NotFound(f"no short-term item {c.item_id!r}")
                raise IllegalTransition(f"short-term item {c.item_id!r} is {row[0]}, expected {c.expect.value}")
        done()

    def _append_audit(self, audit: list[AuditRow], head_seq: int | None = None) -> None:
        """Append rows that continue the stored chain; a stored row is never written again.
        ``head_seq``: the stored head's seq if this transaction read it already (under its
        write lock, so it is still the head), else it is read here."""
        if not audit:
            return
        sql, tenant = self._t.dialect, self._t.tenant
        if head_seq is None:
            row = sql.q("SELECT seq FROM audit WHERE tenant = ? ORDER BY seq DESC LIMIT 1", (tenant,)).fetchone()
            head_seq = int(row[0]) if row else self._audit.audit_base()[0]
        step = self._t.lanes
        if audit[0].seq <= head_seq:
            raise IllegalTransition(f"the audit tier is append-only: seq {audit[0].seq} is stored already")
        starts = audit[0].seq == head_seq + 1 if step == 1 else (audit[0].seq - head_seq) % step == 0
        if not starts or any(b.seq != a.seq + step for a, b in zip(audit, audit[1:], strict=False)):
            raise InvalidInput(f"audit rows must continue the chain after seq {head_seq}, {step} apart")
        sql.many(insert_sql("audit"), [(x.seq, x.payload, x.event_hash, tenant) for x in audit])
        if step > 1:
            self._audit.set_lane_head(chain_of(audit[-1].seq, step), (audit[-1].seq, audit[-1].event_hash))

    def _insert_versions(
        self,
        table: str,
        key_column: str,
        versions: list[V],
        to_row: Callable[[V], tuple[Any, ...]],
        restore: bool,
        d: RowDigest,
    ) -> None:
        """Insert new versions of keyed records (semantic states, claims): each one's ``supersedes``
        must be the active version of the same patient and key, which flips to SUPERSEDED.

        One read, one update and one insert for the whole batch. A version superseded by a later
        one of the same batch is stored SUPERSEDED at once. ``restore`` stores rows as given.
        IllegalTransition (and nothing written, the caller rolls back) for a predecessor that is
        missing, not active, of another key or superseded twice, or a second active version.
        """
        if not versions:
            return
        tenant: str = self._t.tenant
        sql = self._t.dialect

        def ident(v: V) -> str:
            return v.state_id if isinstance(v, SemanticState) else v.claim_id

        def key(v: V) -> str:
            return v.category if isinstance(v, SemanticState) else v.key

        if not restore:
            born = {ident(v): v for v in versions}
            wanted: dict[str, V] = {}
            for v in versions:
                old = v.supersedes
                if old is None:
                    continue
                if old in wanted:
                    raise IllegalTransition(f"{table} version {old!r} is superseded twice")
                wanted[old] = v
                prev = born.get(old)
                if prev is not None and (
                    (prev.patient_id, key(prev)) != (v.patient_id, key(v)) or prev.state != State.ACTIVE
                ):
                    raise IllegalTransition(f"{table} version {old!r} is not the active version of this key")
            stored = [old for old in wanted if old not in born]
            found: dict[str, tuple[str, str]] = {}
            for start in range(0, len(stored), ID_CHUNK):
                part = stored[start : start + ID_CHUNK]
                rows = sql.q(
                    f"SELECT id, patient_id, {key_column} FROM {table}"
                    f" WHERE tenant = ? AND state = 'active' AND id IN ({_marks(len(part))})",
                    [tenant] + part,  # noqa: RUF005 (mypy cannot type a starred list in this generic function)
                )
                found.update((row[0], (row[1], row[2])) for row in rows)
            for old in stored:
                v = wanted[old]
                if found.get(old) != (v.patient_id, key(v)):  # another writer superseded it first
                    raise WriteConflict(f"{table} version {old!r} is not the active version of this key")
            if stored:
                done = self._digests.track(d, table, stored)
                sql.many(
                    f"UPDATE {table} SET state = 'superseded' WHERE tenant = ? AND id = ?",
                    [(tenant, old) for old in stored],
                )
                done()
            versions = [replace(v, state=State.SUPERSEDED) if ident(v) in wanted else v for v in versions]
        new_rows = [to_row(v) for v in versions]
        sql.flush()  # a pipelining backend raises the errors of the statements before as theirs,
        try:
            sql.many(insert_sql(table), [new + (tenant,) for new in new_rows])  # noqa: RUF005 (as above)
            sql.flush()  # and this insert's refusal here
        except sql.integrity_error as exc:
            raise WriteConflict(
                f"a {table} key already has an active version; a new version must supersede it ({exc})"
            ) from exc
        d.add_full(table, new_rows)
