"""API keys: bearer tokens whose principal and patient scope the server looks up.

A key is ``msmk_<key id>_<secret>``; only an argon2id hash of the secret is stored, in
``api-keys.json`` (mode 0600) in the store's folder of the key home, beside its key files and
outside the store directory (so whoever can write the directory cannot add a key of their
own), with the principal it acts as (actor, role, purpose), its patient scope (patient ids, or
``*`` for every patient) and its times. ``create`` prints the key once; nothing can show it
again. A revoked key stays listed with its revocation time.

Verifying a key costs one argon2 hash; a verified key is remembered (by its SHA-256) until the
file changes, so a revocation takes effect on the next request in every worker.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import secrets
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ... import InvalidInput, MissingExtra, MsmMem, NotFound, Principal

__all__ = ["ALL_PATIENTS", "KEY_FILE", "ApiKey", "ApiKeyStore", "parse_patients"]

KEY_FILE = "api-keys.json"
ALL_PATIENTS = "*"
_TOKEN = re.compile(r"\Amsmk_([0-9a-f]{16})_([A-Za-z0-9_-]{20,128})\Z")
_PATIENT = re.compile(r"\A[^\s,*]{1,128}\Z")


def parse_patients(text: str) -> tuple[str, ...]:
    """``P1,P2`` as ``("P1", "P2")``, ``*`` as ``("*",)`` (every patient), "" as no patient."""
    if text.strip() == ALL_PATIENTS:
        return (ALL_PATIENTS,)
    ids = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    for p in ids:
        if not _PATIENT.match(p):
            raise InvalidInput(f"bad patient id {p!r} in the key's scope (ids are comma-separated; * alone for all)")
    return ids


def _hasher() -> object:
    try:
        from argon2 import PasswordHasher
    except ImportError:
        raise MissingExtra("argon2-cffi", "server") from None
    return PasswordHasher()


@dataclass(frozen=True, slots=True)
class ApiKey:
    """One stored key (never its secret): the principal it acts as and its patient scope.
    Times are UTC seconds; ``revoked_at`` is None for a key in force."""

    key_id: str
    actor: str
    role: str
    purpose: str
    patients: tuple[str, ...]
    hash: str
    created_at: float
    revoked_at: float | None = None
    note: str = ""

    @property
    def principal(self) -> Principal:
        return Principal(self.actor, self.role, self.purpose)  # type: ignore[arg-type]

    def covers(self, patient_id: str) -> bool:
        """Whether ``patient_id`` ("*": every patient) lies inside the key's scope."""
        if ALL_PATIENTS in self.patients:
            return True
        return patient_id != ALL_PATIENTS and patient_id in self.patients

    def public(self) -> dict[str, object]:
        """The key as shown by ``list``: everything but its hash."""
        doc = asdict(self)
        doc.pop("hash")
        doc["patients"] = list(self.patients)
        return doc


class ApiKeyStore:
    """The API keys in the file ``path`` (:meth:`of_store`: a store's, in its key home folder)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._hashing = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._keys: dict[str, ApiKey] = {}
        self._verified: dict[str, str] = {}  # sha256 of a verified token -> key id

    @classmethod
    def of_store(cls, directory: str | os.PathLike[str]) -> ApiKeyStore:
        """The API keys of the store in ``directory``: its key home folder's ``api-keys.json``."""
        return cls(MsmMem.key_folder(Path(directory)) / KEY_FILE)

    # the file --------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _writing(self) -> Iterator[list[ApiKey]]:
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        lock = self.path.with_suffix(".lock")
        fd = os.open(lock, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            keys = self._read()
            yield keys
            tmp = self.path.with_suffix(".tmp")
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.fchmod(out, 0o600)
            with os.fdopen(out, "w", encoding="utf-8") as f:
                doc = {"version": 1, "keys": [{**asdict(k), "patients": list(k.patients)} for k in keys]}
                f.write(json.dumps(doc, indent=2) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        finally:
            os.close(fd)

    def _read(self) -> list[ApiKey]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        try:
            doc = json.loads(text)
            return [ApiKey(**{**k, "patients": tuple(k["patients"])}) for k in doc["keys"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidInput(f"{self.path} is not a valid API key file ({exc})") from None

    def _current(self) -> dict[str, ApiKey]:
        """The keys as the file says now (re-read, and the verified tokens forgotten, when it changed)."""
        try:
            st = self.path.stat()
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            stamp = (0, 0, 0)
        with self._lock:
            if stamp != self._stamp:
                self._keys = {k.key_id: k for k in self._read()}
                self._verified = {}
                self._stamp = stamp
            return self._keys

    # operations ------------------------------------------------------------------------------

    def create(self, principal: Principal, patients: Sequence[str], *, note: str = "") -> tuple[str, ApiKey]:
        """A new key for ``principal`` over ``patients`` (ids, or ``("*",)``); returns the token
        (shown once) and the stored record."""
        if not isinstance(principal, Principal):
            raise InvalidInput("an API key acts as a Principal")
        scope = parse_patients(",".join(patients))
        secret = secrets.token_urlsafe(32)
        key_id = secrets.token_hex(8)
        hasher = _hasher()
        record = ApiKey(
            key_id=key_id,
            actor=principal.id,
            role=principal.role.value,
            purpose=principal.purpose.value,
            patients=scope,
            hash=hasher.hash(secret),  # type: ignore[attr-defined]
            created_at=time.time(),
            note=" ".join(note.split())[:200],
        )
        with self._writing() as keys:
            keys.append(record)
        return f"msmk_{key_id}_{secret}", record

    def list(self) -> list[ApiKey]:
        """Every key, revoked ones included, oldest first."""
        return sorted(self._current().values(), key=lambda k: (k.created_at, k.key_id))

    def revoke(self, key_id: str) -> ApiKey:
        """Revoke a key from now on (NotFound for an unknown id; revoking twice keeps the first time)."""
        with self._writing() as keys:
            for i, k in enumerate(keys):
                if k.key_id == key_id:
                    if k.revoked_at is None:
                        keys[i] = replace(k, revoked_at=time.time())
                    return keys[i]
        raise NotFound(f"no API key {key_id!r}")

    def known(self, token: str) -> ApiKey | None:
        """The key in force that ``token`` is, when this store verified that token before and
        the file has not changed since (no hash computed: cheap); None otherwise."""
        match = _TOKEN.match(token)
        if match is None:
            return None
        key = self._current().get(match.group(1))
        if key is None or key.revoked_at is not None:
            return None
        digest = hashlib.sha256(token.encode()).hexdigest()
        return key if self._verified.get(digest) == key.key_id else None

    def verify(self, token: str) -> ApiKey | None:
        """The key in force that ``token`` is, or None (malformed, unknown, revoked or wrong)."""
        match = _TOKEN.match(token)
        if match is None:
            return None
        keys = self._current()
        key = keys.get(match.group(1))
        if key is None or key.revoked_at is not None:
            return None
        digest = hashlib.sha256(token.encode()).hexdigest()
        if self._verified.get(digest) == key.key_id:
            return key
        hasher = _hasher()
        from argon2.exceptions import InvalidHashError, VerificationError

        # one hash at a time: a burst of first requests with one key hashes it once (the others
        # find it verified), and a flood of wrong secrets costs one hash's memory at a time
        with self._hashing:
            if self._verified.get(digest) == key.key_id:
                return key
            try:
                hasher.verify(key.hash, match.group(2))  # type: ignore[attr-defined]
            except (VerificationError, InvalidHashError):
                return None
            with self._lock:
                self._verified[digest] = key.key_id
        return key
