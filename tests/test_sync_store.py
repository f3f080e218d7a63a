"""``SyncStore``: a store's reads and writes for programs without asyncio, on a loop of its own."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from deerflow_journal import (
    MemoryRunEventStore,
    RunEventStore,
    RunJournal,
    RunSummary,
    SyncStore,
    open_sync_store,
    user_scope,
)
from deerflow_journal.stores.base import _shielded
from tests.backends import Backend, PostgresBackend, SqliteBackend
from tests.journal.agents import QUESTION, agent_graph, ai, scripted
from tests.journal.test_store_loop import ANSWER_SEQUENCE, LoopRecordingStore

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")

READS = [
    "list_messages",
    "list_messages_by_run",
    "list_events",
    "get_last_visible_ai_seq_by_run",
    "count_messages",
    "get_run_summary",
    "list_run_summaries",
    "list_threads",
]
WRITES = [
    "put",
    "put_batch",
    "put_if_absent",
    "put_run_summary",
    "delete_by_thread",
    "delete_by_run",
]


def on_store_loop(sync_store: SyncStore, coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` on the loop the facade set its store up on."""
    loop = sync_store.store._setup_loop
    assert loop is not None
    return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=120)


def event(run_id: str, i: int, **fields: Any) -> dict[str, Any]:
    """A message event of thread t1 (``fields`` override)."""
    return {
        "thread_id": "t1",
        "run_id": run_id,
        "event_type": "llm.ai.response" if i % 2 else "llm.human.input",
        "category": "message",
        "content": {"i": i},
        "metadata": {"task_id": f"task-{i % 3}"},
        "created_at": f"2024-01-01T00:00:{i:02d}+00:00",
        **fields,
    }


def summary(run_id: str, **fields: Any) -> RunSummary:
    """A finished run's summary in thread t1."""
    return RunSummary(thread_id="t1", run_id=run_id, status="success", **fields)


def test_the_facade_has_every_store_method_with_the_same_signature():
    for name in [*READS, *WRITES, "setup", "close"]:
        facade, store = getattr(SyncStore, name), getattr(RunEventStore, name)
        assert not inspect.iscoroutinefunction(facade), name
        assert inspect.signature(facade) == inspect.signature(store), name


def test_every_read_through_the_facade_returns_what_the_async_store_returns(backend: Backend):
    calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
        ("list_messages", ("t1",), {}),
        ("list_messages", ("t1",), {"limit": 3, "before_seq": 9}),
        ("list_messages", ("t1",), {"limit": 2, "after_seq": 4}),
        ("list_messages", ("t1",), {"user_id": "alice"}),
        ("list_messages_by_run", ("t1", "r1"), {"limit": 2}),
        ("list_messages_by_run", ("t1", "r2"), {"after_seq": 7, "user_id": None}),
        ("list_events", ("t1", "r1"), {}),
        ("list_events", ("t1", "r1"), {"event_types": "llm.ai.response", "limit": 2}),
        ("list_events", ("t1", "r1"), {"event_types": ["run.start"], "task_id": "task-1"}),
        ("list_events", ("t1", "r2"), {"after_seq": 8, "user_id": "alice"}),
        ("get_last_visible_ai_seq_by_run", ("t1", ["r1", "r2", "nope"]), {}),
        ("get_last_visible_ai_seq_by_run", ("t1", "r1"), {"user_id": "bob"}),
        ("count_messages", ("t1",), {}),
        ("count_messages", ("t1",), {"user_id": "alice"}),
        ("get_run_summary", ("t1", "r1"), {}),
        ("get_run_summary", ("t1", "r1"), {"user_id": "alice"}),
        ("get_run_summary", ("t1", "nope"), {}),
        ("list_run_summaries", ("t1",), {}),
        ("list_run_summaries", ("t1",), {"user_id": "alice"}),
        ("list_run_summaries", (), {}),
        ("list_run_summaries", ("t1",), {"limit": 1}),
        ("list_run_summaries", (), {"status": "success", "user_id": "alice"}),
        ("list_threads", (), {}),
        ("list_threads", (), {"limit": 1, "user_id": "alice"}),
    ]
    with SyncStore(backend.url()) as store:
        store.put_batch([event("r1", i) for i in range(6)])
        store.put_batch([event("r2", i, user_id="alice") for i in range(6, 12)])
        store.put(thread_id="t1", run_id="r1", event_type="run.start", category="trace")
        store.put_run_summary(summary("r1", message_count=6))
        store.put_run_summary(summary("r2", user_id="alice"))
        store.put(thread_id="t2", run_id="r3", event_type="run.start", category="trace")
        for name, args, kwargs in calls:
            got = getattr(store, name)(*args, **kwargs)
            expected = on_store_loop(store, getattr(store.store, name)(*args, **kwargs))
            assert got == expected, (name, args, kwargs)
            assert type(got) is type(expected)
        # Each argument reaches the store: the pages above differ from the defaults'.
        assert len(store.list_messages("t1", limit=3, before_seq=9)) == 3
        assert store.list_events("t1", "r1", task_id="task-1", event_types=["run.start"]) == []
        newest, *rest = store.list_threads()
        assert store.list_threads(before=newest) == rest != []
        newest_run, *older_runs = store.list_run_summaries()
        assert store.list_run_summaries(before=newest_run) == older_runs != []


