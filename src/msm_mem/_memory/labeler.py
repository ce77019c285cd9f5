"""A rule-based CheXpert-style labeler for radiology text, and finding-label F1.

The labeler maps free text to the 14 CheXpert observations, each ``1`` (positive), ``0``
(negative), ``-1`` (uncertain) or ``None`` (not mentioned). It is a small, readable
re-implementation of the idea (mention phrases + negation and uncertainty cues), not a port of
the CheXpert/NegBio code, which parses dependencies; here a cue's scope is a clause window.

The vocabulary (pure data) is in :mod:`msm_mem._memory.labeler_vocabulary`; this module is the
logic. Vocabulary entries are lowercase regular-expression fragments matched on whole words.
Deliberate choices, so that results are explainable:

- ARDS, COVID-19 (without "pneumonia"), CHF, pneumonitis and pneumomediastinum map to nothing:
  they are clinical diagnoses or outside the 14 observations, and guessing their radiographic
  correlate would over-reach.
- "line" alone is not a device (it is also "pleural line", "in line with"); qualified lines
  ("central line", "PICC line", "lines and tubes") and catheters are.
- Hydrothorax, haemothorax, empyema and blunted costophrenic angles are Pleural Effusion.
- Phrases that state normality directly ("heart size is normal", "lungs are clear", "normal
  cardiomediastinal silhouette") give a negative for Cardiomegaly, Lung Opacity and Enlarged
  Cardiomediastinum respectively, and nothing else.
- Mentions of history ("history of pneumonia") are labelled like current findings; the text
  does not say when a finding was present.
- Known limit of clause windows: in "no consolidation and stable cardiomegaly" the negation
  also reaches "cardiomegaly" (a dependency parse would not); "but", "however", ";" and the
  other :data:`SCOPE_TERMINATORS` end a scope, "and" and commas do not, so that lists such as
  "no effusion, pneumothorax or consolidation" are negated as a whole.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Sequence
from typing import Final, TypedDict

from .._errors import InvalidInput
from .labeler_vocabulary import (
    IGNORED_PHRASES,
    MENTIONS,
    NEGATION_BOTH,
    NEGATION_POST,
    NEGATION_PRE,
    NORMAL_STATEMENTS,
    OBSERVATIONS,
    PSEUDO_NEGATIONS,
    QUESTION_MARK_CUE,
    SCOPE_TERMINATORS,
    SCOPE_WORDS,
    UNCERTAIN_BOTH,
    UNCERTAIN_POST,
    UNCERTAIN_PRE,
)

__all__ = ["OBSERVATIONS", "FindingF1", "finding_f1", "label"]

_Label = int | None

_POSITIVE, _NEGATIVE, _UNCERTAIN = 1, 0, -1
_RANK: Final[dict[_Label, int]] = {None: 0, _NEGATIVE: 1, _UNCERTAIN: 2, _POSITIVE: 3}


def _compile(phrases: Sequence[str], *, raw: Sequence[str] = ()) -> re.Pattern[str]:
    # Longest alternative first, so "pleural effusion" wins over "effusion" at one position.
    # One pair of word-boundary lookarounds around the whole alternation matches exactly what
    # a pair around each phrase would (backtracking tries the phrases in the same order), and
    # about three times faster.
    ordered = sorted(phrases, key=len, reverse=True)
    parts = [rf"(?<!\w)(?:{'|'.join(ordered)})(?!\w)"] if ordered else []
    return re.compile("|".join(parts + list(raw)))


def _compile_mentions(table: dict[str, tuple[str, ...]]) -> re.Pattern[str]:
    # One scan for every observation instead of one per observation (about 3x faster). At each
    # word start where some phrase of the table matches, group i captures what observation
    # i's own pattern (``_compile``: longest phrase first, whole words) would match there; the
    # lookaheads are independent, so phrases of two observations may overlap (the
    # "hydropneumothorax" of Pneumothorax and of Pleural Effusion), as with separate scans.
    def alternation(phrases: Sequence[str]) -> str:
        return "|".join(sorted(phrases, key=len, reverse=True))

    anywhere = alternation([p for phrases in table.values() for p in phrases])
    groups = "".join(rf"(?:(?=((?:{alternation(p)})(?!\w)))|)" for p in table.values())
    pattern = re.compile(rf"(?<!\w)(?=(?:{anywhere})(?!\w)){groups}")
    if pattern.groups != len(table):  # a capturing group inside a phrase would shift the others
        raise ValueError("mention phrases must not contain capturing groups; use (?:...)")
    return pattern


_MENTION_NAMES: Final = tuple(MENTIONS)
_MENTION_SCAN = _compile_mentions(MENTIONS)
_NORMALS = {obs: _compile(p) for obs, p in NORMAL_STATEMENTS.items()}
_IGNORED = _compile(IGNORED_PHRASES)
_PSEUDO = _compile(PSEUDO_NEGATIONS)
# (pattern, value, governs mentions before it, governs mentions after it), in matching order:
# each group's matches are blanked before the next group is searched, so "cannot be excluded"
# is never read as the negation "excluded", nor "no longer" as "no".
_CUES: Final = (
    (_compile(UNCERTAIN_BOTH, raw=[QUESTION_MARK_CUE]), _UNCERTAIN, True, True),
    (_compile(UNCERTAIN_POST), _UNCERTAIN, True, False),
    (_compile(UNCERTAIN_PRE), _UNCERTAIN, False, True),
    (_compile(NEGATION_BOTH), _NEGATIVE, True, True),
    (_compile(NEGATION_POST), _NEGATIVE, True, False),
    (_compile(NEGATION_PRE), _NEGATIVE, False, True),
)
# Every cue phrase of every group: where it finds nothing, no group finds anything (nothing is
# blanked, so each group searches the same text, and its phrases are all in here), and the six
# searches are skipped. Most clauses that mention a finding carry no cue.
_ANY_CUE = _compile(
    UNCERTAIN_BOTH + UNCERTAIN_POST + UNCERTAIN_PRE + NEGATION_BOTH + NEGATION_POST + NEGATION_PRE,
    raw=[QUESTION_MARK_CUE],
)
# the phrases in their order: the punctuation ones, then the words within one pair of \b
_TERMINATOR = re.compile(
    "|".join(
        [t for t in SCOPE_TERMINATORS if not t[0].isalpha()]
        + [rf"\b(?:{'|'.join(t for t in SCOPE_TERMINATORS if t[0].isalpha())})\b"]
    )
)
_ABBREVIATION = re.compile(r"\b(vs|e\.g|i\.e|dr|mr|mrs|ms|approx|cf)\.", re.IGNORECASE)
_SENTENCE_END = re.compile(r"\n+|(?<=[.!])(?:\s+|(?=[A-Z]))|(?<=[a-z0-9)]\?)\s+")
_WORD = re.compile(r"\w+")


def _blank(text: str, pattern: re.Pattern[str]) -> str:
    """``text`` with every match of ``pattern`` replaced by spaces (offsets preserved)."""
    return _blank_spans(text, list(pattern.finditer(text)))


def _blank_spans(text: str, found: list[re.Match[str]]) -> str:
    """``text`` with the spans of ``found`` (left to right, not overlapping) made spaces."""
    if not found:
        return text
    parts: list[str] = []
    at = 0
    for m in found:
        parts += (text[at : m.start()], " " * (m.end() - m.start()))
        at = m.end()
    parts.append(text[at:])
    return "".join(parts)


def _clauses(text: str) -> Iterator[str]:
    """Lowercase clauses: sentences split at scope terminators."""
    for sentence in _SENTENCE_END.split(_ABBREVIATION.sub(r"\1", text)):
        for clause in _TERMINATOR.split(sentence.lower()):
            if clause.strip():
                yield clause


def _mentions(text: str) -> list[tuple[str, int, int]]:
    """``(observation, start, end)`` of every mention, by observation then position: what
    ``finditer`` of each observation's own pattern gives (its matches do not overlap, so a
    match starting inside the observation's previous one is not one)."""
    found: list[tuple[int, int, int]] = []
    ends = [0] * len(_MENTION_NAMES)
    for m in _MENTION_SCAN.finditer(text):
        for i, (start, end) in enumerate(m.regs[1:]):
            if start >= ends[i]:  # -1 where observation i has no mention here
                found.append((i, start, end))
                ends[i] = end
    found.sort()
    return [(_MENTION_NAMES[i], start, end) for i, start, end in found]


