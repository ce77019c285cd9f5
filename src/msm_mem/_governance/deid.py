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
                                                "courtesy of", "attending: ...") -> ``[NAME]``
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

Known limits (not caught by rules): names without a cue ("Jane went home"), cities and
regions without a state, country or suffix ("travelled from Wuhan"), month names without a day
or year ("in March"), day/month without a year ("3/4"), times of day, unlabelled bare numbers
(5-digit ZIPs, record numbers), biometric identifiers and photographs (P, Q). Use a trained
de-identifier or human review where these matter; the rules are conservative so that clinical
content ("right lower lobe", "COVID-19", "2 cm nodule", "day 9", "120/80") survives.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["Category", "Finding", "find_identifiers", "scrub"]


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


_PLACEHOLDER = re.compile(r"\[(?:" + "|".join(re.escape(c.value) for c in Category) + r")\]")

# --- vocabulary ----------------------------------------------------------------------------
_MONTH = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
    r"|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?"
    r"|JAN(?:UARY)?|FEB(?:RUARY)?|MAR(?:CH)?|APR(?:IL)?|MAY|JUNE?|JULY?|AUG(?:UST)?"
    r"|SEP(?:T(?:EMBER)?)?|OCT(?:OBER)?|NOV(?:EMBER)?|DEC(?:EMBER)?)\b\.?"
)
_DAY = r"(?:0?[1-9]|[12]\d|3[01])(?:st|nd|rd|th)?"
_YEAR = r"(?:1[89]\d\d|20\d\d)"
_STATES = (
    "Alabama|Alaska|Arizona|Arkansas|California|Colorado|Connecticut|Delaware|Florida|Georgia|"
    "Hawaii|Idaho|Illinois|Indiana|Iowa|Kansas|Kentucky|Louisiana|Maine|Maryland|Massachusetts|"
    "Michigan|Minnesota|Mississippi|Missouri|Montana|Nebraska|Nevada|New Hampshire|New Jersey|"
    "New Mexico|New York|North Carolina|North Dakota|Ohio|Oklahoma|Oregon|Pennsylvania|"
    "Rhode Island|South Carolina|South Dakota|Tennessee|Texas|Utah|Vermont|Virginia|Washington|"
    "West Virginia|Wisconsin|Wyoming|District of Columbia"
)
# Two-letter codes that are also common clinical abbreviations count only before a ZIP code.
_ST_CLEAR = "AK|AZ|CA|DC|FL|IA|IL|KS|KY|MA|MN|MT|NC|NH|NJ|NM|NV|NY|OH|RI|TN|TX|UT|VT|WA|WI|WV|WY"
_ST_AMBIG = "AL|AR|CO|CT|DE|GA|HI|ID|IN|LA|MD|ME|MI|MO|MS|ND|NE|OK|OR|PA|SC|SD|VA"
_COUNTRIES = (
    "Argentina|Australia|Austria|Belgium|Brazil|Canada|Chile|China|Colombia|Denmark|Egypt|"
    "England|Finland|France|Germany|Greece|Hong Kong|India|Indonesia|Iran|Iraq|Ireland|Israel|"
    "Italy|Japan|Korea|Macau|Malaysia|Mexico|Netherlands|New Zealand|Nigeria|Norway|Pakistan|"
    "Peru|Philippines|Poland|Portugal|Russia|Saudi Arabia|Scotland|Singapore|South Africa|"
    "South Korea|Spain|Sweden|Switzerland|Taiwan|Thailand|Turkey|UK|USA|U\\.S\\.A?\\.?|"
    "United Kingdom|United States|Vietnam|Wales"
)
_NOT_NAMES = frozenset(
    """A An The This That These Those He She His Her Hers They Their It Its We Our I You Who
    Which What When Where Was Were Is Are Be Been Had Has Have Did Does Do And Or But Nor Of
    In On At To For From By With Without As Not No Yes None Unknown Also Then After Before
    During Patient Patients Pt Doctor Nurse Hospital Clinic Department Emergency General
    Practitioner Medical Medicine Center Centre University Unit Ward Room Care Intensive
    Team Service Radiology Radiologist Radiopaedia Imaging Notes Note Discussion Presentation
    History Findings Finding Impression Report Diagnosis Case Figure Fig Table Day Days Week
    Weeks Month Months Year Years Today Yesterday Tomorrow Morning Evening Night Chest Lung
    Lungs Left Right Bilateral Upper Lower Normal Positive Negative Covid Coronavirus
    Pneumonia Monday Tuesday Wednesday Thursday Friday Saturday Sunday January February
    March April May June July August September October November December Male Female Man
    Woman Boy Girl Mother Father Son Daughter Wife Husband Brother Sister Family Dr Drs Dra Mr
    Mrs Ms Mx Miss Prof Sr Sra Srta Professor Assoc Associate Assistant Consultant""".split()
)
_UP, _LO = "A-ZÀ-ÖØ-ÞĀ-Ž", "a-zß-öø-ÿĀ-ž"  # Latin-1 and Latin Extended-A letters
_NW = (
    rf"(?:(?:Mc|Mac|O['’])[{_UP}][{_LO}]+|[{_UP}][{_LO}]*[{_UP}][{_LO}]+"
    rf"|[{_UP}][{_LO}]+(?:['’-][{_UP}]?[{_LO}]+)*)(?!\w)"
)
_PART = r"(?:(?:van|von|de|da|del|der|di|du|le|la|dos|bin|ibn|al)\s+)"
_NAMES = rf"(?:[A-Z]\.\s*)*{_NW}(?:\s+(?:[A-Z]\.?\s+)?{_PART}?{_NW}){{0,3}}"
_CAPS = r"[A-Z]{2,}(?:['’-][A-Z]{2,})?(?:\s+[A-Z]{2,}){0,2}\b"
_TITLE = r"(?<![\w.])(?:Dr|Drs|Dra|Mr|Mrs|Ms|Mx|Miss|Prof|Sr|Sra|Srta|Doctor|Professor)\.?\s+"
_VALUE = r"(?P<v>(?=[A-Za-z0-9-]*\d)[A-Za-z0-9]+(?:[-/.][A-Za-z0-9]+)*(?:[ -]\d{3,})*)"