def test_writes_and_deletes_through_the_facade_return_what_the_store_does(backend: Backend):
    with SyncStore(backend.make()) as store:
        first = store.put(thread_id="t1", run_id="r1", event_type="run.start", category="trace")
        assert first["seq"] == 1 and first["run_id"] == "r1"
        batch = store.put_batch([event("r1", 1), event("r2", 2)])
        assert [e["seq"] for e in batch] == [2, 3]
        again, created = store.put_if_absent(
            thread_id="t1", run_id="r1", event_type="run.start", category="trace"
        )
        assert (again, created) == (first, False)
        written = store.put_run_summary(summary("r1"))
        assert store.get_run_summary("t1", "r1") == written
        assert store.delete_by_run("t1", "r1") == 2
        assert store.list_run_summaries("t1") == []
        assert store.delete_by_thread("t1") == 1
        assert store.count_messages("t1") == 0
        with pytest.raises(ValueError, match="thread_id"):
            store.put(thread_id="", run_id="r1", event_type="run.start", category="trace")


def test_with_sets_the_store_up_and_closes_it_and_closing_again_does_nothing(backend: Backend):
    with open_sync_store(backend.url()) as store:
        assert store.store._is_setup
        store.put(thread_id="t1", run_id="r1", event_type="run.start", category="trace")
        assert not store.closed
    assert store.closed
    assert not store._loop.thread.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        store.count_messages("t1")
    with pytest.raises(RuntimeError, match="closed"):  # the async store is closed too
        asyncio.run(store.store.count_messages("t1"))
    store.close()


def test_a_facade_whose_setup_fails_in_with_is_closed(tmp_path: Path):
    facade = open_sync_store(f"sqlite:///{tmp_path / 'missing.db'}", read_only=True)
    with pytest.raises(FileNotFoundError), facade:
        pass
    assert facade.closed
    assert not facade._loop.thread.is_alive()


def test_read_only_facade_refuses_writes(persistent_backend: Backend):
    with open_sync_store(persistent_backend.url()) as writer:
        writer.put(thread_id="t1", run_id="r1", event_type="run.start", category="trace")
    with open_sync_store(persistent_backend.url(), read_only=True) as reader:
        assert reader.read_only
        assert [e["event_type"] for e in reader.list_events("t1", "r1")] == ["run.start"]
        with pytest.raises(PermissionError):
            reader.delete_by_thread("t1")


