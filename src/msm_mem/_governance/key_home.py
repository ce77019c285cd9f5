"""Where a store's keys and its trusted record live: a key home outside the store's directory.

A copy of a store's directory alone must be enough neither to read it nor to rewrite it, so
the key material lives elsewhere, one folder per store (named by the store's id) under the
key home::

    <home>/<store_id>/kek.json        key-encryption keys (0600), unless a master key or a KMS
    <home>/<store_id>/checkpoint.key  Ed25519 checkpoint signing key (0600), unless one is given
    <home>/<store_id>/record.json     what the store is: its id, schema and witness
    <home>/<store_id>/witness.jsonl   the default witness of its checkpoints (and .head)
    <home>/<store_id>/api-keys.json   the service's API keys, as argon2 hashes (interfaces.auth)

The home is ``MSM_MEM_KEY_HOME``, else ``$XDG_CONFIG_HOME/msm-mem/keys``, else
``~/.config/msm-mem/keys`` (folders 0700, files 0600). It may not lie inside the store's
directory, nor the directory inside it.

Where the keys come from, in this order:

* a :class:`~msm_mem._governance.keys.KeyProvider` and a
  :class:`~msm_mem._governance.audit.checkpoint_signer.SigningKey` given by the caller: a KMS
  or hardware key (``wrap``/``unwrap`` become the service's encrypt and decrypt calls; the key
  never leaves it);
* a master key in the environment (``MSM_MEM_MASTER_KEY``: 32 random bytes, base64): the
  key-encryption key and the checkpoint signing key are derived from it with HKDF-SHA256
  (rotation happens by re-keying the environment, not here);
* the key files of the store's folder in the home.

The record and the witness stay in the home whichever way the keys come: they are what an
insider with the directory cannot roll back. The record is written at ``init`` (and by
``store upgrade``), never by an ordinary write: its ``schema`` catches a store whose schema was
set back, its ``witness`` a witness that went missing.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .._errors import AuditChainBroken, InvalidInput, StoreError
from .._private import read_private, write_private
from .audit.checkpoint_signer import CheckpointSigner
from .keys import KekRing, KeyProvider, LocalKeyFileProvider

__all__ = [
    "ENV_HOME",
    "ENV_MASTER",
    "KeyHome",
    "MasterKeyProvider",
    "StoreRecord",
    "default_home",
    "master_key_from_env",
]

ENV_HOME = "MSM_MEM_KEY_HOME"
ENV_MASTER = "MSM_MEM_MASTER_KEY"
KEK_FILE = "kek.json"
SIGNER_FILE = "checkpoint.key"
RECORD_FILE = "record.json"
WITNESS_FILE = "witness.jsonl"
API_KEYS_FILE = "api-keys.json"
#: where a store's key-encryption keys come from (:attr:`StoreRecord.keys`)
KEY_SOURCES = ("files", "master", "provider")
_RECORD_VERSION = 1


def default_home() -> Path:
    """The key home: ``MSM_MEM_KEY_HOME``, else the user's configuration folder's ``msm-mem/keys``."""
    named = os.environ.get(ENV_HOME)
    if named:
        return Path(named).expanduser()
    config = os.environ.get("XDG_CONFIG_HOME")
    base = Path(config).expanduser() if config else Path.home() / ".config"
    return base / "msm-mem" / "keys"


def master_key_from_env() -> bytes | None:
    """The master key of ``MSM_MEM_MASTER_KEY`` (None when unset); InvalidInput naming the
    variable unless it is 32 bytes in base64."""
    value = os.environ.get(ENV_MASTER)
    if not value:
        return None
    try:
        key = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput(f"{ENV_MASTER} is not base64 (32 random bytes: openssl rand -base64 32)") from None
    if len(key) != 32:
        raise InvalidInput(f"{ENV_MASTER} holds {len(key)} bytes; it must hold 32 (openssl rand -base64 32)")
    return key


def _derive(master: bytes, what: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=b"msm-mem master key v1", info=what).derive(master)


class MasterKeyProvider(KekRing):
    """One key-encryption key derived from a master key (HKDF-SHA256): nothing stored, the same
    key in every process given the same master. ``rotate`` and ``retire`` are refused: a new
    master key is a new store's (rewrapping under it is a KMS's or a key home's job)."""

    def __init__(self, master: bytes) -> None:
        kek_id = "kek-" + _derive(master, b"kek id")[:16].hex()
        super().__init__({kek_id: _derive(master, b"kek")}, kek_id)

    def rotate(self) -> str:
        raise InvalidInput(
            f"keys derived from {ENV_MASTER} do not rotate here: keep the store's keys in a key home or a KMS to rotate"
        )

    def retire(self, kek_id: str) -> None:
        raise InvalidInput(f"keys derived from {ENV_MASTER} have no older key to retire")


