"""Flushing and durability (the buffer and writer, see docs/architecture.md): buffering, one
write at a time, faults, threads."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, LLMResult
from langchain_core.runnables import RunnableLambda

from deerflow_journal import (
    MemoryRunEventStore,
    RunEvent,
    RunJournal,
    RunSummary,
    open_store,
    user_scope,
)
from deerflow_journal.journal.writer import JournalWriter
from deerflow_journal.stores.base import Write, Written
from tests.journal.agents import QUESTION, agent_graph, ai, run_events, scripted

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


class FlakyStore(MemoryRunEventStore):
    """A memory store whose every ``every``-th batch fails before writing anything."""

    def __init__(self, every: int) -> None:
        super().__init__()
        self.every = every
        self.batches = 0
        self.failures = 0

    async def _write(self, batch: Write) -> Written:
        self.batches += 1
        if self.every and self.batches % self.every == 0:
            self.failures += 1
            raise ConnectionError(f"injected failure of batch {self.batches}")
        return await super()._write(batch)


class GatedStore(MemoryRunEventStore):
    """A memory store whose writes wait for a gate, counting how many overlap."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.active = 0
        self.max_active = 0

    async def _write(self, batch: Write) -> Written:
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            await self.gate.wait()
            return await super()._write(batch)
        finally:
            self.active -= 1


def long_script(steps: int) -> list[AIMessage]:
    """``steps`` tool-calling responses, each uniquely named, then a final answer."""
    calls = [ai(f"step {i}", calls=[("add", {"a": i, "b": 1}, f"c{i}")]) for i in range(steps)]
    return [*calls, ai("all done")]


def expected_long_run(steps: int) -> list[tuple[str, str]]:
    middle = [
        pair
        for i in range(steps)
        for pair in (("llm.ai.response", f"step {i}"), ("llm.tool.result", f"c{i}"))
    ]
    return [
        ("run.start", ""),
        ("llm.human.input", "What is 1 + 2?"),
        *middle,
        ("llm.ai.response", "all done"),
        ("run.end", ""),
    ]


def fingerprint(events: list[RunEvent]) -> list[tuple[str, str]]:
    """(type, identity) per event: the text of AI/human messages, the call id of tool results."""
    out = []
    for e in events:
        content = e["content"]
        if e["event_type"] == "llm.tool.result":
            out.append((e["event_type"], content["tool_call_id"]))
        elif e["category"] == "message":
            out.append((e["event_type"], content["content"]))
        else:
            out.append((e["event_type"], ""))
    return out


def tool_result(journal: RunJournal, root: uuid.UUID, index: int) -> None:
    """Drive one tool call of the run ``root`` through the callbacks."""
    call = uuid.uuid4()
    journal.on_tool_start({"name": "t"}, "", run_id=call, parent_run_id=root)
    journal.on_tool_end(
        ToolMessage(str(index), tool_call_id=f"d{index}"), run_id=call, parent_run_id=root
    )


def direct_run(journal: RunJournal, events: int) -> uuid.UUID:
    """Start a run by calling the callbacks directly: ``run.start`` and tool results."""
    root = uuid.uuid4()
    journal.on_chain_start(None, {}, run_id=root, name="direct")
    for index in range(events - 1):
        tool_result(journal, root, index)
    return root


