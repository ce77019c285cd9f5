"""Tamper evidence against an insider with the database and the store directory: every commit of
audit rows is signed before it is acknowledged, so truncation, forged appends, edits with a
recomputed chain and a deleted head with a forged base are caught on either store; the key and
the checkpoints can live elsewhere, a witness is consulted, verification writes nothing, and the
project's own formats are pinned by fixed vectors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from msm_mem import CheckpointKeyMissing, InvalidInput, MsmMem, StoreError
from msm_mem._errors import AuditChainBroken
from msm_mem._governance.audit.chain import ChainBuilder
from msm_mem._governance.audit.checkpoint import Checkpoint
from msm_mem._governance.audit.checkpoint_signer import CheckpointSigner
from msm_mem._governance.audit.event import GENESIS, AuditEvent
from msm_mem._governance.crypto import _field_aad, _unb64url, is_token
from msm_mem.testing import FixedBackbone, FixedClock
from tests.conftest import MemFactory
from tests.helpers import ADMIN, AGENT, AUDITOR, key_folder, png, raw_sql
from tests.layers import Layers, layers_of, open_layers

pytestmark = pytest.mark.cluster

T0 = 1_700_000_000.0
PATIENT = "P-TAMPER-1"
QUESTION = "Is the right lower lobe opacity changing?"


def _store(tmp_path: Path, new_mem: MemFactory, **options: Any) -> tuple[MsmMem, int]:
    """A store with three answered turns (no explicit checkpoint); returns it and its head seq.
    ``options`` are those of ``MsmMem.init`` where the key and the checkpoints are."""
    # one audit chain: these are the seqs of one chain (a store of several: tests/test_lanes.py)
    fixed = {"clock": FixedClock(T0), "backbone": FixedBackbone("Stable opacity", "follow up"), "audit_chains": 1}
    mem = new_mem("s", **fixed, **options)
    for seed in (1, 2, 3):
        mem.ask(AGENT, PATIENT, png(tmp_path, seed), QUESTION, study_id=f"ACC-{seed}")
    return mem, _head(mem, **options)[0]


def _layers(mem: MsmMem, **options: Any) -> Layers:
    """The layers of the open ``mem`` (another handle on its store), its key found as ``options`` say."""
    return layers_of(mem, FixedClock(T0), **options)


def _head(mem: MsmMem, **options: Any) -> tuple[int, str]:
    """The committed head of the audit chain of ``mem`` (size, hash), read through a handle of its own."""
    with _layers(mem, **options) as layers:
        return layers.store.audit_head()


def _reopen(mem: MsmMem, **options: Any) -> MsmMem:
    directory = mem.directory
    mem.close()
    return MsmMem.open(directory, **options)


def _row(mem: MsmMem, seq: int) -> tuple[bytes, str]:
    payload, digest = raw_sql(mem, "SELECT payload, event_hash FROM audit WHERE seq = ?", (seq,))[0]
    return bytes(payload), str(digest)


def _recompute(mem: MsmMem, k: int, head: int) -> None:
    """Edit event ``k`` (another actor) and rewrite ``k..head`` with valid hashes and links."""
    builder = ChainBuilder(k - 1, _row(mem, k - 1)[1])
    for seq in range(k, head + 1):
        event = AuditEvent.from_row(seq, *_row(mem, seq))
        fields = {
            f: getattr(event, f)
            for f in (
                "time role action source_tier target_tier purpose outcome record_ids patient consent_id reason".split()
            )
        }
        _, payload, digest = builder.next_row(actor="mallory" if seq == k else event.actor, **fields)
        raw_sql(mem, "UPDATE audit SET payload = ?, event_hash = ? WHERE seq = ?", (payload, digest, seq))


def _signed_sizes(directory: Path) -> list[int]:
    lines = (directory / "audit" / "checkpoints.jsonl").read_text().splitlines()
    return [int(json.loads(line)["size"]) for line in lines]


def _broken(mem: MsmMem, first: int, words: str) -> None:
    for full in (True, False):
        result = mem.verify_audit(AUDITOR, full=full)
        assert (result.ok, result.first_bad_seq) == (False, first), (full, result)
        assert words in result.reason, result.reason


# the chain against its per-commit checkpoints, on either store ------------------------------


def test_every_commit_is_signed_before_it_returns(tmp_path: Path, new_mem: MemFactory) -> None:
    """After each write the log's last line and the head file sign exactly the stored head."""
    mem, head = _store(tmp_path, new_mem)
    last = Checkpoint.from_json((mem.directory / "audit" / "checkpoints.jsonl").read_text().splitlines()[-1])
    assert (last.size, last.head_hash) == _head(mem) and last.base == (0, GENESIS)
    written = Checkpoint.from_json((mem.directory / "audit" / "checkpoints.head").read_bytes()[:-1])
    with _layers(mem) as layers:
        public_key = layers.audit.signer.public_key
    assert written == last and last.verify(public_key)
    assert mem.verify_audit(AUDITOR).ok and mem.verify_audit(AUDITOR).count == head
    mem.close()