def master_signer(master: bytes) -> CheckpointSigner:
    """The checkpoint signer derived from ``master`` (an Ed25519 seed by HKDF-SHA256)."""
    return CheckpointSigner(Ed25519PrivateKey.from_private_bytes(_derive(master, b"checkpoint signing key")))


@dataclass(frozen=True, slots=True)
class StoreRecord:
    """What the key home knows of a store: its id, the schema it was last made or upgraded to,
    the witness of its checkpoints (a ``*.jsonl`` file) and where its key-encryption keys come
    from (``files`` in the folder, the ``master`` key of the environment, or a ``provider``
    the caller passes: a KMS)."""

    store_id: str
    schema: str
    witness: Path
    keys: str = "files"

    def to_json(self) -> bytes:
        doc = {"version": _RECORD_VERSION, "store_id": self.store_id, "schema": self.schema, "keys": self.keys}
        doc["witness"] = str(self.witness)
        return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes, path: Path) -> StoreRecord:
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict) or doc.get("version") != _RECORD_VERSION:
                raise ValueError("not a version 1 record")
            fields = (doc["store_id"], doc["schema"], doc["witness"], doc.get("keys", "files"))
            if not all(isinstance(f, str) and f for f in fields):
                raise ValueError("store_id, schema, witness and keys must be non-empty text")
            if fields[3] not in KEY_SOURCES:
                raise ValueError(f"keys must be one of {', '.join(KEY_SOURCES)}")
        except (ValueError, KeyError) as exc:
            raise StoreError(f"the store record {path} is damaged: {exc}") from None
        return cls(fields[0], fields[1], Path(fields[2]), fields[3])


def _inside(inner: Path, outer: Path) -> bool:
    inner, outer = inner.resolve(), outer.resolve()
    return inner == outer or outer in inner.parents


