"""The vocabulary of the finding labeler: the 14 CheXpert observations, their mention phrases,
and the negation and uncertainty cues with their scope (tables only; the logic is in
:mod:`msm_mem._memory.labeler`).

Entries are lowercase regular-expression fragments matched on whole words; the choices they
encode are listed in the labeler's docstring.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "IGNORED_PHRASES",
    "MENTIONS",
    "NEGATION_BOTH",
    "NEGATION_POST",
    "NEGATION_PRE",
    "NORMAL_STATEMENTS",
    "OBSERVATIONS",
    "PSEUDO_NEGATIONS",
    "QUESTION_MARK_CUE",
    "SCOPE_TERMINATORS",
    "SCOPE_WORDS",
    "UNCERTAIN_BOTH",
    "UNCERTAIN_POST",
    "UNCERTAIN_PRE",
]

OBSERVATIONS: Final[tuple[str, ...]] = (
    "No Finding",
    "Enlarged Cardiomediastinum",
    "Cardiomegaly",
    "Lung Lesion",
    "Lung Opacity",
    "Edema",
    "Consolidation",
    "Pneumonia",
    "Atelectasis",
    "Pneumothorax",
    "Pleural Effusion",
    "Pleural Other",
    "Fracture",
    "Support Devices",
)

# The tables are packed several phrases a line so that one observation reads at a glance;
# one-phrase-per-line formatting would double the module for no gain in clarity.
_OPACITY = r"opacit(?:y|ies)"
_GRADE = r"(?:(?:mildly|moderately|markedly|severely|slightly|massively) )?"
_BE = r"(?:(?:is|are|was|were|appears?|remains?|seems?) )?"

#: Phrases that mention an observation. "No Finding" has none: it is derived (see ``label``).
MENTIONS: Final[dict[str, tuple[str, ...]]] = {
    "Enlarged Cardiomediastinum": (
        r"enlarged cardiomediastin(?:um|al silhouette|al contours?)",
        rf"cardiomediastinal (?:silhouette|contours?) {_BE}{_GRADE}(?:enlarged|widened)",
        r"widened mediastinum",
        r"mediastinal (?:widening|enlargement)",
        r"widening of (?:the )?mediastinum",
        r"enlarged mediastinum",
        rf"mediastinum {_BE}{_GRADE}(?:enlarged|widened)",
    ),
    "Cardiomegaly": (
        r"cardiomegaly",
        r"cardiac enlargement",
        r"enlarged (?:heart|cardiac silhouette|cardiac shadow)",
        r"enlargement of (?:the )?(?:heart|cardiac silhouette)",
        rf"(?:heart|heart size|cardiac size|cardiac silhouette|cardiac shadow) {_BE}{_GRADE}"
        r"(?:enlarged|increased)",
        r"increased cardiothoracic ratio",
    ),
    "Lung Lesion": (
        r"nodules?",
        r"nodular",
        r"mass(?:es)?",
        r"cavitation",
        r"(?:lung|pulmonary|cavitary|parenchymal) lesions?",
        r"tumou?rs?",
        r"neoplasms?",
        r"metastas[ie]s",
        r"metastatic disease",
    ),
    "Lung Opacity": (
        _OPACITY,
        r"opacification",
        r"opacified",
        r"infiltrat(?:es?|ion|ive)",
        r"ground[- ]?glass",
        r"ggos?",
        r"air[- ]?space (?:disease|shadowing)",
        r"haze",
        r"haziness",
        r"hazy",
        r"densit(?:y|ies)",
        r"reticul(?:ar|ation|onodular)",
        rf"interstitial (?:markings?|pattern|{_OPACITY}|thickening|changes?)",
        r"shadowing",
    ),
    "Edema": (
        r"o?edema",
        r"vascular congestion",
        r"pulmonary congestion",
        r"fluid overload",
    ),
    "Consolidation": (r"consolidations?", r"consolidative", r"consolidated"),
    "Pneumonia": (r"pneumonias?", r"bronchopneumonia", r"pneumonic", r"infectious process"),
    "Atelectasis": (r"atelectas[ie]s", r"atelectatic", r"collapsed?", r"volume loss"),
    "Pneumothorax": (r"pneumothora(?:x|ces)", r"hydropneumothorax", r"ptx"),
    "Pleural Effusion": (
        r"(?:pleural )?effusions?",
        r"pleural fluid",
        r"hydrothorax",
        r"hydropneumothorax",
        r"ha?emothorax",
        r"empyema",
        r"blunt(?:ing|ed) of (?:the )?(?:\w+ )?costophrenic angles?",
        r"blunted (?:\w+ )?costophrenic angles?",
        r"costophrenic (?:angle )?blunting",
    ),
    "Pleural Other": (
        r"pleural (?:thickening|plaques?|scar(?:ring)?|calcifications?|reaction)",
        r"fibrothorax",
        r"apical cap",
    ),
    "Fracture": (r"fractures?", r"fractured", r"fx"),
    "Support Devices": (
        r"(?:et|endotracheal|tracheostomy|trach|chest|ng|og|ng/og|og/ng|nasogastric|orogastric"
        r"|feeding|dobhoff|enteric) tubes?",
        r"ett",
        r"ngt",
        r"(?:ng|og) in (?:place|situ)",
        r"endotracheal",
        r"tracheostomy",
        r"intubated",
        r"intubation",
        r"pacemaker",
        r"pacer",
        r"a?icd",
        r"defibrillator",
        r"(?:central venous|central|picc|midline|arterial|dialysis|swan[- ]ganz|ij|subclavian"
        r"|jugular|femoral) (?:lines?|catheters?)",
        r"picc",
        r"catheters?",
        r"lines and tubes",
        r"tubes and lines",
        r"(?:intercostal|chest|pleural|pigtail) drains?",
        r"port-?a-?cath",
        r"sternotomy wires",
        r"sternal wires",
        r"stents?",
        r"ecmo",
        r"(?:ecg|ekg) leads",
    ),
}

#: Statements that an observation is absent, without a negation cue.
NORMAL_STATEMENTS: Final[dict[str, tuple[str, ...]]] = {
    "Cardiomegaly": (
        r"normal (?:heart|cardiac) (?:size|silhouette)",
        rf"(?:heart size|cardiac size|heart|cardiac silhouette) {_BE}(?:within normal limits"
        r"|normal|not enlarged)",
    ),
    "Enlarged Cardiomediastinum": (
        r"normal cardiomediastinal (?:silhouette|contours?)",
        rf"(?:cardiomediastinal (?:silhouette|contours?)|mediastinum) {_BE}"
        r"(?:within normal limits|normal|unremarkable|not widened)",
    ),
    "Lung Opacity": (r"lungs? (?:(?:are|is|remain|appear) )?clear", r"clear lungs?"),
}

#: Phrases blanked out before mentions are searched: they contain a mention word but name
#: something else (a pericardial effusion is not pleural, pedal oedema is not pulmonary).
IGNORED_PHRASES: Final[tuple[str, ...]] = (
    r"pericardial effusions?",
    r"joint effusions?",
    r"(?:subcutaneous|soft tissue|peripheral|pedal|leg|ankle|lower (?:extremity|limb)) o?edema",
    r"(?:circulatory|ha?emodynamic|cardiovascular|vertebral) collapse",
    r"body mass(?: index)?",
    r"muscle mass",
    r"(?:bone|bone mineral) density",
    r"(?:urinary|foley) catheters?",
    r"tumou?r markers?",
)

#: Phrases that contain a negation word but do not negate ("no change in the effusion").
PSEUDO_NEGATIONS: Final[tuple[str, ...]] = (
    r"no (?:significant |interval )?(?:change|increase|decrease|improvement|worsening)",
    r"not (?:only|necessarily)",
    r"without (?:significant |interval )?change",
)

# Uncertainty cues; "pre" cues govern mentions after them, "post" cues mentions before them.
UNCERTAIN_BOTH: Final[tuple[str, ...]] = (r"versus", r"vs", r"v\.s\.")
UNCERTAIN_POST: Final[tuple[str, ...]] = (
    r"(?:cannot|can not|can't|could not) be (?:excluded|ruled out)",
    r"not (?:excluded|ruled out)",
    r"(?:is|are) (?:possible|likely|unlikely|suspected|questioned|not excluded)",
)
UNCERTAIN_PRE: Final[tuple[str, ...]] = (
    r"(?:cannot|can not|can't|could not) (?:exclude|rule out)",
    r"(?:may|might|could) (?:represent|reflect|be|suggest|indicate)",
    r"possible",
    r"possibly",
    r"possibility of",
    r"suggestive of",
    r"suggesting",
    r"suggests",
    r"concerning for",
    r"concern for",
    r"(?:most )?likely",
    r"unlikely",
    r"probable",
    r"probably",
    r"question of",
    r"questionable",
    r"suspicious (?:for|of)",
    r"suspicion (?:for|of)",
    r"suspected",
    r"suspect",
    r"rule out",
    r"r/o",
    r"to exclude",
    r"differential (?:diagnosis )?(?:includes?|of)",
    r"consider",
    r"equivocal",
    r"indeterminate",
    r"borderline",
)
#: "?" as in "? pneumonia" or "pneumonia?", but not "38?C" (a mangled degree sign).
QUESTION_MARK_CUE: Final = r"(?<!\d)\?"

NEGATION_BOTH: Final[tuple[str, ...]] = (r"resolved", r"no longer")
NEGATION_POST: Final[tuple[str, ...]] = (
    r"(?:is |are |was |were )?not (?:seen|present|identified|visuali[sz]ed|demonstrated"
    r"|appreciated|evident|noted|detected|observed)",
    r"(?:has|have) been removed",
    r"removed",
    r"absent",
    r"ruled out",
    r"(?:was|were) excluded",
)
NEGATION_PRE: Final[tuple[str, ...]] = (
    r"no evidence of",
    r"no signs? of",
    r"no",
    r"not",
    r"without",
    r"negative for",
    r"free of",
    r"clear of",
    r"absence of",
    r"resolution of",
    r"removal of",
    r"lack(?: of)?",
    r"denies",
    r"neither",
    r"nor",
)

#: A cue's scope ends at these (and at the sentence end).
SCOPE_TERMINATORS: Final[tuple[str, ...]] = (
    r";",
    r":",
    r",\s*there (?:is|are|was|were)\b",
    r"but",
    r"however",
    r"although",
    r"though",
    r"except",
    r"apart from",
    r"aside from",
    r"nevertheless",
    r"whereas",
    r"showed",
    r"shows",
    r"revealed",
    r"reveals",
    r"demonstrated",
    r"demonstrates",
    r"presented with",
    r"presenting with",
    r"presents with",
)

#: At most this many words may lie between a cue and a mention it governs.
SCOPE_WORDS: Final = 10