def test_user_scope_applies_to_calls_through_the_facade():
    with SyncStore(MemoryRunEventStore()) as store:
        with user_scope("alice"):
            store.put(thread_id="t1", run_id="r1", event_type="run.start", category="trace")
        store.put(thread_id="t1", run_id="r1", event_type="run.end", category="trace")
        with user_scope("alice"):
            assert [e["event_type"] for e in store.list_events("t1", "r1")] == ["run.start"]
        assert [e["user_id"] for e in store.list_events("t1", "r1")] == ["alice", None]


def test_a_call_on_the_facades_own_loop_raises_instead_of_waiting_forever():
    with SyncStore("memory://") as store:

        async def from_the_loop(call: Callable[[], object]) -> None:
            call()

        for call in (lambda: store.count_messages("t1"), store.setup, store.close):
            with pytest.raises(RuntimeError, match="own event loop"):
                on_store_loop(store, from_the_loop(call))
        assert not store.closed
        assert store.count_messages("t1") == 0


def test_a_store_already_set_up_or_no_store_at_all_is_refused():
    store = MemoryRunEventStore()
    asyncio.run(store.setup())
    with pytest.raises(ValueError, match="not set up"):
        SyncStore(store)
    asyncio.run(store.close())
    with SyncStore(store) as reopened:  # a closed store is set up again on the facade's loop
        assert reopened.count_messages("t1") == 0
    with pytest.raises(TypeError, match="RunEventStore or a store URL"):
        SyncStore(object())  # type: ignore[arg-type]


def test_a_journal_under_plain_invoke_writes_on_the_facades_loop():
    recording = LoopRecordingStore()
    with SyncStore(recording) as store:
        journal = RunJournal(event_store=store, flush_threshold=1)
        assert journal.event_store is recording
        agent_graph(scripted(ai("3"))).invoke(QUESTION, {"callbacks": [journal]})
        assert journal.run_id is not None and journal.thread_id is not None
        events = store.list_events(journal.thread_id, journal.run_id)
        assert [e["event_type"] for e in events] == ANSWER_SEQUENCE
        assert set(recording.loops) == {store._loop.loop}


def test_a_journal_sets_up_the_facade_it_is_given():
    store = SyncStore("memory://")
    try:
        RunJournal(event_store=store)
        assert store.store._is_setup  # on the facade's loop, before any run writes
        assert on_store_loop(store, store.store.count_messages("t1")) == 0
    finally:
        store.close()


# -- sync programs -------------------------------------------------------------------------------

SYNC_PROGRAM = """
    import json
    import sys

    from deerflow_journal import RunJournal, open_sync_store
    from tests.journal.agents import QUESTION, agent_graph, ai, scripted

    store = open_sync_store(sys.argv[1])
    journal = RunJournal(event_store=store)
    graph = agent_graph(scripted(ai(calls=[("add", {"a": 1, "b": 2}, "call-1")]), ai("3")))
    graph.invoke(QUESTION, {"callbacks": [journal], "configurable": {"thread_id": "t1"}})
    events = store.list_events("t1", journal.run_id)
    summary = store.get_run_summary("t1", journal.run_id)
    store.close()
    print(json.dumps({
        "run_id": journal.run_id,
        "events": [e["event_type"] for e in events],
        "status": summary.status,
        "llm_calls": summary.llm_call_count,
    }))
"""

LEFT_OPEN_PROGRAM = """
    import gc
    import sys

    from deerflow_journal import RunJournal, open_sync_store
    from tests.journal.agents import QUESTION, agent_graph, ai, scripted

    # Nothing keeps the facade: the journal holds its store, which stays open until exit.
    journal = RunJournal(event_store=open_sync_store(sys.argv[1]))
    gc.collect()
    agent_graph(scripted(ai("3"))).invoke(
        QUESTION, {"callbacks": [journal], "configurable": {"thread_id": "t1"}}
    )
    print(journal.run_id)
"""


