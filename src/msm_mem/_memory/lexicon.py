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
        """Build from terms (blank ones ignored); no term at all raises :class:`InvalidInput`.

        Terms are lower-cased with inner whitespace collapsed; a phrase matches across any run
        of whitespace in the text (a report may break a line inside "pleural effusion").
        """
        if isinstance(terms, str):  # a bare string would become one term per character
            raise InvalidInput("terms must be a list of strings, not one string")
        cleaned = sorted({" ".join(t.lower().split()) for t in terms if t.strip()}, key=lambda t: (-len(t), t))
        if not cleaned:
            raise InvalidInput("the clinical keyword lexicon is empty")
        self.terms = tuple(cleaned)
        alternatives = "|".join(r"\s+".join(re.escape(w) for w in t.split(" ")) for t in cleaned)
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
        """A lexicon from file text: one term a line, ``#`` starts a comment."""
        return cls([line.split("#", 1)[0] for line in text.splitlines()])

    def find(self, text: str) -> list[str]:
        """The lexicon terms present in ``text``, lower-cased, in order of appearance."""
        return [" ".join(m.group(0).lower().split()) for m in self._pattern.finditer(text)]

    def __contains__(self, text: object) -> bool:
        """Whether ``text`` (a string) contains at least one term."""
        return isinstance(text, str) and self._pattern.search(text) is not None
