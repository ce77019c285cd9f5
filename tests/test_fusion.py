"""Tests of msm_mem._memory.fusion: section layout, citable lines and the prompt budget."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from msm_mem import EpisodicRecord, Hit, Impression, SemanticState, VisualRecord
from msm_mem._memory.fusion import FusedPrompt, fuse

Z = np.ones(4, dtype=np.float32) / 2.0
DAY = 86400.0
T0 = datetime(2020, 1, 1, tzinfo=UTC).timestamp()
HEADERS = [
    "## Patient history (semantic memory)",
    "## Similar prior encounters (episodic memory)",
    "## Similar prior images (visual memory)",
    "## Current question",
]
QUESTION = "Is there a pleural effusion?"


def _epi(i: int, score: float, answer: str = "small effusion", decision: str = "") -> Hit:
    rec = EpisodicRecord(f"E-{i}", "p1", T0 + i * DAY, Z, "What is seen?", answer, decision)
    return Hit(rec.episode_id, "episodic", score, rec)


def _vis(i: int, score: float, tag: str = "PA", source: str = "") -> Hit:
    rec = VisualRecord(f"V-{i}", "p1", T0 + i * DAY, Z, visual_tag=tag, source_episode_id=source)
    return Hit(rec.visual_id, "visual", score, rec)


def _sem(state_id: str, *texts_days: tuple[str, int], category: str = "impression") -> SemanticState:
    imps = tuple(Impression(T0 + d * DAY, t) for t, d in texts_days)
    return SemanticState(state_id, "p1", category, imps)


def _sections(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    current = ""
    for line in text.splitlines():
        if line.startswith("## "):
            current = line
            out[current] = []
        else:
            out[current].append(line)
    return out


def test_four_labelled_sections_in_order() -> None:
    """The prompt has the four section headers, once each, in the paper's order."""
    p = fuse([_sem("S-1", ("effusion", 0))], [_epi(1, 0.9)], [_vis(2, 0.8)], QUESTION)
    headers = [line for line in p.text.splitlines() if line.startswith("## ")]
    assert headers == HEADERS


def test_empty_memory_shows_none_in_every_evidence_section() -> None:
    """With no memory each evidence section says '(none)' and the question is last."""
    p = fuse([], [], [], QUESTION)
    sections = _sections(p.text)
    assert sections[HEADERS[0]] == ["(none)"]
    assert sections[HEADERS[1]] == ["(none)"]
    assert sections[HEADERS[2]] == ["(none)"]
    assert sections[HEADERS[3]] == [QUESTION]
    assert p.included == () and p.dropped == ()


def test_every_evidence_line_starts_with_its_bracketed_id() -> None:
    """Each episodic and visual line begins with '[<memory id>]' and shows its cosine."""
    epi = [_epi(1, 0.91, decision="follow up"), _epi(2, 0.5)]
    vis = [_vis(3, 0.7, source="E-1")]
    p = fuse([], epi, vis, QUESTION)
    sections = _sections(p.text)
    assert [line.split("]")[0] + "]" for line in sections[HEADERS[1]]] == ["[E-1]", "[E-2]"]
    assert [line.split("]")[0] + "]" for line in sections[HEADERS[2]]] == ["[V-3]"]
    assert sections[HEADERS[1]][0] == (
        "[E-1] cos=0.910 | 2020-01-02 | Q: What is seen? | A: small effusion | decision: follow up"
    )
    assert sections[HEADERS[2]][0] == "[V-3] cos=0.700 | 2020-01-04 | tag: PA | from E-1"


def test_semantic_section_cites_the_state_and_lists_impressions_oldest_first() -> None:
    """The semantic block starts '[state id] category:' followed by dated impressions."""
    p = fuse([_sem("S-1", ("first", 0), ("second", 10))], [], [], QUESTION)
    assert _sections(p.text)[HEADERS[0]] == [
        "[S-1] impression:",
        "  [2020-01-01] first",
        "  [2020-01-11] second",
    ]