def _label_clause(clause: str) -> Iterator[tuple[str, int]]:
    """Yield ``(observation, value)`` for every mention and normality statement in a clause."""
    for obs, pattern in _NORMALS.items():
        if pattern.search(clause):
            yield obs, _NEGATIVE
    searchable = _blank(clause, _IGNORED)
    mentions = _mentions(searchable)
    if not mentions:
        return
    work = _blank(clause, _PSEUDO)
    cues: list[tuple[int, int, int, bool, bool]] = []
    for pattern, value, before, after in _CUES if _ANY_CUE.search(work) else ():
        found = list(pattern.finditer(work))
        cues.extend((m.start(), m.end(), value, before, after) for m in found)
        work = _blank_spans(work, found)
    for obs, start, end in mentions:
        best: tuple[int, int] | None = None  # (words between, tie-break: uncertain first)
        value = _POSITIVE
        for c_start, c_end, c_value, before, after in cues:
            if after and c_end <= start:
                gap = len(_WORD.findall(clause, c_end, start))
            elif before and c_start >= end:
                gap = len(_WORD.findall(clause, end, c_start))
            else:
                continue
            key = (gap, 0 if c_value == _UNCERTAIN else 1)
            if gap <= SCOPE_WORDS and (best is None or key < best):
                best, value = key, c_value
        yield obs, value