async def settle(rounds: int = 50) -> None:
    """Let the loop run background work (a bounded number of turns, no wall clock)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


# -- buffering -----------------------------------------------------------------------------


async def test_callbacks_buffer_events_until_the_threshold():
    journal = RunJournal(event_store=MemoryRunEventStore(), flush_threshold=5)
    root = direct_run(journal, 4)
    await settle()
    assert await run_events(journal) == []
    tool_result(journal, root, 4)
    assert await run_events(journal) == []  # the callback returned before any write ran
    await settle()
    assert len(await run_events(journal)) == 5


async def test_a_terminal_outcome_writes_everything_in_the_background():
    store = MemoryRunEventStore()
    journal = RunJournal(event_store=store)
    await agent_graph(scripted(ai("ok"))).ainvoke(QUESTION, {"callbacks": [journal]})
    await settle()
    assert [e["event_type"] for e in await run_events(journal)][-1] == "run.end"
    assert journal.thread_id is not None and journal.run_id is not None
    assert await store.get_run_summary(journal.thread_id, journal.run_id) == journal.summary()


async def test_the_store_holds_a_running_summary_until_the_run_ends():
    store = MemoryRunEventStore()
    journal = RunJournal(event_store=store, flush_threshold=3)
    root = direct_run(journal, 3)  # reaches the threshold: a batch goes out mid-run
    await settle()
    assert journal.thread_id is not None and journal.run_id is not None
    running = await store.get_run_summary(journal.thread_id, journal.run_id)
    assert running is not None and running.status == "running" and running.ended_at is None
    journal.on_chain_end({}, run_id=root)
    await journal.flush()
    ended = await store.get_run_summary(journal.thread_id, journal.run_id)
    assert ended is not None and ended.status == "success" and ended.ended_at is not None


async def test_events_store_what_the_callbacks_saw_not_later_changes():
    # The write encodes later, maybe on another thread: it must never walk the caller's
    # own containers (orjson crashes on one changed under it), and it stores the snapshot.
    journal = RunJournal(event_store=MemoryRunEventStore())
    outputs = {"messages": [AIMessage("first", id="a1")], "steps": [{"n": 1}]}
    journal.record_middleware("guard", name="g", hook="before", action="ok", changes=outputs)
    config = {"tags": ["x"], "limits": {"steps": 3}}
    root = uuid.uuid4()
    journal.on_chain_start(None, {}, run_id=root, name="graph", metadata={"config": config})
    usage = {"input_tokens": 3, "output_tokens": 1, "total_tokens": 4}
    answer = AIMessage("hi", id="a0", usage_metadata=usage)  # type: ignore[arg-type]
    result = LLMResult(generations=[[ChatGeneration(message=answer)]])
    journal.on_llm_end(result, run_id=uuid.uuid4(), parent_run_id=root)
    journal.on_chain_end(outputs, run_id=root)
    outputs["messages"].append(AIMessage("later", id="a2"))
    outputs["steps"][0]["n"] = 2
    config["limits"]["steps"] = 9
    answer.usage_metadata["input_tokens"] = 99  # type: ignore[index]
    await journal.flush()
    stored = {e["event_type"]: e for e in await run_events(journal)}
    expected = {"messages": [AIMessage("first", id="a1").model_dump()], "steps": [{"n": 1}]}
    assert stored["run.end"]["content"] == expected
    assert stored["middleware:guard"]["content"]["changes"] == expected
    assert stored["run.start"]["metadata"]["config"] == {"tags": ["x"], "limits": {"steps": 3}}
    assert stored["llm.ai.response"]["metadata"]["usage"]["input_tokens"] == 3


async def test_only_one_background_write_runs_at_a_time():
    store = GatedStore()
    journal = RunJournal(event_store=store, flush_threshold=2)
    root = direct_run(journal, 12)
    await settle()
    assert store.active == 1
    journal.on_chain_end({}, run_id=root)
    await settle()
    assert store.max_active == 1
    store.gate.set()
    await journal.flush()
    events = await run_events(journal)
    assert [e["event_type"] for e in events] == ["run.start", *["llm.tool.result"] * 11, "run.end"]
    assert [e["content"]["content"] for e in events[1:-1]] == [str(i) for i in range(11)]
    assert store.max_active == 1


async def test_a_terminal_drain_writes_what_was_pending_not_what_came_after():
    store = GatedStore()
    journal = RunJournal(event_store=store, flush_threshold=50)
    first = direct_run(journal, 3)
    journal.on_chain_end({}, run_id=first)
    await settle()  # the first run's write took its events and waits at the gate
    second = direct_run(journal, 3)
    store.gate.set()
    await settle()
    assert journal.run_id is not None
    assert await store.list_events(journal.run_id, journal.run_id) == []  # still buffered
    journal.on_chain_end({}, run_id=second)
    await journal.flush()
    assert len(await run_events(journal)) == 4


# -- faults --------------------------------------------------------------------------------


async def test_failed_writes_lose_nothing_duplicate_nothing_and_keep_order():
    store = FlakyStore(every=3)
    journal = RunJournal(event_store=store, flush_threshold=3)
    steps = 25
    graph = agent_graph(scripted(*long_script(steps)))
    await graph.ainvoke(QUESTION, {"callbacks": [journal], "recursion_limit": 100})
    for _ in range(10):
        try:
            await journal.flush()
            break
        except ConnectionError:
            continue
    assert store.failures >= 3
    assert fingerprint(await run_events(journal)) == expected_long_run(steps)
    assert journal.thread_id is not None and journal.run_id is not None
    summary = await store.get_run_summary(journal.thread_id, journal.run_id)
    assert summary is not None and summary.status == "success"
    assert summary.llm_call_count == steps + 1


async def test_flush_raises_when_the_store_fails_and_keeps_the_events():
    store = FlakyStore(every=1)
    journal = RunJournal(event_store=store)
    await agent_graph(scripted(ai("ok"))).ainvoke(QUESTION, {"callbacks": [journal]})
    with pytest.raises(ConnectionError):
        await journal.flush()
    with pytest.raises(ConnectionError):
        await journal.flush()
    store.every = 0
    await journal.flush()
    assert [e["event_type"] for e in await run_events(journal)] == [
        "run.start",
        "llm.human.input",
        "llm.ai.response",
        "run.end",
    ]


async def test_a_refused_run_summary_writes_nothing_of_its_batch(store):
    await store.put_run_summary(RunSummary(thread_id="shared", run_id="r1", user_id="alice"))
    journal = RunJournal(run_id="r1", thread_id="shared", event_store=store)
    with user_scope("bob"):
        await agent_graph(scripted(ai("ok"))).ainvoke(QUESTION, {"callbacks": [journal]})
    with pytest.raises(PermissionError):
        await journal.flush()
    assert await store.list_events("shared", "r1", user_id=None) == []
    summary = await store.get_run_summary("shared", "r1", user_id=None)
    assert summary is not None and summary.user_id == "alice"


class HungStore(MemoryRunEventStore):
    """A memory store whose writes make no progress while ``hung`` is set."""

    hung = True

    async def _write(self, batch: Write) -> Written:
        while self.hung:
            await asyncio.sleep(0.01)
        return await super()._write(batch)


def test_a_loop_closing_leaves_writes_to_another_loop_to_that_loop(caplog, monkeypatch):
    """A store set up on a notebook's loop, blocked meanwhile by a cell that runs a graph with
    ``asyncio.run`` in a thread: that run's loop does not wait, at its close, for writes that
    go to the blocked loop (they go out once it runs again)."""
    monkeypatch.setattr(JournalWriter, "wait_timeout", 0.5)

    async def notebook() -> list[Any]:
        store = MemoryRunEventStore()
        await store.setup()  # the store's loop is this one
        journal = RunJournal(event_store=store)

        async def cell() -> None:
            model = scripted(ai("", calls=[("add", {"a": 1, "b": 2}, "c1")]), ai("3"))
            await agent_graph(model).ainvoke(QUESTION, {"callbacks": [journal]})

        thread = threading.Thread(target=lambda: asyncio.run(cell()))
        thread.start()
        thread.join()  # this loop is blocked until the thread's asyncio.run returns
        await journal.flush()
        return await run_events(journal)

    with caplog.at_level("WARNING", logger="deerflow_journal"):
        events = asyncio.run(notebook())
    assert len(events) == 6
    ours = [r for r in caplog.records if r.name.startswith("deerflow_journal")]
    assert [r.getMessage() for r in ours if r.levelname in ("WARNING", "ERROR")] == []


def test_a_write_cancelled_with_its_event_loop_keeps_its_batch(caplog, monkeypatch):
    monkeypatch.setattr(JournalWriter, "wait_timeout", 0.5)  # how long the loop's end waits
    caplog.set_level("DEBUG", logger="deerflow_journal")
    store = HungStore()
    journal = RunJournal(event_store=store)

    async def main() -> None:
        await agent_graph(scripted(ai("ok"))).ainvoke(QUESTION, {"callbacks": [journal]})
        await settle()  # the terminal write is now waiting inside the store

    asyncio.run(main())  # the loop ends without a flush: its shutdown cancels the write
    # Said once, by the loop's guard: the cancelled write's own warning would repeat it.
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert not [message for message in warned if "write cancelled" in message]
    assert "journal write cancelled; its loop's guard writes its events" in caplog.messages
    assert "could not write 4 events of runs" in caplog.text
    store.hung = False
    journal.close()
    types = [e["event_type"] for e in asyncio.run(run_events(journal))]
    assert types == ["run.start", "llm.human.input", "llm.ai.response", "run.end"]


class Unprintable:
    """A tool artifact JSON cannot hold and whose ``str()`` fails: never storable."""

    def __str__(self) -> str:
        raise ValueError("no text for this object")


async def test_an_event_that_can_never_be_stored_is_dropped_alone_and_logged(caplog):
    store = MemoryRunEventStore()
    journal = RunJournal(event_store=store)
    root = direct_run(journal, 2)
    call = uuid.uuid4()
    journal.on_tool_start({"name": "t"}, "", run_id=call, parent_run_id=root)
    bad = ToolMessage("bad", tool_call_id="bad", artifact=Unprintable())
    journal.on_tool_end(bad, run_id=call, parent_run_id=root)
    tool_result(journal, root, 1)
    journal.on_chain_end({}, run_id=root)
    await journal.flush()
    events = await run_events(journal)
    assert [e["event_type"] for e in events] == ["run.start", *["llm.tool.result"] * 2, "run.end"]
    assert [e["content"]["tool_call_id"] for e in events[1:3]] == ["d0", "d1"]
    dropped = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(dropped) == 1 and "llm.tool.result" in dropped[0].getMessage()


class UnlistableMapping(Mapping[str, Any]):
    """A mapping that fails whenever it is read (a broken proxy, say)."""

    def __getitem__(self, key: str) -> Any:
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        raise RuntimeError("cannot list")

    def __len__(self) -> int:
        return 1


async def test_outputs_that_cannot_be_copied_still_end_the_run(caplog):
    journal = RunJournal(event_store=MemoryRunEventStore())
    root = direct_run(journal, 1)
    journal.on_chain_end(UnlistableMapping(), run_id=root)
    await journal.flush()
    assert journal.summary().status == "success"
    assert [e["event_type"] for e in await run_events(journal)] == ["run.start"]
    assert "can never store" in caplog.text  # run.end is dropped and said so, as before


async def test_a_store_that_is_down_is_retried_once_per_threshold_not_per_event():
    store = FlakyStore(every=1)
    journal = RunJournal(event_store=store, flush_threshold=20)
    root = direct_run(journal, 1)
    for index in range(300):
        tool_result(journal, root, index)
        await settle(3)
    assert 0 < store.batches <= 301 // 20
    store.every = 0
    journal.on_chain_end({}, run_id=root)
    await journal.flush()
    assert len(await run_events(journal)) == 302


def test_close_gives_up_on_a_hung_store_and_logs_what_is_not_written(monkeypatch, caplog):
    monkeypatch.setattr(JournalWriter, "wait_timeout", 0.1)
    store = HungStore()
    journal = RunJournal(event_store=store)
    root = direct_run(journal, 3)
    closer = threading.Thread(target=journal.close, daemon=True)
    closer.start()
    closer.join(120)  # a hang guard, not a time limit on close()
    assert not closer.is_alive()
    assert any("a write is still in flight" in r.getMessage() for r in caplog.records)
    tool_result(journal, root, 3)
    closer = threading.Thread(target=journal.close, daemon=True)
    closer.start()
    closer.join(120)
    assert "1 more events" in caplog.records[-1].getMessage()
    store.hung = False
    journal.on_chain_end({}, run_id=root)
    journal.close()
    assert len(asyncio.run(run_events(journal))) == 5


def test_a_store_error_under_invoke_never_breaks_the_graph_and_close_retries():
    store = FlakyStore(every=1)
    journal = RunJournal(event_store=store)
    journal.raise_error = False  # the default; the test suite turns it on for the class
    result = agent_graph(scripted(ai("ok"))).invoke(QUESTION, {"callbacks": [journal]})
    assert result["messages"][-1].content == "ok"
    assert asyncio.run(run_events(journal)) == []
    store.every = 0
    journal.close()
    assert len(asyncio.run(run_events(journal))) == 4


def eventually(read: Callable[[], T], done: Callable[[T], bool]) -> T:
    """``read()`` again until ``done`` says so, for a minute at most (how long a loaded
    machine may take, not a speed bound); the last read."""
    deadline = time.monotonic() + 60
    while not done(value := read()) and time.monotonic() < deadline:
        time.sleep(0.01)
    return value


def test_a_failed_write_under_invoke_reaches_the_store_once_it_is_back(monkeypatch):
    from deerflow_journal.journal import buffer

    monkeypatch.setattr(buffer._FailedWrites, "first_retry_seconds", 0.01)
    store = FlakyStore(every=1)
    journal = RunJournal(event_store=store)
    journal.raise_error = False
    agent_graph(scripted(ai("ok"))).invoke(QUESTION, {"callbacks": [journal]})
    store.every = 0
    # Nothing flushes or closes the journal: its own loop retries the write that failed.
    events = eventually(lambda: asyncio.run(run_events(journal)), lambda read: len(read) >= 4)
    assert [e["event_type"] for e in events] == [
        "run.start",
        "llm.human.input",
        "llm.ai.response",
        "run.end",
    ]


def test_timed_retries_go_on_after_the_loop_of_the_first_one_ended(monkeypatch):
    from deerflow_journal.journal import buffer

    monkeypatch.setattr(buffer._FailedWrites, "first_retry_seconds", 0.01)
    store = FlakyStore(every=1)
    journal = RunJournal(event_store=store)
    journal.raise_error = False

    async def first() -> None:
        await agent_graph(scripted(ai("one"))).ainvoke(QUESTION, {"callbacks": [journal]})

    # Its write fails, and so does its loop's last flush: a retry waited on that loop.
    asyncio.run(first())
    agent_graph(scripted(ai("two"))).invoke(QUESTION, {"callbacks": [journal]})
    store.every = 0
    threads = eventually(
        lambda: asyncio.run(store.list_threads()),
        lambda read: len(read) == 2 and all(t.run_count == 1 for t in read),
    )
    runs = [asyncio.run(store.list_run_summaries(t.thread_id)) for t in threads]
    assert sorted(r.last_ai_message for (r,) in runs) == ["one", "two"]


async def test_a_closed_journal_makes_no_timed_retries_until_it_is_used_again(monkeypatch):
    from deerflow_journal.journal import buffer

    monkeypatch.setattr(buffer._FailedWrites, "first_retry_seconds", 0.01)
    monkeypatch.setattr(buffer._FailedWrites, "max_retry_seconds", 0.01)
    store = FlakyStore(every=1)
    journal = RunJournal(event_store=store)
    journal.raise_error = False
    await agent_graph(scripted(ai("one"))).ainvoke(QUESTION, {"callbacks": [journal]})
    with pytest.raises(ConnectionError):
        await journal.aclose()
    # Its owner may close the store next: what the journal holds waits for the exit's save.
    tried = store.batches
    await asyncio.sleep(0.3)
    assert store.batches == tried
    await agent_graph(scripted(ai("two"))).ainvoke(QUESTION, {"callbacks": [journal]})
    deadline = time.monotonic() + 60  # how long a loaded machine may take, not a speed bound
    while store.batches <= tried + 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert store.batches > tried + 2  # the run's own write, then timed retries


def test_a_journal_bug_never_breaks_the_graph_by_default():
    class BrokenJournal(RunJournal):
        def on_llm_end(self, *args: Any, **kwargs: Any) -> None:
            raise AssertionError("journal bug")

    journal = BrokenJournal(event_store=MemoryRunEventStore())
    journal.raise_error = False
    result = agent_graph(scripted(ai("fine"))).invoke(QUESTION, {"callbacks": [journal]})
    assert result["messages"][-1].content == "fine"
    assert journal.summary().status == "success"


# -- threads and loops ---------------------------------------------------------------------


def test_callbacks_from_eight_threads_at_once_lose_nothing():
    store = MemoryRunEventStore()
    journal = RunJournal(event_store=store, flush_threshold=7)
    root = uuid.uuid4()
    journal.on_chain_start(None, {}, run_id=root, name="parallel")
    barrier = threading.Barrier(8)
    per_thread = 150

    def work(thread: int) -> None:
        barrier.wait()
        for i in range(per_thread):
            call, call_id = uuid.uuid4(), f"t{thread}-{i}"
            journal.on_tool_start({"name": "w"}, "", run_id=call, parent_run_id=root)
            journal.on_tool_end(
                ToolMessage(str(i), tool_call_id=call_id), run_id=call, parent_run_id=root
            )

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    journal.on_chain_end({}, run_id=root)
    events = asyncio.run(run_events(journal))
    ids = [e["content"]["tool_call_id"] for e in events if e["event_type"] == "llm.tool.result"]
    assert len(ids) == len(set(ids)) == 8 * per_thread
    for thread in range(8):
        mine = [int(i.split("-")[1]) for i in ids if i.startswith(f"t{thread}-")]
        assert mine == list(range(per_thread))
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert (events[0]["event_type"], events[-1]["event_type"]) == ("run.start", "run.end")


async def test_invoke_blocking_a_running_loop_is_complete_when_it_returns():
    """Inside Jupyter a cell's plain ``invoke`` runs on the thread of the running loop."""
    store = MemoryRunEventStore()
    journal = RunJournal(event_store=store)
    agent_graph(scripted(ai("ok"))).invoke(QUESTION, {"callbacks": [journal]})
    assert journal.thread_id is not None and journal.run_id is not None
    assert len(await store.list_events(journal.thread_id, journal.run_id)) == 4
    assert (await store.get_run_summary(journal.thread_id, journal.run_id)) == journal.summary()


