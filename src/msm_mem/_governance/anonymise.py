"""Anonymisation by allow-list: which words of one patient's text may reach anyone else.

The rules of :mod:`msm_mem._governance.deid` find identifiers they can recognise; a name
without a cue, a bare phone number or a city they do not know passes them. Here a word
survives only when it is known to be safe, whatever the rules missed:

1. the text is first scrubbed by the rules (:func:`~msm_mem._governance.deid.scrub`), so a
   date becomes ``[DATE] <year>`` and an e-mail ``[EMAIL]``;
2. a word is kept when it, or its base form (plural, past tense, ``-ing`` or ``-ly`` removed),
   is in the vocabulary; any other word is replaced by its category: ``[NAME]`` when it is
   capitalised (a person or a place), ``[DATE]`` for a capitalised month name, ``[WORD]``
   otherwise; a token mixing letters and digits that the vocabulary does not hold is ``[ID]``;
3. a number is kept only as a clinical measurement: followed by a unit (``2 cm``, ``38.5 C``,
   ``94 %``, ``54-year-old``), after a counting word (``day 9``, ``grade 2``), or a year
   (1900-2099); any other number is ``[NUMBER]``;
4. runs of one placeholder collapse into one; punctuation is kept.

Two vocabularies (:class:`Vocabulary`):

- ``CLINICAL``: the closed clinical vocabulary of ``clinical_vocabulary.txt`` (findings,
  anatomy, devices, diagnoses, outcomes, units, negation and function words). What crosses
  from one patient to another (population retrieval and answers, a backbone's prompt) uses it.
- ``COMMON``: the clinical vocabulary and the common English words of the GCIDE dictionary
  (the ``english-words`` package), less every word Webster's Second lists as a proper noun
  (names of people and places) and the given names of the rules. Decay ("IDs stripped,
  content kept") and free-text reasons use it.

:class:`Anonymised` reports what was kept (``kept`` of ``words``), so that over-anonymising is
visible; :func:`for_population` withholds a text of which less than half the words survive.
Names that are also common words (``Rose``, ``Young``, ``Smith`` in lower case) survive in
``COMMON``: reported as a limit, measured by ``benchmarks/bench_deid.py``.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from enum import Enum
from importlib import resources

from .._errors import InvalidInput
from .deid import scrub
from .deid_vocabulary import GIVEN_NAMES

__all__ = ["Anonymised", "Vocabulary", "anonymise", "for_population", "plain_reason"]

#: a text for population use keeps at least this share of its words, else it is withheld
MIN_KEPT = 0.5

_TOKEN = re.compile(
    r"(?P<ph>\[[A-Z][A-Z>0-9_ ]*\])"  # a placeholder of the rules
    r"|(?P<num>\d+(?:[.,/:]\d+)*(?![^\W_]))"  # a number not run into letters
    r"|(?P<mixed>(?=[^\W_]*\d)(?=[^\W_]*[^\W\d_])[^\W_]+(?:-[^\W_]+)*)"  # T2, SpO2, MRN12345, 2cm
    r"|(?P<word>[^\W\d_]+(?:['’-][^\W_]+)*)"  # a word and its hyphenated parts
    r"|(?P<other>\S)",
    re.UNICODE,
)
_MEASURE = re.compile(r"[1-9]?\d{1,3}(?:\.\d+)?(?P<unit>[^\W\d_]+)")
_MONTHS = frozenset(
    "January February March April May June July August September October November December "
    "Jan Feb Mar Apr Jun Jul Aug Sep Sept Oct Nov Dec".split()
)
#: words after which a number counts something clinical (day 9, grade 2, rib 5)
_COUNTERS = frozenset(
    "day days week weeks month months hour hours grade stage level rib ribs segment zone zones "
    "vertebra vertebrae times dose doses cycle cycles score".split()
)
_UNITS_AFTER = frozenset({"%", "°"})


class Vocabulary(Enum):
    """Which words a text may keep (see the module docstring)."""

    CLINICAL = "clinical"
    COMMON = "common"


@functools.cache
def _vocabulary() -> tuple[frozenset[str], frozenset[str]]:
    """The clinical vocabulary's words, and those of its units section (read after a number)."""
    text = resources.files(__package__).joinpath("clinical_vocabulary.txt").read_text(encoding="utf-8")
    words: set[str] = set()
    units: set[str] = set()
    in_units = False
    for line in text.splitlines():
        if line.startswith("#"):
            in_units = line.startswith("# units and measured quantities")
            continue
        found = line.lower().split()
        words.update(found)
        if in_units:
            units.update(found)
    return frozenset(words), frozenset(units)


