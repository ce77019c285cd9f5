"""Store commands: init, ingest, export, import."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ... import AccessDenied, IngestReport, InvalidInput, MsmMem, Purpose, Role, RowProblem, read_manifest
from ..._media import image_root, set_image_root
from ..._settings import Settings
from .credential import ADMIN_KEY_FILE, issue_admin_key
from .identity import write_identity
from .registry import TENANT_HELP, checkpoint_options, command, group, open_mem, principal

__all__ = ["cmd_export", "cmd_image_root", "cmd_import", "cmd_ingest", "cmd_init", "cmd_upgrade"]

#: the exit statuses of ingest besides 0 (everything stored or stored already) and 1 (an error)
SOME_SKIPPED, NOTHING_STORED = 4, 5


def _configure_init(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path)
    p.add_argument("--encoder", help="image encoder plugin (default: pixels, or MSM_MEM_ENCODER)")
    p.add_argument("--database-url", metavar="URL", help="keep the store of record on this PostgreSQL server")
    p.add_argument("--schema", help="PostgreSQL schema of the store (default: msm_mem; needs --database-url)")
    p.add_argument("--tenant", help=TENANT_HELP)
    p.add_argument(
        "--audit-chains",
        type=int,
        default=1,
        metavar="N",
        help="cut the patients into N lanes (1 to 256; needs --database-url), each with its own write lock, "
        "audit chain and row digests, so writers of patients in different lanes do not wait for one "
        "another (docs/deploy.md); fixed for the store's life (default 1)",
    )
    p.add_argument(
        "--population",
        choices=["permit", "deny"],
        default="permit",
        help="whether the default consent policy lets every patient's de-identified records inform other "
        "patients' answers (permit, the default: a patient opts out with a deny of population) or not "
        "(deny: a patient opts in with a permit of population); docs/privacy.md",
    )


@command("init", _configure_init, role=Role.ADMIN, creates_store=True)
def cmd_init(args: argparse.Namespace) -> int:
    """Create a new memory store in DIR, as its admin.

    By default the store of record is embedded: a SQLite database plus FAISS caches in DIR.
    With --database-url it is a new store in a schema of that PostgreSQL server (pgvector
    needed), and DIR holds store.json, which points at it without the password (libpq reads
    that from PGPASSWORD or ~/.pgpass). Either way DIR keeps the key file, the checkpoint
    key and the signed audit checkpoints, and gets the default consent policy (granted by
    the admin; audited): the care team (agents, clinicians, critics) for treatment, with
    population use (other patients' de-identified experience) permitted unless --population
    deny. Every row carries the store's --tenant: directories of several
    tenants may share one PostgreSQL schema, each a separate store (docs/deploy.md).
    --audit-chains N (a PostgreSQL store) gives the store N patient lanes, each with its own
    write lock and audit chain, so one hospital's writers of different patients write in
    parallel (docs/deploy.md).

    The admin is --actor (else MSM_MEM_ACTOR, else the OS user name) with role admin; any
    other role is refused. DIR/identity.json (mode 0600) records who initialised the store:
    later commands on DIR act as that identity, in each command's default role, unless told
    otherwise (see msm-mem --help)."""
    if args.schema is not None and args.database_url is None:
        raise InvalidInput("--schema names a PostgreSQL schema: give --database-url too")
    if args.audit_chains != 1 and args.database_url is None:
        raise InvalidInput("--audit-chains above 1 needs a PostgreSQL store: give --database-url too")
    settings = Settings.from_env()
    if args.encoder:
        settings = settings.with_(encoder=args.encoder)
    if args.tenant:
        settings = settings.with_(tenant=args.tenant)
    schema = args.schema or "msm_mem"
    admin = principal(args)
    options = checkpoint_options()
    with MsmMem.init(
        args.dir,
        admin,
        settings=settings,
        database_url=args.database_url,
        schema=schema,
        population=args.population == "permit",
        audit_chains=args.audit_chains,
        **options,
    ) as mem:
        write_identity(args.dir, admin)
        where = f"PostgreSQL schema {schema}" if args.database_url else "embedded"
        if args.audit_chains != 1:
            where += f", {args.audit_chains} audit chains"
        print(f"created store {args.dir} ({where}; encoder {mem.encoder_name}, {mem.dim}-d; admin {admin.id})")
        print(
            f"keys and admin credential in {MsmMem.key_folder(args.dir)} (back it up apart from {args.dir};"
            f" {issue_admin_key(args.dir, admin).name} is what admin commands need, or MSM_MEM_ADMIN_KEY)"
        )
        if args.population == "permit":
            print(
                "consent policy: the care team for treatment; every patient's de-identified records may "
                "inform other patients' answers until that patient denies population (docs/privacy.md)"
            )
        else:
            print(
                "consent policy: the care team for treatment; no patient's records inform another's answers "
                "until a consent permits population for that patient (docs/privacy.md)"
            )
    return 0


def _print_problems(problems: Sequence[RowProblem]) -> None:
    for p in problems:
        where = f"line {p.line}" if p.line else "row"
        print(f"skipped {where}: {p.reason}", file=sys.stderr)


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
    p.add_argument(
        "--image-root",
        action="append",
        type=Path,
        default=[],
        metavar="DIR",
        help="with --manifest: a folder the images may lie in instead of the manifest's own (repeatable; a"
        " hospital export whose images are elsewhere); links and '..' may not leave it",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _nothing_stored(total: int, problems: Sequence[RowProblem]) -> str:
    """Why an ingest stored nothing, in one line."""
    if not total:
        return "nothing stored: the manifest or data set has no rows"
    first = problems[0]
    where = f"line {first.line}" if first.line else "a row"
    return f"nothing stored: all {total} rows were skipped ({where}: {first.reason})"


@command("ingest", _configure_ingest, role=Role.SYSTEM)
def cmd_ingest(args: argparse.Namespace) -> int:
    """Encode and store the studies of a manifest or a data set in DIR (base memory).

    Bad rows are reported with their line number and reason; good rows are ingested. A row
    already stored (same patient, study and question) is left as it is, so ingest can be
    re-run; a new question about a stored study is ingested (docs/manifest.md). Images lie
    in the manifest's folder, or in the --image-root folders; each is stored by its absolute
    path, so the store finds it from any working directory. Prints "ingested N studies (M
    questions), K questions already stored, J rows skipped". Runs as the system role (or a
    clinician), consent-checked per patient and audited.

    Exit status: 0 when every row is stored (now or before); 4 when some rows were skipped
    and the rest stored; 5 when nothing is stored and nothing was stored before (every row
    skipped, or no rows), with one line saying why; 1 for an error (nothing stored)."""
    who = principal(args)
    if args.image_root and args.manifest is None:
        raise InvalidInput("--image-root applies to --manifest; a data set loader reads its own folder")
    dataset = None
    if args.dataset is not None:  # a relative folder would store paths relative to this directory
        dataset = (args.dataset[0], os.path.abspath(args.dataset[1]))
    with open_mem(args) as mem:
        if args.manifest is not None:
            rows, problems = read_manifest(args.manifest, root=args.image_root or None)
        else:
            from ...datasets.registry import load_dataset

            assert dataset is not None
            rows, problems = load_dataset(*dataset)
        _print_problems(problems)
        report = mem.ingest(who, rows, progress=not args.no_progress) if rows else IngestReport()
    _print_problems(report.problems)
    every = dataclasses.replace(report, problems=(*problems, *report.problems))
    print(every.summary())
    if not every.ingested and not every.already_stored:
        print(f"error: {_nothing_stored(len(rows) + len(problems), every.problems)}", file=sys.stderr)
        return NOTHING_STORED
    return SOME_SKIPPED if every.problems else 0


def _configure_layout(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path)
    p.add_argument("--format", choices=["paper"], required=True, help="the paper's JSONL + FAISS layout")
    p.add_argument("path", type=Path)


@command("export", _configure_layout, role=Role.CLINICIAN, purpose=Purpose.EXPORT)
def cmd_export(args: argparse.Namespace) -> int:
    """Export DIR to PATH in the paper's layout (episodic/visual .jsonl + .faiss, semantic/).

    Runs as a clinician or admin with purpose export: only the patients whose consent permits
    that export are written (the default policy permits clinicians); audited."""
    with open_mem(args) as mem:
        counts = mem.export_paper(principal(args), args.path)
    print(f"exported {counts} to {args.path}")
    return 0


@command("import", _configure_layout, role=Role.ADMIN, creates_store=True, credential=True)
def cmd_import(args: argparse.Namespace) -> int:
    """Import the paper's layout from PATH into DIR (created when missing; must be empty).

    A missing DIR is created as by msm-mem init, with the layout's encoder, and records the
    importing admin in DIR/identity.json. The import runs as an admin (or the system role)
    and is audited."""
    who = principal(args)
    if not MsmMem.exists(args.dir):
        try:
            layout = json.loads((args.path / "layout.json").read_text(encoding="utf-8"))
            encoder = str(layout["encoder"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InvalidInput(f"{args.path} is not a paper layout: {exc}") from exc
        MsmMem.init(args.dir, who, settings=Settings.from_env().with_(encoder=encoder), **checkpoint_options()).close()
        write_identity(args.dir, who)
        print(f"admin credential: {issue_admin_key(args.dir, who)} (MSM_MEM_ADMIN_KEY; see msm-mem --help)")
    with open_mem(args) as mem:
        counts = mem.import_paper(who, args.path)
    print(f"imported {counts} into {args.dir}")
    return 0


group("store", "The store itself: upgrade one written by an older msm-mem, record its image root.")


def _configure_upgrade(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path)
    p.add_argument(
        "--tenant",
        default=os.environ.get("MSM_MEM_TENANT"),
        help="the tenant the rows become (embedded; default: MSM_MEM_TENANT, else 'default'); a PostgreSQL"
        " store's is its store.json's",
    )


@command("store upgrade", _configure_upgrade, role=Role.ADMIN, credential=True)
def cmd_upgrade(args: argparse.Namespace) -> int:
    """Upgrade DIR, written by an older msm-mem, to this version's store (once; as an admin).

    Other commands refuse such a store and name this one. The audit chain is checked first
    (every hash and link, and every checkpoint it has): a chain that fails is refused, naming
    the first bad seq, and nothing changes. Then one transaction gives every row the store's
    tenant, encrypts the visual tags kept in clear, computes the row digests, records the new
    schema and writes the audited event of the upgrade, whose signed checkpoint adopts the
    chain's head. A crash before the commit leaves the old store as it was.

    Keys kept inside DIR (keys/kek.json, keys/checkpoint.key) move to the store's folder of the
    key home (MSM_MEM_KEY_HOME, default ~/.config/msm-mem/keys): copied, loaded back, then
    removed from DIR, so a copy of DIR no longer holds them. Back that folder up."""
    result = MsmMem.upgrade(args.dir, principal(args), tenant=args.tenant, **checkpoint_options())
    moved = f", {result['keys_moved']} key files moved to the key home" if result["keys_moved"] else ""
    if result["keys_moved"] and not (MsmMem.key_folder(args.dir) / ADMIN_KEY_FILE).exists():
        moved += f"; admin credential: {issue_admin_key(args.dir, principal(args))}"
    print(
        f"upgraded {args.dir} from store schema {result['from_schema']} to {result['to_schema']}:"
        f" {result['visual_tags_encrypted']} visual tags encrypted, {result['events_signed']} audit events signed"
        + moved
    )
    return 0


def _configure_image_root(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path)
    p.add_argument("folder", type=Path, nargs="?", help="the folder to record (default: print the recorded one)")


@command("store image-root", _configure_image_root, role=Role.ADMIN, credential=True)
def cmd_image_root(args: argparse.Namespace) -> int:
    """Print or record the folder that DIR's relative image paths resolve against (as an admin).

    This msm-mem stores every ingested image by its absolute path. A store ingested by an
    older one holds paths relative to the folder its ingest ran in, which resolve against the
    working directory of whoever reads them (so `serve` started elsewhere cannot read them)
    until that folder is recorded here: `msm-mem store image-root DIR FOLDER` writes it to
    DIR/media.json (absolute; it must exist), and every later use of a stored study's image,
    in any process, resolves relative paths against it. Absolute paths are unaffected.
    Without FOLDER, prints the recorded folder, or says there is none."""
    who = principal(args)
    if args.folder is None:
        root = image_root(args.dir)
        print(root if root is not None else "no image root recorded: relative paths resolve from the working directory")
        return 0
    if who.role is not Role.ADMIN:  # not an operation of the API: the check is here
        raise AccessDenied(f"role {who.role.value!r} may not record the image root: only admin")
    recorded = set_image_root(args.dir, args.folder)
    print(f"recorded image root {recorded} in {args.dir}")
    return 0
