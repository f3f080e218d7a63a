"""Event workloads shared by the store benchmarks: realistic sizes, one thread, many runs."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

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


K = TypeVar("K")


def callgrind_counts(
    children: Mapping[K, list[str]], options: tuple[str, ...] = ("--instr-atstart=no",)
) -> dict[K, int] | None:
    """The instructions each child program counted (every thread), or None without valgrind.

    Each runs at once in its own process under ``valgrind --tool=callgrind``, which counts
    instructions, not seconds: the figures repeat whatever else the machine is doing. With the
    default ``options`` a child counts only inside ``counted()``.
    """
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        return None  # callgrind_control ships with valgrind
    with tempfile.TemporaryDirectory() as tmp:
        processes = {
            key: subprocess.Popen(
                [
                    "valgrind",
                    "--tool=callgrind",
                    *options,
                    f"--callgrind-out-file={Path(tmp) / str(i)}",
                    *command,
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i, (key, command) in enumerate(children.items())
        }
        counts = {}
        try:
            for key, process in processes.items():
                _, err = process.communicate()
                found = re.search(r"Collected : (\d+)", err)
                if process.returncode != 0 or found is None:
                    raise RuntimeError(f"callgrind run of {key!r} failed:\n{err[-2000:]}")
                counts[key] = int(found.group(1))
        finally:
            for process in processes.values():  # after a failure, stop the others
                if process.poll() is None:
                    process.kill()
                    process.wait()
    return counts


@contextlib.contextmanager
def counted() -> Iterator[None]:
    """In a ``callgrind_counts`` child: count the instructions of the block, and only those."""
    control = ["callgrind_control", "-i"]
    subprocess.run([*control, "on", str(os.getpid())], check=True, capture_output=True)
    try:
        yield
    finally:
        subprocess.run([*control, "off", str(os.getpid())], check=True, capture_output=True)
