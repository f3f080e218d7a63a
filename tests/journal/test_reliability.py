"""A journal whose store refuses an event, fails, or loses the answer to a write it took: the
refused event is dropped alone and counted (one too long for any store is cut to fit
instead), a failing store is retried with nothing dropped, and a batch retried after its
answer was lost is written once (on every backend), and so is one whose event loop was closed
under it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import string
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from langchain_core.tools import tool

from deerflow_journal import (
    EventRefused,
    MemoryRunEventStore,
    RunEventStore,
    RunJournal,
    SqliteRunEventStore,
)
from deerflow_journal.records import JSON_MAX_LENGTH, encode_json
from deerflow_journal.stores.base import Write, Written
from tests.backends import PostgresBackend
from tests.journal.agents import (
    ONE_TOOL_CALL_SEQUENCE,
    QUESTION,
    agent_graph,
    ai,
    run_events,
    scripted,
    stored,
)

RealWrite = Callable[..., Awaitable[Written]]
ANSWER_SEQUENCE = ["run.start", "llm.human.input", "llm.ai.response", "run.end"]


@tool
def fetch(url: str) -> str:
    """Fetch a page."""
    return f"the page at {url}: forbidden words"


def fetching_graph() -> Any:
    return agent_graph(
        scripted(ai("", calls=[("fetch", {"url": "x"}, "f1")]), ai("Done.")), [fetch]
    )


Wrapper = Callable[[RealWrite, Any, Any, Any], Awaitable[Written]]


def wrap_writes(store: RunEventStore, wrapper: Wrapper) -> None:
    """Route the store's journal writes (those with a batch id) through
    ``wrapper(real_write, events, summaries, id)``: the real backend writes, the wrapper adds
    the fault."""
    real = store._write

    async def write(batch: Write) -> Written:
        if batch.batch_id is None:
            return await real(batch)

        def real_write(events: Any, summaries: Any, batch_id: Any) -> Awaitable[Written]:
            return real(Write(events, summaries, batch_id))

        return await wrapper(real_write, batch.events, batch.summaries, batch.batch_id)

    store._write = write  # type: ignore[method-assign]


def refusing(word: str) -> Wrapper:
    """A store that refuses, as a database refuses a row, every batch holding a message with
    ``word`` (as an index on message content would)."""

    async def wrapper(real: RealWrite, events: Any, summaries: Any, batch_id: Any) -> Written:
        if any(e.category == "message" and word in e.content_json for e in events):
            raise EventRefused(f"no {word!r} here")
        return await real(events, summaries, batch_id)

    return wrapper


def failing_first(failures: list[Exception]) -> Wrapper:
    """A store whose next journal writes raise ``failures`` in turn, and then write."""

    async def wrapper(real: RealWrite, events: Any, summaries: Any, batch_id: Any) -> Written:
        if failures:
            raise failures.pop(0)
        return await real(events, summaries, batch_id)

    return wrapper


async def run_on_failing_store(
    store: RunEventStore, failures: list[Exception], flushes: int
) -> RunJournal:
    """Journal one run on ``store`` whose writes first raise ``failures``; flush (at most
    ``flushes`` times) until a flush writes."""
    errors = tuple({type(failure) for failure in failures})
    wrap_writes(store, failing_first(failures))
    journal = RunJournal(event_store=store, flush_threshold=1000)
    await fetching_graph().ainvoke(QUESTION, {"callbacks": [journal]})
    for _ in range(flushes):
        try:
            await journal.flush()
            break
        except errors:
            pass
    return journal


async def test_an_event_its_store_refuses_is_dropped_alone_and_counted(store, caplog):
    wrap_writes(store, refusing("forbidden"))
    journal = RunJournal(event_store=store, flush_threshold=1000)  # one batch for the run
    await fetching_graph().ainvoke(QUESTION, {"callbacks": [journal]})
    await journal.flush()  # does not raise: the rest of the batch is written
    sequence, summary = await stored(journal)
    assert sequence == [t for t in ONE_TOOL_CALL_SEQUENCE if t != "llm.tool.result"]
    assert journal.dropped_events == 1 and summary.dropped_events == 1
    assert summary.message_count == 3  # those stored
    assert "journal dropped a llm.tool.result event" in caplog.text
    assert [r.levelno for r in caplog.records if "dropped" in r.message] == [logging.ERROR]

    # The journal is not stuck: the next run is written whole.
    await agent_graph(scripted(ai("Hello."))).ainvoke(QUESTION, {"callbacks": [journal]})
    await journal.flush()
    sequence, summary = await stored(journal)
    assert sequence == ["run.start", "llm.human.input", "llm.ai.response", "run.end"]
    assert summary.dropped_events == 0 and journal.dropped_events == 1


@tool(response_format="content_and_artifact")
def render(kind: str) -> tuple[str, dict[str, str]]:
    """Render a chart."""
    return "chart rendered", {"png": "x" * (JSON_MAX_LENGTH + 1000)}


async def test_a_message_too_long_for_any_store_is_cut_to_fit_and_its_call_keeps_its_result(
    store, caplog
):
    graph = agent_graph(
        scripted(ai("", calls=[("render", {"kind": "bar"}, "c1")]), ai("Here it is.")), [render]
    )
    journal = RunJournal(event_store=store)
    await graph.ainvoke(QUESTION, {"callbacks": [journal]})
    await journal.flush()
    sequence, summary = await stored(journal)
    assert sequence == ONE_TOOL_CALL_SEQUENCE
    assert summary.dropped_events == 0 and summary.message_count == 4
    (result,) = [e for e in await run_events(journal) if e["event_type"] == "llm.tool.result"]
    # What the model saw is whole; the artifact it never saw is what is cut.
    assert result["content"]["content"] == "chart rendered"
    assert result["content"]["tool_call_id"] == "c1"
    assert 0 < len(result["content"]["artifact"]["png"]) < JSON_MAX_LENGTH
    assert len(encode_json(result["content"])) <= JSON_MAX_LENGTH
    assert result["metadata"]["content_truncated"] is True
    assert result["metadata"]["original_byte_length"] > JSON_MAX_LENGTH
    assert "journal cut the content of a llm.tool.result event" in caplog.text


async def test_a_failing_store_is_retried_and_nothing_is_dropped(store, caplog):
    failures = [ConnectionError("server closed the connection"), ValueError("pool is closing")]
    # The run's own write at its end may take the first failure.
    journal = await run_on_failing_store(store, failures, flushes=3)
    assert not failures
    sequence, summary = await stored(journal)
    assert sequence == ONE_TOOL_CALL_SEQUENCE
    assert journal.dropped_events == 0 and summary.dropped_events == 0
    assert "dropped" not in caplog.text


async def test_a_batch_whose_answer_was_lost_after_its_commit_is_written_once(store):
    lost = [True]

    async def commit_then_drop(
        real: RealWrite, events: Any, summaries: Any, batch_id: Any
    ) -> Written:
        written = await real(events, summaries, batch_id)
        if lost and events:
            lost.pop()
            raise ConnectionError("server closed the connection unexpectedly")
        return written

    wrap_writes(store, commit_then_drop)
    journal = RunJournal(event_store=store, flush_threshold=1000)
    await fetching_graph().ainvoke(QUESTION, {"callbacks": [journal]})
    with contextlib.suppress(ConnectionError):  # unless the run's own write at its end took it
        await journal.flush()
    assert not lost
    # Meanwhile the journal records more for the run: it goes out with the retry, once.
    journal.record_middleware(
        "guardrail", name="Guard", hook="after_model", action="allow", changes={}
    )
    await journal.flush()
    sequence, summary = await stored(journal)
    assert sequence == [*ONE_TOOL_CALL_SEQUENCE, "middleware:guardrail"]
    assert summary.status == "success" and summary.message_count == 4


async def test_a_summary_its_store_refuses_is_dropped_and_the_events_are_written(store, caplog):
    async def refuse_summaries(
        real: RealWrite, events: Any, summaries: Any, batch_id: Any
    ) -> Written:
        if summaries:
            raise EventRefused("summary too large")
        return await real(events, summaries, batch_id)

    wrap_writes(store, refuse_summaries)
    journal = RunJournal(event_store=store, flush_threshold=1000)
    await fetching_graph().ainvoke(QUESTION, {"callbacks": [journal]})
    await journal.flush()
    assert [e["event_type"] for e in await run_events(journal)] == ONE_TOOL_CALL_SEQUENCE
    assert journal.dropped_events == 0
    assert "journal dropped 1 run summaries its store refused" in caplog.text


def _unindexable(length: int) -> str:
    """Text too random to compress into a btree entry (2,704 bytes at most)."""
    return "".join(random.Random(3).choices(string.ascii_letters + string.digits, k=length))


CONTENT_INDEX = """CREATE INDEX by_content ON run_events ((content::text))
    WHERE category = 'message'"""


@tool
def read_file(path: str) -> str:
    """Read a file."""
    return _unindexable(4000)


@pytest.mark.postgres
async def test_a_row_postgresql_refuses_is_dropped_alone(tmp_path: Path, request, caplog):
    # A real refusal: an index a DBA added on message content cannot hold this tool's output.
    backend = PostgresBackend(tmp_path, request)
    try:
        async with backend.make() as store:
            import psycopg

            async with await psycopg.AsyncConnection.connect(backend.dsn, autocommit=True) as c:
                await c.execute(CONTENT_INDEX)
            journal = RunJournal(event_store=store, flush_threshold=1000)
            model = scripted(ai("", calls=[("read_file", {"path": "a"}, "r1")]), ai("Read."))
            await agent_graph(model, [read_file]).ainvoke(QUESTION, {"callbacks": [journal]})
            await journal.flush()
            sequence, summary = await stored(journal)
        assert sequence == [t for t in ONE_TOOL_CALL_SEQUENCE if t != "llm.tool.result"]
        assert summary.dropped_events == 1
        assert "index row size" in caplog.text
    finally:
        await backend.cleanup()


@pytest.fixture
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Timed retries a hundred times sooner than by default, so that a test sees several."""
    from deerflow_journal.journal import buffer

    monkeypatch.setattr(buffer._FailedWrites, "first_retry_seconds", 0.01)


