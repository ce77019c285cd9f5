"""The error classes as RFC 9457 problem types: one stable ``type`` URI and HTTP status per class.

Shared by the HTTP server (which answers an error with ``application/problem+json``) and by
:class:`~msm_mem.MemoryClient` (which raises the class of the problem's ``type`` again), so both
ends read one table. A class not listed answers as its nearest listed ancestor. The problems
the HTTP layer raises itself (no credential, a malformed or oversized request) have types of
their own and come back to a client as the library class named here.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._errors import (
    AccessDenied,
    AuditChainBroken,
    BackendError,
    BackendUnavailable,
    CanonicalJSONError,
    CheckpointKeyMissing,
    ConsentDenied,
    DecryptionError,
    EncoderMismatch,
    IllegalTransition,
    ImageError,
    IntegrityError,
    InvalidInput,
    InvalidVector,
    ManifestError,
    MissingExtra,
    MsmMemError,
    NotFound,
    StoreError,
    WriteConflict,
)

__all__ = ["HTTP", "LIBRARY", "PROBLEMS", "PROBLEM_BASE", "Problem", "problem_for", "problem_of_type", "slug"]

#: every problem type is this prefix and a slug, e.g. ``urn:msm-mem:problem:consent-denied``
PROBLEM_BASE = "urn:msm-mem:problem:"


@dataclass(frozen=True, slots=True)
class Problem:
    """One problem type: the error class it stands for, its HTTP status, slug and title."""

    error: type[MsmMemError]
    status: int
    slug: str
    title: str

    @property
    def type(self) -> str:
        return PROBLEM_BASE + self.slug


#: the library's classes, most specific first: :func:`problem_for` takes the first that matches
LIBRARY: tuple[Problem, ...] = (
    Problem(ConsentDenied, 403, "consent-denied", "No consent permits this access"),
    Problem(WriteConflict, 409, "write-conflict", "Another writer changed or stored it first"),
    Problem(IllegalTransition, 409, "illegal-transition", "A move the transition table does not allow"),
    Problem(AccessDenied, 403, "access-denied", "The access was refused"),
    Problem(InvalidVector, 422, "invalid-vector", "Invalid vector"),
    Problem(ImageError, 422, "image-error", "The image cannot be read"),
    Problem(ManifestError, 422, "manifest-error", "Malformed manifest row"),
    Problem(CanonicalJSONError, 422, "canonical-json-error", "JSON that cannot be canonicalised"),
    Problem(InvalidInput, 422, "invalid-input", "Invalid input"),
    Problem(NotFound, 404, "not-found", "Not found"),
    Problem(EncoderMismatch, 409, "encoder-mismatch", "Vectors of another encoder than the store's"),
    Problem(CheckpointKeyMissing, 503, "checkpoint-key-missing", "The audit checkpoint signing key is missing"),
    Problem(StoreError, 503, "store-error", "The store cannot be used"),
    Problem(AuditChainBroken, 409, "audit-chain-broken", "The audit chain does not verify"),
    Problem(DecryptionError, 500, "decryption-error", "A ciphertext failed authentication"),
    Problem(IntegrityError, 500, "integrity-error", "Stored data failed an integrity check"),
    Problem(BackendUnavailable, 503, "backend-unavailable", "The model server is unavailable"),
    Problem(BackendError, 502, "backend-error", "The model backend failed"),
    Problem(MissingExtra, 501, "missing-extra", "An optional dependency is not installed"),
)

#: the HTTP layer's own problems, raised on the client as the library class they name
HTTP: tuple[Problem, ...] = (
    Problem(AccessDenied, 401, "unauthenticated", "No valid credential"),
    Problem(InvalidInput, 400, "malformed-request", "The request cannot be parsed"),
    Problem(InvalidInput, 413, "payload-too-large", "The request body is too large"),
    Problem(InvalidInput, 415, "unsupported-media-type", "Unsupported content type"),
    Problem(NotFound, 404, "no-route", "No such endpoint"),
    Problem(InvalidInput, 405, "method-not-allowed", "Method not allowed"),
    Problem(AccessDenied, 429, "too-many-requests", "Too many requests: retry after the Retry-After seconds"),
    Problem(MsmMemError, 503, "server-busy", "The server is busy: retry after the Retry-After seconds"),
    Problem(MsmMemError, 500, "internal-error", "Internal error"),
)

PROBLEMS: tuple[Problem, ...] = LIBRARY + HTTP

_BY_TYPE = {p.type: p for p in PROBLEMS}
_BY_SLUG = {p.slug: p for p in PROBLEMS}


def problem_for(error: BaseException) -> Problem:
    """The problem type of ``error``: its own class's, else its nearest listed ancestor's,
    else ``internal-error`` (anything that is not an MsmMemError)."""
    for p in LIBRARY:
        if isinstance(error, p.error):
            return p
    return _BY_SLUG["internal-error"]


def problem_of_type(type_uri: str) -> Problem | None:
    """The problem with this ``type`` URI, or None for one this version does not know."""
    return _BY_TYPE.get(type_uri)


def slug(name: str) -> Problem:
    """The problem with this slug (the HTTP layer's own problems)."""
    return _BY_SLUG[name]
