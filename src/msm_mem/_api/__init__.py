"""The api layer: :class:`MsmMem`, the one governed door to patient data."""

from .mem import MsmMem

__all__ = ["MsmMem"]
