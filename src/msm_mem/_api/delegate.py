"""How :class:`~msm_mem.MsmMem` exposes the public methods of the operation groups it holds:
``ask = Delegated("_care", _Care.ask)`` in its class body makes ``mem.ask(...)`` call
``mem._care.ask(...)``, with the method's own signature, docstring and types (for mypy too)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import MethodType
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, cast, overload

__all__ = ["Delegated"]

G = TypeVar("G")
P = ParamSpec("P")
R = TypeVar("R")


class Delegated(Generic[G, P, R]):
    """A method of the group held in attribute ``group`` of its owner, seen on the owner: a
    function taking the owner first, which calls the method on the owner's group (on an
    instance, bound to it). It wears the method's name, docstring and signature (``help``,
    ``inspect.signature``); mypy types it from the method's parameters."""

    __slots__ = ("_method", "_unbound")

    def __init__(self, group: str, method: Callable[Concatenate[G, P], R]) -> None:
        self._method = method

        @functools.wraps(method)
        def unbound(owner: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
            return method(getattr(owner, group), *args, **kwargs)

        self._unbound = unbound

    def __set_name__(self, owner: type, name: str) -> None:
        if name != self._method.__name__:
            raise TypeError(f"{owner.__name__}.{name} delegates to a method named {self._method.__name__}")
        self._unbound.__qualname__ = f"{owner.__qualname__}.{name}"

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> Callable[Concatenate[Any, P], R]: ...

    @overload
    def __get__(self, instance: object, owner: type | None = None) -> Callable[P, R]: ...

    def __get__(
        self, instance: object | None, owner: type | None = None
    ) -> Callable[Concatenate[Any, P], R] | Callable[P, R]:
        if instance is None:
            return self._unbound
        return cast("Callable[P, R]", MethodType(self._unbound, instance))