async def written_in_the_end(journal: RunJournal, count: int) -> list[str]:
    """The latest run's stored event types, once ``count`` are stored and so is its summary.
    Waits for as long as a store that is back takes on a loaded machine, not a speed bound."""
    assert journal.thread_id is not None and journal.run_id is not None
    deadline = time.monotonic() + 60
    while True:
        events = await run_events(journal)
        summary = await journal.event_store.get_run_summary(journal.thread_id, journal.run_id)
        if (len(events) >= count and summary is not None) or time.monotonic() > deadline:
            return [e["event_type"] for e in events]
        await asyncio.sleep(0.01)


async def test_what_failed_writes_left_is_retried_although_nothing_else_writes(
    store, quick_retries, caplog
):
    failures = [ConnectionError(f"server down ({i})") for i in range(4)]
    wrap_writes(store, failing_first(failures))
    journal = RunJournal(event_store=store, flush_threshold=1000)
    await fetching_graph().ainvoke(QUESTION, {"callbacks": [journal]})
    # No flush and no other run: the run's own write failed, and the timed retries take it
    # to the store once it is back (a server that idles after its last request).
    assert await written_in_the_end(journal, len(ONE_TOOL_CALL_SEQUENCE)) == (
        ONE_TOOL_CALL_SEQUENCE
    )
    assert not failures
    await journal.flush()  # the write that stored them has ended, and said so
    sequence, summary = await stored(journal)  # written once
    assert sequence == ONE_TOOL_CALL_SEQUENCE and summary.status == "success"
    assert journal_warnings(caplog)[-1] == "journal writes work again after 4 failed in a row"


