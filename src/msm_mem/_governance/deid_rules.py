"""The de-identification rules: one regular expression per identifier pattern, in one table.

Each :class:`Rule` finds one kind of identifier (:class:`Category`); a rule may check a match
(``check``), choose its placeholder (``replace``, dates keep their year) or trim the span
(``adjust``). :mod:`msm_mem._governance.deid` runs the table; the words and fragments it is
built from are in :mod:`msm_mem._governance.deid_vocabulary`.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from .deid_vocabulary import (
    AGE,
    BY_CUE,
    CAPS,
    COUNTRIES,
    CREDENTIAL,
    DAY,
    GIVEN,
    GIVEN_UPPER,
    ISO_TIME,
    LO,
    MONTH,
    NAME_CUE,
    NAMES,
    NOT_NAMES,
    NUM_END,
    NW,
    OCTET,
    OPT_TITLE,
    PART,
    PLACE_SUFFIXES,
    ROLE,
    ST_AMBIG,
    ST_CLEAR,
    ST_ZIP,
    STATES,
    STREET,
    TITLE,
    TLD,
    UP,
    URL_END,
    VALUE,
    YEAR,
)

__all__ = ["PLACEHOLDER", "RULES", "Category", "Rule"]


class Category(StrEnum):
    """Kinds of identifier; the value is the placeholder's text between brackets."""

    NAME = "NAME"
    DATE = "DATE"
    AGE = "AGE>89"
    PHONE = "PHONE"
    FAX = "FAX"
    EMAIL = "EMAIL"
    URL = "URL"
    IP = "IP"
    MRN = "MRN"
    SSN = "SSN"
    ACCOUNT = "ACCOUNT"
    HEALTHPLAN = "HEALTHPLAN"
    LICENSE = "LICENSE"
    VEHICLE = "VEHICLE"
    DEVICE = "DEVICE"
    ID = "ID"
    ZIP = "ZIP"
    ADDRESS = "ADDRESS"
    LOCATION = "LOCATION"


PLACEHOLDER = re.compile(r"\[(?:" + "|".join(re.escape(c.value) for c in Category) + r")\]")


@dataclass(frozen=True, slots=True)
class Rule:
    """One identifier pattern; ``check``, ``replace`` and ``adjust`` refine its matches."""

    category: Category
    regex: re.Pattern[str]
    check: Callable[[re.Match[str]], bool] | None = None
    replace: Callable[[re.Match[str]], str] | None = None
    adjust: Callable[[str, int, int], tuple[int, int]] | None = None


def _rule(
    category: Category,
    pattern: str,
    flags: int = 0,
    check: Callable[[re.Match[str]], bool] | None = None,
    replace: Callable[[re.Match[str]], str] | None = None,
    adjust: Callable[[str, int, int], tuple[int, int]] | None = None,
) -> Rule:
    return Rule(category, re.compile(pattern, flags), check, replace, adjust)


_DOB_BEFORE = re.compile(r"(?:\bDOB|\bD\.O\.B\.?|\bdate of birth|\bbirth ?date|\bborn(?: on| in)?)\W{0,4}\Z", re.I)


def _date_replacement(m: re.Match[str]) -> str:
    """``[DATE] <year>`` keeping a 4-digit year, except in a birth date."""
    groups = m.groupdict()
    year = groups.get("y") or groups.get("y2")
    if year and len(year) == 4 and not _DOB_BEFORE.search(m.string, 0, m.start()):
        return f"[DATE] {year}"
    return "[DATE]"


def _numeric_date_ok(m: re.Match[str]) -> bool:
    a, b = int(m.group("a")), int(m.group("b") or m.group("b2"))
    return 1 <= a <= 31 and 1 <= b <= 31 and min(a, b) <= 12


def _ipv6_ok(m: re.Match[str]) -> bool:
    text: str = m.group(0)
    if len(text) < 3 or not re.search(r"[0-9A-Fa-f]", text):
        return False
    try:
        ipaddress.IPv6Address(text.split("%")[0])
    except ValueError:
        return False
    return True


def _phone_ok(m: re.Match[str]) -> bool:
    value: str = m.group("v")
    return 7 <= sum(ch.isdigit() for ch in value) <= 15


def _phone_category(m: re.Match[str]) -> str:
    start = m.start("v")
    before = m.string[max(0, start - 25) : start]
    return "[FAX]" if re.search(r"fax|facsimile", before, re.I) else "[PHONE]"