class KeyHome:
    """The key home of one store: its folder, its key files, its record and default witness."""

    def __init__(self, root: str | Path | None, store_id: str, directory: Path) -> None:
        self.root = default_home() if root is None else Path(root).expanduser()
        if not store_id or not all(c.isalnum() or c in "-_" for c in store_id):
            raise StoreError(f"the store's id {store_id!r} cannot name a key folder (damaged meta?)")
        self.store_id = store_id
        self.folder = self.root / store_id
        directory = Path(directory)
        if _inside(self.root, directory) or _inside(directory, self.root):
            raise InvalidInput(
                f"the key home {self.root} and the store directory {directory} must not contain one another:"
                f" a copy of the directory would hold its keys (set {ENV_HOME} elsewhere)"
            )

    @property
    def kek_file(self) -> Path:
        return self.folder / KEK_FILE

    @property
    def signer_file(self) -> Path:
        return self.folder / SIGNER_FILE

    @property
    def record_file(self) -> Path:
        return self.folder / RECORD_FILE

    @property
    def default_witness(self) -> Path:
        return self.folder / WITNESS_FILE

    # the keys --------------------------------------------------------------------------------

    def create_keys(
        self, provider: KeyProvider | None, signer: CheckpointSigner | None, master: bytes | None
    ) -> tuple[KeyProvider, CheckpointSigner]:
        """A new store's provider and signer: those given, else derived from ``master``, else
        new key files in the folder (refusing a folder that holds keys already)."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if provider is None and master is None:
            provider = LocalKeyFileProvider.create(self.kek_file)
        if signer is None and master is None:
            signer = CheckpointSigner.create(self.signer_file)
        return self.open_keys(provider, signer, master)

    @staticmethod
    def source(provider: KeyProvider | None, master: bytes | None) -> str:
        """Where the key-encryption keys come from, given these (:data:`KEY_SOURCES`)."""
        return "provider" if provider is not None else "master" if master is not None else "files"

    def check_source(self, record: StoreRecord | None, provider: KeyProvider | None, master: bytes | None) -> None:
        """InvalidInput naming what to give when the keys offered are not where the store's
        record says its keys come from (a master key set for a store of key files, say)."""
        if record is None or record.keys == self.source(provider, master):
            return
        needs = {
            "files": f"its key files in {self.folder}: unset {ENV_MASTER} and pass no key_provider for it",
            "master": f"{ENV_MASTER}, which is not set",
            "provider": "the key provider (a KMS) it was made with: pass key_provider= (and checkpoint_key=)",
        }
        raise InvalidInput(f"store {self.store_id} takes its keys from {needs[record.keys]}")

    def open_keys(
        self, provider: KeyProvider | None, signer: CheckpointSigner | None, master: bytes | None
    ) -> tuple[KeyProvider, CheckpointSigner]:
        """The store's provider and signer: those given, else derived from ``master``, else
        the folder's key files (a missing one is named, with where it was looked for)."""
        if provider is None:
            if master is not None:
                provider = MasterKeyProvider(master)
            else:
                if not self.kek_file.exists():
                    raise InvalidInput(
                        f"the key file {self.kek_file} of store {self.store_id} does not exist: restore it from its"
                        f" backup, point {ENV_HOME} at the key home that holds it, or set {ENV_MASTER}"
                    )
                provider = LocalKeyFileProvider.open(self.kek_file)
        if signer is None:
            signer = master_signer(master) if master is not None else CheckpointSigner.load(self.signer_file)
        return provider, signer

    # the record --------------------------------------------------------------------------------

    def read_record(self) -> StoreRecord | None:
        """The store's record, or None when the home has none (a store made elsewhere)."""
        path = self.record_file
        data = read_private(path, "the store record", missing_ok=True)
        if data is None:
            return None
        record = StoreRecord.from_json(data, path)
        if record.store_id != self.store_id:
            raise AuditChainBroken(
                f"the key home's record {path} is of store {record.store_id}, the directory says {self.store_id}"
            )
        return record

    def write_record(self, record: StoreRecord) -> None:
        write_private(self.record_file, record.to_json(), replace=True)

    def check_schema(self, found: str, record: StoreRecord | None) -> None:
        """AuditChainBroken when the store's schema ``found`` is older than the one recorded: it
        was set back (which would make ``store upgrade`` adopt rewritten history)."""
        if record is None:
            return
        try:
            older = int(found) < int(record.schema)
        except ValueError:
            older = found != record.schema
        if older:
            raise AuditChainBroken(
                f"the store says schema {found}, its key home recorded schema {record.schema} ({self.record_file}):"
                " the store's schema was set back outside msm-mem"
            )

    # moving the keys of an older store ---------------------------------------------------------

    def adopt(self, old: Path) -> list[str]:
        """Move the key files of folder ``old`` (an older store's ``DIR/keys``: its KEKs, its
        checkpoint key and the service's API keys, when there) into this home:
        each is copied (0600, fsynced), loaded back, then removed from ``old``. A file the
        home holds already must be identical (a move a crash interrupted), else StoreError.
        Returns the names moved."""
        moved = []
        for name in (KEK_FILE, SIGNER_FILE, API_KEYS_FILE):
            source = old / name
            if not source.exists():
                continue
            data = source.read_bytes()
            target = self.folder / name
            if target.exists():
                if target.read_bytes() != data:
                    raise StoreError(
                        f"{target} exists and differs from {source}: two stores with the same id? Nothing moved"
                    )
            else:
                write_private(target, data, replace=False)
            moved.append(name)
        LocalKeyFileProvider.open(self.kek_file)  # loads back before anything is removed
        CheckpointSigner.load(self.signer_file)
        for name in moved:
            with contextlib.suppress(FileNotFoundError):
                (old / name).unlink()
        return moved
