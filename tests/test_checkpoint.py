"""Tests for msm_mem._governance.audit.checkpoint: signing, the JSONL log and chain comparison."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from msm_mem._errors import AuditChainBroken, CanonicalJSONError, InvalidInput, StoreError
from msm_mem._governance.audit.chain import ChainBuilder
from msm_mem._governance.audit.checkpoint import (
    Checkpoint,
    CheckpointLog,
    ed25519_verify,
    heads_root,
    verify_against_checkpoints,
)
from msm_mem._governance.audit.checkpoint_signer import CheckpointSigner
from msm_mem._governance.audit.event import GENESIS

WYCHEPROOF = Path(__file__).resolve().parents[1].parent / "shared" / "testvectors" / "wycheproof"
POSIX = pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX-only")


def hashes(n: int, tag: str = "a") -> list[str]:
    """Event hashes of a chain of ``n`` events whose actor is ``tag``."""
    builder = ChainBuilder()
    return [
        builder.next(
            time=float(i),
            actor=tag,
            role="r",
            action="write",
            source_tier="stm",
            target_tier="ltm",
            purpose="treatment",
            outcome="success",
        ).event_hash
        for i in range(n)
    ]


def lookup(chain: list[str]) -> Any:
    """hashes_by_seq for a list of hashes (seq 1 is index 0)."""
    return lambda seq: chain[seq - 1] if 1 <= seq <= len(chain) else None


@pytest.fixture
def signer(tmp_path: Path) -> CheckpointSigner:
    """A signer with a fresh key in a temporary directory."""
    return CheckpointSigner.load_or_create(tmp_path / "keys" / "audit.pem")


@POSIX
def test_key_file_is_created_private_and_reloaded(tmp_path: Path) -> None:
    """The key file is created with mode 0600 and loading it again gives the same key."""
    path = tmp_path / "keys" / "audit.pem"
    first = CheckpointSigner.load_or_create(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    again = CheckpointSigner.load_or_create(path)
    assert again.public_key_bytes == first.public_key_bytes and len(first.public_key_bytes) == 32


@POSIX
def test_key_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    """A key file that group or others can read is refused."""
    path = tmp_path / "audit.pem"
    CheckpointSigner.load_or_create(path)
    path.chmod(0o640)
    with pytest.raises(StoreError, match="chmod 600"):
        CheckpointSigner.load_or_create(path)


def test_wrong_key_files_are_refused(tmp_path: Path) -> None:
    """Garbage and non-Ed25519 keys raise StoreError."""
    garbage = tmp_path / "garbage.pem"
    garbage.write_bytes(b"not a key")
    garbage.chmod(0o600)
    with pytest.raises(StoreError, match="not an unencrypted PEM"):
        CheckpointSigner.load_or_create(garbage)
    other = tmp_path / "ec.pem"
    other.write_bytes(
        ec.generate_private_key(ec.SECP256R1()).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    other.chmod(0o600)
    with pytest.raises(StoreError, match="not an Ed25519 key"):
        CheckpointSigner.load_or_create(other)


def test_signature_covers_every_field(signer: CheckpointSigner, tmp_path: Path) -> None:
    """A checkpoint verifies; changing any signed field or the key breaks it."""
    cp = signer.sign("node-1", 3, "ab" * 32, 1_700_000_000.5)
    assert cp.verify(signer.public_key) and cp.verify(signer.public_key_bytes)
    assert json.loads(cp.message()) == {
        "origin": "node-1",
        "size": 3,
        "head_hash": "ab" * 32,
        "time": 1_700_000_000.5,
    }
    for change in ({"origin": "node-2"}, {"size": 4}, {"head_hash": "cd" * 32}, {"time": 1.0}):
        fields = {f: getattr(cp, f) for f in ("origin", "size", "head_hash", "time", "signature")}
        forged = Checkpoint(**{**fields, **change})
        assert not forged.verify(signer.public_key)
    other = CheckpointSigner.load_or_create(tmp_path / "other.pem")
    assert not cp.verify(other.public_key) and not cp.verify(b"\x00" * 31)


@pytest.mark.parametrize(
    "args",
    [
        ("", 1, "ab" * 32, 0.0),
        ("n", -1, "ab" * 32, 0.0),
        ("n", 1, "AB" * 32, 0.0),
        ("n", 0, "ab" * 32, 0.0),
        ("n", 1, "ab" * 32, float("inf")),
        ("n", True, "ab" * 32, 0.0),
    ],
)
def test_sign_rejects_malformed_fields(signer: CheckpointSigner, args: tuple[Any, ...]) -> None:
    """Empty origin, negative size, bad hash, non-GENESIS empty head, infinite time fail."""
    with pytest.raises(InvalidInput):
        signer.sign(*args)


def test_checkpoint_json_round_trip_and_strictness(signer: CheckpointSigner) -> None:
    """from_json(to_json()) round-trips; extra fields and duplicate keys are refused."""
    cp = signer.sign("node-1", 0, GENESIS, 10.0)
    assert Checkpoint.from_json(cp.to_json()) == cp
    d = json.loads(cp.to_json())
    with pytest.raises(InvalidInput):
        Checkpoint.from_json(json.dumps({**d, "extra": 1}))
    with pytest.raises(CanonicalJSONError, match="duplicate"):
        Checkpoint.from_json(cp.to_json()[:-1] + b',"size":0}')


def test_log_appends_and_reads_back(tmp_path: Path, signer: CheckpointSigner) -> None:
    """The log returns checkpoints in order; a missing log is empty."""
    log = CheckpointLog(tmp_path / "checkpoints.jsonl")
    assert log.all() == [] and log.latest() is None
    chain = hashes(5)
    cps = [signer.sign("n", size, chain[size - 1], float(size)) for size in (2, 2, 5)]
    for cp in cps:
        log.append(cp)
    assert log.all() == cps and log.latest() == cps[-1]
    assert log.path.read_bytes().count(b"\n") == 3


def test_log_refuses_shrinking_or_forked_heads(tmp_path: Path, signer: CheckpointSigner) -> None:
    """Appending a smaller size or another head at the same size raises AuditChainBroken."""
    log = CheckpointLog(tmp_path / "checkpoints.jsonl")
    chain = hashes(5)
    log.append(signer.sign("n", 5, chain[4], 1.0))
    with pytest.raises(AuditChainBroken) as info:
        log.append(signer.sign("n", 3, chain[2], 2.0))
    assert info.value.seq == 4
    with pytest.raises(AuditChainBroken) as info:
        log.append(signer.sign("n", 5, chain[3], 2.0))
    assert info.value.seq == 5
    log.append(signer.sign("other-node", 1, chain[0], 3.0))
    assert len(log.all()) == 2


def test_torn_last_line_is_ignored_and_cut_off(
    tmp_path: Path, signer: CheckpointSigner, caplog: pytest.LogCaptureFixture
) -> None:
    """A last line without its newline (an interrupted append, never acknowledged) is left out
    with a warning naming it, and the next append cuts it off: the log is whole again."""
    log = CheckpointLog(tmp_path / "checkpoints.jsonl")
    first = signer.sign("n", 0, GENESIS, 1.0)
    log.append(first)
    with log.path.open("ab") as handle:
        handle.write(b'{"origin"')
    with caplog.at_level("WARNING", logger="msm_mem"):
        assert log.all() == [first]
    assert "line 2 is incomplete" in caplog.text
    second = signer.sign("n", 0, GENESIS, 2.0)
    log.append(second)
    assert log.all() == [first, second]
    assert log.path.read_bytes() == first.to_json() + b"\n" + second.to_json() + b"\n"


@pytest.mark.parametrize(("tail", "match"), [(b"\n", "line 2"), (b'{"a":1 }\n', "line 2")])
def test_log_reading_is_strict(tmp_path: Path, signer: CheckpointSigner, tail: bytes, match: str) -> None:
    """An empty line or a non-checkpoint line is refused with its number."""
    log = CheckpointLog(tmp_path / "checkpoints.jsonl")
    log.append(signer.sign("n", 0, GENESIS, 1.0))
    with log.path.open("ab") as handle:
        handle.write(tail)
    with pytest.raises((CanonicalJSONError, InvalidInput), match=match):
        log.all()


def test_log_refuses_non_canonical_lines(tmp_path: Path, signer: CheckpointSigner) -> None:
    """A valid checkpoint written with extra whitespace is not accepted."""
    path = tmp_path / "checkpoints.jsonl"
    cp = signer.sign("n", 0, GENESIS, 1.0)
    path.write_bytes(json.dumps(json.loads(cp.to_json())).encode() + b"\n")
    with pytest.raises(CanonicalJSONError, match="line 1: not in canonical form"):
        CheckpointLog(path).all()


def test_intact_chain_matches_checkpoints(signer: CheckpointSigner) -> None:
    """An intact chain verifies against checkpoints; count is the largest checkpoint size."""
    chain = hashes(10)
    cps = [signer.sign("n", 0, GENESIS, 0.0)]
    cps += [signer.sign("n", s, chain[s - 1], float(s)) for s in (3, 7, 7)]
    result = verify_against_checkpoints(cps, signer.public_key, lookup(chain), 10)
    assert (result.ok, result.count, result.head_hash) == (True, 7, chain[6])
    empty = verify_against_checkpoints([], signer.public_key, lookup(chain), 10)
    assert (empty.ok, empty.count, empty.head_hash) == (True, 0, GENESIS)


def test_truncated_tail_is_detected(signer: CheckpointSigner) -> None:
    """A chain shorter than a checkpoint names chain_size + 1 as the first bad seq."""
    chain = hashes(10)
    cps = [signer.sign("n", s, chain[s - 1], float(s)) for s in (3, 10)]
    result = verify_against_checkpoints(cps, signer.public_key, lookup(chain[:8]), 8)
    assert (result.ok, result.first_bad_seq, result.count) == (False, 9, 3)
    assert "truncated" in result.reason


def test_recomputed_chain_is_detected(signer: CheckpointSigner) -> None:
    """A chain rewritten from event 5 and re-hashed fails at the first checkpoint after it."""
    chain = hashes(10)
    cps = [signer.sign("n", s, chain[s - 1], float(s)) for s in (3, 7, 10)]
    forged = chain[:4] + hashes(10, tag="b")[4:]
    result = verify_against_checkpoints(cps, signer.public_key, lookup(forged), 10)
    assert (result.ok, result.first_bad_seq, result.count) == (False, 7, 3)
    assert "4..7" in result.reason


def test_bad_signature_decreasing_and_conflicting_checkpoints(signer: CheckpointSigner) -> None:
    """Forged signatures, shrinking sizes and forks among checkpoints are reported (no seq)."""
    chain = hashes(10)
    good = signer.sign("n", 5, chain[4], 1.0)
    fields = {f: getattr(good, f) for f in ("origin", "size", "head_hash", "time")}
    forged = Checkpoint(**fields, signature="00" * 64)
    cases = [
        ([forged], "bad signature"),
        ([good, signer.sign("n", 3, chain[2], 2.0)], "size decreased"),
        ([good, signer.sign("n", 5, chain[3], 2.0)], "conflicts"),
        ([good, signer.sign("m", 6, chain[5], 2.0)], "origin"),
    ]
    for cps, reason in cases:
        result = verify_against_checkpoints(cps, signer.public_key, lookup(chain), 10)
        assert not result.ok and result.first_bad_seq is None and reason in result.reason


def test_origin_filter_skips_other_chains(signer: CheckpointSigner) -> None:
    """With origin given, checkpoints of other chains in the same log are ignored."""
    chain, other = hashes(4), hashes(9, tag="z")
    cps = [signer.sign("m", 9, other[8], 1.0), signer.sign("n", 4, chain[3], 1.0)]
    result = verify_against_checkpoints(cps, signer.public_key, lookup(chain), 4, origin="n")
    assert result.ok and result.count == 4


@pytest.mark.shared
def test_ed25519_wycheproof_vectors() -> None:
    """ed25519_verify accepts every valid and rejects every invalid Wycheproof vector."""
    path = WYCHEPROOF / "ed25519_test.json"
    if not path.is_file():
        pytest.skip("../shared/testvectors/wycheproof absent")
    data = json.loads(path.read_text())
    seen = 0
    for group in data["testGroups"]:
        key = bytes.fromhex(group["publicKey"]["pk"])
        for case in group["tests"]:
            got = ed25519_verify(key, bytes.fromhex(case["msg"]), bytes.fromhex(case["sig"]))
            assert got is (case["result"] == "valid"), case["tcId"]
            seen += 1
    assert seen == data["numberOfTests"]


def _lanes_checkpoint(signer: CheckpointSigner, **change: Any) -> Checkpoint:
    """A signed checkpoint of chain 1 of a store of three chains, its fields changed by ``change``."""
    fields: dict[str, Any] = {
        "chain": 1,
        "heads": ((3, "aa" * 32), (13, "bb" * 32), (2, GENESIS)),
        "lanes": ((1, (("claims", 2, "cd" * 32), ("episodic", 1, "ef" * 32))),),
    }
    fields.update(change)
    size, head = fields["heads"][fields["chain"]] if "size" not in fields else (fields.pop("size"), "bb" * 32)
    return signer.sign_head("node-1", size, head, 20.0, (1, GENESIS), **fields)


def test_a_checkpoint_of_chains_signs_the_root_of_every_head_and_round_trips(signer: CheckpointSigner) -> None:
    """A checkpoint of one chain of several carries every chain's head and the lanes' row
    digests; they are signed (changing one breaks the signature) and survive the JSON line."""
    cp = _lanes_checkpoint(signer)
    assert cp.verify(signer.public_key) and Checkpoint.from_json(cp.to_json()) == cp
    assert json.loads(cp.message())["heads"] == [[3, "aa" * 32], [13, "bb" * 32], [2, GENESIS]]
    assert cp.root == heads_root(cp.heads or ()) and cp.root != heads_root(((3, "aa" * 32),))
    fields = {f: getattr(cp, f) for f in cp.__slots__}  # type: ignore[attr-defined]
    for change in ({"heads": ((6, "aa" * 32), (13, "bb" * 32), (2, GENESIS))}, {"lanes": ()}):
        assert not Checkpoint(**{**fields, **change}).verify(signer.public_key)


@pytest.mark.parametrize(
    "change",
    [
        {"chain": 3, "size": 13},  # not one of its chains
        {"size": 17},  # the head it names is not its chain's
        {"heads": ((3, "aa" * 32), (14, "bb" * 32), (2, GENESIS))},  # 14 is not a seq of chain 1
        {"lanes": ((5, ()),)},  # not one of its lanes
        {"lanes": ((2, ()), (1, ()))},  # unsorted
    ],
)
def test_a_malformed_checkpoint_of_chains_is_refused(signer: CheckpointSigner, change: dict[str, Any]) -> None:
    """A chain outside the heads, a head not its own, a seq of another residue, an unknown or
    unsorted lane: refused when made or read."""
    with pytest.raises(InvalidInput):
        _lanes_checkpoint(signer, **change)