@dataclass(frozen=True, slots=True)
class _Rule:
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
) -> _Rule:
    return _Rule(category, re.compile(pattern, flags), check, replace, adjust)


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
    words = list(re.finditer(rf"[{_UP}{_LO}'’-]+", text[start:end]))
    while words and words[0].group(0) in _NOT_NAMES:
        words.pop(0)
    if not words:
        return start, start
    first = start + words[0].start()
    for word in words[1:]:
        if len(word.group(0)) > 1 and word.group(0) in _NOT_NAMES:  # "A." is an initial
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
    while kept < len(words) - 1 and words[kept].group(0) in _NOT_NAMES:
        kept += 1
    if kept >= len(words) - 1 or words[kept].group(0) in _PLACE_SUFFIXES:
        return start, start
    return start + words[kept].start(), end


def _trim_city(text: str, start: int, end: int) -> tuple[int, int]:
    """Drop leading generic words ("Presentation, China" is no city); none left: no find."""
    for word in re.finditer(r"[A-Za-z'’-]+", text[start:end]):
        if word.group(0) not in _NOT_NAMES:
            return start + word.start(), end
    return start, start


def _labelled(category: Category, strong: str, weak: str = "") -> _Rule:
    """A label then a value holding a digit; weak labels need "no."/"#"/":" before the value."""
    strong_part = rf"\b(?:{strong})\b\s*[:#=]?\s*(?:(?:number|num|no|nr)\b\.?|#)?\s*[:#=]?\s*"
    weak_part = rf"\b(?:{weak})\b\s*(?:[:#=]\s*[:#=]?|(?:number|num|no|nr)\b\.?\s*[:#=]?)\s*"
    label = f"(?:{strong_part}|{weak_part})" if weak else strong_part
    return _rule(category, label + _VALUE, re.I)


