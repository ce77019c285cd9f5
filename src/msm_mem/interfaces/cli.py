"""msm-mem: a governed, multimodal memory for medical AI agents (command line).

Each command is a thin layer over the Python API; its docstring is its --help text.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from .._api import MsmMem
from .._errors import InvalidInput, MsmMemError
from .._settings import Settings
from .._storage.location import is_store
from ..datasets.manifest import RowProblem, read_manifest

__all__ = ["COMMANDS", "main"]

Command = Callable[[argparse.Namespace], int]
COMMANDS: dict[str, tuple[Command, Callable[[argparse.ArgumentParser], object]]] = {}


def command(name: str, configure: Callable[[argparse.ArgumentParser], object]) -> Callable[[Command], Command]:
    """Register the decorated function as command ``name``; ``configure`` adds its arguments.

    The function's docstring is the command's --help text (its first line the summary)."""

    def register(fn: Command) -> Command:
        COMMANDS[name] = (fn, configure)
        return fn

    return register


def _settings(args: argparse.Namespace) -> Settings:
    base = Settings.from_env()
    return base.with_(encoder=args.encoder) if getattr(args, "encoder", None) else base


def _print_problems(problems: Sequence[RowProblem]) -> None:
    for p in problems:
        where = f"line {p.line}" if p.line else "row"
        print(f"skipped {where}: {p.reason}", file=sys.stderr)


@command(
    "init",
    lambda p: (
        p.add_argument("dir", type=Path),
        p.add_argument("--encoder", help="image encoder plugin (default: pixels)"),
        p.add_argument("--database-url", metavar="URL", help="keep the store of record on this PostgreSQL server"),
        p.add_argument("--schema", help="PostgreSQL schema of the store (default: msm_mem; needs --database-url)"),
    ),
)
def cmd_init(args: argparse.Namespace) -> int:
    """Create a new memory store in DIR.

    By default the store of record is embedded: a SQLite database plus FAISS caches in DIR.
    With --database-url it is a new store in a schema of that PostgreSQL server (pgvector
    needed), and DIR holds store.json, which points at it without the password (libpq reads
    that from PGPASSWORD or ~/.pgpass). Either way DIR keeps the key file, the checkpoint
    key and the signed audit checkpoints, and gets the default consent policy."""
    if args.schema is not None and args.database_url is None:
        raise InvalidInput("--schema names a PostgreSQL schema: give --database-url too")
    schema = args.schema or "msm_mem"
    with MsmMem.init(args.dir, settings=_settings(args), database_url=args.database_url, schema=schema) as mem:
        where = f"PostgreSQL schema {schema}" if args.database_url else "embedded"
        print(f"created store {args.dir} ({where}; encoder {mem.store.encoder_name}, {mem.store.dim}-d)")
    return 0


def _configure_ingest(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--manifest", type=Path, help="CSV or JSONL manifest (see docs/manifest.md)")
    src.add_argument(
        "--dataset",
        nargs=2,
        metavar=("NAME", "PATH"),
        help="a data set loader: mimic-cxr, iu-xray, covid-cxr or synthetic",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


@command("ingest", _configure_ingest)
def cmd_ingest(args: argparse.Namespace) -> int:
    """Encode and store the studies of a manifest or a data set in DIR (base memory).

    Bad rows are reported with their line number and reason; good rows are ingested; rows
    already stored (same patient and study) are skipped, so ingest can be re-run."""
    with MsmMem.open(args.dir, settings=Settings.from_env()) as mem:  # a bad DIR fails first
        if args.manifest is not None:
            rows, problems = read_manifest(args.manifest)
        else:
            from ..datasets.registry import load_dataset

            rows, problems = load_dataset(args.dataset[0], args.dataset[1])
        _print_problems(problems)
        report = mem.ingest(rows, progress=not args.no_progress)
    _print_problems(report.problems)
    report.problems = [*problems, *report.problems]
    print(report.summary())
    return 0


def _configure_ask(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path)
    p.add_argument("--patient", required=True)
    p.add_argument("--image", required=True, type=Path)
    p.add_argument("--question", required=True)
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")
    p.add_argument("--no-write-back", action="store_true", help="answer without writing to memory")
    for flag in ("sem", "epi", "vis"):
        name = {"sem": "semantic", "epi": "episodic", "vis": "visual"}[flag]
        p.add_argument(f"--no-{flag}", action="store_true", help=f"ablation: do not use {name} memory")


@command("ask", _configure_ask)
def cmd_ask(args: argparse.Namespace) -> int:
    """Answer a clinical question about an image with the patient's memory.

    Runs the governed online loop as the agent role (consent check, short-term write, ranked
    retrieval, fusion, backbone, write-back gate, audit). Prints the answer, the evidence
    trail (memory id, kind, score = cosine x composite_k, and each factor) and the gate
    decision; --json prints one object with keys answer, evidence [{id, kind, score, cosine,
    confidence, freshness, tier_weight}], gate {written, reasons} (null with
    --no-write-back), backbone, source and decision."""
    with MsmMem.open(args.dir, settings=Settings.from_env()) as mem:
        result = mem.ask(
            args.patient,
            args.image,
            args.question,
            write_back=not args.no_write_back,
            use_sem=not args.no_sem,
            use_epi=not args.no_epi,
            use_vis=not args.no_vis,
        )
    if args.json:
        print(json.dumps(result.to_json(), ensure_ascii=False))
        return 0
    print(f"answer: {result.answer}")
    print(f"  (backbone {result.backbone}: {result.source})")
    print("evidence:")
    for e in result.evidence or ():
        print(
            f"  {e.kind:<9} {e.id}  score={e.score:.4f} (cosine {e.cosine:.3f} x confidence {e.confidence:.2f}"
            f" x freshness {e.freshness:.3f} x tier {e.tier_weight:.2f})"
        )
    if not result.evidence:
        print("  (none)")
    if result.gate is not None:
        verdict = "written to memory" if result.gate.written else "not written"
        print(f"gate: {verdict} ({', '.join(result.gate.reasons)})")
    return 0


def _configure_layout(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path)
    p.add_argument("--format", choices=["paper"], required=True, help="the paper's JSONL + FAISS layout")
    p.add_argument("path", type=Path)


@command("export", _configure_layout)
def cmd_export(args: argparse.Namespace) -> int:
    """Export DIR to PATH in the paper's layout (episodic/visual .jsonl + .faiss, semantic/)."""
    with MsmMem.open(args.dir) as mem:
        counts = mem.export_paper(args.path)
    print(f"exported {counts} to {args.path}")
    return 0


