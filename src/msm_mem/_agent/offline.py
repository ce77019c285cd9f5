"""The offline loop (paper A.1.1): manifest rows -> preprocess -> encode -> base memory.

Rows whose image cannot be read (missing, not a regular file, over the byte or pixel limit,
corrupt) are skipped with their line number and reason; rows whose
``(patient_id, study_id, question)`` is already stored are skipped too, so ingesting the same
manifest twice stores nothing new, and neither do two ingests of it at once: an ingested
episode and a study's visual record are written under ids keyed by the row
(:func:`~msm_mem._records.keyed_id`: patient, study, question), so the database keeps the copy
that committed first and refuses the other writer's batch, which reads the store again and
stores what is still missing. A study may carry several questions: each question is an
episode of its own, and the study's image one visual record (written with the study's first
stored question, shared by the others). Every study lands in short-term memory and is consolidated into
long-term memory in the same transaction (no write skips its originating tier). Base memory is
built from ground truth: every valid row is consolidated (the gate's verdict is recorded as
``forced``) and the report's impression becomes a semantic history entry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tqdm import tqdm

from .._errors import ImageError, InvalidInput, WriteConflict
from .._limits import MAX_BATCH_PIXELS
from .._memory.tiers import GovernedMemory, Turn
from .._principal import Principal
from .._records import ManifestRow, RowProblem, keyed_id
from ..plugins.encoders.base import Encoder
from ..plugins.images import load_image

__all__ = ["IngestReport", "ingest_rows"]


@dataclass(frozen=True, slots=True)
class IngestReport:
    """Counts and problems of one ingest run: ``ingested`` and ``already_stored`` count rows
    (one question about a study each), ``studies`` the new studies among the ingested rows."""

    ingested: int = 0
    already_stored: int = 0
    problems: tuple[RowProblem, ...] = ()
    studies: int = 0

    def summary(self) -> str:
        return (
            f"ingested {self.studies} studies ({self.ingested} questions), {self.already_stored} questions"
            f" already stored, {len(self.problems)} rows skipped"
        )


def _new_rows(gm: GovernedMemory, rows: Sequence[ManifestRow]) -> tuple[list[ManifestRow], set[tuple[str, str]]]:
    """The rows not yet stored, in time order, and the ``(patient, study)`` pairs whose image
    already has a visual record. A row is stored when its ``(study, question)`` is one of the
    patient's readable (active or superseded) episodes, or when its study is stored but none of
    it is readable any more (retracted: nothing is written again for it). A patient's stored
    questions are read (decrypted) only when one of the rows names a study of theirs that is
    stored."""
    store = gm.store
    studies: dict[str, set[str]] = {}
    questions: dict[str, set[tuple[str, str]]] = {}
    readable: dict[str, set[str]] = {}
    todo: list[ManifestRow] = []
    for row in sorted(rows, key=lambda r: (r.timestamp, r.patient_id, r.study_id, r.question)):
        pid = row.patient_id
        stored = studies.setdefault(pid, store.studies(pid))
        asked = questions.setdefault(pid, set())
        if row.study_id in stored and pid not in readable:
            asked.update((e.study_id, e.question) for e in store.get_episodes(store.record_ids("episodic", pid)))
            readable[pid] = {study for study, _ in asked}
        if (row.study_id, row.question) in asked or (row.study_id in stored and row.study_id not in readable[pid]):
            continue
        asked.add((row.study_id, row.question))
        todo.append(row)
    imaged = {(pid, sid) for pid, ids in studies.items() for sid in ids}
    return todo, imaged


#: how often a batch is staged again after another writer stored some of its rows first
_ATTEMPTS = 5


def _store_batch(
    principal: Principal,
    gm: GovernedMemory,
    key: bytes,
    rows: Sequence[ManifestRow],
    vectors: Sequence[object],
    imaged: set[tuple[str, str]],
) -> int:
    """Stage and commit ``rows`` in one transaction, each episode (and a study's first visual
    record) under its keyed id, so the database refuses a row another writer stored first
    (:class:`WriteConflict`, nothing written). Returns the number of new studies; ``imaged``
    gains them only once the commit succeeded."""
    patients = list(dict.fromkeys(row.patient_id for row in rows))
    novelty = [(row.patient_id, z) for row, z in zip(rows, vectors, strict=True)]
    begun = gm.begin_many(principal, patients, novelty=novelty)
    turns: dict[str, Turn] = dict(zip(patients, begun, strict=True))
    new: set[tuple[str, str]] = set()
    for row, z in zip(rows, vectors, strict=True):
        turn = turns[row.patient_id]
        item = gm.observe(
            turn,
            z,
            row.question,
            timestamp=row.timestamp,
            media_path=row.image,
            visual_tag=row.view,
            study_id=row.study_id,
            media_description=row.report,
        )
        study = (row.patient_id, row.study_id)
        gm.consolidate(
            turn,
            item,
            row.answer,
            decision=row.decision,
            evidence_tier="ground_truth",
            confidence=1.0,
            source="manifest",
            force=True,
            visual=study not in imaged and study not in new,
            keyed=(
                keyed_id("E", key, "episode", row.patient_id, row.study_id, row.question),
                keyed_id("V", key, "visual", row.patient_id, row.study_id),
            ),
        )
        new.add(study)
    gm.commit_many(list(turns.values()))
    fresh = new - imaged
    imaged |= new
    return len(fresh)


def ingest_rows(
    principal: Principal,
    gm: GovernedMemory,
    encoder: Encoder,
    rows: Sequence[ManifestRow],
    *,
    batch_size: int = 64,
    progress: bool = False,
) -> IngestReport:
    """Encode and store rows as ``principal`` (consent-checked per patient, audited) in batches
    of ``batch_size``, each batch one transaction."""
    store = gm.store
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise InvalidInput(f"batch_size must be a positive integer, got {batch_size!r}")
    if encoder.name != store.encoder_name or encoder.dim != store.dim:
        raise InvalidInput(
            f"encoder {encoder.name} ({encoder.dim}-d) does not match the store's {store.encoder_name} ({store.dim}-d)"
        )
    ingested = studies = 0
    problems: list[RowProblem] = []
    todo, imaged = _new_rows(gm, rows)
    already_stored = len(rows) - len(todo)
    key = gm.ingest_key()
    with tqdm(total=len(todo), desc="ingest", unit="study", disable=not progress) as bar:
        start = 0
        while start < len(todo):
            # a batch is batch_size rows, or fewer once its decoded pixels reach the budget
            images, good, pixels, taken = [], [], 0, 0
            for row in todo[start : start + batch_size]:
                taken += 1
                try:
                    image = load_image(row.image)
                except ImageError as exc:
                    problems.append(RowProblem(row.line, str(exc)))
                    continue
                images.append(image)
                good.append(row)
                pixels += image.size
                if pixels >= MAX_BATCH_PIXELS:
                    break
            start += taken
            if good:
                vectors = list(encoder.encode(images))
                for attempt in range(_ATTEMPTS):
                    try:
                        new_studies = _store_batch(principal, gm, key, good, vectors, imaged)
                    except WriteConflict:
                        # another writer stored some of these rows (or changed a patient's
                        # state) first: nothing of this batch was written; read again
                        if attempt == _ATTEMPTS - 1:
                            raise
                        left, imaged = _new_rows(gm, good)
                        already_stored += len(good) - len(left)
                        keep = {id(r) for r in left}
                        vectors = [z for r, z in zip(good, vectors, strict=True) if id(r) in keep]
                        good = left
                        if not good:
                            break
                        continue
                    ingested += len(good)
                    studies += new_studies
                    break
            bar.update(taken)
    return IngestReport(ingested, already_stored, tuple(problems), studies)
