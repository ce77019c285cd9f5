"""Tests of the clinical commands (ask, retrieve, observe, consolidate, feedback) and the reads
(show ...) of msm_mem.interfaces.cli, run in-process with explicit principals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from msm_mem._memory.claim_evidence import claim_key
from tests.cli_support import (
    AGENT,
    AUDITOR,
    CLINICIAN,
    CRITIC,
    QUESTION,
    SYSTEM,
    counts,
    one_line_error,
    png,
    run,
    run_json,
)

KINDS = {"episodic", "visual", "semantic", "claim"}  # claims are read with semantic memory
ANSWER = "Small left pleural effusion, new since the prior study"


#: settings and identity come from MSM_MEM_* variables: every test starts without any
pytestmark = pytest.mark.usefixtures("clean_msm_env")


def _ask_args(data: Path, patient: str = "p1", image: str = "img1.png") -> list[str | Path]:
    return ["--patient", patient, "--image", data / image, "--question", QUESTION, *AGENT]


def _obj(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> dict[str, Any]:
    obj = run_json(capsys, *argv)
    assert isinstance(obj, dict)
    return obj


def _list(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> list[dict[str, Any]]:
    obj = run_json(capsys, *argv)
    assert isinstance(obj, list)
    return obj


# ask ------------------------------------------------------------------------------------------


def test_ask_json_prints_one_object_with_the_documented_keys(
    capsys: pytest.CaptureFixture[str], cli_store: Path, cli_data: Path
) -> None:
    """ask --json prints exactly one JSON object: answer, evidence [{id, kind, score}], gate."""
    obj = _obj(capsys, "ask", cli_store, *_ask_args(cli_data))
    assert {"answer", "evidence", "gate", "backbone", "source", "decision"} <= set(obj)
    assert isinstance(obj["answer"], str) and obj["answer"]
    assert isinstance(obj["evidence"], list) and obj["evidence"]
    for item in obj["evidence"]:
        assert {"id", "kind", "score", "cosine", "confidence", "freshness", "tier_weight"} <= set(item)
        assert isinstance(item["id"], str) and item["id"]
        assert item["kind"] in KINDS
        assert isinstance(item["score"], float | int)
    assert {e["kind"] for e in obj["evidence"]} >= {"episodic", "visual"}
    gate = obj["gate"]
    assert set(gate) == {"written", "reasons"}
    assert isinstance(gate["written"], bool)
    assert gate["reasons"] and all(isinstance(r, str) for r in gate["reasons"])


def test_ask_json_finds_the_same_image_first(
    capsys: pytest.CaptureFixture[str], cli_store: Path, cli_data: Path
) -> None:
    """Asking about an ingested image ranks that study's episodic record first."""
    studies = {e["episode_id"]: e["study_id"] for e in _list(capsys, "show", "episodes", cli_store, "--patient", "p1")}
    for image, study in (("img0.png", "s1"), ("img1.png", "s2")):
        obj = _obj(capsys, "ask", cli_store, *_ask_args(cli_data, "p1", image), "--no-write-back")
        episodic = [e for e in obj["evidence"] if e["kind"] == "episodic"]
        assert episodic, obj
        assert episodic[0]["score"] == max(e["score"] for e in episodic)
        assert studies[episodic[0]["id"]] == study