def test_truncated_tail_is_caught(tmp_path: Path, new_mem: MemFactory) -> None:
    """Deleting the newest events (no checkpoint asked for) names the first missing seq."""
    mem, head = _store(tmp_path, new_mem)
    raw_sql(mem, "DELETE FROM audit WHERE seq > ?", (head - 3,))
    mem = _reopen(mem)
    _broken(mem, head - 2, "tail truncated")
    mem.close()


def test_forged_append_is_caught(tmp_path: Path, new_mem: MemFactory) -> None:
    """An event appended with valid hash and link is covered by no checkpoint: named, and no
    write signs over it."""
    mem, head = _store(tmp_path, new_mem)
    builder = ChainBuilder(head, _row(mem, head)[1])
    seq, payload, digest = builder.next_row(
        time=T0,
        actor="mallory",
        role="admin",
        action="read",
        source_tier="ltm",
        target_tier="stm",
        purpose="audit",
        outcome="success",
    )
    raw_sql(mem, "INSERT INTO audit VALUES (?, ?, ?, 'default')", (seq, payload, digest))
    mem = _reopen(mem)
    _broken(mem, head + 1, "covered by no signed checkpoint (appended outside msm-mem)")
    with pytest.raises(AuditChainBroken):
        mem.ask(AGENT, PATIENT, png(tmp_path, 4), QUESTION, study_id="ACC-4")
    assert _head(mem)[0] == head + 1  # nothing more was written
    mem.close()


def test_edit_and_recompute_after_the_last_checkpoint_is_caught(tmp_path: Path, new_mem: MemFactory) -> None:
    """Editing the newest events and rehashing them names the first event of the commit edited."""
    mem, head = _store(tmp_path, new_mem)
    k = head - 1
    _recompute(mem, k, head)
    mem = _reopen(mem)
    first = max(size for size in _signed_sizes(mem.directory) if size < k) + 1
    assert first <= k
    _broken(mem, first, "edited and rehashed")
    mem.close()


def test_deleted_head_with_a_forged_base_is_caught(tmp_path: Path, new_mem: MemFactory) -> None:
    """Deleting the oldest events and storing the base a purge would have is not a signed base."""
    mem, _ = _store(tmp_path, new_mem)
    k = 5
    _, digest = _row(mem, k)
    raw_sql(mem, "DELETE FROM audit WHERE seq <= ?", (k,))
    raw_sql(mem, "INSERT INTO meta VALUES ('audit_base', ?, 'default')", (f"{k}:{digest}",))
    mem = _reopen(mem)
    _broken(mem, 1, "is not the signed one")
    mem.close()


def test_a_write_killed_after_its_commit_is_covered_by_the_head_file(tmp_path: Path, new_mem: MemFactory) -> None:
    """A commit whose log line never came (its process died) verifies by the signed head file,
    and the next write copies that head into the log."""
    mem, head = _store(tmp_path, new_mem)
    log = mem.directory / "audit" / "checkpoints.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    log.write_text("".join(lines[:-1]))  # as if killed between the commit and the append
    mem = _reopen(mem)
    assert mem.verify_audit(AUDITOR).ok
    mem.ask(AGENT, PATIENT, png(tmp_path, 4), QUESTION, study_id="ACC-4")
    assert head in _signed_sizes(mem.directory)
    assert mem.verify_audit(AUDITOR).ok
    mem.close()


