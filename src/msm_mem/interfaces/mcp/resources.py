"""The resources: a patient's timeline and a claim's supersession chain, as JSON.

``msm-mem://patients/{patient_id}/timeline``: the patient's studies (episodic records), the
versions of their semantic impression, their active claims and their short-term items with
their expiry, each list oldest first, and one merged list of events (time, kind, id, state,
what it supersedes). ``msm-mem://patients/{patient_id}/claims/{key}/chain``: every version of
one claim key (``study:S1|q:any-effusion``), oldest first, each naming the one it supersedes. Each read is
scoped, consent-checked and audited like the tools.
"""

from __future__ import annotations

from typing import Literal

from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel

from ... import InvalidInput
from ..auth.credentials import Caller
from ..http.models import ClaimOut, EpisodeOut, SemanticOut, StmItemOut
from .state import McpState

__all__ = ["ChainOut", "TimelineEventOut", "TimelineOut", "register"]

_JSON = "application/json"


class TimelineEventOut(BaseModel):
    """One entry of a timeline: when (UTC seconds), what and which record it supersedes."""

    time: float
    kind: Literal["study", "semantic", "claim", "stm"]
    id: str
    state: str
    supersedes: str | None


class TimelineOut(BaseModel):
    patient_id: str
    studies: list[EpisodeOut]
    semantic: list[SemanticOut]
    claims: list[ClaimOut]
    stm: list[StmItemOut]
    events: list[TimelineEventOut]


class ChainOut(BaseModel):
    patient_id: str
    key: str
    chain: list[ClaimOut]


def _timeline(state: McpState, who: Caller, patient_id: str) -> TimelineOut:
    p = who.principal
    studies = sorted(state.call(state.mem.episodes, p, patient_id), key=lambda e: (e.timestamp, e.episode_id))
    semantic = state.call(state.mem.semantic_history, p, patient_id, "impression")
    claims = sorted(state.call(state.mem.claims, p, patient_id), key=lambda c: (c.created_at, c.claim_id))
    stm = sorted(state.call(state.mem.stm_items, p, patient_id), key=lambda i: (i.created_at, i.item_id))
    events = [
        TimelineEventOut(time=e.timestamp, kind="study", id=e.episode_id, state=e.state.value, supersedes=e.supersedes)
        for e in studies
    ]
    events += [
        TimelineEventOut(
            time=s.created_at, kind="semantic", id=s.state_id, state=s.state.value, supersedes=s.supersedes
        )
        for s in semantic
    ]
    events += [
        TimelineEventOut(time=c.created_at, kind="claim", id=c.claim_id, state=c.state.value, supersedes=c.supersedes)
        for c in claims
    ]
    events += [
        TimelineEventOut(time=i.created_at, kind="stm", id=i.item_id, state=i.state.value, supersedes=None) for i in stm
    ]
    events.sort(key=lambda e: (e.time, e.kind, e.id))
    return TimelineOut(
        patient_id=patient_id,
        studies=[EpisodeOut.model_validate(e) for e in studies],
        semantic=[SemanticOut.model_validate(s) for s in semantic],
        claims=[ClaimOut.model_validate(c) for c in claims],
        stm=[StmItemOut.model_validate(i) for i in stm],
        events=events,
    )


def register(server: MCPServer[object], state: McpState) -> None:
    """Add the resources to ``server``."""

    @server.resource("msm-mem://patients/{patient_id}/timeline", mime_type=_JSON)
    def timeline(patient_id: str) -> str:
        """A patient's timeline: studies, semantic versions, claims, short-term items with their expiry."""
        uri = f"msm-mem://patients/{patient_id}/timeline"
        return state.resource(uri, patient_id, lambda who: _timeline(state, who, patient_id))

    @server.resource("msm-mem://patients/{patient_id}/claims/{key}/chain", mime_type=_JSON)
    def claim_chain(patient_id: str, key: str) -> str:
        """Every version of one claim of a patient (key such as study:S1|q:any-effusion), oldest first."""
        uri = f"msm-mem://patients/{patient_id}/claims/{key}/chain"

        def body(who: Caller) -> ChainOut:
            if not 1 <= len(key) <= 400:
                raise InvalidInput("the claim key must be 1 to 400 characters (e.g. study:S1|q:any-effusion)")
            chain = state.call(state.mem.claim_history, who.principal, patient_id, key)
            return ChainOut(patient_id=patient_id, key=key, chain=[ClaimOut.model_validate(c) for c in chain])

        return state.resource(uri, patient_id, body)