def run_sync_program(code: str, *args: str, cwd: Path = ROOT) -> str:
    """Run ``code`` in a new interpreter with warnings shown; its stdout, after a clean exit."""
    code = textwrap.dedent(code)
    assert "asyncio" not in code
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-W", "default", "-c", code, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=240,  # a hang guard, not a time limit
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # no traceback, warning or "different loop" error at exit
    return done.stdout


@pytest.fixture(
    params=[
        pytest.param(SqliteBackend, id="sqlite"),
        pytest.param(PostgresBackend, id="postgres", marks=PostgresBackend.marks),
    ]
)
def server_or_file(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """A SQLite file or a fresh PostgreSQL schema, dropped after the test."""
    bound = request.param(tmp_path, request)
    try:
        yield bound
    finally:
        asyncio.run(bound.cleanup())


async def stored_types(backend: Backend, run_id: str) -> list[str]:
    async with backend.make(read_only=True) as store:
        return [e["event_type"] for e in await store.list_events("t1", run_id)]


@pytest.mark.slow
def test_a_sync_program_journals_a_graph_and_reads_it_back_through_the_facade(
    server_or_file: Backend,
):
    out = json.loads(run_sync_program(SYNC_PROGRAM, server_or_file.url()))
    sequence = [
        "run.start",
        "llm.human.input",
        "llm.ai.response",
        "llm.tool.result",
        "llm.ai.response",
        "run.end",
    ]
    assert out["events"] == sequence
    assert (out["status"], out["llm_calls"]) == ("success", 2)
    assert asyncio.run(stored_types(server_or_file, out["run_id"])) == sequence


@pytest.mark.slow
def test_a_facade_left_open_is_closed_at_exit_with_its_journal_s_run_stored(
    server_or_file: Backend,
):
    run_id = run_sync_program(LEFT_OPEN_PROGRAM, server_or_file.url()).strip()
    if isinstance(server_or_file, SqliteBackend):  # closed: the last connection removes the WAL
        assert not (server_or_file.tmp_path / "journal.db-wal").exists()
    assert asyncio.run(stored_types(server_or_file, run_id)) == ANSWER_SEQUENCE


@pytest.mark.slow
def test_the_readme_s_sync_access_snippet_runs(tmp_path: Path):
    section = (ROOT / "README.md").read_text("utf-8").split("### Sync access", 1)[1]
    found = re.search(r"^```python\n(.*?)^```$", section, re.DOTALL | re.MULTILINE)
    assert found is not None
    out = run_sync_program(found.group(1), cwd=tmp_path)
    assert out.splitlines() == [str(ANSWER_SEQUENCE), "success"]
    assert (tmp_path / ".deer-flow" / "journal.db").exists()


@contextlib.contextmanager
def a_write_held_then_interrupted(
    backend: PostgresBackend, interrupts: int = 1, meanwhile: Callable[[], None] = lambda: None
) -> Iterator[None]:
    """While the body writes to ``run_events``, hold the table's lock from another session;
    once the write waits for it, call ``meanwhile`` in another thread, press Ctrl-C
    ``interrupts`` times, and release the lock half a second later."""
    import psycopg

    with psycopg.connect(backend.dsn) as holder, psycopg.connect(backend.dsn) as watcher:
        holder.execute("LOCK TABLE run_events IN EXCLUSIVE MODE")

        def interrupt_then_release() -> None:
            waiting = (
                "SELECT count(*) FROM pg_locks WHERE NOT granted "
                "AND relation = 'run_events'::regclass"
            )
            while watcher.execute(waiting).fetchone() == (0,):  # the write is blocked
                time.sleep(0.01)
            threading.Thread(target=meanwhile, daemon=True).start()
            for _ in range(interrupts):
                time.sleep(0.2)
                os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)  # a call that did not wait for the write has raised by now
            holder.rollback()

        helper = threading.Thread(target=interrupt_then_release)
        helper.start()
        try:
            yield
        finally:
            helper.join()