def label(text: str) -> dict[str, int | None]:
    """Label ``text`` for the 14 observations (keys in :data:`OBSERVATIONS` order).

    Values: ``1`` positive, ``0`` negative, ``-1`` uncertain, ``None`` not mentioned. Text is
    split into sentences (``.``, ``!``, a word ending in ``?``, newlines) and each sentence
    into clauses at :data:`SCOPE_TERMINATORS`. In a clause, each mention takes the value of
    the nearest cue (fewest words between, at most :data:`SCOPE_WORDS`) that governs it,
    uncertainty winning a tie; with no cue it is positive. Across mentions of one observation,
    positive beats uncertain beats negative. ``No Finding`` is 1 when the text has any
    non-blank character and no observation other than Support Devices is 1 or -1, it is 0
    when some such observation is, and ``None`` for blank text.
    """
    return dict(_label(text))


@functools.lru_cache(maxsize=8192)
def _label(text: str) -> tuple[tuple[str, int | None], ...]:
    """The labels of one text, memoised: impressions repeat, and labelling costs ~0.1 ms."""
    result: dict[str, int | None] = dict.fromkeys(OBSERVATIONS)
    if not text.strip():
        return tuple(result.items())
    for clause in _clauses(text):
        for obs, value in _label_clause(clause):
            if _RANK[value] > _RANK[result[obs]]:
                result[obs] = value
    abnormal = any(
        result[obs] in (_POSITIVE, _UNCERTAIN) for obs in OBSERVATIONS if obs not in ("No Finding", "Support Devices")
    )
    result["No Finding"] = _NEGATIVE if abnormal else _POSITIVE
    return tuple(result.items())


class FindingF1(TypedDict):
    """Finding-label F1 over :data:`OBSERVATIONS` (all values in [0, 1] or ``None``)."""

    micro: float
    macro: float
    per_observation: dict[str, float | None]
    n: int


def finding_f1(predictions: Sequence[str], references: Sequence[str], *, uncertain_as: int = 1) -> FindingF1:
    """Return micro, macro and per-observation F1 of ``label(prediction)`` vs ``label(ref)``.

    Each text pair is labelled; an uncertain label becomes ``uncertain_as`` (0 or 1), and the
    positive class is 1 (``None`` and 0 are negative). Per observation
    ``F1 = 2 TP / (2 TP + FP + FN)``; an observation positive in no prediction and no reference
    has no F1 (``None``) and is left out of the macro mean. Micro F1 pools TP, FP and FN over
    the 14 observations. When nothing is positive anywhere, micro and macro are 1.0 (agreement
    on absence, as with two empty answers in token F1). ``n`` is the number of pairs.
    Raises :class:`InvalidInput` for sequences of different or zero length or a bad
    ``uncertain_as``.
    """
    if uncertain_as not in (0, 1):
        raise InvalidInput(f"uncertain_as must be 0 or 1, got {uncertain_as!r}")
    if len(predictions) != len(references):
        raise InvalidInput(f"{len(predictions)} predictions but {len(references)} references")
    if not predictions:
        raise InvalidInput("finding F1 of no pairs is undefined")
    counts = {obs: [0, 0, 0] for obs in OBSERVATIONS}  # tp, fp, fn

    def positive(value: int | None) -> bool:
        return (uncertain_as if value == _UNCERTAIN else value) == _POSITIVE

    for pred_text, ref_text in zip(predictions, references, strict=True):
        pred, ref = label(pred_text), label(ref_text)
        for obs in OBSERVATIONS:
            p, r = positive(pred[obs]), positive(ref[obs])
            counts[obs][0] += p and r
            counts[obs][1] += p and not r
            counts[obs][2] += r and not p
    per_obs: dict[str, float | None] = {}
    for obs, (tp, fp, fn) in counts.items():
        per_obs[obs] = None if tp + fp + fn == 0 else 2 * tp / (2 * tp + fp + fn)
    tp, fp, fn = (sum(c[i] for c in counts.values()) for i in range(3))
    micro = 1.0 if tp + fp + fn == 0 else 2 * tp / (2 * tp + fp + fn)
    defined = [v for v in per_obs.values() if v is not None]
    macro = sum(defined) / len(defined) if defined else 1.0
    return FindingF1(micro=micro, macro=macro, per_observation=per_obs, n=len(predictions))
