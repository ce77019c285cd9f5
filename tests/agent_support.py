"""What the agent's tests share: the synthetic rows by patient, queries, a store holding each
patient's first study, counts of what memory holds, the audit since a seq, fake backbones and
policies, and a new agent over a store's memory."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from msm_mem._agent.agent import MemoryAgent, Query
from msm_mem._agent.policy import PolicyQuery, RetrievalStep, Step
from msm_mem._api.mem import MsmMem
from msm_mem._storage.base import Store
from msm_mem.datasets.manifest import ManifestRow
from msm_mem.plugins.backbones.base import BackboneReply, BackboneRequest
from msm_mem.plugins.backbones.nonparametric import NonparametricBackbone
from msm_mem.testing import FixedClock
from tests.conftest import MemFactory
from tests.helpers import INGEST
from tests.layers import Layers, layers_of


def by_patient(rows: Sequence[ManifestRow]) -> dict[str, list[ManifestRow]]:
    out: dict[str, list[ManifestRow]] = {}
    for r in sorted(rows, key=lambda r: (r.patient_id, r.timestamp, r.study_id)):
        out.setdefault(r.patient_id, []).append(r)
    return out


def query(row: ManifestRow, patient: str | None = None) -> Query:
    return Query(patient or row.patient_id, row.image, row.question, timestamp=row.timestamp, study_id=row.study_id)


def later(rows: Sequence[ManifestRow]) -> list[ManifestRow]:
    """The second study of every patient that has one."""
    return [rs[1] for rs in by_patient(rows).values() if len(rs) > 1]


def open_store(new_mem: MemFactory, rows: Sequence[ManifestRow], name: str = "store") -> Layers:
    """The layers (``tests/layers.py``) of a fresh store (of the backend of ``new_mem``) holding
    the first study of each patient, ingested through the API; close them after use."""
    clock = FixedClock()
    mem = new_mem(name, clock=clock)
    mem.ingest(INGEST, [rs[0] for rs in by_patient(rows).values()])
    return layers_of(mem, clock)


@contextmanager
def _stored(target: Layers | MsmMem) -> Iterator[Store]:
    """The store of ``target``: the layers' own handle, or one of its own on an ``MsmMem``'s store."""
    if isinstance(target, Layers):
        yield target.store
        return
    with layers_of(target) as layers:
        yield layers.store


def counts(target: Layers | MsmMem) -> dict[str, int]:
    with _stored(target) as s:
        claims = sum(len(s.record_ids("claims", p)) for p in s.patients())
        return {
            "episodic": s.count("episodic"),
            "visual": s.count("visual"),
            "semantic": s.count("semantic"),
            "claims": claims,
            "stm": len(s.stm_list()),
        }


def audit_since(target: Layers | MsmMem, seq: int) -> list[dict[str, Any]]:
    with _stored(target) as s:
        return [json.loads(r.payload) for r in s.iter_audit(seq + 1)]


class Recording:
    """A backbone that records requests and answers with the nonparametric vote."""

    name = "recording"

    def __init__(self) -> None:
        self.requests: list[BackboneRequest] = []

    def generate(self, request: BackboneRequest) -> BackboneReply:
        self.requests.append(request)
        return NonparametricBackbone().generate(request)


class Faulty:
    """A backbone that fails in a given way."""

    name = "faulty"

    def __init__(self, result: object) -> None:
        self.result = result

    def generate(self, request: BackboneRequest) -> Any:
        if isinstance(self.result, BaseException):
            raise self.result
        return self.result


class Always:
    """A policy that never stops and always asks for the same step."""

    def __init__(self, step: Step) -> None:
        self.step = step

    def next(self, query: PolicyQuery, history: Sequence[RetrievalStep]) -> Step | None:
        return self.step


def agent(layers: Layers, **kwargs: Any) -> MemoryAgent:
    """A new agent over the store's memory, with the store's directory (as MsmMem makes its own)."""
    kwargs.setdefault("directory", layers.directory)
    return MemoryAgent(layers.gm, layers.encoder, kwargs.pop("backbone", None), **kwargs)
