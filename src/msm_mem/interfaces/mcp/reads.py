"""The read tools: who the caller is, a patient's semantic state and its history (one page at a
time), and the verification of the audit chain."""

from __future__ import annotations

from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolResult, ToolAnnotations
from pydantic import Field

from ... import RecordPage, SemanticState
from ..auth.credentials import Caller
from ..http.models import Page, SemanticOut, VerifyOut, WhoAmIOut
from .state import McpState
from .tools import PatientId

__all__ = ["register"]

Category = Annotated[str, Field(min_length=1, max_length=100, description="a semantic category, e.g. impression")]
Offset = Annotated[int, Field(ge=0, le=10_000_000, description="the first item of the page")]
Limit = Annotated[int, Field(ge=1, le=500, description="the most items in the page")]

_READS = ToolAnnotations(read_only_hint=True, open_world_hint=False)


def register(server: MCPServer[object], state: McpState) -> None:
    """Add the read tools to ``server``."""

    def paged(records: RecordPage[SemanticState], limit: int) -> Page[SemanticOut]:
        items = [SemanticOut.model_validate(s) for s in records]
        nxt = records.next_offset
        return Page[SemanticOut](items=items, total=records.total, offset=records.offset, limit=limit, next_offset=nxt)

    @server.tool(annotations=_READS, structured_output=True)
    def whoami() -> Annotated[CallToolResult, WhoAmIOut]:
        """The principal you act as (id, role, purpose), your patient scope and your credential's kind."""

        def body(who: Caller) -> WhoAmIOut:
            p = who.principal
            return WhoAmIOut(
                id=p.id,
                role=p.role.value,
                purpose=p.purpose.value,
                patients=list(who.patients),
                credential=who.credential,
            )

        return state.tool("whoami", None, "", body)

    @server.tool(annotations=_READS, structured_output=True)
    def patient_state(
        patient_id: PatientId, category: Category | None = None, offset: Offset = 0, limit: Limit = 100
    ) -> Annotated[CallToolResult, Page[SemanticOut]]:
        """A patient's active semantic state: one version per category (or just category), with its impressions.

        Each version names its evidence tier and the version it supersedes. Audited as a read."""

        def body(who: Caller) -> Page[SemanticOut]:
            size = min(limit, state.config.server.max_page)  # paged in the read: its audit names the page
            read = state.mem.semantic_state
            states = state.call(read, who.principal, patient_id, category, offset=offset, limit=size)
            return paged(states, size)

        return state.tool("patient_state", "read", patient_id, body)

    @server.tool(annotations=_READS, structured_output=True)
    def patient_history(
        patient_id: PatientId, category: Category = "impression", offset: Offset = 0, limit: Limit = 100
    ) -> Annotated[CallToolResult, Page[SemanticOut]]:
        """Every version of a patient's semantic state in one category, oldest first (superseded ones too).

        The whole chain of supersession: each version names the one it replaced. Audited as a read."""

        def body(who: Caller) -> Page[SemanticOut]:
            size = min(limit, state.config.server.max_page)  # paged in the read: its audit names the page
            read = state.mem.semantic_history
            states = state.call(read, who.principal, patient_id, category, offset=offset, limit=size)
            return paged(states, size)

        return state.tool("patient_history", "read", patient_id, body)

    @server.tool(annotations=_READS, structured_output=True)
    def verify_audit(
        full: Annotated[bool, Field(description="recompute every hash (else from the last checkpoint)")] = True,
    ) -> Annotated[CallToolResult, VerifyOut]:
        """Verify the audit tier's hash chain and its signed checkpoints (an auditor or admin credential).

        Returns ok, the number of events, the head hash and, when broken, the first bad
        sequence number and why. Writes nothing."""

        def body(who: Caller) -> VerifyOut:
            return VerifyOut.model_validate(state.call(state.mem.verify_audit, who.principal, full=full))

        return state.tool("verify_audit", None, "", body)
