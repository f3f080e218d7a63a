"""``RunSummary``: the authoritative status and token totals of one run."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["RUN_STATUSES", "RunStatus", "RunSummary", "other_users_summary_error"]

RunStatus = Literal["running", "success", "error", "interrupted", "cancelled"]
RUN_STATUSES: tuple[RunStatus, ...] = ("running", "success", "error", "interrupted", "cancelled")


class RunSummary(BaseModel):
    """Status, timing and token usage of one run, as the journal writes it to its store.

    The token keys are exactly those of ``RunJournal.get_completion_data()``. A run whose
    process died before a terminal outcome keeps the status ``running``.
    """

    model_config = ConfigDict(extra="forbid")

    thread_id: str
    run_id: str
    user_id: str | None = None
    status: RunStatus = "running"
    started_at: datetime | None = None
    ended_at: datetime | None = None
    duration_ms: int | None = Field(default=None, ge=0)
    error: dict[str, str] | None = None
    total_input_tokens: int = 0
    total_output_tokens: int = 0
    total_tokens: int = 0
    llm_call_count: int = 0
    lead_agent_tokens: int = 0
    subagent_tokens: int = 0
    middleware_tokens: int = 0
    token_usage_by_model: dict[str, dict[str, int]] = Field(default_factory=dict)
    message_count: int = 0
    last_ai_message: str | None = None
    first_human_message: str | None = None
    #: Events of the run its store refused for good, dropped by the journal (logged at ERROR).
    dropped_events: int = Field(default=0, ge=0)
    #: Estimated cost in USD (see ``deerflow_journal.cost``): ``None`` unless every model the
    #: run used is priced; summaries written before this field read back with ``None``.
    estimated_cost_usd: float | None = Field(default=None, ge=0)
    #: Estimated cost in USD of each model in ``token_usage_by_model`` (``None``: unpriced).
    estimated_cost_by_model: dict[str, float | None] = Field(default_factory=dict)

    def to_json_dict(self) -> dict[str, Any]:
        """Return the summary as plain JSON values (timestamps as ISO-8601 strings)."""
        return self.model_dump(mode="json")


def other_users_summary_error(summary: Mapping[str, Any]) -> PermissionError:
    """The error a store raises instead of replacing a run summary another user wrote."""
    return PermissionError(
        f"the summary of run {summary['run_id']!r} in thread {summary['thread_id']!r} was "
        "written by another user; only that user (in its user_scope) may replace it"
    )
