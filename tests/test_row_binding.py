"""The governed rows are bound to the signed chain: every commit signs a keyed digest of every
governed table's rows, and full verification recomputes it, so a row changed, rolled back,
resurrected, deleted or forged in the database (with SQL, around msm-mem) is caught and its
table named, on either store; honest writes through the API keep verifying; the digest's
formats are pinned by fixed vectors."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from msm_mem import ManifestRow, MsmMem, StoreError
from msm_mem._governance.audit.checkpoint import Checkpoint
from msm_mem._governance.audit.checkpoint_signer import CheckpointSigner
from msm_mem._governance.audit.event import GENESIS
from msm_mem._records import State
from msm_mem._storage.row_digest import _VERSION, COLUMNS, RowDigest, _field, row_bytes
from msm_mem._tier_records import ConsentRecord
from msm_mem.testing import FixedBackbone, FixedClock
from tests.conftest import MemFactory
from tests.helpers import ADMIN, AGENT, AUDITOR, CRITIC, SYSTEM, png, raw_sql

pytestmark = pytest.mark.cluster

T0 = 1_700_000_000.0
PATIENT = "P-BIND-1"
QUESTION = "Is the right lower lobe opacity changing?"


def _store(tmp_path: Path, new_mem: MemFactory) -> MsmMem:
    """Three answered turns written: semantic versions 1..3 (two superseded), agent-tier claims,
    STM items (consolidated, their content gone); a fourth turn held (an STM item with its
    answer); the default consents; it verifies."""
    mem = new_mem(
        "s", clock=FixedClock(T0), backbone=FixedBackbone("Stable opacity in the right lower lobe", "follow up")
    )
    for seed in (1, 2, 3):
        mem.ask(AGENT, PATIENT, png(tmp_path, seed), QUESTION, study_id=f"ACC-{seed}")
    held = mem.ask(AGENT, PATIENT, png(tmp_path, 3), QUESTION, study_id="ACC-3")  # the same image
    assert held.gate is not None and not held.gate.written
    assert mem.verify_audit(AUDITOR).ok
    return mem


def _caught(mem: MsmMem, table: str, words: str) -> None:
    """Full verification fails naming ``table`` and ``words``; the hash walk alone still passes
    (the chain itself was not touched)."""
    result = mem.verify_audit(AUDITOR)
    assert not result.ok and result.first_bad_seq is None, result
    assert f"{table}: " in result.reason and words in result.reason, result.reason
    assert "names the table, not the row" in result.reason
    assert mem.verify_audit(AUDITOR, full=False).ok


def _one(mem: MsmMem, sql: str, params: tuple[Any, ...] = ()) -> Any:
    rows = raw_sql(mem, sql, params)
    assert rows, sql
    return rows[0][0]


def test_a_semantic_state_rolled_back_is_caught(tmp_path: Path, new_mem: MemFactory) -> None:
    """The newest semantic version deleted and the one before made active again."""
    mem = _store(tmp_path, new_mem)
    newest = _one(mem, "SELECT id FROM semantic WHERE state = 'active'")
    older = _one(mem, "SELECT id FROM semantic WHERE version = 2")
    raw_sql(mem, "DELETE FROM semantic WHERE id = ?", (newest,))
    raw_sql(mem, "UPDATE semantic SET state = 'active' WHERE id = ?", (older,))
    _caught(mem, "semantic", "3 rows signed, 2 stored: rows deleted")


def test_a_superseded_version_resurrected_is_caught(tmp_path: Path, new_mem: MemFactory) -> None:
    """The active version marked superseded and the first one active: as many rows, one changed."""
    mem = _store(tmp_path, new_mem)
    raw_sql(mem, "UPDATE semantic SET state = 'superseded' WHERE state = 'active'")
    raw_sql(mem, "UPDATE semantic SET state = 'active' WHERE version = 1")
    _caught(mem, "semantic", "3 rows signed and stored: a row changed")


def test_a_claim_promoted_to_ground_truth_is_caught(tmp_path: Path, new_mem: MemFactory) -> None:
    """An agent's claim raised to the ground-truth tier in the database."""
    mem = _store(tmp_path, new_mem)
    claim = _one(mem, "SELECT id FROM claims WHERE evidence_tier = 'agent'")
    raw_sql(mem, "UPDATE claims SET evidence_tier = 'ground_truth' WHERE id = ?", (claim,))
    _caught(mem, "claims", "a row changed")


