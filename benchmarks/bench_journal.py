"""RunJournal overhead: time inside the callbacks, and whole agent runs against no callbacks.

Run: ``.venv/bin/python benchmarks/bench_journal.py [--runs 500] [--invocations 200]``.
Prints one line per figure:

- callback cost: a simulated run driven by direct callback calls (root start, then 10 x [chat
  model start, LLM end with usage, tool end], root end) on the memory store, in microseconds
  of CPU time per callback spent inside the callbacks (writes happen between runs and are not
  counted); the median of ``--rounds`` measurements of ``--runs`` runs, beside the floor handler
  (below) driven alike in the same run, so that their ratio hardly depends on the machine;
- end to end: one LangGraph agent (3 model calls, 2 tool calls per run, a model that answers
  at once) invoked with ``ainvoke`` without callbacks, with a no-op handler, with the
  contract's floor (``FloorHandler``: the least any journal does for these runs, a baseline
  and not a journal) kept in a list and written to a plain aiosqlite table, and journaled to
  the memory and SQLite stores, as ratios to no callbacks (see ``end_to_end``). Writes are
  included: the clock stops when they are all stored;
- instructions: the same variants counted by valgrind's callgrind (every thread), as ratios
  to no callbacks, and the callbacks of the journal's and the floor handler's simulated runs:
  unlike the times, these repeat on a shared, noisy machine (``--instructions 0`` skips them;
  without valgrind they are reported as not measured). The callbacks are counted run by run,
  the writes between runs left out as the timed cost leaves them, so the figure does not
  depend on ``--runs``; starting and stopping the count of the variants costs about 0.5 M
  instructions, spread over their invocations.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib.util
import itertools
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiosqlite
import orjson
from bench_stores import FLOOR_SCHEMA, INSERT
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, LLMResult
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from pydantic import BaseModel
from workloads import callgrind_counts, counted

from deerflow_journal import MemoryRunEventStore, RunEventStore, RunJournal

USAGE = {"input_tokens": 812, "output_tokens": 64, "total_tokens": 876}
PROMPT = [[HumanMessage("What is the weather in Paris and in Oslo?")]]
TURNS = 10  # model call and tool answer pairs of a simulated run
CALLBACKS_PER_RUN = 2 + TURNS * 3
WARM_UP_RUNS = 20  # simulated runs before any is timed or counted


def line(name: str, value: str, note: str = "") -> None:
    """Print one figure."""
    print(f"{name}: {value}" + (f"  ({note})" if note else ""), flush=True)


# -- callback cost -----------------------------------------------------------------------------


def tool_turn(i: int) -> tuple[LLMResult, ToolMessage]:
    call_id = f"call_{i}"
    message = AIMessage(
        content=f"checking step {i}",
        tool_calls=[{"name": "weather", "args": {"city": "Paris"}, "id": call_id}],
        usage_metadata=USAGE,
        response_metadata={"model_name": "fake-chat"},
    )
    result = LLMResult(generations=[[ChatGeneration(message=message)]])
    return result, ToolMessage(f"sunny {i}", tool_call_id=call_id, name="weather")


Ids = tuple[uuid.UUID, list[tuple[uuid.UUID, uuid.UUID]]]  # a run's root, model and tool runs


def run_ids() -> Ids:
    """Fresh LangChain run ids for one simulated run."""
    return uuid.uuid4(), [(uuid.uuid4(), uuid.uuid4()) for _ in range(TURNS)]


def simulated_turns() -> list[tuple[LLMResult, ToolMessage]]:
    """The model results and tool answers of a simulated run."""
    return [tool_turn(i) for i in range(TURNS)]


def drive(
    handler: BaseCallbackHandler, turns: list[tuple[LLMResult, ToolMessage]], ids: Ids
) -> None:
    """Make the callbacks of one simulated run."""
    root, calls = ids
    handler.on_chain_start(None, {}, run_id=root, name="agent", metadata={"thread_id": "bench"})
    for (model_run, tool_run), (result, output) in zip(calls, turns, strict=True):
        handler.on_chat_model_start({}, PROMPT, run_id=model_run, parent_run_id=root)
        handler.on_llm_end(result, run_id=model_run, parent_run_id=root)
        handler.on_tool_end(output, run_id=tool_run, parent_run_id=root)
    handler.on_chain_end({"messages": []}, run_id=root)


def simulated_run(
    handler: BaseCallbackHandler, turns: list[tuple[LLMResult, ToolMessage]]
) -> float:
    """Drive one run through the callbacks; return the CPU seconds spent inside them.

    CPU time of this thread, not wall time, so other processes on the machine do not count.
    """
    ids = run_ids()
    started = time.thread_time()
    drive(handler, turns, ids)
    return time.thread_time() - started


async def warmed_journal() -> tuple[RunJournal, list[tuple[LLMResult, ToolMessage]]]:
    """A journal on the memory store after ``WARM_UP_RUNS`` simulated runs, and the turns of a
    run."""
    journal = RunJournal(event_store=MemoryRunEventStore())
    turns = simulated_turns()
    for _ in range(WARM_UP_RUNS):
        simulated_run(journal, turns)
        await journal.flush()
    return journal, turns


async def callback_cost(runs: int) -> float:
    """Microseconds per callback over ``runs`` simulated runs on the memory store."""
    journal, turns = await warmed_journal()
    inside = 0.0
    for _ in range(runs):
        inside += simulated_run(journal, turns)
        await asyncio.sleep(0)  # let the background write of this run go
    await journal.flush()
    return inside / (runs * CALLBACKS_PER_RUN) * 1e6


async def floor_callback_cost(runs: int) -> float:
    """Microseconds per callback of the floor handler over ``runs`` simulated runs: a new
    handler per run, as in ``floored`` (made, and its write awaited, outside the clock)."""
    table, turns = FloorTable(None), simulated_turns()
    inside = 0.0
    for i in range(WARM_UP_RUNS + runs):
        handler = FloorHandler(table.write)
        spent = simulated_run(handler, turns)
        inside += spent if i >= WARM_UP_RUNS else 0.0
        await handler.written  # type: ignore[misc]
        table.rows.clear()
    return inside / (runs * CALLBACKS_PER_RUN) * 1e6


def _counted_drive(
    handler: BaseCallbackHandler, turns: list[tuple[LLMResult, ToolMessage]], ids: Ids
) -> None:
    """``drive`` inside ``functools.reduce``, the one function ``callback_instructions``'
    callgrind counts in (``--toggle-collect``): what runs between runs is left out."""
    functools.reduce(lambda _, __: drive(handler, turns, ids), (0, 0))


async def count_callbacks(runs: int, handler: str) -> None:
    """In a callgrind child: count the instructions of ``runs`` simulated runs' callbacks, of
    the journal or (``handler="floor"``) of a floor handler per run, as the timed callback
    cost drives them: each run's writes go between runs, uncounted."""
    ids = [run_ids() for _ in range(runs)]
    if handler == "floor":
        table, turns = FloorTable(None), simulated_turns()
        for _ in range(WARM_UP_RUNS):
            floor = FloorHandler(table.write)
            drive(floor, turns, run_ids())
            await floor.written  # type: ignore[misc]
        with counted():
            for run in ids:
                floor = FloorHandler(table.write)
                _counted_drive(floor, turns, run)
                await floor.written  # type: ignore[misc]
                table.rows.clear()
        return
    journal, turns = await warmed_journal()
    with counted():
        for run in ids:
            _counted_drive(journal, turns, run)
            await asyncio.sleep(0)  # let the background write of this run go
    await journal.flush()


