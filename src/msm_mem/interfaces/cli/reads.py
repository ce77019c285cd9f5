"""Read commands: ``show`` a patient's semantic state and its history, episodes, visual
records, claims and short-term items (each read consent-checked and audited)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ... import Claim, InvalidInput, Role, SemanticState, StmItem, StmState
from .output import iso, print_json
from .registry import command, group, open_mem, principal

__all__ = ["cmd_claims", "cmd_episodes", "cmd_history", "cmd_state", "cmd_stm", "cmd_visuals"]

group(
    "show",
    """Show what the store holds about one patient: semantic state, episodes, claims, STM.

    Each read is a consent-checked turn as an agent, clinician, critic or the system role (the
    auditor reads no patient data) and leaves one audit event naming the ids it returned.
    --json prints one JSON list of the records (without embeddings).""",
)


def _patient(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path)
    p.add_argument("--patient", required=True)
    p.add_argument("--json", action="store_true", help="print exactly one JSON list")


def _semantic(states: list[SemanticState]) -> None:
    for s in states:
        since = f", supersedes {s.supersedes}" if s.supersedes else ""
        print(f"{s.state_id} {s.category} v{s.version} {s.state.value} ({s.evidence_tier}{since})")
        for imp in s.impressions:
            decision = f" [{imp.decision}]" if imp.decision else ""
            print(f"  {iso(imp.timestamp)}  {imp.text}{decision}")


def _configure_state(p: argparse.ArgumentParser) -> None:
    _patient(p)
    p.add_argument("--category", help="one category only (default: every category)")


@command("show state", _configure_state, role=Role.CLINICIAN)
def cmd_state(args: argparse.Namespace) -> int:
    """The patient's active semantic state: one version per category, with its impressions."""
    with open_mem(args) as mem:
        states = mem.semantic_state(principal(args), args.patient, args.category)
    if args.json:
        print_json(states)
    else:
        _semantic(states)
    return 0


def _configure_history(p: argparse.ArgumentParser) -> None:
    _patient(p)
    p.add_argument("--category", default="impression", help="the category (default: impression)")


@command("show history", _configure_history, role=Role.CLINICIAN)
def cmd_history(args: argparse.Namespace) -> int:
    """Every version of the patient's semantic state in one category, oldest first.

    Each version names the one it supersedes: the state is superseded, never rewritten."""
    with open_mem(args) as mem:
        states = mem.semantic_history(principal(args), args.patient, args.category)
    if args.json:
        print_json(states)
    else:
        _semantic(states)
    return 0


@command("show episodes", _patient, role=Role.CLINICIAN)
def cmd_episodes(args: argparse.Namespace) -> int:
    """The patient's episodic records (past interactions) in every state, with their answers."""
    with open_mem(args) as mem:
        episodes = mem.episodes(principal(args), args.patient)
    if args.json:
        print_json(episodes)
        return 0
    for e in episodes:
        since = f", supersedes {e.supersedes}" if e.supersedes else ""
        print(
            f"{e.episode_id} study={e.study_id or '-'} {iso(e.timestamp)} {e.state.value} "
            f"({e.evidence_tier}, confidence {e.confidence:.2f}{since})"
        )
        print(f"  Q: {e.question}")
        print(f"  A: {e.answer}")
    return 0


@command("show visuals", _patient, role=Role.CLINICIAN)
def cmd_visuals(args: argparse.Namespace) -> int:
    """The patient's visual records (image embeddings' metadata; the vectors are not printed)."""
    with open_mem(args) as mem:
        visuals = mem.visuals(principal(args), args.patient)
    if args.json:
        print_json(visuals)
        return 0
    for v in visuals:
        print(
            f"{v.visual_id} {iso(v.timestamp)} {v.state.value} episode={v.source_episode_id or '-'} "
            f"tag={v.visual_tag or '-'} media={v.media_path or '-'}"
        )
    return 0


def _configure_claims(p: argparse.ArgumentParser) -> None:
    _patient(p)
    p.add_argument(
        "--key",
        help="one claim key, study:<study>|q:<question key> as `show claims` lists them (default: every active claim)",
    )
    p.add_argument("--history", action="store_true", help="the key's whole supersession chain, oldest first")


def _claim_line(c: Claim) -> str:
    since = f", supersedes {c.supersedes}" if c.supersedes else ""
    return (
        f"{c.claim_id} {c.key} {c.state.value} ({c.evidence_tier}, confidence {c.confidence:.2f}{since}): {c.content}"
    )


@command("show claims", _configure_claims, role=Role.CLINICIAN)
def cmd_claims(args: argparse.Namespace) -> int:
    """The patient's active claims (findings with source, confidence and evidence tier).

    --key KEY shows one key's active claim, --key KEY --history its supersession chain."""
    with open_mem(args) as mem:
        if args.history:
            if not args.key:
                raise InvalidInput("--history needs --key")
            claims = mem.claim_history(principal(args), args.patient, args.key)
        else:
            claims = mem.claims(principal(args), args.patient, args.key)
    if args.json:
        print_json(claims)
        return 0
    for c in claims:
        print(_claim_line(c))
    return 0


def _configure_stm(p: argparse.ArgumentParser) -> None:
    _patient(p)
    p.add_argument("--state", choices=[s.value for s in StmState], help="only items in this state")


def _stm_line(i: StmItem) -> str:
    return f"{i.item_id} {i.kind} {i.state.value} created {iso(i.created_at)} expires {iso(i.expires_at)}"


@command("show stm", _configure_stm, role=Role.CLINICIAN)
def cmd_stm(args: argparse.Namespace) -> int:
    """The patient's short-term items (the working set of turns), with their state and expiry."""
    with open_mem(args) as mem:
        items = mem.stm_items(principal(args), args.patient, StmState(args.state) if args.state else None)
    if args.json:
        print_json(items)
        return 0
    for i in items:
        print(_stm_line(i))
    return 0
