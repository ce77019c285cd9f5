"""Tests of the command line (msm_mem.interfaces.cli, cli_extra) and the demo, run in-process."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import msm_mem
from msm_mem import MsmMem, SqliteStore
from msm_mem.interfaces import cli
from msm_mem.interfaces.cli import COMMANDS, build_parser, main
from msm_mem.interfaces.demo import run_demo

HEADER = "patient_id,study_id,timestamp,image,question,answer,report,decision"
QUESTION = "What is seen on the chest radiograph?"
KINDS = {"episodic", "visual", "semantic"}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings come from MSM_MEM_* variables: start every test without any."""
    for name in list(os.environ):
        if name.startswith("MSM_MEM_"):
            monkeypatch.delenv(name)


def _png(path: Path, seed: int) -> Path:
    """A 64x64 grey PNG with a seeded pattern (different seeds give different images)."""
    rng = np.random.default_rng(seed)
    Image.fromarray((rng.random((64, 64)) * 255).astype(np.uint8), mode="L").save(path)
    return path


def _make_data(folder: Path) -> Path:
    """Four good images, one corrupt one, and a CSV manifest with one malformed row."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(4):
        _png(folder / f"img{i}.png", i)
    (folder / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"not really a png" * 4)
    rows = [
        HEADER,  # line 1
        f"p1,s1,2020-01-01,img0.png,{QUESTION},small left pleural effusion,report,follow up",  # 2
        f"p1,s2,2020-02-01,img1.png,{QUESTION},pleural effusion resolved,,",  # 3
        f"p2,s1,2020-01-05,corrupt.png,{QUESTION},normal chest,,",  # 4: corrupt image
        f"p2,s2,not-a-date,img2.png,{QUESTION},cardiomegaly,,",  # 5: malformed row
        f"p2,s3,2020-03-01,img2.png,{QUESTION},mild cardiomegaly without edema,,",  # 6
    ]
    manifest = folder / "manifest.csv"
    manifest.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return manifest


def _counts(store_dir: Path) -> dict[str, int]:
    """Rows per memory table, read straight from the store of record."""
    store = SqliteStore.open(store_dir)
    try:
        return {k: store.count(k) for k in ("episodic", "visual", "semantic")}
    finally:
        store.close()


def _run(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    """Run the CLI in-process; return (exit status, stdout, stderr)."""
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _ask_json(capsys: pytest.CaptureFixture[str], store: Path, *extra: str | Path) -> dict[str, Any]:
    rc, out, err = _run(capsys, "ask", store, *extra, "--json")
    assert rc == 0, err
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    obj = json.loads(lines[0])
    assert isinstance(obj, dict)
    return obj


def _one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    return lines[0]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """A store with the manifest ingested once (copied by the tests that change it)."""
    root = tmp_path_factory.mktemp("cli-base")
    data = root / "data"
    manifest = _make_data(data)
    store = root / "store"
    saved = {k: v for k, v in os.environ.items() if k.startswith("MSM_MEM_")}
    for k in saved:
        del os.environ[k]
    try:
        assert main(["init", str(store)]) == 0
        assert main(["ingest", str(store), "--manifest", str(manifest), "--no-progress"]) == 0
    finally:
        os.environ.update(saved)
    yield store, data


@pytest.fixture
def store(base: tuple[Path, Path], tmp_path: Path) -> Path:
    """A private copy of the base store."""
    return Path(shutil.copytree(base[0], tmp_path / "store"))


@pytest.fixture
def data(base: tuple[Path, Path]) -> Path:
    return base[1]


# help -----------------------------------------------------------------------------------------


def test_every_registered_command_has_a_docstring() -> None:
    """Each command function has a docstring; its first line is a sentence (the summary)."""
    build_parser()  # imports the modules that register the remaining commands
    assert {"init", "ingest", "ask", "export", "import", "demo"} <= set(COMMANDS)
    for name, (fn, _) in COMMANDS.items():
        doc = (fn.__doc__ or "").strip()
        assert doc, f"command {name!r} has no docstring (its --help)"
        assert len(doc.splitlines()[0]) > 10, name


@pytest.mark.parametrize("name", sorted({"init", "ingest", "ask", "export", "import", "demo"}))
def test_command_help_prints_its_docstring(capsys: pytest.CaptureFixture[str], name: str) -> None:
    """`msm-mem CMD --help` exits 0 and prints the command's docstring."""
    rc, out, _ = _run(capsys, name, "--help")
    assert rc == 0
    fn = COMMANDS[name][0]
    first = (fn.__doc__ or "").strip().splitlines()[0]
    assert first in out
    assert out.startswith(f"usage: msm-mem {name}")