# -- owned stores --------------------------------------------------------------------------


def test_the_default_store_is_opened_and_closed_by_the_journal(monkeypatch):
    monkeypatch.setenv("DEERFLOW_JOURNAL_URL", "memory://")
    journal = RunJournal()
    assert isinstance(journal.event_store, MemoryRunEventStore)
    agent_graph(scripted(ai("ok"))).invoke(QUESTION, {"callbacks": [journal]})
    journal.close()
    assert len(asyncio.run(run_events(journal))) == 4


async def test_the_journal_is_an_async_context_manager(monkeypatch):
    monkeypatch.setenv("DEERFLOW_JOURNAL_URL", "memory://")
    async with RunJournal() as journal:
        await agent_graph(scripted(ai("ok"))).ainvoke(QUESTION, {"callbacks": [journal]})
    assert len(await run_events(journal)) == 4


async def test_closing_inside_a_coroutine_with_a_write_on_its_loop_says_to_use_aclose(caplog):
    """``close()`` blocks, so on the loop that runs the journal's write it cannot wait for it:
    returning without a word as if everything were written let a store closed next lose the
    run. It says so, and what the block raises stays what the caller sees."""
    store = GatedStore()  # a store still writing when the block ends
    with (
        pytest.raises(KeyError, match="raised in the block"),
        RunJournal(event_store=store) as journal,
    ):
        await agent_graph(scripted(ai("ok"))).ainvoke(QUESTION, {"callbacks": [journal]})
        raise KeyError("raised in the block")
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "aclose()" in warning.getMessage()
    store.gate.set()
    await journal.aclose()  # what the warning says: nothing was lost meanwhile
    assert len(await store.list_events(journal.thread_id, journal.run_id)) == 4
    summary = await store.get_run_summary(journal.thread_id, journal.run_id)
    assert summary is not None and summary.status == "success"


