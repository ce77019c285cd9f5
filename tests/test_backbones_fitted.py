"""The fitted backbone and its parameter file: round trip, validation, the router's choice."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from msm_mem import InvalidInput, MsmMem, Settings
from msm_mem.plugins.backbones import get_backbone
from msm_mem.plugins.backbones.base import BackboneRequest, Candidate
from msm_mem.plugins.backbones.fitted import FittedBackbone, answer_with, choose, proposals
from msm_mem.plugins.backbones.fitted_format import GATE_FEATURES, FittedGroup, FittedModels, load
from msm_mem.plugins.encoders import get_encoder
from msm_mem.testing import FixedClock
from tests.helpers import ADMIN, AGENT, INGEST

Q = "What is the diagnosis for this chest X-ray?"
DIM = get_encoder("pixels").dim
DAY = 86_400.0


def _gate(**weights: float) -> np.ndarray:
    """Router coefficients with the given weight per feature name (0 elsewhere)."""
    return np.array([weights.get(name, 0.0) for name in GATE_FEATURES])


def _models(*, gate: np.ndarray | None = None, encoder: str = "pixels", dim: int = DIM) -> FittedModels:
    """A classifier that answers "COVID-19" for bright images and "Pneumonia" for dark ones."""
    coef = np.zeros((2, dim))
    coef[0, :], coef[1, :] = 5.0, -5.0
    group = FittedGroup("label", Q, ("COVID-19", "Pneumonia"), coef, np.zeros(2), gate, 0.0, 10, 5, 20)
    return FittedModels(encoder, dim, (group,), {"note": "test"})


def _saved(tmp_path: Path, models: FittedModels, name: str = "fitted.npz") -> Path:
    path = tmp_path / name
    models.save(path)
    return path


def test_file_round_trips(tmp_path: Path) -> None:
    """What save writes, load reads back: classes, coefficients, router and the record."""
    models = _models(gate=_gate(is_semantic=2.0))
    back = load(_saved(tmp_path, models))
    assert back.encoder == "pixels" and back.dim == DIM and back.fit == {"note": "test"}
    g, h = models.groups[0], back.groups[0]
    assert h.key == ("label", Q) and h.classes == g.classes
    assert np.array_equal(h.coef, g.coef) and h.gate_coef is not None and np.array_equal(h.gate_coef, g.gate_coef)
    z = np.ones(DIM) / np.sqrt(DIM)
    assert h.predict(z) == g.predict(z) and h.predict(z)[0] == "COVID-19"


def _rewrite(path: Path, **changes: object) -> None:
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    meta = json.loads(arrays["meta"].tobytes())
    for key, value in changes.items():
        if key.startswith("meta."):
            meta[key[5:]] = value
        elif value is None:
            arrays.pop(key)
        else:
            arrays[key] = value  # type: ignore[assignment]
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **arrays)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"meta.format": "other"}, "not a msm-mem-fitted"),
        ({"meta.version": 2}, "version 1"),
        ({"meta.dim": 0}, "dim"),
        ({"meta.gate_features": ["x"]}, "gate_features"),
        ({"g0.coef": None}, "g0.coef is missing"),
        ({"g0.coef": np.zeros((2, 3))}, "shape"),
        ({"g0.intercept": np.array([np.nan, 0.0])}, "not finite"),
        ({"g0.gate_coef": np.zeros(2)}, "g0.gate_coef"),
        ({"meta.groups": [{"question_type": "label", "question": Q, "classes": ["a", "a"]}]}, "repeat"),
    ],
)
def test_a_bad_file_is_invalid_input(tmp_path: Path, changes: dict[str, object], message: str) -> None:
    """A wrong format, version, shape, missing array or non-finite number names the problem."""
    path = _saved(tmp_path, _models(gate=_gate()))
    _rewrite(path, **changes)
    with pytest.raises(InvalidInput, match=message):
        load(path)


def test_garbage_missing_and_pickled_files_are_invalid_input(tmp_path: Path) -> None:
    """Not a zip, no file at all, or an object array (which would need pickle) is refused."""
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip file")
    for path in (junk, tmp_path / "absent.npz", tmp_path):
        with pytest.raises(InvalidInput):
            load(path)
    pickled = tmp_path / "pickled.npz"
    with open(pickled, "wb") as f:
        np.savez(f, meta=np.array([{"format": "msm-mem-fitted"}], dtype=object))
    with pytest.raises(InvalidInput):
        load(pickled)


def test_get_backbone_builds_it_by_name_and_needs_a_path(tmp_path: Path) -> None:
    """``fitted`` is a registered backbone; without path= or with a bad file it is InvalidInput."""
    backbone = get_backbone("fitted", path=str(_saved(tmp_path, _models())))
    assert backbone.name == "fitted"
    with pytest.raises(InvalidInput):
        get_backbone("fitted")
    with pytest.raises(InvalidInput):
        get_backbone("fitted", path=str(tmp_path / "absent.npz"))


def test_a_file_whose_encoder_has_another_dimension_is_refused(tmp_path: Path) -> None:
    """Coefficients of another width than the encoder's embedding cannot be used."""
    with pytest.raises(InvalidInput, match="-d"):
        FittedBackbone(str(_saved(tmp_path, _models(dim=DIM + 1))))


