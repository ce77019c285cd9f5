"""The offline loop (paper A.1.1): manifest rows -> preprocess -> encode -> base memory.

Rows whose image cannot be read are skipped with their line number and reason; rows whose
``(patient_id, study_id)`` is already stored are skipped too, so ingesting the same manifest
twice stores nothing new. Base memory is built from ground truth: every valid row is
consolidated (the write-back gate is recorded but not applied) and the report's impression
becomes a semantic history entry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from .._errors import ImageError, InvalidInput
from ..datasets.manifest import ManifestRow, RowProblem
from ..memory.msm import Interaction, Memory
from ..plugins.encoders.base import Encoder
from ..plugins.images import load_image

__all__ = ["IngestReport", "ingest_rows"]


@dataclass(slots=True)
class IngestReport:
    """Counts and problems of one ingest run."""

    ingested: int = 0
    already_stored: int = 0
    problems: list[RowProblem] = field(default_factory=list)

    def summary(self) -> str:
        return (f"ingested {self.ingested} studies, {self.already_stored} already stored, "
                f"{len(self.problems)} rows skipped")  # fmt: skip


def ingest_rows(
    memory: Memory,
    encoder: Encoder,
    rows: Sequence[ManifestRow],
    *,
    batch_size: int = 64,
    progress: bool = False,
    on_batch: Callable[[int], None] | None = None,
) -> IngestReport:
    """Encode and store rows in batches of ``batch_size``, each batch one transaction."""
    if encoder.name != memory.store.encoder_name or encoder.dim != memory.store.dim:
        raise InvalidInput(
            f"encoder {encoder.name} ({encoder.dim}-d) does not match the store's "
            f"{memory.store.encoder_name} ({memory.store.dim}-d)")  # fmt: skip
    report = IngestReport()
    seen: dict[str, set[str]] = {}
    todo: list[ManifestRow] = []
    for row in sorted(rows, key=lambda r: (r.timestamp, r.patient_id, r.study_id)):
        stored = seen.setdefault(row.patient_id, memory.store.studies(row.patient_id))
        if row.study_id in stored:
            report.already_stored += 1
            continue
        stored.add(row.study_id)
        todo.append(row)
    bar = tqdm(total=len(todo), desc="ingest", unit="study", disable=not progress)
    try:
        for start in range(0, len(todo), batch_size):
            chunk = todo[start : start + batch_size]
            images, good = [], []
            for row in chunk:
                try:
                    images.append(load_image(row.image))
                    good.append(row)
                except ImageError as exc:
                    report.problems.append(RowProblem(row.line, str(exc)))
            if good:
                vectors = encoder.encode(images)
                memory.write_back_many([_interaction(r, v) for r, v in zip(good, vectors, strict=True)], force=True)
                report.ingested += len(good)
            bar.update(len(chunk))
            if on_batch is not None:
                on_batch(report.ingested)
    finally:
        bar.close()
    return report


def _interaction(row: ManifestRow, z: np.ndarray) -> Interaction:
    return Interaction(
        patient_id=row.patient_id, z=z, question=row.question, answer=row.answer,
        timestamp=row.timestamp, decision=row.decision, media_path=row.image,
        media_description=row.report, visual_tag=row.view, study_id=row.study_id,
        evidence_tier="ground_truth", source="manifest",
    )  # fmt: skip