ABANDONED_RUN = """
import sqlite3, sys, time, uuid
from langchain_core.messages import ToolMessage
from deerflow_journal import RunJournal

journal = RunJournal(flush_threshold=2)  # the default store: .deer-flow/journal.db
root = uuid.uuid4()
journal.on_chain_start(None, {}, run_id=root, name="abandoned")
for i in range(3):
    call = uuid.uuid4()
    journal.on_tool_start({"name": "t"}, "", run_id=call, parent_run_id=root)
    journal.on_tool_end(ToolMessage(str(i), tool_call_id=f"c{i}"), run_id=call, parent_run_id=root)
for _ in range(600):  # until the background write opened the store and committed a batch
    try:
        with sqlite3.connect(".deer-flow/journal.db") as db:
            if db.execute("SELECT count(*) FROM run_events").fetchone()[0]:
                break
    except sqlite3.OperationalError:
        pass
    time.sleep(0.05)
else:
    sys.exit("no batch was written")
print("exiting with the run still open")
"""


def run_program(source: str, cwd: Path) -> str:
    """Run ``source`` in a new interpreter using the default store under ``cwd``; its stdout.

    The timeout is a hang guard: a leftover non-daemon thread would block exit forever.
    """
    env = {k: v for k, v in os.environ.items() if k != "DEERFLOW_JOURNAL_URL"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    command = [sys.executable, "-c", source]
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


STREAM_LEFT_OPEN_AT_EXIT = """
from langchain_core.messages import HumanMessage
from deerflow_journal import RunJournal, open_sync_store
from tests.journal.agents import add, agent_graph, ai, scripted

store = open_sync_store("sqlite:///journal.db")
graph = agent_graph(scripted(ai("", calls=[("add", {"a": 1, "b": 2}, "c1")]), ai("3")), [add])
stream = graph.stream(
    {"messages": [HumanMessage("1 + 2?")]}, {"callbacks": [RunJournal(event_store=store)]}
)
next(stream)  # neither exhausted nor closed: the interpreter closes it as it exits
print("exiting with the stream open")
"""


def test_a_sync_stream_left_open_at_exit_does_not_hang_the_program(tmp_path: Path):
    # The stream's run ends while the interpreter finalizes, when no thread can start or run.
    assert run_program(STREAM_LEFT_OPEN_AT_EXIT, tmp_path) == "exiting with the stream open\n"


def stored_run(directory: Path, run_id: str) -> tuple[list[str], Any]:
    """Event types and summary of thread ``owned``'s run in the default store of ``directory``."""

    async def read() -> tuple[list[str], Any]:
        async with open_store(f"sqlite:///{directory / '.deer-flow' / 'journal.db'}") as store:
            events = await store.list_events("owned", run_id)
            return [e["event_type"] for e in events], await store.get_run_summary("owned", run_id)

    return asyncio.run(read())


def test_nothing_the_journal_opens_keeps_the_interpreter_alive(tmp_path):
    assert "exiting with the run still open" in run_program(ABANDONED_RUN, tmp_path)


OWNED_STORE_INVOKE = """
from langchain_core.messages import HumanMessage
from deerflow_journal import RunJournal
from tests.journal.agents import agent_graph, ai, scripted

journal = RunJournal(thread_id="owned")  # opens the default SQLite store itself
agent_graph(scripted(ai("ok"))).invoke({"messages": [HumanMessage("hi")]}, {"callbacks": [journal]})
print(journal.run_id)
"""


def test_invoke_with_the_default_store_is_stored_when_the_program_ends(tmp_path):
    types, summary = stored_run(tmp_path, run_program(OWNED_STORE_INVOKE, tmp_path).strip())
    assert types == ["run.start", "llm.human.input", "llm.ai.response", "run.end"]
    assert summary is not None and summary.status == "success"


OWNED_STORE_AINVOKE = """
import asyncio, time
from langchain_core.messages import HumanMessage
from deerflow_journal import RunJournal, SqliteRunEventStore
from tests.journal.agents import agent_graph, ai, scripted

write = SqliteRunEventStore._write


async def slow_write(self, batch):
    await asyncio.sleep(0.2)  # a slow disk: the program ends before the write does
    return await write(self, batch)


SqliteRunEventStore._write = slow_write
journal = RunJournal(thread_id="owned")  # opens the default SQLite store itself


async def main():
    graph = agent_graph(scripted(ai("ok")))
    await graph.ainvoke({"messages": [HumanMessage("hi")]}, {"callbacks": [journal]})


asyncio.run(main())  # no flush() or aclose()
print(journal.run_id)
"""


def test_ainvoke_with_the_default_store_is_stored_when_the_program_ends(tmp_path):
    types, summary = stored_run(tmp_path, run_program(OWNED_STORE_AINVOKE, tmp_path).strip())
    assert types == ["run.start", "llm.human.input", "llm.ai.response", "run.end"]
    assert summary is not None and summary.status == "success"


STORE_BACK_BEFORE_EXIT = """
import os
from langchain_core.messages import HumanMessage
from deerflow_journal import RunJournal
from tests.journal.agents import agent_graph, ai, scripted

open({blocked!r}, "w").close()  # a file where the store's directory goes: its writes fail
journal = RunJournal(thread_id="owned", event_store={url!r})
question = {{"messages": [HumanMessage("hi")]}}
agent_graph(scripted(ai("ok"))).invoke(question, {{"callbacks": [journal]}})
os.remove({blocked!r})  # the store can be written again before the program ends
print(journal.run_id)
"""


@pytest.mark.parametrize("scheme", ["jsonl", "sqlite"])
def test_a_store_back_before_the_program_ends_takes_the_run_at_exit(tmp_path, scheme):
    """The exit handler retries the failed write: a store whose work runs in the default
    executor (JSONL) still writes, although Python has shut that executor down by then."""
    blocked = tmp_path / "store"
    url = f"jsonl:///{blocked}" if scheme == "jsonl" else f"sqlite:///{blocked / 'journal.db'}"
    program = STORE_BACK_BEFORE_EXIT.format(blocked=str(blocked), url=url)
    run_id = run_program(program, tmp_path).strip()

    async def read() -> tuple[list[str], Any]:
        async with open_store(url) as store:
            events = await store.list_events("owned", run_id)
            return [e["event_type"] for e in events], await store.get_run_summary("owned", run_id)

    types, summary = asyncio.run(read())
    assert types == ["run.start", "llm.human.input", "llm.ai.response", "run.end"]
    assert summary is not None and summary.status == "success"


OUTPUTS_CHANGED_DURING_WRITES = """
import sys, threading, time, uuid
from langchain_core.messages import AIMessage, HumanMessage
from deerflow_journal import MemoryRunEventStore, RunJournal

sys.setswitchinterval(1e-6)  # switch threads as often as possible
messages = [AIMessage("m" * 40, id=str(i)) for i in range(50)]
outputs = {"messages": list(messages)}
stop = False

def change_outputs():
    while not stop:
        outputs["messages"].append(HumanMessage("x"))
        outputs["messages"].clear()
        outputs["messages"].extend(messages)

changer = threading.Thread(target=change_outputs)
changer.start()
journal = RunJournal(event_store=MemoryRunEventStore())
deadline = time.monotonic() + 1.5
try:
    while time.monotonic() < deadline:  # plain invoke-style runs: written on another thread
        root = uuid.uuid4()
        journal.on_chain_start(None, {}, run_id=root, name="graph")
        journal.on_chain_end(outputs, run_id=root)
finally:
    stop = True
    changer.join()
print("done")
"""


def test_outputs_changed_by_another_thread_while_they_are_written_do_not_crash(tmp_path):
    # Before callbacks copied their containers, this crashed the interpreter (SIGSEGV)
    # within a second: orjson was walking the very list the other thread changed.
    assert run_program(OUTPUTS_CHANGED_DURING_WRITES, tmp_path).strip() == "done"


# -- a plain invoke's wait ---------------------------------------------------------------------


class CallingBackStore(MemoryRunEventStore):
    """Storing a ``run.end`` makes another run of the journal call back at once; that run's
    later writes make no progress while ``hung`` is set."""

    hung = True

    def __init__(self) -> None:
        super().__init__()
        self.other: tuple[RunJournal, uuid.UUID] | None = None
        self.called_back = False

    async def _write(self, batch: Write) -> Written:
        while self.called_back and self.hung:
            await asyncio.sleep(0.01)
        written = await super()._write(batch)
        if self.other is not None and any(e.event_type == "run.end" for e in batch.events):
            self.called_back = True
            tool_result(*self.other, 99)
        return written


def test_a_plain_invoke_waits_for_its_own_run_not_for_what_others_add_meanwhile(
    monkeypatch, caplog
):
    monkeypatch.setattr(JournalWriter, "wait_timeout", 0.5)
    store = CallingBackStore()
    journal = RunJournal(event_store=store)
    store.other = (journal, direct_run(journal, 1))  # another run, in progress
    agent_graph(scripted(ai("ok"))).invoke(QUESTION, {"callbacks": [journal]})
    assert not [r for r in caplog.records if "gave up" in r.getMessage()]
    assert [e["event_type"] for e in asyncio.run(run_events(journal))][-1] == "run.end"
    store.hung = False
    journal.close()


def test_a_plain_invoke_gives_up_on_a_hung_progress_reporter(monkeypatch, caplog):
    monkeypatch.setattr(JournalWriter, "wait_timeout", 0.1)
    calls = []

    async def reporter(data: dict[str, Any]) -> None:
        calls.append(data)
        if len(calls) > 1:  # the trailing snapshot never returns
            await asyncio.Event().wait()

    journal = RunJournal(
        event_store=MemoryRunEventStore(), progress_reporter=reporter, progress_flush_interval=60
    )
    graph = agent_graph(scripted(ai("", calls=[("add", {"a": 1, "b": 1}, "c1")]), ai("done")))
    invoker = threading.Thread(
        target=graph.invoke, args=(QUESTION, {"callbacks": [journal]}), daemon=True
    )
    invoker.start()
    invoker.join(120)  # a hang guard, not a time limit on invoke
    assert not invoker.is_alive()
    assert any("last progress snapshot" in r.getMessage() for r in caplog.records)
    assert journal.summary().status == "success"


async def test_a_plain_invoke_on_the_loop_thread_during_a_write_is_written_right_after_it():
    """Inside Jupyter: the write in flight belongs to the loop this invoke blocks."""
    store = GatedStore()
    journal = RunJournal(event_store=store, flush_threshold=5)
    direct_run(journal, 5)  # an ainvoke-style run whose threshold write is now in flight
    await settle()
    assert store.active == 1
    agent_graph(scripted(ai("ok"))).invoke(QUESTION, {"callbacks": [journal]})
    store.gate.set()
    await settle()
    assert [e["event_type"] for e in await run_events(journal)] == [
        "run.start",
        "llm.human.input",
        "llm.ai.response",
        "run.end",
    ]


def test_a_run_that_ends_while_a_write_builds_its_summary_stores_the_final_one():
    """A write that built a run's summary and finds it queued again keeps the newer one."""
    store = MemoryRunEventStore()
    journal = RunJournal(run_id="r", thread_id="t", event_store=store, flush_threshold=1)
    buffer = journal._writer.buffer
    caller = threading.current_thread()
    real_put = buffer.put_summary
    built_while_running: list[str] = []

    wrapped: dict[int, tuple[Any, Any]] = {}  # one wrapper per builder: identity is kept

    def put_summary(key: tuple[str, str], build: Any) -> None:
        def slow_build(timeout: float = -1, *, locked: bool = False) -> dict[str, Any]:
            data = build(timeout, locked=locked)
            writing = not locked and threading.current_thread() is not caller
            if writing and not built_while_running:  # hold the first write until the run ends
                built_while_running.append(data["status"])
                ticket = buffer._ticket
                deadline = time.monotonic() + 5
                while buffer._ticket == ticket and time.monotonic() < deadline:
                    time.sleep(0.01)
            return data

        if id(build) not in wrapped or wrapped[id(build)][0] is not build:
            wrapped[id(build)] = (build, slow_build)
        real_put(key, wrapped[id(build)][1])

    buffer.put_summary = put_summary  # type: ignore[method-assign]

    def step(value: str) -> str:
        # The write run.start began may have taken its snapshot before the run's summary was
        # queued: an event now starts one that finds it, once that write is done.
        journal.record_middleware("probe", name="p", hook="step", action="wait", changes={})
        deadline = time.monotonic() + 5
        while not built_while_running and time.monotonic() < deadline:
            time.sleep(0.01)
        return value

    RunnableLambda(step).invoke("x", {"callbacks": [journal]})
    asyncio.run(journal.flush())
    (summary,) = asyncio.run(store.list_run_summaries("t"))
    assert built_while_running == ["running"]
    assert summary.status == "success" and summary.ended_at is not None