@command("import", _configure_layout)
def cmd_import(args: argparse.Namespace) -> int:
    """Import the paper's layout from PATH into DIR (created when missing; must be empty)."""
    if not is_store(args.dir):
        try:
            layout = json.loads((args.path / "layout.json").read_text(encoding="utf-8"))
            encoder = str(layout["encoder"])
        except (OSError, ValueError, KeyError) as exc:
            raise InvalidInput(f"{args.path} is not a paper layout: {exc}") from exc
        MsmMem.init(args.dir, settings=Settings.from_env().with_(encoder=encoder)).close()
    with MsmMem.open(args.dir) as mem:
        counts = mem.import_paper(args.path)
    print(f"imported {counts} into {args.dir}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every registered command."""
    from . import cli_extra, cli_governance  # noqa: F401  (register the remaining commands)

    parser = argparse.ArgumentParser(prog="msm-mem", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (fn, configure) in COMMANDS.items():
        doc = inspect.cleandoc(fn.__doc__ or "")  # a command without one still parses
        p = sub.add_parser(
            name,
            help=doc.splitlines()[0] if doc else None,
            description=doc,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        configure(p)
        p.set_defaults(func=fn)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 1 error, 2 usage).

    Errors print one line, ``error: <message>``, on stderr; ``--help`` and usage errors
    return their status instead of raising ``SystemExit``, so callers in-process get a code.
    """
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse exits on --help (0) and on usage errors (2)
        return exc.code if isinstance(exc.code, int) else 2
    try:
        return int(args.func(args))
    except (MsmMemError, OSError) as exc:  # OSError: unreadable or unwritable paths
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
