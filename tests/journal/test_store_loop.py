"""A store passed in is written on the loop it was set up on, whatever thread ends the run,
and elsewhere once that loop ends."""

from __future__ import annotations

import asyncio
import threading

import pytest

from deerflow_journal import MemoryRunEventStore, RunJournal, SqliteRunEventStore
from deerflow_journal.journal.loops import background_loop
from deerflow_journal.stores.base import Write, Written
from tests.journal.agents import QUESTION, agent_graph, ai, run_events, scripted

ANSWER_SEQUENCE = ["run.start", "llm.human.input", "llm.ai.response", "run.end"]


class LoopRecordingStore(MemoryRunEventStore):
    """A memory store that records the loop each journal write runs on."""

    def __init__(self) -> None:
        super().__init__()
        self.loops: list[asyncio.AbstractEventLoop] = []

    async def _write(self, write: Write) -> Written:
        self.loops.append(asyncio.get_running_loop())
        return await super()._write(write)


async def test_invoke_in_a_worker_thread_writes_on_the_loop_the_store_was_set_up_on():
    async with LoopRecordingStore() as store:
        journal = RunJournal(event_store=store, flush_threshold=1)
        graph = agent_graph(scripted(ai("3")))
        await asyncio.to_thread(graph.invoke, QUESTION, {"callbacks": [journal]})
        assert [e["event_type"] for e in await run_events(journal)] == ANSWER_SEQUENCE
        assert set(store.loops) == {asyncio.get_running_loop()}


def test_a_store_set_up_on_a_loop_that_has_closed_is_written_on_the_background_loop():
    store = LoopRecordingStore()
    asyncio.run(store.setup())
    journal = RunJournal(event_store=store, flush_threshold=1)
    agent_graph(scripted(ai("3"))).invoke(QUESTION, {"callbacks": [journal]})
    assert [e["event_type"] for e in asyncio.run(run_events(journal))] == ANSWER_SEQUENCE
    assert set(store.loops) == {background_loop()}


@pytest.mark.parametrize("ends_by", ["asyncio.run", "close"])
@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_invoke_while_the_loop_of_an_earlier_ainvoke_ends_is_written_elsewhere_once(
    tmp_path, kind, ends_by
):
    """A plain ``invoke`` writes on the loop of the journal's latest ``ainvoke``, in another
    thread; that loop ends while the write runs there (``asyncio.run`` returning, or
    ``loop.close()`` after ``run_until_complete``): the write goes on elsewhere."""
    store = MemoryRunEventStore() if kind == "memory" else SqliteRunEventStore(tmp_path / "j.db")
    journal = RunJournal(event_store=store, flush_threshold=1000)
    home: list[asyncio.AbstractEventLoop] = []
    ran, stalled, ended = threading.Event(), threading.Event(), threading.Event()
    real = store._write

    async def write(batch: Write) -> Written:
        if ran.is_set() and not stalled.is_set() and asyncio.get_running_loop() is home[0]:
            stalled.set()  # the invoke's write: it stalls there until that loop ends
            await asyncio.Event().wait()
        return await real(batch)

    store._write = write  # type: ignore[method-assign]

    async def home_thread() -> None:
        home.append(asyncio.get_running_loop())
        await agent_graph(scripted(ai("4"))).ainvoke(QUESTION, {"callbacks": [journal]})
        await journal.flush()
        ran.set()
        while not (stalled.is_set() or ended.is_set()):
            await asyncio.sleep(0.001)

    def main() -> None:
        if ends_by == "asyncio.run":
            asyncio.run(home_thread())
            return
        loop = asyncio.new_event_loop()
        loop.run_until_complete(home_thread())
        loop.close()

    thread = threading.Thread(target=main)
    thread.start()
    try:
        assert ran.wait(60)
        agent_graph(scripted(ai("3"))).invoke(QUESTION, {"callbacks": [journal]})
    finally:
        ended.set()
        thread.join()
    assert stalled.is_set()
    assert [e["event_type"] for e in asyncio.run(run_events(journal))] == ANSWER_SEQUENCE