# where the key and the checkpoints are ------------------------------------------------------


def test_deleted_key_is_an_error_and_never_regenerated(tmp_path: Path, new_mem: MemFactory) -> None:
    """Opening without the checkpoint key is CheckpointKeyMissing and creates no key."""
    mem, _ = _store(tmp_path, new_mem)
    directory = mem.directory
    mem.close()
    key = key_folder(directory) / "checkpoint.key"
    saved = key.read_bytes()
    key.unlink()
    with pytest.raises(CheckpointKeyMissing, match="never regenerated"):
        MsmMem.open(directory)
    assert not key.exists()
    key.write_bytes(b"-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n")
    key.chmod(0o600)
    with pytest.raises(StoreError, match="not an unencrypted PEM private key"):
        MsmMem.open(directory)
    key.write_bytes(saved)
    with MsmMem.open(directory) as again:
        assert again.verify_audit(AUDITOR).ok


def test_deleted_checkpoints_are_caught(tmp_path: Path, new_mem: MemFactory) -> None:
    """A store whose checkpoint log is gone does not verify, and says which file is missing."""
    mem, _ = _store(tmp_path, new_mem)
    (mem.directory / "audit" / "checkpoints.jsonl").unlink()
    mem = _reopen(mem)
    _broken(mem, 1, "checkpoints.jsonl is missing")
    mem.close()


def test_key_and_checkpoints_outside_the_store_with_a_witness(tmp_path: Path, new_mem: MemFactory) -> None:
    """The key (a path), the checkpoints and a witness elsewhere: nothing of them is in DIR; an
    insider who truncates the tail and the log and head file with it is caught by the witness,
    which the store recorded at init: opening without naming it still consults it, and naming
    another is refused."""
    elsewhere = tmp_path / "vault"
    options = {
        "checkpoint_key": elsewhere / "checkpoint.key",
        "checkpoints": elsewhere / "cps",
        "witness": tmp_path / "witness" / "published.jsonl",
    }
    mem, head = _store(tmp_path, new_mem, **options)
    directory = mem.directory
    assert not (directory / "keys" / "checkpoint.key").exists() and not (directory / "audit").exists()
    assert (tmp_path / "witness" / "published.jsonl").read_bytes() == (
        elsewhere / "cps" / "checkpoints.jsonl"
    ).read_bytes()
    mem.consents(ADMIN)  # a commit of audit rows only: cutting it leaves every governed row as signed
    mem.close()
    with pytest.raises(CheckpointKeyMissing):
        MsmMem.open(directory)
    # the insider: drop the last commit's events, its log line and the head file
    cut = sorted(set(_signed_sizes_at(elsewhere / "cps" / "checkpoints.jsonl")))[-2]
    raw_sql(directory, "DELETE FROM audit WHERE seq > ?", (cut,))
    log = elsewhere / "cps" / "checkpoints.jsonl"
    log.write_text(
        "".join(line for line in log.read_text().splitlines(keepends=True) if json.loads(line)["size"] <= cut)
    )
    (elsewhere / "cps" / "checkpoints.head").unlink()
    with MsmMem.open(directory, checkpoint_key=options["checkpoint_key"], checkpoints=options["checkpoints"]) as mem:
        _broken(mem, cut + 1, "witness signed")  # the recorded witness, though not named
    with pytest.raises(InvalidInput, match="recorded at init"):
        MsmMem.open(directory, **{**options, "witness": tmp_path / "another.jsonl"})
    with MsmMem.open(directory, **options) as mem:
        _broken(mem, cut + 1, "witness signed")


def _signed_sizes_at(path: Path) -> list[int]:
    return [int(json.loads(line)["size"]) for line in path.read_text().splitlines()]


