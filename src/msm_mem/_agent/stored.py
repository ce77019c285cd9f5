"""An image named by one of the patient's stored studies, resolved inside the turn that uses it.

``ask``, ``observe`` and ``retrieve`` take ``study=`` instead of an image: the study's active
episode (else its newest) is read from the store after the turn's consent check, so a stored
study costs no separate audited read. ``retrieve`` queries with the embedding stored with the
episode; ``ask`` and ``observe`` load the episode's image file (the backbone sees the pixels).
An error never names the stored file."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .._errors import ImageError, InvalidInput, NotFound
from .._limits import MAX_IMAGE_PIXELS
from .._records import EpisodicRecord
from .._storage.base import Store
from ..plugins.images import load_image

__all__ = ["StoredStudy", "pixels", "study_episode"]


@dataclass(frozen=True, slots=True)
class StoredStudy:
    """The image of one of the query's patient's stored studies (by study id)."""

    study_id: str


def study_episode(store: Store, patient_id: str, study_id: str) -> EpisodicRecord:
    """The patient's episode of ``study_id`` (active first); NotFound when there is none."""
    found = store.study_episode(patient_id, study_id)
    if found is None:
        raise NotFound("no stored study of that id for this patient")
    return found


def pixels(store: Store, patient_id: str, image: object) -> tuple[npt.NDArray[np.float32], str]:
    """The grayscale pixels of ``image`` (a path, an array, or a :class:`StoredStudy` of the
    patient) and the media path to record with them ("" for an array)."""
    if isinstance(image, StoredStudy):
        path = study_episode(store, patient_id, image.study_id).media_path
        if not path:
            raise NotFound("no stored image for that study of this patient")
        try:
            return load_image(path), path
        except ImageError:
            raise ImageError("the stored study's image cannot be read") from None
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