def test_retries_wait_twice_as_long_after_each_failure_up_to_half_a_minute(monkeypatch):
    from deerflow_journal.journal.buffer import _FailedWrites

    monkeypatch.undo()  # the timings a program has, not the tests' (see conftest)

    failures, delays = _FailedWrites(), []
    for _ in range(8):
        failures.failed(ConnectionError("down"), 0)
        delays.append(failures.retry_delay())
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    failures.succeeded()
    failures.failed(ConnectionError("down again"), 0)
    assert failures.retry_delay() == 1.0


def journal_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the journal logged at WARNING or above (other libraries' objects, collected
    meanwhile, may log too)."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith("deerflow_journal")
    ]


async def test_a_store_down_for_many_writes_is_said_once_and_its_return_too(store, caplog):
    failures = [ConnectionError(f"server down ({i})") for i in range(6)]
    # Each flush sends the backlog again until the store answers.
    journal = await run_on_failing_store(store, failures, flushes=10)
    assert not failures
    sequence, _ = await stored(journal)
    assert sequence == ONE_TOOL_CALL_SEQUENCE
    said = journal_warnings(caplog)
    assert said == [
        "journal write failed; its events stay buffered: ConnectionError('server down (0)')",
        "journal writes work again after 6 failed in a row",
    ]