@pytest.fixture
def postgres(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[PostgresBackend]:
    """A fresh PostgreSQL schema, dropped after the test."""
    backend = PostgresBackend(tmp_path, request)
    try:
        yield backend
    finally:
        asyncio.run(backend.cleanup())


def stored_seqs(backend: Backend, run_id: str) -> list[int]:
    with SyncStore(backend.make(read_only=True)) as store:
        return [e["seq"] for e in store.list_events("t1", run_id)]


@pytest.mark.postgres
def test_a_write_interrupted_by_ctrl_c_has_ended_when_the_call_raises(postgres: PostgresBackend):
    """Ctrl-C while a write waits for a lock: the call raises only once the write has ended,
    so what the caller does next (an import deleting the runs it began) cannot overlap it."""
    with SyncStore(postgres.make()) as store:
        store.put(thread_id="t1", run_id="r0", event_type="run.start", category="trace")
        with a_write_held_then_interrupted(postgres), pytest.raises(KeyboardInterrupt):
            store.put_batch([event("r1", 1), event("r1", 2)])
        written = [e["seq"] for e in store.list_events("t1", "r1")]
        assert written == [2, 3]  # the write went on to its end under the Ctrl-C
        assert store.delete_by_run("t1", "r1") == 2
        assert store.list_events("t1", "r1") == []


@pytest.mark.postgres
def test_close_meanwhile_returns_once_the_interrupted_write_has_ended(postgres: PostgresBackend):
    store = SyncStore(postgres.make())
    store.put(thread_id="t1", run_id="r0", event_type="run.start", category="trace")
    closed = threading.Event()

    def close() -> None:
        store.close()  # waits for the write under way
        closed.set()

    with a_write_held_then_interrupted(postgres, meanwhile=close), pytest.raises(KeyboardInterrupt):
        store.put_batch([event("r1", 1), event("r1", 2)])
    assert closed.wait(60), "close() never returned"  # a hang guard, not a time limit
    assert stored_seqs(postgres, "r1") == [2, 3]


def test_after_a_second_ctrl_c_close_still_waits_for_the_call():
    """A second Ctrl-C stops waiting for a write, not the write: closing the store waits for
    it rather than cutting it off. (A stand-in write: the stores' own close waits for their
    writes anyway; a store of another kind need not.)"""
    store = SyncStore(MemoryRunEventStore())
    begun, steps = threading.Event(), []

    async def write() -> None:
        begun.set()
        await asyncio.sleep(1.0)
        steps.append("written")

    def interrupt_twice() -> None:
        begun.wait()
        for _ in range(2):
            time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGINT)

    helper = threading.Thread(target=interrupt_twice)
    helper.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            store._loop.call("put", lambda: _shielded(write()))
    finally:
        helper.join()
    assert steps == []  # the caller stopped waiting
    store.close()
    assert steps == ["written"]


def test_a_call_that_ends_the_loop_fails_every_waiting_call_instead_of_hanging():
    """KeyboardInterrupt or SystemExit raised in a call escapes asyncio's loop and ends its
    thread: the callers waiting are told, and the facade counts as closed."""
    store = SyncStore(MemoryRunEventStore())
    store.put(thread_id="t1", run_id="r1", event_type="run.start", category="trace")

    async def exits() -> None:
        raise SystemExit(3)

    failures: list[BaseException] = []

    def call() -> None:
        try:
            store._loop.call("put", exits)
        except BaseException as exc:
            failures.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    caller.join(60)  # a hang guard, not a time limit
    assert not caller.is_alive(), "the call never returned"
    assert [type(f) for f in failures] == [RuntimeError]
    assert "the SyncStore's event loop ended" in str(failures[0])
    assert store.closed
    with pytest.raises(RuntimeError, match="closed"):
        store.count_messages("t1")
    store.close()  # nothing left to close: returns
