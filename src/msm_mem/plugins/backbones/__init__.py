"""Backbones: turn a fused prompt (+ image) into an answer. Chosen by name, imported lazily."""

from __future__ import annotations

from typing import Any

from ..._errors import InvalidInput
from .base import Backbone, BackboneReply, BackboneRequest, Candidate

__all__ = ["Backbone", "BackboneReply", "BackboneRequest", "Candidate", "get_backbone", "known_backbones"]

_KNOWN = ("nonparametric",)


def known_backbones() -> list[str]:
    return sorted(_KNOWN)


def get_backbone(name: str, **options: Any) -> Backbone:
    """The backbone registered under ``name``; unknown names raise :class:`InvalidInput`."""
    if name == "nonparametric":
        from .nonparametric import NonparametricBackbone

        return NonparametricBackbone(**options)
    raise InvalidInput(f"unknown backbone {name!r}; known: {', '.join(known_backbones())}")