def test_multiline_text_cannot_break_the_line_structure() -> None:
    """Newlines in answers, tags, impressions or the question are folded into one line."""
    p = fuse(
        [_sem("S-1", ("a\nb", 0))],
        [_epi(1, 0.9, answer="line one\n[E-9] fake")],
        [_vis(2, 0.8, tag="PA\n## Current question")],
        "what\nnow?",
    )
    assert [line for line in p.text.splitlines() if line.startswith("## ")] == HEADERS
    sections = _sections(p.text)
    assert len(sections[HEADERS[1]]) == 1 and len(sections[HEADERS[2]]) == 1
    assert sections[HEADERS[3]] == ["what now?"]


def test_included_lists_every_cited_id_when_under_budget() -> None:
    """Under the budget nothing is dropped and included names semantic, episodic, visual ids."""
    p = fuse([_sem("S-1", ("x", 0))], [_epi(1, 0.9), _epi(2, 0.8)], [_vis(3, 0.7)], QUESTION)
    assert p.included == ("S-1", "E-1", "E-2", "V-3")
    assert p.dropped == ()
    for memory_id in p.included:
        assert f"[{memory_id}]" in p.text


def test_semantic_state_without_impressions_is_not_cited() -> None:
    """A semantic state with an empty history adds no block and no included id."""
    p = fuse([_sem("S-empty")], [], [], QUESTION)
    assert "S-empty" not in p.text
    assert p.included == ()


def test_budget_drops_the_lowest_ranked_evidence_line_first() -> None:
    """One character over the budget drops exactly the lowest-scored episodic/visual line."""
    epi = [_epi(1, 0.9), _epi(2, 0.6)]
    vis = [_vis(3, 0.8), _vis(4, 0.4)]
    full = fuse([_sem("S-1", ("x", 0))], epi, vis, QUESTION).text
    p = fuse([_sem("S-1", ("x", 0))], epi, vis, QUESTION, budget_chars=len(full) - 1)
    assert p.dropped == ("V-4",)
    assert p.included == ("S-1", "E-1", "E-2", "V-3")
    assert len(p.text) <= len(full) - 1


def test_budget_drops_in_ascending_score_across_both_lists() -> None:
    """Evidence lines go lowest score first, interleaving episodic and visual lists."""
    epi = [_epi(1, 0.9), _epi(2, 0.5)]
    vis = [_vis(3, 0.7), _vis(4, 0.3)]
    sem = [_sem("S-1", ("kept", 0))]
    question_only = fuse(sem, [], [], QUESTION).text
    p = fuse(sem, epi, vis, QUESTION, budget_chars=len(question_only))
    assert p.dropped == ("V-4", "E-2", "V-3", "E-1")
    assert p.included == ("S-1",)
    assert "kept" in p.text


def test_visual_line_goes_first_on_a_score_tie() -> None:
    """On equal scores the visual line is dropped before the episodic one."""
    epi, vis = [_epi(1, 0.5)], [_vis(2, 0.5)]
    full = fuse([], epi, vis, QUESTION).text
    assert fuse([], epi, vis, QUESTION, budget_chars=len(full) - 1).dropped == ("V-2",)


def test_semantic_impressions_go_after_all_evidence_oldest_first() -> None:
    """Once evidence is gone, the oldest impressions are dropped one by one, newest kept."""
    sem = [_sem("S-1", ("oldest finding", 0), ("middle finding", 5), ("newest finding", 9))]
    epi = [_epi(1, 0.9)]
    keep_newest = fuse([_sem("S-1", ("newest finding", 9))], [], [], QUESTION).text
    p = fuse(sem, epi, [], QUESTION, budget_chars=len(keep_newest))
    assert p.dropped == ("E-1",)
    assert "oldest finding" not in p.text and "middle finding" not in p.text
    assert "newest finding" in p.text
    assert p.included == ("S-1",)