def _bright(tmp_path: Path) -> Path:
    from PIL import Image

    path = tmp_path / "bright.png"
    Image.fromarray(np.full((64, 64), 250, dtype=np.uint8), mode="L").save(path)
    return path


def test_msm_mem_loads_it_and_the_model_answers_without_memory(tmp_path: Path) -> None:
    """MsmMem opens a store with the fitted backbone; with no memory the image model answers."""
    path = _saved(tmp_path, _models())
    with MsmMem.init(tmp_path / "mem", ADMIN, clock=FixedClock(1e9)) as mem:
        mem.ingest(INGEST, [])
    with MsmMem.open(tmp_path / "mem", backbone="fitted", backbone_options={"path": str(path)}) as mem:
        a = mem.ask(AGENT, "p1", _bright(tmp_path), Q, use_sem=False, use_epi=False, use_vis=False)
    assert a.answer in ("COVID-19", "Pneumonia") and a.source == "model"


def test_msm_mem_refuses_a_backbone_fitted_on_another_encoder(tmp_path: Path) -> None:
    """A fitted file naming another encoder than the store's is InvalidInput at open."""
    path = _saved(tmp_path, _models())
    MsmMem.init(tmp_path / "mem", ADMIN, settings=Settings(), clock=FixedClock(1e9)).close()
    models = load(path)
    other = FittedModels("efficientnet-lite0", models.dim, models.groups)

    class Stub(FittedBackbone):
        def __init__(self) -> None:
            self.models, self.encoder_name = other, other.encoder

    with pytest.raises(InvalidInput, match="fitted on encoder efficientnet-lite0"):
        MsmMem.open(tmp_path / "mem", backbone=Stub())


def _request(image: np.ndarray | None = None, *, own: str = "Pneumonia", prior: str = "") -> BackboneRequest:
    cands = (
        (
            Candidate("s1", "semantic", own, "", 0.0, 10 * DAY, 1.0),
            Candidate("e1", "episodic", own, "", 0.8, 10 * DAY, 1.0),
        )
        if own
        else ()
    )
    pop = (Candidate("x1", "episodic", prior, "", 0.6, 5 * DAY, 1.0),) if prior else ()
    return BackboneRequest("prompt", Q, cands, pop, image)


def test_router_follows_the_patients_history_or_the_model_as_fitted(tmp_path: Path) -> None:
    """Item 5: with a router that trusts the patient's own memories the answer is the patient's
    history; with one that trusts the image model it is the model's; the untrusted side loses."""
    image = np.full((64, 64), 0.98, dtype=np.float32)  # bright: the model says COVID-19
    trust_own = FittedBackbone(str(_saved(tmp_path, _models(gate=_gate(same_patient=4.0, is_model=-4.0)), "a.npz")))
    trust_model = FittedBackbone(str(_saved(tmp_path, _models(gate=_gate(same_patient=-4.0, is_model=4.0)), "b.npz")))
    assert trust_own.generate(_request(image)).answer == "Pneumonia"
    reply = trust_model.generate(_request(image))
    assert reply.answer == "COVID-19" and reply.source == "model" and reply.cited == ()