def test_witness_disagreeing_with_the_log_is_caught(tmp_path: Path, new_mem: MemFactory) -> None:
    """A witness line signed by the store's key for another head at a size the store holds."""
    witness = tmp_path / "witness"
    mem, head = _store(tmp_path, new_mem, witness=witness)
    with _layers(mem, witness=witness) as layers:  # the store's own key signs the forgery
        other = layers.audit.signer.sign_head("msm-mem", head - 1, "ab" * 32, T0, (0, GENESIS))
    with (witness / "checkpoints.jsonl").open("ab") as handle:
        handle.write(other.to_json() + b"\n")
    mem = _reopen(mem, witness=witness)
    result = mem.verify_audit(AUDITOR)
    assert not result.ok and result.reason.startswith(f"seq {result.first_bad_seq}: witness: events")
    mem.close()


def test_a_signing_key_object_signs_the_checkpoints(tmp_path: Path, new_mem: MemFactory) -> None:
    """A key provider object (here an Ed25519PrivateKey) instead of a key file: no key file is made."""
    key = Ed25519PrivateKey.generate()
    mem, _ = _store(tmp_path, new_mem, checkpoint_key=key)
    assert not (mem.directory / "keys" / "checkpoint.key").exists()
    mem = _reopen(mem, checkpoint_key=key)
    assert mem.verify_audit(AUDITOR).ok
    mem.close()
    with pytest.raises(CheckpointKeyMissing):
        MsmMem.open(mem.directory)


def test_a_store_from_before_per_commit_checkpoints_says_so(tmp_path: Path, new_mem: MemFactory) -> None:
    """A store whose checkpoints are all of the first format (or none): verification names the
    first event no checkpoint signs and why; writes refuse until a checkpoint signs the head."""
    mem, head = _store(tmp_path, new_mem)
    log = mem.directory / "audit" / "checkpoints.jsonl"
    first = Checkpoint.from_json(log.read_text().splitlines()[0])
    with _layers(mem) as layers:  # the store's own key, in the first format
        old = layers.audit.signer.sign(first.origin, first.size, first.head_hash, first.time)
    log.write_bytes(old.to_json() + b"\n")
    (mem.directory / "audit" / "checkpoints.head").unlink()
    witness = key_folder(mem) / "witness.jsonl"  # as old as the log: no witness then
    witness.write_bytes(old.to_json() + b"\n")
    witness.with_suffix(".head").unlink()
    mem = _reopen(mem)
    _broken(mem, first.size + 1, "written before per-commit checkpoints")
    with pytest.raises(AuditChainBroken):
        mem.ask(AGENT, PATIENT, png(tmp_path, 4), QUESTION, study_id="ACC-4")
    assert mem.checkpoint(ADMIN)[0] == head
    assert mem.verify_audit(AUDITOR).ok
    mem.ask(AGENT, PATIENT, png(tmp_path, 4), QUESTION, study_id="ACC-4")
    assert mem.verify_audit(AUDITOR).ok
    mem.close()


# verification only reads ----------------------------------------------------------------------


def _snapshot(*folders: Path) -> dict[str, tuple[int, int, int]]:
    return {
        str(p): (p.stat().st_mtime_ns, p.stat().st_size, p.stat().st_mode)
        for folder in folders
        for p in [folder, *folder.rglob("*")]
    }


def test_verification_writes_nothing(tmp_path: Path, new_mem: MemFactory) -> None:
    """Verifying (fully and by hashes) creates, changes or removes no file in the store directory
    nor where the checkpoints live; the directory and its files are read-only meanwhile."""
    outside = tmp_path / "cps"
    mem, _ = _store(tmp_path, new_mem, checkpoints=outside)
    mem = _reopen(mem, checkpoints=outside)
    paths = [p for p in (mem.directory, outside)]
    files = [
        p for folder in paths for p in folder.rglob("*") if p.is_file() and not p.name.startswith("msm-mem.sqlite")
    ]
    for p in files:
        p.chmod(0o400)
    (outside).chmod(0o500)
    try:
        before = _snapshot(*paths)
        assert mem.verify_audit(AUDITOR, full=True).ok
        assert mem.verify_audit(AUDITOR, full=False).ok
        after = _snapshot(*paths)
    finally:
        outside.chmod(0o700)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    # the audit event of the verification itself goes to the database (and its WAL) only: it
    # is a write of the governed API, not of the verifier
    assert {Path(k).name for k in changed} <= {"msm-mem.sqlite", "msm-mem.sqlite-wal", "msm-mem.sqlite-shm"}
    mem.close()


