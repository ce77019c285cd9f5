"""Tests of msm_mem._governance.keys: KEK providers, key files and the wrapped-key store."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from msm_mem._errors import DecryptionError, InvalidInput, NotFound
from msm_mem._governance.keys import (
    KeyProvider,
    LocalKeyFileProvider,
    WrappedKey,
    WrappedKeyStore,
)
from msm_mem.testing import InMemoryKeyProvider, InMemoryWrappedKeyStore

DEK = bytes(range(32))


@pytest.fixture(params=["memory", "file"])
def provider(request: pytest.FixtureRequest, tmp_path: Path) -> KeyProvider:
    """Every shipped KeyProvider, so the contract tests run on each."""
    if request.param == "memory":
        return InMemoryKeyProvider()
    return LocalKeyFileProvider.create(tmp_path / "kek.json")


def test_providers_satisfy_protocol(provider: KeyProvider) -> None:
    """Both providers are runtime instances of the KeyProvider protocol."""
    assert isinstance(provider, KeyProvider)


def test_wrap_unwrap_roundtrip(provider: KeyProvider) -> None:
    """unwrap(wrap(dek)) gives back the DEK, and the wrap is not the DEK in clear."""
    kek_id, wrapped = provider.wrap(DEK)
    assert kek_id == provider.current_kek_id()
    assert DEK not in wrapped
    assert len(wrapped) == 12 + 32 + 16
    assert provider.unwrap(kek_id, wrapped) == DEK


def test_wrap_uses_fresh_nonce(provider: KeyProvider) -> None:
    """Two wraps of the same DEK differ (random nonce)."""
    assert provider.wrap(DEK)[1] != provider.wrap(DEK)[1]


def test_tampered_wrap_fails(provider: KeyProvider) -> None:
    """Flipping any byte of a wrapped key makes unwrap raise DecryptionError."""
    kek_id, wrapped = provider.wrap(DEK)
    for i in range(len(wrapped)):
        bad = bytearray(wrapped)
        bad[i] ^= 0x01
        with pytest.raises(DecryptionError):
            provider.unwrap(kek_id, bytes(bad))
    with pytest.raises(DecryptionError):
        provider.unwrap(kek_id, wrapped[:20])


def test_aad_binds_kek_id(provider: KeyProvider) -> None:
    """A wrap presented under another KEK id (even one holding the same key) is refused."""
    kek_id, wrapped = provider.wrap(DEK)
    with pytest.raises(DecryptionError):
        provider.unwrap("kek-" + "0" * 32, wrapped)


def test_rotate_keeps_old_keks_until_retired(provider: KeyProvider) -> None:
    """After rotate, old wraps still unwrap; after retire(old) they raise DecryptionError."""
    old_id, old_wrap = provider.wrap(DEK)
    new_id = provider.rotate()
    assert new_id != old_id and provider.current_kek_id() == new_id
    assert provider.wrap(DEK)[0] == new_id
    assert provider.unwrap(old_id, old_wrap) == DEK
    provider.retire(old_id)
    with pytest.raises(DecryptionError):
        provider.unwrap(old_id, old_wrap)


def test_retire_refuses_current_and_unknown(provider: KeyProvider) -> None:
    """Retiring the current KEK is InvalidInput; an unknown one is NotFound."""
    with pytest.raises(InvalidInput):
        provider.retire(provider.current_kek_id())
    with pytest.raises(NotFound):
        provider.retire("kek-" + "1" * 32)


def test_wrap_refuses_empty_dek(provider: KeyProvider) -> None:
    """An empty data key is refused."""
    with pytest.raises(InvalidInput):
        provider.wrap(b"")


def test_key_file_created_with_mode_0600(tmp_path: Path) -> None:
    """create() writes a 0600 file holding valid JSON with the current KEK."""
    path = tmp_path / "kek.json"
    prov = LocalKeyFileProvider.create(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    doc = json.loads(path.read_text())
    assert doc["current"] == prov.current_kek_id()
    assert list(doc["keys"]) == [prov.current_kek_id()]


def test_key_file_mode_ignores_permissive_umask(tmp_path: Path) -> None:
    """Even with umask 0, the created key file is 0600."""
    old = os.umask(0)
    try:
        LocalKeyFileProvider.create(tmp_path / "kek.json")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "kek.json").stat().st_mode) == 0o600


def test_create_refuses_to_overwrite(tmp_path: Path) -> None:
    """create() on an existing path raises InvalidInput and leaves the file unchanged."""
    path = tmp_path / "kek.json"
    LocalKeyFileProvider.create(path)
    before = path.read_bytes()
    with pytest.raises(InvalidInput, match="already exists"):
        LocalKeyFileProvider.create(path)
    assert path.read_bytes() == before


def test_reopen_unwraps(tmp_path: Path) -> None:
    """A key file reopened by another instance unwraps what the first wrapped."""
    path = tmp_path / "kek.json"
    kek_id, wrapped = LocalKeyFileProvider.create(path).wrap(DEK)
    assert LocalKeyFileProvider.open(path).unwrap(kek_id, wrapped) == DEK


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644, 0o666, 0o610])
def test_open_refuses_group_or_other_access(tmp_path: Path, mode: int) -> None:
    """A key file with any group/other permission bit is refused."""
    path = tmp_path / "kek.json"
    LocalKeyFileProvider.create(path)
    path.chmod(mode)
    with pytest.raises(InvalidInput, match="group or others"):
        LocalKeyFileProvider.open(path)


def test_open_accepts_0400(tmp_path: Path) -> None:
    """A read-only owner-only key file opens."""
    path = tmp_path / "kek.json"
    LocalKeyFileProvider.create(path)
    path.chmod(0o400)
    assert LocalKeyFileProvider.open(path).current_kek_id()


def test_open_refuses_missing_and_symlink(tmp_path: Path) -> None:
    """A missing file and a symbolic link are refused with InvalidInput."""
    with pytest.raises(InvalidInput, match="does not exist"):
        LocalKeyFileProvider.open(tmp_path / "nope.json")
    real = tmp_path / "kek.json"
    LocalKeyFileProvider.create(real)
    link = tmp_path / "link.json"
    link.symlink_to(real)
    with pytest.raises(InvalidInput):
        LocalKeyFileProvider.open(link)


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


GOOD_ID = "kek-" + "a" * 32
GOOD_KEY = "A" * 43 + "="  # 32 zero bytes in base64


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        "[]",
        json.dumps({"version": 1, "current": GOOD_ID}),
        json.dumps({"version": 2, "current": GOOD_ID, "keys": {GOOD_ID: GOOD_KEY}}),
        json.dumps({"version": 1, "current": GOOD_ID, "keys": {}}),
        json.dumps({"version": 1, "current": "kek-x", "keys": {GOOD_ID: GOOD_KEY}}),
        json.dumps({"version": 1, "current": GOOD_ID, "keys": {GOOD_ID: "AAAA"}}),
        json.dumps({"version": 1, "current": GOOD_ID, "keys": {GOOD_ID: "!!notb64"}}),
        json.dumps({"version": 1, "current": "x", "keys": {"x": GOOD_KEY}}),
        json.dumps({"version": 1, "current": GOOD_ID, "keys": {GOOD_ID: GOOD_KEY}, "x": 1}),
    ],
)
def test_open_validates_content(tmp_path: Path, content: str) -> None:
    """Malformed key-file JSON raises InvalidInput."""
    path = tmp_path / "kek.json"
    _write_private(path, content)
    with pytest.raises(InvalidInput):
        LocalKeyFileProvider.open(path)


def test_open_accepts_hand_written_valid_file(tmp_path: Path) -> None:
    """A well-formed file written by hand opens and names its current KEK."""
    path = tmp_path / "kek.json"
    _write_private(path, json.dumps({"version": 1, "current": GOOD_ID, "keys": {GOOD_ID: GOOD_KEY}}))
    assert LocalKeyFileProvider.open(path).current_kek_id() == GOOD_ID


def test_rotation_persists_atomically(tmp_path: Path) -> None:
    """rotate/retire rewrite the file (still 0600, no temporary left) and survive a reopen."""
    path = tmp_path / "kek.json"
    prov = LocalKeyFileProvider.create(path)
    old_id, old_wrap = prov.wrap(DEK)
    new_id = prov.rotate()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kek.json"]
    reopened = LocalKeyFileProvider.open(path)
    assert reopened.current_kek_id() == new_id
    assert reopened.unwrap(old_id, old_wrap) == DEK
    prov.retire(old_id)
    again = LocalKeyFileProvider.open(path)
    assert list(json.loads(path.read_text())["keys"]) == [new_id]
    with pytest.raises(DecryptionError):
        again.unwrap(old_id, old_wrap)


def test_failed_persist_leaves_state_unchanged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """If the rename fails, rotate raises, the provider keeps its KEK and no temp file stays."""
    path = tmp_path / "kek.json"
    prov = LocalKeyFileProvider.create(path)
    before, content = prov.current_kek_id(), path.read_bytes()

    def broken_replace(src: object, dst: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        prov.rotate()
    monkeypatch.undo()
    assert prov.current_kek_id() == before
    assert path.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kek.json"]


def _key(patient: str, key_id: str = "K-1", wrapped: bytes = b"w") -> WrappedKey:
    return WrappedKey(key_id, patient, "kek-1", wrapped, 1.0)


def test_store_put_get_replace() -> None:
    """put inserts, get/get_by_id find it, a second put for the patient replaces it."""
    store = InMemoryWrappedKeyStore()
    assert isinstance(store, WrappedKeyStore)
    assert store.get("p") is None and store.get_by_id("K-1") is None
    store.put(_key("p"))
    assert store.get("p") == _key("p") and store.get_by_id("K-1") == _key("p")
    store.put(_key("p", "K-2", b"v"))
    assert store.get("p") == _key("p", "K-2", b"v")
    assert store.get_by_id("K-1") is None
    assert store.all() == [_key("p", "K-2", b"v")]


def test_store_shred_keeps_tombstone() -> None:
    """shred destroys the wrapped bytes of one patient only and keeps a tombstone."""
    store = InMemoryWrappedKeyStore()
    store.put(_key("p", "K-1"))
    store.put(_key("q", "K-2"))
    store.shred("p")
    tomb = store.get("p")
    assert tomb is not None and tomb.shredded and tomb.wrapped == b"" and tomb.key_id == "K-1"
    assert store.get("q") == _key("q", "K-2")
    store.shred("absent")  # no-op
    assert len(store.all()) == 2


def test_wrapped_key_is_frozen() -> None:
    """WrappedKey is immutable."""
    with pytest.raises(AttributeError):
        _key("p").shredded = True  # type: ignore[misc]


def test_two_handles_on_one_key_file_see_each_others_rotations(tmp_path: Path) -> None:
    """A rotation by one process (a service worker) is read by another: it unwraps keys under
    the new KEK, and its own rotation keeps the other's KEK in the file."""
    path = tmp_path / "kek.json"
    first = LocalKeyFileProvider.create(path)
    second = LocalKeyFileProvider.open(path)
    new = first.rotate()
    kek_id, wrapped = first.wrap(b"k" * 32)
    assert kek_id == new and second.unwrap(kek_id, wrapped) == b"k" * 32
    second.rotate()
    assert LocalKeyFileProvider.open(path).unwrap(kek_id, wrapped) == b"k" * 32
