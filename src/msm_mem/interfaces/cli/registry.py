"""The command registry: the ``command`` decorator, the parser built from it, and ``main``.

Command modules import this one and register their functions; the package ``__init__``
imports every command module, so the registry never imports a command. Each command's
docstring is its ``--help`` text (its first line the summary in the command list).
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import MsmMem, MsmMemError, Principal, Purpose, Role, StoreError, __version__
from ..._settings import Settings
from ..backbone import API_KEY_ENV, CONFIG_ENV, NAME_ENV, OPTIONS_ENV, BackboneConfig
from . import identity
from .output import escaped_output

__all__ = [
    "BACKBONE_HELP",
    "COMMANDS",
    "GROUPS",
    "TENANT_HELP",
    "Spec",
    "backbone_flags",
    "backbone_of",
    "build_parser",
    "command",
    "group",
    "main",
    "open_mem",
    "principal",
    "require_store",
]

#: the help of the --tenant options
TENANT_HELP = "the store's tenant: letters, digits, - and _ (default: MSM_MEM_TENANT, else 'default')"

#: the description of the backbone flags' group
BACKBONE_HELP = (
    f"the model that answers ask; a flag wins over {NAME_ENV} and {OPTIONS_ENV} (JSON), which win over the TOML "
    f"file of --backbone-config or {CONFIG_ENV}; the model server's API key only from {API_KEY_ENV}"
)

Command = Callable[[argparse.Namespace], int]
Configure = Callable[[argparse.ArgumentParser], object]

DESCRIPTION = """\
msm-mem: a governed, multimodal memory for medical AI agents (command line).

