"""What the manifest tests share: the CSV header, a good row, and files of rows to read."""

from __future__ import annotations

import json
from pathlib import Path

from msm_mem import RowProblem
from msm_mem.datasets.manifest import COLUMNS

HEADER = ",".join(COLUMNS)
GOOD = "p1,s1,2020-01-02,img/a.png,What is seen?,small effusion,report text,follow up"


def write_file(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` as UTF-8; return the path."""
    path.write_text(text, encoding="utf-8")
    return path


def json_row(**changes: object) -> dict[str, object]:
    """A good JSONL row as a dict, with ``changes`` over its fields."""
    base: dict[str, object] = {
        "patient_id": "p1",
        "study_id": "s1",
        "timestamp": "2020-01-02T03:04:05Z",
        "image": "a.png",
        "question": "What is seen?",
        "answer": "small effusion",
        "report": "",
        "decision": "",
    }
    base.update(changes)
    return base


def write_jsonl(path: Path, items: list[object]) -> Path:
    """A JSONL file of ``items``: dicts as JSON, strings as they are (one per line)."""
    lines = [x if isinstance(x, str) else json.dumps(x) for x in items]
    return write_file(path, "\n".join(lines) + "\n")


def by_line(problems: list[RowProblem]) -> dict[int, str]:
    """Each problem's reason by its line."""
    return {p.line: p.reason for p in problems}