def test_a_changed_confidence_is_caught(tmp_path: Path, new_mem: MemFactory) -> None:
    """A claim's confidence raised from 0.6 to 0.99, every other table left as signed."""
    mem = _store(tmp_path, new_mem)
    raw_sql(mem, "UPDATE claims SET confidence = 0.99 WHERE confidence < 0.9")
    _caught(mem, "claims", "a row changed")
    assert "semantic: " not in mem.verify_audit(AUDITOR).reason


def test_a_deleted_row_is_caught(tmp_path: Path, new_mem: MemFactory) -> None:
    """A deny consent (or any consent) deleted: the consents table has a row fewer."""
    mem = _store(tmp_path, new_mem)
    count = int(_one(mem, "SELECT count(*) FROM consents"))
    raw_sql(mem, "DELETE FROM consents WHERE id = (SELECT min(id) FROM consents)")
    _caught(mem, "consents", f"{count} rows signed, {count - 1} stored: rows deleted")


def test_a_forged_row_is_caught(tmp_path: Path, new_mem: MemFactory) -> None:
    """A permit consent inserted by SQL (a copy of a real one under a new id)."""
    mem = _store(tmp_path, new_mem)
    raw_sql(
        mem,
        "INSERT INTO consents SELECT 'C-forged', patient_id, grantee, purpose, 'permit', data_classes, start,"
        ' "end", created_at, NULL, tenant FROM consents WHERE id = (SELECT min(id) FROM consents)',
    )
    _caught(mem, "consents", "rows inserted")


def test_a_stale_ciphertext_of_the_same_row_is_caught(tmp_path: Path, new_mem: MemFactory) -> None:
    """An STM item's content replaced by another valid token of the same field (AES-GCM accepts
    it: same record, field and patient), here the one stored before an update."""
    mem = _store(tmp_path, new_mem)
    item = _one(mem, "SELECT id FROM stm WHERE payload <> '' ORDER BY created_at LIMIT 1")  # the held one
    old_payload = _one(mem, "SELECT payload FROM stm WHERE id = ?", (item,))
    raw_sql(mem, "UPDATE stm SET payload = '' WHERE id = ?", (item,))
    _caught(mem, "stm", "a row changed")
    raw_sql(mem, "UPDATE stm SET payload = ? WHERE id = ?", (old_payload, item))
    assert mem.verify_audit(AUDITOR).ok  # put back exactly as signed


def test_edited_running_sums_are_caught(tmp_path: Path, new_mem: MemFactory) -> None:
    """Only the stored sums in meta edited (rows untouched): named as such."""
    mem = _store(tmp_path, new_mem)
    # rows:claims, or rows:<lane>:claims in a store of several lanes
    claims = "substr(key, 1, 5) = 'rows:' AND substr(key, length(key) - 6) = ':claims'"
    raw_sql(mem, f"UPDATE meta SET value = ? WHERE {claims}", ("3 " + "0" * 64,))
    result = mem.verify_audit(AUDITOR)
    assert not result.ok and "stored row sums of ['claims'] were edited" in result.reason


