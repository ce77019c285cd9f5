"""Tests of the operation table (msm_mem._api.access): read-only, checked before anything runs."""

from __future__ import annotations

import pytest

import msm_mem
from msm_mem import OPERATIONS, AccessDenied, InvalidInput, Operation, Principal, Role
from msm_mem._api import access


def test_every_operation_has_its_roles() -> None:
    """Each operation of the governed API names at least one role allowed to call it."""
    assert set(OPERATIONS) == set(Operation)
    assert all(OPERATIONS[op] for op in Operation)


def test_an_importer_cannot_widen_a_role() -> None:
    """The table is a read-only view: assigning, deleting or clearing an entry raises TypeError."""
    for table in (OPERATIONS, msm_mem.OPERATIONS, access.OPERATIONS):
        with pytest.raises(TypeError):
            table[Operation.SHRED] = frozenset(Role)  # type: ignore[index]
        with pytest.raises(TypeError):
            del table[Operation.SHRED]  # type: ignore[attr-defined]
        with pytest.raises(AttributeError):
            table.clear()  # type: ignore[attr-defined]
        with pytest.raises(AttributeError, match="read-only"):
            table._roles = {op: frozenset(Role) for op in Operation}  # type: ignore[misc]
    with pytest.raises(AccessDenied, match="may not shred: only admin"):
        access.require(Principal("a-1", Role.AGENT), Operation.SHRED)


def test_require_refuses_what_is_not_a_principal() -> None:
    """A caller without type checking that passes a tuple or a string gets InvalidInput."""
    for fake in (("a-1", "admin"), "admin", None):
        with pytest.raises(InvalidInput, match="needs a Principal"):
            access.require(fake, Operation.ASK)


def test_require_returns_an_allowed_principal() -> None:
    """A role in the operation's set passes through unchanged."""
    p = Principal("c-1", Role.CLINICIAN)
    assert access.require(p, Operation.ASK) is p
