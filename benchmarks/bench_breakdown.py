"""Where a journaled ``ainvoke`` spends its instructions, part by part, beside the floor handler.

Run: ``.venv/bin/python benchmarks/bench_breakdown.py [--invocations 30] [--warm-up 10]
[--parts a,b]``. It
runs bench_journal's agent (3 model calls, 2 tool calls) with a memory store. Each part is
counted by valgrind's callgrind in a child process of its own. The child runs warm-up
invocations first, so first-use costs such as loading the price table are not counted. Then
the part's function is wrapped so that callgrind counts only inside it: ``--toggle-collect``
on ``functools.reduce``, which calls it. The count covers ``--invocations`` invocations.

A figure includes the wrapper, about 2.5k instructions per call, more for calls with many
keyword arguments. A part called inside another is counted in both. bench_journal.py prints
the totals per invocation that these parts add up to.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_journal import FloorTable, build_agent, floored, journaled
from workloads import callgrind_counts

from deerflow_journal import MemoryRunEventStore

_HANDLER = "deerflow_journal.journal.handler:RunJournal."
# The floor handler's callbacks (it has no on_tool_start).
_FLOOR_CALLBACKS = (
    "on_chain_start",
    "on_chain_end",
    "on_chat_model_start",
    "on_llm_end",
    "on_tool_end",
)

#: Each part: the variant it runs in, and the functions counted (``module:qualified.name``).
PARTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "RunJournal()": ("journal", (_HANDLER + "__init__",)),
    # on_chain_start is a property that hands out this method (without workspace roots).
    "on_chain_start": ("journal", (_HANDLER + "_chain_start",)),
    **{
        name: ("journal", (_HANDLER + name,))
        for name in (
            "on_chain_end",
            "on_chat_model_start",
            "on_llm_end",
            "on_tool_start",
            "on_tool_end",
        )
    },
    "events to rows": ("journal", ("deerflow_journal.stores.base:normalise_journal_batch",)),
    "memory store write": (
        "journal",
        ("deerflow_journal.stores.memory:MemoryRunEventStore._write_now",),
    ),
    "run summary": ("journal", ("deerflow_journal.journal.state:RunState.summary_json",)),
    "floor callbacks": (
        "floor",
        tuple(f"bench_journal:FloorHandler.{name}" for name in _FLOOR_CALLBACKS),
    ),
}


def resolve(target: str) -> tuple[Any, str]:
    """The object that holds ``target`` (``module:qualified.name``) and the name it has there."""
    module_name, _, path = target.partition(":")
    *owners, name = path.split(".")
    owner: Any = importlib.import_module(module_name)
    for part in owners:
        owner = getattr(owner, part)
    return owner, name


def _counted_inside(target: str) -> None:
    """Replace ``target`` with a wrapper that calls it through ``functools.reduce``."""
    owner, name = resolve(target)
    wrapped = getattr(owner, name)

    def through_reduce(*args: Any, **kwargs: Any) -> Any:
        return functools.reduce(lambda _, __: wrapped(*args, **kwargs), (0, 0))

    setattr(owner, name, through_reduce)


async def count_part(part: str, invocations: int, warm_up: int) -> None:
    """In a callgrind child: run the part's variant, counting inside the part's functions."""
    variant_name, targets = PARTS[part]
    agent = build_agent()
    if variant_name == "journal":
        variant = journaled(MemoryRunEventStore())
    else:
        variant = floored(FloorTable(None).write)
    await variant(agent, warm_up)
    for target in targets:
        _counted_inside(target)
    await variant(agent, invocations)


def main(invocations: int, warm_up: int, parts: list[str]) -> None:
    """Count every part in ``parts`` and print one line for each."""
    child = [sys.executable, __file__, "--invocations", str(invocations)]
    child += ["--warm-up", str(warm_up), "--count-part"]
    options = ("--toggle-collect=functools_reduce",)
    counts = callgrind_counts({part: [*child, part] for part in parts}, options)
    if counts is None:
        print("breakdown: not measured  (valgrind not found)", flush=True)
        return
    for part in parts:
        variant_name, targets = PARTS[part]
        label = "journal+memory" if variant_name == "journal" else "floor+memory"
        print(
            f"breakdown {label} {part}: {counts[part] / invocations / 1e3:.1f} k per invocation"
            f"  ({len(targets)} function{'s' if len(targets) > 1 else ''}, callgrind)",
            flush=True,
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--invocations", type=int, default=30, help="counted ainvoke calls")
    parser.add_argument("--warm-up", type=int, default=10, help="uncounted ainvoke calls first")
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated part names")
    parser.add_argument("--count-part", help=argparse.SUPPRESS)  # one callgrind child
    args = parser.parse_args()
    if args.count_part is not None:
        asyncio.run(count_part(args.count_part, args.invocations, args.warm_up))
    else:
        chosen = [part.strip() for part in args.parts.split(",") if part.strip()]
        unknown = [part for part in chosen if part not in PARTS]
        if unknown:
            parser.error(f"unknown part(s) {unknown}; the parts are {list(PARTS)}")
        main(args.invocations, args.warm_up, chosen)