def test_honest_writes_keep_verifying(tmp_path: Path, new_mem: MemFactory) -> None:
    """Every kind of governed write through the API (ingest, asks, observe and consolidate, a
    critic's correction, consent revocation, maintenance with decay, key rotation, shredding)
    keeps the rows as signed, also after reopening."""
    mem = _store(tmp_path, new_mem)
    images = [str(png(tmp_path, 20 + i)) for i in (1, 2)]
    rows = [
        ManifestRow("P-BIND-3", f"S{i}", T0 - i, image, QUESTION, "effusion", view="PA")
        for i, image in enumerate(images)
    ]
    mem.ingest(SYSTEM, rows)
    mem.feedback(CRITIC, PATIENT, "ACC-3", accept=False, correction="Right lower lobe pneumonia, improving.")
    assert mem.verify_audit(AUDITOR).ok
    item = mem.observe(AGENT, PATIENT, png(tmp_path, 7), QUESTION)
    mem.consolidate(AGENT, PATIENT, item.item_id, "Right lower lobe consolidation with effusion, new since prior.")
    assert mem.verify_audit(AUDITOR).ok
    extra = ConsentRecord("C-bind-extra", PATIENT, "role:agent", "research", "permit", ("episodic",), T0)
    mem.grant(ADMIN, [extra])
    mem.revoke(ADMIN, extra.consent_id)
    # everything expires, ages and decays (past the ten-year retention after the last write)
    mem.maintain(SYSTEM, at=T0 + 11 * 365 * 86400.0)
    assert mem.verify_audit(AUDITOR).ok
    mem.rotate_keys(ADMIN, "yearly rotation")
    mem.ask(AGENT, "P-BIND-2", png(tmp_path, 8), QUESTION, study_id="ACC-9")
    mem.shred(ADMIN, "P-BIND-2", "erasure request")
    result = mem.verify_audit(AUDITOR)
    assert result.ok, result
    directory = mem.directory
    mem.close()
    with MsmMem.open(directory) as again:
        assert again.verify_audit(AUDITOR).ok


def test_the_digest_covers_every_column_of_every_governed_table(new_mem: MemFactory, backend: str) -> None:
    """The digest's column lists are the stores' own tables, column for column (a new column
    fails this test until the digest covers it); only vectors, PostgreSQL's ``ord`` and the
    ``tenant`` column are left out (each tenant's sums are its own, so a row moved to another
    tenant changes both tenants' sums)."""
    mem = new_mem("s")
    for table, columns in COLUMNS.items():
        if backend == "sqlite":
            query = "SELECT name FROM pragma_table_info(?) ORDER BY cid"
        else:
            query = (
                "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema()"
                " AND table_name = ? ORDER BY ordinal_position"
            )
        stored = [str(name) for (name,) in raw_sql(mem, query, (table,)) if name not in ("ord", "tenant")]
        assert stored == [name for name, _ in columns], table
        assert {name for name, kind in columns if kind == "z"} <= {"z"}


# fixed vectors -------------------------------------------------------------------------------

SEED = bytes(range(32))
ROW = ("C-1", "P-1", "impression", "enc1:K-1:AAAA", "enc1:K-1:BBBB", 0.6, "agent", "active", None, T0, None)
ROW_BYTES_SHA256 = "948c592f191f03072594107d5365580b1cefd257abe4e37d0791945d39dcf2aa"
ROW_TERM = "e202f335a1070fa4e8998c4557065d89a4e769640e8eaa8f8ab44e9a068ec264"
ROW_KEY_HEX = "76cd66b83c6064b09d09c6fb142c7d86e46398c8ecd41253885240606e6d1428"
CHECKPOINT_LINE = (
    b'{"base_hash":"' + b"0" * 64 + b'","base_size":0,"head_hash":"' + b"ab" * 32 + b'","origin":"msm-mem",'
    b'"rows":{"claims":{"count":1,"digest":"'
    + ROW_TERM.encode()
    + b'"},"consents":{"count":0,"digest":"'
    + b"0" * 64
    + b'"}},"signature":"16dff5908a5f0c9e44f4162144503c31cf661f59633663570a9242182b24ed8d378d14aab32b46a50c8b5c14'
    b'bdfc254ca5e9bdcae190bb0c83573e7fb020580e","size":2,"time":1700000000.5}'
)


