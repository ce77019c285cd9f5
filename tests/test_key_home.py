"""The keys live outside the store's directory (msm_mem._governance.key_home): a copy of the
directory alone neither opens nor decrypts nor re-signs; the key home records the store's
schema and witness, so a schema set back, a witness rolled back or left out, and a whole
directory rolled back are caught; an older store's keys move out with ``store upgrade``; a
master key from the environment and a KMS-style provider work without key files (synthetic
data only)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from msm_mem import AuditChainBroken, DecryptionError, InvalidInput, ManifestRow, MsmMem, StoreError
from msm_mem._governance.key_home import ENV_HOME, ENV_MASTER, default_home
from msm_mem.interfaces.cli import main
from msm_mem.testing import FixedBackbone, FixedClock, InMemoryKeyProvider
from tests.cli_support import ADMIN as ADMIN_FLAGS
from tests.cli_support import AUDITOR as AUDITOR_FLAGS
from tests.cli_support import CLINICIAN as CLINICIAN_FLAGS
from tests.conftest import MemFactory
from tests.helpers import ADMIN, AGENT, AUDITOR, CLINICIAN, SYSTEM, key_folder, png, raw_sql
from tests.legacy_layout import keys_into_directory

T0 = 1_700_000_000.0
QUESTION = "Is the right lower lobe opacity changing?"


def _fill(tmp_path: Path, mem: MsmMem, n: int = 3) -> None:
    rows = [
        ManifestRow(f"P{i % 2}", f"S{i}", T0 - 86400 * i, str(png(tmp_path, i)), QUESTION, "effusion") for i in range(n)
    ]
    mem.ingest(SYSTEM, rows)


def _store(tmp_path: Path, new_mem: MemFactory, **options: object) -> MsmMem:
    mem = new_mem("s", clock=FixedClock(T0), backbone=FixedBackbone("Stable opacity", "follow up"), **options)
    _fill(tmp_path, mem)
    return mem


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_no_key_material_in_the_directory(tmp_path: Path, new_mem: MemFactory) -> None:
    """init writes the key files, the record and the witness to the store's folder of the key
    home (files 0600, folders 0700) and none of them to the directory."""
    mem = _store(tmp_path, new_mem)
    directory, folder = mem.directory, key_folder(mem)
    mem.close()
    assert folder.parent == default_home()
    assert sorted(p.name for p in folder.iterdir()) == [
        "checkpoint.key",
        "kek.json",
        "record.json",
        "witness.head",
        "witness.jsonl",
    ]
    assert all(_mode(p) == 0o600 for p in folder.iterdir()) and _mode(folder) == 0o700
    names = {p.name for p in directory.rglob("*")}
    assert not names & {"kek.json", "checkpoint.key", "record.json", "witness.jsonl"}
    record = json.loads((folder / "record.json").read_text())
    assert record["schema"] == "3" and record["witness"] == str(folder / "witness.jsonl")


def test_a_copy_of_the_directory_alone_opens_nothing(tmp_path: Path, new_mem: MemFactory, backend: str) -> None:
    """The directory copied to another machine (another, empty key home): opening it names the
    missing key file; the CLI says the same; the original opens with its key home."""
    mem = _store(tmp_path, new_mem)
    directory = mem.directory
    mem.close()
    stolen = tmp_path / "stolen"
    shutil.copytree(directory, stolen)
    other_home = tmp_path / "insider-home"
    with pytest.raises(InvalidInput, match="key file .*kek.json.* does not exist"):
        MsmMem.open(stolen, key_home=other_home)
    os.environ[ENV_HOME] = str(other_home)
    try:
        assert main(["show", "episodes", str(stolen), "--patient", "P0", *CLINICIAN_FLAGS]) == 1
    finally:
        del os.environ[ENV_HOME]
    if backend == "sqlite":  # nothing readable in the copy: the narrative is ciphertext
        rows = raw_sql(stolen, "SELECT answer FROM episodic")
        assert rows and all("Stable" not in str(a) for (a,) in rows)
    with MsmMem.open(directory) as mem:
        assert mem.episodes(CLINICIAN, "P0")


def test_a_key_home_inside_the_directory_is_refused(tmp_path: Path) -> None:
    """Neither may contain the other: init refuses and leaves nothing behind."""
    with pytest.raises(InvalidInput, match="must not contain one another"):
        MsmMem.init(tmp_path / "s", ADMIN, key_home=tmp_path / "s" / "keys")
    assert not (tmp_path / "s").exists()
    with pytest.raises(InvalidInput, match="lies in the store directory"):
        MsmMem.init(tmp_path / "t", ADMIN, checkpoint_key=tmp_path / "t" / "cp.key")
    assert not (tmp_path / "t").exists()


def test_a_master_key_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MSM_MEM_MASTER_KEY derives the keys: no key file anywhere; the same master reopens and
    verifies; without it the store does not open; another master cannot read or verify;
    rotation is refused naming why; a malformed value names the variable."""
    master = base64.b64encode(os.urandom(32)).decode()
    monkeypatch.setenv(ENV_MASTER, master)
    mem = MsmMem.init(tmp_path / "s", ADMIN, clock=FixedClock(T0))
    _fill(tmp_path, mem)
    folder = key_folder(mem)
    mem.close()
    assert not (folder / "kek.json").exists() and not (folder / "checkpoint.key").exists()
    assert (folder / "record.json").exists()
    with MsmMem.open(tmp_path / "s", clock=FixedClock(T0 + 60)) as mem:
        assert mem.verify_audit(AUDITOR).ok
        answers = [e.answer for e in mem.episodes(CLINICIAN, "P0")]
        with pytest.raises(InvalidInput, match="do not rotate here"):
            mem.rotate_keys(ADMIN, "scheduled rotation")
    assert answers
    monkeypatch.setenv(ENV_MASTER, base64.b64encode(os.urandom(32)).decode())
    with MsmMem.open(tmp_path / "s", clock=FixedClock(T0 + 60)) as mem:
        with pytest.raises(DecryptionError):
            mem.episodes(CLINICIAN, "P0")
        assert not mem.verify_audit(AUDITOR).ok
    monkeypatch.delenv(ENV_MASTER)
    with pytest.raises(InvalidInput, match=f"takes its keys from {ENV_MASTER}, which is not set"):
        MsmMem.open(tmp_path / "s")
    monkeypatch.setenv(ENV_MASTER, "c2hvcnQ=")
    with pytest.raises(InvalidInput, match=f"{ENV_MASTER} holds 5 bytes"):
        MsmMem.open(tmp_path / "s")


