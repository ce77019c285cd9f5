"""Tests of how MsmMem exposes its operation groups: it inherits none of them, and every public
method of every group is a method of MsmMem with that method's signature and docstring."""

from __future__ import annotations

import inspect
from pathlib import Path

from msm_mem import MsmMem, Principal, Purpose, Role
from msm_mem._api.admin import _Admin
from msm_mem._api.care import _Care
from msm_mem._api.context import _Context
from msm_mem._api.reads import _Reads
from msm_mem._api.scope import _Scope
from msm_mem._api.trail import _Trail

GROUPS = (_Care, _Context, _Reads, _Admin, _Trail, _Scope)
ADMIN = Principal("admin-1", Role.ADMIN, Purpose.OPERATIONS)


def test_msm_mem_inherits_no_group() -> None:
    """MsmMem holds its groups instead of inheriting them."""
    assert MsmMem.__mro__ == (MsmMem, object)


def test_every_public_group_method_is_exposed_as_itself() -> None:
    """Each public method of a group is MsmMem's method of that name: same signature, same docstring."""
    for group in GROUPS:
        for name, method in vars(group).items():
            if name.startswith("_") or not inspect.isfunction(method):
                continue
            exposed = getattr(MsmMem, name, None)
            assert exposed is not None, f"{group.__name__}.{name} is not exposed on MsmMem"
            assert inspect.signature(exposed) == inspect.signature(method), name
            assert exposed.__doc__ == method.__doc__, name
            assert exposed.__qualname__ == f"MsmMem.{name}"


def test_an_operation_is_bound_to_the_memory(tmp_path: Path) -> None:
    """On an open store an operation is a method of the MsmMem (its self), called on its group."""
    with MsmMem.init(tmp_path / "m", ADMIN) as mem:
        assert mem.consents.__self__ is mem
        assert "self" not in inspect.signature(mem.ask).parameters
        assert mem.consents(ADMIN).total == MsmMem.consents(mem, ADMIN).total > 0
