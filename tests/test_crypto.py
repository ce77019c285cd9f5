"""Tests of msm_mem._governance.crypto: AES-GCM primitives and per-patient envelope encryption."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from msm_mem._errors import AccessDenied, DecryptionError, InvalidInput
from msm_mem._governance.crypto import (
    EnvelopeCipher,
    aes_gcm_decrypt,
    aes_gcm_encrypt,
    is_token,
)
from msm_mem._governance.keys import KeyProvider, LocalKeyFileProvider
from msm_mem.testing import InMemoryKeyProvider, InMemoryWrappedKeyStore

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
WYCHEPROOF = SHARED / "testvectors" / "wycheproof" / "aes_gcm_test.json"
PLACE = ("episodic", "E-1", "answer")


def make_cipher(
    tenant: str = "t1", provider: KeyProvider | None = None, **kw: Any
) -> tuple[EnvelopeCipher, InMemoryWrappedKeyStore]:
    store = InMemoryWrappedKeyStore()
    return EnvelopeCipher(tenant, provider or InMemoryKeyProvider(), store, lambda: 42.0, **kw), store


# -- Wycheproof -------------------------------------------------------------------------------


def _wycheproof_cases() -> list[Any]:
    """The test cases of groups with 96-bit IVs, 128-bit tags and 16/24/32-byte keys.

    Other groups are skipped: IVs other than 96 bits (0..2056 bits) are legal in GCM but go
    through GHASH to derive the counter block, an option msm-mem never uses (it always draws a
    random 96-bit nonce and aes_gcm_* refuse anything else). All groups in the file use
    128-bit tags, the only tag length used here.
    """
    if not WYCHEPROOF.is_file():
        return [pytest.param(None, marks=pytest.mark.skip(reason="../shared/testvectors absent"))]
    doc = json.loads(WYCHEPROOF.read_text())
    cases = []
    for group in doc["testGroups"]:
        sizes = (group["keySize"], group["ivSize"], group["tagSize"])
        if sizes[0] not in (128, 192, 256) or sizes[1:] != (96, 128):
            continue
        for case in group["tests"]:
            cases.append(pytest.param(case, id=f"tc{case['tcId']}"))
    return cases


@pytest.mark.shared
@pytest.mark.parametrize("case", _wycheproof_cases())
def test_wycheproof_aes_gcm(case: dict[str, Any]) -> None:
    """Valid Wycheproof vectors encrypt to ct||tag and decrypt to msg; invalid ones raise."""
    key, iv = bytes.fromhex(case["key"]), bytes.fromhex(case["iv"])
    aad, msg = bytes.fromhex(case["aad"]), bytes.fromhex(case["msg"])
    sealed = bytes.fromhex(case["ct"]) + bytes.fromhex(case["tag"])
    if case["result"] == "invalid":
        with pytest.raises(DecryptionError):
            aes_gcm_decrypt(key, iv, sealed, aad)
    else:
        assert aes_gcm_decrypt(key, iv, sealed, aad) == msg
        assert aes_gcm_encrypt(key, iv, msg, aad) == sealed


@pytest.mark.shared
def test_wycheproof_selection_is_not_empty() -> None:
    """The selected Wycheproof groups hold both valid and invalid cases."""
    if not WYCHEPROOF.is_file():
        pytest.skip("../shared/testvectors absent")
    results = {c.values[0]["result"] for c in _wycheproof_cases()}
    assert {"valid", "invalid"} <= results


def test_aes_gcm_rejects_bad_sizes() -> None:
    """Keys not 16/24/32 bytes, nonces not 12 bytes and too-short ciphertexts are refused."""
    with pytest.raises(InvalidInput):
        aes_gcm_encrypt(b"k" * 20, b"n" * 12, b"", b"")
    with pytest.raises(InvalidInput):
        aes_gcm_encrypt(b"k" * 32, b"n" * 8, b"", b"")
    with pytest.raises(DecryptionError):
        aes_gcm_decrypt(b"k" * 32, b"n" * 12, b"short", b"")


# -- envelope cipher --------------------------------------------------------------------------


def test_roundtrip_and_token_shape() -> None:
    """A field decrypts back; the token is ASCII enc1:<key_id>:<payload> and is_token accepts it."""
    cipher, store = make_cipher()
    token = cipher.encrypt_field("patient-7", *PLACE, "left lower lobe opacity")
    assert token.isascii() and token.startswith("enc1:K-") and is_token(token)
    assert cipher.decrypt_field("patient-7", *PLACE, token) == "left lower lobe opacity"
    key = store.get("patient-7")
    assert key is not None and token.split(":")[1] == key.key_id
    assert key.created_at == 42.0 and not key.shredded
    assert "patient-7" not in key.key_id


def test_is_token_rejects_other_strings() -> None:
    """is_token is False for plain text, other prefixes, bad key ids and non-strings."""
    for s in [
        "hello",
        "enc2:K-" + "0" * 32 + ":AAAA",
        "enc1:K-1:AAAA",
        "enc1:K-" + "0" * 32,
        "enc1:K-" + "0" * 32 + ":AA=A",
        None,
        5,
    ]:
        assert not is_token(s)


def test_one_dek_per_patient() -> None:
    """Fields of one patient share a key id; another patient gets another key."""
    cipher, store = make_cipher()
    a1 = cipher.encrypt_field("a", *PLACE, "x")
    a2 = cipher.encrypt_field("a", "visual", "V-2", "tag", "y")
    b1 = cipher.encrypt_field("b", *PLACE, "x")
    assert a1.split(":")[1] == a2.split(":")[1] != b1.split(":")[1]
    assert len(store.all()) == 2
    assert a1 != cipher.encrypt_field("a", *PLACE, "x")  # fresh nonce each time


@pytest.mark.parametrize(
    "moved",
    [
        ("t1", "a", "episodic", "E-2", "answer"),  # other record
        ("t1", "a", "episodic", "E-1", "question"),  # other field
        ("t1", "a", "visual", "E-1", "answer"),  # other table
        ("t2", "a", "episodic", "E-1", "answer"),  # other tenant, same key store
        ("t1", "b", "episodic", "E-1", "answer"),  # other patient
        ("t1", "a", "episodi", "cE-1", "answer"),  # same concatenation, other split
    ],
)
def test_moved_ciphertext_fails(moved: tuple[str, str, str, str, str]) -> None:
    """A token presented for another record, field, table, tenant or patient is refused."""
    provider, store = InMemoryKeyProvider(), InMemoryWrappedKeyStore()
    c1 = EnvelopeCipher("t1", provider, store)
    token = c1.encrypt_field("a", "episodic", "E-1", "answer", "secret")
    c1.encrypt_field("b", *PLACE, "other patient's data")
    tenant, patient, table, record, field = moved
    cipher = EnvelopeCipher(tenant, provider, store)
    with pytest.raises(DecryptionError):
        cipher.decrypt_field(patient, table, record, field, token)


def test_tampered_or_malformed_token_fails() -> None:
    """Any altered payload character, unknown key id or malformed token raises DecryptionError."""
    cipher, _ = make_cipher()
    token = cipher.encrypt_field("a", *PLACE, "secret")
    prefix, key_id, payload = token.split(":")
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    for i in range(len(payload)):
        for swapped in alphabet.replace(payload[i], ""):  # incl. changes of unused low bits
            bad = f"{prefix}:{key_id}:{payload[:i]}{swapped}{payload[i + 1 :]}"
            with pytest.raises(DecryptionError):
                cipher.decrypt_field("a", *PLACE, bad)
    for bad in [
        "",
        "secret",
        f"enc1:{key_id}:",
        f"enc1:{key_id}:AAAA",
        f"enc1:K-{'0' * 32}:{payload}",
        f"enc1:{key_id}:{payload[:-1]}~",
        f"enc1:{key_id}:A",
    ]:
        with pytest.raises(DecryptionError):
            cipher.decrypt_field("a", *PLACE, bad)


def test_shred_only_affects_that_patient() -> None:
    """After shred(a), a's tokens fail and encrypt for a is refused; b still decrypts."""
    cipher, store = make_cipher()
    ta = cipher.encrypt_field("a", *PLACE, "alpha")
    tb = cipher.encrypt_field("b", *PLACE, "beta")
    key_a = store.get("a")
    assert key_a is not None and key_a.key_id in cipher.cached_key_ids()
    cipher.shred("a")
    assert key_a.key_id not in cipher.cached_key_ids()
    tomb = store.get("a")
    assert tomb is not None and tomb.shredded and tomb.wrapped == b""
    with pytest.raises(DecryptionError):
        cipher.decrypt_field("a", *PLACE, ta)
    with pytest.raises(AccessDenied):
        cipher.encrypt_field("a", *PLACE, "new")
    assert cipher.decrypt_field("b", *PLACE, tb) == "beta"
    cipher.shred("a")  # idempotent


