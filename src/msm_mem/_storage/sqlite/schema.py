"""The embedded store's tables (SQLite types); the same columns, in the same order, as PostgreSQL's."""

from __future__ import annotations

__all__ = ["DB_NAME", "FORMAT", "SCHEMA", "SCHEMA_VERSION"]

DB_NAME = "msm-mem.sqlite"
FORMAT = "msm-mem-store"
#: "1": before row digests (and, in stores of older versions, clear visual tags); such a store
#: is upgraded by ``msm-mem store upgrade``. "2": row digests in meta (``rows:<table>``).
SCHEMA_VERSION = "2"

_MEMORY = """
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE episodic(
  pos INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, patient_id TEXT NOT NULL,
  study_id TEXT NOT NULL, timestamp REAL NOT NULL, z BLOB NOT NULL, question TEXT NOT NULL,
  answer TEXT NOT NULL, decision TEXT NOT NULL, media_path TEXT NOT NULL,
  media_description TEXT NOT NULL, state TEXT NOT NULL, confidence REAL NOT NULL,
  evidence_tier TEXT NOT NULL, source TEXT NOT NULL, created_at REAL NOT NULL, decay_at REAL,
  supersedes TEXT);
CREATE INDEX episodic_patient ON episodic(patient_id, study_id);
CREATE TABLE visual(
  pos INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, patient_id TEXT NOT NULL,
  timestamp REAL NOT NULL, z BLOB NOT NULL, media_path TEXT NOT NULL, visual_tag TEXT NOT NULL,
  source_episode_id TEXT NOT NULL, state TEXT NOT NULL, confidence REAL NOT NULL,
  evidence_tier TEXT NOT NULL, source TEXT NOT NULL, created_at REAL NOT NULL, decay_at REAL,
  supersedes TEXT);
CREATE INDEX visual_patient ON visual(patient_id);
CREATE TABLE semantic(
  id TEXT PRIMARY KEY, patient_id TEXT NOT NULL, category TEXT NOT NULL,
  version INTEGER NOT NULL, state TEXT NOT NULL, created_at REAL NOT NULL, supersedes TEXT,
  evidence_tier TEXT NOT NULL, impressions TEXT NOT NULL);
CREATE UNIQUE INDEX semantic_one_active ON semantic(patient_id, category) WHERE state = 'active';
CREATE INDEX semantic_key ON semantic(patient_id, category, version);
"""

_TIERS = """
CREATE TABLE stm(
  id TEXT PRIMARY KEY, patient_id TEXT NOT NULL, kind TEXT NOT NULL, payload TEXT NOT NULL, z BLOB,
  created_at REAL NOT NULL, expires_at REAL NOT NULL, state TEXT NOT NULL, actor TEXT NOT NULL);
CREATE INDEX stm_state ON stm(state, expires_at);
CREATE INDEX stm_patient ON stm(patient_id, state);
CREATE TABLE claims(
  id TEXT PRIMARY KEY, patient_id TEXT NOT NULL, key TEXT NOT NULL, content TEXT NOT NULL,
  source TEXT NOT NULL, confidence REAL NOT NULL, evidence_tier TEXT NOT NULL, state TEXT NOT NULL,
  supersedes TEXT, created_at REAL NOT NULL, decay_at REAL);
CREATE UNIQUE INDEX claims_one_active ON claims(patient_id, key) WHERE state = 'active';
CREATE INDEX claims_decay ON claims(decay_at);
CREATE TABLE entities(
  id TEXT PRIMARY KEY, patient_id TEXT NOT NULL, type TEXT NOT NULL, name TEXT NOT NULL,
  created_at REAL NOT NULL, state TEXT NOT NULL);
CREATE TABLE relationships(
  id TEXT PRIMARY KEY, patient_id TEXT NOT NULL, source_id TEXT NOT NULL, target_id TEXT NOT NULL,
  type TEXT NOT NULL, created_at REAL NOT NULL, state TEXT NOT NULL);
CREATE TABLE consents(
  id TEXT PRIMARY KEY, patient_id TEXT NOT NULL, grantee TEXT NOT NULL, purpose TEXT NOT NULL,
  decision TEXT NOT NULL, data_classes TEXT NOT NULL, start REAL NOT NULL, "end" REAL,
  created_at REAL NOT NULL, revoked_at REAL);
CREATE INDEX consents_patient ON consents(patient_id);
CREATE TABLE audit(seq INTEGER PRIMARY KEY, payload BLOB NOT NULL, event_hash TEXT NOT NULL);
CREATE TABLE keys(
  key_id TEXT PRIMARY KEY, patient_ref TEXT NOT NULL UNIQUE, kek_id TEXT NOT NULL,
  wrapped BLOB NOT NULL, created_at REAL NOT NULL, shredded INTEGER NOT NULL);
CREATE TABLE pseudonyms(key_id TEXT PRIMARY KEY, pseudonym TEXT NOT NULL UNIQUE, token TEXT NOT NULL);
CREATE INDEX episodic_decay ON episodic(decay_at);
CREATE INDEX visual_decay ON visual(decay_at);
"""

#: every table of a store, created at once
SCHEMA = _MEMORY + _TIERS
