"""Tests of the backbone of a deployment (interfaces/backbone.py): where it is configured, what
is refused at start, and the key that never leaves the environment; and of the CLI's context,
record-answer and ask --backbone against a model server process."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from msm_mem import BackendUnavailable, FixedClock, InvalidInput, ManifestRow, MsmMem
from msm_mem.interfaces.backbone import API_KEY_ENV, CONFIG_ENV, NAME_ENV, OPTIONS_ENV, BackboneConfig, probe
from msm_mem.interfaces.http.config import ServeConfig
from tests.chat_process import chat_process, image_sent, prompt_sent
from tests.cli_support import AGENT, clean_env, one_line_error, run, run_json
from tests.helpers import ADMIN, INGEST, png
from tests.layers import Views


@pytest.fixture
def views() -> Iterator[Views]:
    """Handles of their own on the stores a test opens (``tests/layers.py``), closed after it."""
    with Views() as opened:
        yield opened


QUESTION = "What is the impression?"


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    """No MSM_MEM_* settings and no proxy from the environment of the test run."""
    clean_env(monkeypatch)
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "backbone.toml"
    path.write_text(text)
    return path


OPENAI_TOML = 'name = "openai"\n[options]\nbase_url = "http://file-host:8000/v1"\nmodel = "from-file"\ntimeout_s = 30\n'


def test_the_default_is_the_nonparametric_voter() -> None:
    """Nothing configured: the nonparametric backbone, no options, nothing to probe."""
    config = BackboneConfig.resolve(environ={})
    assert (config.name, dict(config.options)) == ("nonparametric", {})
    assert probe(config.build(environ={})) == ""


def test_flags_win_over_the_environment_which_wins_over_the_file(tmp_path: Path) -> None:
    """Option by option: the file, then MSM_MEM_BACKBONE_OPTIONS, then --backbone-option."""
    env = {CONFIG_ENV: str(_toml(tmp_path, OPENAI_TOML)), OPTIONS_ENV: json.dumps({"model": "from-env", "retries": 1})}
    config = BackboneConfig.resolve(None, ["retries=3", "temperature=0.2"], environ=env)
    assert config.name == "openai"
    assert dict(config.options) == {
        "base_url": "http://file-host:8000/v1",
        "model": "from-env",
        "timeout_s": 30,
        "retries": 3,
        "temperature": 0.2,
    }
    assert config.build(environ={}).timeout_s == 30.0  # type: ignore[attr-defined]


def test_another_backbone_named_drops_the_files_options(tmp_path: Path) -> None:
    """A file for openai does not configure --backbone nonparametric."""
    config = BackboneConfig.resolve("nonparametric", file=_toml(tmp_path, OPENAI_TOML), environ={})
    assert (config.name, dict(config.options)) == ("nonparametric", {})
    named = BackboneConfig.resolve(None, environ={NAME_ENV: "openai", OPTIONS_ENV: '{"model": "m"}'})
    assert (named.name, dict(named.options)) == ("openai", {"model": "m"})


@pytest.mark.parametrize(
    ("name", "pairs", "message"),
    [
        ("gpt", [], "unknown backbone 'gpt'; known: fitted, nonparametric, openai, transformers"),
        (
            "openai",
            ["base_url=http://h:1/v1", "model=m", "temprature=0.1"],
            "no option 'temprature'; it takes base_url, model, timeout_s, retries, backoff_s, max_tokens, "
            "temperature, system_prompt, and its API key from MSM_MEM_BACKBONE_API_KEY",
        ),
        ("openai", ["base_url=ftp://h/v1", "model=m"], "base_url must be an http\\(s\\) URL"),
        ("openai", ["base_url=http://user:pw@h/v1", "model=m"], "must not hold a user or password"),
        ("openai", ["base_url=http://h/v1", "model=m", "timeout_s=0"], "timeout_s must be a number > 0 and <= 600"),
        ("openai", ["base_url=http://h/v1", "model=m", "timeout_s=601"], "timeout_s must be a number > 0 and <= 600"),
        ("openai", ["base_url=http://h/v1", "model=m", "timeout_s=soon"], "timeout_s must be a number"),
        ("openai", ["base_url=http://h/v1", "model=m", "retries=1.5"], "retries must be an integer from 0 to 10"),
        ("openai", ["base_url=http://h/v1", "model=m", "max_tokens=true"], "max_tokens must be an integer"),
        ("openai", ["base_url=http://h/v1"], "it takes base_url, model"),
        ("openai", ["base_url"], "wants KEY=VALUE"),
        ("openai", ["base_url=http://h/v1", "model=m", "sleep=0"], "no option 'sleep'"),
        ("nonparametric", ["model=m"], "no option 'model'; it takes semantic_weight$"),
        ("fitted", ["path=f.npz", "encoder=pixels"], "no option 'encoder'; it takes path$"),
    ],
)
def test_a_bad_backbone_is_refused_at_start_naming_the_problem(name: str, pairs: list[str], message: str) -> None:
    """Unknown names and options, wrong types, schemes and bounds: InvalidInput naming them."""
    with pytest.raises(InvalidInput, match=message):
        BackboneConfig.resolve(name, pairs, environ={}).build(environ={})


def test_the_api_key_comes_from_the_environment_only(tmp_path: Path) -> None:
    """api_key is refused from the command line, MSM_MEM_BACKBONE_OPTIONS and the file, and
    never shows in the settings a worker is given or in the backbone's repr."""
    with pytest.raises(InvalidInput, match=f"set {API_KEY_ENV}"):
        BackboneConfig.resolve("openai", ["api_key=sk-secret"], environ={})
    with pytest.raises(InvalidInput, match=f"set {API_KEY_ENV}"):
        BackboneConfig.resolve("openai", environ={OPTIONS_ENV: '{"api_key": "sk-secret"}'})
    with pytest.raises(InvalidInput, match=f"set {API_KEY_ENV}"):
        BackboneConfig.resolve(file=_toml(tmp_path, 'name = "openai"\n[options]\napi_key = "sk-secret"\n'), environ={})
    config = BackboneConfig.resolve("openai", ["base_url=http://h:1/v1", "model=m"], environ={})
    backbone = config.build(environ={API_KEY_ENV: "sk-secret"})
    assert "sk-secret" not in repr(backbone)
    serve = ServeConfig(tmp_path, backbone=config)
    assert "sk-secret" not in json.dumps(serve.to_env())
    assert ServeConfig.from_env(serve.to_env()).backbone == config


