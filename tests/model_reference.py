"""The reference model of ``tests/test_model.py``: what the store should hold after each step,
predicted from the documented rules alone (the gate, supersession, the short-term lifecycle,
retention from the patient's last activity), never from the implementation."""

from __future__ import annotations

from dataclasses import dataclass, field

from msm_mem import claim_key
from tests import strategies as s

T0 = 1_700_000_000.0
DAY = 86_400.0
#: every interaction of a study shares the study's UTC time
STUDY_TIME = {"S1": T0 - 90 * DAY, "S2": T0 - 60 * DAY, "S3": T0 - 30 * DAY}

# the documented retention rule (docs/design.md, "Retention"): a long-term record decays at
# the sweep once its patient's last activity (the newest write among the patient's active and
# superseded long-term records) plus retention x confidence x tier weight has passed; the
# retention's default is ten years; a semantic version keeps the whole retention. The clinical
# time plays no part.
TIER_WEIGHT = {"ground_truth": 1.0, "critic": 0.95, "agent": 0.6}
RETENTION = 10 * 365.25 * DAY
STM_TTL = 86_400.0
AGE_THRESHOLD = 3600.0
HISTORY = 5
K = 5  # hits per episodic / visual read


def keeps(confidence: float, tier: str) -> float:
    """How long a record is kept after its patient's last activity (seconds)."""
    return RETENTION * (confidence * TIER_WEIGHT[tier])


# the model ----------------------------------------------------------------------------------


@dataclass(eq=False)
class Epi:
    qid: int
    image: int
    study: str
    answer: str
    tier: str
    keep: float
    created: float
    state: str = "active"
    question: str = ""


@dataclass(eq=False)
class Vis:
    image: int
    tier: str
    keep: float
    created: float
    episode: Epi | None = None
    state: str = "active"


@dataclass(eq=False)
class Clm:
    key: str
    content: str
    tier: str
    keep: float
    created: float
    qid: int
    episode: Epi | None
    time: float | None = None  # the study's clinical time, when the claim knows it
    state: str = "active"


@dataclass(eq=False)
class Sem:
    version: int
    impressions: tuple[tuple[float, str], ...]
    tier: str
    created: float
    state: str = "active"

    @property
    def keep(self) -> float:
        return RETENTION


@dataclass(eq=False)
class Stm:
    qid: int
    image: int
    study: str
    created: float
    answer: str | None = None
    state: str = "active"
    question: str = ""

    @property
    def payload(self) -> bool:
        return self.state == "active"


@dataclass
class Patient:
    episodes: list[Epi] = field(default_factory=list)
    visuals: list[Vis] = field(default_factory=list)
    claims: list[Clm] = field(default_factory=list)
    semantic: list[Sem] = field(default_factory=list)
    stm: list[Stm] = field(default_factory=list)
    shredded: bool = False

    def live_images(self) -> set[int]:
        """The images of the patient's live (active) records: what novelty compares against."""
        return {e.image for e in self.episodes if e.state == "active"} | {
            v.image for v in self.visuals if v.state == "active"
        }

    def active_semantic(self) -> Sem | None:
        return next((v for v in self.semantic if v.state == "active"), None)

    def active_claim(self, key: str) -> Clm | None:
        return next((c for c in self.claims if c.key == key and c.state == "active"), None)