def test_a_kms_provider_and_a_signing_key_object(tmp_path: Path) -> None:
    """A provider object (a KMS's stand-in) and an Ed25519 key object: no key file is written;
    the same objects reopen the store; without them it does not open."""
    provider, key = InMemoryKeyProvider(), Ed25519PrivateKey.generate()
    mem = MsmMem.init(tmp_path / "s", ADMIN, key_provider=provider, checkpoint_key=key, clock=FixedClock(T0))
    _fill(tmp_path, mem)
    folder = key_folder(mem)
    mem.close()
    assert sorted(p.name for p in folder.iterdir()) == ["record.json", "witness.head", "witness.jsonl"]
    with MsmMem.open(tmp_path / "s", key_provider=provider, checkpoint_key=key) as mem:
        assert mem.verify_audit(AUDITOR).ok and mem.episodes(CLINICIAN, "P1")
    with pytest.raises(InvalidInput, match="the key provider .a KMS. it was made with"):
        MsmMem.open(tmp_path / "s")


def test_a_master_key_does_not_stand_in_for_key_files(
    tmp_path: Path, new_mem: MemFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store whose keys are files in the key home, opened with MSM_MEM_MASTER_KEY set (for
    another store): refused naming where its keys are, not a decryption failure later."""
    mem = _store(tmp_path, new_mem)
    directory = mem.directory
    mem.close()
    assert json.loads((key_folder(directory) / "record.json").read_text())["keys"] == "files"
    monkeypatch.setenv(ENV_MASTER, base64.b64encode(os.urandom(32)).decode())
    with pytest.raises(InvalidInput, match=f"its key files in .*: unset {ENV_MASTER}"):
        MsmMem.open(directory)


def test_store_upgrade_moves_the_keys_out(
    tmp_path: Path, new_mem: MemFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """A store that keeps its keys inside its directory (an older layout) is refused naming the
    upgrade; `msm-mem store upgrade` moves them to the key home (audited) and the store opens,
    reads and verifies; a second upgrade has nothing to do."""
    mem = _store(tmp_path, new_mem)
    directory = mem.directory
    mem.close()
    keys_into_directory(directory)
    with pytest.raises(StoreError, match="msm-mem store upgrade"):
        MsmMem.open(directory)
    capsys.readouterr()
    assert main(["store", "upgrade", str(directory), *ADMIN_FLAGS]) == 0
    assert "2 key files moved to the key home" in capsys.readouterr().out
    assert not (directory / "keys" / "kek.json").exists() and not (directory / "keys" / "checkpoint.key").exists()
    assert (key_folder(directory) / "kek.json").exists()
    with MsmMem.open(directory, clock=FixedClock(T0 + 60)) as mem:
        assert mem.verify_audit(AUDITOR).ok
        assert [e.action for e in mem.audit_trail(AUDITOR, limit=1000).events if e.action == "store_upgrade"]
        assert mem.episodes(CLINICIAN, "P0")
    with pytest.raises(StoreError, match="nothing to upgrade"):
        MsmMem.upgrade(directory, ADMIN)


def test_a_schema_set_back_is_broken_not_old(
    tmp_path: Path, new_mem: MemFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """An insider sets the store's schema back (so that an upgrade would adopt a rewritten
    head): opening, upgrading and `audit verify` (exit 3) name the recorded schema."""
    mem = _store(tmp_path, new_mem)
    directory = mem.directory
    mem.close()
    raw_sql(directory, "UPDATE meta SET value = '2' WHERE key = 'schema'")
    with pytest.raises(AuditChainBroken, match="recorded schema 3"):
        MsmMem.open(directory)
    with pytest.raises(AuditChainBroken, match="recorded schema 3"):
        MsmMem.upgrade(directory, ADMIN)
    capsys.readouterr()
    assert main(["audit", "verify", str(directory), *AUDITOR_FLAGS]) == 3
    assert "set back" in capsys.readouterr().out


def _rolled_back(
    tmp_path: Path, new_mem: MemFactory, log_of: Callable[[MsmMem], Path], expected: str
) -> tuple[Path, Callable[[], None]]:
    """A store whose checkpoint log ``log_of(mem)`` and its head file were put back to their
    copies from before one more ask: its verification must name ``expected``. Returns the
    store's directory and what puts the current files back."""
    mem = _store(tmp_path, new_mem)
    log = log_of(mem)
    old = {p: p.read_bytes() for p in (log, log.with_suffix(".head"))}
    mem.ask(AGENT, "P0", png(tmp_path, 7), QUESTION, study_id="S7")
    directory = mem.directory
    mem.close()
    new = {p: p.read_bytes() for p in old}
    for p, data in old.items():
        p.write_bytes(data)
    with MsmMem.open(directory) as mem:
        result = mem.verify_audit(AUDITOR)
    assert not result.ok and expected in result.reason, result.reason

    def restore() -> None:
        for p, data in new.items():
            p.write_bytes(data)

    return directory, restore


