"""Tests of the command line's registry (msm_mem.interfaces.cli: help, docs, structure, errors)
and of its store commands (init, ingest, export, import), run in-process."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import msm_mem
from msm_mem.interfaces import cli
from msm_mem.interfaces.cli import COMMANDS, build_parser
from msm_mem.interfaces.cli.registry import GROUPS
from tests.cli_support import (
    ADMIN,
    AGENT,
    CLINICIAN,
    HEADER,
    SYSTEM,
    counts,
    make_data,
    one_line_error,
    png,
    run,
    run_json,
)

README = Path(__file__).resolve().parents[1] / "README.md"
CLI_PACKAGE = Path(cli.__file__).parent
QUESTION = "What is seen on the chest radiograph?"


#: settings and identity come from MSM_MEM_* variables: every test starts without any
pytestmark = pytest.mark.usefixtures("clean_msm_env")


# help and docs --------------------------------------------------------------------------------


def _readme_cli_section() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("## As a command line")
    return text[start : text.index("\n## ", start + 1)]


def test_every_command_has_a_docstring_and_a_readme_mention() -> None:
    """Each registered command (and group) has a docstring whose first line is a summary, and
    the README's command-line section shows `msm-mem COMMAND`."""
    section = _readme_cli_section()
    assert {"init", "ingest", "ask", "retrieve", "observe", "consolidate", "feedback", "show state"} <= set(COMMANDS)
    missing = []
    for name, spec in COMMANDS.items():
        assert spec.doc, f"command {name!r} has no docstring (its --help)"
        assert len(spec.doc.splitlines()[0]) > 10, name
        if f"msm-mem {name}" not in section:
            missing.append(name)
    assert missing == [], f"commands without a README mention: {missing}"
    for name, doc in GROUPS.items():
        assert doc and len(doc.splitlines()[0]) > 10, name


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_command_help_prints_its_docstring(capsys: pytest.CaptureFixture[str], name: str) -> None:
    """`msm-mem CMD --help` exits 0, prints the command's whole docstring and, for commands on
    a store, the principal flags and the default principal."""
    spec = COMMANDS[name]
    rc, out, _ = run(capsys, *spec.words, "--help")
    assert rc == 0
    assert out.startswith(f"usage: msm-mem {name}")
    for line in spec.doc.splitlines():
        assert line.strip() in out, line
    if spec.role is not None:
        assert "--actor ID" in out and "--role ROLE" in out and "Default principal" in out
        assert spec.role.value in out.split("Default principal")[1]


@pytest.mark.parametrize("name", sorted(GROUPS))
def test_group_help_lists_its_actions(capsys: pytest.CaptureFixture[str], name: str) -> None:
    """`msm-mem GROUP --help` exits 0, prints the group's docstring and names every action."""
    rc, out, _ = run(capsys, name, "--help")
    assert rc == 0
    assert GROUPS[name].splitlines()[0] in out
    for spec in COMMANDS.values():
        if spec.words[0] == name:
            assert f"    {spec.words[1]}" in out, spec.name


def _walk(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, str | None]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield f"{path} {name}".strip(), helps.get(name)
                yield from _walk(sub, f"{path} {name}")