def test_shred_through_other_instance_is_seen_despite_cache() -> None:
    """A key shredded via another cipher on the same store is refused although it was cached."""
    provider, store = InMemoryKeyProvider(), InMemoryWrappedKeyStore()
    c1, c2 = EnvelopeCipher("t", provider, store), EnvelopeCipher("t", provider, store)
    token = c1.encrypt_field("a", *PLACE, "alpha")
    assert c1.decrypt_field("a", *PLACE, token) == "alpha"
    c2.shred("a")
    with pytest.raises(DecryptionError):
        c1.decrypt_field("a", *PLACE, token)


def test_shred_unknown_patient_leaves_tombstone() -> None:
    """Shredding a patient with no key records a tombstone that blocks later encryption."""
    cipher, store = make_cipher()
    cipher.shred("ghost")
    tomb = store.get("ghost")
    assert tomb is not None and tomb.shredded
    with pytest.raises(AccessDenied):
        cipher.encrypt_field("ghost", *PLACE, "x")


@pytest.mark.parametrize("kind", ["memory", "file"])
def test_rotate_kek_rewraps_everything(kind: str, tmp_path: Path) -> None:
    """rotate_kek rewraps every live DEK; all records decrypt after the old KEK is retired."""
    provider: InMemoryKeyProvider | LocalKeyFileProvider = (
        InMemoryKeyProvider() if kind == "memory" else LocalKeyFileProvider.create(tmp_path / "k")
    )
    cipher, store = make_cipher(provider=provider)
    old_kek = provider.current_kek_id()
    tokens = {f"p{i}": cipher.encrypt_field(f"p{i}", *PLACE, f"text {i}") for i in range(5)}
    cipher.shred("p4")
    assert cipher.rotate_kek() == 4
    assert cipher.cached_key_ids() == []
    new_kek = provider.current_kek_id()
    assert {k.kek_id for k in store.all() if not k.shredded} == {new_kek} != {old_kek}
    provider.retire(old_kek)
    fresh = EnvelopeCipher("t1", provider, store)  # nothing cached
    for i in range(4):
        assert fresh.decrypt_field(f"p{i}", *PLACE, tokens[f"p{i}"]) == f"text {i}"
    with pytest.raises(DecryptionError):
        fresh.decrypt_field("p4", *PLACE, tokens["p4"])
    assert cipher.rotate_kek() == 4  # a second rotation again rewraps all live keys


