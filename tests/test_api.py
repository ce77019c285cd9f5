"""Tests of the Python API (msm_mem._api.mem) beyond what the CLI tests reach through it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from msm_mem import InvalidInput, MsmMem
from msm_mem._governance.audit_event import AuditEvent
from tests.helpers import ADMIN, AGENT, EXPORTER


def test_api_ask_refuses_unknown_options(tmp_path: Path) -> None:
    """MsmMem.ask names an unknown keyword option instead of failing with a TypeError."""
    with MsmMem.init(tmp_path / "s", ADMIN) as mem, pytest.raises(InvalidInput, match="studyid"):
        mem.ask(AGENT, "P1", np.zeros((8, 8), dtype=np.float32), "q?", studyid="S1")


def test_api_import_is_audited(tmp_path: Path) -> None:
    """After an API import the audit chain verifies and its last event is the import."""
    with MsmMem.init(tmp_path / "a", ADMIN) as src:
        src.ask(AGENT, "P1", np.random.default_rng(0).random((16, 16), dtype=np.float32), "Any consolidation?")
        src.export_paper(EXPORTER, tmp_path / "out")
    with MsmMem.init(tmp_path / "b", ADMIN) as dst:
        counts = dst.import_paper(ADMIN, tmp_path / "out")
        assert counts["episodic"] == dst._store.count("episodic")
        last = list(dst._store.iter_audit())[-1]
        assert AuditEvent.from_row(*last).action == "import" and dst._audit.verify().ok
