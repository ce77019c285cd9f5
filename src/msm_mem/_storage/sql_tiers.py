"""The reads of the governed tiers (short-term items, claims, graph, consent) and the audit
rows, written once for both SQL stores: the parts of a SQL store behind the
:class:`~msm_mem._storage.base.Tiers` and :class:`~msm_mem._storage.base.Consents` protocols
(:class:`SqlTiers`) and the :class:`~msm_mem._storage.base.Audit` protocol (:class:`SqlAudit`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from .._errors import InvalidInput, NotFound, StoreError
from .._tier_records import Claim, ConsentRecord, Entity, Relationship, StmItem, StmState
from . import tier_rows as g
from .base import AUDIT_PAGE_ROWS
from .sql_core import UPSERT_META, PatientCache, SqlTables

__all__ = ["GENESIS", "SqlAudit", "SqlTiers"]

#: the hash the first audit event links to
GENESIS = "0" * 64


class SqlTiers:
    """Short-term items, claims, entities, relationships and consent records; the reads a turn
    repeats go through ``cache``."""

    def __init__(self, tables: SqlTables, cache: PatientCache) -> None:
        self._t = tables
        self._cache = cache

    def stm_get(self, item_ids: Sequence[str]) -> list[StmItem]:
        return self._t.get("stm", item_ids, g.stm_from_row, 0, "short-term item")

    def stm_list(
        self,
        *,
        patient_id: str | None = None,
        state: StmState | None = None,
        expires_before: float | None = None,
        created_before: float | None = None,
    ) -> list[StmItem]:
        where: list[str] = ["tenant = ?"]
        args: list[object] = [self._t.tenant]
        for clause, value in (
            ("patient_id = ?", patient_id),
            ("state = ?", state.value if state else None),
            ("expires_at <= ?", expires_before),
            ("created_at <= ?", created_before),
        ):
            if value is not None:
                where.append(clause)
                args.append(value)
        sql = "SELECT * FROM stm WHERE " + " AND ".join(where) + " ORDER BY created_at, id"
        return self._t.select(sql, args, g.stm_from_row)

    def _load_claims(self, patient_id: str, key: str | None) -> list[Claim]:
        """A patient's ACTIVE claims (of one key), by key (the statement the cache stands for)."""
        t = self._t
        if key is None:
            return t.select(
                "SELECT * FROM claims WHERE tenant = ? AND patient_id = ? AND state = 'active' ORDER BY key",
                (t.tenant, patient_id),
                g.claim_from_row,
            )
        return t.select(
            "SELECT * FROM claims WHERE tenant = ? AND patient_id = ? AND key = ? AND state = 'active'",
            (t.tenant, patient_id, key),
            g.claim_from_row,
        )

    def claims_active(self, patient_id: str, key: str | None = None) -> list[Claim]:
        return self._cache.claims(patient_id, key, lambda: self._load_claims(patient_id, key))

    def claim_history(self, patient_id: str, key: str) -> list[Claim]:
        return self._t.select(
            "SELECT * FROM claims WHERE tenant = ? AND patient_id = ? AND key = ?"
            f" ORDER BY created_at, {self._t.dialect.order['claims']}",
            (self._t.tenant, patient_id, key),
            g.claim_from_row,
        )

    def get_claims(self, ids: Sequence[str]) -> list[Claim]:
        return self._t.get("claims", ids, g.claim_from_row, 0, "claim")

    def _load_entities(self, patient_id: str) -> list[Entity]:
        """A patient's ACTIVE entities, oldest first (the statement the cache stands for)."""
        order = self._t.dialect.order["entities"]
        return self._t.select(
            "SELECT id, patient_id, type, name, created_at, state FROM entities"
            f" WHERE tenant = ? AND patient_id = ? AND state = 'active' ORDER BY created_at, {order}",
            (self._t.tenant, patient_id),
            g.entity_from_row,
        )

    def entities(self, patient_id: str) -> list[Entity]:
        return self._cache.entities(patient_id, lambda: self._load_entities(patient_id))

    def relationships(self, patient_id: str) -> list[Relationship]:
        d = self._t.dialect
        with d.db():
            rows = d.q(
                "SELECT id, patient_id, source_id, target_id, type, created_at, state FROM relationships"
                " WHERE tenant = ? AND patient_id = ? AND state = 'active'"
                f" ORDER BY created_at, {d.order['relationships']}",
                (self._t.tenant, patient_id),
            ).fetchall()
        return [g.relationship_from_row(row) for row in rows]

    def _load_consents(self, patient_id: str | None) -> list[ConsentRecord]:
        """Consent records of a patient and of every patient (``*``), or all (the statement the
        cache stands for)."""
        d = self._t.dialect
        with d.db():
            if patient_id is None:
                rows = d.q(
                    "SELECT * FROM consents WHERE tenant = ? ORDER BY created_at, id", (self._t.tenant,)
                ).fetchall()
            else:
                rows = d.q(
                    "SELECT * FROM consents WHERE tenant = ? AND patient_id IN (?, '*') ORDER BY created_at, id",
                    (self._t.tenant, patient_id),
                ).fetchall()
        return [g.consent_from_row(row) for row in rows]

    def consents(self, patient_id: str | None = None) -> list[ConsentRecord]:
        return self._cache.consents(patient_id, lambda: self._load_consents(patient_id))


