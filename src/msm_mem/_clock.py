"""Time as an injected dependency: every time in msm-mem is UTC seconds since the epoch."""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """Something that tells the time in UTC seconds (float)."""

    def now(self) -> float: ...


class SystemClock:
    """The wall clock (``time.time()``)."""

    def now(self) -> float:
        return time.time()
