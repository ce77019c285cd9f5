"""Tests for msm_mem.eval.protocol: configurations, phases, modes, feedback, determinism."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path

import pytest

from msm_mem._errors import InvalidInput
from msm_mem.datasets.manifest import ManifestRow
from msm_mem.datasets.synthetic import generate
from msm_mem.eval.metrics import normalize_answer
from msm_mem.eval.protocol import (
    CONFIGS,
    Answered,
    ProtocolRun,
    ProtocolSettings,
    config_flags,
    fingerprint,
    parse_configs,
    run_protocol,
)
from msm_mem.eval.report import summarise
from msm_mem.eval.split import PHASES
from msm_mem.plugins.backbones.nonparametric import EMPTY_ANSWER

pytestmark = pytest.mark.slow

# ---------------------------------------------------------------- configurations


def test_all_is_the_eight_subsets_in_table_order() -> None:
    """ "all" gives the 8 subsets of S, E, V, none first and SEV last."""
    assert parse_configs("all") == CONFIGS == ("none", "S", "E", "V", "SE", "SV", "EV", "SEV")


def test_configs_are_canonicalised_and_ordered() -> None:
    """Letters in any order and case map to S, E, V order; the result follows CONFIGS order."""
    assert parse_configs("ves, e ,None,es") == ("none", "E", "SE", "SEV")


@pytest.mark.parametrize("text", ["X", "SS", "", "S,,E", "all,S"])
def test_bad_configs_are_refused(text: str) -> None:
    """Unknown letters, repeats and empty items raise InvalidInput."""
    with pytest.raises(InvalidInput):
        parse_configs(text)


def test_flags_follow_the_letters() -> None:
    """SV reads semantic and visual memory, not episodic; none reads nothing."""
    assert config_flags("SV") == {"use_sem": True, "use_epi": False, "use_vis": True}
    assert config_flags("none") == {"use_sem": False, "use_epi": False, "use_vis": False}
    with pytest.raises(InvalidInput):
        config_flags("VS")


def test_settings_refuse_unknown_feedback_and_baselines() -> None:
    """Feedback must be truth or none; baselines must be known; something must be evaluated."""
    with pytest.raises(InvalidInput):
        ProtocolSettings(feedback="maybe")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        ProtocolSettings(baselines=("oracle",))
    with pytest.raises(InvalidInput):
        ProtocolSettings(configs=(), baselines=())


# ---------------------------------------------------------------- fingerprint


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> list[ManifestRow]:
    rows, _ = generate(tmp_path_factory.mktemp("syn"), patients=20, studies_per_patient=(2, 4), seed=3, size=64)
    return rows


def test_fingerprint_ignores_folder_and_order_but_not_content(data: list[ManifestRow], tmp_path: Path) -> None:
    """The same set generated elsewhere has the same fingerprint; a changed answer does not."""
    again, _ = generate(tmp_path, patients=20, studies_per_patient=(2, 4), seed=3, size=64)
    assert fingerprint(list(reversed(again))) == fingerprint(data)
    changed = [replace(data[0], answer="something else"), *data[1:]]
    assert fingerprint(changed) != fingerprint(data)


# ---------------------------------------------------------------- runs


@pytest.fixture(scope="module")
def truth(data: list[ManifestRow]) -> ProtocolRun:
    return run_protocol(data, ProtocolSettings(configs=("none", "S", "SEV")), dataset="synthetic")


@pytest.fixture(scope="module")
def blind(data: list[ManifestRow]) -> ProtocolRun:
    return run_protocol(data, ProtocolSettings(configs=("S",), baselines=("copy-prior",), feedback="none"))


def _by(run: ProtocolRun, mode: str, arm: str) -> dict[str, list[Answered]]:
    out: dict[str, list[Answered]] = defaultdict(list)
    for a in run.answers:
        if a.mode == mode and a.arm == arm:
            out[a.phase].append(a)
    return out


def test_online_scores_each_phase_on_its_own_patients(truth: ProtocolRun, data: list[ManifestRow]) -> None:
    """Online WB1..WB4 answer exactly the studies of that phase's patients, in time order; Base
    and validation studies are never answered online."""
    when = {(r.patient_id, r.study_id): r.timestamp for r in data}
    online = _by(truth, "online", "SEV")
    assert list(online) == list(PHASES[1:])
    for phase, patients in zip(PHASES[1:], truth.split.phases[1:], strict=True):
        answered = online[phase]
        assert {a.patient_id for a in answered} == set(patients)
        assert len(answered) == sum(r.patient_id in patients for r in data)
        times = [when[(a.patient_id, a.study_id)] for a in answered]
        assert times == sorted(times)


def test_frozen_scores_the_same_validation_queries_after_every_phase(truth: ProtocolRun) -> None:
    """The frozen probe answers the same validation studies after Base and each of WB1..WB4."""
    frozen = _by(truth, "frozen", "S")
    assert list(frozen) == list(PHASES)
    queries = {phase: [(a.patient_id, a.study_id) for a in answers] for phase, answers in frozen.items()}
    assert all(q == queries["Base"] for q in queries.values())
    assert {p for p, _ in queries["Base"]} == set(truth.split.validation)


def test_every_arm_answers_the_same_queries(truth: ProtocolRun) -> None:
    """Configurations and baselines are scored on identical (mode, phase, study) lists."""
    keys: dict[str, list[tuple[str, str, str, str]]] = defaultdict(list)
    for a in truth.answers:
        keys[a.arm].append((a.mode, a.phase, a.patient_id, a.study_id))
    assert set(keys) == {"none", "S", "SEV", "prior", "copy-prior", "nearest-neighbour", "view"}
    assert len({tuple(v) for v in keys.values()}) == 1


def test_answers_come_before_their_write_back(truth: ProtocolRun) -> None:
    """With only semantic memory a patient's first study has nothing to go on (its own study is
    not yet in memory); the no-memory row is the memory-free model: the training split's
    majority answer, one fixed answer whatever the query."""
    first: dict[tuple[str, str, str], Answered] = {}
    for a in truth.answers:
        if a.arm == "S":
            first.setdefault((a.mode, a.phase, a.patient_id), a)
    assert first and all(a.prediction == EMPTY_ANSWER for a in first.values())
    assert truth.memory_free


def test_no_memory_is_the_training_majority(truth: ProtocolRun, data: list[ManifestRow]) -> None:
    """The ``none`` row answers the most frequent answer of the Base and fine-tune patients'
    rows (the validation patients' answers never count), never the voter's empty answer."""
    training = set(truth.split.phases[0]) | set(truth.split.finetune)
    votes = Counter(normalize_answer(r.answer) for r in data if r.patient_id in training)
    nones = {a.prediction for a in truth.answers if a.arm == "none"}
    assert len(nones) == 1 and EMPTY_ANSWER not in nones
    top = max(votes.values())
    assert normalize_answer(next(iter(nones))) == min(k for k, v in votes.items() if v == top)  # ties: smallest
    assert len(votes) > 1  # more than one answer to choose from, so the check can fail


def _followers(run: ProtocolRun, arm: str) -> list[tuple[Answered, Answered]]:
    """Consecutive (earlier, later) answers of one patient within one mode and phase."""
    seq: dict[tuple[str, str, str], list[Answered]] = defaultdict(list)
    for a in run.answers:
        if a.arm == arm:
            seq[(a.mode, a.phase, a.patient_id)].append(a)
    return [(x, y) for answers in seq.values() for x, y in zip(answers, answers[1:], strict=False)]


def test_truth_feedback_supersedes_the_agents_impression(truth: ProtocolRun) -> None:
    """With feedback, semantic memory holds the signed report: each next answer of a patient is
    the previous study's reference, not the agent's own earlier answer."""
    pairs = _followers(truth, "S")
    assert pairs
    assert all(later.prediction == earlier.reference for earlier, later in pairs)


def test_without_feedback_only_the_agents_own_answers_are_written_back(blind: ProtocolRun) -> None:
    """Without feedback each next semantic-only answer repeats the agent's own answer, and the
    copy-prior baseline copies its own answer, never the reference."""
    for arm in ("S", "copy-prior"):
        pairs = _followers(blind, arm)
        assert pairs
        assert all(later.prediction == earlier.prediction for earlier, later in pairs)
    assert {a.prediction for a in blind.answers if a.arm == "S"} == {EMPTY_ANSWER}


def test_gate_outcomes_are_recorded_for_memory_configurations_only(truth: ProtocolRun) -> None:
    """Agent answers carry written/discarded:<codes>; baselines and the memory-free model carry
    no gate."""
    gates = {a.gate for a in truth.answers if a.arm in CONFIGS and a.arm != "none"}
    assert gates and all(g == "written" or g.startswith("discarded:") for g in gates)
    assert {a.gate for a in truth.answers if a.arm not in CONFIGS or a.arm == "none"} == {""}


def test_same_seed_same_answers_whatever_the_number_of_processes(data: list[ManifestRow], truth: ProtocolRun) -> None:
    """A second run with 2 worker processes gives exactly the same answers."""
    again = run_protocol(data, ProtocolSettings(configs=("none", "S", "SEV")), dataset="synthetic", jobs=2)
    assert again.answers == truth.answers
    assert again.data == truth.data


def test_unlabelled_rows_are_left_out(data: list[ManifestRow]) -> None:
    """Rows with an empty answer are not scored; nothing labelled at all is an error."""
    run = run_protocol([replace(data[0], answer=""), *data[1:]], ProtocolSettings(configs=(), baselines=("prior",)))
    assert (data[0].patient_id, data[0].study_id) not in {(a.patient_id, a.study_id) for a in run.answers}
    assert run.data["rows"] == len(data) and run.data["labelled"] == len(data) - 1
    with pytest.raises(InvalidInput):
        run_protocol([replace(r, answer="") for r in data])


# ---------------------------------------------------------------- question groups

EFFUSION = "Is there a pleural effusion?"


def _two_questions(data: list[ManifestRow]) -> list[ManifestRow]:
    """The impression (text) and a yes/no question about each study, answered from it."""
    asked = [
        replace(r, question=EFFUSION, answer="yes" if "effusion" in r.answer else "no", question_type="yes_no")
        for r in data
    ]
    return [*data, *asked]


def test_each_question_group_has_its_own_memory_and_one_split(data: list[ManifestRow], tmp_path: Path) -> None:
    """Two questions per study: every answer names its group, the groups share the patient split
    and probe the same studies, and a yes/no answer comes only from yes/no memories (never an
    impression of the other question)."""
    rows = _two_questions(data)
    run = run_protocol(
        rows, ProtocolSettings(configs=("SEV",), baselines=("copy-prior",)), dataset="two", keep_stores=tmp_path
    )
    groups = {(a.question_type, a.question) for a in run.answers}
    assert groups == {("yes_no", EFFUSION), ("text", data[0].question)}
    probed = {
        g: {(a.mode, a.phase, a.arm, a.study_id) for a in run.answers if (a.question_type, a.question) == g}
        for g in groups
    }
    assert probed[("yes_no", EFFUSION)] == probed[("text", data[0].question)]
    yes_no = {a.prediction for a in run.answers if a.question_type == "yes_no"}
    assert yes_no <= {"yes", "no", EMPTY_ANSWER} and {"yes", "no"} <= yes_no
    fold = run.data["folds"][0]  # type: ignore[index]
    assert [q["question_type"] for q in fold["questions"]] == ["yes_no", "text"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q0-yes_no", "q1-text"]
    assert (tmp_path / "q0-yes_no" / "SEV").is_dir()
    single = run_protocol(data, ProtocolSettings(configs=(), baselines=("copy-prior",)))
    assert single.split == run.split  # the split is by patient, whatever the questions


def test_too_few_patients_is_a_clear_error(data: list[ManifestRow]) -> None:
    """Two labelled patients cannot be split into memory, fine-tune and validation."""
    two = [r for r in data if r.patient_id in sorted({r.patient_id for r in data})[:2]]
    with pytest.raises(InvalidInput, match="at least 3 labelled patients, got 2"):
        run_protocol(two)


def test_evidence_recall_is_recorded_for_memory_configurations(truth: ProtocolRun) -> None:
    """Each answer knows its patient's prior study in the probe and the studies its evidence is
    about; the full memory's evidence reaches the prior, no memory reaches nothing, and every
    memory configuration's record carries recall@k (baselines none)."""
    sev = [a for a in truth.answers if a.arm == "SEV" and a.prior]
    assert sev and all(a.prior in a.retrieved for a in sev)
    assert all(a.retrieved == () for a in truth.answers if a.arm == "none")
    assert {a.prior for a in truth.answers if a.arm not in CONFIGS} == {""}
    for rec in summarise(truth, n_boot=10):
        if rec["kind"] == "memory":
            assert rec["evidence_recall"]["n"] > 0
        else:
            assert rec["kind"] != "memory-free" or rec["arm"] == "none"
            assert "evidence_recall" not in rec


def test_structured_gate_admits_short_label_answers(data: list[ManifestRow]) -> None:
    """Label answers never pass the paper's gate (too short, often no keyword); with the
    structured gate the novel ones are written, and the reasons say so."""
    from msm_mem._settings import Settings

    labels = [replace(r, answer="COVID-19" if int(r.patient_id[-1]) % 2 else "Pneumonia") for r in data]
    settings = ProtocolSettings(configs=("SEV",), baselines=())
    paper = run_protocol(labels, settings)
    structured = run_protocol(labels, settings, memory=Settings(structured_gate=True))
    online = [a.gate for a in paper.answers if a.mode == "online"]
    assert online and all(g.startswith("discarded:") and "answer_too_short" in g for g in online)
    written = [a.gate for a in structured.answers if a.mode == "online" and a.gate == "written"]
    assert written and structured.memory_settings.structured_gate


def test_cross_validated_folds_probe_every_patient_once(data: list[ManifestRow]) -> None:
    """With 3 folds each fold runs the protocol on its own split: the frozen probe of each fold
    answers that fold's validation patients only, every patient is probed in exactly one fold,
    and a fold's validation patients never sit in its memory."""
    run = run_protocol(data, ProtocolSettings(configs=("SEV",), baselines=("copy-prior",), folds=3))
    assert [s.fold for s in run.splits] == [0, 1, 2] and len(run.data["folds"]) == 3  # type: ignore[arg-type]
    probed: dict[str, set[int]] = defaultdict(set)
    for a in run.answers:
        split = run.splits[a.fold]
        if a.mode == "frozen":
            assert a.patient_id in split.validation
            probed[a.patient_id].add(a.fold)
        else:
            assert a.patient_id in split.memory and a.patient_id not in split.validation
    assert set(probed) == {r.patient_id for r in data} and all(len(f) == 1 for f in probed.values())
    with pytest.raises(InvalidInput, match="folds"):
        run.split  # noqa: B018
