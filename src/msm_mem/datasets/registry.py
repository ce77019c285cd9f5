"""Data set loaders by name: one entry point for the CLI, ingest and evaluation.

- ``synthetic``: ``path`` = the output folder (written, then returned); options ``patients``,
  ``studies_per_patient``, ``seed``, ``size``, ``questions`` (what each study is asked:
  ``impression``, ``decision``, ``effusion``) (:func:`msm_mem.datasets.synthetic.generate`).
- ``covid-cxr``: the covid-cxr folder or its ``metadata.csv``, read in place; options
  ``keep_unlabelled``, ``check_images`` (:func:`msm_mem.datasets.covid_cxr.load`).
- ``iu-xray``: ``NLMCXR_reports.tgz`` or its folder, or ``None`` for the copy inside an
  installed torchxrayvision; options ``images_dir``, ``views_csv``.
- ``mimic-cxr``: the MIMIC-CXR-JPG root; options ``split``, ``reports_dir``.
- ``manifest``: any manifest file, CSV or JSONL (``docs/manifest.md``), question types read
  from its rows; option ``root`` (the folder images must lie in; default the file's folder)
  (:func:`msm_mem.datasets.manifest.read_manifest`). Every loader above produces such rows.

Options are the loaders' keyword-only parameters (:func:`options_of`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._errors import InvalidInput
from . import covid_cxr, iu_xray, mimic_cxr, synthetic
from .manifest import ManifestRow, RowProblem, read_manifest

__all__ = ["DATASETS", "load_dataset", "options_of"]

Loader = Callable[..., tuple[list[ManifestRow], list[RowProblem]]]

#: name -> (loader, whether ``path`` may be ``None``)
DATASETS: dict[str, tuple[Loader, bool]] = {
    "covid-cxr": (covid_cxr.load, False),
    "iu-xray": (iu_xray.load, True),
    "manifest": (read_manifest, False),
    "mimic-cxr": (mimic_cxr.load, False),
    "synthetic": (synthetic.generate, False),
}


def options_of(name: str) -> tuple[str, ...]:
    """The keyword options data set ``name`` accepts, sorted; raises :class:`InvalidInput`."""
    if name not in DATASETS:
        raise InvalidInput(f"unknown data set {name!r}; known: {', '.join(sorted(DATASETS))}")
    params = inspect.signature(DATASETS[name][0]).parameters.values()
    return tuple(sorted(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY))


def load_dataset(name: str, path: str | Path | None, **options: Any) -> tuple[list[ManifestRow], list[RowProblem]]:
    """Load data set ``name`` from ``path``; returns ``(rows, problems)``.

    Rows are sorted by patient then time; every skipped source row is a problem with a
    reason. Raises :class:`InvalidInput` for an unknown name (listing the known ones), an
    unknown option (listing the accepted ones) or a missing ``path``, plus whatever the
    loader raises.
    """
    accepted = options_of(name)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise InvalidInput(f"{name}: unknown option(s) {', '.join(unknown)}; accepted: {', '.join(accepted)}")
    loader, path_optional = DATASETS[name]
    if path is None and not path_optional:
        raise InvalidInput(f"the {name} data set needs a path")
    if name == "synthetic":
        return loader(Path(path), **options)  # type: ignore[arg-type]  # checked above
    return loader(path, **options)