def test_ask_image_study_answers_as_the_studys_image_does(
    capsys: pytest.CaptureFixture[str], cli_store: Path, cli_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ask --image-study STUDY answers with the same evidence as --image of that study's file,
    from any working directory; observe --image-study records the study's image."""
    monkeypatch.chdir(tmp_path)  # not the folder ingest ran in
    common = ["--patient", "p1", "--question", QUESTION, "--time", "2020-03-01", "--no-write-back", *AGENT]
    by_file = _obj(capsys, "ask", cli_store, "--image", cli_data / "img1.png", *common)
    by_study = _obj(capsys, "ask", cli_store, "--image-study", "s2", *common)
    assert by_study["answer"] == by_file["answer"]
    assert [(e["id"], e["score"]) for e in by_study["evidence"]] == [(e["id"], e["score"]) for e in by_file["evidence"]]
    item = _obj(capsys, "observe", cli_store, "--patient", "p1", "--image-study", "s2", "--question", QUESTION, *AGENT)
    assert item["payload"]["media_path"] == str(cli_data / "img1.png")
    ranked = _obj(capsys, "retrieve", cli_store, "--patient", "p1", "--image-study", "s2", *AGENT)
    assert ranked["evidence"][0]["record"]["study_id"] == "s2"


def test_ask_needs_exactly_one_of_image_and_image_study(
    capsys: pytest.CaptureFixture[str], cli_store: Path, cli_data: Path
) -> None:
    """Neither or both of --image and --image-study is a usage error (2); a study the patient
    does not have is a one-line error (1) and writes nothing."""
    before = counts(cli_store)
    base = ["--patient", "p1", "--question", QUESTION, *AGENT]
    rc, _, err = run(capsys, "ask", cli_store, *base)
    assert rc == 2 and "--image" in err
    rc, _, err = run(capsys, "ask", cli_store, *base, "--image", cli_data / "img1.png", "--image-study", "s2")
    assert rc == 2 and "not allowed with argument" in err
    rc, _, err = run(capsys, "ask", cli_store, *base, "--image-study", "s9")
    assert rc == 1 and "no stored study" in one_line_error(err)
    assert counts(cli_store) == before


def test_ask_no_write_back_has_no_gate_and_changes_nothing(
    capsys: pytest.CaptureFixture[str], cli_store: Path, cli_data: Path
) -> None:
    """--no-write-back gives gate null and leaves every memory table unchanged."""
    before = counts(cli_store)
    obj = _obj(capsys, "ask", cli_store, *_ask_args(cli_data), "--no-write-back")
    assert obj["gate"] is None
    assert counts(cli_store) == before


def test_ask_text_shows_answer_evidence_and_gate(
    capsys: pytest.CaptureFixture[str], cli_store: Path, cli_data: Path
) -> None:
    """Plain ask prints the answer, every evidence id with its kind, and the gate line."""
    expected = _obj(capsys, "ask", cli_store, *_ask_args(cli_data), "--no-write-back")
    rc, out, _ = run(capsys, "ask", cli_store, *_ask_args(cli_data))
    assert rc == 0
    assert out.startswith(f"answer: {expected['answer']}")
    assert "evidence:" in out
    for item in expected["evidence"]:
        if item["kind"] != "semantic":  # semantic state ids change with each write-back
            assert any(item["id"] in line and item["kind"] in line for line in out.splitlines())
    assert "\ngate: " in out


def test_ask_as_the_configured_identity_acts_as_an_agent(
    capsys: pytest.CaptureFixture[str], cli_store: Path, cli_data: Path
) -> None:
    """Without principal flags, ask acts as the store's identity (admin-1) in its default role
    (agent); an explicit auditor is refused and writes nothing."""
    args = ["--patient", "p1", "--image", cli_data / "img1.png", "--question", QUESTION, "--no-write-back"]
    assert _obj(capsys, "ask", cli_store, *args)["answer"]
    rc, _, err = run(capsys, "ask", cli_store, *args, *AUDITOR)
    assert rc == 1 and "may not ask" in one_line_error(err)


def test_env_settings_reach_the_gate(
    capsys: pytest.CaptureFixture[str], cli_store: Path, cli_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MSM_MEM_MIN_ANSWER_WORDS is honoured by ask: raised to 50, the answer is 'too short'."""
    default = _obj(capsys, "ask", cli_store, *_ask_args(cli_data))
    assert len(default["answer"].split()) < 50
    assert "answer_too_short" not in default["gate"]["reasons"]
    monkeypatch.setenv("MSM_MEM_MIN_ANSWER_WORDS", "50")
    strict = _obj(capsys, "ask", cli_store, *_ask_args(cli_data))
    assert "answer_too_short" in strict["gate"]["reasons"]
    assert strict["gate"]["written"] is False


def test_bad_env_setting_is_a_one_line_error(
    capsys: pytest.CaptureFixture[str], cli_store: Path, cli_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unparseable MSM_MEM_ variable makes ask exit 1 with one error line naming it."""
    monkeypatch.setenv("MSM_MEM_TOP_K", "many")
    before = counts(cli_store)
    rc, _, err = run(capsys, "ask", cli_store, *_ask_args(cli_data))
    assert rc == 1
    assert "MSM_MEM_TOP_K" in one_line_error(err)
    assert counts(cli_store) == before


def test_unknown_patient_gets_a_prior_not_an_error(
    capsys: pytest.CaptureFixture[str], cli_store: Path, cli_data: Path
) -> None:
    """A patient with no memory still gets an answer (population prior or 'No prior evidence')."""
    before = counts(cli_store)
    obj = _obj(capsys, "ask", cli_store, *_ask_args(cli_data, patient="nobody"), "--no-write-back")
    if obj.get("source") == "population-prior":  # the other patients it came from are the evidence
        assert obj["evidence"] and {e["kind"] for e in obj["evidence"]} <= {"population-episodic", "population-visual"}
    else:
        assert obj["evidence"] == []
        assert obj.get("source") == "empty" or "No prior evidence" in obj["answer"]
    assert obj["answer"]
    assert counts(cli_store) == before


def test_unknown_patient_in_an_empty_store_says_no_prior_evidence(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, cli_data: Path
) -> None:
    """With nothing in memory at all the answer says there is no prior evidence."""
    assert run(capsys, "init", tmp_path / "s", "--actor", "admin-1")[0] == 0
    obj = _obj(capsys, "ask", tmp_path / "s", *_ask_args(cli_data, patient="nobody"), "--no-write-back")
    assert "No prior evidence" in obj["answer"]
    assert obj["evidence"] == []


def test_ask_on_a_directory_that_is_not_a_store(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, cli_data: Path
) -> None:
    """ask on a plain directory exits 1 with one error line and creates nothing there."""
    plain = tmp_path / "plain"
    plain.mkdir()
    rc, out, err = run(capsys, "ask", plain, *_ask_args(cli_data))
    assert rc == 1
    assert "not an msm-mem store" in one_line_error(err)
    assert out == ""
    assert list(plain.iterdir()) == []


@pytest.mark.parametrize("image", ["corrupt.png", "absent.png"])
def test_ask_with_a_bad_image_fails_and_writes_nothing(
    capsys: pytest.CaptureFixture[str], cli_store: Path, cli_data: Path, image: str
) -> None:
    """A corrupt or missing image exits 1 with one error line naming it; the store is unchanged."""
    before = counts(cli_store)
    rc, out, err = run(capsys, "ask", cli_store, *_ask_args(cli_data, image=image))
    assert rc == 1
    assert image in one_line_error(err)
    assert out == ""
    assert counts(cli_store) == before


def test_ask_with_an_empty_question_fails(capsys: pytest.CaptureFixture[str], cli_store: Path, cli_data: Path) -> None:
    """A blank question exits 1 with one error line and writes nothing."""
    before = counts(cli_store)
    rc, _, err = run(
        capsys, "ask", cli_store, "--patient", "p1", "--image", cli_data / "img1.png", "--question", "  ", *AGENT
    )
    assert rc == 1
    one_line_error(err)
    assert counts(cli_store) == before


# retrieve -------------------------------------------------------------------------------------


def test_retrieve_ranks_like_ask_and_writes_no_memory(
    capsys: pytest.CaptureFixture[str], cli_store: Path, cli_data: Path
) -> None:
    """retrieve --json gives the evidence ask would cite from S, E and V (same ids, same scores;
    retrieve lists no claims) with the patient's own records, and writes no memory; the text
    form lists every id."""
    before = counts(cli_store)
    asked = _obj(capsys, "ask", cli_store, *_ask_args(cli_data), "--no-write-back")
    found = _obj(capsys, "retrieve", cli_store, "--patient", "p1", "--image", cli_data / "img1.png", *CLINICIAN)
    assert found["patient"] == "p1" and found["scope"] == "patient"
    ids = {e["id"]: e["score"] for e in found["evidence"]}
    for e in asked["evidence"]:
        if e["kind"] != "claim":
            assert ids[e["id"]] == pytest.approx(e["score"], abs=1e-4)
    for e in found["evidence"]:
        assert e["record"] is not None and e["record"]["patient_id"] == "p1" and "z" not in e["record"]
    assert counts(cli_store) == before
    rc, out, _ = run(capsys, "retrieve", cli_store, "--patient", "p1", "--image", cli_data / "img1.png", *AGENT)
    assert rc == 0 and all(i in out for i in ids)


def test_retrieve_population_withholds_other_patients(
    capsys: pytest.CaptureFixture[str], cli_store: Path, cli_data: Path
) -> None:
    """--scope population may rank other patients' records, but never hands out their content."""
    found = _obj(
        capsys,
        "retrieve",
        cli_store,
        "--patient",
        "p1",
        "--image",
        cli_data / "img2.png",
        "--scope",
        "population",
        *AGENT,
    )
    assert found["scope"] == "population"
    for e in found["evidence"]:
        assert e["record"] is None or e["record"].get("patient_id") in ("p1", "")


def test_retrieve_by_an_auditor_is_refused(capsys: pytest.CaptureFixture[str], cli_store: Path, cli_data: Path) -> None:
    """The auditor reads no patient data: retrieve exits 1 with one error line."""
    rc, _, err = run(capsys, "retrieve", cli_store, "--patient", "p1", "--image", cli_data / "img1.png", *AUDITOR)
    assert rc == 1 and "may not retrieve" in one_line_error(err)


# observe, consolidate, feedback ---------------------------------------------------------------


def test_observe_then_consolidate_writes_through_the_gate(
    capsys: pytest.CaptureFixture[str], cli_store: Path, tmp_path: Path
) -> None:
    """observe puts an active item in STM (shown by show stm); consolidate moves it into
    long-term memory through the gate (a new episode and visual record, a new semantic
    version) and the item is no longer active."""
    image = png(tmp_path / "new.png", 99)
    before = counts(cli_store)
    item = _obj(capsys, "observe", cli_store, "--patient", "p1", "--image", image, "--question", "Effusion?", *AGENT)
    assert item["item_id"].startswith("M-") and item["state"] == "active" and item["expires_at"] > item["created_at"]
    assert "z" not in item
    active = _list(capsys, "show", "stm", cli_store, "--patient", "p1", "--state", "active", *CLINICIAN)
    assert [i["item_id"] for i in active] == [item["item_id"]]
    result = _obj(
        capsys, "consolidate", cli_store, "--patient", "p1", "--item", item["item_id"], "--answer", ANSWER, *AGENT
    )
    assert result["gate"]["written"] is True
    assert result["episode_id"] and result["visual_id"] and result["semantic_id"]
    after = counts(cli_store)
    assert after["episodic"] == before["episodic"] + 1 and after["visual"] == before["visual"] + 1
    assert _list(capsys, "show", "stm", cli_store, "--patient", "p1", "--state", "active", *CLINICIAN) == []
    episodes = _list(capsys, "show", "episodes", cli_store, "--patient", "p1", *CLINICIAN)
    assert any(e["episode_id"] == result["episode_id"] and e["answer"] == ANSWER for e in episodes)
    rc, _, err = run(
        capsys, "consolidate", cli_store, "--patient", "p1", "--item", item["item_id"], "--answer", ANSWER, *AGENT
    )
    assert rc == 1 and "not active" in one_line_error(err)


def test_observe_text_prints_the_item_and_its_expiry(
    capsys: pytest.CaptureFixture[str], cli_store: Path, cli_data: Path
) -> None:
    """observe without --json prints the item id, its state and its expiry time."""
    rc, out, _ = run(
        capsys, "observe", cli_store, "--patient", "p2", "--image", cli_data / "img2.png", "--question", "?", *AGENT
    )
    assert rc == 0
    item_id, state, word, _ = out.split()
    assert item_id.startswith("M-") and state == "active" and word == "expires"


def test_consolidate_an_unknown_item_fails(capsys: pytest.CaptureFixture[str], cli_store: Path) -> None:
    """consolidate of an item that is not the patient's exits 1 and writes nothing."""
    before = counts(cli_store)
    rc, _, err = run(
        capsys, "consolidate", cli_store, "--patient", "p1", "--item", "M-nope", "--answer", ANSWER, *SYSTEM
    )
    assert rc == 1 and "M-nope" in one_line_error(err)
    assert counts(cli_store) == before


def test_feedback_supersedes_the_claim_and_the_semantic_state(
    capsys: pytest.CaptureFixture[str], cli_store: Path, cli_data: Path
) -> None:
    """An ask with --study leaves an agent claim; feedback --correction by a critic supersedes
    it at the critic's tier, and the semantic history grows by a version that names its
    predecessor; feedback by an agent is refused."""
    question = ["--patient", "p1", "--image", cli_data / "img3.png", "--question", QUESTION, "--study", "s9", *AGENT]
    assert run(capsys, "ask", cli_store, *question)[0] == 0
    (agent_claim,) = _list(
        capsys, "show", "claims", cli_store, "--patient", "p1", "--key", claim_key("s9", QUESTION), *CLINICIAN
    )
    assert agent_claim["evidence_tier"] == "agent"
    history = _list(capsys, "show", "history", cli_store, "--patient", "p1", *CLINICIAN)
    fix = ["--patient", "p1", "--study", "s9", "--correction", "Right lower lobe pneumonia"]
    rc, _, err = run(capsys, "feedback", cli_store, *fix, *AGENT)
    assert rc == 1 and "may not feedback" in one_line_error(err)
    claim = _obj(capsys, "feedback", cli_store, *fix, *CRITIC)
    assert claim["content"] == "Right lower lobe pneumonia" and claim["evidence_tier"] == "critic"
    assert claim["supersedes"] == agent_claim["claim_id"]
    chain = _list(
        capsys,
        "show",
        "claims",
        cli_store,
        "--patient",
        "p1",
        "--key",
        claim_key("s9", QUESTION),
        "--history",
        *CLINICIAN,
    )
    assert [c["claim_id"] for c in chain] == [agent_claim["claim_id"], claim["claim_id"]]
    assert [c["state"] for c in chain] == ["superseded", "active"]
    newer = _list(capsys, "show", "history", cli_store, "--patient", "p1", *CLINICIAN)
    assert len(newer) == len(history) + 1
    assert newer[-1]["supersedes"] == newer[-2]["state_id"] and newer[-1]["evidence_tier"] == "critic"
    (state,) = _list(capsys, "show", "state", cli_store, "--patient", "p1", *CLINICIAN)
    assert state["state_id"] == newer[-1]["state_id"]
    assert any(i["text"] == "Right lower lobe pneumonia" for i in state["impressions"])


def test_feedback_accept_and_text_output(capsys: pytest.CaptureFixture[str], cli_store: Path, cli_data: Path) -> None:
    """feedback --accept keeps the impression and prints the new claim's id and key."""
    question = ["--patient", "p2", "--image", cli_data / "img2.png", "--question", QUESTION, "--study", "s7", *AGENT]
    assert run(capsys, "ask", cli_store, *question)[0] == 0
    rc, out, _ = run(capsys, "feedback", cli_store, "--patient", "p2", "--study", "s7", "--accept", *CLINICIAN)
    assert rc == 0 and out.startswith("C-") and claim_key("s7", QUESTION) in out
    rc, _, err = run(capsys, "feedback", cli_store, "--patient", "p2", "--study", "nope", "--accept", *CRITIC)
    assert rc == 1 and "nope" in one_line_error(err)


# show -----------------------------------------------------------------------------------------


def test_show_text_forms(capsys: pytest.CaptureFixture[str], cli_store: Path) -> None:
    """Each show command prints the patient's records, one header line each with its id."""
    episodes = _list(capsys, "show", "episodes", cli_store, "--patient", "p1", *CLINICIAN)
    visuals = _list(capsys, "show", "visuals", cli_store, "--patient", "p1", *CLINICIAN)
    states = _list(capsys, "show", "state", cli_store, "--patient", "p1", *CLINICIAN)
    assert len(episodes) == 2 and len(visuals) == 2 and len(states) >= 1
    assert all("z" not in r for r in [*episodes, *visuals])
    for what, records, key in (
        ("episodes", episodes, "episode_id"),
        ("visuals", visuals, "visual_id"),
        ("state", states, "state_id"),
    ):
        rc, out, _ = run(capsys, "show", what, cli_store, "--patient", "p1", *CLINICIAN)
        assert rc == 0
        for r in records:
            assert r[key] in out, what
    rc, out, _ = run(capsys, "show", "episodes", cli_store, "--patient", "p1", *CLINICIAN)
    assert "A: small left pleural effusion" in out


def test_show_as_an_auditor_is_refused(capsys: pytest.CaptureFixture[str], cli_store: Path) -> None:
    """The auditor reads no patient data: every show command exits 1."""
    for what in ("state", "history", "episodes", "visuals", "claims", "stm"):
        rc, out, err = run(capsys, "show", what, cli_store, "--patient", "p1", *AUDITOR)
        assert rc == 1 and "may not read" in one_line_error(err), what
        assert out == ""


def test_show_claims_history_needs_a_key(capsys: pytest.CaptureFixture[str], cli_store: Path) -> None:
    """show claims --history without --key is a one-line error."""
    rc, _, err = run(capsys, "show", "claims", cli_store, "--patient", "p1", "--history", *CLINICIAN)
    assert rc == 1 and "--key" in one_line_error(err)
