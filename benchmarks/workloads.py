"""Event workloads shared by the store benchmarks: realistic sizes, one thread, many runs."""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from langchain_core.messages import AIMessage

THREAD = "bench-thread"


def ai_message_dump(i: int, text_bytes: int = 1100) -> dict[str, Any]:
    """An AI message ``model_dump()`` of about 1.5 KB, like a real tool-calling response."""
    message = AIMessage(
        content=f"step {i}: " + "lorem ipsum dolor sit amet " * (text_bytes // 27),
        tool_calls=[{"name": "search", "args": {"query": f"weather {i}"}, "id": f"call_{i}"}],
        usage_metadata={"input_tokens": 812, "output_tokens": 64, "total_tokens": 876},
        response_metadata={"model_name": "fake-chat", "finish_reason": "tool_calls"},
        id=f"run-{i}",
    )
    return message.model_dump()


def make_events(
    count: int, runs: int, *, thread_id: str = THREAD, text_bytes: int = 1100
) -> list[dict[str, Any]]:
    """``count`` events over ``runs`` runs: AI responses, tool results, traces and subagent steps.

    About half are ``message`` rows; every tenth is a subagent step with a ``task_id``.
    """
    per_run = max(1, count // runs)
    events = []
    for i in range(count):
        run_id = f"run-{i // per_run:04d}"
        kind = i % 10
        if kind in (0, 4):
            event = {
                "event_type": "llm.ai.response",
                "category": "message",
                "content": ai_message_dump(i, text_bytes),
                "metadata": {
                    "caller": "lead_agent",
                    "usage": {"input_tokens": 812, "output_tokens": 64, "total_tokens": 876},
                    "latency_ms": 412,
                    "llm_call_index": i % 7 + 1,
                },
            }
        elif kind in (1, 5, 7):
            event = {
                "event_type": "llm.tool.result",
                "category": "message",
                "content": {
                    "type": "tool",
                    "content": f"result {i} " * 20,
                    "tool_call_id": f"c{i}",
                },
                "metadata": {"caller": "lead_agent"},
            }
        elif kind == 9:
            event = {
                "event_type": "subagent.step",
                "category": "subagent",
                "content": {
                    "task_id": f"task-{i % 3}",
                    "message_index": i,
                    "kind": "ai",
                    "text": "thinking " * 30,
                    "truncated": False,
                    "tool_calls": [],
                },
                "metadata": {"task_id": f"task-{i % 3}", "message_index": i},
            }
        else:
            event = {
                "event_type": "run.start" if kind == 2 else "llm.error",
                "category": "trace",
                "content": {"chain": "agent"} if kind == 2 else f"trace detail {i} " * 10,
                "metadata": {"caller": "lead_agent"},
            }
        events.append({"thread_id": thread_id, "run_id": run_id, **event})
    return events


async def median_seconds(fn: Callable[[], Awaitable[Any]], repeat: int = 30) -> float:
    """Median wall time of ``repeat`` awaited calls, after two warm-up calls."""
    for _ in range(2):
        await fn()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        await fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def line(label: str, value: float, unit: str, extra: str = "") -> None:
    """Print one benchmark figure on one line."""
    print(f"{label:<58} {value:>12,.1f} {unit}{('  ' + extra) if extra else ''}", flush=True)
