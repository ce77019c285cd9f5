"""Signed checkpoints of the audit chain, kept outside the database.

A checkpoint says "the chain of ``origin`` had ``size`` events and its last ``event_hash`` was
``head_hash`` at ``time``", signed with Ed25519 over the canonical JSON of every field but the
signature: ``{"head_hash", "origin", "size", "time"}`` (the first format, still read), and since
per-commit checkpoints also ``"base_hash", "base_size"``: the ``(seq, hash)`` the stored chain
continues from (``(0, GENESIS)`` until a retention purge), so a deleted head with a forged base
no longer matches; and since row digests also ``"rows"``: ``{table: {"count", "digest"}}``, the
keyed multiset hash of every governed row at that commit (:mod:`msm_mem._storage.row_digest`),
so a row changed, deleted or added in the database no longer matches; and in a store of several
audit chains (:mod:`msm_mem._storage.lanes`) ``"chain"`` (which chain ``size`` and ``head_hash``
are the head of), ``"heads"`` (``[size, hash]`` of every chain as the commit saw them: the root
the checkpoint signs over every chain head) and ``"lanes"`` (``{lane: rows}``, the row digests
of the lanes the commit wrote) instead of ``"rows"``. Someone who can rewrite the
database can recompute a whole hash chain, or cut off its tail, and the chain alone still
verifies; a checkpoint written elsewhere (an append-only JSONL file here, ideally on other
storage) exposes both, because its signing key is not in the database.

File formats: the private key is an unencrypted PKCS#8 PEM file created with mode 0600 (or any
object with ``sign(bytes) -> bytes`` and ``public_key()``, such as an ``Ed25519PrivateKey`` or a
wrapper of a hardware key); the log holds one canonical JSON checkpoint per line, each line
ended by ``\\n``. A missing key is :class:`CheckpointKeyMissing`: it is created only by
:meth:`CheckpointSigner.create`, never regenerated when it is gone.
Appends of one log are serialised by an exclusive lock on it; a last line left without its
newline by a crash mid-append was never acknowledged: it is ignored with a warning and cut off
by the next append.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import math
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from ..._errors import AuditChainBroken, CanonicalJSONError, InvalidInput
from .event import GENESIS
from .jcs import MAX_SAFE_INTEGER, canonicalize, loads_strict
from .verify import VerifyResult

__all__ = [
    "Checkpoint",
    "CheckpointLog",
    "LaneRows",
    "TableRows",
    "ed25519_verify",
    "heads_root",
    "verify_against_checkpoints",
]

_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX_SIG = re.compile(r"[0-9a-f]{128}")
_FIELDS = frozenset({"origin", "size", "head_hash", "time", "signature"})
_FIELDS_BASE = _FIELDS | {"base_size", "base_hash"}
_FIELDS_ROWS = _FIELDS_BASE | {"rows"}
_FIELDS_LANES = _FIELDS_BASE | {"chain", "heads", "lanes"}
_TABLE = re.compile(r"[a-z_]{1,32}")

#: one governed table's signed digest: (table, row count, 64 hex digits)
TableRows = tuple[str, int, str]
#: the signed row digests of one lane: (lane, its tables' digests)
LaneRows = tuple[int, tuple[TableRows, ...]]

PublicKeyLike = Ed25519PublicKey | bytes
_log = logging.getLogger("msm_mem")


def _rows_json(rows: tuple[TableRows, ...]) -> dict[str, Any]:
    return {table: {"count": count, "digest": digest} for table, count, digest in rows}


def _rows_from_json(value: object) -> tuple[TableRows, ...]:
    if type(value) is not dict:
        raise InvalidInput("checkpoint rows must be an object of tables")
    rows = []
    for table, entry in sorted(value.items()):
        if _TABLE.fullmatch(table) is None or type(entry) is not dict or entry.keys() != {"count", "digest"}:
            raise InvalidInput(f"checkpoint rows: {table!r} needs exactly count and digest")
        rows.append((table, entry["count"], entry["digest"]))
    return _check_rows(tuple(rows))


def _check_rows(rows: tuple[TableRows, ...]) -> tuple[TableRows, ...]:
    for table, count, digest in rows:
        if type(count) is not int or not 0 <= count <= MAX_SAFE_INTEGER:
            raise InvalidInput(f"checkpoint rows: {table} count {count!r} is not an integer >= 0")
        if not isinstance(digest, str) or _HEX64.fullmatch(digest) is None:
            raise InvalidInput(f"checkpoint rows: {table} digest is not 64 lowercase hex digits")
    if [r[0] for r in rows] != sorted({r[0] for r in rows}):
        raise InvalidInput("checkpoint rows: tables must be unique and sorted")
    return rows


def _lanes_json(lanes: tuple[LaneRows, ...]) -> dict[str, Any]:
    return {str(lane): _rows_json(rows) for lane, rows in lanes}


def _lanes_from_json(value: object) -> tuple[LaneRows, ...]:
    if type(value) is not dict:
        raise InvalidInput("checkpoint lanes must be an object of lanes")
    lanes = []
    for key, rows in value.items():
        if not isinstance(key, str) or not key.isdigit() or key != str(int(key)):
            raise InvalidInput(f"checkpoint lanes: {key!r} is not a lane number")
        lanes.append((int(key), _rows_from_json(rows)))
    return tuple(sorted(lanes))


def _heads_from_json(value: object) -> tuple[tuple[int, str], ...]:
    if type(value) is not list or not all(type(h) is list and len(h) == 2 for h in value):
        raise InvalidInput("checkpoint heads must be a list of [size, hash] pairs")
    return tuple((h[0], h[1]) for h in value)


def _dict(
    origin: str,
    size: int,
    head_hash: str,
    time: float,
    base: tuple[int, str] | None,
    rows: tuple[TableRows, ...] | None,
    chain: int | None,
    heads: tuple[tuple[int, str], ...] | None,
    lanes: tuple[LaneRows, ...] | None,
) -> dict[str, Any]:
    d: dict[str, Any] = {"origin": origin, "size": size, "head_hash": head_hash, "time": time}
    if base is not None:
        d["base_size"], d["base_hash"] = base
    if rows is not None:
        d["rows"] = _rows_json(rows)
    if chain is not None and heads is not None and lanes is not None:
        d["chain"], d["heads"], d["lanes"] = chain, [list(h) for h in heads], _lanes_json(lanes)
    return d


def _message(
    origin: str,
    size: int,
    head_hash: str,
    time: float,
    base: tuple[int, str] | None = None,
    rows: tuple[TableRows, ...] | None = None,
    chain: int | None = None,
    heads: tuple[tuple[int, str], ...] | None = None,
    lanes: tuple[LaneRows, ...] | None = None,
) -> bytes:
    return canonicalize(_dict(origin, size, head_hash, time, base, rows, chain, heads, lanes))


def heads_root(heads: tuple[tuple[int, str], ...]) -> str:
    """The root of a store's chain heads: sha256 of their canonical JSON ``[[size, hash], ...]``
    in chain order, as 64 hex digits."""
    return hashlib.sha256(canonicalize([list(h) for h in heads])).hexdigest()


def _check_fields(origin: object, size: object, head_hash: object, time: object) -> None:
    if not isinstance(origin, str) or not origin:
        raise InvalidInput("checkpoint origin must be a non-empty string")
    if type(size) is not int or not 0 <= size <= MAX_SAFE_INTEGER:
        raise InvalidInput(f"checkpoint size {size!r} is not an integer >= 0")
    if not isinstance(head_hash, str) or _HEX64.fullmatch(head_hash) is None:
        raise InvalidInput("checkpoint head_hash is not 64 lowercase hex digits")
    if size == 0 and head_hash != GENESIS:
        raise InvalidInput("a checkpoint of an empty chain must have head_hash GENESIS")
    if isinstance(time, bool) or not isinstance(time, int | float) or not math.isfinite(time):
        raise InvalidInput(f"checkpoint time {time!r} is not finite UTC seconds")


def ed25519_verify(public_key: PublicKeyLike, message: bytes, signature: bytes) -> bool:
    """True when ``signature`` is a valid Ed25519 (RFC 8032) signature of ``message``.

    ``public_key`` is a key object or its 32 raw bytes. Malformed keys or signatures (wrong
    length, non-canonical encodings) give False, never an exception.
    """
    try:
        key = (
            public_key
            if isinstance(public_key, Ed25519PublicKey)
            else Ed25519PublicKey.from_public_bytes(bytes(public_key))
        )
        key.verify(bytes(signature), bytes(message))
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A signed statement of the chain head: ``size`` events, last hash ``head_hash``.

    ``time`` is UTC seconds; ``signature`` is the 64-byte Ed25519 signature as 128 lowercase
    hex digits. Construction checks formats (raising :class:`InvalidInput`), not the signature.
    """

    origin: str
    size: int
    head_hash: str
    time: float
    signature: str
    #: the stored chain's base when signed (seq, hash); None in checkpoints of the first format
    base_size: int | None = None
    base_hash: str | None = None
    #: the row digests of the commit, ``(table, count, digest)`` sorted by table; None in
    #: checkpoints signed before row digests (they need a base too), and in a store of chains
    rows: tuple[TableRows, ...] | None = None
    #: in a store of several chains: the chain this checkpoint's ``size``/``head_hash`` is the
    #: head of, every chain's head ``(size, hash)`` as the commit saw it (its own chain's new
    #: one), and the row digests of the lanes the commit wrote, sorted by lane; else None
    chain: int | None = None
    heads: tuple[tuple[int, str], ...] | None = None
    lanes: tuple[LaneRows, ...] | None = None

    def __post_init__(self) -> None:
        if type(self.time) is int:
            object.__setattr__(self, "time", float(self.time))
        _check_fields(self.origin, self.size, self.head_hash, self.time)
        if not isinstance(self.signature, str) or _HEX_SIG.fullmatch(self.signature) is None:
            raise InvalidInput("checkpoint signature is not 128 lowercase hex digits")
        if (self.base_size is None) != (self.base_hash is None):
            raise InvalidInput("a checkpoint has both base_size and base_hash or neither")
        if self.base_size is not None:
            _check_fields(self.origin, self.base_size, self.base_hash, self.time)
            if self.base_size > self.size:
                raise InvalidInput("a checkpoint's base lies beyond its head")
        if self.rows is not None:
            if self.base_size is None:
                raise InvalidInput("a checkpoint with row digests has a base too")
            if not isinstance(self.rows, tuple) or not all(isinstance(r, tuple) and len(r) == 3 for r in self.rows):
                raise InvalidInput("checkpoint rows must be (table, count, digest) tuples")
            _check_rows(self.rows)
        if (self.chain, self.heads, self.lanes).count(None) not in (0, 3):
            raise InvalidInput("a checkpoint of a store of chains has chain, heads and lanes")
        if self.chain is not None:
            self._check_chains()

    def _check_chains(self) -> None:
        heads, lanes = self.heads, self.lanes
        assert heads is not None and lanes is not None
        if self.base is None or self.rows is not None:
            raise InvalidInput("a checkpoint of a store of chains has a base and its rows by lane")
        if not isinstance(heads, tuple) or not heads or not all(isinstance(h, tuple) and len(h) == 2 for h in heads):
            raise InvalidInput("checkpoint heads must be (size, hash) pairs, one per chain")
        n = len(heads)
        if type(self.chain) is not int or not 0 <= self.chain < n:
            raise InvalidInput(f"checkpoint chain {self.chain!r} is not one of its {n} chains")
        for c, (size, digest) in enumerate(heads):
            if type(size) is not int or not 0 <= size <= MAX_SAFE_INTEGER or size % n != c:
                raise InvalidInput(f"checkpoint heads: chain {c} size {size!r} is not a seq of that chain")
            if not isinstance(digest, str) or _HEX64.fullmatch(digest) is None:
                raise InvalidInput(f"checkpoint heads: chain {c} hash is not 64 lowercase hex digits")
        if heads[self.chain] != (self.size, self.head_hash):
            raise InvalidInput("a checkpoint's head is not the head it names for its chain")
        if not isinstance(lanes, tuple) or [lane for lane, _ in lanes] != sorted({lane for lane, _ in lanes}):
            raise InvalidInput("checkpoint lanes must be unique and sorted")
        for lane, rows in lanes:
            if type(lane) is not int or not 0 <= lane < n:
                raise InvalidInput(f"checkpoint lanes: {lane!r} is not one of its {n} lanes")
            _check_rows(rows)

    @property
    def root(self) -> str | None:
        """:func:`heads_root` of :attr:`heads` (None in a store of one chain)."""
        return None if self.heads is None else heads_root(self.heads)

    @property
    def base(self) -> tuple[int, str] | None:
        """``(base_size, base_hash)``, or None for a checkpoint of the first format."""
        if self.base_size is None or self.base_hash is None:
            return None
        return self.base_size, self.base_hash

    def _signed_fields(self) -> dict[str, Any]:
        """Every field but the signature, as the JSON object the signature covers."""
        return _dict(
            self.origin,
            self.size,
            self.head_hash,
            self.time,
            self.base,
            self.rows,
            self.chain,
            self.heads,
            self.lanes,
        )

    def message(self) -> bytes:
        """The signed bytes: canonical JSON of every field but the signature."""
        return canonicalize(self._signed_fields())

    def verify(self, public_key: PublicKeyLike) -> bool:
        """True when the signature verifies under ``public_key``."""
        return ed25519_verify(public_key, self.message(), bytes.fromhex(self.signature))

    def to_json(self) -> bytes:
        """Canonical JSON of every field (one log line, without the newline)."""
        return canonicalize({**self._signed_fields(), "signature": self.signature})

    @classmethod
    def from_json(cls, data: str | bytes) -> Checkpoint:
        """Parse :meth:`to_json` output strictly (exact fields, types; signature not checked).

        Raises :class:`CanonicalJSONError` for bad JSON, :class:`InvalidInput` for bad fields.
        """
        d = loads_strict(data)
        if type(d) is not dict or d.keys() not in (_FIELDS, _FIELDS_BASE, _FIELDS_ROWS, _FIELDS_LANES):
            raise InvalidInput(
                f"a checkpoint needs exactly the fields {sorted(_FIELDS)} (and base_size, base_hash;"
                " and rows, or chain, heads and lanes)"
            )
        if "rows" in d:
            d["rows"] = _rows_from_json(d["rows"])
        if "lanes" in d:
            d["lanes"] = _lanes_from_json(d["lanes"])
            d["heads"] = _heads_from_json(d["heads"])
        return cls(**d)


