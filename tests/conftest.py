"""Shared fixtures: every store backend runs the same contract tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from msm_mem import Store
from msm_mem.storage.sqlite import SqliteStore
from msm_mem.testing import FixedClock

settings.register_profile(
    "default", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("default")

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
DIM = 16

StoreFactory = Callable[..., Store]


def _sqlite_factory(tmp_path: Path) -> StoreFactory:
    counter = iter(range(10**6))

    def make(dim: int = DIM, encoder: str = "test") -> Store:
        return SqliteStore.create(tmp_path / f"store{next(counter)}", dim=dim, encoder=encoder)

    return make


BACKENDS: dict[str, Callable[[Path], StoreFactory]] = {"sqlite": _sqlite_factory}


@pytest.fixture(params=sorted(BACKENDS))
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """A factory of empty stores of one backend; every store made is closed afterwards."""
    made: list[Store] = []
    factory = BACKENDS[request.param](tmp_path)

    def make(dim: int = DIM, encoder: str = "test") -> Store:
        store = factory(dim, encoder)
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


@pytest.fixture
def store(make_store: StoreFactory) -> Store:
    """One empty store (dimension 16) of each backend."""
    return make_store()


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock()


def random_unit(rng: np.random.Generator, dim: int = DIM) -> np.ndarray:
    v = rng.standard_normal(dim)
    return (v / np.linalg.norm(v)).astype(np.float32)


def shared_path(*parts: str) -> Path:
    """A path under ../shared, skipping the test with a reason when it is absent."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"../shared/{'/'.join(parts)} is absent (third-party data lives beside the repository)")
    return path
