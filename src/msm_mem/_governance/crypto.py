"""Envelope encryption of PHI fields with per-patient data keys and crypto-shredding.

Each patient gets one random 256-bit data key (DEK) on first use. A field is encrypted with
AES-256-GCM under that DEK, a fresh random 96-bit nonce and associated data (AAD) that binds
the ciphertext to where it lives: tenant, table, record id, field name and key id. The AAD
holds no PHI (in particular not the patient reference). A ciphertext copied to another record,
field, table or tenant therefore fails authentication, and one presented for another patient
fails because its key belongs to someone else.

Tokens are ASCII and self-describing::

    enc1:<key_id>:<base64url(nonce || ciphertext || tag), unpadded>

The DEK is stored wrapped by a :class:`~msm_mem._governance.keys.KeyProvider` in a
:class:`~msm_mem._governance.keys.WrappedKeyStore`. Shredding a patient destroys the wrapped
DEK (a tombstone remains): every token of that patient then raises DecryptionError, and no new
data can be encrypted for that patient (AccessDenied).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import functools
import hashlib
import hmac
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .._errors import AccessDenied, DecryptionError, InvalidInput, NotFound
from .._records import new_id
from .aead import _NONCE_BYTES, _TAG_BYTES, _check_key_nonce, aes_gcm_decrypt, aes_gcm_encrypt
from .keys import KeyProvider, WrappedKey, WrappedKeyStore

__all__ = ["EnvelopeCipher", "aes_gcm_decrypt", "aes_gcm_encrypt", "is_token"]

TOKEN_PREFIX = "enc1"
_DEK_BYTES = 32
_AAD_DOMAIN = b"msm-mem/field/enc1\x00"
_TOKEN = re.compile(r"\Aenc1:(K-[0-9a-f]{32}):([A-Za-z0-9_-]+)\Z")


def is_token(s: object) -> bool:
    """True when ``s`` has the shape of a field token (``enc1:<key_id>:<payload>``)."""
    return isinstance(s, str) and _TOKEN.match(s) is not None


@functools.lru_cache(maxsize=16384)
def _prefixed(part: str) -> bytes:
    """``part`` as UTF-8 after its 4-byte big-endian length (tenants, tables, fields and key
    ids repeat: cached)."""
    raw = part.encode("utf-8")
    return len(raw).to_bytes(4, "big") + raw


def _field_aad(tenant: str, table: str, record_id: str, field: str, key_id: str) -> bytes:
    """Length-prefixed (4-byte big-endian) UTF-8 parts: unambiguous, and free of PHI."""
    rid = record_id.encode("utf-8")
    return b"".join(
        (
            _AAD_DOMAIN,
            _prefixed(tenant),
            _prefixed(table),
            len(rid).to_bytes(4, "big"),
            rid,
            _prefixed(field),
            _prefixed(key_id),
        )
    )


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


_B64URL_VALUE = {c: i for i, c in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")}
_TO_STANDARD = bytes.maketrans(b"-_", b"+/")
#: bits of the last character that encode nothing, by ``len(text) % 4``: they must be zero
_UNUSED_BITS = {0: 0, 2: 0b1111, 3: 0b11}


def _unb64url(text: str) -> bytes:
    """Strict decoding: only the unpadded base64url alphabet, and a payload whose unused
    trailing bits are set is refused (malleable): exactly the inverse of :func:`_b64url`.
    ValueError otherwise. Checked directly rather than by encoding the result again (every
    field a read decrypts comes through here)."""
    raw = text.encode("ascii")  # UnicodeEncodeError is a ValueError
    if b"+" in raw or b"/" in raw or b"=" in raw:  # the standard alphabet's, and padding
        raise ValueError("not base64url")
    rest = len(raw) % 4
    if rest == 1 or (rest and _B64URL_VALUE.get(text[-1], 0) & _UNUSED_BITS[rest]):
        raise ValueError("non-canonical base64url")
    # strict: any character outside the alphabet is refused
    return binascii.a2b_base64(raw.translate(_TO_STANDARD) + b"=" * (-rest % 4), strict_mode=True)


def _check_str(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidInput(f"{name} must be a str, got {type(value).__name__}")
    return value


class EnvelopeCipher:
    """Encrypts and decrypts PHI fields of one tenant with per-patient data keys.

    ``clock`` returns UTC seconds (default ``time.time``) and stamps new keys. Unwrapped DEKs
    are cached in a bounded LRU of ``cache_size`` entries to spare the provider (a KMS call per
    field otherwise); the store is still consulted on every call, so a key shredded through
    another instance is refused at once. Thread-safe.
    """

    def __init__(
        self,
        tenant: str,
        provider: KeyProvider,
        store: WrappedKeyStore,
        clock: Callable[[], float] | None = None,
        *,
        cache_size: int = 1024,
    ) -> None:
        if not isinstance(tenant, str) or not tenant:
            raise InvalidInput("tenant must be a non-empty str")
        if cache_size < 0:
            raise InvalidInput("cache_size must be >= 0")
        self.tenant = tenant
        self._provider = provider
        self._store = store
        self._clock = clock or time.time
        self._cache_size = cache_size
        self._cache: OrderedDict[str, bytes] = OrderedDict()
        #: AES-GCM contexts of cached DEKs (building one runs the key schedule)
        self._contexts: dict[str, AESGCM] = {}
        self._lock = threading.RLock()
        self._tomb_key: bytes | None = None

    # -- shredded patients -------------------------------------------------------------------

    def use_tomb_key(self, key: bytes) -> None:
        """The secret (at least 32 bytes, kept outside the store) of :meth:`tomb_ref`: with it a
        shredded patient's key row keeps a keyed digest of the patient id, never the id."""
        if type(key) is not bytes or len(key) < 32:
            raise InvalidInput("the tombstone key must be at least 32 bytes")
        self._tomb_key = key

    def tomb_ref(self, patient_ref: str) -> str | None:
        """What a shredded patient's key row keeps instead of ``patient_ref``: ``shredded-``
        and 128 bits of HMAC-SHA256 under the tombstone key (None without one: the row keeps
        the reference itself). Nobody without the key can tell whose it is."""
        if self._tomb_key is None:
            return None
        digest = hmac.new(self._tomb_key, patient_ref.encode("utf-8", "surrogatepass"), hashlib.sha256)
        return "shredded-" + digest.hexdigest()[:32]

    def _tombstone(self, patient_ref: str) -> WrappedKey | None:
        ref = self.tomb_ref(patient_ref)
        key = self._store.get(ref) if ref is not None else None
        return key if key is not None and key.shredded else None

    def is_shredded(self, patient_ref: str) -> bool:
        """Whether the patient's data key was shredded (a tombstone under the patient reference
        or under its :meth:`tomb_ref`)."""
        key = self._store.get(patient_ref)
        if key is not None:
            return key.shredded
        return self._tombstone(patient_ref) is not None

    # -- cache -------------------------------------------------------------------------------

    def _cache_get(self, key_id: str) -> bytes | None:
        with self._lock:
            dek = self._cache.get(key_id)
            if dek is not None:
                self._cache.move_to_end(key_id)
            return dek

    def _cache_put(self, key_id: str, dek: bytes) -> None:
        if self._cache_size == 0:
            return
        with self._lock:
            self._cache[key_id] = dek
            self._cache.move_to_end(key_id)
            while len(self._cache) > self._cache_size:
                evicted, _ = self._cache.popitem(last=False)
                self._contexts.pop(evicted, None)

    def cached_key_ids(self) -> list[str]:
        """Key ids whose unwrapped DEK is cached now, least recently used first (for tests)."""
        with self._lock:
            return list(self._cache)

    # -- keys --------------------------------------------------------------------------------

    def _dek_for(self, key: WrappedKey) -> bytes:
        dek = self._cache_get(key.key_id)
        if dek is None:
            dek = self._provider.unwrap(key.kek_id, key.wrapped)
            self._cache_put(key.key_id, dek)
        return dek

    def _aead(self, key: WrappedKey) -> AESGCM:
        """The AES-GCM context of a live key's DEK: unwrapped once, then kept while the DEK
        is cached (building a context runs the key schedule)."""
        ctx = self._contexts.get(key.key_id)
        if ctx is not None:
            try:
                self._cache.move_to_end(key.key_id)  # recency; one atomic call, no lock needed
            except KeyError:  # evicted meanwhile: the context goes at the next miss
                pass
            return ctx
        dek = self._dek_for(key)
        _check_key_nonce(dek, bytes(_NONCE_BYTES))
        ctx = AESGCM(dek)
        with self._lock:
            if key.key_id in self._cache:
                self._contexts[key.key_id] = ctx
        return ctx

    def _key_for_encrypt(self, patient_ref: str) -> tuple[str, AESGCM]:
        key = self._store.get(patient_ref)
        if key is not None and not key.shredded:
            return key.key_id, self._aead(key)
        with self._lock:  # one DEK per patient even when two threads race on first use
            key = self._store.get(patient_ref)
            if key is not None:
                if key.shredded:
                    raise AccessDenied("the patient's data key was shredded; cannot encrypt")
                return key.key_id, self._aead(key)
            if self._tombstone(patient_ref) is not None:
                raise AccessDenied("the patient's data key was shredded; cannot encrypt")
            dek = os.urandom(_DEK_BYTES)
            kek_id, wrapped = self._provider.wrap(dek)
            key = WrappedKey(new_id("K"), patient_ref, kek_id, wrapped, float(self._clock()))
            self._store.put(key)
            stored = self._store.get(patient_ref)
            if stored is not None and stored.key_id != key.key_id:  # another process stored one first
                if stored.shredded:
                    raise AccessDenied("the patient's data key was shredded; cannot encrypt")
                return stored.key_id, self._aead(stored)
            self._cache_put(key.key_id, dek)
            return key.key_id, self._aead(key)

    # -- fields ------------------------------------------------------------------------------

    def encrypt_field(self, patient_ref: str, table: str, record_id: str, field: str, plaintext: str) -> str:
        """Encrypt ``plaintext`` for one field of one record; return an ASCII ``enc1:`` token.

        The patient's DEK is created on first use. AccessDenied if the patient was shredded;
        InvalidInput if an argument is not a str or the text is not encodable as UTF-8.
        """
        if not all(type(v) is str for v in (patient_ref, table, record_id, field, plaintext)):
            for name, value in (
                ("patient_ref", patient_ref),
                ("table", table),
                ("record_id", record_id),
                ("field", field),
                ("plaintext", plaintext),
            ):
                _check_str(name, value)
        try:
            data = plaintext.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidInput("plaintext is not encodable as UTF-8") from exc
        key_id, aead = self._key_for_encrypt(patient_ref)
        nonce = os.urandom(_NONCE_BYTES)
        sealed = aead.encrypt(nonce, data, _field_aad(self.tenant, table, record_id, field, key_id))
        return f"{TOKEN_PREFIX}:{key_id}:{_b64url(nonce + sealed)}"

    def decrypt_field(self, patient_ref: str, table: str, record_id: str, field: str, token: str) -> str:
        """Decrypt a token made by :meth:`encrypt_field` for exactly this place and patient.

        DecryptionError when the token is malformed, its key is missing, shredded or belongs
        to another patient, or authentication fails (the token was moved to another record,
        field, table or tenant, or altered).
        """
        match = _TOKEN.match(token) if isinstance(token, str) else None
        if match is None:
            raise DecryptionError("not an enc1 token")
        key_id, payload = match.groups()
        try:
            blob = _unb64url(payload)
        except (binascii.Error, ValueError) as exc:
            raise DecryptionError("token payload is not base64url") from exc
        if len(blob) < _NONCE_BYTES + _TAG_BYTES:
            raise DecryptionError("token payload too short")
        # the patient's own key first (found by the patient, a read of one shard on a cluster);
        # any other key id is looked up as itself, and the checks below refuse it as before
        key = self._store.get(patient_ref)
        if key is None or key.key_id != key_id:
            key = self._store.get_by_id(key_id)
        if key is None:
            raise DecryptionError("unknown data key")
        if key.shredded:
            raise DecryptionError("data key was shredded")
        if key.patient_ref != patient_ref:
            raise DecryptionError("token does not belong to this patient")
        aad = _field_aad(self.tenant, table, record_id, field, key_id)
        try:
            data = self._aead(key).decrypt(blob[:_NONCE_BYTES], blob[_NONCE_BYTES:], aad)
        except InvalidTag as exc:
            raise DecryptionError("authentication failed") from exc
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:  # only reachable with a forged, authenticated blob
            raise DecryptionError("plaintext is not UTF-8") from exc

    # -- maintenance -------------------------------------------------------------------------

    def rewrap_all(self) -> list[WrappedKey]:
        """Rotate the provider's KEK and return every live DEK rewrapped under it, unstored.

        The caller stores them (with the audit event of the rotation, in one transaction) and
        then calls :meth:`rotated`. Until then the old KEK still unwraps the stored keys, so a
        failure before the commit loses nothing. Each rewrap is unwrapped again before it is
        returned, so a faulty provider cannot lose a key."""
        with self._lock:
            new_kek = self._provider.rotate()
            out: list[WrappedKey] = []
            for key in self._store.all():
                if key.shredded or key.kek_id == new_kek:
                    continue
                dek = self._provider.unwrap(key.kek_id, key.wrapped)
                kek_id, wrapped = self._provider.wrap(dek)
                if self._provider.unwrap(kek_id, wrapped) != dek:
                    raise DecryptionError("key provider returned a wrap that does not unwrap")
                out.append(replace(key, kek_id=kek_id, wrapped=wrapped))
            return out

    def rotated(self) -> None:
        """Forget the cached data keys and contexts after rewrapped keys were stored."""
        with self._lock:
            self._cache.clear()
            self._contexts.clear()

    def retire_unused(self) -> list[str]:
        """Retire the provider's non-current KEKs that no live stored data key is wrapped under
        (those of rotations that committed, or that a crash interrupted before the commit);
        returns their ids. A provider that does not list its KEKs (``kek_ids``) is left alone."""
        kek_ids = getattr(self._provider, "kek_ids", None)
        if not callable(kek_ids):
            return []
        with self._lock:
            current = self._provider.current_kek_id()
            used = {k.kek_id for k in self._store.all() if not k.shredded}
            unused = [k for k in kek_ids() if k != current and k not in used]
            for kek_id in unused:
                with contextlib.suppress(NotFound):  # another process retired it first
                    self._provider.retire(kek_id)
            return unused

    def rotate_kek(self) -> int:
        """Rotate the KEK and store every live DEK rewrapped under it (each key written on its
        own); return how many. The governed API stores them with its audit event instead."""
        keys = self.rewrap_all()
        for key in keys:
            self._store.put(key)
        self.rotated()
        return len(keys)

    def shred(self, patient_ref: str) -> None:
        """Crypto-shred ``patient_ref``: destroy its wrapped DEK and drop it from the cache.

        Afterwards every token of that patient raises DecryptionError and encrypting for it
        raises AccessDenied; other patients are unaffected. Idempotent; a patient without a key
        gets a tombstone so that no key is created for it later.
        """
        _check_str("patient_ref", patient_ref)
        ref = self.tomb_ref(patient_ref)
        with self._lock:
            key = self._store.get(patient_ref)
            if key is None:
                gone = self._tombstone(patient_ref)
                if gone is not None:  # shredded already (in the transaction of an erasure)
                    self._cache.pop(gone.key_id, None)
                    self._contexts.pop(gone.key_id, None)
                    return
                tomb = WrappedKey(new_id("K"), ref or patient_ref, "", b"", float(self._clock()), True)
                self._store.put(tomb)
                stored = self._store.get(patient_ref)
                if stored is None or stored.shredded:
                    return
                key = stored  # another process made the patient's first key meanwhile: shred it
            self._store.shred(patient_ref, ref)
            self._cache.pop(key.key_id, None)
            self._contexts.pop(key.key_id, None)
