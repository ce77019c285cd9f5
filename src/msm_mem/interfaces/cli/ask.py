"""Clinical commands: ask, retrieve, observe, consolidate, feedback, and context and
record-answer for an agent that calls its own model."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ... import Evidence, Role
from .output import as_json, iso, parse_time, print_json
from .registry import backbone_flags, backbone_of, command, open_mem, principal

__all__ = [
    "cmd_ask",
    "cmd_consolidate",
    "cmd_context",
    "cmd_feedback",
    "cmd_observe",
    "cmd_record_answer",
    "cmd_retrieve",
]

_MEMORIES = {"sem": "semantic", "epi": "episodic", "vis": "visual"}


def _json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print exactly one JSON object")


def _study_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--study", default="", help="the study's id (feedback names it later)")
    p.add_argument("--time", help="the study's time, ISO 8601 (default now)")


def _image_flags(p: argparse.ArgumentParser) -> None:
    image = p.add_mutually_exclusive_group(required=True)
    image.add_argument("--image", type=Path, help="the image file (PNG, JPEG, DICOM or video)")
    image.add_argument(
        "--image-study",
        metavar="STUDY",
        help="instead of --image: the image of one of the patient's stored studies (by study id)",
    )


def _image(args: argparse.Namespace) -> dict[str, Any]:
    """The image arguments of ask, retrieve and observe: a file, or a stored study."""
    if args.image_study is not None:
        return {"image": None, "image_study": args.image_study}
    return {"image": str(args.image)}


def _ablation_flags(p: argparse.ArgumentParser) -> None:
    for flag, name in _MEMORIES.items():
        p.add_argument(f"--no-{flag}", action="store_true", help=f"ablation: do not use {name} memory")


def _ablation(args: argparse.Namespace) -> tuple[bool, bool, bool]:
    """(use_sem, use_epi, use_vis) from the --no-* flags."""
    return not args.no_sem, not args.no_epi, not args.no_vis


def _print_evidence(evidence: Iterable[Evidence]) -> None:
    print("evidence:")
    shown = 0
    for e in evidence:
        shown += 1
        print(
            f"  {e.kind:<9} {e.id}  score={e.score:.4f} (cosine {e.cosine:.3f} x confidence {e.confidence:.2f}"
            f" x freshness {e.freshness:.3f} x tier {e.tier_weight:.2f})"
        )
    if not shown:
        print("  (none)")


def _configure_ask(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path)
    p.add_argument("--patient", required=True)
    _image_flags(p)
    p.add_argument("--question", required=True)
    _study_flags(p)
    _json_flag(p)
    p.add_argument("--no-write-back", action="store_true", help="answer without writing to memory")
    _ablation_flags(p)
    backbone_flags(p)


@command("ask", _configure_ask, role=Role.AGENT)
def cmd_ask(args: argparse.Namespace) -> int:
    """Answer a clinical question about an image with the patient's memory.

    Runs the governed online loop (consent check, short-term write, ranked retrieval, fusion,
    backbone, write-back gate, audit) as an agent or clinician. The image is a file
    (--image) or one of the patient's stored studies (--image-study STUDY: its image file). Prints the answer, the
    evidence trail (memory id, kind, score = cosine x composite_k, and each factor) and the
    gate decision; --json prints one object with keys answer, evidence [{id, kind, score,
    cosine, confidence, freshness, tier_weight}], gate {written, reasons} (null with
    --no-write-back), backbone, source, decision and model {backbone, model, version}. The
    answer comes from --backbone (default nonparametric) with its options, e.g. --backbone
    openai --backbone-option base_url=http://gpu-host:8000/v1 --backbone-option model=NAME."""
    use_sem, use_epi, use_vis = _ablation(args)
    with open_mem(args, backbone=backbone_of(args).build()) as mem:
        result = mem.ask(
            principal(args),
            args.patient,
            question=args.question,
            **_image(args),
            timestamp=parse_time(args.time),
            study_id=args.study,
            write_back=not args.no_write_back,
            use_sem=use_sem,
            use_epi=use_epi,
            use_vis=use_vis,
        )
    if args.json:
        print_json(result.to_json())
        return 0
    print(f"answer: {result.answer}")
    print(f"  (backbone {result.backbone}: {result.source}; model {result.model.audit_id if result.model else '-'})")
    _print_evidence(result.evidence or ())
    if result.gate is not None:
        verdict = "written to memory" if result.gate.written else "not written"
        print(f"gate: {verdict} ({', '.join(result.gate.reasons)})")
    return 0


def _configure_retrieve(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path)
    p.add_argument("--patient", required=True)
    _image_flags(p)
    p.add_argument(
        "--scope",
        choices=["patient", "population"],
        default="patient",
        help="patient: only the patient's memory (default); population: also consented and anonymised records",
    )
    p.add_argument("--at", help="the query's time for freshness, ISO 8601 (default now)")
    _json_flag(p)
    _ablation_flags(p)


