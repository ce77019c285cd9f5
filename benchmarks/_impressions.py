"""The impressions the write-back and labeler benchmarks use (no project imports)."""

from __future__ import annotations


def impressions() -> list[str]:
    """240 distinct impressions in the style of chest radiograph reports (answers repeat, as
    impressions do in practice; the labeler that derives entities memoises per text)."""
    findings = [
        "right lower lobe consolidation",
        "left lower lobe consolidation",
        "right pleural effusion",
        "left pleural effusion",
        "cardiomegaly",
        "pulmonary edema",
        "right pneumothorax",
        "left upper lobe nodule",
        "bibasilar atelectasis",
        "ground-glass opacities",
    ]
    grades = ["Mild", "Moderate", "Extensive", "Small", "Stable", "New"]
    changes = [".", ", increased since prior.", ", decreased since prior.", ", unchanged from prior."]
    return [f"{g} {f}{c}" for f in findings for g in grades for c in changes]