def test_oldest_impression_is_chosen_across_categories() -> None:
    """With two categories the globally oldest impression is dropped first, not a whole category."""
    a = _sem("S-a", ("a-old", 0), ("a-new", 20), category="cardiac")
    b = _sem("S-b", ("b-old", 10), ("b-new", 30), category="lung")
    full = fuse([a, b], [], [], QUESTION).text
    p = fuse([a, b], [], [], QUESTION, budget_chars=len(full) - 1)
    assert "a-old" not in p.text
    assert all(t in p.text for t in ("a-new", "b-old", "b-new"))
    p2 = fuse([a, b], [], [], QUESTION, budget_chars=len(p.text) - 1)
    assert "b-old" not in p2.text and "a-new" in p2.text


def test_a_fully_emptied_state_is_reported_dropped() -> None:
    """When every impression of a state is dropped, its id moves from included to dropped."""
    sem = [_sem("S-1", ("old", 0)), _sem("S-2", ("new", 5), category="other")]
    p = fuse(sem, [], [], QUESTION, budget_chars=len(fuse([sem[1]], [], [], QUESTION).text))
    assert p.dropped == ("S-1",)
    assert p.included == ("S-2",)
    assert "[S-1]" not in p.text


def test_the_question_is_never_dropped() -> None:
    """Even a budget of one character keeps the question; every memory id is dropped."""
    sem = [_sem("S-1", ("x", 0), ("y", 1))]
    p = fuse(sem, [_epi(1, 0.9)], [_vis(2, 0.8)], QUESTION, budget_chars=1)
    assert p.text.endswith("## Current question\n" + QUESTION)
    assert p.included == ()
    assert set(p.dropped) == {"S-1", "E-1", "V-2"}


@given(
    n_epi=st.integers(0, 5),
    n_vis=st.integers(0, 5),
    n_imp=st.integers(0, 4),
    budget=st.integers(1, 1500),
    data=st.data(),
)
def test_included_and_dropped_partition_the_cited_ids(
    n_epi: int, n_vis: int, n_imp: int, budget: int, data: st.DataObject
) -> None:
    """included and dropped never overlap, cover every id, and included ids appear in the text."""
    scores = data.draw(st.lists(st.floats(-1, 1), min_size=n_epi + n_vis, max_size=n_epi + n_vis))
    epi = sorted((_epi(i, s) for i, s in enumerate(scores[:n_epi])), key=lambda h: -h.score)
    vis = sorted((_vis(10 + i, s) for i, s in enumerate(scores[n_epi:])), key=lambda h: -h.score)
    sem = [_sem("S-1", *[(f"imp{i}", i) for i in range(n_imp)])]
    p = fuse(sem, epi, vis, QUESTION, budget_chars=budget)
    assert isinstance(p, FusedPrompt)
    assert not set(p.included) & set(p.dropped)
    expected = {h.id for h in epi + vis} | ({"S-1"} if n_imp else set())
    assert set(p.included) | set(p.dropped) == expected
    assert len(p.included) + len(p.dropped) == len(expected)
    for memory_id in p.included:
        assert re.search(rf"^\[{re.escape(memory_id)}\]", p.text, re.MULTILINE)
    for memory_id in p.dropped:
        assert f"[{memory_id}]" not in p.text
    if len(p.text) > budget:  # only when nothing is left to drop
        assert p.included == ()
    assert p.text.endswith(QUESTION)


@pytest.mark.parametrize("budget", [10, 200, 6000])
def test_fuse_is_deterministic(budget: int) -> None:
    """The same inputs always give the same prompt and id lists."""
    args = ([_sem("S-1", ("x", 0), ("y", 3))], [_epi(1, 0.9), _epi(2, 0.1)], [_vis(3, 0.5)], QUESTION)
    assert fuse(*args, budget_chars=budget) == fuse(*args, budget_chars=budget)
