"""Backbones: turn a fused prompt (+ image) into an answer. Chosen by name, imported lazily.

- ``nonparametric`` (the default): a similarity-weighted vote over the retrieved evidence.
- ``fitted``: a memory-free image model and a router over the memory experts, fitted on the
  fine-tune split by ``msm-mem eval`` (option ``path``: its ``fitted.npz``).
- ``openai``: any OpenAI-compatible chat-completions server over HTTP (standard library only).
- ``transformers``: an in-process LLaVA-family model; needs the ``hf`` extra (torch +
  transformers), else :class:`~msm_mem._errors.MissingExtra`.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from ..._errors import InvalidInput
from .base import Backbone, BackboneReply, BackboneRequest, Candidate

__all__ = [
    "Backbone",
    "BackboneReply",
    "BackboneRequest",
    "BackboneSpec",
    "Candidate",
    "get_backbone",
    "known_backbones",
    "option_names",
]

_KNOWN = ("fitted", "nonparametric", "openai", "transformers")


class BackboneSpec(str):
    """A backbone name that carries its options: it goes wherever a backbone name goes (a
    setting, a report, a worker process) and :func:`get_backbone` builds it with ``options``.
    Its text is the name only, so a report or a results file never shows an option (an API key
    among them); it pickles and copies with them."""

    options: Mapping[str, Any]

    def __new__(cls, name: str, options: Mapping[str, Any] | None = None) -> BackboneSpec:
        spec = super().__new__(cls, name)
        spec.options = MappingProxyType(dict(options or {}))
        return spec

    def __reduce__(self) -> tuple[Any, ...]:
        return (BackboneSpec, (str(self), dict(self.options)))

    def __deepcopy__(self, memo: object) -> BackboneSpec:
        return self  # immutable: a copy is the same spec

    def __repr__(self) -> str:  # the options may hold a key: only their names are shown
        return f"BackboneSpec({str(self)!r}, options={sorted(self.options)})"


def known_backbones() -> list[str]:
    """Every registered backbone name, sorted, whether or not its extras are installed."""
    return sorted(_KNOWN)


def _class(name: str) -> type[Any]:
    cls: type[Any]
    if name == "nonparametric":
        from .nonparametric import NonparametricBackbone as cls
    elif name == "fitted":
        from .fitted import FittedBackbone as cls
    elif name == "openai":
        from .openai_http import OpenAICompatibleBackbone as cls
    elif name == "transformers":
        from .hf import TransformersBackbone as cls
    else:
        raise InvalidInput(f"unknown backbone {name!r}; known: {', '.join(known_backbones())}")
    return cls


def option_names(name: str) -> tuple[str, ...]:
    """The options backbone ``name`` takes, in the order of its signature (InvalidInput for an
    unknown name)."""
    params = inspect.signature(_class(name)).parameters.values()
    return tuple(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def get_backbone(name: str, **options: Any) -> Backbone:
    """The backbone registered under ``name``, built with ``options`` as keyword arguments.

    ``name`` may be a :class:`BackboneSpec` (its options first, then ``options``). Unknown
    names and missing or unknown options raise :class:`InvalidInput` (naming the options the
    backbone takes); ``transformers`` without torch/transformers
    installed raises :class:`~msm_mem._errors.MissingExtra`.
    """
    if isinstance(name, BackboneSpec):
        options = {**name.options, **options}
        name = str(name)
    cls = _class(name)
    try:
        inspect.signature(cls).bind(**options)
    except TypeError as exc:
        params = [
            p.name + ("" if p.default is inspect.Parameter.empty else "=...")
            for p in inspect.signature(cls).parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        ]
        raise InvalidInput(
            f"backbone {name!r}: bad options {sorted(options)} ({exc}); it takes {', '.join(params) or 'no options'}"
        ) from None
    backbone: Backbone = cls(**options)
    return backbone
