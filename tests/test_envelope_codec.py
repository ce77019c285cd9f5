"""Tests of the envelope codec at the repository boundary (msm_mem._governance.envelope_codec): PHI at rest
is ciphertext bound to its place, KEK rotation keeps data readable, shredding unlinks a patient."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from msm_mem import Principal
from msm_mem._api.mem import MsmMem
from msm_mem._errors import AccessDenied, DecryptionError
from msm_mem._governance.crypto import is_token
from msm_mem._governance.envelope_codec import SHREDDED
from msm_mem.interfaces.cli import main
from msm_mem.testing import FixedBackbone, FixedClock
from tests.cli_support import ADMIN as ADMIN_FLAGS
from tests.cli_support import admin_credential
from tests.conftest import MemFactory
from tests.helpers import ADMIN, AGENT, audit_events, raw_db
from tests.helpers import png as _png
from tests.layers import open_layers

T0 = 1_700_000_000.0
QUESTION = "Is the wombat-shaped opacity in the left apex new?"
ANSWER = "New wombatoid opacity left apex, suspicious for pneumonia"
DECISION = "antibiotics and platypus follow-up"
#: PHI columns per table as stored
PHI_COLUMNS = {
    "episodic": ("question", "answer", "decision", "media_path", "media_description"),
    "visual": ("media_path",),
    "semantic": ("impressions",),
    "stm": ("payload",),
    "claims": ("content", "source"),
}


def _fill(tmp_path: Path, new_mem: MemFactory | None = None) -> Path:
    """A closed store with two patients, a held item and a critic correction (SQLite, or of the
    backend of ``new_mem``)."""
    directory = tmp_path / "s"
    backbone = FixedBackbone(ANSWER, DECISION)
    if new_mem is None:
        mem = MsmMem.init(directory, ADMIN, clock=FixedClock(T0), backbone=backbone)
    else:
        mem = new_mem("s", clock=FixedClock(T0), backbone=backbone)
    for patient, seed in (("P1", 1), ("P1", 1), ("P2", 2)):
        mem.ask(AGENT, patient, _png(tmp_path, seed), QUESTION, study_id=f"S{seed}")
    mem.feedback(Principal("rad-1", "critic"), "P2", "S2", accept=False, correction="Confirmed wombatoid pneumonia")
    mem.close()
    admin_credential(directory)  # the command-line tests run admin commands on it
    return directory


def _db(directory: Path) -> sqlite3.Connection:
    return sqlite3.connect(directory / "msm-mem.sqlite", isolation_level=None)


def _readable(directory: Path) -> dict[str, str]:
    """Every decrypted PHI field of every record, keyed by table/id/field."""
    out: dict[str, str] = {}
    with open_layers(directory) as layers:
        s = layers.store
        for e in s.iter_episodes():
            for f in PHI_COLUMNS["episodic"]:
                out[f"{e.patient_id}/episodic/{e.episode_id}/{f}"] = getattr(e, f)
        for v in s.iter_visuals():
            out[f"{v.patient_id}/visual/{v.visual_id}/media_path"] = v.media_path
        for st in s.iter_semantic():
            out[f"{st.patient_id}/semantic/{st.state_id}"] = repr(st.impressions)
        for item in s.stm_list():
            out[f"{item.patient_id}/stm/{item.item_id}"] = "" if item.payload is None else item.payload.to_json()
        for p in ("P1", "P2"):
            for c in s.claims_active(p):
                out[f"{p}/claims/{c.claim_id}"] = c.content + c.source
    return out


@pytest.fixture
def store_dir(tmp_path: Path) -> Iterator[Path]:
    """The filled store on SQLite (for the file-level and the command-line tests)."""
    yield _fill(tmp_path)


@pytest.fixture
def filled(tmp_path: Path, new_mem: MemFactory) -> Path:
    """The filled store, closed, on each backend."""
    return _fill(tmp_path, new_mem)


def test_phi_columns_hold_enc1_tokens(filled: Path) -> None:
    """Every non-empty PHI column of every table is an enc1 token."""
    con = raw_db(filled)
    try:
        for table, columns in PHI_COLUMNS.items():
            for column in columns:
                values = [r[0] for r in con.execute(f"SELECT {column} FROM {table}")]  # noqa: S608
                assert values, (table, column)
                for value in values:
                    assert value == "" or is_token(value), (table, column, value[:40])
                    assert value == "" or value.startswith("enc1:")
    finally:
        con.close()


def test_no_plaintext_in_database_files(store_dir: Path) -> None:
    """Neither the database file nor its WAL holds question, answer or decision text.

    SQLite only: it reads the store's files; the rows of either backend are checked by
    test_no_plaintext_in_any_stored_row."""
    blob = b"".join(p.read_bytes() for p in store_dir.glob("msm-mem.sqlite*"))
    assert blob
    for secret in ("wombat", "platypus", "pneumonia", "left apex", "img1.png", "Confirmed"):
        assert secret.encode() not in blob, secret


def test_no_plaintext_in_any_stored_row(filled: Path) -> None:
    """No column of any row of any table of the store of record holds question, answer or decision text."""
    with raw_db(filled) as db:
        tables = db.tables()
        assert {"episodic", "visual", "semantic", "stm", "claims", "audit", "keys"} <= set(tables)
        rows = [repr(tuple(r)) for t in tables for r in db.execute(f"SELECT * FROM {t}").fetchall()]  # noqa: S608
    blob = "\n".join(rows)
    assert "enc1:" in blob
    for secret in ("wombat", "platypus", "pneumonia", "left apex", "img1.png", "Confirmed"):
        assert secret not in blob, secret


def test_fields_decrypt_back(filled: Path) -> None:
    """Through the store, the same fields read back as the plaintext that was written."""
    fields = _readable(filled)
    assert ANSWER in fields.values() and QUESTION in fields.values()
    assert any("Confirmed wombatoid pneumonia" in v for v in fields.values())


@pytest.mark.parametrize("where", ["other_field", "other_record_same_patient", "other_patient"])
def test_moved_ciphertext_fails_authentication(filled: Path, where: str) -> None:
    """A token copied into another field or record (edit in the database) raises DecryptionError on read."""
    con = raw_db(filled)
    rows = con.execute("SELECT id, patient_id, question, answer FROM episodic ORDER BY pos").fetchall()
    p1 = [r for r in rows if r[1] == "P1"]
    p2 = [r for r in rows if r[1] == "P2"]
    if where == "other_field":
        target, sql, token = p1[0][0], "UPDATE episodic SET question = ? WHERE id = ?", p1[0][3]
    elif where == "other_record_same_patient":
        target, sql, token = p2[-1][0], "UPDATE episodic SET answer = ? WHERE id = ?", p2[0][3]
    else:
        target, sql, token = p2[0][0], "UPDATE episodic SET answer = ? WHERE id = ?", p1[0][3]
    con.execute(sql, (token, target))
    con.close()
    with open_layers(filled) as layers, pytest.raises(DecryptionError):
        layers.store.get_episodes([target])


def test_tampered_or_plain_values_fail(filled: Path) -> None:
    """A flipped character in a token or plain text in a PHI column raises DecryptionError."""
    con = raw_db(filled)
    claim_id, content = con.execute("SELECT id, content FROM claims WHERE patient_id = 'P1'").fetchone()
    flipped = content[:-3] + ("A" if content[-3] != "A" else "B") + content[-2:]
    con.execute("UPDATE claims SET content = ? WHERE id = ?", (flipped, claim_id))
    stm_id = con.execute("SELECT id FROM stm WHERE payload != '' LIMIT 1").fetchone()[0]
    con.execute("UPDATE stm SET payload = ? WHERE id = ?", (json.dumps({"question": "plain"}), stm_id))
    con.close()
    with open_layers(filled) as layers:
        with pytest.raises(DecryptionError):
            layers.store.get_claims([claim_id])
        with pytest.raises(DecryptionError):
            layers.store.stm_get([stm_id])


def test_cli_rotate_keeps_every_record_readable(store_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """keys rotate rewraps every data key under a new KEK; all fields read the same and the rotation is audited."""
    before = _readable(store_dir)
    con = _db(store_dir)
    keks = {r[0] for r in con.execute("SELECT kek_id FROM keys")}
    con.close()
    assert main(["keys", "rotate", str(store_dir), *ADMIN_FLAGS]) == 0
    assert "rewrapped" in capsys.readouterr().out
    assert _readable(store_dir) == before
    con = _db(store_dir)
    after = {r[0] for r in con.execute("SELECT kek_id FROM keys")}
    con.close()
    assert len(after) == 1 and not (after & keks)
    last = audit_events(store_dir)[-1]
    assert (last.action, last.role) == ("key_rotate", "admin")
    assert main(["audit", "verify", str(store_dir), *ADMIN_FLAGS]) == 0


def test_cli_shred_unlinks_one_patient(store_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """keys shred makes P1's fields read [shredded]; P2 stays readable; the audit chain verifies."""
    p2_before = {k: v for k, v in _readable(store_dir).items() if k.startswith("P2/")}
    assert main(["keys", "shred", str(store_dir), "--patient", "P1", "--reason", "erasure request", *ADMIN_FLAGS]) == 0
    assert "shredded" in capsys.readouterr().out
    with MsmMem.open(store_dir) as mem, open_layers(store_dir) as layers:
        s = layers.store
        con = _db(store_dir)
        p1_eps = [r[0] for r in con.execute("SELECT id FROM episodic WHERE patient_id = 'P1'")]
        p2_eps = [r[0] for r in con.execute("SELECT id FROM episodic WHERE patient_id = 'P2'")]
        con.close()
        for e in s.get_episodes(p1_eps):
            assert (e.question, e.answer) == (SHREDDED, SHREDDED)
            assert e.state.value == "retracted"
        assert all(i.payload is None for i in s.stm_list(patient_id="P1"))
        assert all(st.impressions == () for st in s.iter_semantic() if st.patient_id == "P1")
        assert {e.answer for e in s.get_episodes(p2_eps)} <= {ANSWER, "Confirmed wombatoid pneumonia"}
        assert s.claims_active("P2")[0].content == "Confirmed wombatoid pneumonia"
        with pytest.raises(AccessDenied):
            mem.ask(AGENT, "P1", _png(store_dir.parent, 3), QUESTION)
        assert mem.verify_audit(ADMIN).ok
    assert {k: v for k, v in _readable(store_dir).items() if k.startswith("P2/")} == p2_before
    assert len(p2_before) >= 8
    assert main(["audit", "verify", str(store_dir), *ADMIN_FLAGS]) == 0


def test_shred_through_another_handle_is_enforced(tmp_path: Path) -> None:
    """After `keys shred` through another handle (the CLI), an open handle refuses new turns for that patient."""
    directory = tmp_path / "s"
    mem = MsmMem.init(directory, ADMIN, clock=FixedClock(T0), backbone=FixedBackbone(ANSWER, DECISION))
    try:
        mem.ask(AGENT, "P1", _png(tmp_path, 1), QUESTION)
        admin_credential(directory)
        assert main(["keys", "shred", str(directory), "--patient", "P1", "--reason", "erasure", *ADMIN_FLAGS]) == 0
        with pytest.raises(AccessDenied):
            mem.ask(AGENT, "P1", _png(tmp_path, 2), QUESTION)
    finally:
        mem.close()
