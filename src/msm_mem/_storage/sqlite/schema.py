"""The embedded store's tables (SQLite types); the same columns, in the same order, as PostgreSQL's,
``tenant`` last in each, leading every primary and unique key (one tenant per store directory)."""

from __future__ import annotations

import re

from ..indexes import INDEXES

__all__ = ["DB_NAME", "FORMAT", "INDEXES", "SCHEMA", "SCHEMA_VERSION", "TABLES"]

DB_NAME = "msm-mem.sqlite"
FORMAT = "msm-mem-store"
#: "1": before row digests (and, in stores of older versions, clear visual tags). "2": row
#: digests in meta (``rows:<table>``). "3": a ``tenant`` column leading every key. Older stores
#: are upgraded by ``msm-mem store upgrade``.
SCHEMA_VERSION = "3"

_MEMORY = """
CREATE TABLE meta(key TEXT NOT NULL, value TEXT NOT NULL, tenant TEXT NOT NULL, PRIMARY KEY (tenant, key));
CREATE TABLE episodic(
  pos INTEGER NOT NULL, id TEXT NOT NULL, patient_id TEXT NOT NULL,
  study_id TEXT NOT NULL, timestamp REAL NOT NULL, z BLOB NOT NULL, question TEXT NOT NULL,
  answer TEXT NOT NULL, decision TEXT NOT NULL, media_path TEXT NOT NULL,
  media_description TEXT NOT NULL, state TEXT NOT NULL, confidence REAL NOT NULL,
  evidence_tier TEXT NOT NULL, source TEXT NOT NULL, created_at REAL NOT NULL, decay_at REAL,
  supersedes TEXT, tenant TEXT NOT NULL, PRIMARY KEY (tenant, pos), UNIQUE (tenant, id));
CREATE TABLE visual(
  pos INTEGER NOT NULL, id TEXT NOT NULL, patient_id TEXT NOT NULL,
  timestamp REAL NOT NULL, z BLOB NOT NULL, media_path TEXT NOT NULL, visual_tag TEXT NOT NULL,
  source_episode_id TEXT NOT NULL, state TEXT NOT NULL, confidence REAL NOT NULL,
  evidence_tier TEXT NOT NULL, source TEXT NOT NULL, created_at REAL NOT NULL, decay_at REAL,
  supersedes TEXT, tenant TEXT NOT NULL, PRIMARY KEY (tenant, pos), UNIQUE (tenant, id));
CREATE TABLE semantic(
  id TEXT NOT NULL, patient_id TEXT NOT NULL, category TEXT NOT NULL,
  version INTEGER NOT NULL, state TEXT NOT NULL, created_at REAL NOT NULL, supersedes TEXT,
  evidence_tier TEXT NOT NULL, impressions TEXT NOT NULL, tenant TEXT NOT NULL, PRIMARY KEY (tenant, id));
"""

_TIERS = """
CREATE TABLE stm(
  id TEXT NOT NULL, patient_id TEXT NOT NULL, kind TEXT NOT NULL, payload TEXT NOT NULL, z BLOB,
  created_at REAL NOT NULL, expires_at REAL NOT NULL, state TEXT NOT NULL, actor TEXT NOT NULL,
  tenant TEXT NOT NULL, PRIMARY KEY (tenant, id));
CREATE TABLE claims(
  id TEXT NOT NULL, patient_id TEXT NOT NULL, key TEXT NOT NULL, content TEXT NOT NULL,
  source TEXT NOT NULL, confidence REAL NOT NULL, evidence_tier TEXT NOT NULL, state TEXT NOT NULL,
  supersedes TEXT, created_at REAL NOT NULL, decay_at REAL, tenant TEXT NOT NULL, PRIMARY KEY (tenant, id));
CREATE TABLE entities(
  id TEXT NOT NULL, patient_id TEXT NOT NULL, type TEXT NOT NULL, name TEXT NOT NULL,
  created_at REAL NOT NULL, state TEXT NOT NULL, tenant TEXT NOT NULL, PRIMARY KEY (tenant, id));
CREATE TABLE relationships(
  id TEXT NOT NULL, patient_id TEXT NOT NULL, source_id TEXT NOT NULL, target_id TEXT NOT NULL,
  type TEXT NOT NULL, created_at REAL NOT NULL, state TEXT NOT NULL, tenant TEXT NOT NULL,
  PRIMARY KEY (tenant, id));
CREATE TABLE consents(
  id TEXT NOT NULL, patient_id TEXT NOT NULL, grantee TEXT NOT NULL, purpose TEXT NOT NULL,
  decision TEXT NOT NULL, data_classes TEXT NOT NULL, start REAL NOT NULL, "end" REAL,
  created_at REAL NOT NULL, revoked_at REAL, tenant TEXT NOT NULL, PRIMARY KEY (tenant, id));
CREATE TABLE audit(
  seq INTEGER NOT NULL, payload BLOB NOT NULL, event_hash TEXT NOT NULL, tenant TEXT NOT NULL,
  PRIMARY KEY (tenant, seq));
CREATE TABLE keys(
  key_id TEXT NOT NULL, patient_ref TEXT NOT NULL, kek_id TEXT NOT NULL, wrapped BLOB NOT NULL,
  created_at REAL NOT NULL, shredded INTEGER NOT NULL, tenant TEXT NOT NULL,
  PRIMARY KEY (tenant, key_id), UNIQUE (tenant, patient_ref));
CREATE TABLE pseudonyms(
  key_id TEXT NOT NULL, pseudonym TEXT NOT NULL, token TEXT NOT NULL, tenant TEXT NOT NULL,
  PRIMARY KEY (tenant, key_id), UNIQUE (tenant, pseudonym));
"""


#: every table of a store, created at once
SCHEMA = _MEMORY + _TIERS + INDEXES
#: the names of the tables of a store, in the order they are created
TABLES: tuple[str, ...] = tuple(re.findall(r"CREATE TABLE (\w+)\(", SCHEMA))