def callback_instructions(runs: int) -> dict[str, float] | None:
    """Instructions per callback of ``runs`` simulated runs of the journal and of the floor
    handler (None without valgrind)."""
    child = [sys.executable, __file__, "--runs", str(runs), "--count-callbacks"]
    options = ("--instr-atstart=no", "--toggle-collect=functools_reduce")
    counts = callgrind_counts({name: [*child, name] for name in ("journal", "floor")}, options)
    if counts is None:
        return None
    return {name: count / (runs * CALLBACKS_PER_RUN) for name, count in counts.items()}


# -- end to end --------------------------------------------------------------------------------


@tool
def weather(city: str) -> str:
    """Return the weather of a city."""
    return f"sunny in {city}"


def build_agent() -> Any:
    """3 model calls (two ask for a tool) and 2 tool calls per run; the model answers at once."""
    script = [
        AIMessage("", tool_calls=[{"name": "weather", "args": {"city": "Paris"}, "id": "c1"}]),
        AIMessage("", tool_calls=[{"name": "weather", "args": {"city": "Oslo"}, "id": "c2"}]),
        AIMessage("Sunny in both."),
    ]
    for message in script:
        message.usage_metadata = dict(USAGE)  # type: ignore[assignment]
        message.response_metadata = {"model_name": "fake-chat"}
    model = GenericFakeChatModel(messages=itertools.cycle(script))

    async def call_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", RunnableLambda(call_model))
    graph.add_node("tools", ToolNode([weather]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile()


class NoopHandler(BaseCallbackHandler):
    """A handler that does nothing (inline, like the journal), to price the callback system."""

    run_inline = True

    def on_chat_model_start(self, serialized: Any, messages: Any, **kwargs: Any) -> None:
        """Accept chat model starts (the base class raises to fall back to ``on_llm_start``)."""


Row = tuple[str, str, str, str, str, str, str]  # thread, run, type, category, content, ...
Write = Callable[[list[Row]], Awaitable[None]]


def _dumper() -> Callable[[Any], Any]:
    """orjson's ``default`` for one run's rows: each message dumped once (run.end repeats them)."""
    dumps: dict[int, Any] = {}  # the run's events keep every message alive meanwhile

    def dump(value: Any) -> Any:
        if not isinstance(value, BaseModel):
            return str(value)
        found = dumps.get(id(value))
        if found is None:
            found = dumps[id(value)] = value.model_dump()
        return found

    return dump


class FloorHandler(BaseCallbackHandler):
    """The least any journal does for this agent's runs, to price what the contract asks.

    A baseline, not a journal: it builds the events of the catalog this agent produces (with
    the contract's metadata) and adds up token usage in its callbacks, then at the root
    chain's end encodes every content (messages through ``model_dump()``) and metadata with
    orjson and hands the rows to ``write`` in a background task. No input checks, no copies,
    no locks, no run summary, no tool-call outcomes, no timings, nested chains and runs not
    told apart.
    """

    run_inline = True

    def __init__(self, write: Write) -> None:
        self.write = write
        self.run_id = ""
        self.events: list[tuple[str, str, Any, dict[str, Any]]] = []
        self.usage = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
        self.calls = 0
        self.human = False
        self.written: asyncio.Task[None] | None = None

    def on_chain_start(self, serialized: Any, inputs: Any, **kwargs: Any) -> None:
        """Write ``run.start`` at the root chain."""
        if kwargs.get("parent_run_id") is None:
            self.run_id = str(kwargs["run_id"])
            metadata = {**(kwargs.get("metadata") or {}), "caller": "lead_agent"}
            self.events.append(("run.start", "trace", {"chain": kwargs.get("name")}, metadata))

    def on_chat_model_start(self, serialized: Any, messages: Any, **kwargs: Any) -> None:
        """Write the first call's human input."""
        if not self.human:
            self.human = True
            metadata = {"caller": "lead_agent"}
            self.events.append(("llm.human.input", "message", messages[0][-1], metadata))

    def on_llm_end(self, response: LLMResult, **kwargs: Any) -> None:
        """Write each response and add up its tokens."""
        self.calls += 1
        for generations in response.generations:
            for generation in generations:
                message = generation.message  # type: ignore[attr-defined]
                usage = message.usage_metadata or {}
                for key in self.usage:
                    self.usage[key] += usage.get(key, 0)
                metadata = {
                    "caller": "lead_agent",
                    "usage": dict(usage),
                    "latency_ms": 0,
                    "llm_call_index": self.calls,
                }
                self.events.append(("llm.ai.response", "message", message, metadata))

    def on_tool_end(self, output: Any, **kwargs: Any) -> None:
        """Write a tool's message."""
        if isinstance(output, ToolMessage):
            metadata = {"caller": "lead_agent", "tool_call_id": output.tool_call_id}
            self.events.append(("llm.tool.result", "message", output, metadata))

    def on_chain_end(self, outputs: Any, **kwargs: Any) -> None:
        """Write ``run.end`` at the root chain, then the run's rows in the background."""
        if kwargs.get("parent_run_id") is None:
            self.events.append(("run.end", "outputs", outputs, {"status": "success"}))
            self.written = asyncio.get_running_loop().create_task(self.flush())

    async def flush(self) -> None:
        await self.write(self.rows())

    def rows(self) -> list[Row]:
        """The run's rows: every content and metadata encoded with orjson."""
        now, dump = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()), _dumper()
        return [
            (
                "bench",
                self.run_id,
                event_type,
                category,
                orjson.dumps(content, default=dump).decode(),
                orjson.dumps(metadata, default=dump).decode(),
                now,
            )
            for event_type, category, content, metadata in self.events
        ]


Variant = Callable[[Any, int], Awaitable[None]]


def plain(handler: Callable[[], BaseCallbackHandler] | None) -> Variant:
    async def run(agent: Any, count: int) -> None:
        for i in range(count):
            config = {} if handler is None else {"callbacks": [handler()]}
            await agent.ainvoke({"messages": [HumanMessage(f"weather {i}?")]}, config)

    return run


def journaled(store: RunEventStore) -> Variant:
    async def run(agent: Any, count: int) -> None:
        journals = []
        for i in range(count):
            journal = RunJournal(thread_id="bench", event_store=store)
            await agent.ainvoke(
                {"messages": [HumanMessage(f"weather {i}?")]}, {"callbacks": [journal]}
            )
            journals.append(journal)
        for journal in journals:
            await journal.flush()

    return run


def floored(write: Write) -> Variant:
    async def run(agent: Any, count: int) -> None:
        handlers = []
        for i in range(count):
            handler = FloorHandler(write)
            await agent.ainvoke(
                {"messages": [HumanMessage(f"weather {i}?")]}, {"callbacks": [handler]}
            )
            handlers.append(handler)
        await asyncio.gather(*(h.written for h in handlers if h.written is not None))

    return run


class FloorTable:
    """Where the floor writes, numbering rows in the thread: a list, or a plain aiosqlite table
    (bench_stores' floor schema, one transaction per run, one at a time: concurrent ones on
    its one connection fail with 'bad parameter or other API misuse'; one process only, so the
    seqs are counted here rather than read under a write lock)."""

    def __init__(self, db: aiosqlite.Connection | None) -> None:
        self.db = db
        self.rows: list[tuple[Any, ...]] = []  # without a database
        self.last_seq = 0
        self.lock = asyncio.Lock()

    async def write(self, rows: list[Row]) -> None:
        numbered = [
            (thread, run, self.last_seq + seq, *rest, None)
            for seq, (thread, run, *rest) in enumerate(rows, 1)
        ]
        self.last_seq += len(rows)
        if self.db is None:
            self.rows.extend(numbered)
            return
        async with self.lock:
            await self.db.executemany(INSERT, numbered)
            await self.db.commit()


@contextlib.asynccontextmanager
async def variants(tmp: str) -> AsyncIterator[dict[str, Variant]]:
    """The four ways of running the agent, keyed by name (SQLite only if its store imports)."""
    sqlite = None
    floor_db = await aiosqlite.connect(Path(tmp) / "floor.db")
    try:  # aiosqlite's worker thread keeps the process alive until the connection closes
        await floor_db.execute("PRAGMA journal_mode=WAL")
        await floor_db.execute("PRAGMA synchronous=NORMAL")
        await floor_db.executescript(FLOOR_SCHEMA)
        found: dict[str, Variant] = {
            "no callbacks": plain(None),
            "no-op handler": plain(NoopHandler),
            "floor+memory": floored(FloorTable(None).write),
            "floor+sqlite": floored(FloorTable(floor_db).write),
            "journal+memory": journaled(MemoryRunEventStore()),
        }
        if importlib.util.find_spec("deerflow_journal.stores.sqlite") is not None:
            from deerflow_journal.stores.sqlite import SqliteRunEventStore

            sqlite = SqliteRunEventStore(str(Path(tmp) / "bench.db"))
            await sqlite.setup()
            found["journal+sqlite"] = journaled(sqlite)
        yield found
    finally:
        await floor_db.close()
        if sqlite is not None:
            await sqlite.close()


async def end_to_end(
    invocations: int, rounds: int, block: int
) -> tuple[float, dict[str, tuple[float, float, float]]]:
    """Seconds per run without callbacks, and each variant's ratio to it (median, min, max).

    Every round runs each variant ``invocations`` times, in blocks of ``block`` invocations
    that take turns (a journal's writes are flushed at the end of each of its blocks), so
    that load from other processes, which drifts, reaches every variant alike. A variant's
    ratio is the median over rounds of its time divided by the same round's time without
    callbacks; the spread of the same-round ratios shows how much of a difference is noise.
    """
    with tempfile.TemporaryDirectory() as tmp:
        async with variants(tmp) as found:
            agent = build_agent()
            for variant in found.values():
                await variant(agent, 20)  # warm up
            times: dict[str, list[float]] = {name: [] for name in found}
            sizes = [block] * (invocations // block)
            if invocations % block:
                sizes.append(invocations % block)
            for _ in range(rounds):
                spent = dict.fromkeys(found, 0.0)
                for size in sizes:
                    for name, variant in found.items():
                        started = time.perf_counter()
                        await variant(agent, size)
                        spent[name] += time.perf_counter() - started
                for name, seconds in spent.items():
                    times[name].append(seconds)
    base = times["no callbacks"]
    ratios = {}
    for name, values in times.items():
        same_round = [t / b for t, b in zip(values, base, strict=True)]
        ratios[name] = (statistics.median(same_round), min(same_round), max(same_round))
    return statistics.median(base) / invocations, ratios


# -- instruction counts -----------------------------------------------------------------------


async def count_one(name: str, invocations: int) -> None:
    """Run one variant, counting the instructions of the measured runs only."""
    with tempfile.TemporaryDirectory() as tmp:
        async with variants(tmp) as found:
            agent = build_agent()
            await found[name](agent, 20)  # warm up
            with counted():
                await found[name](agent, invocations)


def instructions(invocations: int) -> dict[str, float] | None:
    """Instructions per run of each variant, every thread included (None without valgrind)."""
    names = [
        "no callbacks",
        "no-op handler",
        "floor+memory",
        "floor+sqlite",
        "journal+memory",
        "journal+sqlite",
    ]
    if importlib.util.find_spec("deerflow_journal.stores.sqlite") is None:
        names.pop()
    child = [sys.executable, __file__, "--invocations", str(invocations), "--count-variant"]
    counts = callgrind_counts({name: [*child, name] for name in names})
    return None if counts is None else {name: n / invocations for name, n in counts.items()}


async def main(runs: int, invocations: int, rounds: int, block: int, counted: int) -> None:
    """Measure and print every figure."""
    costs = [(await callback_cost(runs), await floor_callback_cost(runs)) for _ in range(rounds)]
    cost = statistics.median(journal for journal, _ in costs)
    floor_cost = statistics.median(floor for _, floor in costs)
    line(
        "callback cost",
        f"{cost:.2f} us per callback",
        f"median of {rounds} x {runs} runs x {CALLBACKS_PER_RUN} callbacks, memory store; "
        "target <= 3.0 us",
    )
    line(
        "callback cost floor handler",
        f"{floor_cost:.2f} us per callback",
        "driven alike; the journal's is "
        f"{statistics.median(journal / floor for journal, floor in costs):.2f}x, "
        "the median of same-round ratios",
    )
    per_run, ratios = await end_to_end(invocations, rounds, block)
    line(
        f"ainvoke x{invocations} no callbacks",
        f"{per_run * 1e3:.2f} ms per run",
        f"{rounds} rounds, variants alternating every {block} runs; "
        "ratios are medians of same-round ratios",
    )
    notes = {
        "floor+memory": "the least any journal does, a baseline",
        "floor+sqlite": "the least any journal does, a baseline",
    }
    for name in (
        "no-op handler",
        "floor+memory",
        "floor+sqlite",
        "journal+memory",
        "journal+sqlite",
    ):
        if name not in ratios:
            line(f"ainvoke x{invocations} {name}", "not measured", "store not available")
            continue
        median, low, high = ratios[name]
        spread = f"rounds {low:.3f}-{high:.3f}"
        line(
            f"ainvoke x{invocations} {name}",
            f"{median:.3f}x no callbacks",
            f"{spread}; {notes[name]}" if name in notes else spread,
        )
    above_floor(
        f"ainvoke x{invocations}", {name: median for name, (median, _, _) in ratios.items()}
    )
    if counted == 0:
        return
    counts = instructions(counted)
    if counts is None:
        line("instructions", "not measured", "valgrind not found")
        return
    per_callback = callback_instructions(runs)
    if per_callback is not None:
        journal, floor = per_callback["journal"], per_callback["floor"]
        line(
            "instructions callback cost",
            f"{journal / 1e3:.2f} k per callback",
            f"callgrind, {runs} runs x {CALLBACKS_PER_RUN} callbacks, memory store; "
            "what the timed callback cost counts, repeatable on a busy machine",
        )
        line(
            "instructions callback cost floor handler",
            f"{floor / 1e3:.2f} k per callback",
            f"the journal's is {journal / floor:.2f}x",
        )
    base = counts["no callbacks"]
    line(
        f"instructions x{counted} no callbacks",
        f"{base / 1e6:.2f} M per run",
        "callgrind, every thread; repeatable on a busy machine",
    )
    for name, count in counts.items():
        if name != "no callbacks":
            line(f"instructions x{counted} {name}", f"{count / base:.3f}x no callbacks")
    above_floor(f"instructions x{counted}", {name: count / base for name, count in counts.items()})


#: The most the journal may cost above the floor, as a share of a run without callbacks.
ABOVE_FLOOR_TARGETS = {"memory": 0.025, "sqlite": 0.030}


def above_floor(label: str, ratios: dict[str, float]) -> None:
    """Print the journal's cost above the floor on each store, beside its target."""
    for store, target in ABOVE_FLOOR_TARGETS.items():
        journal, floor = ratios.get(f"journal+{store}"), ratios.get(f"floor+{store}")
        if journal is not None and floor is not None:
            line(
                f"{label} journal+{store} above floor+{store}",
                f"{journal - floor:+.3f}",
                f"target <= +{target:.3f}",
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=500, help="simulated runs for callback cost")
    parser.add_argument("--invocations", type=int, default=200, help="ainvoke calls per round")
    parser.add_argument("--rounds", type=int, default=7, help="repeats of each measurement")
    parser.add_argument("--block", type=int, default=25, help="runs before the next variant")
    parser.add_argument(
        "--instructions",
        type=int,
        default=50,
        metavar="N",
        help="also count instructions over N runs of each variant with valgrind (0: skip)",
    )
    parser.add_argument("--count-variant", help=argparse.SUPPRESS)  # one callgrind child
    parser.add_argument(  # one callgrind child
        "--count-callbacks", choices=("journal", "floor"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.block < 1 or args.invocations < 1 or args.instructions < 0:
        parser.error("--block and --invocations must be at least 1, --instructions at least 0")
    if args.count_variant is not None:
        asyncio.run(count_one(args.count_variant, args.invocations))
    elif args.count_callbacks is not None:
        asyncio.run(count_callbacks(args.runs, args.count_callbacks))
    else:
        asyncio.run(main(args.runs, args.invocations, args.rounds, args.block, args.instructions))
