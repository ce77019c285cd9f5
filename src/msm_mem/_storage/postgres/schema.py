"""The server store's tables (PostgreSQL types, pgvector columns); the SQLite store's columns in
the same order, plus a trailing ``ord`` identity column on ``semantic`` and ``claims`` standing
in for SQLite's ``rowid`` (insertion order)."""

from __future__ import annotations

import re

__all__ = ["FORMAT", "HNSW", "LIVE", "SCHEMA", "SCHEMA_VERSION", "TABLES"]

FORMAT = "msm-mem-store"
#: "1": before row digests (and, in stores of older versions, clear visual tags); such a store
#: is upgraded by ``msm-mem store upgrade``. "2": row digests in meta (``rows:<table>``).
SCHEMA_VERSION = "2"
#: rows that searches return
LIVE = "state IN ('active', 'anonymized')"

_MEMORY = """
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE episodic(
  pos BIGINT PRIMARY KEY, id TEXT COLLATE "C" NOT NULL UNIQUE, patient_id TEXT COLLATE "C" NOT NULL,
  study_id TEXT COLLATE "C" NOT NULL, timestamp FLOAT8 NOT NULL, z vector({dim}) NOT NULL,
  question TEXT NOT NULL, answer TEXT NOT NULL, decision TEXT NOT NULL, media_path TEXT NOT NULL,
  media_description TEXT NOT NULL, state TEXT NOT NULL, confidence FLOAT8 NOT NULL,
  evidence_tier TEXT NOT NULL, source TEXT NOT NULL, created_at FLOAT8 NOT NULL, decay_at FLOAT8,
  supersedes TEXT);
CREATE INDEX episodic_patient ON episodic(patient_id, study_id);
CREATE TABLE visual(
  pos BIGINT PRIMARY KEY, id TEXT COLLATE "C" NOT NULL UNIQUE, patient_id TEXT COLLATE "C" NOT NULL,
  timestamp FLOAT8 NOT NULL, z vector({dim}) NOT NULL, media_path TEXT NOT NULL,
  visual_tag TEXT NOT NULL, source_episode_id TEXT NOT NULL, state TEXT NOT NULL,
  confidence FLOAT8 NOT NULL, evidence_tier TEXT NOT NULL, source TEXT NOT NULL,
  created_at FLOAT8 NOT NULL, decay_at FLOAT8, supersedes TEXT);
CREATE INDEX visual_patient ON visual(patient_id);
CREATE TABLE semantic(
  id TEXT COLLATE "C" PRIMARY KEY, patient_id TEXT COLLATE "C" NOT NULL,
  category TEXT COLLATE "C" NOT NULL, version BIGINT NOT NULL, state TEXT NOT NULL,
  created_at FLOAT8 NOT NULL, supersedes TEXT, evidence_tier TEXT NOT NULL, impressions TEXT NOT NULL,
  ord BIGINT GENERATED ALWAYS AS IDENTITY);
CREATE UNIQUE INDEX semantic_one_active ON semantic(patient_id, category) WHERE state = 'active';
CREATE INDEX semantic_key ON semantic(patient_id, category, version);
"""

_TIERS = """
CREATE TABLE stm(
  id TEXT COLLATE "C" PRIMARY KEY, patient_id TEXT COLLATE "C" NOT NULL, kind TEXT NOT NULL,
  payload TEXT NOT NULL, z BYTEA, created_at FLOAT8 NOT NULL, expires_at FLOAT8 NOT NULL,
  state TEXT NOT NULL, actor TEXT NOT NULL);
CREATE INDEX stm_state ON stm(state, expires_at);
CREATE INDEX stm_patient ON stm(patient_id, state);
CREATE TABLE claims(
  id TEXT COLLATE "C" PRIMARY KEY, patient_id TEXT COLLATE "C" NOT NULL, key TEXT COLLATE "C" NOT NULL,
  content TEXT NOT NULL, source TEXT NOT NULL, confidence FLOAT8 NOT NULL,
  evidence_tier TEXT NOT NULL, state TEXT NOT NULL, supersedes TEXT, created_at FLOAT8 NOT NULL,
  decay_at FLOAT8, ord BIGINT GENERATED ALWAYS AS IDENTITY);
CREATE UNIQUE INDEX claims_one_active ON claims(patient_id, key) WHERE state = 'active';
CREATE INDEX claims_decay ON claims(decay_at);
CREATE TABLE entities(
  id TEXT PRIMARY KEY, patient_id TEXT NOT NULL, type TEXT NOT NULL, name TEXT NOT NULL,
  created_at FLOAT8 NOT NULL, state TEXT NOT NULL);
CREATE TABLE relationships(
  id TEXT PRIMARY KEY, patient_id TEXT NOT NULL, source_id TEXT NOT NULL, target_id TEXT NOT NULL,
  type TEXT NOT NULL, created_at FLOAT8 NOT NULL, state TEXT NOT NULL);
CREATE TABLE consents(
  id TEXT COLLATE "C" PRIMARY KEY, patient_id TEXT NOT NULL, grantee TEXT NOT NULL,
  purpose TEXT NOT NULL, decision TEXT NOT NULL, data_classes TEXT NOT NULL, start FLOAT8 NOT NULL,
  "end" FLOAT8, created_at FLOAT8 NOT NULL, revoked_at FLOAT8);
CREATE INDEX consents_patient ON consents(patient_id);
CREATE TABLE audit(seq BIGINT PRIMARY KEY, payload BYTEA NOT NULL, event_hash TEXT NOT NULL);
CREATE TABLE keys(
  key_id TEXT PRIMARY KEY, patient_ref TEXT NOT NULL UNIQUE, kek_id TEXT NOT NULL,
  wrapped BYTEA NOT NULL, created_at FLOAT8 NOT NULL, shredded BOOLEAN NOT NULL);
CREATE TABLE pseudonyms(key_id TEXT PRIMARY KEY, pseudonym TEXT NOT NULL UNIQUE, token TEXT NOT NULL);
CREATE INDEX episodic_decay ON episodic(decay_at);
CREATE INDEX visual_decay ON visual(decay_at);
"""

#: every table of a store, created at once (``{dim}``: the vector dimension)
SCHEMA = _MEMORY + _TIERS
#: the names of the tables of a store
TABLES = frozenset(re.findall(r"CREATE TABLE (\w+)\(", SCHEMA))
#: the partial HNSW index of one vector kind (live rows only), for approximate population search
HNSW = "CREATE INDEX IF NOT EXISTS {kind}_hnsw ON {kind} USING hnsw (z vector_ip_ops) WHERE " + LIVE + ";"
