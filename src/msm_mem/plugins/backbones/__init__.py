"""Backbones: turn a fused prompt (+ image) into an answer. Chosen by name, imported lazily.

- ``nonparametric`` (the default): a similarity-weighted vote over the retrieved evidence.
- ``openai``: any OpenAI-compatible chat-completions server over HTTP (standard library only).
- ``transformers``: an in-process LLaVA-family model; needs the ``hf`` extra (torch +
  transformers), else :class:`~msm_mem._errors.MissingExtra`.
"""

from __future__ import annotations

from typing import Any

from ..._errors import InvalidInput
from .base import Backbone, BackboneReply, BackboneRequest, Candidate

__all__ = [
    "Backbone",
    "BackboneReply",
    "BackboneRequest",
    "Candidate",
    "get_backbone",
    "known_backbones",
]

_KNOWN = ("nonparametric", "openai", "transformers")


def known_backbones() -> list[str]:
    """Every registered backbone name, sorted, whether or not its extras are installed."""
    return sorted(_KNOWN)


def get_backbone(name: str, **options: Any) -> Backbone:
    """The backbone registered under ``name``, built with ``options`` as keyword arguments.

    Unknown names raise :class:`InvalidInput`; ``transformers`` without torch/transformers
    installed raises :class:`~msm_mem._errors.MissingExtra`.
    """
    if name == "nonparametric":
        from .nonparametric import NonparametricBackbone

        return NonparametricBackbone(**options)
    if name == "openai":
        from .openai_http import OpenAICompatibleBackbone

        return OpenAICompatibleBackbone(**options)
    if name == "transformers":
        from .hf import TransformersBackbone

        return TransformersBackbone(**options)
    raise InvalidInput(f"unknown backbone {name!r}; known: {', '.join(known_backbones())}")