def test_a_malformed_file_is_refused_naming_it(tmp_path: Path) -> None:
    """Not TOML, an unknown key, options that are not a table: InvalidInput naming the file."""
    for text, message in [
        ("name = ", "is not TOML"),
        ('name = "openai"\nmodel = "m"\n', "unknown key\\(s\\) \\['model'\\]"),
        ('name = "openai"\noptions = 3\n', "must be an object of options"),
    ]:
        with pytest.raises(InvalidInput, match=message):
            BackboneConfig.resolve(file=_toml(tmp_path, text), environ={})


def test_the_probe_reports_an_unreachable_model_server(tmp_path: Path) -> None:
    """The probe asks GET /models: an answer is reported, a server that is gone is BackendUnavailable."""
    with chat_process(tmp_path / "chat") as server:
        backbone = BackboneConfig("openai", {"base_url": server.base_url, "model": "m", "timeout_s": 5}).build()
        assert probe(backbone).endswith("/v1/models: HTTP 200")
        server.stop()
        with pytest.raises(BackendUnavailable, match=f"the model server at {server.base_url} is unreachable"):
            probe(backbone)


# the command line ----------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Path:
    directory = tmp_path / "store"
    images = tmp_path / "images"
    images.mkdir()
    with MsmMem.init(directory, ADMIN) as mem:
        rows = [
            ManifestRow("P1", f"S{i}", 1_700_000_000.0 + i * 86_400, str(png(images, i)), QUESTION, answer, line=i + 1)
            for i, answer in enumerate(["Right lower lobe consolidation.", "Right lower lobe consolidation, better."])
        ]
        mem.ingest(INGEST, rows)
    return directory


