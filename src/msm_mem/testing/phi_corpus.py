"""A generated corpus of clinical sentences with planted identifiers, to measure de-identification.

Each :class:`Sentence` is one clinical finding (from :data:`FINDINGS`) with one to three
identifiers of the HIPAA Safe Harbor categories planted in many forms: names in full, alone,
in lower case, in capitals and as "Surname, Given"; street addresses, cities, ZIP codes; dates
in a dozen formats and ages over 89; telephone and fax numbers formatted and bare; e-mails,
SSNs formatted and bare, record, health-plan, account, licence, vehicle and device numbers
labelled and bare; URLs and IP addresses; other unique ids. Names, places and numbers come
from Faker (the ``test`` extra) in several locales, seeded, so a corpus is the same for the
same ``seed``. Photographs and biometric identifiers (categories P and Q) are not text and are
not planted.

:func:`leaks` says which planted identifiers survive in a system's output: a name, place or
number survives when one of its distinctive parts (words of three letters or more, numbers of
four digits or more, the whole of an e-mail, URL or IP address) is still there; a date when
its day and month are (its year may stay); an age over 89 when its number is.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

__all__ = ["CATEGORIES", "FINDINGS", "Planted", "Sentence", "corpus", "leaks"]

#: the categories planted, in report order (Safe Harbor letters in brackets in the docs)
CATEGORIES: tuple[str, ...] = (
    "name",
    "address",
    "city",
    "zip",
    "date",
    "age",
    "phone",
    "fax",
    "email",
    "ssn",
    "mrn",
    "health_plan",
    "account",
    "license",
    "vehicle",
    "device",
    "url",
    "ip",
    "other_id",
)

#: the clinical content of each sentence (what a de-identifier should keep)
FINDINGS: tuple[str, ...] = (
    "right lower lobe consolidation",
    "small left pleural effusion",
    "bilateral patchy ground-glass opacities",
    "2 cm nodule in the right upper lobe",
    "endotracheal tube 4 cm above the carina",
    "no pneumothorax",
    "mild cardiomegaly with pulmonary edema",
    "improving bilateral infiltrates",
    "left basal atelectasis",
    "interval resolution of the right pleural effusion",
    "diffuse interstitial opacities consistent with pneumonia",
    "stable mediastinal contour",
)

_LOCALES = ("en_US", "en_GB", "de_DE", "es_ES", "pl_PL", "it_IT", "fr_FR")
_SKIP = frozenset("org com net edu gov info biz www http https html htm suite apt unit box the and of".split())
_DATE_FORMATS: tuple[tuple[str, str], ...] = (
    ("%B %d, %Y", "%B %d"),
    ("%d %B %Y", "%d %B"),
    ("%Y-%m-%d", "%m-%d"),
    ("%m/%d/%Y", "%m/%d"),
    ("%m/%d/%y", "%m/%d"),
    ("%d.%m.%Y", "%d.%m"),
    ("%b %d", "%b %d"),
    ("%B %Y", "%B"),
    ("%d %b", "%d %b"),
    ("%b. %d, %Y", "%b. %d"),
    ("%A, %B %d", "%B %d"),
    ("%Y%m%d", "%m%d"),
)


@dataclass(frozen=True, slots=True)
class Planted:
    """One identifier: its category, its text, and the parts whose survival is a leak."""

    category: str
    value: str
    parts: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Sentence:
    """A clinical sentence, the identifiers planted in it, and its clinical finding."""

    text: str
    planted: tuple[Planted, ...]
    finding: str


def _parts(value: str, skip: frozenset[str] = _SKIP) -> tuple[str, ...]:
    out = []
    for token in re.findall(r"[^\W_]+", value):
        low = token.lower()
        if low in skip:
            continue
        if (token.isdigit() and len(token) >= 4) or (not token.isdigit() and len(token) >= 3):
            out.append(token)
    return tuple(dict.fromkeys(out))


class _Maker:
    def __init__(self, seed: int) -> None:
        from faker import Faker

        self.rng = random.Random(seed)
        self.fakers = [Faker(locale) for locale in _LOCALES]
        for i, f in enumerate(self.fakers):
            f.seed_instance(seed * 101 + i)
        from faker.providers.address.en_US import Provider as Address

        self.street_words = frozenset(s.lower() for s in Address.street_suffixes) | _SKIP

    @property
    def fake(self) -> Any:
        return self.fakers[0] if self.rng.random() < 0.5 else self.rng.choice(self.fakers)

    def digits(self, n: int) -> str:
        return "".join(str(self.rng.randrange(10)) for _ in range(n))

    def name(self) -> Planted:
        f = self.fake
        first, last = f.first_name(), f.last_name()
        form = self.rng.randrange(8)
        text = [
            f"{first} {last}",
            last,
            f"{first.lower()} {last.lower()}",
            f"{last}, {first}",
            f"Dr. {last}",
            first,
            last.upper(),
            last.lower(),
        ][form]
        context = self.rng.choice(["per {}", "{} improving", "seen by {}", "discussed with {}", "{} asked"])
        return Planted("name", context.format(text), _parts(text))

    def address(self) -> Planted:
        value = self.fakers[0].street_address()
        return Planted("address", f"lives at {value}", _parts(value, self.street_words))

    def city(self) -> Planted:
        # it_IT's city draws from a set, whose order follows the interpreter's hash seed: left
        # out, so the corpus is the same in every process
        fake = self.fake
        if fake is self.fakers[_LOCALES.index("it_IT")]:
            fake = self.fakers[0]
        value = fake.city()
        context = self.rng.choice(["traveling from {}", "lives in {}", "transferred from {}", "returned from {}"])
        return Planted("city", context.format(value), _parts(value))

    def zip(self) -> Planted:
        value = self.fakers[0].zipcode()
        context = self.rng.choice(["ZIP {}", "zip code {}", "postal code {}", "{}"])
        return Planted("zip", context.format(value), (value,))

    def date(self) -> Planted:
        day = date(2010, 1, 1) + timedelta(days=self.rng.randrange(5000))
        full, part = self.rng.choice(_DATE_FORMATS)
        value = day.strftime(full)
        context = self.rng.choice(["seen on {}", "admitted {}", "{}", "study of {}", "discharged {}"])
        return Planted("date", context.format(value), (day.strftime(part),))

    def age(self) -> Planted:
        n = str(self.rng.randrange(90, 111))
        form = self.rng.choice(["{}-year-old", "{} year old", "aged {}", "age {}", "{} yo"])
        return Planted("age", form.format(n), (n,))

    def phone(self, category: str = "phone") -> Planted:
        a, b, c = self.digits(3), self.digits(3), self.digits(4)
        value = self.rng.choice([f"{a}-{b}-{c}", f"({a}) {b}-{c}", f"{a}{b}{c}", f"{a}.{b}.{c}", f"+1 {a} {b} {c}"])
        label = "fax" if category == "fax" else self.rng.choice(["call", "phone", "tel", "cell", ""])
        return Planted(category, f"{label} {value}".strip(), (c, f"{a}{b}{c}"))

    def email(self) -> Planted:
        value = self.fake.email()
        return Planted("email", f"contact {value}", (value, *_parts(value.split("@")[0])))

    def ssn(self) -> Planted:
        a, b, c = self.digits(3), self.digits(2), self.digits(4)
        value = self.rng.choice([f"{a}-{b}-{c}", f"{a}{b}{c}", f"{a} {b} {c}"])
        label = self.rng.choice(["SSN", "social security number", "ssn:", ""])
        return Planted("ssn", f"{label} {value}".strip(), (c, f"{a}{b}{c}"))

    def labelled(self, category: str, labels: list[str], n: int) -> Planted:
        value = self.rng.choice([self.digits(n), self.fake.bothify("??" + "#" * (n - 2)).upper()])
        label = self.rng.choice(labels)
        return Planted(category, f"{label} {value}".strip(), _parts(value) or (value,))

    def vehicle(self) -> Planted:
        value = self.rng.choice([self.fakers[0].license_plate(), self.fakers[0].vin()])
        return Planted("vehicle", f"{self.rng.choice(['plate', 'VIN', 'car'])} {value}", _parts(value) or (value,))

    def url(self) -> Planted:
        value = self.fake.url() + self.rng.choice(["", f"patients/{self.digits(6)}"])
        return Planted("url", f"see {value}", (value.rstrip("/"),))

    def ip(self) -> Planted:
        value = self.fakers[0].ipv4() if self.rng.random() < 0.7 else self.fakers[0].ipv6()
        return Planted("ip", f"from {value}", (value,))

    def one(self, category: str) -> Planted:
        if category in ("name", "address", "city", "zip", "date", "age", "email", "ssn", "vehicle", "url", "ip"):
            make: Planted = getattr(self, category)()
            return make
        if category in ("phone", "fax"):
            return self.phone(category)
        labels = {
            "mrn": (["MRN", "medical record", "record no.", "chart", ""], 8),
            "health_plan": (["member ID", "health plan", "policy", "insurance no."], 10),
            "account": (["account", "acct", "billing no."], 9),
            "license": (["license", "licence no.", "DL"], 8),
            "device": (["serial", "device ID", "pacemaker SN", "implant lot"], 9),
            "other_id": (["case", "accession", "study ID", "ref", ""], 7),
        }
        choices, n = labels[category]
        return self.labelled(category, choices, n)


def corpus(identifiers: int, *, seed: int = 0) -> list[Sentence]:
    """Sentences holding at least ``identifiers`` planted identifiers, categories in turn."""
    maker = _Maker(seed)
    out: list[Sentence] = []
    planted = 0
    cycle = _cycle(maker.rng)
    while planted < identifiers:
        ids = [maker.one(next(cycle)) for _ in range(maker.rng.randint(1, 3))]
        finding = maker.rng.choice(FINDINGS)
        pieces = [finding, *(p.value for p in ids)]
        maker.rng.shuffle(pieces)
        text = "; ".join(pieces)
        out.append(Sentence(text[0].upper() + text[1:] + ".", tuple(ids), finding))
        planted += len(ids)
    return out


def _cycle(rng: random.Random) -> Iterator[str]:
    while True:
        order = list(CATEGORIES)
        rng.shuffle(order)
        yield from order


def leaks(sentence: Sentence, output: str) -> list[Planted]:
    """The planted identifiers of ``sentence`` that survive in ``output`` (module docstring)."""
    low = output.lower()
    found = []
    for p in sentence.planted:
        for part in p.parts:
            pattern = re.escape(part.lower())
            if re.search(rf"(?<![^\W_]){pattern}(?![^\W_])", low):
                found.append(p)
                break
    return found
