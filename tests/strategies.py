"""Hypothesis strategies shared by the property and model-based tests.

The model-based test (``tests/test_model.py``) draws from small, fixed pools so that the
write-back gate's outcome is known in advance: images are random-noise PNGs (one per seed;
two different seeds are far apart under any encoder, the same seed is cosine 1), and every
answer's length and clinical keyword are stated here, next to the text.
"""

from __future__ import annotations

from hypothesis import strategies as st

#: the patients of the model (few, so that rules meet the same patient again)
PATIENTS = ("P1", "P2", "P3")
#: image seeds: the same seed twice is not novel for a patient, two seeds always are
IMAGES = (0, 1, 2, 3)
#: study ids, each with its own UTC time (every interaction of a study shares it)
STUDIES = ("S1", "S2", "S3")

#: answers and whether each passes the gate's substance and relevance criteria (at least 3
#: words and a clinical keyword of the packaged lexicon); novelty is the image's business
ANSWERS: dict[str, bool] = {
    "Right lower lobe consolidation with a small effusion.": True,  # 8 words, 3 keywords
    "Lungs are clear, no pneumothorax.": True,  # 5 words, 2 keywords
    "Consolidation.": False,  # a keyword, but 1 word
    "Looks about the same.": False,  # 4 words, no keyword
}
#: a critic's corrections (the text of a rejecting verdict)
CORRECTIONS = ("Left basal effusion, improving.", "No acute cardiopulmonary process.")

#: how far the clock moves in one rule, in seconds: a minute, past the age threshold of a held
#: item (1 h), past the STM lifetime (1 day), and spans that reach the decay of semantic versions
#: (645 to 778 days) and of agent, critic and ground-truth records (1040 to 1578 days)
ADVANCES = (60.0, 2 * 3600.0, 2 * 86400.0, 200 * 86400.0, 700 * 86400.0, 1100 * 86400.0, 1600 * 86400.0)

#: roles whose per-patient treatment consent the model grants and revokes
CONSENT_ROLES = ("agent", "clinician", "critic")

patients = st.sampled_from(PATIENTS)
images = st.sampled_from(IMAGES)
studies = st.sampled_from(STUDIES)
answers = st.sampled_from(sorted(ANSWERS))
corrections = st.sampled_from(CORRECTIONS)
advances = st.sampled_from(ADVANCES)
consent_roles = st.sampled_from(CONSENT_ROLES)
#: manifest rows of one ingest: (patient, study, image, answer)
ingest_rows = st.lists(st.tuples(patients, studies, images, answers), min_size=1, max_size=3)
