"""AsyncMemoryClient against a real ``msm-mem serve`` process (embedded store, one worker): the
operations awaited one by one and several at once, the library's records and exceptions."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from msm_mem import AccessDenied, AsyncMemoryClient, ConsentRecord, NotFound, StmItem
from tests.http_support import OTHER, OWN, QUESTION, ROLES, Served, make_store, start, stop

pytestmark = pytest.mark.system


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("serve-async")
    server = start(root, make_store(root))
    yield server
    stop(server)


def _png(seed: int) -> bytes:
    buf = io.BytesIO()
    pixels = np.random.default_rng(seed).integers(0, 256, (64, 64), dtype=np.uint8)
    Image.fromarray(pixels, mode="L").save(buf, "PNG")
    return buf.getvalue()


def _client(served: Served, role: str, **kwargs: object) -> AsyncMemoryClient:
    return AsyncMemoryClient(served.url, served.tokens[role], **kwargs)  # type: ignore[arg-type]


def test_the_async_client_runs_the_clinical_loop(served: Served) -> None:
    """whoami, ask (upload and stored study), retrieve, observe then consolidate, a critic's
    feedback and the reads, awaited: the same records the sync client returns."""

    async def scenario() -> None:
        async with _client(served, "agent") as agent, _client(served, "critic") as critic:
            assert await agent.health()
            assert await agent.whoami() == (ROLES["agent"], (OWN,))
            answer = await agent.ask(OWN, _png(1), QUESTION, study_id="S-async")
            assert answer.answer and answer.evidence and answer.gate is not None
            stored = await agent.ask(OWN, None, QUESTION, image_study="S0", write_back=False)
            assert stored.gate is None and stored.evidence
            found = await agent.retrieve(OWN, _png(2), k=2)
            assert found.patient_id == OWN and 0 < len(found.items) <= 2
            item = await agent.observe(OWN, _png(3), "Any change?")
            assert isinstance(item, StmItem) and item.patient_id == OWN
            written = await agent.consolidate(OWN, item.item_id, "Stable right lower lobe consolidation noted.")
            assert written.gate.reasons
            claim = await critic.feedback(OWN, "S-async", accept=False, correction="Left basal effusion.")
            assert claim.content == "Left basal effusion."
            history = await agent.claim_history(OWN, claim.key)
            assert history[-1].content == "Left basal effusion."
            episodes = await agent.episodes(OWN)
            assert episodes and {e.patient_id for e in episodes} == {OWN} and episodes[0].z.size == 0
            assert {v.patient_id for v in await agent.visuals(OWN)} == {OWN}
            assert await agent.semantic_state(OWN) and await agent.semantic_history(OWN)
            assert {c.patient_id for c in await agent.claims(OWN)} == {OWN}
            assert all(i.patient_id == OWN for i in await agent.stm_items(OWN))
            with pytest.raises(AccessDenied):
                await agent.episodes(OTHER)
            with pytest.raises(NotFound):
                await agent.consolidate(OWN, "M-nothing", "Some answer about the lobe.")

    asyncio.run(scenario())


def test_the_async_client_runs_governance(served: Served, tmp_path: Path) -> None:
    """Consent grant, list and revoke (break-glass), key rotation, audit verification,
    checkpoint, FHIR export and maintenance, awaited as each role."""
    consent = ConsentRecord("ignored", OWN, "role:agent", "research", "permit", ("*",), time.time() - 1)

    async def scenario() -> None:
        async with _client(served, "admin") as admin:
            (granted,) = await admin.grant([consent])
            assert granted.consent_id in {c.consent_id for c in await admin.consents(OWN)}
            assert await admin.rotate_keys("async rotation") >= 1
        async with _client(served, "admin", break_glass_reason="revoking a test consent") as glass:
            await glass.revoke(granted.consent_id)
            assert await glass.shred("PAT-SHRED-A", "erasure request") == 0
        async with _client(served, "auditor") as auditor:
            assert (await auditor.verify_audit()).ok
            size, head = await auditor.checkpoint()
            assert size > 0 and len(head) == 64
            out = tmp_path / "fhir.ndjson"
            assert await auditor.export_fhir(out) == len(out.read_text().splitlines()) > 0
        async with _client(served, "system") as system:
            assert (await system.maintain()).checkpoint is not None

    asyncio.run(scenario())


def test_many_awaited_calls_at_once_are_all_answered(served: Served) -> None:
    """Twelve reads and four observations gathered at once on one client: every one answered,
    each observation stored once, and the audit chain still verifies."""

    async def scenario() -> list[object]:
        async with _client(served, "agent", timeout=120) as agent:
            reads = [agent.episodes(OWN) for _ in range(12)]
            writes = [agent.observe(OWN, _png(10 + i), f"Gathered question {i}?") for i in range(4)]
            return list(await asyncio.gather(*reads, *writes))

    results = asyncio.run(scenario())
    items = [r for r in results if isinstance(r, StmItem)]
    assert len(results) == 16 and len(items) == 4 and len({i.item_id for i in items}) == 4

    async def check() -> None:
        async with _client(served, "agent") as agent:
            stored = {i.item_id for i in await agent.stm_items(OWN)}
            assert {i.item_id for i in items} <= stored
        async with _client(served, "auditor") as auditor:
            assert (await auditor.verify_audit()).ok

    asyncio.run(check())