class Model:
    """What the store should hold, from the documented rules alone."""

    def __init__(self) -> None:
        self.now = T0
        self.patients = {p: Patient() for p in s.PATIENTS}
        self.permits: dict[tuple[str, str], str | None] = {}
        self.next_qid = 0
        #: the question text of each claim key the model made
        self.key_questions: dict[str, str] = {}

    def qid(self) -> int:
        self.next_qid += 1
        return self.next_qid

    def novel(self, p: str, image: int) -> bool:
        return image not in self.patients[p].live_images()

    def passes(self, p: str, image: int, answer: str) -> bool:
        return self.novel(p, image) and s.ANSWERS[answer]

    def write_records(
        self, p: str, item: Stm, answer: str, tier: str, confidence: float, *, visual: bool = True
    ) -> Epi:
        pt = self.patients[p]
        epi = Epi(item.qid, item.image, item.study, answer, tier, keeps(confidence, tier), self.now)
        epi.question = item.question
        pt.episodes.append(epi)
        if visual:  # another question about a study whose image has a visual record shares it
            pt.visuals.append(Vis(item.image, tier, keeps(confidence, tier), self.now, epi))
        item.state, item.answer = "consolidated", None
        return epi

    def supersede_semantic(
        self, p: str, impression: tuple[float, str], tier: str, *, drop: tuple[float | None, set[str]] | None = None
    ) -> None:
        """A new semantic version with ``impression``; ``drop`` (time, texts): the impressions
        of those texts at that time go (a verdict's judged answers)."""
        pt = self.patients[p]
        current = pt.active_semantic()
        previous = current.impressions if current else ()
        kept = [i for i in previous if drop is None or not (i[0] == drop[0] and i[1] in drop[1])]
        merged = tuple(sorted([*kept, impression], key=lambda i: i[0])[-HISTORY:])
        if current:
            current.state = "superseded"
        pt.semantic.append(Sem(current.version + 1 if current else 1, merged, tier, self.now))

    def supersede_claim(
        self,
        p: str,
        key: str,
        content: str,
        tier: str,
        confidence: float,
        qid: int,
        epi: Epi | None,
        when: float | None,
    ):
        pt = self.patients[p]
        old = pt.active_claim(key)
        if old:
            old.state = "superseded"
        claim = Clm(key, content, tier, keeps(confidence, tier), self.now, qid, epi)
        claim.time = when
        pt.claims.append(claim)
        return claim

    def consolidate(self, p: str, item: Stm, answer: str) -> bool:
        """STM -> LTM through the gate (agent tier): a written answer supersedes the semantic
        state and its question's claim; a held one keeps its answer in STM and nothing else."""
        if not self.passes(p, item.image, answer):
            item.answer = answer  # a held item keeps its answer for the critic or the age sweep
            return False
        self.derive(p, item, answer, self.write_records(p, item, answer, "agent", 0.6))
        return True

    def derive(self, p: str, item: Stm, answer: str, epi: Epi) -> None:
        """What a written agent answer supersedes: the semantic state and its question's claim."""
        when = STUDY_TIME[item.study]
        self.supersede_semantic(p, (when, answer), "agent")
        key = claim_key(item.study, item.question)
        self.key_questions[key] = item.question
        self.supersede_claim(p, key, answer, "agent", 0.6, item.qid, epi, when)

    def studies_stored(self, p: str) -> set[str]:
        return {e.study for e in self.patients[p].episodes}

    def questions_stored(self, p: str) -> set[tuple[str, int]]:
        """(study, question) of the patient's readable (active or superseded) episodes."""
        return {(e.study, e.qid) for e in self.patients[p].episodes if e.state in ("active", "superseded")}

    def study_qid(self, study: str) -> int:
        """The one question a manifest asks about ``study`` here (so re-ingesting it is skipped)."""
        return 10_000 + s.STUDIES.index(study)

    def maintain(self) -> dict[str, int]:
        counts = dict.fromkeys(("expired", "consolidated", "discarded", "anonymized", "retracted"), 0)
        for pt in self.patients.values():
            for item in pt.stm:
                if item.state == "active" and item.created + STM_TTL <= self.now:
                    item.state, item.answer = "expired", None
                    counts["expired"] += 1
        for p, pt in self.patients.items():
            for item in sorted(pt.stm, key=lambda i: i.created):
                if item.state != "active" or item.answer is None or item.created > self.now - AGE_THRESHOLD:
                    continue
                if self.passes(p, item.image, item.answer):
                    answer = item.answer
                    self.derive(p, item, answer, self.write_records(p, item, answer, "agent", 0.6))
                    counts["consolidated"] += 1
                else:
                    item.state, item.answer = "discarded", None
                    counts["discarded"] += 1
        for pt in self.patients.values():
            if pt.shredded:
                continue
            tables = (pt.episodes, pt.visuals, pt.claims, pt.semantic)
            live = [r for records in tables for r in records if r.state in ("active", "superseded")]
            if not live:
                continue
            last = max(r.created for r in live)  # decided once per sweep, after consolidation
            for records in tables:
                for r in list(records):
                    if r.state in ("active", "superseded") and last + r.keep <= self.now:
                        active = r.state == "active" and not isinstance(r, Sem)
                        counts["anonymized" if active else "retracted"] += 1
                        records.remove(r)  # either way it leaves the patient (no patient id any more)
        return counts
