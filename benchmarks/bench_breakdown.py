"""Where a journaled ``ainvoke`` spends its instructions, part by part, beside the floor handler.

Run: ``.venv/bin/python benchmarks/bench_breakdown.py [--invocations 30] [--warm-up 10]
[--parts a,b]``.

It runs bench_journal's agent (3 model calls, 2 tool calls), either with a journal on a
memory store or with the floor handler, which keeps its rows in a list. Each part is
counted by valgrind's callgrind in a child process of its own:
- the child first runs warm-up invocations, uncounted, so first-use costs such as loading the
  price table are left out;
- it then replaces the part's functions with a wrapper that calls them through
  ``functools.reduce``, and callgrind counts only inside that call (``--toggle-collect``);
- the count covers ``--invocations`` invocations.

Beside each figure is how often the part is called per invocation: the wrapper adds about
2.5k instructions to each call, more for a call with many keyword arguments. A part called
inside another is counted in both, and the parts leave out LangChain's dispatch and the
journal's buffer and writer, so they add up to no total.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_journal import FloorHandler, FloorTable, build_agent, floored, journaled
from workloads import callgrind_counts, counted

from deerflow_journal import MemoryRunEventStore

_HANDLER = "deerflow_journal.journal.handler:RunJournal."
_CALLBACKS = (
    "on_chain_start",
    "on_chain_end",
    "on_chat_model_start",
    "on_llm_end",
    "on_tool_start",
    "on_tool_end",
)

#: Each part: the variant it runs in, and the functions counted (``module:qualified.name``).
PARTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "RunJournal()": ("journal", (_HANDLER + "__init__",)),
    **{
        # on_chain_start is a property that hands out _chain_start (without workspace roots).
        name: ("journal", (_HANDLER + ("_chain_start" if name == "on_chain_start" else name),))
        for name in _CALLBACKS
    },
    "events to rows": ("journal", ("deerflow_journal.stores.base:normalise_journal_batch",)),
    "memory store write": (
        "journal",
        ("deerflow_journal.stores.memory:MemoryRunEventStore._write_now",),
    ),
    "run summary": ("journal", ("deerflow_journal.journal.state:RunState.summary_json",)),
    "floor events to rows": ("floor", ("bench_journal:FloorHandler.rows",)),
    "floor callbacks": (  # those the floor handler has (it has no on_tool_start)
        "floor",
        tuple(
            f"bench_journal:FloorHandler.{name}"
            for name in _CALLBACKS
            if name in vars(FloorHandler)
        ),
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


def _through_reduce(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` called inside ``functools.reduce``, where callgrind counts."""

    def through_reduce(*args: Any, **kwargs: Any) -> Any:
        return functools.reduce(lambda _, __: function(*args, **kwargs), (0, 0))

    return through_reduce


def _variant(part: str) -> Any:
    """The bench_journal variant a part runs in."""
    if PARTS[part][0] == "journal":
        return journaled(MemoryRunEventStore())
    return floored(FloorTable(None).write)


async def count_part(part: str, invocations: int, warm_up: int) -> None:
    """In a callgrind child: run the part's variant, counting inside the part's functions."""
    agent, variant = build_agent(), _variant(part)
    await variant(agent, warm_up)
    for owner, name in map(resolve, PARTS[part][1]):
        setattr(owner, name, _through_reduce(getattr(owner, name)))
    with counted():
        await variant(agent, invocations)


async def calls_per_invocation(parts: list[str], invocations: int = 2) -> dict[str, float]:
    """How often each part's functions are called per invocation, after one warm-up."""
    calls = dict.fromkeys(parts, 0)

    def counting(part: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def wrap(function: Callable[..., Any]) -> Callable[..., Any]:
            def count(*args: Any, **kwargs: Any) -> Any:
                calls[part] += 1
                return function(*args, **kwargs)

            return count

        return wrap

    for part in parts:
        saved = [
            (owner, name, getattr(owner, name)) for owner, name in map(resolve, PARTS[part][1])
        ]
        agent, variant = build_agent(), _variant(part)
        await variant(agent, 1)
        for owner, name, original in saved:
            setattr(owner, name, counting(part)(original))
        try:
            await variant(agent, invocations)
        finally:
            for owner, name, original in saved:
                setattr(owner, name, original)
    return {part: count / invocations for part, count in calls.items()}


def main(invocations: int, warm_up: int, parts: list[str]) -> None:
    """Count every part in ``parts`` and print one line for each."""
    child = [sys.executable, __file__, "--invocations", str(invocations)]
    child += ["--warm-up", str(warm_up), "--count-part"]
    options = ("--instr-atstart=no", "--toggle-collect=functools_reduce")
    counts = callgrind_counts({part: [*child, part] for part in parts}, options)
    if counts is None:
        print("breakdown: not measured  (valgrind not found)", flush=True)
        return
    calls = asyncio.run(calls_per_invocation(parts))
    for part in parts:
        label = "journal+memory" if PARTS[part][0] == "journal" else "floor+memory"
        figure = f"{counts[part] / invocations / 1e3:.1f} k per invocation"
        if not calls[part]:
            figure = "not called"  # a part the code no longer goes through
        print(
            f"breakdown {label} {part}: {figure}  "
            f"({calls[part]:g} call{'' if calls[part] == 1 else 's'} per invocation)",
            flush=True,
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--invocations", type=int, default=30, help="counted ainvoke calls")
    parser.add_argument("--warm-up", type=int, default=10, help="uncounted ainvoke calls first")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"some of: {', '.join(PARTS)}")
    parser.add_argument("--count-part", help=argparse.SUPPRESS)  # one callgrind child
    args = parser.parse_args()
    if args.count_part is not None:
        asyncio.run(count_part(args.count_part, args.invocations, args.warm_up))
    else:
        chosen = [part.strip() for part in args.parts.split(",") if part.strip()]
        unknown = [part for part in chosen if part not in PARTS]
        if unknown:
            parser.error(f"unknown part(s) {unknown}; the parts are {list(PARTS)}")
        if args.invocations < 1 or args.warm_up < 1:
            parser.error("--invocations and --warm-up must be at least 1")
        main(args.invocations, args.warm_up, chosen)
