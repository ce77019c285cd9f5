"""The secondary indexes of both stores' schemas (the same SQL in SQLite and PostgreSQL)."""

__all__ = ["INDEXES"]

#: the secondary indexes (each leads with the tenant), created with the tables
INDEXES = """
CREATE INDEX episodic_patient ON episodic(tenant, patient_id, study_id);
CREATE INDEX visual_patient ON visual(tenant, patient_id);
CREATE UNIQUE INDEX semantic_one_active ON semantic(tenant, patient_id, category) WHERE state = 'active';
CREATE INDEX semantic_key ON semantic(tenant, patient_id, category, version);
CREATE INDEX stm_state ON stm(tenant, state, expires_at);
CREATE INDEX stm_patient ON stm(tenant, patient_id, state);
CREATE UNIQUE INDEX claims_one_active ON claims(tenant, patient_id, key) WHERE state = 'active';
CREATE INDEX claims_decay ON claims(tenant, decay_at);
CREATE INDEX consents_patient ON consents(tenant, patient_id);
CREATE INDEX episodic_decay ON episodic(tenant, decay_at);
CREATE INDEX visual_decay ON visual(tenant, decay_at);
"""
