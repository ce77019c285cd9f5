"""The server store's tables (PostgreSQL types, pgvector columns); the SQLite store's columns in
the same order, plus a trailing ``ord`` identity column on ``semantic`` and ``claims`` standing
in for SQLite's ``rowid`` (insertion order).

Every table ends with ``tenant``: several tenants share the tables of one schema as separate
stores, every primary and unique key leads with it, there are no foreign keys, and every
statement names one tenant. On a Citus cluster a patient's tables are distributed by the
patient and the tenant's own by ``tenant`` (:data:`DISTRIBUTION`, :func:`citus_ddl`;
docs/deploy.md, Citus).
"""

from __future__ import annotations

import re

from ..indexes import INDEXES

__all__ = [
    "DISTRIBUTION",
    "FORMAT",
    "HNSW",
    "INDEXES",
    "LIVE",
    "SCHEMA",
    "SCHEMA_VERSION",
    "TABLES",
    "citus_ddl",
]

FORMAT = "msm-mem-store"
#: "1": before row digests (and, in stores of older versions, clear visual tags). "2": row
#: digests in meta (``rows:<table>``). "3": a ``tenant`` column leading every key. Older stores
#: are upgraded by ``msm-mem store upgrade``.
SCHEMA_VERSION = "3"
#: rows that searches return
LIVE = "state IN ('active', 'anonymized')"

_MEMORY = """
CREATE TABLE meta(key TEXT NOT NULL, value TEXT NOT NULL, tenant TEXT COLLATE "C" NOT NULL, PRIMARY KEY (tenant, key));
CREATE TABLE episodic(
  pos BIGINT NOT NULL, id TEXT COLLATE "C" NOT NULL, patient_id TEXT COLLATE "C" NOT NULL,
  study_id TEXT COLLATE "C" NOT NULL, timestamp FLOAT8 NOT NULL, z vector({dim}) NOT NULL,
  question TEXT NOT NULL, answer TEXT NOT NULL, decision TEXT NOT NULL, media_path TEXT NOT NULL,
  media_description TEXT NOT NULL, state TEXT NOT NULL, confidence FLOAT8 NOT NULL,
  evidence_tier TEXT NOT NULL, source TEXT NOT NULL, created_at FLOAT8 NOT NULL, decay_at FLOAT8,
  supersedes TEXT, tenant TEXT COLLATE "C" NOT NULL, PRIMARY KEY (tenant, pos), UNIQUE (tenant, id));
CREATE TABLE visual(
  pos BIGINT NOT NULL, id TEXT COLLATE "C" NOT NULL, patient_id TEXT COLLATE "C" NOT NULL,
  timestamp FLOAT8 NOT NULL, z vector({dim}) NOT NULL, media_path TEXT NOT NULL,
  visual_tag TEXT NOT NULL, source_episode_id TEXT NOT NULL, state TEXT NOT NULL,
  confidence FLOAT8 NOT NULL, evidence_tier TEXT NOT NULL, source TEXT NOT NULL,
  created_at FLOAT8 NOT NULL, decay_at FLOAT8, supersedes TEXT, tenant TEXT COLLATE "C" NOT NULL,
  PRIMARY KEY (tenant, pos), UNIQUE (tenant, id));
CREATE TABLE semantic(
  id TEXT COLLATE "C" NOT NULL, patient_id TEXT COLLATE "C" NOT NULL,
  category TEXT COLLATE "C" NOT NULL, version BIGINT NOT NULL, state TEXT NOT NULL,
  created_at FLOAT8 NOT NULL, supersedes TEXT, evidence_tier TEXT NOT NULL, impressions TEXT NOT NULL,
  ord BIGINT GENERATED ALWAYS AS IDENTITY, tenant TEXT COLLATE "C" NOT NULL, PRIMARY KEY (tenant, id));
"""

