"""How much one client may ask of a server process: request rates per credential and per client
address (token buckets), failed logins per address (a window after which the address is
refused without a hash being computed), and concurrent image decodes (a semaphore).

Everything here is per process and in memory: several worker processes each keep their own
counts, so a limit is per worker (``--workers N`` allows N times the rate in all). Time comes
from a monotonic clock passed in, so tests move it instead of sleeping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["FailureWindow", "RateLimiter", "Throttle"]

#: keys a limiter remembers before it forgets the idle ones (bounds its memory)
MAX_KEYS = 100_000


class RateLimiter:
    """A token bucket per key: ``rate`` requests a second sustained, bursts of ``burst``;
    ``rate`` 0 allows everything."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = float(rate)
        self.burst = max(1.0, float(burst))
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, time)

    def take(self, key: str) -> float:
        """Take one request's token for ``key``: 0.0 when there was one, else the seconds until
        there will be (nothing taken)."""
        if self.rate <= 0:
            return 0.0
        now = self._clock()
        with self._lock:
            tokens, then = self._buckets.get(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - then) * self.rate)
            if tokens >= 1.0:
                self._buckets[key] = (tokens - 1.0, now)
                self._forget(now)
                return 0.0
            self._buckets[key] = (tokens, now)
            return (1.0 - tokens) / self.rate

    def _forget(self, now: float) -> None:
        if len(self._buckets) > MAX_KEYS:  # a full bucket says nothing: drop those
            full = now - self.burst / self.rate
            self._buckets = {k: v for k, v in self._buckets.items() if v[1] > full}


class FailureWindow:
    """Failed logins per key (a client address): after ``limit`` failures within ``window_s``
    seconds the key is blocked until the oldest of them is ``window_s`` old; ``limit`` 0
    blocks nothing."""

    def __init__(self, limit: int, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = int(limit)
        self.window_s = float(window_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._failures: dict[str, list[float]] = {}

    def blocked(self, key: str) -> float:
        """The seconds ``key`` stays blocked (0.0: not blocked)."""
        if self.limit <= 0:
            return 0.0
        now = self._clock()
        with self._lock:
            times = self._recent(key, now)
            if len(times) < self.limit:
                return 0.0
            return max(0.0, times[-self.limit] + self.window_s - now)

    def fail(self, key: str) -> None:
        """Count one failed login of ``key``."""
        if self.limit <= 0:
            return
        now = self._clock()
        with self._lock:
            times = self._recent(key, now)
            times.append(now)
            del times[: max(0, len(times) - self.limit)]
            self._failures[key] = times
            if len(self._failures) > MAX_KEYS:
                self._failures = {k: v for k, v in self._failures.items() if v and v[-1] > now - self.window_s}

    def _recent(self, key: str, now: float) -> list[float]:
        return [t for t in self._failures.get(key, ()) if t > now - self.window_s]


@dataclass
class Throttle:
    """One process's limits: requests per credential and per address, failed logins per
    address, and a slot per concurrent image decode."""

    per_credential: RateLimiter
    per_address: RateLimiter
    logins: FailureWindow
    decodes: threading.BoundedSemaphore
    decode_wait_s: float
    clock: Callable[[], float] = field(default=time.monotonic)