def _walk(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, str | None]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield f"{path} {name}".strip(), helps.get(name)
                yield from _walk(sub, f"{path} {name}")


def test_every_command_and_subcommand_has_help() -> None:
    """Every (sub)command in the parser tree carries a non-empty help line."""
    missing = [name for name, text in _walk(build_parser(), "") if not (text or "").strip()]
    assert missing == []


def test_top_level_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    """`msm-mem --help` exits 0 and names every registered command."""
    rc, out, _ = _run(capsys, "--help")
    assert rc == 0
    for name in COMMANDS:
        assert name in out


def test_usage_errors_return_2(capsys: pytest.CaptureFixture[str]) -> None:
    """No command, an unknown command or a missing option returns 2 with usage on stderr."""
    for argv in ([], ["frobnicate"], ["ask", "somewhere"]):
        rc, _, err = _run(capsys, *argv)
        assert rc == 2, argv
        assert "usage:" in err


def test_console_entry_points_print_help(tmp_path: Path) -> None:
    """The installed `msm-mem` script (or `python -m msm_mem`) runs and prints the help."""
    script = Path(sys.executable).parent / "msm-mem"
    env = {**os.environ, "PYTHONPATH": str(Path(msm_mem.__file__).parents[1])}
    commands = [[sys.executable, "-m", "msm_mem", "--help"]]
    if script.exists():
        commands.append([str(script), "--help"])
    for argv in commands:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("usage: msm-mem")
        assert "ingest" in done.stdout and "ask" in done.stdout


# init and ingest ------------------------------------------------------------------------------


