"""The signer of audit checkpoints: one Ed25519 private key in a PKCS#8 PEM file (mode 0600),
or any object with ``sign(bytes) -> bytes`` and ``public_key()`` (a hardware key's wrapper).

A missing key file is :class:`CheckpointKeyMissing`: a key is created only by
:meth:`CheckpointSigner.create` (at ``init``), never regenerated when it is gone, since the
checkpoints it signed could no longer be verified.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path
from typing import Protocol

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..._errors import CheckpointKeyMissing, InvalidInput, StoreError
from .checkpoint import Checkpoint, LaneRows, TableRows, _check_fields, _fsync_dir, _message, ed25519_verify

__all__ = ["CheckpointSigner", "SigningKey"]


class SigningKey(Protocol):
    """What signs checkpoints: an ``Ed25519PrivateKey`` or anything that behaves like one."""

    def sign(self, data: bytes) -> bytes: ...

    def public_key(self) -> Ed25519PublicKey: ...


class CheckpointSigner:
    """Signs checkpoints with one Ed25519 private key (or a :class:`SigningKey` provider)."""

    def __init__(self, private_key: Ed25519PrivateKey | SigningKey) -> None:
        if not callable(getattr(private_key, "sign", None)) or not callable(getattr(private_key, "public_key", None)):
            raise InvalidInput("a checkpoint key needs sign(bytes) and public_key()")
        public = private_key.public_key()
        if not isinstance(public, Ed25519PublicKey):
            raise InvalidInput(f"a checkpoint key must be Ed25519, its public key is {type(public).__name__}")
        self._key = private_key
        self._public = public

    @classmethod
    def create(cls, key_path: Path) -> CheckpointSigner:
        """A new key written to ``key_path`` (mode 0600, parents 0700); refuses an existing file."""
        key_path = Path(key_path)
        key_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        try:
            fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise StoreError(f"{key_path} exists already: a checkpoint key is never replaced") from None
        try:
            os.write(fd, pem)
            os.fsync(fd)
        finally:
            os.close(fd)
        _fsync_dir(key_path.parent)
        return cls(key)

    @classmethod
    def load(cls, key_path: Path) -> CheckpointSigner:
        """Load the PEM key at ``key_path``; reads only (no file or directory is created).

        Raises :class:`CheckpointKeyMissing` if there is no file: a lost key is never replaced
        by a new one (its checkpoints could not be verified any more), and :class:`StoreError`
        as :meth:`load_or_create` for a file that is not a private Ed25519 key.
        """
        key_path = Path(key_path)
        if not key_path.is_file():
            raise CheckpointKeyMissing(
                f"no checkpoint signing key at {key_path}: restore it from its backup or name where it is"
                " (checkpoint_key=, MSM_MEM_CHECKPOINT_KEY); it is never regenerated"
            )
        return cls.load_or_create(key_path)

    @classmethod
    def load_or_create(cls, key_path: Path) -> CheckpointSigner:
        """Load the PEM key at ``key_path``, creating it (mode 0600, parents 0700) if absent.

        Raises :class:`StoreError` if the file is not an unencrypted Ed25519 PKCS#8 PEM key,
        or (on POSIX) if group or others may read or write it.
        """
        key_path = Path(key_path)
        if not key_path.exists():
            key_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            key = Ed25519PrivateKey.generate()
            pem = key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
            try:
                fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                pass  # another process created it first: load theirs below
            else:
                try:
                    os.write(fd, pem)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                _fsync_dir(key_path.parent)
                return cls(key)
        if os.name == "posix" and key_path.stat().st_mode & 0o077:
            raise StoreError(f"{key_path} is accessible by group or others; chmod 600 it")
        try:
            loaded = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        except (ValueError, TypeError) as exc:
            raise StoreError(f"{key_path} is not an unencrypted PEM private key: {exc}") from None
        if not isinstance(loaded, Ed25519PrivateKey):
            raise StoreError(f"{key_path} holds a {type(loaded).__name__}, not an Ed25519 key")
        return cls(loaded)

    @property
    def public_key(self) -> Ed25519PublicKey:
        """The public key that verifies this signer's checkpoints."""
        return self._public

    @property
    def public_key_bytes(self) -> bytes:
        """The 32 raw bytes of the public key (RFC 8032 encoding)."""
        return self._public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    def sign(self, origin: str, size: int, head_hash: str, time: float) -> Checkpoint:
        """Sign the head of ``origin``'s chain: ``size`` events, last hash ``head_hash``.

        ``time`` is UTC seconds; ``size`` 0 requires ``head_hash == GENESIS``.
        Raises :class:`InvalidInput` for malformed fields.
        """
        return self.sign_head(origin, size, head_hash, time)

    def sign_head(
        self,
        origin: str,
        size: int,
        head_hash: str,
        time: float,
        base: tuple[int, str] | None = None,
        rows: tuple[TableRows, ...] | None = None,
        *,
        chain: int | None = None,
        heads: tuple[tuple[int, str], ...] | None = None,
        lanes: tuple[LaneRows, ...] | None = None,
    ) -> Checkpoint:
        """:meth:`sign`, also signing the chain's ``base`` ``(seq, hash)`` and the row digests
        ``rows`` (``(table, count, digest)`` sorted by table; they need a base) when given; in a
        store of several chains ``chain``, ``heads`` and ``lanes`` instead of ``rows`` (see
        :class:`~.checkpoint.Checkpoint`)."""
        _check_fields(origin, size, head_hash, time)
        if base is not None:
            _check_fields(origin, base[0], base[1], time)
        if (rows is not None or lanes is not None) and base is None:
            raise InvalidInput("row digests are signed with the chain's base")
        message = _message(origin, size, head_hash, float(time), base, rows, chain, heads, lanes)
        signature = self._key.sign(message).hex()
        if base is None:
            return Checkpoint(origin, size, head_hash, float(time), signature)
        return Checkpoint(origin, size, head_hash, float(time), signature, base[0], base[1], rows, chain, heads, lanes)

    def row_key(self, tenant: str) -> bytes:
        """The key of the store's row digests: HKDF-SHA256 (salt ``msm-mem rows v1``, info the
        store's ``tenant``) of this key's Ed25519 signature of ``msm-mem row digest key v1``
        and the tenant. Ed25519 signatures are deterministic (RFC 8032), so only a holder of
        the signing key (a file, or a hardware key behind :class:`SigningKey`) can derive it,
        and it never needs storing. Raises :class:`StoreError` for a key whose signatures
        differ from one call to the next or do not verify."""
        message = b"msm-mem row digest key v1\x00" + tenant.encode("utf-8")
        first, second = self._key.sign(message), self._key.sign(message)
        if first != second or not ed25519_verify(self._public, message, first):
            raise StoreError(
                "the checkpoint key does not sign deterministically (RFC 8032 Ed25519 does):"
                " the row digest key cannot be derived from it"
            )
        hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=b"msm-mem rows v1", info=tenant.encode("utf-8"))
        return hkdf.derive(first)

    def tomb_key(self, tenant: str) -> bytes:
        """The key of a shredded patient's tombstone reference
        (:meth:`~msm_mem._governance.crypto.EnvelopeCipher.use_tomb_key`): HMAC-SHA256 of
        ``msm-mem shredded patient v1`` under :meth:`row_key`, so only a holder of the signing
        key can tell whose a tombstone is."""
        return hmac.new(self.row_key(tenant), b"msm-mem shredded patient v1", hashlib.sha256).digest()

    def sign_bytes(self, domain: bytes, message: bytes) -> str:
        """The Ed25519 signature (128 lowercase hex digits) of ``domain``, a NUL and ``message``:
        statements other than checkpoints (an erasure receipt), each under its own domain."""
        return bytes(self._key.sign(domain + b"\x00" + message)).hex()