def test_cli_context_then_record_answer(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """context prints the fused prompt and its context id; record-answer writes the answer back
    through the gate, naming the model."""
    image = png(tmp_path / "images", 9)
    ctx = run_json(capsys, "context", store, "--patient", "P1", "--image", image, "--question", QUESTION, *AGENT)
    assert isinstance(ctx, dict) and ctx["included"] and f"[{ctx['included'][0]}]" in ctx["prompt"]
    rc, out, err = run(
        capsys, "context", store, "--patient", "P1", "--image-study", "S1", "--question", QUESTION, *AGENT
    )
    assert rc == 0 and out.startswith("## Patient history") and "context M-" in out, err
    done = run_json(
        capsys,
        "record-answer",
        store,
        "--patient",
        "P1",
        "--context",
        ctx["context_id"],
        "--answer",
        "Right lower lobe consolidation, resolving.",
        "--evidence",
        ctx["included"][0],
        "--model-backbone",
        "ollama",
        "--model",
        "llava:13b",
        *AGENT,
    )
    assert isinstance(done, dict) and done["gate"]["written"] and done["model"]["model"] == "llava:13b"
    again = ["--context", ctx["context_id"], "--answer", "Again.", "--model-backbone", "ollama"]
    rc, out, err = run(capsys, "record-answer", store, "--patient", "P1", *again, *AGENT)
    assert rc == 1 and "not active" in one_line_error(err)


def test_cli_ask_with_an_openai_backbone(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], views: Views
) -> None:
    """ask --backbone openai answers from the model server process (the fused prompt sent); an
    unknown option and an unreachable server are one error line each, with nothing written."""
    image = png(tmp_path / "images", 9)
    with chat_process(tmp_path / "chat", ["Right lower lobe consolidation, stable."]) as server:
        flags = ["--backbone", "openai", "--backbone-option", f"base_url={server.base_url}"]
        flags += ["--backbone-option", "model=llava-test", "--backbone-option", "retries=0"]
        answer = run_json(
            capsys, "ask", store, "--patient", "P1", "--image", image, "--question", QUESTION, *flags, *AGENT
        )
        sent = server.requests()
        assert isinstance(answer, dict) and answer["model"] == {
            "backbone": "openai",
            "model": "fake-model",
            "version": "",
        }
        assert prompt_sent(sent[0]).endswith(QUESTION) and "## Similar prior encounters" in prompt_sent(sent[0])
        cut = [*flags, "--backbone-option", "colour=red"]
        rc, _, err = run(
            capsys, "ask", store, "--patient", "P1", "--image", image, "--question", QUESTION, *cut, *AGENT
        )
        assert rc == 1 and "no option 'colour'" in one_line_error(err) and "it takes base_url, model" in err
        server.stop()
        with MsmMem.open(store) as mem:
            before = views(mem).store.count("episodic")
        rc, _, err = run(
            capsys, "ask", store, "--patient", "P1", "--image", image, "--question", QUESTION, *flags, *AGENT
        )
        assert rc == 1 and "connection error" in one_line_error(err)
        with MsmMem.open(store, clock=FixedClock()) as mem:
            assert views(mem).store.count("episodic") == before


def test_eval_runs_the_protocol_against_a_model_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """msm-mem eval --backbone openai: every probe of the protocol is a request to the model
    server (the fused prompt and the image), and Table 1 is written; an unreachable server
    stops it before any work."""
    from msm_mem.interfaces.cli import main

    args = ["eval", "--dataset", "synthetic", str(tmp_path / "data"), "--option", "patients=6", "--option", "size=64"]
    args += ["--configs", "sev", "--folds", "1", "--no-fit", "--no-baselines", "--bootstrap", "2"]
    args += ["--no-progress", "--no-plots", "--jobs", "1"]
    with chat_process(tmp_path / "chat", default="Right lower lobe consolidation.") as server:
        flags = ["--backbone", "openai", "--backbone-option", f"base_url={server.base_url}"]
        flags += ["--backbone-option", "model=llava-test"]
        code = main([*args, "--out", str(tmp_path / "out"), *flags])
        printed = capsys.readouterr().out
        sent = server.requests()
    assert code == 0 and "| SEV |" in printed
    doc = json.loads((tmp_path / "out" / "results.json").read_text(encoding="utf-8"))
    assert doc["settings"]["backbone"] == "openai"
    answers = [json.loads(line) for line in (tmp_path / "out" / "answers.jsonl").read_text().splitlines()]
    agent = [a for a in answers if a["arm"] == "SEV"]
    assert agent and {a["prediction"] for a in agent} == {"Right lower lobe consolidation."}
    assert len(sent) >= len(agent)
    assert all(r["json"]["model"] == "llava-test" for r in sent)
    assert all(image_sent(r).startswith("data:image/png;base64,") for r in sent)
    assert all(prompt_sent(r).startswith("## Patient history") for r in sent)
    code = main([*args, "--out", str(tmp_path / "out2"), *flags])
    assert code == 1 and "is unreachable" in capsys.readouterr().err
    assert not (tmp_path / "out2" / "results.json").exists()
    code = main([*args, "--out", str(tmp_path / "out3"), "--backbone", "openai", "--option", "base_url=http://h/v1"])
    assert code == 1 and "the backbone's is --backbone-option base_url=..." in capsys.readouterr().err
