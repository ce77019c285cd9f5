"""The pseudonym and key tables fit the chain: full verification catches a pseudonym row
deleted in the database (a patient's access history orphaned) and wrapped data keys swapped
between patients, on both stores, and stays intact through honest erasure (synthetic data only)."""

from __future__ import annotations

from pathlib import Path

import pytest

from msm_mem import ManifestRow, MsmMem
from msm_mem.interfaces.cli import main
from msm_mem.testing import FixedBackbone, FixedClock
from tests.cli_support import AUDITOR as AUDITOR_FLAGS
from tests.conftest import MemFactory
from tests.helpers import ADMIN, AGENT, AUDITOR, SYSTEM, png, raw_sql

T0 = 1_700_000_000.0
QUESTION = "Is the right lower lobe opacity changing?"


def _store(tmp_path: Path, new_mem: MemFactory) -> Path:
    mem = new_mem("s", clock=FixedClock(T0), backbone=FixedBackbone("Stable opacity", "follow up"))
    rows = [
        ManifestRow(f"P{i % 3}", f"S{i}", T0 - 86400 * i, str(png(tmp_path, i)), QUESTION, "effusion") for i in range(6)
    ]
    mem.ingest(SYSTEM, rows)
    mem.ask(AGENT, "P1", png(tmp_path, 9), QUESTION, study_id="S9")
    directory = mem.directory
    mem.close()
    return directory


def _verify(directory: Path, *, full: bool = True) -> tuple[bool, str]:
    with MsmMem.open(directory) as mem:
        result = mem.verify_audit(AUDITOR, full=full)
    return result.ok, result.reason


def test_a_deleted_pseudonym_row_is_caught(
    tmp_path: Path, new_mem: MemFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """One pseudonym row deleted: broken naming the orphaned histories (exit 3); put back: intact."""
    directory = _store(tmp_path, new_mem)
    assert _verify(directory) == (True, "")
    row = raw_sql(directory, "SELECT key_id, pseudonym, token, tenant FROM pseudonyms ORDER BY key_id LIMIT 1")[0]
    raw_sql(directory, "DELETE FROM pseudonyms WHERE key_id = ?", (row[0],))
    ok, reason = _verify(directory)
    assert not ok and "1 pseudonyms named by audit events have no row" in reason
    capsys.readouterr()
    assert main(["audit", "verify", str(directory), *AUDITOR_FLAGS]) == 3
    assert "orphans" in capsys.readouterr().out
    raw_sql(directory, "INSERT INTO pseudonyms (key_id, pseudonym, token, tenant) VALUES (?, ?, ?, ?)", row)
    assert _verify(directory) == (True, "")


def test_wrapped_keys_swapped_between_patients_are_caught(tmp_path: Path, new_mem: MemFactory) -> None:
    """Two patients' wrapped keys swapped: broken naming the keys; swapped back: intact."""
    directory = _store(tmp_path, new_mem)
    (a, wa), (b, wb) = raw_sql(
        directory, "SELECT key_id, wrapped FROM keys WHERE shredded = ? ORDER BY key_id LIMIT 2", (False,)
    )
    raw_sql(directory, "UPDATE keys SET wrapped = ? WHERE key_id = ?", (wb, a))
    raw_sql(directory, "UPDATE keys SET wrapped = ? WHERE key_id = ?", (wa, b))
    ok, reason = _verify(directory)
    assert not ok and "2 wrapped data keys do not open their patient's pseudonym link" in reason
    raw_sql(directory, "UPDATE keys SET wrapped = ? WHERE key_id = ?", (wa, a))
    raw_sql(directory, "UPDATE keys SET wrapped = ? WHERE key_id = ?", (wb, b))
    assert _verify(directory) == (True, "")


def test_honest_erasure_and_rotation_stay_intact(tmp_path: Path, new_mem: MemFactory) -> None:
    """Shredding deletes a patient's pseudonym row, named by the erasure event; rotation rewraps
    every key: both verify intact."""
    directory = _store(tmp_path, new_mem)
    with MsmMem.open(directory, clock=FixedClock(T0 + 60)) as mem:
        mem.shred(ADMIN, "P2", "erasure request")
        assert mem.verify_audit(AUDITOR).ok
        mem.rotate_keys(ADMIN, "scheduled rotation")
        assert mem.verify_audit(AUDITOR).ok
    assert _verify(directory) == (True, "")
