"""How commands read times and print records: ISO 8601 in and out, records as plain JSON values."""

from __future__ import annotations

import json
from dataclasses import fields, is_dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from ... import InvalidInput
from ...datasets.manifest import parse_timestamp

__all__ = ["as_json", "iso", "parse_time", "print_json"]


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
    """Print ``value`` as exactly one line of JSON."""
    print(json.dumps(as_json(value), ensure_ascii=False))


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
