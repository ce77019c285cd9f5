"""Time as an injected dependency: every time in msm-mem is UTC seconds since the epoch."""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "FixedClock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """Something that tells the time in UTC seconds (float)."""

    def now(self) -> float: ...


class SystemClock:
    """The wall clock (``time.time()``)."""

    def now(self) -> float:
        return time.time()


class FixedClock:
    """A clock at a fixed UTC time (seconds) that moves only by :meth:`advance` or :meth:`set`."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        """Move forward by ``seconds`` (>= 0); returns the new time."""
        if seconds < 0:
            raise ValueError("a clock does not move backwards")
        self._now += float(seconds)
        return self._now

    def set(self, when: float) -> None:
        self._now = float(when)