Each command is a thin layer over the Python API (msm_mem.MsmMem); its docstring is its --help.
Every command on a store acts as a principal (who, role, purpose), recorded in the audit trail.
"""


@dataclass(frozen=True, slots=True)
class Spec:
    """One registered command: its words (``("consent", "grant")``), function and arguments,
    and whom it acts as. ``role`` is its default role for the store's configured identity
    (None: it opens no store and takes no principal), ``purpose`` its own purpose of use
    (None: the role's usual one), ``creates_store`` whether it may make the store (then the
    OS user is the default admin), ``purpose_flag`` whether ``--purpose`` is the principal's
    (``consent grant`` uses it for the consent's purpose), ``credential`` whether it needs the
    admin credential (:mod:`.credential`) besides the role."""

    words: tuple[str, ...]
    func: Command
    configure: Configure
    role: Role | None
    purpose: Purpose | None = None
    creates_store: bool = False
    purpose_flag: bool = True
    credential: bool = False

    @property
    def name(self) -> str:
        return " ".join(self.words)

    @property
    def doc(self) -> str:
        return inspect.cleandoc(self.func.__doc__ or "")


#: every command, by its words joined with a space ("consent grant")
COMMANDS: dict[str, Spec] = {}
#: the docstring of each command group ("consent"), its --help
GROUPS: dict[str, str] = {}


def _nothing(_: argparse.ArgumentParser) -> None:
    return None


def command(
    name: str,
    configure: Configure = _nothing,
    *,
    role: Role | None,
    purpose: Purpose | None = None,
    creates_store: bool = False,
    purpose_flag: bool = True,
    credential: bool = False,
) -> Callable[[Command], Command]:
    """Register the decorated function as command ``name`` (one word, or a group and an action:
    ``"consent grant"``); ``configure`` adds its arguments. See :class:`Spec` for the rest."""

    def register(fn: Command) -> Command:
        words = tuple(name.split())
        if not 1 <= len(words) <= 2:
            raise ValueError(f"a command is one word or a group and an action, got {name!r}")
        if len(words) == 2 and words[0] not in GROUPS:
            raise ValueError(f"register the group {words[0]!r} before its command {name!r}")
        COMMANDS[name] = Spec(words, fn, configure, role, purpose, creates_store, purpose_flag, credential)
        return fn

    return register


def group(name: str, doc: str) -> None:
    """Declare the command group ``name`` with its --help text ``doc``."""
    GROUPS[name] = inspect.cleandoc(doc)


def _identity_flags(p: argparse.ArgumentParser, prefix: str, *, purpose: bool = True) -> None:
    g = p.add_argument_group(
        "acting principal", "who runs the command; default: MSM_MEM_ACTOR/_ROLE/_PURPOSE, else DIR/identity.json"
    )
    g.add_argument("--actor", dest=f"{prefix}actor", metavar="ID", help="who is acting (an id, never a patient's)")
    g.add_argument("--role", dest=f"{prefix}role", metavar="ROLE", help=", ".join(r.value for r in Role))
    if purpose:
        g.add_argument(
            "--purpose", dest=f"{prefix}purpose", metavar="PURPOSE", help=", ".join(p.value for p in Purpose)
        )


def _epilog(spec: Spec) -> str | None:
    if spec.role is None:
        return None
    purpose = spec.purpose or identity.USUAL_PURPOSE[spec.role]
    if spec.creates_store:
        return f"Default principal: the OS user name as {spec.role.value} (purpose {purpose.value})."
    return f"Default principal: the store's configured identity (DIR/identity.json) as {spec.role.value}, " + (
        f"purpose {purpose.value}; a role or purpose named by flag or environment wins."
    )


def _leaf(sub: argparse._SubParsersAction[argparse.ArgumentParser], word: str, spec: Spec) -> None:
    doc = spec.doc
    p = sub.add_parser(
        word,
        help=doc.splitlines()[0] if doc else None,
        description=doc or None,
        epilog=_epilog(spec),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    spec.configure(p)
    if spec.role is not None:
        _identity_flags(p, "", purpose=spec.purpose_flag)
    p.set_defaults(spec=spec)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every registered command."""
    parser = argparse.ArgumentParser(
        prog="msm-mem",
        description=DESCRIPTION,
        epilog=identity.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"msm-mem {__version__}")
    _identity_flags(parser, "global_")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    actions: dict[str, argparse._SubParsersAction[argparse.ArgumentParser]] = {}
    for spec in COMMANDS.values():
        if len(spec.words) == 1:
            _leaf(sub, spec.words[0], spec)
            continue
        head, word = spec.words
        if head not in actions:
            doc = GROUPS[head]
            g = sub.add_parser(
                head, help=doc.splitlines()[0], description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
            )
            actions[head] = g.add_subparsers(dest="action", required=True, metavar="ACTION")
        _leaf(actions[head], word, spec)
    return parser


def _principal_of(args: argparse.Namespace, spec: Spec) -> Principal:
    assert spec.role is not None
    flags = {k: getattr(args, k, None) for k in ("actor", "role", "purpose")}
    if not spec.purpose_flag:
        flags["purpose"] = None  # there --purpose is the command's own argument
    glob = {k: getattr(args, f"global_{k}", None) for k in ("actor", "role", "purpose")}
    given = identity.Given.of(flags, glob, identity.environment())
    directory: Path | None = getattr(args, "dir", None)
    creates = spec.creates_store and (directory is None or not MsmMem.exists(directory))
    return identity.resolve(given, directory, role=spec.role, purpose=spec.purpose, creates_store=creates)


def backbone_flags(p: argparse.ArgumentParser) -> None:
    """``--backbone``, ``--backbone-option`` and ``--backbone-config`` (see :data:`BACKBONE_HELP`)."""
    g = p.add_argument_group("backbone", textwrap.fill(BACKBONE_HELP, 78, break_on_hyphens=False))
    g.add_argument("--backbone", metavar="NAME", help="nonparametric (default), fitted, openai or transformers")
    g.add_argument(
        "--backbone-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one of the backbone's options (a JSON value or text), e.g. base_url=http://gpu-host:8000/v1 "
        "model=llava-hf/llava-1.5-7b-hf timeout_s=60 (repeatable)",
    )
    g.add_argument("--backbone-config", type=Path, metavar="FILE", help="a TOML file: name = ... and [options]")


def backbone_of(args: argparse.Namespace) -> BackboneConfig:
    """The backbone the flags of :func:`backbone_flags`, the environment and the file name."""
    return BackboneConfig.resolve(args.backbone, args.backbone_option, file=args.backbone_config)


def principal(args: argparse.Namespace) -> Principal:
    """The acting principal of the running command (resolved by :func:`main`)."""
    who = getattr(args, "principal", None)
    assert isinstance(who, Principal), "the command was registered without a role"
    return who


def checkpoint_options() -> dict[str, Any]:
    """Where the audit checkpoints and their key live, from ``MSM_MEM_CHECKPOINT_KEY``,
    ``MSM_MEM_CHECKPOINTS`` and ``MSM_MEM_WITNESS`` (unset: inside the store directory)."""
    names = {
        "checkpoint_key": "MSM_MEM_CHECKPOINT_KEY",
        "checkpoints": "MSM_MEM_CHECKPOINTS",
        "witness": "MSM_MEM_WITNESS",
    }
    return {option: os.environ[name] for option, name in names.items() if os.environ.get(name)}


def open_mem(args: argparse.Namespace, **options: Any) -> MsmMem:
    """Open the store in ``args.dir`` with the settings of the environment (``MSM_MEM_*``); a
    tenant given (``MSM_MEM_TENANT``, or the option) must be the store's."""
    options.setdefault("tenant", os.environ.get("MSM_MEM_TENANT") or None)
    return MsmMem.open(args.dir, settings=Settings.from_env(), **checkpoint_options(), **options)


def require_store(directory: Path) -> None:
    """StoreError when ``directory`` holds no msm-mem store (looked up by file names only)."""
    if not MsmMem.exists(directory):
        raise StoreError(f"{directory} is not an msm-mem store: check the path, or create one with msm-mem init")


#: the exit status of a command whose output was cut off (its reader left: ``| head``), as a
#: process ended by SIGPIPE reports it in a shell (128 + 13)
BROKEN_PIPE = 141


def _quiet_stdout() -> None:
    """Point stdout at /dev/null once its reader has left, so that flushing it at exit raises
    no second BrokenPipeError (and prints no "Exception ignored" message)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout without a file descriptor (captured in-process)
        pass


def _broken_pipe(exc: BaseException) -> bool:
    """Whether ``exc`` is (or, in an exception group, holds only) a broken pipe or a reset
    connection: the reader of our output has gone."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_broken_pipe(e) for e in exc.exceptions)
    return isinstance(exc, BrokenPipeError | ConnectionResetError)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 1 error, 2 usage; ``audit verify``: 3
    broken; ``ingest``: 4 some rows skipped, 5 nothing stored; 141 when the reader of the output
    left, as ``| head`` does, which ends the command quietly).

    Errors print one line, ``error: <message>``, on stderr; ``--help`` and usage errors
    return their status instead of raising ``SystemExit``, so callers in-process get a code.
    A command on a store checks that DIR is one before it resolves who is acting, so a
    mistyped DIR is the first error named.
    """
    with escaped_output():  # stored text reaches the terminal: no raw escape codes
        return _run(argv)


def _run(argv: Sequence[str] | None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse exits on --help (0) and on usage errors (2)
        return exc.code if isinstance(exc.code, int) else 2
    spec: Spec = args.spec
    try:
        directory = getattr(args, "dir", None)
        if isinstance(directory, Path) and not spec.creates_store:
            require_store(directory)
        if spec.role is not None:
            args.principal = _principal_of(args, spec)
        admin = getattr(args, "principal", None)
        needs = admin is None or admin.role is Role.ADMIN  # another role is refused by the operation itself
        if spec.credential and isinstance(directory, Path) and MsmMem.exists(directory) and needs:
            from .credential import require_admin_credential

            require_admin_credential(directory, spec.name)
        code = int(spec.func(args))
        sys.stdout.flush()  # a reader that left shows here, not at exit
        return code
    except KeyboardInterrupt:
        return 130
    except BaseException as exc:
        if _broken_pipe(exc):
            _quiet_stdout()
            return BROKEN_PIPE
        if isinstance(exc, MsmMemError | OSError):  # OSError: unreadable or unwritable paths
            print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
            return 1
        raise
