"""How commands read times and print records: ISO 8601 in and out, records as plain JSON values,
and every line written to the terminal with its control characters escaped.

A record may hold text stored before the input rules refused control characters (an ESC, a
C1 control, a right-to-left override): :func:`escaped_output`, which ``main`` wraps around
every command, writes each such character as its Python escape (``\\x1b``, ``\\u202e``) so no
output of the CLI can move the cursor, recolour, retitle or reorder the terminal.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields, is_dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import Any, TextIO

from ... import InvalidInput
from ...datasets.manifest import parse_timestamp

__all__ = ["as_json", "escaped_output", "iso", "parse_time", "print_json", "terminal_safe"]

#: what a terminal acts on rather than shows: C0 controls but tab and newline, DEL and C1
#: controls, bidirectional marks, overrides and isolates, zero-width characters, line and
#: paragraph separators
_UNSAFE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u2069\ufeff]"
)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: str, *, carriage_return: bool = False) -> str:
    """``text`` with every character a terminal would act on (see :data:`_UNSAFE`) written as
    its escape (``\\x1b``, ``\\u202e``); tabs and newlines are kept, and with
    ``carriage_return`` a carriage return too (a progress bar redraws its line with it)."""
    if carriage_return:
        return _UNSAFE.sub(lambda m: m.group() if m.group() == "\r" else _escape(m), text)
    return _UNSAFE.sub(_escape, text)


class _Escaping:
    """A text stream that writes through :func:`terminal_safe` (everything else delegated)."""

    def __init__(self, stream: TextIO, *, carriage_return: bool = False) -> None:
        self._stream = stream
        self._carriage_return = carriage_return

    def write(self, text: str) -> int:
        self._stream.write(terminal_safe(text, carriage_return=self._carriage_return))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextmanager
def escaped_output() -> Iterator[None]:
    """Within the block, ``sys.stdout`` and ``sys.stderr`` escape control characters (the
    streams in place before are restored after it); stderr keeps carriage returns, with which
    the progress bars redraw their line."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Escaping(out), _Escaping(err, carriage_return=True)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err


def as_json(value: object) -> Any:
    """``value`` (a record, an enum, a sequence or a mapping of them) as JSON values; the
    embedding ``z`` of a record is left out (vectors are not for terminals)."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: as_json(getattr(value, f.name)) for f in fields(value) if f.name != "z"}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, list | tuple):
        return [as_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): as_json(v) for k, v in value.items()}
    return value


def print_json(value: object) -> None:
    """Print ``value`` as exactly one line of JSON (a character a terminal would act on as a
    JSON ``\\uXXXX`` escape, so the line stays valid JSON)."""
    text = json.dumps(as_json(value), ensure_ascii=False)
    print(_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text))


def iso(t: float | None, none: str = "open") -> str:
    """UTC seconds as ISO 8601 (``none`` for no time)."""
    return none if t is None else datetime.fromtimestamp(t, UTC).isoformat()


def parse_time(text: str | None) -> float | None:
    """An ISO 8601 time (naive means UTC) as UTC seconds;
    None stays None. A malformed time is InvalidInput."""
    if text is None:
        return None
    try:
        return parse_timestamp(text)
    except ValueError as exc:
        raise InvalidInput(f"bad time {text!r}: {exc}") from exc