class SqlAudit:
    """The audit rows: the stored chains' heads and bases, their pages, and retention's purge.
    In a store of several lanes (:mod:`.lanes`) chain ``c`` is the rows whose ``seq % lanes``
    is ``c``; its base is ``meta``'s ``audit_base:<c>`` (``audit_base`` for chain 0) and its
    head the ``lane:<c>`` row, which every commit of the chain sets under that lane's lock (so
    a write reads every head in one statement; verification walks the rows themselves)."""

    def __init__(self, tables: SqlTables) -> None:
        self._t = tables

    def audit_chains(self) -> int:
        return self._t.lanes

    def _chain(self, chain: int) -> int:
        if type(chain) is not int or not 0 <= chain < self._t.lanes:
            raise InvalidInput(f"chain {chain!r} is not one of the store's {self._t.lanes} audit chains")
        return chain

    def audit_base(self, chain: int = 0) -> tuple[int, str]:
        d = self._t.dialect
        key = "audit_base" if self._chain(chain) == 0 else f"audit_base:{chain}"
        with d.db():
            row = d.q("SELECT value FROM meta WHERE tenant = ? AND key = ?", (self._t.tenant, key)).fetchone()
        if row is None:
            return chain, GENESIS
        seq, digest = str(row[0]).split(":", 1)
        return int(seq), digest

    def _lane_heads(self) -> tuple[tuple[int, str], ...]:
        """Every chain's head from ``meta`` (one statement): the ``lane:<c>`` row each commit of
        chain ``c`` sets to its last ``seq:hash``, else the chain's base."""
        d, lanes = self._t.dialect, self._t.lanes
        with d.db():
            rows = dict(
                d.q(
                    "SELECT key, value FROM meta WHERE tenant = ?"
                    " AND (substr(key, 1, 5) = 'lane:' OR substr(key, 1, 10) = 'audit_base')",
                    (self._t.tenant,),
                ).fetchall()
            )
        heads = []
        for chain in range(lanes):
            value = rows.get(f"lane:{chain}") or rows.get("audit_base" if chain == 0 else f"audit_base:{chain}")
            if value:
                seq, digest = str(value).split(":", 1)
                heads.append((int(seq), digest))
            else:
                heads.append((chain, GENESIS))
        return tuple(heads)

    def audit_head(self, chain: int = 0) -> tuple[int, str]:
        d = self._t.dialect
        if self._t.lanes != 1:
            return self._lane_heads()[self._chain(chain)]
        with d.db():
            row = d.q(
                "SELECT seq, event_hash FROM audit WHERE tenant = ? ORDER BY seq DESC LIMIT 1", (self._t.tenant,)
            ).fetchone()
            return (int(row[0]), str(row[1])) if row else self.audit_base(chain)

    def audit_last(self) -> int:
        """The highest seq stored in any chain (a base's, where the chain holds none)."""
        return max(seq for seq, _ in self.audit_heads())

    def audit_heads(self) -> tuple[tuple[int, str], ...]:
        if self._t.lanes != 1:
            return self._lane_heads()
        return (self.audit_head(),)

    def set_lane_head(self, chain: int, head: tuple[int, str]) -> None:
        """Inside a write of a store of several lanes, with the chain's lane locked: record its new head."""
        self._t.dialect.q(
            "UPDATE meta SET value = ? WHERE tenant = ? AND key = ?",
            (f"{head[0]}:{head[1]}", self._t.tenant, f"lane:{self._chain(chain)}"),
        )

    def iter_audit_batches(
        self, start_seq: int = 1, chain: int | None = None
    ) -> Iterator[list[tuple[int, bytes, str]]]:
        seq = start_seq
        d, lanes = self._t.dialect, self._t.lanes
        only = "" if chain is None or lanes == 1 else f" AND MOD(seq, {lanes}) = {self._chain(chain)}"
        while True:
            with d.db():  # held for one page at a time, so a long verification never blocks writers
                rows: list[tuple[int, bytes, str]] = d.q(
                    "SELECT seq, payload, event_hash FROM audit"
                    f" WHERE tenant = ? AND seq >= ?{only} ORDER BY seq LIMIT ?",
                    (self._t.tenant, seq, AUDIT_PAGE_ROWS),
                ).fetchall()
            if rows:
                yield rows
            if len(rows) < AUDIT_PAGE_ROWS:
                return
            seq = int(rows[-1][0]) + 1

    def audit_purge(self, through_seq: int) -> int:
        """The one way audit rows leave the store: retention (the caller checks the period)."""
        d, t = self._t.dialect, self._t.tenant
        if self._t.lanes != 1:
            raise StoreError(
                f"this store keeps {self._t.lanes} audit chains; a retention purge of a store of several"
                " chains is not supported yet: nothing was deleted"
            )
        with d.db():
            row = d.q("SELECT event_hash FROM audit WHERE tenant = ? AND seq = ?", (t, through_seq)).fetchone()
            if row is None:
                raise NotFound(f"no audit event {through_seq}")
            with d.transaction():
                cur = d.q("DELETE FROM audit WHERE tenant = ? AND seq <= ?", (t, through_seq))
                deleted = int(cur.rowcount)
                d.q(UPSERT_META, ("audit_base", f"{through_seq}:{row[0]}", t))
            return deleted