def test_init_creates_a_pixels_store(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """init creates an empty store with the default 1024-d pixels encoder and says so."""
    rc, out, _ = _run(capsys, "init", tmp_path / "s")
    assert rc == 0
    assert "pixels" in out and "1024" in out
    assert _counts(tmp_path / "s") == {"episodic": 0, "visual": 0, "semantic": 0}


def test_init_twice_is_a_one_line_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """init on a directory that already holds a store exits 1 with one error line."""
    assert _run(capsys, "init", tmp_path / "s")[0] == 0
    rc, _, err = _run(capsys, "init", tmp_path / "s")
    assert rc == 1
    assert "already" in _one_line_error(err)


def test_ingest_reports_bad_rows_and_stores_good_ones(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """ingest stores the good rows, reports the corrupt image and malformed row by line."""
    manifest = _make_data(tmp_path / "data")
    store = tmp_path / "store"
    assert _run(capsys, "init", store)[0] == 0
    rc, out, err = _run(capsys, "ingest", store, "--manifest", manifest, "--no-progress")
    assert rc == 0
    skipped = [line for line in err.splitlines() if line.startswith("skipped")]
    assert len(skipped) == 2, err
    assert any(line.startswith("skipped line 4:") and "corrupt.png" in line for line in skipped)
    assert any(line.startswith("skipped line 5:") and "not-a-date" in line for line in skipped)
    assert out.strip().splitlines()[-1] == "ingested 3 studies, 0 already stored, 2 rows skipped"
    counts = _counts(store)
    assert counts["episodic"] == 3 and counts["visual"] == 3
    assert counts["semantic"] >= 2  # one state per patient at least


def test_reingest_stores_nothing_new(capsys: pytest.CaptureFixture[str], store: Path, data: Path) -> None:
    """Running ingest again on the same manifest stores nothing and counts the stored rows."""
    before = _counts(store)
    rc, out, _ = _run(capsys, "ingest", store, "--manifest", data / "manifest.csv", "--no-progress")
    assert rc == 0
    assert out.strip().splitlines()[-1] == "ingested 0 studies, 3 already stored, 2 rows skipped"
    assert _counts(store) == before


def test_ingest_missing_manifest_is_an_error(capsys: pytest.CaptureFixture[str], store: Path) -> None:
    """A manifest path that does not exist exits 1 with one error line; nothing is stored."""
    before = _counts(store)
    rc, _, err = _run(capsys, "ingest", store, "--manifest", store / "absent.csv")
    assert rc == 1
    assert "absent.csv" in _one_line_error(err)
    assert _counts(store) == before


def test_ingest_into_a_non_store_is_an_error(capsys: pytest.CaptureFixture[str], tmp_path: Path, data: Path) -> None:
    """ingest into a directory without a store exits 1 and creates no store there."""
    rc, out, err = _run(capsys, "ingest", tmp_path / "nowhere", "--manifest", data / "manifest.csv")
    assert rc == 1
    assert "not an msm-mem store" in _one_line_error(err)
    assert out == ""
    assert not (tmp_path / "nowhere" / "msm-mem.sqlite").exists()


# ask ------------------------------------------------------------------------------------------


def _ask_args(data: Path, patient: str = "p1", image: str = "img1.png") -> list[str | Path]:
    return ["--patient", patient, "--image", data / image, "--question", QUESTION]


def test_ask_json_prints_one_object_with_the_documented_keys(
    capsys: pytest.CaptureFixture[str], store: Path, data: Path
) -> None:
    """ask --json prints exactly one JSON object: answer, evidence [{id, kind, score}], gate."""
    obj = _ask_json(capsys, store, *_ask_args(data))
    assert {"answer", "evidence", "gate"} <= set(obj)
    assert isinstance(obj["answer"], str) and obj["answer"]
    assert isinstance(obj["evidence"], list) and obj["evidence"]
    for item in obj["evidence"]:
        assert {"id", "kind", "score"} <= set(item)
        assert isinstance(item["id"], str) and item["id"]
        assert item["kind"] in KINDS
        assert isinstance(item["score"], float | int)
    assert {e["kind"] for e in obj["evidence"]} >= {"episodic", "visual"}
    gate = obj["gate"]
    assert set(gate) == {"written", "reasons"}
    assert isinstance(gate["written"], bool)
    assert gate["reasons"] and all(isinstance(r, str) for r in gate["reasons"])


def test_ask_json_finds_the_same_image_first(capsys: pytest.CaptureFixture[str], store: Path, data: Path) -> None:
    """Asking about an ingested image ranks that study's episodic record first."""
    for image, study in (("img0.png", "s1"), ("img1.png", "s2")):
        obj = _ask_json(capsys, store, *_ask_args(data, "p1", image), "--no-write-back")
        episodic = [e for e in obj["evidence"] if e["kind"] == "episodic"]
        assert episodic, obj
        assert episodic[0]["score"] == max(e["score"] for e in episodic)
        opened = MsmMem.open(store).store  # the governed door holds the codec its records need
        try:
            (record,) = opened.get_episodes([episodic[0]["id"]])
        finally:
            opened.close()
        assert (record.patient_id, record.study_id) == ("p1", study)


def test_ask_no_write_back_has_no_gate_and_changes_nothing(
    capsys: pytest.CaptureFixture[str], store: Path, data: Path
) -> None:
    """--no-write-back gives gate null and leaves every memory table unchanged."""
    before = _counts(store)
    obj = _ask_json(capsys, store, *_ask_args(data), "--no-write-back")
    assert obj["gate"] is None
    assert _counts(store) == before


def test_ask_text_shows_answer_evidence_and_gate(capsys: pytest.CaptureFixture[str], store: Path, data: Path) -> None:
    """Plain ask prints the answer, every evidence id with its kind, and the gate line."""
    expected = _ask_json(capsys, store, *_ask_args(data), "--no-write-back")
    rc, out, _ = _run(capsys, "ask", store, *_ask_args(data))
    assert rc == 0
    assert out.startswith(f"answer: {expected['answer']}")
    assert "evidence:" in out
    for item in expected["evidence"]:
        if item["kind"] != "semantic":  # semantic state ids change with each write-back
            assert any(item["id"] in line and item["kind"] in line for line in out.splitlines())
    assert "\ngate: " in out


def test_env_settings_reach_the_gate(
    capsys: pytest.CaptureFixture[str], store: Path, data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MSM_MEM_MIN_ANSWER_WORDS is honoured by ask: raised to 50, the answer is 'too short'."""
    default = _ask_json(capsys, store, *_ask_args(data))
    assert len(default["answer"].split()) < 50
    assert "answer_too_short" not in default["gate"]["reasons"]
    monkeypatch.setenv("MSM_MEM_MIN_ANSWER_WORDS", "50")
    strict = _ask_json(capsys, store, *_ask_args(data))
    assert "answer_too_short" in strict["gate"]["reasons"]
    assert strict["gate"]["written"] is False


def test_bad_env_setting_is_a_one_line_error(
    capsys: pytest.CaptureFixture[str], store: Path, data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unparseable MSM_MEM_ variable makes ask exit 1 with one error line naming it."""
    monkeypatch.setenv("MSM_MEM_TOP_K", "many")
    before = _counts(store)
    rc, _, err = _run(capsys, "ask", store, *_ask_args(data))
    assert rc == 1
    assert "MSM_MEM_TOP_K" in _one_line_error(err)
    assert _counts(store) == before


def test_unknown_patient_gets_a_prior_not_an_error(capsys: pytest.CaptureFixture[str], store: Path, data: Path) -> None:
    """A patient with no memory still gets an answer (population prior or 'No prior evidence')."""
    before = _counts(store)
    obj = _ask_json(capsys, store, *_ask_args(data, patient="nobody"), "--no-write-back")
    assert obj["evidence"] == []
    assert obj.get("source") in {"population-prior", "empty"} or "No prior evidence" in obj["answer"]
    assert obj["answer"]
    assert _counts(store) == before


def test_unknown_patient_in_an_empty_store_says_no_prior_evidence(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, data: Path
) -> None:
    """With nothing in memory at all the answer says there is no prior evidence."""
    assert _run(capsys, "init", tmp_path / "s")[0] == 0
    obj = _ask_json(capsys, tmp_path / "s", *_ask_args(data, patient="nobody"), "--no-write-back")
    assert "No prior evidence" in obj["answer"]
    assert obj["evidence"] == []


def test_ask_on_a_directory_that_is_not_a_store(capsys: pytest.CaptureFixture[str], tmp_path: Path, data: Path) -> None:
    """ask on a plain directory exits 1 with one error line and creates nothing there."""
    plain = tmp_path / "plain"
    plain.mkdir()
    rc, out, err = _run(capsys, "ask", plain, *_ask_args(data))
    assert rc == 1
    assert "not an msm-mem store" in _one_line_error(err)
    assert out == ""
    assert list(plain.iterdir()) == []


@pytest.mark.parametrize("image", ["corrupt.png", "absent.png"])
def test_ask_with_a_bad_image_fails_and_writes_nothing(
    capsys: pytest.CaptureFixture[str], store: Path, data: Path, image: str
) -> None:
    """A corrupt or missing image exits 1 with one error line naming it; the store is unchanged."""
    before = _counts(store)
    rc, out, err = _run(capsys, "ask", store, *_ask_args(data, image=image))
    assert rc == 1
    assert image in _one_line_error(err)
    assert out == ""
    assert _counts(store) == before


def test_ask_with_an_empty_question_fails(capsys: pytest.CaptureFixture[str], store: Path, data: Path) -> None:
    """A blank question exits 1 with one error line and writes nothing."""
    before = _counts(store)
    rc, _, err = _run(capsys, "ask", store, "--patient", "p1", "--image", data / "img1.png", "--question", "   ")
    assert rc == 1
    _one_line_error(err)
    assert _counts(store) == before


# export / import ------------------------------------------------------------------------------


def test_export_then_import_gives_identical_evidence(
    capsys: pytest.CaptureFixture[str], store: Path, data: Path, tmp_path: Path
) -> None:
    """export --format paper then import into a new dir answers with identical evidence."""
    layout, copy = tmp_path / "layout", tmp_path / "imported"
    rc, out, err = _run(capsys, "export", store, "--format", "paper", layout)
    assert rc == 0, err
    for name in ("episodic.jsonl", "episodic.faiss", "visual.jsonl", "visual.faiss"):
        assert (layout / name).is_file(), name
    assert (layout / "semantic").is_dir()
    rc, _, err = _run(capsys, "import", copy, "--format", "paper", layout)
    assert rc == 0, err
    original = _counts(store)
    imported = _counts(copy)
    assert imported["episodic"] == original["episodic"]
    assert imported["visual"] == original["visual"]
    for patient, image in (("p1", "img1.png"), ("p2", "img2.png"), ("p1", "img3.png")):
        a = _ask_json(capsys, store, *_ask_args(data, patient, image), "--no-write-back")
        b = _ask_json(capsys, copy, *_ask_args(data, patient, image), "--no-write-back")
        assert a["evidence"] == b["evidence"], (patient, image)
        assert a["answer"] == b["answer"]


def test_import_of_a_non_layout_fails_cleanly(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """import from a folder that is not a paper layout exits 1 with one error line."""
    (tmp_path / "empty").mkdir()
    rc, _, err = _run(capsys, "import", tmp_path / "new", "--format", "paper", tmp_path / "empty")
    assert rc == 1
    assert "layout" in _one_line_error(err)
    assert not (tmp_path / "new" / "msm-mem.sqlite").exists()


def test_export_of_a_non_store_fails(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """export from a directory that is not a store exits 1 and writes no layout."""
    rc, _, err = _run(capsys, "export", tmp_path, "--format", "paper", tmp_path / "out")
    assert rc == 1
    _one_line_error(err)
    assert not (tmp_path / "out" / "episodic.jsonl").exists()


# error formatting -----------------------------------------------------------------------------


def test_multiline_error_messages_are_folded_to_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever a command raises, the CLI prints a single 'error: ...' line and returns 1."""

    def boom(args: argparse.Namespace) -> int:
        """Fail with a message that spans lines."""
        raise msm_mem.StoreError("first line\nsecond line")

    monkeypatch.setitem(cli.COMMANDS, "export", (boom, COMMANDS["export"][1]))
    rc, _, err = _run(capsys, "export", "x", "--format", "paper", "y")
    assert rc == 1
    assert _one_line_error(err) == "error: first line second line"


# demo -----------------------------------------------------------------------------------------


def test_demo_runs_and_leaves_a_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """run_demo on 6 synthetic patients returns 0 and leaves a store with memory in it."""
    assert run_demo(tmp_path, patients=6, verbose=False) == 0
    out = capsys.readouterr().out
    assert "mean token F1 with memory" in out
    counts = _counts(tmp_path / "store")
    assert counts["episodic"] > 0 and counts["semantic"] > 0


def test_demo_can_be_rerun_in_the_same_folder(tmp_path: Path) -> None:
    """A second run in the same folder replaces the previous demo instead of failing."""
    assert run_demo(tmp_path, patients=6, verbose=False) == 0
    assert run_demo(tmp_path, patients=6, verbose=False) == 0
