"""Import and export of the paper's on-disk layout."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from msm_mem import EncoderMismatch, InvalidInput
from msm_mem._memory.msm import Interaction, Memory
from msm_mem._storage.base import Store
from msm_mem._storage.paper_layout import export_paper, import_paper
from tests.conftest import StoreFactory, random_unit


def populate(store: Store, n: int, seed: int) -> list[np.ndarray]:
    mem = Memory(store)
    rng = np.random.default_rng(seed)
    zs = [random_unit(rng) for _ in range(n)]
    mem.write_back_many(
        [
            Interaction(
                f"p{i % 3}",
                z,
                "q?",
                f"consolidation grade {i} worse",
                1e9 + i * 86400,
                decision="treat",
                media_path=f"img/{i}.png",
            )
            for i, z in enumerate(zs)
        ]
    )
    return zs


def evidence(store: Store, z: np.ndarray) -> list[tuple[str, str, float]]:
    mem = Memory(store)
    out = []
    for p in ("p0", "p1", "p2"):
        for scope in ("patient", "population"):
            r = mem.retrieve(p, z, scope=scope)  # type: ignore[arg-type]
            out += [(h.id, h.kind, h.score) for h in r.evidence()]
    return out


@settings(max_examples=10, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(0, 25), seed=st.integers(0, 1000))
def test_export_then_import_is_identity(
    make_store: StoreFactory, tmp_path_factory: pytest.TempPathFactory, n: int, seed: int
) -> None:
    """Round trip: same records, same semantic history, identical retrieval results."""
    src, dst = make_store(), make_store()
    zs = populate(src, n, seed)
    out = tmp_path_factory.mktemp("layout")
    export_paper(src, out)
    import_paper(dst, out)
    assert list(src.iter_episodes()) == list(dst.iter_episodes())
    assert list(src.iter_visuals()) == list(dst.iter_visuals())
    assert list(src.iter_semantic()) == list(dst.iter_semantic())
    for z in zs[:3] or [random_unit(np.random.default_rng(seed))]:
        assert evidence(src, z) == evidence(dst, z)


def test_layout_files_are_aligned(store: Store, tmp_path: Path) -> None:
    """The i-th FAISS vector is the i-th JSONL line; semantic files are per patient."""
    import faiss

    zs = populate(store, 6, 1)
    export_paper(store, tmp_path / "out")
    lines = (tmp_path / "out" / "episodic.jsonl").read_text().splitlines()
    index = faiss.read_index(str(tmp_path / "out" / "episodic.faiss"))
    assert index.ntotal == len(lines) == 6
    for i, line in enumerate(lines):
        rec = json.loads(line)
        assert rec["media_path"] == f"img/{i}.png"
        assert np.allclose(index.reconstruct(i), zs[i], atol=1e-6)
    assert sorted(p.name for p in (tmp_path / "out" / "semantic").iterdir()) == ["p0.json", "p1.json", "p2.json"]


def test_import_refuses_bad_layouts_and_writes_nothing(make_store: StoreFactory, tmp_path: Path) -> None:
    """Misaligned files, bad JSON, another encoder or a non-empty target: error, nothing stored."""
    src = make_store()
    populate(src, 4, 2)
    out = tmp_path / "out"
    export_paper(src, out)
    lines = (out / "episodic.jsonl").read_text().splitlines()
    (out / "episodic.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    dst = make_store()
    with pytest.raises(InvalidInput, match="3 lines but episodic.faiss has 4"):
        import_paper(dst, out)
    (out / "episodic.jsonl").write_text("\n".join([*lines[:-1], "{not json"]) + "\n")
    with pytest.raises(InvalidInput, match="line 4"):
        import_paper(dst, out)
    assert dst.count("episodic") == dst.count("visual") == dst.count("semantic") == 0
    with pytest.raises(EncoderMismatch):
        import_paper(make_store(encoder="other"), out)
    with pytest.raises(InvalidInput):
        export_paper(src, out)  # not empty
