"""The reads of the governed tiers (short-term items, claims, graph, consent) and the audit
rows, written once for both SQL stores."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from .._errors import NotFound
from .._tier_records import Claim, ConsentRecord, Entity, Relationship, StmItem, StmState
from . import tier_rows as g
from .base import AUDIT_PAGE_ROWS
from .sql_core import UPSERT_META, SqlCore

__all__ = ["GENESIS", "SqlTiers"]

#: the hash the first audit event links to
GENESIS = "0" * 64


class SqlTiers(SqlCore):
    """Short-term items, claims, entities, relationships, consent records and audit rows."""

    def stm_get(self, item_ids: Sequence[str]) -> list[StmItem]:
        return self._get("stm", item_ids, g.stm_from_row, 0, "short-term item")

    def stm_list(
        self,
        *,
        patient_id: str | None = None,
        state: StmState | None = None,
        expires_before: float | None = None,
        created_before: float | None = None,
    ) -> list[StmItem]:
        where: list[str] = ["tenant = ?"]
        args: list[object] = [self.tenant]
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
        return self._select(sql, args, g.stm_from_row)

    def claims_active(self, patient_id: str, key: str | None = None) -> list[Claim]:
        if key is None:
            return self._select(
                "SELECT * FROM claims WHERE tenant = ? AND patient_id = ? AND state = 'active' ORDER BY key",
                (self.tenant, patient_id),
                g.claim_from_row,
            )
        return self._select(
            "SELECT * FROM claims WHERE tenant = ? AND patient_id = ? AND key = ? AND state = 'active'",
            (self.tenant, patient_id, key),
            g.claim_from_row,
        )

    def claim_history(self, patient_id: str, key: str) -> list[Claim]:
        return self._select(
            "SELECT * FROM claims WHERE tenant = ? AND patient_id = ? AND key = ?"
            f" ORDER BY created_at, {self.ORDER['claims']}",
            (self.tenant, patient_id, key),
            g.claim_from_row,
        )

    def get_claims(self, ids: Sequence[str]) -> list[Claim]:
        return self._get("claims", ids, g.claim_from_row, 0, "claim")

    def _load_entities(self, patient_id: str) -> list[Entity]:
        """A patient's ACTIVE entities, oldest first (the caller may cache them)."""
        return self._select(
            "SELECT id, patient_id, type, name, created_at, state FROM entities"
            f" WHERE tenant = ? AND patient_id = ? AND state = 'active' ORDER BY created_at, {self.ORDER['entities']}",
            (self.tenant, patient_id),
            g.entity_from_row,
        )

    def entities(self, patient_id: str) -> list[Entity]:
        return self._load_entities(patient_id)

    def relationships(self, patient_id: str) -> list[Relationship]:
        with self._db():
            rows = self._q(
                "SELECT id, patient_id, source_id, target_id, type, created_at, state FROM relationships"
                " WHERE tenant = ? AND patient_id = ? AND state = 'active'"
                f" ORDER BY created_at, {self.ORDER['relationships']}",
                (self.tenant, patient_id),
            ).fetchall()
        return [g.relationship_from_row(row) for row in rows]

    def _load_consents(self, patient_id: str | None) -> list[ConsentRecord]:
        """Consent records of a patient and of every patient (``*``), or all (the caller may cache them)."""
        with self._db():
            if patient_id is None:
                rows = self._q(
                    "SELECT * FROM consents WHERE tenant = ? ORDER BY created_at, id", (self.tenant,)
                ).fetchall()
            else:
                rows = self._q(
                    "SELECT * FROM consents WHERE tenant = ? AND patient_id IN (?, '*') ORDER BY created_at, id",
                    (self.tenant, patient_id),
                ).fetchall()
        return [g.consent_from_row(row) for row in rows]

    def consents(self, patient_id: str | None = None) -> list[ConsentRecord]:
        return self._load_consents(patient_id)

    # audit ---------------------------------------------------------------------------------

    def audit_base(self) -> tuple[int, str]:
        with self._db():
            row = self._q("SELECT value FROM meta WHERE tenant = ? AND key = 'audit_base'", (self.tenant,)).fetchone()
        if row is None:
            return 0, GENESIS
        seq, digest = str(row[0]).split(":", 1)
        return int(seq), digest

    def audit_head(self) -> tuple[int, str]:
        with self._db():
            row = self._q(
                "SELECT seq, event_hash FROM audit WHERE tenant = ? ORDER BY seq DESC LIMIT 1", (self.tenant,)
            ).fetchone()
            return (int(row[0]), str(row[1])) if row else self.audit_base()

    def iter_audit_batches(self, start_seq: int = 1) -> Iterator[list[tuple[int, bytes, str]]]:
        seq = start_seq
        while True:
            with self._db():  # held for one page at a time, so a long verification never blocks writers
                rows: list[tuple[int, bytes, str]] = self._q(
                    "SELECT seq, payload, event_hash FROM audit WHERE tenant = ? AND seq >= ? ORDER BY seq LIMIT ?",
                    (self.tenant, seq, AUDIT_PAGE_ROWS),
                ).fetchall()
            if rows:
                yield rows
            if len(rows) < AUDIT_PAGE_ROWS:
                return
            seq = int(rows[-1][0]) + 1

    def audit_purge(self, through_seq: int) -> int:
        """The one way audit rows leave the store: retention (the caller checks the period)."""
        with self._db():
            row = self._q(
                "SELECT event_hash FROM audit WHERE tenant = ? AND seq = ?", (self.tenant, through_seq)
            ).fetchone()
            if row is None:
                raise NotFound(f"no audit event {through_seq}")
            with self._transaction():
                cur = self._q("DELETE FROM audit WHERE tenant = ? AND seq <= ?", (self.tenant, through_seq))
                deleted = int(cur.rowcount)
                self._q(UPSERT_META, ("audit_base", f"{through_seq}:{row[0]}", self.tenant))
            return deleted