def _fsync_dir(path: Path) -> None:
    if os.name != "posix":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckpointLog:
    """An append-only JSONL file of checkpoints (one canonical JSON object per line)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._mutex = threading.RLock()
        self._fd: int | None = None  # the locked log while :meth:`locked` is held
        self._depth = 0

    def all(self) -> list[Checkpoint]:
        """Every checkpoint in file order; ``[]`` when the file does not exist.

        A last line without its newline is an append a crash or a full disk interrupted: it
        was never acknowledged, so it is left out (with a warning) and cut off by the next
        append. Raises :class:`CanonicalJSONError` (message starts with ``line N:``) for a
        line that is not canonical strict JSON or an empty line, and :class:`InvalidInput`
        for a line with bad fields.
        """
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        lines = data.split(b"\n")
        if lines[-1]:
            _log.warning("%s: line %d is incomplete (an interrupted append); it is ignored", self.path, len(lines))
        checkpoints = []
        for number, line in enumerate(lines[:-1], start=1):
            try:
                checkpoint = Checkpoint.from_json(line)
            except CanonicalJSONError as exc:
                raise CanonicalJSONError(f"line {number}: {exc}") from None
            except InvalidInput as exc:
                raise InvalidInput(f"line {number}: {exc}") from None
            if checkpoint.to_json() != line:
                raise CanonicalJSONError(f"line {number}: not in canonical form")
            checkpoints.append(checkpoint)
        return checkpoints

    def latest(self) -> Checkpoint | None:
        """The last checkpoint, or None for an empty or missing log."""
        checkpoints = self.all()
        return checkpoints[-1] if checkpoints else None

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the log's exclusive lock (re-entrant): read the chain head and append under it,
        so checkpoints of processes sharing the store are appended in chain order."""
        with self._mutex:
            if self._depth == 0:
                created = not self.path.exists()
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                except BaseException:
                    os.close(fd)
                    raise
                self._fd = fd
                if created:
                    _fsync_dir(self.path.parent)
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0 and self._fd is not None:
                    os.close(self._fd)  # closing releases the lock
                    self._fd = None

    def append(self, checkpoint: Checkpoint) -> None:
        """Append ``checkpoint`` and fsync it, under the log's lock.

        Raises :class:`AuditChainBroken` if its size is below that of the latest checkpoint
        of the same origin (``seq`` = its size + 1, the first event that went missing) or
        equal with another head hash (``seq`` = that size); nothing is written then. A write
        that fails (OSError, a full disk) leaves the file as it was.
        """
        with self.locked():
            same = [c for c in self.all() if (c.origin, c.chain) == (checkpoint.origin, checkpoint.chain)]
            last = same[-1] if same else None
            if last is not None:
                if checkpoint.size < last.size:
                    raise AuditChainBroken(
                        f"chain shrank from {last.size} to {checkpoint.size} events",
                        seq=checkpoint.size + 1,
                    )
                if checkpoint.size == last.size and checkpoint.head_hash != last.head_hash:
                    raise AuditChainBroken(
                        f"head of event {last.size} differs from the last checkpoint",
                        seq=last.size,
                    )
            fd = self._fd
            assert fd is not None
            data = self.path.read_bytes()
            keep = data.rfind(b"\n") + 1  # cut off a torn last line
            if keep != len(data):
                _log.warning("%s: removing an incomplete last line (an interrupted append)", self.path)
            try:
                os.ftruncate(fd, keep)
                line = memoryview(checkpoint.to_json() + b"\n")
                at = keep
                while line:
                    n = os.pwrite(fd, line, at)
                    line, at = line[n:], at + n
                os.fsync(fd)
            except OSError:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, keep)
                    os.fsync(fd)
                raise


