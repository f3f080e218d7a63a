"""A journal whose write's event loop stops or closes under it, as a worker that makes a loop
per task does (``loop.run_until_complete(graph.ainvoke(...))``, then ``loop.close()``, or the
loop kept for the next task): the journal's next use writes every run once, and neither spins
nor stalls. Every wait here is bounded, so a regression fails instead of hanging the suite."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from collections.abc import Callable
from typing import Any

import pytest

from deerflow_journal import MemoryRunEventStore, RunJournal
from deerflow_journal.journal import buffer as buffer_module
from deerflow_journal.stores.base import Write, Written
from tests.journal.agents import QUESTION, agent_graph, ai, scripted

ANSWER_SEQUENCE = ["run.start", "llm.human.input", "llm.ai.response", "run.end"]
#: Seconds a step that takes milliseconds may take on a loaded machine before the test fails.
BOUND = 60.0


def in_thread(work: Callable[[], Any]) -> Any:
    """Run ``work`` in a thread of its own; fail (not hang) if it does not return in time."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = work()
        except BaseException as exc:  # handed to the test
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(BOUND)
    assert not thread.is_alive(), "the journal's next use did not return"
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def stored(store: MemoryRunEventStore, run_id: str) -> list[str]:
    async def read() -> list[str]:
        return [event["event_type"] for event in await store.list_events(run_id, run_id)]

    return in_thread(lambda: asyncio.run(read()))


class GatedStore(MemoryRunEventStore):
    """A memory store whose journal writes wait for ``gate`` (a future of the caller's loop),
    then fail once if ``fail`` says so."""

    def __init__(self) -> None:
        super().__init__()
        self.gate: asyncio.Future[None] | None = None
        self.fail = False

    async def _write(self, write: Write) -> Written:
        gate = self.gate
        if gate is not None and not gate.done():
            await gate
        if self.fail:
            self.fail = False
            raise OSError("the store went away")
        return await super()._write(write)


# -- a write that ended on its loop's last turn -----------------------------------------------


@pytest.mark.parametrize("then", ["invoke", "ainvoke", "close"])
@pytest.mark.parametrize("outcome", ["stored", "failed"])
def test_a_write_that_ends_on_its_loops_last_turn_is_accounted_for(then, outcome):
    """The write ends as ``run_until_complete`` stops its loop: its done callback never runs
    before ``loop.close()``, and the journal's write is a finished task of a closed loop."""
    store = GatedStore()
    asyncio.run(store.setup())
    journal = RunJournal(event_store=store, flush_threshold=1000)
    store.fail = outcome == "failed"

    async def run_then_answer() -> None:
        store.gate = asyncio.get_running_loop().create_future()
        await agent_graph(scripted(ai("1"))).ainvoke(QUESTION, {"callbacks": [journal]})
        store.gate.set_result(None)  # the store answers just as the run returns

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(run_then_answer())
        write = journal._buffer._write
        assert write is not None and write.future.done()  # ended, not accounted for
    finally:
        loop.close()
    first = journal.run_id
    assert first is not None

    if then == "invoke":
        in_thread(lambda: agent_graph(scripted(ai("2"))).invoke(QUESTION, {"callbacks": [journal]}))
    elif then == "ainvoke":

        async def next_run() -> None:
            await agent_graph(scripted(ai("2"))).ainvoke(QUESTION, {"callbacks": [journal]})
            await asyncio.wait_for(journal.flush(), BOUND)

        in_thread(lambda: asyncio.run(next_run()))
    else:
        in_thread(journal.close)

    assert stored(store, first) == ANSWER_SEQUENCE  # written, and once
    if then != "close":
        assert journal._buffer._write is None
        assert journal.run_id != first
        assert stored(store, journal.run_id) == ANSWER_SEQUENCE


# -- await flush() while another thread's loop closes under the write --------------------------


