"""The exception tree of msm-mem.

Every error the library raises on purpose derives from :class:`MsmMemError`; each leaf also
subclasses the builtin it resembles, so ``except LookupError`` keeps working for callers that
do not know this library::

    MsmMemError
    +-- InvalidInput(ValueError)            bad data from outside: vectors, rows, files, settings
    |   +-- InvalidVector                   wrong dimension, NaN/Inf, zero norm
    |   +-- ImageError                      unreadable or unsupported image file
    |   +-- ManifestError                   a malformed manifest row (carries the line number)
    |   +-- CanonicalJSONError              JSON that RFC 8785 canonicalisation must refuse
    +-- NotFound(LookupError)               unknown patient, record, key or consent
    +-- StoreError(RuntimeError)            a directory that is not a store, a schema mismatch
    |   +-- EncoderMismatch                 vectors from another encoder than the store's
    |   +-- CheckpointKeyMissing(FileNotFoundError)  the checkpoint signing key is gone (never regenerated)
    +-- AccessDenied(PermissionError)       a governed action that is refused (always audited)
    |   +-- ConsentDenied                   no matching permit in the consent records
    |   +-- IllegalTransition               a move not in the transition table
    |       +-- WriteConflict               another writer changed or stored it first (retry)
    +-- IntegrityError(RuntimeError)
    |   +-- AuditChainBroken                the audit chain or its checkpoints do not verify
    |   +-- DecryptionError                 a ciphertext that fails authentication or was shredded
    +-- BackendError(RuntimeError)          a model backend failed (malformed or refused reply)
    |   +-- BackendUnavailable              the model server cannot be reached, times out or is overloaded
    +-- MissingExtra(ImportError)           an optional dependency is not installed

The HTTP layer maps these to status codes in one table; the CLI maps them to exit codes.
"""

from __future__ import annotations

__all__ = [
    "AccessDenied",
    "AuditChainBroken",
    "BackendError",
    "BackendUnavailable",
    "CanonicalJSONError",
    "CheckpointKeyMissing",
    "ConsentDenied",
    "DecryptionError",
    "EncoderMismatch",
    "IllegalTransition",
    "ImageError",
    "IntegrityError",
    "InvalidInput",
    "InvalidVector",
    "ManifestError",
    "MissingExtra",
    "MsmMemError",
    "NotFound",
    "StoreError",
    "WriteConflict",
]


class MsmMemError(Exception):
    """Base class of every error raised by msm-mem."""


class InvalidInput(MsmMemError, ValueError):
    """Input from outside the library failed validation; nothing was written."""


class InvalidVector(InvalidInput):
    """A vector with the wrong dimension, a non-finite value or zero norm."""


class ImageError(InvalidInput):
    """An image file that cannot be read or has an unsupported format."""


class ManifestError(InvalidInput):
    """A malformed manifest row; ``line`` is its 1-based line number in the file."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message if line is None else f"line {line}: {message}")
        self.line = line
        self.reason = message


class CanonicalJSONError(InvalidInput):
    """JSON that RFC 8785 canonicalisation refuses (duplicate keys, NaN, lone surrogates...)."""


class NotFound(MsmMemError, LookupError):
    """An unknown patient, record, key or consent id."""


class StoreError(MsmMemError, RuntimeError):
    """The store cannot be opened or used (not a store directory, schema mismatch)."""


class CheckpointKeyMissing(StoreError, FileNotFoundError):
    """The audit checkpoint signing key is not where the store was told to find it; it is
    never regenerated (checkpoints signed by a new key would not verify)."""


class EncoderMismatch(StoreError):
    """Vectors produced by another encoder (name or dimension) than the store was built with."""


class AccessDenied(MsmMemError, PermissionError):
    """A governed action was refused; the refusal is recorded in the audit tier."""


class ConsentDenied(AccessDenied):
    """No consent record permits this actor, purpose and data class for the patient."""


class IllegalTransition(AccessDenied):
    """A move between tiers or states that the transition table does not allow."""


class WriteConflict(IllegalTransition):
    """Another writer stored first a record this write also makes (the same ingested row): the
    database refused the second copy and nothing was written; reading again resolves it."""


class IntegrityError(MsmMemError, RuntimeError):
    """Stored data failed an integrity check."""


class AuditChainBroken(IntegrityError):
    """The audit hash chain or a checkpoint does not verify; ``seq`` is the first bad event."""

    def __init__(self, message: str, seq: int | None = None) -> None:
        super().__init__(message)
        self.seq = seq


class DecryptionError(IntegrityError):
    """A ciphertext failed authentication, was moved between records, or its key was shredded."""


class BackendError(MsmMemError, RuntimeError):
    """A model backend failed: timeout, transport error or a malformed reply."""


class BackendUnavailable(BackendError):
    """The model server cannot be reached, timed out, or answered 429 or 5xx after every retry."""


class MissingExtra(MsmMemError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""

    def __init__(self, package: str, extra: str) -> None:
        super().__init__(f"{package} is not installed: pip install 'msm-mem[{extra}]'")
        self.package = package
        self.extra = extra