def _trim_name(text: str, start: int, end: int) -> tuple[int, int]:
    """Drop leading non-name words, then cut at the next one ("Dr. Smith Hospital" -> Smith)."""
    words = list(re.finditer(rf"[{UP}{LO}'’-]+", text[start:end]))
    while words and words[0].group(0) in NOT_NAMES:
        words.pop(0)
    if not words:
        return start, start
    first = start + words[0].start()
    for word in words[1:]:
        if len(word.group(0)) > 1 and word.group(0) in NOT_NAMES:  # "A." is an initial
            end = start + word.start()
            break
    start = first
    while end > start and text[end - 1] in " \t\n,":
        end -= 1
    return start, end


def _trim_place(text: str, start: int, end: int) -> tuple[int, int]:
    """Drop leading generic words ("The", "General"); nothing left before the suffix: no find."""
    words = list(re.finditer(r"[A-Za-z'’.-]+", text[start:end]))
    kept = 0
    while kept < len(words) - 1 and words[kept].group(0) in NOT_NAMES:
        kept += 1
    if kept >= len(words) - 1 or words[kept].group(0) in PLACE_SUFFIXES:
        return start, start
    return start + words[kept].start(), end


def _trim_city(text: str, start: int, end: int) -> tuple[int, int]:
    """Drop leading generic words ("Presentation, China" is no city); none left: no find."""
    for word in re.finditer(r"[A-Za-z'’-]+", text[start:end]):
        if word.group(0) not in NOT_NAMES:
            return start + word.start(), end
    return start, start


def _labelled(category: Category, strong: str, weak: str = "") -> Rule:
    """A label then a value holding a digit; weak labels need "no."/"#"/":" before the value."""
    strong_part = rf"\b(?:{strong})\b\s*[:#=]?\s*(?:(?:number|num|no|nr)\b\.?|#)?\s*[:#=]?\s*"
    weak_part = rf"\b(?:{weak})\b\s*(?:[:#=]\s*[:#=]?|(?:number|num|no|nr)\b\.?\s*[:#=]?)\s*"
    label = f"(?:{strong_part}|{weak_part})" if weak else strong_part
    return _rule(category, label + VALUE, re.I)