def test_a_witness_rolled_back_is_caught(
    tmp_path: Path, new_mem: MemFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """The witness replaced by an older copy (log and head) is behind the store: broken, exit 3;
    the current witness put back verifies again."""
    directory, restore = _rolled_back(
        tmp_path, new_mem, lambda mem: key_folder(mem) / "witness.jsonl", "the witness is behind"
    )
    capsys.readouterr()
    assert main(["audit", "verify", str(directory), *AUDITOR_FLAGS]) == 3
    assert "witness is behind" in capsys.readouterr().out
    restore()
    with MsmMem.open(directory) as mem:
        assert mem.verify_audit(AUDITOR).ok


def test_a_missing_witness_is_caught(tmp_path: Path, new_mem: MemFactory) -> None:
    """The recorded witness deleted: verification names it missing."""
    mem = _store(tmp_path, new_mem)
    directory = mem.directory
    witness = key_folder(mem) / "witness.jsonl"
    mem.close()
    witness.unlink()
    with MsmMem.open(directory) as mem:
        result = mem.verify_audit(AUDITOR)
    assert not result.ok and "witness witness.jsonl is missing" in result.reason


def test_the_whole_directory_rolled_back_is_caught(tmp_path: Path) -> None:
    """An embedded store's directory replaced by an older copy of itself (every file: database,
    checkpoints, head): the witness in the key home signed more, so the tail is missing."""
    mem = MsmMem.init(tmp_path / "s", ADMIN, clock=FixedClock(T0), backbone=FixedBackbone("Stable opacity", "x"))
    _fill(tmp_path, mem)
    mem.close()
    shutil.copytree(tmp_path / "s", tmp_path / "before")
    with MsmMem.open(tmp_path / "s", clock=FixedClock(T0 + 60), backbone=FixedBackbone("Worse", "x")) as mem:
        mem.ask(AGENT, "P0", png(tmp_path, 8), QUESTION, study_id="S8")
    shutil.rmtree(tmp_path / "s")
    shutil.copytree(tmp_path / "before", tmp_path / "s")
    with MsmMem.open(tmp_path / "s") as mem:
        result = mem.verify_audit(AUDITOR)
    assert not result.ok and "witness signed" in result.reason and "tail truncated" in result.reason


def test_a_damaged_key_file_is_named(tmp_path: Path, new_mem: MemFactory) -> None:
    """A key-encryption key changed in the key file (still valid JSON and base64): reading a
    patient fails naming the key file, not only "authentication failed"."""
    mem = _store(tmp_path, new_mem)
    directory, kek = mem.directory, key_folder(mem) / "kek.json"
    mem.close()
    doc = json.loads(kek.read_text())
    current = doc["current"]
    raw = bytearray(base64.b64decode(doc["keys"][current]))
    raw[0] ^= 0xFF
    doc["keys"][current] = base64.b64encode(bytes(raw)).decode()
    kek.write_text(json.dumps(doc))
    with MsmMem.open(directory) as mem:
        with pytest.raises(DecryptionError, match=f"key file {kek}"):
            mem.episodes(CLINICIAN, "P0")


def test_the_checkpoint_files_rolled_back_are_caught(tmp_path: Path, new_mem: MemFactory) -> None:
    """The directory's checkpoint log and head file replaced by older copies (the database and
    the witness as they are): broken, naming the rolled-back checkpoints; put back: intact."""
    directory, restore = _rolled_back(
        tmp_path,
        new_mem,
        lambda mem: mem.directory / "audit" / "checkpoints.jsonl",
        "the store's checkpoints were rolled back",
    )
    restore()
    with MsmMem.open(directory) as mem:
        assert mem.verify_audit(AUDITOR).ok
