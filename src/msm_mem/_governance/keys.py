"""Key-encryption keys (KEKs) and the store of wrapped per-patient data keys.

Envelope encryption has two layers. Each patient's PHI is encrypted under a random 256-bit data
key (DEK, see :mod:`msm_mem._governance.crypto`); the DEK itself is stored only *wrapped*
(encrypted) under a key-encryption key held by a :class:`KeyProvider`. Rotating the KEK rewraps
the small DEKs and never touches the records; shredding a patient destroys the wrapped DEK so
every ciphertext of that patient becomes unreadable (crypto-shredding).

Providers shipped here:

* :class:`LocalKeyFileProvider`: KEKs in a JSON key file with mode ``0600``, rotated atomically.
* :class:`msm_mem.testing.InMemoryKeyProvider` (with an in-memory :class:`WrappedKeyStore`):
  KEKs in process memory, for tests and examples.

A HashiCorp Vault transit engine or a cloud KMS implements the same protocol: ``wrap`` and
``unwrap`` become the service's encrypt/decrypt calls (the KEK never leaves the service),
``rotate`` its key-rotation call and ``retire`` its minimum-decryption-version setting.

Errors: a key file that is not a regular file, is readable or writable by group/other, or holds
malformed JSON raises :class:`~msm_mem._errors.InvalidInput` (a file from outside that fails
validation; nothing is read from it). A wrapped key that fails authentication or names an
unknown (retired) KEK raises :class:`~msm_mem._errors.DecryptionError`.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import fcntl
import json
import os
import re
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol, runtime_checkable

from .._errors import DecryptionError, InvalidInput, NotFound
from .._private import read_private
from .._tier_records import WrappedKey
from .aead import aes_gcm_decrypt, aes_gcm_encrypt

__all__ = [
    "KekRing",
    "KeyProvider",
    "LocalKeyFileProvider",
    "WrappedKey",
    "WrappedKeyStore",
    "new_kek",
]

_KEY_BYTES = 32  # AES-256
_NONCE_BYTES = 12  # 96-bit GCM nonce
_FILE_VERSION = 1
_KEK_ID = re.compile(r"\Akek-[0-9a-f]{32}\Z")
_WRAP_AAD_PREFIX = b"msm-mem/kek-wrap/v1\x00"


@runtime_checkable
class KeyProvider(Protocol):
    """Holds key-encryption keys and wraps/unwraps data keys under them.

    Invariants: ``unwrap(*wrap(dek)) == dek``; after ``rotate()`` new wraps use the new KEK
    while every older, non-retired KEK still unwraps what it wrapped.
    """

    def current_kek_id(self) -> str:
        """The id of the KEK that ``wrap`` uses now."""
        ...

    def wrap(self, dek: bytes) -> tuple[str, bytes]:
        """Encrypt ``dek`` under the current KEK; return ``(kek_id, wrapped_bytes)``."""
        ...

    def unwrap(self, kek_id: str, wrapped: bytes) -> bytes:
        """Decrypt ``wrapped`` under KEK ``kek_id``; raise DecryptionError on any failure."""
        ...

    def rotate(self) -> str:
        """Create a new current KEK and return its id; old KEKs still unwrap until retired."""
        ...

    def retire(self, kek_id: str) -> None:
        """Destroy a non-current KEK; what it wrapped can no longer be unwrapped."""
        ...


@runtime_checkable
class WrappedKeyStore(Protocol):
    """Persistence of wrapped data keys, at most one per ``patient_ref``."""

    def get(self, patient_ref: str) -> WrappedKey | None:
        """The key (or tombstone) of ``patient_ref``, or None."""
        ...

    def get_by_id(self, key_id: str) -> WrappedKey | None:
        """The key (or tombstone) with ``key_id``, or None."""
        ...

    def put(self, key: WrappedKey) -> None:
        """Insert ``key``, replacing any key of the same ``patient_ref``."""
        ...

    def shred(self, patient_ref: str, tomb_ref: str | None = None) -> None:
        """Destroy the wrapped bytes of ``patient_ref``'s key, keep a tombstone (under
        ``tomb_ref`` instead of the patient reference when given); no-op if absent."""
        ...

    def all(self) -> list[WrappedKey]:
        """Every stored key and tombstone."""
        ...


def _new_kek_id() -> str:
    return f"kek-{uuid.uuid4().hex}"


def new_kek() -> tuple[str, bytes]:
    """A fresh key-encryption key: ``(kek_id, 32 random bytes)``."""
    return _new_kek_id(), os.urandom(_KEY_BYTES)


def _wrap_aad(kek_id: str) -> bytes:
    return _WRAP_AAD_PREFIX + kek_id.encode("ascii")


class KekRing:
    """KEKs by id plus the current one; the wrapping logic shared by the providers."""

    def __init__(self, keks: dict[str, bytes], current: str) -> None:
        self._keks = dict(keks)
        self._current = current
        self._lock = threading.RLock()

    def current_kek_id(self) -> str:
        """The id of the KEK that ``wrap`` uses now."""
        with self._lock:
            return self._current

    def kek_ids(self) -> list[str]:
        """Ids of every KEK still held (current and not yet retired)."""
        with self._lock:
            return list(self._keks)

    def wrap(self, dek: bytes) -> tuple[str, bytes]:
        """AES-256-GCM ``dek`` under the current KEK (random nonce, AAD binds the KEK id).

        Returns ``(kek_id, nonce || ciphertext || tag)``.
        """
        if not isinstance(dek, bytes) or not dek:
            raise InvalidInput("a data key must be non-empty bytes")
        with self._lock:
            kek_id, kek = self._current, self._keks[self._current]
        nonce = os.urandom(_NONCE_BYTES)
        return kek_id, nonce + aes_gcm_encrypt(kek, nonce, dek, _wrap_aad(kek_id))

    def unwrap(self, kek_id: str, wrapped: bytes) -> bytes:
        """Inverse of :meth:`wrap`; DecryptionError for an unknown KEK or a tampered blob."""
        with self._lock:
            kek = self._keks.get(kek_id)
        if kek is None:
            raise DecryptionError(f"unknown or retired key-encryption key {kek_id!r}")
        if len(wrapped) < _NONCE_BYTES + 16:
            raise DecryptionError("wrapped key too short")
        return aes_gcm_decrypt(kek, wrapped[:_NONCE_BYTES], wrapped[_NONCE_BYTES:], _wrap_aad(kek_id))

    def rotate(self) -> str:
        """Add a fresh random KEK, make it current and return its id."""
        with self._lock:
            kek_id = _new_kek_id()
            keks = {**self._keks, kek_id: os.urandom(_KEY_BYTES)}
            self._persist(keks, kek_id)
            self._keks, self._current = keks, kek_id
            return kek_id

    def retire(self, kek_id: str) -> None:
        """Forget KEK ``kek_id``; NotFound if unknown, InvalidInput if it is the current one."""
        with self._lock:
            if kek_id not in self._keks:
                raise NotFound(f"no key-encryption key {kek_id!r}")
            if kek_id == self._current:
                raise InvalidInput("cannot retire the current key-encryption key; rotate first")
            keks = {k: v for k, v in self._keks.items() if k != kek_id}
            self._persist(keks, self._current)
            self._keks = keks

    def _persist(self, keks: dict[str, bytes], current: str) -> None:
        """Hook for durable providers; called before the in-memory state changes."""


def _encode_file(keks: dict[str, bytes], current: str) -> bytes:
    doc = {
        "version": _FILE_VERSION,
        "current": current,
        "keys": {k: base64.b64encode(v).decode("ascii") for k, v in sorted(keks.items())},
    }
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode("utf-8")


def _decode_file(raw: bytes, path: Path) -> tuple[dict[str, bytes], str]:
    def bad(why: str) -> InvalidInput:
        return InvalidInput(f"key file {path}: {why}")

    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad("not valid UTF-8 JSON") from exc
    if not isinstance(doc, dict) or set(doc) != {"version", "current", "keys"}:
        raise bad("expected exactly the fields version, current, keys")
    if doc["version"] != _FILE_VERSION:
        raise bad(f"unsupported version {doc['version']!r}")
    current, entries = doc["current"], doc["keys"]
    if not isinstance(entries, dict) or not entries:
        raise bad("keys must be a non-empty object")
    keks: dict[str, bytes] = {}
    for kek_id, b64 in entries.items():
        if not _KEK_ID.match(kek_id) or not isinstance(b64, str):
            raise bad(f"malformed key entry {kek_id!r}")
        try:
            kek = base64.b64decode(b64, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise bad(f"key {kek_id} is not base64") from exc
        if len(kek) != _KEY_BYTES:
            raise bad(f"key {kek_id} is not {_KEY_BYTES} bytes")
        keks[kek_id] = kek
    if not isinstance(current, str) or current not in keks:
        raise bad("current does not name one of the keys")
    return keks, current


def _write_new(path: Path, data: bytes) -> None:
    """Create ``path`` with mode 0600 (never wider, even briefly), write and fsync it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        os.fchmod(fd, 0o600)  # the umask can only narrow the mode; make it exact
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not every platform can open a directory
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class LocalKeyFileProvider(KekRing):
    """KEKs kept in a local JSON key file (mode ``0600``), for single-machine deployments.

    ``LocalKeyFileProvider(path)`` opens an existing file (same as :meth:`open`);
    :meth:`create` makes a new one. Rotation and retirement rewrite the file atomically
    (temporary file with mode 0600, fsync, rename, fsync of the directory), so a crash leaves
    either the old or the new file, never a torn one.
    """

    def __init__(self, path: Path) -> None:
        self._path = Path(path)
        keks, current = _decode_file(self._read_private(self._path), self._path)
        super().__init__(keks, current)
        self._stamp = self._stamp_now()
        self._remove_leftovers()

    def _stamp_now(self) -> tuple[int, int, int]:
        try:
            st = os.stat(self._path)
        except FileNotFoundError as exc:
            raise InvalidInput(f"key file {self._path} does not exist (deleted?); it is never recreated") from exc
        return st.st_ino, st.st_mtime_ns, st.st_size

    def _remove_leftovers(self) -> None:
        """Delete temporary files of rewrites a crash interrupted before their rename: the KEK
        they hold never wrapped anything (wrapping starts after the rename), and no key material
        is left lying about."""
        for tmp in self._path.parent.glob(f".{self._path.name}.*.tmp"):
            with contextlib.suppress(OSError):  # read-only media, or another process took it
                tmp.unlink()

    def _refresh(self) -> None:
        """Re-read the key file when another process rewrote it (a rotation, a retirement)."""
        stamp = self._stamp_now()
        if stamp == self._stamp:
            return
        keks, current = _decode_file(self._read_private(self._path), self._path)
        with self._lock:
            self._keks, self._current, self._stamp = keks, current, stamp

    def current_kek_id(self) -> str:
        self._refresh()
        return super().current_kek_id()

    def kek_ids(self) -> list[str]:
        self._refresh()
        return super().kek_ids()

    def wrap(self, dek: bytes) -> tuple[str, bytes]:
        self._refresh()  # never wrap under a KEK another process has rotated away
        return super().wrap(dek)

    def unwrap(self, kek_id: str, wrapped: bytes) -> bytes:
        if kek_id not in self._keks:
            self._refresh()
        try:
            return super().unwrap(kek_id, wrapped)
        except DecryptionError as exc:
            raise DecryptionError(
                f"a data key does not unwrap under {kek_id} of the key file {self._path} ({exc}): the key file"
                " is damaged or another store's, or the wrapped key was changed in the store"
            ) from None

    @contextlib.contextmanager
    def _file_lock(self) -> Iterator[None]:
        """Processes sharing the key file take turns rewriting it (read, change, replace): the
        lock is on its directory, which the replace leaves in place (the file is a new one)."""
        fd = os.open(self._path.parent, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def rotate(self) -> str:
        with self._lock, self._file_lock():
            self._refresh()
            return super().rotate()

    def retire(self, kek_id: str) -> None:
        with self._lock, self._file_lock():
            self._refresh()
            super().retire(kek_id)

    @property
    def path(self) -> Path:
        """The key file."""
        return self._path

    @classmethod
    def create(cls, path: Path) -> LocalKeyFileProvider:
        """Write a new key file with one fresh KEK; InvalidInput if ``path`` already exists."""
        path = Path(path)
        kek_id = _new_kek_id()
        try:
            _write_new(path, _encode_file({kek_id: os.urandom(_KEY_BYTES)}, kek_id))
        except FileExistsError as exc:
            raise InvalidInput(f"key file {path} already exists; refusing to overwrite") from exc
        _fsync_dir(path.parent)
        return cls(path)

    @classmethod
    def open(cls, path: Path) -> LocalKeyFileProvider:
        """Open an existing key file after checking its mode (no group/other bits) and JSON."""
        return cls(path)

    @staticmethod
    def _read_private(path: Path) -> bytes:
        data = read_private(path, "key file")
        assert data is not None  # (missing is an error here)
        return data

    def _persist(self, keks: dict[str, bytes], current: str) -> None:
        tmp = self._path.with_name(f".{self._path.name}.{uuid.uuid4().hex}.tmp")
        try:
            _write_new(tmp, _encode_file(keks, current))
            os.replace(tmp, self._path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise
        _fsync_dir(self._path.parent)
        self._stamp = self._stamp_now()
