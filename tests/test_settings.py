"""Tests of msm_mem._settings: the paper's defaults, validation and environment parsing."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from msm_mem import InvalidInput, Settings


def test_defaults_are_the_papers() -> None:
    """k_epi=5, k_vis=5, top_k=10, tau=0.9 and a semantic history of N=5, as in the paper."""
    s = Settings()
    assert (s.k_epi, s.k_vis, s.top_k, s.tau, s.semantic_history) == (5, 5, 10, 0.9, 5)


def test_other_defaults() -> None:
    """The remaining defaults: pixels encoder, packaged lexicon, 3-word answers, 1 h STM."""
    s = Settings()
    assert s.encoder == "pixels"
    assert s.lexicon_path is None
    assert s.min_answer_words == 3
    assert s.prompt_budget_chars == 6000
    assert s.stm_ttl_s == 86400.0
    assert (s.population_search, s.population_ef_search) == ("exact", 128)
    assert s.structured_gate is False  # the paper's gate


@pytest.mark.parametrize(("raw", "value"), [("1", True), ("on", True), ("0", False), ("false", False), ("", False)])
def test_structured_gate_reads_a_flag(raw: str, value: bool) -> None:
    """MSM_MEM_STRUCTURED_GATE takes 1/0, true/false, yes/no, on/off; anything else is refused."""
    assert Settings.from_env({"MSM_MEM_STRUCTURED_GATE": raw}).structured_gate is value


def test_structured_gate_refuses_other_values() -> None:
    """A value that is not a flag, from the environment or in code, raises InvalidInput."""
    with pytest.raises(InvalidInput, match="STRUCTURED_GATE"):
        Settings.from_env({"MSM_MEM_STRUCTURED_GATE": "maybe"})
    with pytest.raises(InvalidInput, match="structured_gate"):
        Settings(structured_gate="yes")  # type: ignore[arg-type]


def test_settings_are_frozen() -> None:
    """A Settings object cannot be changed in place."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        Settings().tau = 0.5  # type: ignore[misc]


@pytest.mark.parametrize(
    "changes",
    [
        {"k_epi": 0},
        {"k_vis": -1},
        {"top_k": 2.5},
        {"top_k": True},
        {"semantic_history": 0},
        {"prompt_budget_chars": 0},
        {"k_epi": "5"},
        {"min_answer_words": -1},
        {"min_answer_words": True},
        {"min_answer_words": 1.5},
        {"tau": 1.5},
        {"tau": -1.01},
        {"tau": float("nan")},
        {"tau": "0.9"},
        {"tau": None},
        {"stm_ttl_s": 0},
        {"stm_ttl_s": -5.0},
        {"stm_ttl_s": float("nan")},
        {"stm_ttl_s": float("inf")},
        {"stm_ttl_s": "60"},
        {"encoder": ""},
        {"encoder": "  "},
        {"encoder": None},
        {"population_search": "fast"},
        {"population_search": None},
        {"population_ef_search": 0},
        {"population_ef_search": 100_001},
        {"population_ef_search": 64.0},
        {"population_ef_search": True},
    ],
)
def test_invalid_values_raise_invalid_input(changes: dict[str, Any]) -> None:
    """Out-of-range or wrongly typed settings raise InvalidInput (never a bare error)."""
    with pytest.raises(InvalidInput):
        Settings(**changes)


@pytest.mark.parametrize("tau", [-1.0, 0.0, 1.0, np.float32(0.5), 1])
def test_tau_accepts_any_cosine(tau: float) -> None:
    """Every real cosine in [-1, 1] (including numpy scalars and ints) is a valid tau."""
    assert float(Settings(tau=tau).tau) == float(tau)


def test_with_changes_a_copy_and_validates_again() -> None:
    """with_ returns a changed copy, leaves the original, and refuses invalid changes."""
    base = Settings()
    changed = base.with_(tau=0.8, top_k=3)
    assert (changed.tau, changed.top_k) == (0.8, 3)
    assert (base.tau, base.top_k) == (0.9, 10)
    with pytest.raises(InvalidInput):
        base.with_(top_k=0)


def test_from_env_reads_every_field() -> None:
    """from_env parses MSM_MEM_<FIELD> for each field with that field's type."""
    env = {
        "MSM_MEM_K_EPI": "3",
        "MSM_MEM_K_VIS": "4",
        "MSM_MEM_TOP_K": " 7 ",
        "MSM_MEM_TAU": "0.85",
        "MSM_MEM_MIN_ANSWER_WORDS": "0",
        "MSM_MEM_LEXICON_PATH": "terms.txt",
        "MSM_MEM_SEMANTIC_HISTORY": "2",
        "MSM_MEM_PROMPT_BUDGET_CHARS": "500",
        "MSM_MEM_ENCODER": "efficientnet-lite0",
        "MSM_MEM_STM_TTL_S": "12.5",
        "MSM_MEM_POPULATION_SEARCH": "hnsw",
        "MSM_MEM_POPULATION_EF_SEARCH": "256",
        "MSM_MEM_STRUCTURED_GATE": "yes",
        "UNRELATED": "x",
    }
    s = Settings.from_env(env)
    assert s == Settings(
        k_epi=3,
        k_vis=4,
        top_k=7,
        tau=0.85,
        min_answer_words=0,
        lexicon_path=Path("terms.txt"),
        semantic_history=2,
        prompt_budget_chars=500,
        encoder="efficientnet-lite0",
        stm_ttl_s=12.5,
        population_search="hnsw",
        population_ef_search=256,
        structured_gate=True,
    )


def test_from_env_with_nothing_set_gives_defaults() -> None:
    """An environment without MSM_MEM_ variables gives the defaults."""
    assert Settings.from_env({}) == Settings()


def test_from_env_reads_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without an explicit mapping, from_env reads os.environ."""
    monkeypatch.setenv("MSM_MEM_TAU", "0.75")
    assert Settings.from_env().tau == 0.75


def test_from_env_empty_lexicon_path_means_packaged() -> None:
    """MSM_MEM_LEXICON_PATH set to an empty string keeps the packaged lexicon (None)."""
    assert Settings.from_env({"MSM_MEM_LEXICON_PATH": ""}).lexicon_path is None


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("K_EPI", "five"),
        ("TOP_K", "2.5"),
        ("TOP_K", ""),
        ("TAU", "high"),
        ("TAU", "2"),
        ("TAU", "nan"),
        ("STM_TTL_S", "-1"),
        ("STM_TTL_S", "inf"),
        ("SEMANTIC_HISTORY", "0"),
        ("ENCODER", ""),
    ],
)
def test_from_env_bad_values_raise_invalid_input(name: str, raw: str) -> None:
    """Unparseable or out-of-range environment values raise InvalidInput."""
    with pytest.raises(InvalidInput):
        Settings.from_env({f"MSM_MEM_{name}": raw})


def test_from_env_parse_error_names_the_variable() -> None:
    """A parse error message names the offending variable and its value."""
    with pytest.raises(InvalidInput, match="MSM_MEM_K_VIS='lots'"):
        Settings.from_env({"MSM_MEM_K_VIS": "lots"})


@pytest.mark.parametrize(
    ("name", "raw"), [("MSM_MEM_POPULATION_SEARCH", "approximate"), ("MSM_MEM_POPULATION_EF_SEARCH", "many")]
)
def test_from_env_refuses_a_bad_population_search(name: str, raw: str) -> None:
    """An unknown population search mode or a non-integer search depth is InvalidInput naming it."""
    with pytest.raises(InvalidInput, match="(?i)population_"):
        Settings.from_env({name: raw})