# Order matters only for ties (same start, same length): the rule listed first wins.
RULES: tuple[Rule, ...] = (
    _rule(
        Category.EMAIL,
        r"(?<![\w.%+-])[\w.%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*"
        r"\.[A-Za-z]{2,}\b",
    ),
    _rule(Category.URL, rf"\b(?:(?:https?|ftp)://|www\.){URL_END}", re.I),
    _rule(Category.URL, rf"(?<![\w@.-])(?:[A-Za-z0-9-]+\.)+{TLD}\b(?:/{URL_END})?"),
    _rule(Category.IP, rf"(?<![\w.])(?:{OCTET}\.){{3}}{OCTET}(?![\w.]?\d)"),
    _rule(Category.IP, r"(?<![\w:])[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,7}(?:%\w+)?(?![\w:])", check=_ipv6_ok),
    _rule(Category.SSN, r"(?<![\d-])\d{3}-\d{2}-\d{4}(?![\d-])"),
    _rule(
        Category.SSN,
        r"\b(?:SSN|social security)\b\D{0,12}?"
        r"(?P<v>\d{3}[- ]?\d{2}[- ]?\d{4})(?!\d)",
        re.I,
    ),
    _labelled(
        Category.MRN,
        r"MRN|medical record|med\.? rec\.?|hospital (?:number|no|id)|patient id"
        r"|unit number|UR number",
        r"record|chart",
    ),
    _labelled(
        Category.HEALTHPLAN,
        r"health plan(?: beneficiary)?|beneficiary|medicaid|medicare",
        r"member(?: id)?|policy|insurance(?: id)?|subscriber(?: id)?|group",
    ),
    _labelled(Category.VEHICLE, r"VIN|vehicle(?: identification)?(?: id)?|licen[cs]e plate", r"plate"),
    _labelled(Category.LICENSE, r"(?:driver'?s )?licen[cs]e|certificate|DEA|NPI|passport", r"registration"),
    _labelled(Category.ACCOUNT, r"account|acct|a/c", r"billing"),
    _labelled(
        Category.DEVICE, r"serial|S/N|device id|device identifier|UDI|implant id", r"SN|device|implant|pacemaker|lot"
    ),
    _labelled(
        Category.ID, r"r?ID|identifier|accession|study id", r"case|specimen|encounter|visit|sample|ref(?:erence)?"
    ),
    _rule(
        Category.PHONE,
        r"\b(?:phone|tel|telephone|cell|mobile|pager|fax|facsimile|contact)\b\.?"
        r"\s*[:#=]?\s*(?:(?:number|no)\b\.?|#)?\s*[:#=]?\s*(?P<v>\+?\(?\d[\d().\s-]{5,}\d)(?!\d)",
        re.I,
        _phone_ok,
        _phone_category,
    ),
    _rule(
        Category.PHONE,
        r"(?<![\w+])(?P<v>(?:\+?1[\s.-]?)?(?:\(\d{3}\)\s?|\d{3}[\s.-])\d{3}[\s.-]"
        r"\d{4}(?:\s*(?:x|ext\.?)\s*\d{1,5})?)(?![\d-])",
        0,
        _phone_ok,
        _phone_category,
    ),
    _rule(
        Category.PHONE,
        r"(?<![\w+])(?P<v>\+\d{1,3}(?:[\s.-]?\(?\d{1,4}\)?){2,5})(?![\d-])",
        0,
        _phone_ok,
        _phone_category,
    ),
    _rule(
        Category.DATE,
        rf"(?:\bDOB|\bD\.O\.B\.?|\bdate of birth|\bbirth ?date|\bborn(?: on| in)?)"
        rf"\W{{0,4}}(?:\[DATE\]\s*)?(?P<v>{YEAR})\b",
        re.I,
        replace=lambda m: "[DATE]",
    ),
    _rule(
        Category.DATE,
        rf"(?<![\w.]){MONTH}\s*{DAY}(?:\s*[-–]\s*{DAY})?"
        rf"(?:\s*,?\s*(?P<y>{YEAR}))?(?!\w)",
        replace=_date_replacement,
    ),
    _rule(
        Category.DATE,
        rf"(?<![\w.]){DAY}(?:\s*[-–]\s*{DAY})?\s*(?:of\s+)?{MONTH}"
        rf"(?:\s*,?\s*(?P<y>{YEAR})\b)?",
        replace=_date_replacement,
    ),
    _rule(Category.DATE, rf"(?<![\w.]){MONTH}\s*,?\s*(?:of\s+)?(?P<y>{YEAR})\b", replace=_date_replacement),
    _rule(
        Category.DATE,
        rf"(?<![\d/.-])(?P<y>{YEAR})(?P<s>[-/.])(?:0?[1-9]|1[0-2])(?P=s)"
        rf"(?:0?[1-9]|[12]\d|3[01]){ISO_TIME}{NUM_END}",
        replace=_date_replacement,
    ),
    _rule(
        Category.DATE,
        rf"(?<![\d/.-])(?P<a>\d{{1,2}})(?:/(?P<b>\d{{1,2}})/(?P<y>{YEAR}|\d\d)"
        rf"|(?P<s>[-.])(?P<b2>\d{{1,2}})(?P=s)(?P<y2>{YEAR})){NUM_END}",
        check=_numeric_date_ok,
        replace=_date_replacement,
    ),
    _rule(
        Category.DATE,
        rf"(?<![\d/.-])(?:0[1-9]|1[0-2])[/-](?P<y>{YEAR}){NUM_END}"
        rf"|(?<![\d/.-])(?P<y2>{YEAR})-(?:0[1-9]|1[0-2]){NUM_END}",
        replace=_date_replacement,
    ),
    _rule(
        Category.DATE,
        r"(?<!\d)(?P<y>(?:19|20)\d\d)(?:0[1-9]|1[0-2])"
        r"(?:0[1-9]|[12]\d|3[01])(?!\d)",
        replace=_date_replacement,
    ),
    _rule(
        Category.AGE,
        rf"(?<![\w.])(?P<v>{AGE})\s*-?\s*(?:years?|yrs?|y)\.?\s*-?\s*"
        rf"(?:old|o\b\.?|of age)|(?<![\w.])(?P<v2>{AGE})\s*-?\s*(?:y/o|yo[mf]?)\b",
        re.I,
    ),
    _rule(Category.AGE, rf"\bage[ds]?\s*(?:of\s*)?[:=]?\s*(?P<v>{AGE})(?![\d.]?\d)", re.I),
    _rule(
        Category.AGE,
        r"\bin\s+(?:his|her|their)\s+(?P<v>(?:(?:early|mid|late)[- ]?)?(?:90s|"
        r"nineties|'90s))|\b(?P<v2>(?:nonagenarian|centenarian)s?)\b|\b(?P<v3>(?:ninety|one "
        r"hundred)(?:[- ](?:one|two|three|four|five|six|seven|eight|nine))?)[- ]years?[- ]old",
        re.I,
    ),
    _rule(Category.ZIP, r"(?<![\d-])\d{5}-\d{4}(?![\d-])"),
    _rule(Category.ZIP, rf"\b{ST_ZIP}\.?,?\s+(?P<v>\d{{5}})(?![\d-])"),
    _rule(
        Category.ZIP,
        r"\b(?:zip(?: ?code)?|postal code|post ?code)\s*[:#]?\s*(?P<v>\d{5}"
        r"|[A-Z]\d[A-Z] ?\d[A-Z]\d|[A-Z]{1,2}\d[A-Z\d]? ?\d[A-Z]{2})\b",
        re.I,
    ),
    _rule(
        Category.ADDRESS,
        rf"(?<![\w.])\d{{1,6}}[A-Za-z]?\s+(?:(?:[NSEW]|North|South|East|West)"
        rf"\.?\s+)?(?:(?:[A-Z][A-Za-z'-]*|\d+(?:st|nd|rd|th))\.?\s+){{1,3}}{STREET}\b\.?"
        r"(?:\s*,?\s*(?:Apt|Apartment|Suite|Ste|Unit|Floor|Fl|Room|Rm|#)\.?\s*#?\s*[A-Za-z0-9-]+)?",
    ),
    _rule(Category.ADDRESS, r"\b(?:P\.?\s?O\.?\s*Box|Post Office Box)\s*#?\s*\d+", re.I),
    _rule(
        Category.LOCATION,
        rf"(?<![\w-])(?P<v>[A-Z][a-z]+(?:[ -][A-Z][a-z]+){{0,2}}),\s*(?:"
        rf"(?:{ST_CLEAR})(?![\w-])(?!\s*-?\d{{1,4}}(?!\d))"
        rf"|(?:{ST_AMBIG})\b(?=\.?,?\s+\d{{5}})|(?:{STATES}|{COUNTRIES})\b)",
        adjust=_trim_city,
    ),
    _rule(
        Category.LOCATION,
        r"(?<![\w'-])(?:[A-Z][a-z]+\s){1,3}"
        r"(?:County|Parish|Borough|Township|Precinct)\b",
        adjust=_trim_place,
    ),
    _rule(
        Category.LOCATION,
        r"(?<![\w'-])(?:(?:St\.?|Saint)\s+)?(?:[A-Z][A-Za-z'-]+\s+){1,4}"
        r"(?:Hospital|Medical Cent(?:er|re)|Clinic|Infirmary|Health Cent(?:er|re)|Nursing Home"
        r"|Hospice)\b",
        adjust=_trim_place,
    ),
    _rule(Category.NAME, rf"{TITLE}(?P<v>{NAMES}|{CAPS})", adjust=_trim_name),
    _rule(
        Category.NAME,
        rf"(?<![\w'’-])(?P<v>{NW}(?:\s+(?:[A-Z]\.\s+)?{NW}){{1,3}}),?\s+"
        rf"{CREDENTIAL}",
        adjust=_trim_name,
    ),
    _rule(Category.NAME, rf"{NAME_CUE},?\s+(?:(?:named|called|is)\s+)?(?P<v>{NAMES})", adjust=_trim_name),
    _rule(Category.NAME, rf"{BY_CUE}{OPT_TITLE}(?P<v>{NAMES})", adjust=_trim_name),
    _rule(Category.NAME, rf"{ROLE}{OPT_TITLE}(?P<v>{NW},\s*{NAMES}|{NAMES}|{CAPS})", adjust=_trim_name),
    _rule(
        Category.NAME,
        rf"\b(?:(?:[Pp]atient|[Ff]ull|[Ff]irst|[Ll]ast|[Gg]iven) )?(?:[Nn]ame|NAME"
        rf"|[Ss]urname)\s*[:=]\s*{OPT_TITLE}(?P<v>{NW},\s*{NAMES}|{NAMES}|{CAPS}(?:,\s*"
        rf"{CAPS})?|[a-z][a-z'-]+(?:\s+[a-z][a-z'-]+)?)",
        adjust=_trim_name,
    ),
    # names without a cue: a common given name, with an initial and a surname or two, or after
    # "Surname, "; in capitals a given name and at most one surname
    _rule(
        Category.NAME,
        rf"(?<![\w'’-])(?P<v>{GIVEN}(?:\s+(?:[A-Z]\.?\s+)?{PART}{{0,2}}{NW}){{0,2}})",
        adjust=_trim_name,
    ),
    _rule(Category.NAME, rf"(?<![\w'’-])(?P<v>{NW},\s*{GIVEN})", adjust=_trim_name),
    _rule(Category.NAME, rf"(?<![\w'’-])(?P<v>{GIVEN_UPPER}(?:\s+[A-Z]\b\.?)?(?:\s+[A-Z]{{2,}}\b)?)"),
)
