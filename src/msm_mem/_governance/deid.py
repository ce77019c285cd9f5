"""HIPAA Safe Harbor de-identification of free text by rules.

:func:`find_identifiers` scans text for the identifiers of 45 CFR 164.514(b)(2) that rules can
recognise; :func:`scrub` replaces each with a bracketed placeholder (``[NAME]``, ``[DATE]``...)
until the scanner finds nothing, so ``find_identifiers(scrub(t)) == []`` and
``scrub(scrub(t)) == scrub(t)`` hold for every ``t``.

Rule coverage of the 18 Safe Harbor categories:

=====  =======================================  ===================================================
 #     category                                 rules here
=====  =======================================  ===================================================
 A     names                                    after titles (Dr., Mr., Mrs., Ms., Prof...), before
                                                credentials (", MD"), after cues ("patient Jane
                                                Doe", "his wife Mary", "name: ...", "seen by",
                                                "courtesy of", "attending: ..."); without a cue:
                                                a common given name (a names list), with an
                                                initial and surnames, or "Surname, Given", in
                                                title case or capitals -> ``[NAME]``
 B     geography smaller than a state           street addresses (number + street word), PO boxes
                                                -> ``[ADDRESS]``; ZIP codes (ZIP+4 anywhere; 5
                                                digits after a state or a label) -> ``[ZIP]``;
                                                "City, ST", "City, State", "City, Country", "X
                                                County", named hospitals/clinics -> ``[LOCATION]``
 C     dates finer than the year; ages over 89  month-name and numeric dates -> ``[DATE] 2020``
                                                (year kept; dropped after "DOB"/"born"), ISO
                                                date-times; "92-year-old", "aged 91", "in her
                                                90s" -> ``[AGE>89]`` (the number only)
 D-E   telephone, fax                           formatted numbers, labelled numbers -> ``[PHONE]``,
                                                ``[FAX]`` when "fax" precedes
 F     e-mail                                   ``[EMAIL]``
 G-M   SSN, MRN, health plan, account,          SSN format or label -> ``[SSN]``; labelled values
       licence/certificate, vehicle, device     -> ``[MRN]``, ``[HEALTHPLAN]``, ``[ACCOUNT]``,
                                                ``[LICENSE]``, ``[VEHICLE]``, ``[DEVICE]``
 N-O   URLs, IP addresses                       schemes, ``www.``, bare domains on common TLDs;
                                                IPv4, IPv6 (validated) -> ``[URL]``, ``[IP]``
 R     other unique numbers                     labelled ("ID:", "case no.", "accession #")
                                                -> ``[ID]``
=====  =======================================  ===================================================

Known limits (not caught by rules): names without a cue whose given name is not in the list,
or absent ("Smithers went home"), names in lower case without a cue, cities and
regions without a state, country or suffix ("travelled from Wuhan"), month names without a day
or year ("in March"), day/month without a year ("3/4"), times of day, unlabelled bare numbers
(5-digit ZIPs, record numbers), biometric identifiers and photographs (P, Q). Use a trained
de-identifier or human review where these matter; the rules are conservative so that clinical
content ("right lower lobe", "COVID-19", "2 cm nodule", "day 9", "120/80") survives.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .deid_rules import PLACEHOLDER, RULES, Category

__all__ = ["Category", "Finding", "find_identifiers", "scrub"]


@dataclass(frozen=True, slots=True)
class Finding:
    """One identifier: ``text == source[start:end]`` and what :func:`scrub` puts there."""

    category: Category
    start: int
    end: int
    text: str
    replacement: str

    @property
    def span(self) -> tuple[int, int]:
        """``(start, end)`` character offsets, end exclusive."""
        return self.start, self.end


def _value_span(m: re.Match[str]) -> tuple[int, int]:
    for name in ("v", "v2", "v3"):
        if name in m.re.groupindex and m.group(name) is not None:
            return m.span(name)
    return m.span()


def _inside_placeholders(holders: list[tuple[int, int]], start: int, end: int) -> bool:
    """True when every character of [start, end) lies inside some placeholder."""
    covered = sum(max(0, min(end, b) - max(start, a)) for a, b in holders)
    return covered >= end - start


def find_identifiers(text: str) -> list[Finding]:
    """Scan ``text``; return non-overlapping identifiers in order of position.

    Text inside placeholders (``[NAME]``...) is never reported. When candidates overlap the
    earliest wins, then the longest, then the rule listed first.
    """
    holders = [m.span() for m in PLACEHOLDER.finditer(text)]
    candidates: list[tuple[int, int, int, Finding]] = []
    for priority, rule in enumerate(RULES):
        for m in rule.regex.finditer(text):
            if rule.check is not None and not rule.check(m):
                continue
            start, end = _value_span(m)
            if rule.adjust is not None:
                start, end = rule.adjust(text, start, end)
            if end <= start or _inside_placeholders(holders, start, end):
                continue
            replacement = rule.replace(m) if rule.replace else f"[{rule.category.value}]"
            for a, b in holders:  # swallow placeholders it cuts into, never split one
                if a < end and start < b:
                    start, end = min(start, a), max(end, b)
            finding = Finding(rule.category, start, end, text[start:end], replacement)
            candidates.append((start, -(end - start), priority, finding))
    candidates.sort(key=lambda c: c[:3])
    chosen: list[Finding] = []
    for _, _, _, finding in candidates:
        if not chosen or finding.start >= chosen[-1].end:
            chosen.append(finding)
    return chosen


def _replace(text: str, findings: list[Finding], keep_year: bool) -> str:
    parts, pos = [], 0
    for f in findings:
        parts.append(text[pos : f.start])
        parts.append(f.replacement if keep_year else f"[{f.category.value}]")
        pos = f.end
    parts.append(text[pos:])
    return "".join(parts)


def scrub(text: str) -> str:
    """Replace every identifier found by :func:`find_identifiers` with its placeholder.

    Repeats until the scanner finds nothing, so the result has no findings and ``scrub`` is
    idempotent. Dates keep their year ("March 3, 2020" -> "[DATE] 2020") except after a
    birth-date cue; everything else becomes a bare placeholder. Placeholders already in the
    text are left alone.
    """
    rounds = 0
    while findings := find_identifiers(text):
        # Every finding holds a character outside placeholders and becomes a placeholder, so
        # the text outside placeholders shrinks each round once kept years stop being added
        # (after 8 rounds): the loop ends whatever the rules do.
        text = _replace(text, findings, keep_year=rounds < 8)
        rounds += 1
    return text