def test_an_async_flush_waiting_for_a_write_whose_loop_closes_writes_it_elsewhere():
    store = MemoryRunEventStore()
    asyncio.run(store.setup())
    journal = RunJournal(event_store=store, flush_threshold=1000)
    real = store._write
    stalled = threading.Event()

    async def stalling(write: Write) -> Written:
        if not stalled.is_set():
            stalled.set()
            await asyncio.Event().wait()  # only its loop closing ends it
        return await real(write)

    store._write = stalling  # type: ignore[method-assign]
    waiting = threading.Event()
    real_wait = buffer_module._Write.wait

    async def wait(self: Any, stopped_for: float) -> None:
        waiting.set()
        await real_wait(self, stopped_for)

    closed = threading.Event()

    def worker() -> None:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(
                agent_graph(scripted(ai("1"))).ainvoke(QUESTION, {"callbacks": [journal]})
            )
            while not stalled.is_set():  # the write may start on the next turn
                loop.run_until_complete(asyncio.sleep(0.001))
            assert waiting.wait(BOUND)  # the flush below waits for it now
        finally:
            loop.close()
            closed.set()

    async def flush() -> None:
        await asyncio.wait_for(journal.flush(), BOUND)

    buffer_module._Write.wait = wait  # type: ignore[method-assign]
    try:
        thread = threading.Thread(target=worker, daemon=True)
        thread.start()
        assert stalled.wait(BOUND)
        asyncio.run(flush())
    finally:
        buffer_module._Write.wait = real_wait  # type: ignore[method-assign]
    thread.join(BOUND)
    assert closed.is_set()
    assert journal.run_id is not None
    assert stored(store, journal.run_id) == ANSWER_SEQUENCE


# -- await flush() while another thread's loop stays stopped ----------------------------------


def test_an_async_flush_gives_up_on_a_write_whose_loop_stays_stopped_and_keeps_its_events():
    """A worker keeps its loop for a next task with the run's write in flight: the flush
    raises after the wait's timeout instead of waiting for good; the loop run again writes
    the run, once."""
    store = MemoryRunEventStore()
    asyncio.run(store.setup())
    journal = RunJournal(event_store=store, flush_threshold=1000)
    journal._buffer.wait_timeout = 0.2
    real = store._write
    release: list[asyncio.Event] = []

    async def stalling(write: Write) -> Written:
        if not release:
            release.append(asyncio.Event())
            await release[0].wait()  # until the worker's loop runs again and sets it
        return await real(write)

    store._write = stalling  # type: ignore[method-assign]
    loop = asyncio.new_event_loop()

    def first_task() -> None:
        loop.run_until_complete(
            agent_graph(scripted(ai("1"))).ainvoke(QUESTION, {"callbacks": [journal]})
        )
        while not release:  # the write may start on the next turn
            loop.run_until_complete(asyncio.sleep(0.001))

    async def flush() -> None:
        await asyncio.wait_for(journal.flush(), BOUND)

    async def next_task() -> None:
        release[0].set()
        while journal._buffer._write is not None:
            await asyncio.sleep(0.001)

    try:
        in_thread(first_task)  # returns with the loop stopped, the write in flight
        with pytest.raises(buffer_module.LoopStopped):
            in_thread(lambda: asyncio.run(flush()))
        in_thread(lambda: loop.run_until_complete(next_task()))
        in_thread(lambda: asyncio.run(flush()))
    finally:
        loop.close()
    assert journal.run_id is not None
    assert stored(store, journal.run_id) == ANSWER_SEQUENCE


# -- loops that ran a journal are freed ----------------------------------------------------------


@pytest.mark.parametrize("ends_by", ["close", "asyncio.run"])
def test_a_loop_that_ran_a_journal_is_freed_once_closed(ends_by):
    store = MemoryRunEventStore()
    asyncio.run(store.setup())
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def run(journal: RunJournal) -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        await agent_graph(scripted(ai("1"))).ainvoke(QUESTION, {"callbacks": [journal]})
        await journal.flush()

    for _ in range(3):
        journal = RunJournal(event_store=store, flush_threshold=1000)
        if ends_by == "close":
            loop = asyncio.new_event_loop()
            loop.run_until_complete(run(journal))
            loop.close()
            del loop
        else:
            asyncio.run(run(journal))
    # A loop closed without shutting down its generators goes when the next guard starts.
    asyncio.run(run(RunJournal(event_store=store, flush_threshold=1000)))
    del journal
    gc.collect()
    assert [ref() for ref in loops[:3]] == [None, None, None]