def test_a_known_row_and_its_term() -> None:
    """The bytes of a known claims row and its HMAC term under a known key are pinned; a row
    differing in one governed column has another term."""
    assert [name for name, _ in COLUMNS["claims"]][5:7] == ["confidence", "evidence_tier"]
    data = row_bytes("claims", ROW)
    assert hashlib.sha256(data).hexdigest() == ROW_BYTES_SHA256
    assert hmac.digest(SEED, data, hashlib.sha256).hex() == ROW_TERM
    digest = RowDigest(SEED)
    digest.add("claims", [ROW])
    assert digest.result()["claims"].digest == ROW_TERM and digest.result()["claims"].count == 1
    promoted = RowDigest(SEED)
    promoted.add("claims", [(*ROW[:6], "ground_truth", *ROW[7:])])
    assert promoted.result()["claims"].digest != ROW_TERM
    digest.remove("claims", [ROW])
    assert digest.result()["claims"].digest == "0" * 64


@pytest.mark.parametrize("table", sorted(COLUMNS))
def test_row_bytes_are_the_fields_as_defined_for_every_type(table: str) -> None:
    """The per-kind encoders give exactly the bytes of the field definition, for the exact
    types they take first and for everything else (subclasses, bools, wrong types, None); the
    sums of several rows are the sums of their terms."""
    kinds = [kind for _, kind in COLUMNS[table] if kind != "z"]
    values: list[Any] = [None, "", "Edema é", State.ACTIVE, 0.5, -0.0, 1e300, 7, True, 2**62, b"x", ["a"]]
    rows = [[values[(i * 7 + j * 5) % len(values)] for j in range(len(kinds))] for i in range(len(values) * 2)]
    for row in rows:
        expected = _VERSION + _field("t", table) + b"".join(_field(k, v) for k, v in zip(kinds, row, strict=True))
        assert row_bytes(table, row) == expected
    together, apart = RowDigest(SEED), RowDigest(SEED)
    together.add(table, rows)
    for row in rows:
        apart.add(table, [row])
    together.remove(table, rows[:3])
    apart.remove(table, [])
    for row in rows[:3]:
        apart.remove(table, [row])
    assert together.result() == apart.result() and together.changed == apart.changed == {table}
    with pytest.raises(StoreError, match="digested columns"):
        row_bytes(table, rows[0][:-1])


def test_a_known_row_key_and_checkpoint_with_rows() -> None:
    """The row key a known signing key derives for a known tenant, and the checkpoint line that
    signs a head with row digests, are pinned; the line parses and verifies back."""
    signer = CheckpointSigner(Ed25519PrivateKey.from_private_bytes(SEED))
    assert signer.row_key("T-00112233445566778899aabbccddeeff").hex() == ROW_KEY_HEX
    rows = (("claims", 1, ROW_TERM), ("consents", 0, "0" * 64))
    cp = signer.sign_head("msm-mem", 2, "ab" * 32, T0 + 0.5, (0, GENESIS), rows)
    assert cp.to_json() == CHECKPOINT_LINE
    parsed = Checkpoint.from_json(CHECKPOINT_LINE)
    assert parsed == cp and parsed.verify(signer.public_key_bytes)
    changed = CHECKPOINT_LINE.replace(b'"count":1', b'"count":2')
    assert not Checkpoint.from_json(changed).verify(signer.public_key_bytes)


@pytest.mark.parametrize(
    "rows",
    [
        {"claims": {"count": -1, "digest": "0" * 64}},
        {"claims": {"count": 1, "digest": "xyz"}},
        {"claims": {"count": 1}},
        {"Claims!": {"count": 1, "digest": "0" * 64}},
        [],
    ],
)
def test_malformed_row_digests_in_a_checkpoint_are_refused(rows: object) -> None:
    """A checkpoint line with bad row digests is an error naming them, never accepted."""
    import json

    line = json.loads(CHECKPOINT_LINE)
    line["rows"] = rows
    with pytest.raises(ValueError, match="rows"):
        Checkpoint.from_json(json.dumps(line, sort_keys=True, separators=(",", ":")))
