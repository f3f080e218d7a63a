"""Events shaped as a journal builds them, with every kind of content a store must clean, cut,
stringify or refuse: shared by the tests of the journal's write path."""

from __future__ import annotations

import enum
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage

from deerflow_journal.records import utc_timestamp


class Colour(enum.Enum):
    RED = "red"


class Odd:
    """An object JSON cannot hold: stored as its ``str()``."""

    def __str__(self) -> str:
        return "odd\x00one"


def journal_event(
    thread_id: str,
    event_type: str,
    category: str,
    content: Any,
    metadata: Any,
    *,
    run_id: str = "r",
    user_id: str | None = None,
    created_at: Any = None,
) -> dict[str, Any]:
    """An event as a journal hands it to its store: every field, a stored timestamp."""
    return {
        "event_type": event_type,
        "category": category,
        "content": content,
        "metadata": metadata,
        "thread_id": thread_id,
        "run_id": run_id,
        "user_id": user_id,
        "created_at": utc_timestamp(1_780_000_000.25) if created_at is None else created_at,
    }


def nasty_events(thread_id: str, *, messages: bool = True) -> list[dict[str, Any]]:
    """Events whose content and metadata need every part of the normalisation."""
    multibyte = "é" * 9000  # 18000 bytes: cut inside a character
    events = [
        journal_event(
            thread_id, "run.start", "trace", {"chain": "agent"}, {"caller": "lead_agent"}
        ),
        journal_event(thread_id, "run.start", "trace", "a\x00b \ud800 c", {"k\x00": "\udfff"}),
        journal_event(
            thread_id,
            "llm.tool.result",
            "message",
            {1: "one", None: "none", False: "no", 1.5: "x", Colour.RED: [2**70, -(2**70)]},
            {2: "two", "caller": "lead_agent", "task_id": "task-1", "big": 2**64},
        ),
        journal_event(thread_id, "run.start", "trace", multibyte, {"caller": "lead_agent"}),
        journal_event(thread_id, "run.end", "outputs", {"x": "y" * 70_000}, {"status": "success"}),
        journal_event(
            thread_id,
            "llm.ai.response",
            "message",
            {"odd": Odd(), "when": datetime(2026, 1, 2, tzinfo=UTC), "n": Decimal("1.5")},
            {"caller": "middleware:summarize", "id": uuid.UUID(int=7), "nan": float("nan")},
            user_id="alice",
        ),
        journal_event(thread_id, "llm.error", "trace", "", {"caller": "lead\x00agent"}),
        journal_event(thread_id, "llm.error", "trace", "", {"caller": 7, "task_id": 8}),
        journal_event(thread_id, "llm.error", "trace", "", {"caller": Colour.RED}),
        journal_event(thread_id, "llm.error", "trace", "", {"task_id": "t\ud800"}),
        journal_event(thread_id, "llm.error", "trace", (1, 2), None),
        journal_event(
            thread_id, "llm.error", "trace", "", {}, created_at="2026-03-04T05:06:07+02:00"
        ),
    ]
    if messages:
        events += [
            journal_event(thread_id, "llm.human.input", "message", HumanMessage("hi\x00"), {}),
            journal_event(
                thread_id,
                "llm.ai.response",
                "message",
                AIMessage(
                    "hello",
                    usage_metadata={"input_tokens": 1, "output_tokens": 2, "total_tokens": 3},
                ),
                {"caller": "lead_agent", "usage": {"input_tokens": 1}},
            ),
        ]
    return events
