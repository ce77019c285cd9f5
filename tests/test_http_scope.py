"""The service's patient scope, as a real process over each backend: for every role and every
endpoint that names a patient, another patient is refused and the refusal audited, and no
answer carries the other patient's id."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tests.helpers import png
from tests.http_support import OTHER, OWN, QUESTION, ROLES, Served, serve_backend

pytestmark = pytest.mark.system


@pytest.fixture(scope="module", params=[pytest.param("sqlite"), pytest.param("postgres", marks=pytest.mark.postgres)])
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One server per backend for the module (embedded: one worker; PostgreSQL: two)."""
    yield from serve_backend(request.param, tmp_path_factory.mktemp(f"scope-{request.param}"))


def _form(served: Served, question: bool = True) -> dict[str, Any]:
    data = {"question": QUESTION} if question else {}
    return {"files": {"image": ("x.png", png(served.images, 2).read_bytes(), "image/png")}, "data": data}


#: every endpoint that names a patient: (name, method, path after /v1/patients/{p}, request)
PATIENT_ENDPOINTS: list[tuple[str, str, str, Callable[[Served], dict[str, Any]]]] = [
    ("ask", "POST", "/ask", lambda s: _form(s)),
    ("retrieve", "POST", "/retrieve", lambda s: _form(s, question=False)),
    ("observe", "POST", "/observe", lambda s: _form(s)),
    ("consolidate", "POST", "/stm/M-none/consolidate", lambda s: {"json": {"answer": "Clear lungs noted."}}),
    ("feedback", "POST", "/studies/S1/feedback", lambda s: {"json": {"accept": True}}),
    ("semantic", "GET", "/semantic", lambda s: {}),
    ("semantic history", "GET", "/semantic/history", lambda s: {}),
    ("episodes", "GET", "/episodes", lambda s: {}),
    ("visuals", "GET", "/visuals", lambda s: {}),
    ("claims", "GET", "/claims", lambda s: {}),
    ("claim history", "GET", "/claims/history", lambda s: {"params": {"key": "study:S1"}}),
    ("stm", "GET", "/stm", lambda s: {}),
    ("shred", "POST", "/shred", lambda s: {"json": {"reason": "erasure request"}}),
]


@pytest.mark.parametrize("role", sorted(ROLES))
def test_no_role_reads_another_patient_and_every_denial_is_audited(served: Served, role: str) -> None:
    """For each role and each patient endpoint: the other patient is refused (403) with a denial
    in the audit trail naming the key's actor; the own patient is served or refused by role
    (audited too); no answer ever carries the other patient's id."""
    actor = ROLES[role].id
    with httpx.Client(base_url=served.url, headers=served.headers(role), timeout=30) as http:
        for name, method, path, request in PATIENT_ENDPOINTS:
            for patient in (OTHER, OWN):
                if name == "shred" and patient == OWN:
                    continue  # the module's store keeps its patient
                before = served.head_seq()
                r = http.request(method, f"/v1/patients/{patient}{path}", **request(served))
                assert OTHER not in r.text, (role, name, patient)
                events = served.audit_events(before)
                denied = [e for e in events if e["outcome"] == "denied" and e["actor"] == actor]
                if patient == OTHER:
                    assert r.status_code == 403, (role, name, r.text)
                    assert r.headers["content-type"] == "application/problem+json"
                    assert denied, f"{role} {name}: the refusal is not audited"
                    assert not [e for e in events if e["outcome"] == "success"], (role, name)
                elif r.status_code == 403:
                    assert denied, f"{role} {name} on its own patient: the refusal is not audited"
                else:
                    assert r.status_code in (200, 201, 404, 409), (role, name, r.status_code, r.text)
