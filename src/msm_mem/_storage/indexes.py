"""The secondary indexes of both stores' schemas (the same SQL in SQLite and PostgreSQL).

Every read of one patient's rows has an index that leads with the tenant and the patient, so
its cost follows the patient's rows, not the store's. An index added in a later release is
created when a store made before it is first opened for writing (:func:`missing_indexes`):
an index changes no row and no result, only how rows are found, so it needs no schema
upgrade, and a store with an index its release does not know reads the same.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["INDEXES", "INDEX_NAMES", "missing_indexes"]

#: the secondary indexes (each leads with the tenant), created with the tables
INDEXES = """
CREATE INDEX episodic_patient ON episodic(tenant, patient_id, study_id);
CREATE INDEX visual_patient ON visual(tenant, patient_id);
CREATE UNIQUE INDEX semantic_one_active ON semantic(tenant, patient_id, category) WHERE state = 'active';
CREATE INDEX semantic_key ON semantic(tenant, patient_id, category, version);
CREATE INDEX stm_state ON stm(tenant, state, expires_at);
CREATE INDEX stm_patient ON stm(tenant, patient_id, state);
CREATE UNIQUE INDEX claims_one_active ON claims(tenant, patient_id, key) WHERE state = 'active';
CREATE INDEX claims_patient ON claims(tenant, patient_id, key);
CREATE INDEX claims_decay ON claims(tenant, decay_at);
CREATE INDEX entities_patient ON entities(tenant, patient_id);
CREATE INDEX relationships_patient ON relationships(tenant, patient_id);
CREATE INDEX consents_patient ON consents(tenant, patient_id);
CREATE INDEX episodic_decay ON episodic(tenant, decay_at);
CREATE INDEX visual_decay ON visual(tenant, decay_at);
"""

_STATEMENTS: dict[str, str] = {
    found.group(2): statement.strip()
    for statement in INDEXES.split(";")
    if (found := re.match(r"\s*CREATE (UNIQUE )?INDEX (\w+) ON ", statement))
}

#: the names of the secondary indexes, in the order they are created
INDEX_NAMES: tuple[str, ...] = tuple(_STATEMENTS)


def missing_indexes(found: Iterable[str]) -> list[str]:
    """The statements (``CREATE ... INDEX IF NOT EXISTS``) of the secondary indexes whose names
    are not among ``found``, the index names the store's catalog lists, in creation order."""
    have = set(found)
    return [
        re.sub(r"INDEX (\w+) ON ", r"INDEX IF NOT EXISTS \1 ON ", statement, count=1)
        for name, statement in _STATEMENTS.items()
        if name not in have
    ]