async def test_a_store_that_goes_on_failing_is_said_again_after_a_while(store, caplog, monkeypatch):
    from deerflow_journal.journal import buffer

    monkeypatch.setattr(buffer._FailedWrites, "repeat_seconds", 0.0)  # every failure is "a while"
    failures = [ConnectionError("down") for _ in range(3)]
    await run_on_failing_store(store, failures, flushes=5)
    assert not failures
    said = journal_warnings(caplog)
    waiting = len(ONE_TOOL_CALL_SEQUENCE)
    assert said == [
        "journal write failed; its events stay buffered: ConnectionError('down')",
        f"journal writes still fail (2 in a row); {waiting} events wait: ConnectionError('down')",
        f"journal writes still fail (3 in a row); {waiting} events wait: ConnectionError('down')",
        "journal writes work again after 3 failed in a row",
    ]


async def test_a_journal_dropped_after_its_run_is_freed_without_the_cycle_collector(store):
    import gc
    import weakref

    journal = RunJournal(event_store=store)
    await fetching_graph().ainvoke(QUESTION, {"callbacks": [journal]})
    await journal.flush()
    gone = weakref.ref(journal)
    # The run leaves LangChain's own garbage cycles, some holding its callback managers and
    # so the journal: collected first, while the journal is still held here.
    gc.collect()
    gc.disable()  # reference counting alone must free it: no cycle through its buffer
    try:
        del journal
        assert gone() is None
    finally:
        gc.enable()


# -- a loop closed under a write -----------------------------------------------------------


def stalled_once(store: RunEventStore, stage: str) -> list[str]:
    """Make the store's first journal write stall (``commit``: after storing its batch) or its
    first setup (``setup``) until its loop is closed under it; the list names what stalled."""
    stalled: list[str] = []
    method = "_setup" if stage == "setup" else "_write"
    real = getattr(store, method)

    async def stall() -> None:
        stalled.append(stage)
        await asyncio.Event().wait()  # only the loop closing ends it

    async def stalling(*args: Any) -> Any:
        if stalled or (method == "_write" and args[0].batch_id is None):
            return await real(*args)
        if stage != "commit":
            await stall()
        written = await real(*args)
        await stall()
        return written

    setattr(store, method, stalling)
    return stalled


@pytest.mark.parametrize("then", ["next_run", "close"])
@pytest.mark.parametrize("stage", ["write", "commit", "setup"])
@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_write_whose_loop_is_closed_under_it_is_written_next_once(tmp_path, kind, stage, then):
    """``loop.run_until_complete(graph.ainvoke(...))`` then ``loop.close()``, as a task
    queue's worker does per task, while the run's write (or the store's lazy setup) runs.

    The ``commit`` variants (the store took the batch, then the loop closed) pass also
    without the journal taking up a dead write (``EventBuffer._drop_dead_locked``): they only
    guard against the batch being stored twice. A write that ended on the loop's last turn,
    and one on a loop stopped but not closed, are ``test_loop_ends.py``'s."""
    store = MemoryRunEventStore() if kind == "memory" else SqliteRunEventStore(tmp_path / "j.db")
    if stage != "setup":
        asyncio.run(store.setup())
    stalled = stalled_once(store, stage)
    journal = RunJournal(event_store=store, flush_threshold=1000)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(fetching_graph().ainvoke(QUESTION, {"callbacks": [journal]}))
        deadline = time.monotonic() + 60  # a loaded machine's turns, not a speed bound
        while not stalled and time.monotonic() < deadline:  # it may start on the next turn
            loop.run_until_complete(asyncio.sleep(0.001))
        assert stalled
    finally:
        loop.close()
    first = journal.run_id

    async def next_run() -> None:
        await agent_graph(scripted(ai("3"))).ainvoke(QUESTION, {"callbacks": [journal]})
        await asyncio.wait_for(journal.flush(), 60)

    if then == "next_run":
        asyncio.run(next_run())
    else:
        journal.close()

    async def read(run_id: str) -> list[str]:
        events = await asyncio.wait_for(store.list_events(run_id, run_id), 60)
        return [event["event_type"] for event in events]

    assert asyncio.run(read(first)) == ONE_TOOL_CALL_SEQUENCE  # written, and once
    if then == "next_run":
        assert asyncio.run(read(journal.run_id)) == ANSWER_SEQUENCE