_TIERS = """
CREATE TABLE stm(
  id TEXT COLLATE "C" NOT NULL, patient_id TEXT COLLATE "C" NOT NULL, kind TEXT NOT NULL,
  payload TEXT NOT NULL, z BYTEA, created_at FLOAT8 NOT NULL, expires_at FLOAT8 NOT NULL,
  state TEXT NOT NULL, actor TEXT NOT NULL, tenant TEXT COLLATE "C" NOT NULL, PRIMARY KEY (tenant, id));
CREATE TABLE claims(
  id TEXT COLLATE "C" NOT NULL, patient_id TEXT COLLATE "C" NOT NULL, key TEXT COLLATE "C" NOT NULL,
  content TEXT NOT NULL, source TEXT NOT NULL, confidence FLOAT8 NOT NULL,
  evidence_tier TEXT NOT NULL, state TEXT NOT NULL, supersedes TEXT, created_at FLOAT8 NOT NULL,
  decay_at FLOAT8, ord BIGINT GENERATED ALWAYS AS IDENTITY, tenant TEXT COLLATE "C" NOT NULL,
  PRIMARY KEY (tenant, id));
CREATE TABLE entities(
  id TEXT NOT NULL, patient_id TEXT NOT NULL, type TEXT NOT NULL, name TEXT NOT NULL,
  created_at FLOAT8 NOT NULL, state TEXT NOT NULL, tenant TEXT COLLATE "C" NOT NULL, PRIMARY KEY (tenant, id));
CREATE TABLE relationships(
  id TEXT NOT NULL, patient_id TEXT NOT NULL, source_id TEXT NOT NULL, target_id TEXT NOT NULL,
  type TEXT NOT NULL, created_at FLOAT8 NOT NULL, state TEXT NOT NULL, tenant TEXT COLLATE "C" NOT NULL,
  PRIMARY KEY (tenant, id));
CREATE TABLE consents(
  id TEXT COLLATE "C" NOT NULL, patient_id TEXT NOT NULL, grantee TEXT NOT NULL,
  purpose TEXT NOT NULL, decision TEXT NOT NULL, data_classes TEXT NOT NULL, start FLOAT8 NOT NULL,
  "end" FLOAT8, created_at FLOAT8 NOT NULL, revoked_at FLOAT8, tenant TEXT COLLATE "C" NOT NULL,
  PRIMARY KEY (tenant, id));
CREATE TABLE audit(
  seq BIGINT NOT NULL, payload BYTEA NOT NULL, event_hash TEXT NOT NULL, tenant TEXT COLLATE "C" NOT NULL,
  PRIMARY KEY (tenant, seq));
CREATE TABLE keys(
  key_id TEXT NOT NULL, patient_ref TEXT NOT NULL, kek_id TEXT NOT NULL, wrapped BYTEA NOT NULL,
  created_at FLOAT8 NOT NULL, shredded BOOLEAN NOT NULL, tenant TEXT COLLATE "C" NOT NULL,
  PRIMARY KEY (tenant, key_id), UNIQUE (tenant, patient_ref));
CREATE TABLE pseudonyms(
  key_id TEXT NOT NULL, pseudonym TEXT NOT NULL, token TEXT NOT NULL, tenant TEXT COLLATE "C" NOT NULL,
  PRIMARY KEY (tenant, key_id), UNIQUE (tenant, pseudonym));
"""


#: every table of a store, created at once (``{dim}``: the vector dimension)
SCHEMA = _MEMORY + _TIERS + INDEXES
#: the names of the tables of a store, in the order they are created
TABLES: tuple[str, ...] = tuple(re.findall(r"CREATE TABLE (\w+)\(", SCHEMA))
#: the partial HNSW index of one vector kind (live rows only), for approximate population search
HNSW = "CREATE INDEX IF NOT EXISTS {kind}_hnsw ON {kind} USING hnsw (z vector_ip_ops) WHERE " + LIVE + ";"
#: the table every other one is colocated with on a Citus cluster
_ANCHOR = "meta"
#: Each table's distribution column on a Citus cluster. A patient's rows of every memory and
#: tier table, its data key and its consents are distributed by the patient (``patient_id``;
#: ``patient_ref`` of ``keys`` is the same id), so one hospital's patients spread over the
#: shards and each patient's rows are one shard's. The hospital's own rows (its ``meta``, whose
#: row its writers queue on, its audit chain and its pseudonym table) are distributed by
#: ``tenant``. All are colocated: the same value hashes to the same shard in every table.
DISTRIBUTION: dict[str, str] = {
    t: {"meta": "tenant", "audit": "tenant", "pseudonyms": "tenant", "keys": "patient_ref"}.get(t, "patient_id")
    for t in TABLES
}


def _keys_with(table: str, column: str) -> list[str]:
    """The statements that give ``column`` of ``table`` the ``"C"`` collation of the other
    distribution columns (Citus colocates only columns of one type and collation) and make
    every primary and unique key of ``table`` that lacks ``column`` (Citus requires the
    distribution column in each) end with it. A key still leads with the tenant and holds what
    it held; two rows of one tenant that differ only in the patient are never written (ids are
    random, positions are taken under the tenant's write lock)."""
    body = re.search(rf"CREATE TABLE {table}\((.*?)\);", SCHEMA, re.S)
    if body is None:
        raise ValueError(f"no table {table!r} in the schema")
    out = []
    if not re.search(rf'\b{column} TEXT COLLATE "C"', body.group(1)):  # colocated columns share a collation
        out.append(f'ALTER TABLE {table} ALTER COLUMN {column} TYPE TEXT COLLATE "C";')
    for kind, cols in re.findall(r"(PRIMARY KEY|UNIQUE) \(([^)]*)\)", body.group(1)):
        names = [c.strip() for c in cols.split(",")]
        if column in names:
            continue
        name = f"{table}_pkey" if kind == "PRIMARY KEY" else f"{table}_{'_'.join(names)}_key"
        out.append(f"ALTER TABLE {table} DROP CONSTRAINT {name}, ADD {kind} ({', '.join([*names, column])});")
    return out


def citus_ddl() -> str:
    """The statements that distribute every table of a store on a Citus cluster by its column
    of :data:`DISTRIBUTION`, all colocated with ``meta``, after making every key hold that
    column. ``PostgresStore.create`` runs them on a coordinator in the transaction that makes
    the tables (``citus.py``)."""
    lines = [line for t in TABLES for line in _keys_with(t, DISTRIBUTION[t])]
    lines.append(f"SELECT create_distributed_table('{_ANCHOR}', '{DISTRIBUTION[_ANCHOR]}');")
    lines += [
        f"SELECT create_distributed_table('{t}', '{DISTRIBUTION[t]}', colocate_with => '{_ANCHOR}');"
        for t in TABLES
        if t != _ANCHOR
    ]
    return "\n".join(lines) + "\n"