@command("retrieve", _configure_retrieve, role=Role.AGENT)
def cmd_retrieve(args: argparse.Namespace) -> int:
    """Show the ranked evidence for an image without answering (nothing is written but the audit).

    Ranks the patient's semantic state and episodic and visual records by cosine x
    composite_k (for --image-study STUDY: the embedding stored with that study), as an
    agent, clinician, critic or the system role; --scope population adds other patients'
    consented and anonymised records. --json prints one object: patient, scope, evidence
    [{id, kind, score, cosine, confidence, freshness, tier_weight, record}], where record is
    a de-identified copy (no patient id, no source) for population experience and null for a
    record that still names another patient (its content withheld)."""
    use_sem, use_epi, use_vis = _ablation(args)
    with open_mem(args) as mem:
        found = mem.retrieve(
            principal(args),
            args.patient,
            **_image(args),
            scope=args.scope,
            at=parse_time(args.at),
            use_sem=use_sem,
            use_epi=use_epi,
            use_vis=use_vis,
        )
    if args.json:
        evidence = [{**i.evidence.to_json(), "record": as_json(i.record)} for i in found.items]
        print_json({"patient": found.patient_id, "scope": found.scope, "evidence": evidence})
        return 0
    _print_evidence(found.evidence)
    return 0


def _configure_observe(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path)
    p.add_argument("--patient", required=True)
    _image_flags(p)
    p.add_argument("--question", required=True)
    _study_flags(p)
    _json_flag(p)


@command("observe", _configure_observe, role=Role.AGENT)
def cmd_observe(args: argparse.Namespace) -> int:
    """Write a working observation (image and question) into the patient's short-term memory.

    The image is a file (--image) or one of the patient's stored studies (--image-study).
    The item lives until its TTL (MSM_MEM_STM_TTL_S) unless consolidate moves it into
    long-term memory; maintain expires it. As an agent, clinician or the system role;
    audited. Prints the item id and its expiry; --json prints the item (without its
    embedding)."""
    with open_mem(args) as mem:
        item = mem.observe(
            principal(args),
            args.patient,
            question=args.question,
            **_image(args),
            timestamp=parse_time(args.time),
            study_id=args.study,
        )
    if args.json:
        print_json(item)
        return 0
    print(f"{item.item_id} {item.state.value} expires {iso(item.expires_at)}")
    return 0


def _configure_consolidate(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path)
    p.add_argument("--patient", required=True)
    p.add_argument("--item", required=True, metavar="ID", help="the short-term item (from observe)")
    p.add_argument("--answer", required=True, help="the answer to store with the observation")
    p.add_argument("--decision", default="", help="the clinical decision taken, if any")
    _json_flag(p)


@command("consolidate", _configure_consolidate, role=Role.AGENT)
def cmd_consolidate(args: argparse.Namespace) -> int:
    """Move a short-term item into long-term memory with its answer, through the write-back gate.

    The gate (novelty, answer length, clinical keyword) decides what reaches long-term
    memory: a written answer becomes the patient's new semantic state and the claim of its
    question about its study (each superseding the last version, never rewritten); an item
    the gate holds stays in short-term memory with its answer and becomes neither. As an
    agent, clinician or the system role; audited. --json prints one object: gate {written,
    reasons}; episode_id and visual_id, the long-term records (null when the gate holds the
    item; visual_id null too when the study's image has a visual record already);
    semantic_id, the new semantic state (null when the gate holds the item)."""
    with open_mem(args) as mem:
        result = mem.consolidate(principal(args), args.patient, args.item, args.answer, decision=args.decision)
    ids = {
        "episode_id": result.episode_id,
        "visual_id": result.visual_id,
        "semantic_id": result.semantic.state_id if result.semantic is not None else None,
    }
    if args.json:
        print_json({"gate": {"written": result.gate.written, "reasons": list(result.gate.reasons)}, **ids})
        return 0
    verdict = "written to memory" if result.gate.written else "held in short-term memory"
    print(f"gate: {verdict} ({', '.join(result.gate.reasons)})")
    for name, value in ids.items():
        if value is not None:
            print(f"  {name} {value}")
    return 0


def _configure_feedback(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path)
    p.add_argument("--patient", required=True)
    p.add_argument("--study", required=True, help="the study whose answer is judged")
    p.add_argument(
        "--question",
        metavar="TEXT",
        help="the question whose answer is judged (needed when the study holds answers to several)",
    )
    verdict = p.add_mutually_exclusive_group(required=True)
    verdict.add_argument("--accept", action="store_true", help="the agent's answer stands")
    verdict.add_argument("--correction", metavar="TEXT", help="reject it: the correct answer")
    p.add_argument("--decision", default="", help="the clinical decision, if any")
    _json_flag(p)