def test_verifier_alone_reads_only(tmp_path: Path, new_mem: MemFactory) -> None:
    """The verifier itself (without the audited API call around it) changes no file at all."""
    mem, _ = _store(tmp_path, new_mem)
    directory = mem.directory
    mem.close()
    with open_layers(directory, clock=FixedClock(T0)) as layers:  # the audit log without the API around it
        before = _snapshot(directory)
        assert layers.audit.verify().ok and layers.audit.verify(full=False).ok
        assert _snapshot(directory) == before


# fixed vectors of the project's own formats -----------------------------------------------------

#: an Ed25519 key from a fixed seed (signatures are deterministic, RFC 8032)
SEED = bytes(range(32))
PUBLIC_HEX = "03a107bff3ce10be1d70dd18e74bc09967e4d6309ba50d5f1ddc8664125531b8"
CHECKPOINT_LINE = (
    b'{"base_hash":"' + b"0" * 64 + b'","base_size":0,"head_hash":"' + b"ab" * 32 + b'","origin":"msm-mem",'
    b'"signature":"cb1eca791e6cc2691a58e1132df6343935e6341498bdbb1d20b0ba89fb0a9e32a6120ea48a793ccdf6d213'
    b'2e7f69e293d02df62868d1bb9a0135f56fb95d1b04","size":2,"time":1700000000.5}'
)


def test_a_known_checkpoint_line() -> None:
    """A known key signs a known head to the pinned line, which parses and verifies back."""
    signer = CheckpointSigner(Ed25519PrivateKey.from_private_bytes(SEED))
    assert signer.public_key_bytes.hex() == PUBLIC_HEX
    cp = signer.sign_head("msm-mem", 2, "ab" * 32, 1700000000.5, (0, GENESIS))
    assert cp.to_json() == CHECKPOINT_LINE
    parsed = Checkpoint.from_json(CHECKPOINT_LINE)
    assert parsed == cp and parsed.verify(bytes.fromhex(PUBLIC_HEX))
    assert not Checkpoint.from_json(CHECKPOINT_LINE.replace(b'"size":2', b'"size":3')).verify(bytes.fromhex(PUBLIC_HEX))


TENANT = "T-00112233445566778899aabbccddeeff"
KEY_ID = "K-" + "0" * 31 + "1"
AAD_HEX = (
    "6d736d2d6d656d2f6669656c642f656e63310000000022542d30303131323233333434353536363737383839396161626263636464"
    "6565666600000008657069736f64696300000003452d3100000006616e73776572000000224b2d303030303030303030303030303030"
    "3030303030303030303030303030303031"
)
TOKEN = "enc1:K-00000000000000000000000000000001:AAECAwQFBgcICQoLDyY8xSZQy4LTnbyqQwq72ByWBcRltdNCbgUGpu4"
DEK = bytes(range(32, 64))


def test_a_known_envelope_token_and_its_aad() -> None:
    """The AAD of a known field is pinned byte for byte, and a known token decrypts under its DEK
    with that AAD only (another record id fails)."""
    aad = _field_aad(TENANT, "episodic", "E-1", "answer", KEY_ID)
    assert aad.hex() == AAD_HEX
    assert is_token(TOKEN)
    blob = _unb64url(TOKEN.split(":", 2)[2])
    assert AESGCM(DEK).decrypt(blob[:12], blob[12:], aad) == b"Stable nodule"
    with pytest.raises(InvalidTag):
        AESGCM(DEK).decrypt(blob[:12], blob[12:], _field_aad(TENANT, "episodic", "E-2", "answer", KEY_ID))