def _parsers(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"{path} {name}".strip(), sub
                yield from _parsers(sub, f"{path} {name}")


def test_every_command_and_subcommand_has_help() -> None:
    """Every (sub)command in the parser tree carries a non-empty help line."""
    missing = [name for name, text in _walk(build_parser(), "") if not (text or "").strip()]
    assert missing == []


def test_every_command_and_subcommand_has_a_description() -> None:
    """Every (sub)command's --help opens with a description of more than its usage line, down
    to the actions of `keys api-key`."""
    found = dict(_parsers(build_parser(), ""))
    assert {"keys api-key create", "keys api-key list", "keys api-key revoke", "store image-root"} <= set(found)
    missing = [name for name, sub in found.items() if len((sub.description or "").strip()) < 20]
    assert missing == []


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    """`msm-mem --version` exits 0 printing the installed package's version."""
    rc, out, _ = run(capsys, "--version")
    assert rc == 0 and out.strip() == f"msm-mem {msm_mem.__version__}"


@pytest.mark.parametrize(
    "argv",
    [
        ["ingest", "{d}", "--manifest", "m.csv"],
        ["ask", "{d}", "--patient", "P1", "--image", "x.png", "--question", "q?"],
        ["show", "state", "{d}", "--patient", "P1"],
        ["audit", "verify", "{d}"],
        ["keys", "api-key", "list", "{d}"],
        ["mcp", "{d}", "--patients", "*"],
        ["serve", "{d}"],
    ],
)
def test_a_missing_store_is_named_before_any_identity_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str]
) -> None:
    """With no principal anywhere, a command on a directory that is no store says that DIR is
    not an msm-mem store (not "no acting principal"), and creates nothing."""
    nosuch = tmp_path / "nosuch"
    rc, out, err = run(capsys, *[a.format(d=nosuch) for a in argv])
    assert rc == 1 and out == ""
    assert one_line_error(err).startswith(f"error: {nosuch} is not an msm-mem store")
    assert not nosuch.exists()


def test_top_level_help_lists_every_command_and_the_identity_rules(capsys: pytest.CaptureFixture[str]) -> None:
    """`msm-mem --help` exits 0, names every command and explains where the principal comes from."""
    rc, out, _ = run(capsys, "--help")
    assert rc == 0
    for spec in COMMANDS.values():
        assert f"    {spec.words[0]} " in out, spec.name
    for needle in ("--actor ID", "MSM_MEM_ACTOR", "MSM_MEM_ROLE", "MSM_MEM_PURPOSE", "identity.json"):
        assert needle in out


def test_usage_errors_return_2(capsys: pytest.CaptureFixture[str]) -> None:
    """No command, an unknown command, a group without action or a missing option returns 2."""
    for argv in ([], ["frobnicate"], ["consent"], ["ask", "somewhere"]):
        rc, _, err = run(capsys, *argv)
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


# structure ------------------------------------------------------------------------------------

_PRIVATE_LAYERS = ("msm_mem._storage", "msm_mem._governance", "msm_mem._memory", "msm_mem._agent", "msm_mem._api")
_SHARED = {"registry", "identity", "output", "credential"}


def _imports(path: Path) -> set[str]:
    """The absolute names of the modules ``path`` imports (relative imports resolved)."""
    package = ["msm_mem", "interfaces", "cli"]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            names.add(module)
            if not node.module:  # from . import store: the names are modules
                names.update(f"{module}.{a.name}" for a in node.names)
    return names


def test_the_cli_is_a_package_over_the_public_api() -> None:
    """The CLI package imports no private layer (storage, governance, memory, agent, api);
    command modules import only the registry and its helpers, which import no command module
    (no cycles); the old single-file modules are gone."""
    modules = sorted(CLI_PACKAGE.glob("*.py"))
    assert {"__init__.py", "registry.py", "store.py", "ask.py", "reads.py", "consent.py"} <= {m.name for m in modules}
    for old in ("cli.py", "cli_extra.py", "cli_governance.py"):
        assert not (CLI_PACKAGE.parent / old).exists()
    for path in modules:
        imported = _imports(path)
        private = sorted(n for n in imported if n.startswith(_PRIVATE_LAYERS))
        assert private == [], f"{path.name} imports {private}"
        ours = {n.split(".")[3] for n in imported if n.startswith("msm_mem.interfaces.cli.")}
        if path.stem in _SHARED:
            assert ours <= _SHARED - {path.stem}, f"{path.name} imports {ours}"
        elif path.stem != "__init__":
            assert ours <= _SHARED, f"{path.name} imports {ours}"


