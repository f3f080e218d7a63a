"""Read helpers for a journal's readers: thread history, memory audit, workspace review."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from deerflow_journal.catalog import (
    MEMORY_CONTEXT_EVENT,
    WORKSPACE_CHANGES_EVENT,
    is_middleware_caller,
)
from deerflow_journal.records import AUTO, Auto, RunEvent, check_text
from deerflow_journal.stores.base import AI_RESPONSE_EVENT_TYPES, RunEventStore

__all__ = ["latest_workspace_changes", "memory_context_digests", "visible_messages"]

_PAGE = 500


def _caller(event: Mapping[str, Any]) -> str:
    metadata = event.get("metadata")
    caller = metadata.get("caller") if isinstance(metadata, Mapping) else None
    return caller if isinstance(caller, str) else ""


def _hidden(event: Mapping[str, Any]) -> bool:
    content = event.get("content")
    extra = content.get("additional_kwargs") if isinstance(content, Mapping) else None
    return isinstance(extra, Mapping) and extra.get("hide_from_ui") is True


def _visible(event: Mapping[str, Any]) -> bool:
    if event.get("category") != "message" or _hidden(event):
        return False
    caller = _caller(event)
    if is_middleware_caller(caller):
        return False
    return not (
        event.get("event_type") in AI_RESPONSE_EVENT_TYPES and caller.startswith("subagent:")
    )


def visible_messages(events: Iterable[RunEvent]) -> list[RunEvent]:
    """The message rows a thread-history view shows, in the order given.

    Drops non-message rows, rows whose ``metadata.caller`` is a middleware, subagent AI
    responses, and messages whose ``additional_kwargs.hide_from_ui`` is true.
    """
    return [event for event in events if _visible(event)]


async def memory_context_digests(
    store: RunEventStore,
    thread_id: str,
    run_ids: Iterable[str],
    *,
    user_id: str | Auto | None = AUTO,
) -> dict[str, str]:
    """Map each run to the ``content_sha256`` of its ``context:memory`` event (if it has one)."""
    digests: dict[str, str] = {}
    for run_id in [run_ids] if isinstance(run_ids, str) else run_ids:
        check_text(run_id, "run_id")  # None would read the whole thread
        events = await store.list_events(
            thread_id, run_id, event_types=MEMORY_CONTEXT_EVENT.event_type, limit=1, user_id=user_id
        )
        content = events[0]["content"] if events else None
        digest = content.get("content_sha256") if isinstance(content, Mapping) else None
        if isinstance(digest, str):
            digests[run_id] = digest
    return digests


async def latest_workspace_changes(
    store: RunEventStore,
    thread_id: str,
    run_id: str,
    *,
    user_id: str | Auto | None = AUTO,
) -> dict[str, Any] | None:
    """The ``metadata.workspace_changes`` payload of the run's newest such event, or ``None``."""
    check_text(run_id, "run_id")  # None would read the whole thread
    latest: RunEvent | None = None
    after_seq: int | None = None
    while True:
        page = await store.list_events(
            thread_id,
            run_id,
            event_types=WORKSPACE_CHANGES_EVENT.event_type,
            limit=_PAGE,
            after_seq=after_seq,
            user_id=user_id,
        )
        if page:
            latest, after_seq = page[-1], page[-1]["seq"]
        if len(page) < _PAGE:
            break
    payload = latest["metadata"].get("workspace_changes") if latest else None
    return payload if isinstance(payload, dict) else None