_PLACE_SUFFIXES = frozenset(
    "Hospital Medical Clinic Infirmary Health Nursing Hospice County Parish Borough Township Precinct".split()
)
_ST_ZIP = rf"(?:{_ST_CLEAR}|{_ST_AMBIG}|{_STATES})"
_STREET = (
    r"(?:Street|St|Avenue|Ave|Road|Rd|Boulevard|Blvd|Lane|Ln|Drive|Dr|Court|Ct|Place|Pl|Way"
    r"|Terrace|Parkway|Pkwy|Highway|Hwy|Circle|Square|Sq|Trail|Alley|Crescent|Close|Plaza)"
)
_URL_END = r"[^\s<>\"'\[\]]*[^\s<>\"'\[\].,;:!?)]"
_TLD = (
    r"(?:com|org|net|edu|gov|mil|info|io|co\.uk|ac\.uk|nhs\.uk|de|fr|es|it|nl|ca|au|cn|jp|kr"
    r"|br|ch|se|eu|health)"
)
_OCTET = r"(?:25[0-5]|2[0-4]\d|1?\d?\d)"
_AGE = r"(?:9\d|1[01]\d)"
_NAME_CUE = (
    r"\b(?:[Pp]atient|[Pp]t\.?|[Cc]lient|[Rr]esident|[Ww]ife|[Hh]usband|[Ss]on|[Dd]aughter"
    r"|[Mm]other|[Ff]ather|[Bb]rother|[Ss]ister|[Ss]pouse|[Pp]artner|[Gg]uardian|[Ff]riend"
    r"|[Cc]aregiver|(?<!-)[Nn]amed|(?<!-)[Cc]alled)\b"
)
_BY_CUE = (
    r"\b(?:[Ss]igned|[Dd]ictated|[Rr]eviewed|[Ss]een|[Ee]xamined|[Rr]eferred|[Rr]eported"
    r"|[Tt]ranscribed|[Aa]pproved|[Ww]ritten|[Tt]reated|[Cc]ourtesy)\s+(?:by|of)\s*:?\s*"
)
_ROLE = (
    r"\b(?:[Aa]ttending|[Pp]hysician|[Rr]adiologist|[Ss]urgeon|PCP|[Pp]rovider|[Cc]onsultant"
    r"|[Nn]urse|[Cc]ontact|[Nn]ext of kin|NOK|[Ss]ignature|[Aa]uthor)\s*[:=]\s*"
)
_OPT_TITLE = r"(?:(?:Dr|Prof|Mr|Mrs|Ms)\.?\s+)?"
_CREDENTIAL = r"(?:MD|M\.D\.|PhD|Ph\.D\.|RN|NP|MBBS|FRCR|FRCPC?|FACR|DNP|PA-C)(?![\w.]|\.\w)"
_ISO_TIME = r"(?:[T ]\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?"
_NUM_END = r"(?![\d/.-]?\d)"