def test_router_can_fall_back_to_the_population(tmp_path: Path) -> None:
    """A router trusting other patients' experience answers from it, citing it."""
    gate = _gate(is_population=4.0, is_model=-4.0)
    backbone = FittedBackbone(str(_saved(tmp_path, _models(gate=gate))))
    reply = backbone.generate(_request(np.full((64, 64), 0.98, dtype=np.float32), own="", prior="Influenza"))
    assert reply.answer == "Influenza" and reply.source == "population-prior" and reply.cited == ("x1",)


def test_unknown_question_falls_back_to_the_nonparametric_vote(tmp_path: Path) -> None:
    """A question the file has no group for is answered as the nonparametric backbone would."""
    backbone = FittedBackbone(str(_saved(tmp_path, _models(gate=_gate(is_model=9.0)))))
    request = BackboneRequest("p", "Another question?", _request().candidates)
    assert backbone.generate(request).answer == "Pneumonia"


def test_proposal_features() -> None:
    """Each expert proposes once; agreement, same patient and the model's agreement are set."""
    props = {p.expert: p for p in proposals(_request(own="Pneumonia", prior="Pneumonia"), ("COVID-19", 0.7))}
    assert set(props) == {"semantic", "episodic", "population", "model"}
    f = {name: i for i, name in enumerate(GATE_FEATURES)}
    e = props["episodic"].features
    assert e[f["is_episodic"]] == 1 and e[f["same_patient"]] == 1 and e[f["agreement"]] == 1.0
    assert e[f["agrees_model"]] == 0 and e[f["recency"]] == 1.0 and e[f["weight"]] == pytest.approx(0.8)
    m = props["model"].features
    assert m[f["weight"]] == pytest.approx(0.7) and m[f["agreement"]] == 0.0 and m[f["same_patient"]] == 0
    assert props["population"].features[f["same_patient"]] == 0


def test_choose_is_a_noisy_or_over_agreeing_experts() -> None:
    """Two experts at 0.6 for one answer (score 0.84) beat one at 0.8 for another."""
    props = proposals(_request(own="Pneumonia"), ("COVID-19", 0.9))
    by = {p.expert: p for p in props}
    first, score, agreeing = choose([by["semantic"], by["episodic"], by["model"]], [0.6, 0.6, 0.8])
    assert first.text == "Pneumonia" and score == pytest.approx(0.84) and len(agreeing) == 2
    with pytest.raises(InvalidInput):
        choose(props, [0.5])


def _twins(kind: str, ids: tuple[str, str], texts: tuple[str, str]) -> tuple[Candidate, ...]:
    """Two candidates equal in weight, time and tier, listed in the order of ``ids``."""
    return tuple(Candidate(i, kind, t, f"decision {t}", 0.8, 10 * DAY, 1.0) for i, t in zip(ids, texts, strict=True))


@pytest.mark.parametrize("ids", [("e-a", "e-z"), ("e-z", "e-a")])
def test_newest_and_nearest_take_the_first_of_equal_candidates(ids: tuple[str, str]) -> None:
    """The newest and nearest strategies answer with the first of two candidates equal in time
    and weight (retrieval's order), whatever the random ids."""
    request = BackboneRequest("p", Q, _twins("episodic", ids, ("Pneumonia", "COVID-19")))
    for strategy in ("newest", "nearest"):
        reply = answer_with(strategy, request, None, None)
        assert (reply.answer, reply.cited) == ("Pneumonia", (ids[0],))


@pytest.mark.parametrize("ids", [("s-a", "s-z"), ("s-z", "s-a")])
def test_proposals_take_the_first_of_equal_candidates(ids: tuple[str, str]) -> None:
    """Of equal candidates the semantic expert proposes the first one's impression, and a vote
    answers with its first member's wording and decision, whatever the random ids."""
    semantic = _twins("semantic", ids, ("Pneumonia", "COVID-19"))
    (sem,) = proposals(BackboneRequest("p", Q, semantic), None)
    assert (sem.expert, sem.text) == ("semantic", "Pneumonia")
    episodic = _twins("episodic", ids, ("Pneumonia", "pneumonia"))
    (epi,) = proposals(BackboneRequest("p", Q, episodic), None)
    assert (epi.text, epi.decision) == ("Pneumonia", "decision Pneumonia")
