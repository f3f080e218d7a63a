"""A store passed in is written on the loop it was set up on, whatever thread ends the run."""

from __future__ import annotations

import asyncio

from deerflow_journal import MemoryRunEventStore, RunJournal
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
