"""Tests of msm_mem._errors: the exception tree, its builtins and its documented drawing."""

from __future__ import annotations

import builtins
import re

import pytest

import msm_mem
from msm_mem import _errors
from msm_mem._errors import (
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

# class -> (direct msm-mem parent, the builtin it must also be)
EXPECTED: dict[type[Exception], tuple[type[Exception], type[Exception]]] = {
    InvalidInput: (MsmMemError, ValueError),
    InvalidVector: (InvalidInput, ValueError),
    ImageError: (InvalidInput, ValueError),
    ManifestError: (InvalidInput, ValueError),
    CanonicalJSONError: (InvalidInput, ValueError),
    NotFound: (MsmMemError, LookupError),
    StoreError: (MsmMemError, RuntimeError),
    EncoderMismatch: (StoreError, RuntimeError),
    CheckpointKeyMissing: (StoreError, FileNotFoundError),
    AccessDenied: (MsmMemError, PermissionError),
    ConsentDenied: (AccessDenied, PermissionError),
    IllegalTransition: (AccessDenied, PermissionError),
    WriteConflict: (IllegalTransition, PermissionError),
    IntegrityError: (MsmMemError, RuntimeError),
    AuditChainBroken: (IntegrityError, RuntimeError),
    DecryptionError: (IntegrityError, RuntimeError),
    BackendError: (MsmMemError, RuntimeError),
    BackendUnavailable: (BackendError, RuntimeError),
    MissingExtra: (MsmMemError, ImportError),
}


def test_every_error_is_covered_by_this_table() -> None:
    """The table above lists every exported error except the base (so new ones get checked)."""
    exported = {getattr(_errors, n) for n in _errors.__all__}
    assert exported == set(EXPECTED) | {MsmMemError}


def test_base_is_a_plain_exception() -> None:
    """MsmMemError derives from Exception and does not shadow a builtin name."""
    assert issubclass(MsmMemError, Exception)
    assert not hasattr(builtins, "MsmMemError")
    for name in _errors.__all__:
        assert not hasattr(builtins, name), f"{name} shadows a builtin"


@pytest.mark.parametrize("cls", list(EXPECTED), ids=[c.__name__ for c in EXPECTED])
def test_every_error_subclasses_base_parent_and_builtin(cls: type[Exception]) -> None:
    """Each error is an MsmMemError, a subclass of its parent and of its documented builtin."""
    parent, builtin = EXPECTED[cls]
    assert issubclass(cls, MsmMemError)
    assert issubclass(cls, parent)
    assert issubclass(cls, builtin)


def test_named_builtins_from_the_style_guide() -> None:
    """NotFound is a LookupError, ConsentDenied a PermissionError, MissingExtra an ImportError."""
    with pytest.raises(LookupError):
        raise NotFound("patient p1")
    with pytest.raises(PermissionError):
        raise ConsentDenied("no permit")
    with pytest.raises(ImportError):
        raise MissingExtra("torch", "torch")


def test_missing_extra_message_has_the_install_hint() -> None:
    """MissingExtra names the package and the pip extra to install, and keeps both."""
    err = MissingExtra("open_clip", "openclip")
    assert str(err) == "open_clip is not installed: pip install 'msm-mem[openclip]'"
    assert (err.package, err.extra) == ("open_clip", "openclip")


def test_manifest_error_carries_line_and_reason() -> None:
    """ManifestError keeps its 1-based line, the bare reason, and prefixes the message."""
    err = ManifestError("empty question", 12)
    assert (err.line, err.reason) == (12, "empty question")
    assert str(err) == "line 12: empty question"
    whole = ManifestError("not UTF-8")
    assert (whole.line, str(whole)) == (None, "not UTF-8")


def test_audit_chain_broken_carries_seq() -> None:
    """AuditChainBroken keeps the sequence number of the first bad event (or None)."""
    assert AuditChainBroken("bad hash", seq=4).seq == 4
    assert AuditChainBroken("bad checkpoint").seq is None


def test_errors_are_reexported_by_the_package() -> None:
    """Every error class is reachable as msm_mem.<Name> and is the same object."""
    for name in _errors.__all__:
        assert getattr(msm_mem, name) is getattr(_errors, name)


def _drawn_tree() -> dict[str, tuple[str, str | None]]:
    """Parse the module docstring's drawing into name -> (parent, builtin or None)."""
    doc = _errors.__doc__ or ""
    out: dict[str, tuple[str, str | None]] = {}
    stack: list[tuple[int, str]] = []
    for line in doc.splitlines():
        m = re.match(r"^(\s*)(?:[|\s]*\+--\s*)?([A-Z]\w+)(?:\((\w+)\))?", line)
        if not m or ("+--" not in line and m.group(2) != "MsmMemError"):
            continue
        depth = line.index("+--") if "+--" in line else -1
        while stack and stack[-1][0] >= depth:
            stack.pop()
        if stack:
            out[m.group(2)] = (stack[-1][1], m.group(3))
        stack.append((depth, m.group(2)))
    return out


def test_docstring_drawing_matches_the_classes() -> None:
    """The tree drawn in the module docstring has every class with its real parent and builtin."""
    drawn = _drawn_tree()
    assert set(drawn) == {c.__name__ for c in EXPECTED}
    for cls, (parent, builtin) in EXPECTED.items():
        drawn_parent, drawn_builtin = drawn[cls.__name__]
        assert drawn_parent == parent.__name__, cls.__name__
        if drawn_builtin is not None:
            assert drawn_builtin == builtin.__name__, cls.__name__
