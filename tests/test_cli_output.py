"""Tests of msm_mem.interfaces.cli.output: records and stored text reach the terminal escaped."""

from __future__ import annotations

import dataclasses
import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from msm_mem import MsmMem
from msm_mem.interfaces.cli.output import escaped_output, print_json, terminal_safe
from tests.cli_support import CLINICIAN, clean_env, make_store, run

#: what a hostile record might hold: a clear-screen, a C1 CSI, a window-title OSC, an RLO
HOSTILE = "a\x1b[2J b\x9b31m c\x1b]0;owned\x07 d\u202ee\u200bf\rg"


def test_terminal_safe_escapes_what_a_terminal_acts_on() -> None:
    """ESC, C1, BEL, CR, bidi and zero-width characters become visible escapes; tab and newline stay."""
    assert terminal_safe(HOSTILE) == "a\\x1b[2J b\\x9b31m c\\x1b]0;owned\\x07 d\\u202ee\\u200bf\\x0dg"
    assert (
        terminal_safe("line one\n\tline two, caf\u00e9 \u60a3\u8005") == "line one\n\tline two, caf\u00e9 \u60a3\u8005"
    )


def test_escaped_output_wraps_both_streams_and_restores_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside the block print escapes on stdout and stderr (stderr keeps the carriage return a
    progress bar redraws with); after it the original streams are back."""
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    with escaped_output():
        print(HOSTILE)
        print(HOSTILE, file=sys.stderr)
    assert sys.stdout is out and sys.stderr is err
    for stream in (out, err):
        text = stream.getvalue()
        assert not any(ch in text for ch in "\x1b\x9b\x07\u202e\u200b"), text
    assert "\\x0dg" in out.getvalue() and "f\rg" in err.getvalue()


def test_print_json_stays_valid_json_with_hostile_text(capsys: pytest.CaptureFixture[str]) -> None:
    """JSON output writes controls and bidi characters as \\u escapes: one valid line, same value."""
    with escaped_output():
        print_json({"answer": HOSTILE})
    out = capsys.readouterr().out
    assert not any(ch in out for ch in "\x1b\x9b\x07\r\u202e\u200b")
    assert json.loads(out) == {"answer": HOSTILE}


def test_show_never_writes_raw_escape_codes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stored answer holding escape codes (written before the input rules) is shown escaped, as text and JSON."""
    clean_env(monkeypatch)
    store, _ = make_store(tmp_path)
    real = MsmMem.episodes

    def hostile(self: MsmMem, *args: Any, **kwargs: Any) -> Any:
        return [dataclasses.replace(e, answer=HOSTILE, question=HOSTILE) for e in real(self, *args, **kwargs)]

    monkeypatch.setattr(MsmMem, "episodes", hostile)
    for extra in ([], ["--json"]):
        rc, out, err = run(capsys, "show", "episodes", store, "--patient", "p1", *CLINICIAN, *extra)
        assert rc == 0, err
        assert "owned" in out
        assert not any(ch in out for ch in "\x1b\x9b\x07\r\u202e\u200b"), out
