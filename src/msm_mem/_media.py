"""Where a stored study's image file is: its media path as stored, resolved against the store's
image root.

Ingest stores absolute paths (the manifest reader makes every image path absolute), and an
absolute path resolves the same from any working directory. A relative path (written by an
msm-mem before that, or given relative through the library) resolves against the image root
recorded in ``DIR/media.json``::

    {"image_root": "/data/pacs-export"}

(``msm-mem store image-root DIR FOLDER`` records it: for an older store, the folder its
``ingest`` ran in). With no root recorded, a relative path resolves against the working
directory, as before. The root is read on each use, so a changed root applies at once.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ._errors import InvalidInput, StoreError
from ._private import private_file

__all__ = ["MEDIA_FILE", "MediaPlace", "image_root", "resolve_media", "set_image_root"]

MEDIA_FILE = "media.json"


@dataclass(frozen=True, slots=True)
class MediaPlace:
    """A stored media path resolved: the path as stored, the file it names, and the root it was
    resolved against (None: the path is absolute, or no root is recorded)."""

    stored: str
    path: Path
    root: Path | None

    def describe(self) -> str:
        """How the file was found: the path as stored and the root it was resolved against."""
        if Path(self.stored).is_absolute():
            return f"stored as the absolute path {self.stored!r}"
        if self.root is not None:
            return f"stored as {self.stored!r}, resolved against the store's image root {self.root}"
        return (
            f"stored as {self.stored!r}, resolved against the working directory {Path.cwd()}: the store "
            "records no image root (msm-mem store image-root DIR FOLDER)"
        )


def image_root(directory: str | os.PathLike[str] | None) -> Path | None:
    """The image root recorded in ``directory``'s ``media.json`` (None when there is no file or
    no directory). A file that does not parse, or names no absolute folder, is StoreError
    naming it."""
    if directory is None:
        return None
    path = Path(directory) / MEDIA_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise StoreError(f"{path} cannot be read: {exc}") from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise StoreError(f"{path} is not JSON ({exc}); fix it or record the root again") from None
    root = doc.get("image_root") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or set(doc) != {"image_root"}:
        raise StoreError(f'{path} must hold exactly {{"image_root": "/absolute/folder"}}')
    if not isinstance(root, str) or not root or not Path(root).is_absolute():
        raise StoreError(f"{path}: image_root must be an absolute folder, got {root!r}")
    return Path(root)


def set_image_root(directory: str | os.PathLike[str], root: str | os.PathLike[str]) -> Path:
    """Record ``root`` (made absolute; it must be an existing folder) as the image root of the
    store in ``directory``, replacing any; returns the absolute root. The file is replaced
    whole (written aside, then renamed), so a reader never sees half of it."""
    folder = Path(os.path.abspath(root))
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise InvalidInput(f"image root {folder} {what}: name the folder the relative image paths start from")
    path = Path(directory) / MEDIA_FILE
    tmp = path.with_name(MEDIA_FILE + ".tmp")
    private_file(tmp).write_text(json.dumps({"image_root": str(folder)}, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return folder


def resolve_media(stored: str, directory: str | os.PathLike[str] | None) -> MediaPlace:
    """Where the media path ``stored`` points: itself when absolute, else under the image root
    recorded in ``directory`` (else under the working directory)."""
    root = None if Path(stored).is_absolute() else image_root(directory)
    path = Path(stored) if root is None else root / stored
    return MediaPlace(stored, path, root)
