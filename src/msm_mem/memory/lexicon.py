"""The clinical keyword lexicon used by the write-back gate."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

from .._errors import InvalidInput

__all__ = ["Lexicon"]


class Lexicon:
    """A set of clinical terms matched case-insensitively on word boundaries.

    The packaged file ``clinical_keywords.txt`` is the default; any UTF-8 file with one term
    or phrase a line (``#`` comments, blank lines ignored) replaces it.
    """

    def __init__(self, terms: list[str]) -> None:
        cleaned = sorted({t.strip().lower() for t in terms if t.strip()}, key=lambda t: (-len(t), t))
        if not cleaned:
            raise InvalidInput("the clinical keyword lexicon is empty")
        self.terms = tuple(cleaned)
        alternatives = "|".join(re.escape(t) for t in cleaned)
        self._pattern = re.compile(rf"(?<![\w-])(?:{alternatives})(?![\w-])", re.IGNORECASE)

    @classmethod
    def default(cls) -> Lexicon:
        """The packaged lexicon."""
        text = resources.files(__package__).joinpath("clinical_keywords.txt").read_text("utf-8")
        return cls.parse(text)

    @classmethod
    def from_file(cls, path: str | Path) -> Lexicon:
        """Read a lexicon file; a missing or unreadable file raises :class:`InvalidInput`."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidInput(f"cannot read lexicon {path}: {exc}") from exc
        return cls.parse(text)

    @classmethod
    def parse(cls, text: str) -> Lexicon:
        return cls([line.split("#", 1)[0] for line in text.splitlines()])

    def find(self, text: str) -> list[str]:
        """The lexicon terms present in ``text``, lower-cased, in order of appearance."""
        return [m.group(0).lower() for m in self._pattern.finditer(text)]

    def __contains__(self, text: object) -> bool:
        return isinstance(text, str) and self._pattern.search(text) is not None
