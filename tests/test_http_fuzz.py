"""Property-based fuzzing of the served OpenAPI schema against a real ``msm-mem serve`` process on
loopback, over a store with data and over an empty one: for every operation, cases generated from
the schema (valid and invalid ones) sent with several credentials, and every answer checked:
never a 5xx, a documented status, the documented content type, a body and headers that match the
schema, and no operation that succeeds without its credential. The examples are bounded (a fixed
count per operation, derandomised) and failures are collected rather than shrunk, so the run is
bounded and names every distinct failure at once."""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from PIL import Image

from msm_mem import MsmMem
from tests.helpers import ADMIN
from tests.http_support import OWN, Served, make_store, start, stop

pytestmark = [pytest.mark.slow, pytest.mark.system]

schemathesis = pytest.importorskip("schemathesis")

#: generated cases per operation and mode (valid / invalid data), drawn from a fixed seed
#: (derandomised): every machine sends the same cases, however slow it is
EXAMPLES = 12
#: the credentials a case is sent with: every patient (a clinician), the scoped agent and critic,
#: the system role, and an admin acting outside its scope with a break-glass reason
POOL = ("everyone", "agent", "critic", "system", "admin")


def _png(seed: int) -> bytes:
    buf = io.BytesIO()
    pixels = np.random.default_rng(seed).integers(0, 256, (48, 48), dtype=np.uint8)
    Image.fromarray(pixels, mode="L").save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module", params=["data", "empty"])
def fuzzed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A server over a store with three studies of one patient and one of another, or over an
    empty store (one worker each)."""
    root = tmp_path_factory.mktemp(f"fuzz-{request.param}")
    if request.param == "data":
        directory = make_store(root)
    else:
        directory = root / "store"
        (root / "images").mkdir()
        MsmMem.init(directory, ADMIN).close()
    # the fuzzer sends hundreds of requests without a valid credential from one address: the
    # failed-login throttle (tests/test_http_limits.py) would answer them 429
    server = start(root, directory, extra=["--max-login-failures", "1000000"])
    server.extra["store"] = request.param
    yield server
    stop(server)


def _checks() -> list[Any]:
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        ignored_auth,
        response_headers_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    return [
        not_a_server_error,
        status_code_conformance,
        content_type_conformance,
        response_schema_conformance,
        response_headers_conformance,
        ignored_auth,
    ]


def _with_image(case: Any, image: bytes) -> Any:
    """A generated upload case with a real image (or a stored study) in place of random bytes,
    so the fuzzing reaches the governed operation behind the upload checks."""
    if isinstance(case.body, dict):
        case.body.pop("image", None)
        case.body.pop("image_study", None)
        if len(case.body) % 2:
            case.body["image_study"] = "S1"
        else:
            case.body["image"] = image
    return case


def _strategy(operation: Any, mode: Any) -> Any:
    from schemathesis import GenerationMode

    strategy = operation.as_strategy(generation_mode=mode)
    path = operation.path
    if "{patient_id}" in path and not path.endswith("/shred"):  # the store keeps its patient
        own = operation.as_strategy(generation_mode=mode, path_parameters={"patient_id": OWN})
        if mode == GenerationMode.POSITIVE and path.endswith(("/ask", "/observe", "/retrieve")):
            image = _png(7)
            own = own.map(lambda case: _with_image(case, image))
            return st.one_of(strategy, own, own)  # mostly cases that get past the upload checks
        strategy = st.one_of(strategy, own)
    return strategy


def _fuzz(
    served: Served,
    operation: Any,
    mode: Any,
    checks: list[Any],
    failures: dict[tuple[str, str], str],
    statuses: Counter[tuple[str, int]],
) -> None:
    """Send ``EXAMPLES`` generated cases of one operation; a check's failure is recorded under
    the operation and its first line (not raised, so the run goes on and nothing is shrunk)."""

    @given(case=_strategy(operation, mode), role=st.sampled_from(POOL))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    def send(case: Any, role: str) -> None:
        headers = served.headers(role)
        if role == "admin":
            headers["X-Break-Glass-Reason"] = "fuzzing the schema"
        try:
            response = case.call_and_validate(base_url=served.url, headers=headers, checks=checks, timeout=60)
        except (Exception, BaseExceptionGroup) as exc:  # the checks raise a group of failures
            key = (operation.label, type(exc).__name__ + ": " + str(exc).splitlines()[0][:200])
            failures.setdefault(key, str(exc)[:2000])
        else:
            statuses[(operation.label, response.status_code)] += 1

    send()


def test_the_served_schema_holds_under_fuzzing(fuzzed: Served) -> None:
    """Every operation of /openapi.json, fuzzed with valid and invalid cases and five
    credentials: no 5xx, no status, content type, body or header the schema does not document,
    no success without a credential; and the governed operations are reached (2xx seen)."""
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_url(fuzzed.url + "/openapi.json")
    checks = _checks()
    failures: dict[tuple[str, str], str] = {}
    statuses: Counter[tuple[str, int]] = Counter()
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                _fuzz(fuzzed, operation, mode, checks, failures, statuses)
            except Unsatisfiable:  # nothing of the operation can be made invalid (no parameters, no body)
                assert mode == GenerationMode.NEGATIVE, operation.label
    assert not failures, "\n\n".join(f"{op} {kind}\n{text}" for (op, kind), text in failures.items())
    assert {label for label, _ in statuses} == {op.label for op in operations}  # every operation was sent
    answered = {label for (label, status), _ in statuses.items() if status < 300}
    expected = {"GET /health", "GET /ready", "GET /v1/whoami", "GET /v1/audit/verify", "POST /v1/audit/checkpoint"}
    if fuzzed.extra["store"] == "data":
        expected |= {
            "GET /v1/patients/{patient_id}/episodes",
            "POST /v1/patients/{patient_id}/ask",
            "POST /v1/patients/{patient_id}/retrieve",
            "POST /v1/patients/{patient_id}/observe",
        }
    missing = expected - answered
    assert not missing, sorted((k, n) for k, n in statuses.items() if k[0] in missing)
    assert not [line for line in fuzzed.log.read_text().splitlines() if "unexpected" in line]


def test_health_and_readiness_need_no_credential_in_the_schema() -> None:
    """/health and /ready are documented without the bearer requirement (they answer without
    one); every other operation keeps it (fuzzing found the schema claiming a credential)."""
    from msm_mem.interfaces.http.app import openapi_document

    doc = openapi_document()
    assert doc["security"] == [{"bearer": []}]
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if path in ("/health", "/ready"):
                assert op.get("security") == [], (method, path)
            else:
                assert "security" not in op, (method, path)


def test_upload_forms_are_described_as_the_server_takes_them() -> None:
    """The form bodies of ask, observe and retrieve have no null fields (a form leaves a field
    out; fuzzing sent "null" and the image as a plain field) and need exactly one of image and
    image_study, as the server does."""
    from msm_mem.interfaces.http.app import openapi_document

    doc = openapi_document()
    schemas = doc["components"]["schemas"]
    for name in ("ask", "observe", "retrieve"):
        content = doc["paths"][f"/v1/patients/{{patient_id}}/{name}"]["post"]["requestBody"]["content"]
        body = schemas[content["multipart/form-data"]["schema"]["$ref"].rsplit("/", 1)[-1]]
        assert body["oneOf"] == [{"required": ["image"]}, {"required": ["image_study"]}], name
        assert not [p for p, prop in body["properties"].items() if "anyOf" in prop or prop.get("type") == "null"]
        assert body["properties"]["image"]["contentMediaType"] == "application/octet-stream"