def test_lru_cache_is_bounded() -> None:
    """The DEK cache never exceeds cache_size and evicts the least recently used key."""
    cipher, store = make_cipher(cache_size=2)
    for p in "abc":
        cipher.encrypt_field(p, *PLACE, p)
    ids = {p: store.get(p).key_id for p in "abc"}  # type: ignore[union-attr]
    assert cipher.cached_key_ids() == [ids["b"], ids["c"]]
    cipher.encrypt_field("b", *PLACE, "again")
    assert cipher.cached_key_ids() == [ids["c"], ids["b"]]
    nocache, _ = make_cipher(cache_size=0)
    token = nocache.encrypt_field("a", *PLACE, "x")
    assert nocache.decrypt_field("a", *PLACE, token) == "x" and nocache.cached_key_ids() == []


def test_invalid_arguments() -> None:
    """Empty tenant, negative cache, non-str fields and lone surrogates are InvalidInput."""
    with pytest.raises(InvalidInput):
        EnvelopeCipher("", InMemoryKeyProvider(), InMemoryWrappedKeyStore())
    with pytest.raises(InvalidInput):
        make_cipher(cache_size=-1)
    cipher, _ = make_cipher()
    with pytest.raises(InvalidInput):
        cipher.encrypt_field("a", *PLACE, 5)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        cipher.encrypt_field("a", *PLACE, "\ud800")


CIPHER, _STORE = make_cipher()
patients = st.text(min_size=8, max_size=40)


@settings(max_examples=200, deadline=None)
@given(
    plaintext=st.text(),
    patient=st.text(max_size=40),
    record=st.text(max_size=20),
    field=st.text(max_size=20),
)
def test_roundtrip_property(plaintext: str, patient: str, record: str, field: str) -> None:
    """Any text (empty, non-BMP) round-trips for any patient, record and field name."""
    token = CIPHER.encrypt_field(patient, "t", record, field, plaintext)
    assert token.isascii() and is_token(token)
    assert CIPHER.decrypt_field(patient, "t", record, field, token) == plaintext


@settings(max_examples=200, deadline=None)
@given(plaintext=st.text(min_size=8), patient=patients)
def test_token_never_contains_plaintext_or_patient(plaintext: str, patient: str) -> None:
    """Neither the plaintext nor the patient reference appears in the token."""
    token = CIPHER.encrypt_field(patient, *PLACE, plaintext)
    assert plaintext not in token
    assert patient not in token


def test_non_bmp_roundtrip() -> None:
    """Astral-plane characters and the empty string round-trip exactly."""
    cipher, _ = make_cipher()
    for text in ["", "\U0001f9ec pneumonia \U00020000", "é\u0301"]:
        assert cipher.decrypt_field("p", *PLACE, cipher.encrypt_field("p", *PLACE, text)) == text


def test_evicted_keys_still_work_and_contexts_follow_the_cache() -> None:
    """AES-GCM contexts are kept only for cached DEKs; an evicted key is unwrapped again and
    its tokens still decrypt; shredding drops its context."""
    cipher, store = make_cipher(cache_size=2)
    tokens = {p: cipher.encrypt_field(p, *PLACE, f"text {p}") for p in "abcd"}
    assert set(cipher._contexts) <= set(cipher.cached_key_ids()) and len(cipher.cached_key_ids()) == 2
    assert [cipher.decrypt_field(p, *PLACE, tokens[p]) for p in "abcd"] == [f"text {p}" for p in "abcd"]
    assert set(cipher._contexts) <= set(cipher.cached_key_ids())
    cipher.shred("d")
    assert store.get("d").key_id not in cipher._contexts  # type: ignore[union-attr]
    with pytest.raises(DecryptionError):
        cipher.decrypt_field("d", *PLACE, tokens["d"])
    with pytest.raises(AccessDenied):
        cipher.encrypt_field("d", *PLACE, "more")
