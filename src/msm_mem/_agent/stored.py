"""An image named by one of the patient's stored studies, resolved inside the turn that uses it.

``ask``, ``observe`` and ``retrieve`` take ``image_study=`` instead of an image: the study's
episodes are read from the store after the turn's consent check, so a stored study costs no
separate audited read. ``retrieve`` queries with the embedding stored with the study's active
episode (else its newest); ``ask`` and ``observe`` load the image file of the first of those
episodes that recorded one (an episode written from an array has none), so the backbone sees
the pixels. A relative stored path resolves against the store's recorded image root
(:mod:`msm_mem._media`); an image that cannot be read is an ImageError naming the stored path
and what it was resolved against (the caller may read that patient's records)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .._errors import ImageError, InvalidInput, NotFound
from .._limits import MAX_IMAGE_PIXELS
from .._media import resolve_media
from .._records import EpisodicRecord
from .._storage.base import Store
from ..plugins.images import load_image

__all__ = ["StoredStudy", "pixels", "study_episode", "study_image"]


@dataclass(frozen=True, slots=True)
class StoredStudy:
    """The image of one of the query's patient's stored studies (by study id)."""

    study_id: str


def study_episode(store: Store, patient_id: str, study_id: str) -> EpisodicRecord:
    """The patient's episode of ``study_id`` (active first, else the newest); NotFound when
    there is none."""
    return _episodes(store, patient_id, study_id, 1)[0]


def study_image(store: Store, patient_id: str, study_id: str) -> str:
    """The image file of the patient's study: that of its first episode, in
    :func:`study_episode`'s order, that recorded one; NotFound when the study has none."""
    for episode in _episodes(store, patient_id, study_id):
        if episode.media_path:
            return episode.media_path
    raise NotFound("no stored image for that study of this patient")


def _episodes(store: Store, patient_id: str, study_id: str, limit: int | None = None) -> list[EpisodicRecord]:
    found = store.study_episodes(patient_id, study_id, limit)
    if not found:
        raise NotFound("no stored study of that id for this patient")
    return found


def pixels(
    store: Store, patient_id: str, image: object, directory: str | os.PathLike[str] | None = None
) -> tuple[npt.NDArray[np.float32], str]:
    """The grayscale pixels of ``image`` (a path, an array, or a :class:`StoredStudy` of the
    patient, whose relative path resolves against the image root of the store ``directory``)
    and the media path to record with them (as stored for a study; "" for an array)."""
    if isinstance(image, StoredStudy):
        stored = study_image(store, patient_id, image.study_id)
        place = resolve_media(stored, directory)
        try:
            return load_image(place.path), stored
        except ImageError as exc:
            raise ImageError(f"the stored study's image cannot be read ({exc}); {place.describe()}") from None
    # a path is read as a bounded regular file (any folder: the caller names its own files);
    # an array is bounded by the same pixel limit
    if isinstance(image, np.ndarray):
        if image.size > MAX_IMAGE_PIXELS:
            raise ImageError(f"image array of {image.size:,} values exceeds the limit of {MAX_IMAGE_PIXELS:,}")
        try:
            return image.astype(np.float32, copy=False), ""
        except (TypeError, ValueError) as exc:
            raise ImageError(f"image array of dtype {image.dtype} is not numeric ({exc})") from exc
    if isinstance(image, (str, os.PathLike)):
        return load_image(image), str(image)
    raise InvalidInput(f"image must be a path or an array, got {type(image).__name__}")