def verify_against_checkpoints(
    checkpoints: Iterable[Checkpoint],
    public_key: PublicKeyLike,
    hashes_by_seq: Callable[[int], str | None],
    chain_size: int,
    *,
    origin: str | None = None,
) -> VerifyResult:
    """Check the stored chain (``chain_size`` events) against signed checkpoints, in log order.

    ``hashes_by_seq(n)`` returns the stored ``event_hash`` of event ``n`` (None if missing);
    call this after :func:`~.verify.verify_chain` has accepted the rows.

    When ``origin`` is given only its checkpoints are checked (a log may hold several chains);
    without it every checkpoint must belong to the same chain. Failures, first found wins:

    * bad signature, size below the previous checkpoint, or same
      size with another head: ``first_bad_seq`` None (the checkpoints, not the chain, are bad);
    * ``chain_size`` below a checkpoint's size (truncated tail): ``chain_size + 1``;
    * stored hash at a checkpoint's size differs (chain rewritten or recomputed): that size.
      The rewrite began after the previous matching checkpoint; the reason names the range.

    On success ``count`` is the largest checkpointed size and ``head_hash`` its hash; events
    after it are covered by no checkpoint yet.
    """
    if type(chain_size) is not int or chain_size < 0:
        raise InvalidInput(f"chain_size {chain_size!r} is not an integer >= 0")
    good_size, good_hash = 0, GENESIS
    previous: Checkpoint | None = None
    for index, checkpoint in enumerate(checkpoints, start=1):
        if origin is not None and checkpoint.origin != origin:
            continue
        where = f"checkpoint {index} (size {checkpoint.size})"
        if not checkpoint.verify(public_key):
            return VerifyResult(False, good_size, good_hash, None, f"{where}: bad signature")
        if previous is not None and checkpoint.origin != previous.origin:
            reason = f"{where}: origin {checkpoint.origin!r} after {previous.origin!r}"
            return VerifyResult(False, good_size, good_hash, None, reason)
        if previous is not None and checkpoint.size < previous.size:
            reason = f"{where}: size decreased from {previous.size}"
            return VerifyResult(False, good_size, good_hash, None, reason)
        if previous is not None and checkpoint.size == previous.size and checkpoint.head_hash != previous.head_hash:
            reason = f"{where}: conflicts with the previous checkpoint of the same size"
            return VerifyResult(False, good_size, good_hash, None, reason)
        if checkpoint.size > chain_size:
            reason = f"{where}: chain has only {chain_size} events (tail truncated)"
            return VerifyResult(False, good_size, good_hash, chain_size + 1, reason)
        stored = GENESIS if checkpoint.size == 0 else hashes_by_seq(checkpoint.size)
        if stored != checkpoint.head_hash:
            reason = f"{where}: stored hash differs; chain rewritten in seqs {good_size + 1}..{checkpoint.size}"
            return VerifyResult(False, good_size, good_hash, checkpoint.size, reason)
        previous = checkpoint
        if checkpoint.size >= good_size:
            good_size, good_hash = checkpoint.size, checkpoint.head_hash
    return VerifyResult(True, good_size, good_hash, None, "")