def _clinical() -> frozenset[str]:
    return _vocabulary()[0]


def _units() -> frozenset[str]:
    return _vocabulary()[1]


@functools.cache
def _proper() -> frozenset[str]:
    """Webster's Second's proper nouns and the rules' given names, lower case."""
    from english_words import get_english_words_set

    web2 = get_english_words_set(["web2"], lower=False, alpha=True)
    return frozenset({w.lower() for w in web2 if w[:1].isupper()} | {n.lower() for n in GIVEN_NAMES})


@functools.cache
def _common() -> frozenset[str]:
    from english_words import get_english_words_set

    gcide = get_english_words_set(["gcide"], lower=True, alpha=True)
    return frozenset((gcide - _proper()) | _clinical())


def _words(vocabulary: Vocabulary) -> frozenset[str]:
    return _clinical() if vocabulary is Vocabulary.CLINICAL else _common()


def _bases(word: str) -> list[str]:
    """``word`` and the base forms a plural, past tense, ``-ing`` or ``-ly`` may come from."""
    out = [word]
    for suffix, repl in (("'s", ""), ("’s", ""), ("ies", "y"), ("es", ""), ("s", ""), ("ed", ""), ("ed", "e")):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            out.append(word[: -len(suffix)] + repl)
    for suffix in ("ing", "ly"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            stem = word[: -len(suffix)]
            out += [stem, stem + "e"]
            if len(stem) >= 4 and stem[-1] == stem[-2]:  # stopping -> stop
                out.append(stem[:-1])
    return out


def _in(low: str, words: frozenset[str]) -> bool:
    if low in words:
        return True
    if "-" in low and all(part in words for part in low.split("-") if part):
        return True
    return any(b in words and b not in _proper() for b in _bases(low)[1:])


def _known(word: str, words: frozenset[str], initial: bool) -> bool:
    """Whether ``word`` may stay: in lower case, or capitalised only because it opens a
    sentence, when it is in ``words``; in capitals when it is clinical (``ARDS``, ``CT``). A
    word capitalised inside a sentence, or a capitalised word outside the clinical
    vocabulary, is taken for a name (``per Day``, ``PARKER``)."""
    low = word.lower()
    if word.isupper() and len(word) > 1:
        return _in(low, _clinical())
    if word[:1].isupper() and not initial:
        return False
    return _in(low, words)


@dataclass(frozen=True, slots=True)
class Anonymised:
    """The anonymised ``text``; ``words`` the words and numbers the allow-list judged (what the
    rules replaced is not counted), ``kept`` how many survived; ``categories`` the placeholders
    in the result, the rules' and the allow-list's (each once, in order met)."""

    text: str
    words: int
    kept: int
    categories: tuple[str, ...]

    @property
    def share_kept(self) -> float:
        """The share of words kept (1.0 for a text without words)."""
        return self.kept / self.words if self.words else 1.0


def anonymise(text: str, vocabulary: Vocabulary = Vocabulary.COMMON) -> Anonymised:
    """``text`` with every word outside ``vocabulary`` replaced by its category and every
    number that is not a measurement replaced by ``[NUMBER]`` (see the module docstring).
    Idempotent: a placeholder can make the rules see a new identifier beside it (``X::0``
    becomes ``[NAME]::0``, an IPv6 address to them), so the pass runs again on its result
    until nothing changes (at most three times; ``words`` and ``kept`` count the first pass's
    judgements less what a later pass replaced)."""
    result = _pass(text, vocabulary)
    for _ in range(3):
        again = _pass(result.text, vocabulary)
        if again.text == result.text:
            break
        lost = again.words - again.kept
        categories = tuple(dict.fromkeys((*result.categories, *again.categories)))
        result = Anonymised(again.text, result.words, max(0, result.kept - lost), categories)
    return result


def _pass(text: str, vocabulary: Vocabulary) -> Anonymised:
    words = _words(vocabulary)
    units = _units()
    source = scrub(text)
    tokens = [(m.lastgroup or "other", m.group(), m.start(), m.end()) for m in _TOKEN.finditer(source)]
    out: list[str] = []
    categories: dict[str, None] = {}
    counted = kept = 0
    last_word = ""
    initial = True
    for i, (kind, value, start, _end) in enumerate(tokens):
        gap = source[tokens[i - 1][3] : start] if i else source[:start]
        initial = initial or "\n" in gap
        replacement: str | None = None
        if kind == "ph":  # the rules found an identifier: its category is named, nothing to judge
            categories.setdefault(value, None)
        elif kind == "word":
            counted += 1
            if value in _MONTHS:
                replacement = "[DATE]"
            elif _known(value, words, initial):
                kept += 1
            else:
                replacement = "[NAME]" if value[:1].isupper() else "[WORD]"
            last_word = value.lower()
        elif kind == "num":
            counted += 1
            if _measured(tokens, i, units, last_word):
                kept += 1
            else:
                replacement = "[NUMBER]"
        elif kind == "mixed":
            counted += 1
            measure = _MEASURE.fullmatch(value)
            if value.lower() in words or (measure is not None and _attached_unit(measure["unit"], units)):
                kept += 1
            else:
                replacement = "[ID]"
        initial = kind == "other" and value in ".!?:;"
        if replacement is None:
            out.append(gap + value)
        else:
            categories.setdefault(replacement, None)
            previous = out[-1].strip() if out else ""
            if previous == replacement and not gap.strip():
                continue  # one placeholder for a run
            out.append(gap + replacement)
    out.append(source[tokens[-1][3] :] if tokens else source)
    return Anonymised("".join(out), counted, kept, tuple(categories))


def _attached_unit(unit: str, units: frozenset[str]) -> bool:
    """A unit run into its number (``2cm``, ``5mg``, ``120mmHg``): as units are written."""
    return unit in units or unit in ("mmHg", "mL", "L")


def _measured(tokens: list[tuple[str, str, int, int]], i: int, units: frozenset[str], before: str) -> bool:
    """Whether the number at ``tokens[i]`` is a clinical measurement, a count or a year: never
    a number with a leading zero (``0142``) and never a year beside another number
    (``310 60 1966`` is an SSN)."""
    value = tokens[i][1]
    if re.match(r"0\d", value):
        return False
    if re.fullmatch(r"(?:19|20)\d\d", value):
        beside = [k for k, _, _, _ in (tokens[i - 1 : i] if i else []) + tokens[i + 1 : i + 2]]
        return "num" not in beside and "mixed" not in beside
    if i and before in _COUNTERS and tokens[i - 1][0] == "word" and re.fullmatch(r"\d{1,3}", value):
        return True
    for kind, following, _, _ in tokens[i + 1 : i + 3]:
        if following in _UNITS_AFTER:
            return True
        if kind == "word":
            return following.lower().split("-")[0] in units
        if following not in "-/":  # 54-year-old, 5/10 mm: look past one joining mark
            return False
    return False


def for_population(text: str) -> str | None:
    """``text`` in the clinical vocabulary for another patient's answer, evidence or prompt;
    None (withheld) when less than half of its words survive."""
    result = anonymise(text, Vocabulary.CLINICAL)
    return result.text if result.share_kept >= MIN_KEPT else None


def plain_reason(what: str, reason: str) -> str:
    """``reason`` anonymised with the common vocabulary (what the audit tier keeps);
    :class:`InvalidInput` naming the classes found (never the words) when no word of it survives."""
    result = anonymise(reason, Vocabulary.COMMON)
    if result.words and not result.kept:
        found = ", ".join(c.strip("[]").lower() for c in result.categories)
        raise InvalidInput(
            f"{what} must not identify anyone and says nothing else: it reads as {found}; state the reason "
            "in common words"
        )
    return result.text
