"""The finding labeler (:mod:`msm_mem._memory.labeler`) against the IU X-ray reports' MeSH terms.

The IU X-ray reports (shipped in the torchxrayvision wheel, :mod:`msm_mem.datasets.iu_xray`)
were indexed by hand with MeSH ``major`` terms (``Opacity/lung/base/left``). Their headings are
mapped to the labeler's observations by :data:`MESH_TO_OBSERVATION` (a heading not in it, such
as ``Calcified Granuloma`` or ``Thoracic Vertebrae``, names nothing the labeler labels); a
report's reference set is the observations of its headings (``normal`` is ``No Finding``). The
labeler reads the report's FINDINGS and IMPRESSION text; an observation it labels positive or
uncertain counts as predicted (as in finding F1). Per observation: reports whose MeSH names it
(support), reports the labeler names it in, true positives, precision, recall and F1; and the
micro totals. Reports indexed ``No Indexing`` are left out.

MeSH indexes what a report asserts, not what it rules out, and headings are coarser or finer
than the observations (``Opacity`` is Lung Opacity, but ``Lung/hypoinflation`` names none), so
this is agreement with a second annotation, not accuracy against a gold standard.

Run ``python -m msm_mem.eval.labeler_check --out docs/results/labeler.md`` (needs the
torchxrayvision wheel installed for its report archive, or ``--archive``).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .._memory.labeler import OBSERVATIONS, label

__all__ = ["MESH_TO_OBSERVATION", "QUALIFIED", "LabelAgreement", "agreement", "mesh_observations", "table_markdown"]

#: MeSH heading (the part of a major term before the first ``/``) -> observation
MESH_TO_OBSERVATION: dict[str, str] = {
    "normal": "No Finding",
    "Cardiomegaly": "Cardiomegaly",
    "Nodule": "Lung Lesion",
    "Mass": "Lung Lesion",
    "Opacity": "Lung Opacity",
    "Airspace Disease": "Lung Opacity",
    "Infiltrate": "Lung Opacity",
    "Pulmonary Edema": "Edema",
    "Pulmonary Congestion": "Edema",
    "Consolidation": "Consolidation",
    "Pneumonia": "Pneumonia",
    "Pulmonary Atelectasis": "Atelectasis",
    "Pneumothorax": "Pneumothorax",
    "Pleural Effusion": "Pleural Effusion",
    "Fractures, Bone": "Fracture",
    "Catheters, Indwelling": "Support Devices",
    "Implanted Medical Device": "Support Devices",
    "Surgical Instruments": "Support Devices",
    "Tube, Inserted": "Support Devices",
    "Pacemaker, Artificial": "Support Devices",
    "Medical Device": "Support Devices",
    "Stents": "Support Devices",
}
#: (heading, qualifier) -> observation, for headings that name one only with that qualifier
QUALIFIED: dict[tuple[str, str], str] = {
    ("Thickening", "pleura"): "Pleural Other",
    ("Mediastinum", "prominent"): "Enlarged Cardiomediastinum",
    ("Mediastinum", "enlarged"): "Enlarged Cardiomediastinum",
    ("Cardiac Shadow", "enlarged"): "Cardiomegaly",
}
#: headings that mean the report was not indexed
UNINDEXED = frozenset({"No Indexing"})


def mesh_observations(terms: Iterable[str]) -> frozenset[str]:
    """The observations named by MeSH major terms (``Heading/qualifier/...``): by heading
    (:data:`MESH_TO_OBSERVATION`) or by heading and qualifier (:data:`QUALIFIED`)."""
    out = set()
    for term in terms:
        heading, *qualifiers = (part.strip() for part in term.split("/"))
        if heading in MESH_TO_OBSERVATION:
            out.add(MESH_TO_OBSERVATION[heading])
        out.update(obs for q in qualifiers if (obs := QUALIFIED.get((heading, q.lower()))) is not None)
    return frozenset(out)


def _predicted(text: str) -> frozenset[str]:
    return frozenset(obs for obs, value in label(text).items() if value in (1, -1))


@dataclass(frozen=True, slots=True)
class LabelAgreement:
    """One observation: ``support`` reports name it in MeSH, the labeler names it in
    ``predicted``, ``tp`` both; precision, recall and F1 in [0, 1] (0 when undefined)."""

    observation: str
    support: int
    predicted: int
    tp: int

    @property
    def precision(self) -> float:
        return self.tp / self.predicted if self.predicted else 0.0

    @property
    def recall(self) -> float:
        return self.tp / self.support if self.support else 0.0

    @property
    def f1(self) -> float:
        den = self.predicted + self.support
        return 2 * self.tp / den if den else 0.0


def agreement(reports: Sequence[tuple[str, Sequence[str]]]) -> tuple[list[LabelAgreement], LabelAgreement]:
    """Per observation that MeSH can name (in :data:`OBSERVATIONS` order) and the micro total,
    over ``(report text, MeSH major terms)`` pairs; unindexed reports are left out."""
    mapped = {*MESH_TO_OBSERVATION.values(), *QUALIFIED.values()}
    names = [o for o in OBSERVATIONS if o in mapped]
    counts = {o: [0, 0, 0] for o in names}
    for text, terms in reports:
        if any(t.split("/")[0].strip() in UNINDEXED for t in terms):
            continue
        truth, guess = mesh_observations(terms), _predicted(text) & set(names)
        for o in names:
            counts[o][0] += o in truth
            counts[o][1] += o in guess
            counts[o][2] += o in truth and o in guess
    rows = [LabelAgreement(o, *counts[o]) for o in names]
    total = LabelAgreement("micro", *(sum(c[i] for c in counts.values()) for i in range(3)))
    return rows, total


def table_markdown(rows: Sequence[LabelAgreement], total: LabelAgreement, reports: int) -> str:
    """The agreement table as Markdown (percent)."""
    lines = [
        "# The finding labeler against the IU X-ray MeSH terms",
        "",
        f"{reports} IU X-ray reports (FINDINGS and IMPRESSION text) from the torchxrayvision wheel, "
        "labelled by `msm_mem._memory.labeler` (positive or uncertain counts as predicted) and compared "
        "with the observations their MeSH major terms name (`msm_mem.eval.labeler_check`: the mapping, "
        "and why this is agreement with a second annotation rather than accuracy). Percent.",
        "",
        "Regenerate: `python -m msm_mem.eval.labeler_check --out docs/results/labeler.md`.",
        "",
        "| Observation | MeSH support | labeler positive | both | precision | recall | F1 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in [*rows, total]:
        lines.append(
            f"| {r.observation} | {r.support} | {r.predicted} | {r.tp} | "
            f"{100 * r.precision:.1f} | {100 * r.recall:.1f} | {100 * r.f1:.1f} |"
        )
    lines += [
        "",
        "Reading it: MeSH names what a report asserts, so a labeler positive that MeSH lacks is not always "
        "a labeler error. No Finding is the clearest case: the labeler says No Finding when none of the 14 "
        "observations is asserted, while MeSH says `normal` only for reports with no indexed finding at all, "
        "and many reports are indexed only with findings outside the 14 (calcified granuloma, degenerative "
        "spine, aortic calcification), so its precision is low by construction. A low recall (Support Devices, "
        "Enlarged Cardiomediastinum) is a vocabulary the labeler does not cover (surgical clips and sternotomy "
        "wires, a prominent mediastinum).",
    ]
    return "\n".join(lines) + "\n"


def iu_reports(archive: str | Path | None = None) -> list[tuple[str, Sequence[str]]]:
    """``(FINDINGS + IMPRESSION text, MeSH major terms)`` per IU X-ray report with either text."""
    from ..datasets.iu_xray import load, mesh_terms

    rows, _ = load(archive)
    terms: Mapping[str, Sequence[str]] = mesh_terms(archive)
    out = []
    for row in rows:
        parts = [
            line.split(": ", 1)[1]
            for line in row.report.splitlines()
            if line.startswith(("FINDINGS: ", "IMPRESSION: "))
        ]
        out.append((" ".join(parts), terms.get(row.study_id, ())))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Write the agreement table (to ``--out``, else print it)."""
    parser = argparse.ArgumentParser(prog="python -m msm_mem.eval.labeler_check", description=__doc__.splitlines()[0])
    parser.add_argument("--archive", help="NLMCXR_reports.tgz (default: the installed torchxrayvision's)")
    parser.add_argument("--out", type=Path, help="Markdown file to write")
    args = parser.parse_args(argv)
    reports = iu_reports(args.archive)
    indexed = [r for r in reports if not any(t.split("/")[0].strip() in UNINDEXED for t in r[1])]
    text = table_markdown(*agreement(indexed), len(indexed))
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