# Order matters only for ties (same start, same length): the rule listed first wins.
_RULES: tuple[_Rule, ...] = (
    _rule(
        Category.EMAIL,
        r"(?<![\w.%+-])[\w.%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*"
        r"\.[A-Za-z]{2,}\b",
    ),
    _rule(Category.URL, rf"\b(?:(?:https?|ftp)://|www\.){_URL_END}", re.I),
    _rule(Category.URL, rf"(?<![\w@.-])(?:[A-Za-z0-9-]+\.)+{_TLD}\b(?:/{_URL_END})?"),
    _rule(Category.IP, rf"(?<![\w.])(?:{_OCTET}\.){{3}}{_OCTET}(?![\w.]?\d)"),
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
        rf"\W{{0,4}}(?:\[DATE\]\s*)?(?P<v>{_YEAR})\b",
        re.I,
        replace=lambda m: "[DATE]",
    ),
    _rule(
        Category.DATE,
        rf"(?<![\w.]){_MONTH}\s*{_DAY}(?:\s*[-–]\s*{_DAY})?"
        rf"(?:\s*,?\s*(?P<y>{_YEAR}))?(?!\w)",
        replace=_date_replacement,
    ),
    _rule(
        Category.DATE,
        rf"(?<![\w.]){_DAY}(?:\s*[-–]\s*{_DAY})?\s*(?:of\s+)?{_MONTH}"
        rf"(?:\s*,?\s*(?P<y>{_YEAR})\b)?",
        replace=_date_replacement,
    ),
    _rule(Category.DATE, rf"(?<![\w.]){_MONTH}\s*,?\s*(?:of\s+)?(?P<y>{_YEAR})\b", replace=_date_replacement),
    _rule(
        Category.DATE,
        rf"(?<![\d/.-])(?P<y>{_YEAR})(?P<s>[-/.])(?:0?[1-9]|1[0-2])(?P=s)"
        rf"(?:0?[1-9]|[12]\d|3[01]){_ISO_TIME}{_NUM_END}",
        replace=_date_replacement,
    ),
    _rule(
        Category.DATE,
        rf"(?<![\d/.-])(?P<a>\d{{1,2}})(?:/(?P<b>\d{{1,2}})/(?P<y>{_YEAR}|\d\d)"
        rf"|(?P<s>[-.])(?P<b2>\d{{1,2}})(?P=s)(?P<y2>{_YEAR})){_NUM_END}",
        check=_numeric_date_ok,
        replace=_date_replacement,
    ),
    _rule(
        Category.DATE,
        rf"(?<![\d/.-])(?:0[1-9]|1[0-2])[/-](?P<y>{_YEAR}){_NUM_END}"
        rf"|(?<![\d/.-])(?P<y2>{_YEAR})-(?:0[1-9]|1[0-2]){_NUM_END}",
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
        rf"(?<![\w.])(?P<v>{_AGE})\s*-?\s*(?:years?|yrs?|y)\.?\s*-?\s*"
        rf"(?:old|o\b\.?|of age)|(?<![\w.])(?P<v2>{_AGE})\s*-?\s*(?:y/o|yo[mf]?)\b",
        re.I,
    ),
    _rule(Category.AGE, rf"\bage[ds]?\s*(?:of\s*)?[:=]?\s*(?P<v>{_AGE})(?![\d.]?\d)", re.I),
    _rule(
        Category.AGE,
        r"\bin\s+(?:his|her|their)\s+(?P<v>(?:(?:early|mid|late)[- ]?)?(?:90s|"
        r"nineties|'90s))|\b(?P<v2>(?:nonagenarian|centenarian)s?)\b|\b(?P<v3>(?:ninety|one "
        r"hundred)(?:[- ](?:one|two|three|four|five|six|seven|eight|nine))?)[- ]years?[- ]old",
        re.I,
    ),
    _rule(Category.ZIP, r"(?<![\d-])\d{5}-\d{4}(?![\d-])"),
    _rule(Category.ZIP, rf"\b{_ST_ZIP}\.?,?\s+(?P<v>\d{{5}})(?![\d-])"),
    _rule(
        Category.ZIP,
        r"\b(?:zip(?: ?code)?|postal code|post ?code)\s*[:#]?\s*(?P<v>\d{5}"
        r"|[A-Z]\d[A-Z] ?\d[A-Z]\d|[A-Z]{1,2}\d[A-Z\d]? ?\d[A-Z]{2})\b",
        re.I,
    ),
    _rule(
        Category.ADDRESS,
        rf"(?<![\w.])\d{{1,6}}[A-Za-z]?\s+(?:(?:[NSEW]|North|South|East|West)"
        rf"\.?\s+)?(?:(?:[A-Z][A-Za-z'-]*|\d+(?:st|nd|rd|th))\.?\s+){{1,3}}{_STREET}\b\.?"
        r"(?:\s*,?\s*(?:Apt|Apartment|Suite|Ste|Unit|Floor|Fl|Room|Rm|#)\.?\s*#?\s*[A-Za-z0-9-]+)?",
    ),
    _rule(Category.ADDRESS, r"\b(?:P\.?\s?O\.?\s*Box|Post Office Box)\s*#?\s*\d+", re.I),
    _rule(
        Category.LOCATION,
        rf"(?<![\w-])(?P<v>[A-Z][a-z]+(?:[ -][A-Z][a-z]+){{0,2}}),\s*(?:"
        rf"(?:{_ST_CLEAR})(?![\w-])(?!\s*-?\d{{1,4}}(?!\d))"
        rf"|(?:{_ST_AMBIG})\b(?=\.?,?\s+\d{{5}})|(?:{_STATES}|{_COUNTRIES})\b)",
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
    _rule(Category.NAME, rf"{_TITLE}(?P<v>{_NAMES}|{_CAPS})", adjust=_trim_name),
    _rule(
        Category.NAME,
        rf"(?<![\w'’-])(?P<v>{_NW}(?:\s+(?:[A-Z]\.\s+)?{_NW}){{1,3}}),?\s+"
        rf"{_CREDENTIAL}",
        adjust=_trim_name,
    ),
    _rule(Category.NAME, rf"{_NAME_CUE},?\s+(?:(?:named|called|is)\s+)?(?P<v>{_NAMES})", adjust=_trim_name),
    _rule(Category.NAME, rf"{_BY_CUE}{_OPT_TITLE}(?P<v>{_NAMES})", adjust=_trim_name),
    _rule(Category.NAME, rf"{_ROLE}{_OPT_TITLE}(?P<v>{_NW},\s*{_NAMES}|{_NAMES}|{_CAPS})", adjust=_trim_name),
    _rule(
        Category.NAME,
        rf"\b(?:(?:[Pp]atient|[Ff]ull|[Ff]irst|[Ll]ast|[Gg]iven) )?(?:[Nn]ame|NAME"
        rf"|[Ss]urname)\s*[:=]\s*{_OPT_TITLE}(?P<v>{_NW},\s*{_NAMES}|{_NAMES}|{_CAPS}(?:,\s*"
        rf"{_CAPS})?|[a-z][a-z'-]+(?:\s+[a-z][a-z'-]+)?)",
        adjust=_trim_name,
    ),
)


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
    holders = [m.span() for m in _PLACEHOLDER.finditer(text)]
    candidates: list[tuple[int, int, int, Finding]] = []
    for priority, rule in enumerate(_RULES):
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