def test_multiline_error_messages_are_folded_to_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, cli_store: Path
) -> None:
    """Whatever a command raises, the CLI prints a single 'error: ...' line and returns 1."""

    def boom(args: argparse.Namespace) -> int:
        """Fail with a message that spans lines."""
        raise msm_mem.StoreError("first line\nsecond line")

    monkeypatch.setitem(COMMANDS, "export", dataclasses.replace(COMMANDS["export"], func=boom))
    rc, _, err = run(capsys, "export", cli_store, "--format", "paper", "y", *CLINICIAN)
    assert rc == 1
    assert one_line_error(err) == "error: first line second line"


# init and ingest ------------------------------------------------------------------------------


def test_init_creates_a_pixels_store(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """init creates an empty store with the default 1024-d pixels encoder and names its admin."""
    rc, out, _ = run(capsys, "init", tmp_path / "s", *ADMIN)
    assert rc == 0
    assert "pixels" in out and "1024" in out and "admin admin-1" in out
    assert counts(tmp_path / "s") == {"episodic": 0, "visual": 0, "semantic": 0}


def test_init_twice_is_a_one_line_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """init on a directory that already holds a store exits 1 with one error line."""
    assert run(capsys, "init", tmp_path / "s", *ADMIN)[0] == 0
    rc, _, err = run(capsys, "init", tmp_path / "s", *ADMIN)
    assert rc == 1
    assert "already" in one_line_error(err)


def test_init_schema_without_database_url_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """--schema without --database-url exits 1 and creates nothing."""
    rc, _, err = run(capsys, "init", tmp_path / "s", "--schema", "ward", *ADMIN)
    assert rc == 1 and "--database-url" in one_line_error(err)
    assert not (tmp_path / "s").exists()


def test_ingest_reports_bad_rows_and_stores_good_ones(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """ingest stores the good rows, reports the corrupt image and malformed row by line, and
    exits 4 (some rows skipped)."""
    manifest = make_data(tmp_path / "data")
    store = tmp_path / "store"
    assert run(capsys, "init", store, *ADMIN)[0] == 0
    rc, out, err = run(capsys, "ingest", store, "--manifest", manifest, "--no-progress", *SYSTEM)
    assert rc == 4
    skipped = [line for line in err.splitlines() if line.startswith("skipped")]
    assert len(skipped) == 2, err
    assert any(line.startswith("skipped line 4:") and "corrupt.png" in line for line in skipped)
    assert any(line.startswith("skipped line 5:") and "not-a-date" in line for line in skipped)
    summary = "ingested 3 studies (3 questions), 0 questions already stored, 2 rows skipped"
    assert out.strip().splitlines()[-1] == summary
    c = counts(store)
    assert c["episodic"] == 3 and c["visual"] == 3
    assert c["semantic"] >= 2  # one state per patient at least


def test_reingest_stores_nothing_new(capsys: pytest.CaptureFixture[str], cli_store: Path, cli_data: Path) -> None:
    """Running ingest again on the same manifest stores nothing and counts the stored rows; the
    skipped rows still make it exit 4, not 5 (the good rows are stored)."""
    before = counts(cli_store)
    rc, out, _ = run(capsys, "ingest", cli_store, "--manifest", cli_data / "manifest.csv", "--no-progress", *CLINICIAN)
    assert rc == 4
    summary = "ingested 0 studies (0 questions), 3 questions already stored, 2 rows skipped"
    assert out.strip().splitlines()[-1] == summary
    assert counts(cli_store) == before


def test_ingest_as_an_agent_is_refused(capsys: pytest.CaptureFixture[str], cli_store: Path, cli_data: Path) -> None:
    """The agent role may not ingest: exit 1 naming the roles that may; nothing is stored."""
    before = counts(cli_store)
    rc, _, err = run(capsys, "ingest", cli_store, "--manifest", cli_data / "manifest.csv", "--no-progress", *AGENT)
    assert rc == 1
    assert err.splitlines()[-1] == "error: role 'agent' may not ingest: only clinician, system"
    assert counts(cli_store) == before


def test_ingest_missing_manifest_is_an_error(capsys: pytest.CaptureFixture[str], cli_store: Path) -> None:
    """A manifest path that does not exist exits 1 with one error line; nothing is stored."""
    before = counts(cli_store)
    rc, _, err = run(capsys, "ingest", cli_store, "--manifest", cli_store / "absent.csv", *SYSTEM)
    assert rc == 1
    assert "absent.csv" in one_line_error(err)
    assert counts(cli_store) == before


def test_ingest_into_a_non_store_is_an_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, cli_data: Path
) -> None:
    """ingest into a directory without a store exits 1 and creates no store there."""
    rc, out, err = run(capsys, "ingest", tmp_path / "nowhere", "--manifest", cli_data / "manifest.csv", *SYSTEM)
    assert rc == 1
    assert "not an msm-mem store" in one_line_error(err)
    assert out == ""
    assert not (tmp_path / "nowhere" / "msm-mem.sqlite").exists()


def _export(root: Path) -> tuple[Path, Path]:
    """A hospital export: images in root/pacs, the manifest in root/export naming them by
    absolute path; returns (manifest, pacs)."""
    pacs, export = root / "pacs", root / "export"
    pacs.mkdir(parents=True)
    export.mkdir()
    rows = [f"P1,S{i},2020-01-0{i + 1},{png(pacs / f'a{i}.png', i)},{QUESTION},Small effusion {i}.,," for i in range(2)]
    rows.append(f"P1,S0,2020-01-01,{pacs / 'a0.png'},Any change?,No change.,,")  # a second question of S0
    manifest = export / "studies.csv"
    manifest.write_text("\n".join([HEADER, *rows]) + "\n", encoding="utf-8")
    return manifest, pacs


def test_ingest_of_a_hospital_export_needs_its_image_root(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A manifest naming images outside its folder stores nothing and exits 5 with one line
    saying why and naming --image-root; with --image-root DIR it stores every row, counting
    studies and questions apart."""
    manifest, pacs = _export(tmp_path)
    store = tmp_path / "store"
    assert run(capsys, "init", store, *ADMIN)[0] == 0
    rc, out, err = run(capsys, "ingest", store, "--manifest", manifest, "--no-progress", *SYSTEM)
    assert rc == 5
    assert out.strip() == "ingested 0 studies (0 questions), 0 questions already stored, 3 rows skipped"
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: nothing stored: all 3 rows were skipped (line 2: image ")
    assert "outside the folder" in last and "--image-root DIR" in last
    assert counts(store)["episodic"] == 0
    rc, out, err = run(capsys, "ingest", store, "--manifest", manifest, "--image-root", pacs, "--no-progress", *SYSTEM)
    assert rc == 0, err
    assert out.strip() == "ingested 2 studies (3 questions), 0 questions already stored, 0 rows skipped"
    assert counts(store)["episodic"] == 3 and counts(store)["visual"] == 2


def test_an_image_root_is_no_way_out(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Under --image-root, a symlink or '..' leading out of the root is skipped like any row
    outside it (exit 4 when others are stored); --image-root with --dataset, or naming a
    missing folder, is a one-line error that stores nothing."""
    manifest, pacs = _export(tmp_path)
    secret = png(tmp_path / "secret.png", 9)
    (pacs / "link.png").symlink_to(secret)
    extra = [
        f"P2,S1,2020-01-01,{pacs / 'link.png'},{QUESTION},x,,",
        f"P2,S2,2020-01-02,{pacs}/../secret.png,{QUESTION},x,,",
    ]
    with manifest.open("a", encoding="utf-8") as f:
        f.write("\n".join(extra) + "\n")
    store = tmp_path / "store"
    assert run(capsys, "init", store, *ADMIN)[0] == 0
    base = ["ingest", store, "--manifest", manifest, "--no-progress", *SYSTEM]
    rc, out, err = run(capsys, *base, "--image-root", pacs)
    assert rc == 4
    assert [line.split(":")[0] for line in err.splitlines()] == ["skipped line 5", "skipped line 6"]
    assert out.strip().endswith("2 rows skipped") and counts(store)["episodic"] == 3
    rc, _, err = run(capsys, *base, "--image-root", tmp_path / "absent")
    assert rc == 1 and "image root" in one_line_error(err) and "does not exist" in err
    rc, _, err = run(capsys, "ingest", store, "--dataset", "synthetic", tmp_path, "--image-root", pacs, *SYSTEM)
    assert rc == 1 and "--image-root applies to --manifest" in one_line_error(err)


def test_ingest_of_an_empty_manifest_stores_nothing(capsys: pytest.CaptureFixture[str], cli_store: Path) -> None:
    """A manifest with a header and no rows exits 5 saying it has no rows."""
    empty = cli_store.parent / "empty.csv"
    empty.write_text(HEADER + "\n", encoding="utf-8")
    rc, _, err = run(capsys, "ingest", cli_store, "--manifest", empty, "--no-progress", *SYSTEM)
    assert rc == 5 and one_line_error(err) == "error: nothing stored: the manifest or data set has no rows"


def test_a_store_ingested_elsewhere_finds_its_images_from_any_folder(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A manifest named relative to the folder ingest runs in is stored by absolute paths: a
    command run from another folder reads the stored study's image."""
    data = tmp_path / "work"
    make_data(data)
    store = tmp_path / "store"
    assert run(capsys, "init", store, *ADMIN)[0] == 0
    monkeypatch.chdir(data)
    assert run(capsys, "ingest", store, "--manifest", "manifest.csv", "--no-progress", *SYSTEM)[0] == 4
    monkeypatch.chdir(tmp_path)
    rc, out, err = run(capsys, "ask", store, "--patient", "p1", "--image-study", "s2", "--question", QUESTION, *AGENT)
    assert rc == 0, err
    assert out.startswith("answer: ")


def test_store_image_root_lets_an_older_store_find_its_relative_paths(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store holding relative image paths (as older versions wrote them) fails from another
    folder naming the path and the working directory; once an admin records the folder with
    `store image-root`, it reads them from anywhere; another role may not record it."""
    data = tmp_path / "work"
    make_data(data)
    store = tmp_path / "store"
    assert run(capsys, "init", store, *ADMIN)[0] == 0
    monkeypatch.chdir(data)
    rows = msm_mem.read_manifest("manifest.csv")[0]
    legacy = [dataclasses.replace(r, image=Path(r.image).name) for r in rows]  # as stored before
    with msm_mem.MsmMem.open(store) as mem:
        mem.ingest(msm_mem.Principal("cron", "system", "operations"), legacy)
    monkeypatch.chdir(tmp_path)
    ask = ["ask", store, "--patient", "p1", "--image-study", "s2", "--question", QUESTION, *AGENT]
    rc, _, err = run(capsys, *ask)
    assert rc == 1 and "stored as 'img1.png'" in one_line_error(err) and f"working directory {tmp_path}" in err
    rc, out, _ = run(capsys, "store", "image-root", store, *ADMIN)
    assert rc == 0 and out.startswith("no image root recorded")
    rc, _, err = run(capsys, "store", "image-root", store, data, *CLINICIAN)
    assert rc == 1 and "may not record the image root" in one_line_error(err)
    rc, _, err = run(capsys, "store", "image-root", store, tmp_path / "absent", *ADMIN)
    assert rc == 1 and "does not exist" in one_line_error(err)
    rc, out, _ = run(capsys, "store", "image-root", store, data, *ADMIN)
    assert rc == 0 and out.strip() == f"recorded image root {data} in {store}"
    assert run(capsys, "store", "image-root", store, *ADMIN)[1].strip() == str(data)
    rc, out, err = run(capsys, *ask)
    assert rc == 0, err


def _show_history_cut_off(store: Path) -> subprocess.CompletedProcess[bytes]:
    script = Path(sys.executable).parent / "msm-mem"
    argv = [str(script), "show", "history", str(store), "--patient", "p1", *CLINICIAN]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MSM_MEM_")}
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader leaves before the first line, as `| head -0` would
    with proc.stderr:
        err = proc.stderr.read()
    return subprocess.CompletedProcess(argv, proc.wait(timeout=60), b"", err)


def test_a_reader_that_leaves_ends_the_command_quietly(cli_store: Path) -> None:
    """`msm-mem show history ... | head`: when the reader of stdout has gone, the command ends
    with status 141 and nothing on stderr (no "Broken pipe" error, no traceback)."""
    done = _show_history_cut_off(cli_store)
    assert done.stderr == b"" and done.returncode == 141


# export / import ------------------------------------------------------------------------------


def _ask_args(data: Path, patient: str, image: str) -> list[str | Path]:
    return ["--patient", patient, "--image", data / image, "--question", QUESTION, "--no-write-back", *AGENT]


def test_export_then_import_gives_identical_evidence(
    capsys: pytest.CaptureFixture[str], cli_store: Path, cli_data: Path, tmp_path: Path
) -> None:
    """export --format paper (as a clinician, purpose export) then import into a new dir (as an
    admin, who the new identity file names) answers with identical evidence from S, E and V (the
    paper's layout holds no claims, so the import has none)."""
    layout, copy = tmp_path / "layout", tmp_path / "imported"
    rc, out, err = run(capsys, "export", cli_store, "--format", "paper", layout, *CLINICIAN)
    assert rc == 0, err
    for name in ("episodic.jsonl", "episodic.faiss", "visual.jsonl", "visual.faiss"):
        assert (layout / name).is_file(), name
    assert (layout / "semantic").is_dir()
    rc, _, err = run(capsys, "import", copy, "--format", "paper", layout, "--actor", "importer")
    assert rc == 0, err
    assert '"actor": "importer"' in (copy / "identity.json").read_text(encoding="utf-8")
    original, imported = counts(cli_store), counts(copy)
    assert imported["episodic"] == original["episodic"]
    assert imported["visual"] == original["visual"]
    for patient, image in (("p1", "img1.png"), ("p2", "img2.png"), ("p1", "img3.png")):
        a = run_json(capsys, "ask", cli_store, *_ask_args(cli_data, patient, image))
        b = run_json(capsys, "ask", copy, *_ask_args(cli_data, patient, image))
        assert isinstance(a, dict) and isinstance(b, dict)
        paper = [e for e in a["evidence"] if e["kind"] != "claim"]
        assert paper == b["evidence"], (patient, image)
        assert a["answer"] == b["answer"]


def test_export_without_consent_writes_no_patient(
    capsys: pytest.CaptureFixture[str], cli_store: Path, tmp_path: Path
) -> None:
    """An admin exporting (no consent for admins to export in the default policy) writes no
    patient's records; an agent may not export at all."""
    rc, out, err = run(capsys, "export", cli_store, "--format", "paper", tmp_path / "a", *ADMIN)
    assert rc == 0, err
    assert "'episodic': 0" in out
    rc, _, err = run(capsys, "export", cli_store, "--format", "paper", tmp_path / "b", *AGENT)
    assert rc == 1 and "may not export" in one_line_error(err)


def test_import_of_a_non_layout_fails_cleanly(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """import from a folder that is not a paper layout exits 1 with one error line."""
    (tmp_path / "empty").mkdir()
    rc, _, err = run(capsys, "import", tmp_path / "new", "--format", "paper", tmp_path / "empty", *ADMIN)
    assert rc == 1
    assert "layout" in one_line_error(err)
    assert not (tmp_path / "new" / "msm-mem.sqlite").exists()


def test_export_of_a_non_store_fails(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """export from a directory that is not a store exits 1 and writes no layout."""
    rc, _, err = run(capsys, "export", tmp_path, "--format", "paper", tmp_path / "out", *CLINICIAN)
    assert rc == 1
    one_line_error(err)
    assert not (tmp_path / "out" / "episodic.jsonl").exists()