@command("feedback", _configure_feedback, role=Role.CRITIC)
def cmd_feedback(args: argparse.Namespace) -> int:
    """Record a critic verdict on the agent's answer to a question about a study (e.g. the signed report).

    --accept keeps the answer, --correction TEXT replaces it: the question's claim and the
    answer's impression in the semantic state are superseded at the critic's evidence tier,
    a consolidated episode by a corrected copy, a held answer promoted; answers to the
    study's other questions stay. --question names the question when the study holds
    answers to several. As a critic or clinician; audited. Prints the new claim; --json
    prints it as one object."""
    with open_mem(args) as mem:
        claim = mem.feedback(
            principal(args),
            args.patient,
            args.study,
            accept=args.accept,
            correction=args.correction or "",
            decision=args.decision,
            question=args.question,
        )
    if args.json:
        print_json(claim)
        return 0
    print(f"{claim.claim_id} {claim.key} ({claim.evidence_tier}, supersedes {claim.supersedes}): {claim.content}")
    return 0


def _configure_context(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path)
    p.add_argument("--patient", required=True)
    _image_flags(p)
    p.add_argument("--question", required=True)
    _study_flags(p)
    _json_flag(p)
    _ablation_flags(p)


@command("context", _configure_context, role=Role.AGENT)
def cmd_context(args: argparse.Namespace) -> int:
    """Print the patient's memory fused into a prompt for your own model (ask without the model).

    Runs ask up to the model (consent check, short-term write, the audited reads, fusion) as
    an agent or clinician and prints the prompt: patient history, study claims, similar prior
    encounters and images, each evidence line starting with its memory id in brackets, then the
    question. Then the context id (answer it with record-answer before it expires), the ids
    included and dropped for the character budget, and the evidence with its scores. --json
    prints one object: context_id, patient_id, question, prompt, included, dropped,
    budget_chars, evidence [{id, kind, score, cosine, confidence, freshness, tier_weight}],
    study_id, image_study, expires_at."""
    use_sem, use_epi, use_vis = _ablation(args)
    with open_mem(args) as mem:
        found = mem.context(
            principal(args),
            args.patient,
            question=args.question,
            **_image(args),
            timestamp=parse_time(args.time),
            study_id=args.study,
            use_sem=use_sem,
            use_epi=use_epi,
            use_vis=use_vis,
        )
    if args.json:
        print_json(found.to_json())
        return 0
    print(found.prompt)
    print()
    print(f"context {found.context_id} (answer it with record-answer before {iso(found.expires_at)})")
    print(f"included: {' '.join(found.included) or '(none)'}")
    print(f"dropped for the {found.budget_chars}-character budget: {' '.join(found.dropped) or '(none)'}")
    return 0


def _configure_record_answer(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", type=Path)
    p.add_argument("--patient", required=True)
    p.add_argument("--context", required=True, metavar="ID", help="the context answered (from context)")
    p.add_argument("--answer", required=True, help="your model's answer")
    p.add_argument("--evidence", action="append", default=[], metavar="ID", help="a memory id the answer used")
    p.add_argument(
        "--model-backbone", required=True, metavar="NAME", help="what served the model (e.g. openai, vllm, ollama)"
    )
    p.add_argument("--model", default="", metavar="ID", help="the model's id, e.g. llava-hf/llava-1.5-7b-hf")
    p.add_argument("--model-version", default="", metavar="VERSION", help="the model's version, where known")
    p.add_argument("--outcome", default="", help="the clinical decision taken, if any")
    _json_flag(p)


@command("record-answer", _configure_record_answer, role=Role.AGENT)
def cmd_record_answer(args: argparse.Namespace) -> int:
    """Write back the answer your own model gave to a context, through the write-back gate.

    As ask writes back its own answer: the gate (novelty, answer length, clinical keyword)
    decides whether it reaches long-term memory, and a written answer supersedes the patient's
    semantic state and its question's claim. The audit trail names the model (--model-backbone,
    --model, --model-version) and the evidence ids the answer used (--evidence, repeatable).
    As an agent or clinician. --json prints one object: context_id, gate {written, reasons},
    episode_id, answer, source, evidence, model {backbone, model, version}."""
    model = {"backbone": args.model_backbone, "model": args.model, "version": args.model_version}
    with open_mem(args) as mem:
        result = mem.record_answer(
            principal(args),
            args.patient,
            args.context,
            args.answer,
            model=model,
            evidence=args.evidence,
            outcome=args.outcome,
        )
    if args.json:
        print_json(result.to_json())
        return 0
    verdict = "written to memory" if result.gate.written else "held in short-term memory"
    print(f"gate: {verdict} ({', '.join(result.gate.reasons)})")
    if result.episode_id is not None:
        print(f"  episode_id {result.episode_id}")
    print(f"  model {result.model.audit_id}")
    return 0
