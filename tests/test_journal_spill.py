"""A journal whose store is down keeps at most ``max_buffered_events`` in memory and spills the
rest, in order, to a temporary file: once the store answers, every event is written once and in
order, and the file is removed; a process that ends with events spilled says where they are.

These tests sit outside ``tests/journal/`` on purpose: the contract check that fixture runs on
every written record would dominate a test that writes half a million of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import tracemalloc
from pathlib import Path
from typing import Any

import orjson
import pytest
from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableLambda

from deerflow_journal import RunJournal, RunSummary, SqliteRunEventStore
from deerflow_journal.journal import spill as spill_module
from deerflow_journal.journal.spill import SPILL_PREFIX, SpillFile, report_leftover_spills
from tests.journal.agents import QUESTION, agent_graph, ai, scripted

ROOT = Path(__file__).resolve().parent.parent
HANG_GUARD = 120  # seconds: a guard against a hang, not a time limit
UUID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class OutageStore(SqliteRunEventStore):
    """A real SQLite store whose journal writes fail with ``ConnectionError`` while ``down``
    is set, as a database server's would while it is unreachable."""

    down = False
    refused = 0
    #: Writes taken before the store goes down again (None: it stays up).
    up_for: int | None = None

    async def _put_journal_batch(self, *args: Any, **kwargs: Any) -> bool:
        if not self.down and self.up_for is not None:
            self.down = self.up_for == 0
            self.up_for -= 1
        if self.down:
            self.refused += 1
            raise ConnectionError("store unreachable")
        return await super()._put_journal_batch(*args, **kwargs)


def spill_dirs(journal: RunJournal) -> list[Path]:
    """The spill directory of the journal's buffer, if it has one now."""
    path = journal._writer.buffer._spill.path
    return [] if path is None else [path.parent]


async def record(journal: RunJournal, first: int, last: int) -> None:
    """Record middleware events ``first``..``last - 1``, letting the loop run writes between."""
    for i in range(first, last):
        journal.record_middleware("guardrail", name=str(i), hook="h", action="allow", changes={})
        if i % 200 == 0:
            await asyncio.sleep(0)


@pytest.mark.slow
async def test_a_store_down_for_500000_events_gets_each_once_in_order_with_memory_bounded(
    tmp_path: Path,
):
    total, bound = 500_000, 100_000  # the default bound
    store = OutageStore(tmp_path / "journal.db")
    await store.setup()
    journal = RunJournal(run_id="r", thread_id="t", event_store=store)
    assert journal._writer.buffer.max_buffered == bound
    store.down = True
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        await record(journal, 0, bound)
        full = tracemalloc.get_traced_memory()[0] - before  # memory holding the bound
        assert not spill_dirs(journal)
        await record(journal, bound, total)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    (spill,) = spill_dirs(journal)
    assert store.refused > 100  # the store was tried, and failed, all along
    # Memory stays near what the bound takes: the other 400,000 events are in the file.
    assert peak < 1.5 * full, (peak, full)
    buffer = journal._writer.buffer
    assert buffer._memory_locked() <= bound
    assert buffer._spill.count >= total - bound - 200

    store.down = False
    await journal.flush()
    assert not spill.exists()  # removed once drained
    assert not spill_dirs(journal)
    events = await store.list_events("t", "r", limit=total + 1)
    assert [e["content"]["name"] for e in events] == [str(i) for i in range(total)]
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == total
    await store.close()


async def test_spilled_events_read_back_as_events_never_spilled(tmp_path: Path):
    async def journal_a_run(store: SqliteRunEventStore, thread: str, bound: int) -> list[Any]:
        journal = RunJournal(event_store=store, max_buffered_events=bound)
        graph = agent_graph(
            scripted(ai("", calls=[("add", {"a": 1, "b": 2}, "c1")]), ai("It is 3.")),
        )
        await graph.ainvoke(
            QUESTION, {"callbacks": [journal], "configurable": {"thread_id": thread}}
        )
        if isinstance(store, OutageStore):
            assert spill_dirs(journal)
            store.down = False
        await journal.flush()
        assert not spill_dirs(journal)
        assert journal.run_id is not None
        summary = await store.get_run_summary(thread, journal.run_id)
        assert summary is not None and summary.status == "success"
        return await store.list_events(thread, journal.run_id)

    async with SqliteRunEventStore(tmp_path / "healthy.db") as healthy:
        expected = await journal_a_run(healthy, "t", 1_000)
    async with OutageStore(tmp_path / "outage.db") as outage:
        outage.down = True
        spilled = await journal_a_run(outage, "t", 2)  # all but two go to the file

    def comparable(event: dict[str, Any]) -> tuple[Any, ...]:
        """The event less what differs between two runs (ids made afresh, latencies)."""
        metadata = {k: v for k, v in event["metadata"].items() if k != "latency_ms"}
        content = event["content"]
        if event["event_type"] == "llm.tool.result":
            # LangGraph gives the tool's message its id after the tool callback, in place: a
            # spilled event is encoded before that, as one written at once would be.
            content = {k: v for k, v in content.items() if k != "id"}
        text = orjson.dumps([event["event_type"], event["category"], content, metadata])
        return UUID.sub(b"<id>", text), event["user_id"]

    assert len(spilled) == len(expected) == 6
    assert [comparable(e) for e in spilled] == [comparable(e) for e in expected]


async def test_events_recorded_while_the_backlog_drains_keep_their_place(tmp_path: Path):
    async with OutageStore(tmp_path / "journal.db") as store:
        journal = RunJournal(run_id="r", thread_id="t", event_store=store, max_buffered_events=10)
        store.down = True
        await record(journal, 0, 300)
        assert journal._writer.buffer._spill.count > 250
        store.down = False
        for first in range(300, 400, 5):  # a few at a time while the backlog goes out
            await record(journal, first, first + 5)
            await asyncio.sleep(0.001)
            assert journal._writer.buffer._memory_locked() <= 10
        await journal.flush()
        assert not spill_dirs(journal)
        events = await store.list_events("t", "r", limit=1000)
    assert [e["content"]["name"] for e in events] == [str(i) for i in range(400)]


def test_a_spill_file_gives_events_back_first_in_first_out_then_goes(tmp_path: Path):
    spill = SpillFile()
    message = AIMessage("hello", id="m1")
    spill.append({"n": 0, "content": message})
    spill.append({"n": 1})
    path = spill.path
    assert path is not None and path.is_file()
    assert spill.read(1) == [{"n": 0, "content": message.model_dump()}]
    spill.append({"n": 2})
    assert spill.read(10) == [{"n": 1}, {"n": 2}]
    assert spill.count == 0 and spill.path is None and not path.parent.exists()
    assert spill.read(10) == []


def test_a_spill_file_cut_short_says_its_events_are_lost(tmp_path: Path, caplog):
    spill = SpillFile()
    for n in range(3):
        spill.append({"n": n})
    path = spill.path
    assert path is not None
    spill.read(0)  # flushes what is written so far
    path.write_bytes(path.read_bytes()[:-3])  # the last line cut short
    with caplog.at_level(logging.ERROR):
        assert spill.read(10) == []
    assert f"cannot read back the 3 events it spilled to {path}" in caplog.text
    assert spill.count == 0 and path.is_file()  # kept for whoever wants to look
    shutil.rmtree(path.parent)


def run_script(body: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``body`` in a fresh interpreter whose temporary directory is ``tmp_path``."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    return subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)},
        cwd=ROOT,
        timeout=HANG_GUARD,
    )


SPILLING_PROCESS = """
    import asyncio, os, signal, sys
    from tests.test_journal_spill import OutageStore, record
    from deerflow_journal import RunJournal

    async def main():
        store = OutageStore(sys.argv[1])
        await store.setup()
        store.down = True
        journal = RunJournal(run_id="r", thread_id="t", event_store=store, max_buffered_events=10)
        await record(journal, 0, 50)
        print(journal._writer.buffer._spill.path, flush=True)
        if sys.argv[2].startswith("drain"):
            # The store takes three writes (0..9 from memory in two, then 10..19 from the
            # file), then is down again with 20..29 taken back from the file.
            store.down, store.up_for = False, 3
            try:
                await journal.flush()
            except ConnectionError:
                pass
        if sys.argv[2].endswith("kill"):
            os.kill(os.getpid(), signal.SIGKILL)

    asyncio.run(main())
"""


async def test_a_process_that_exits_with_events_spilled_says_where_they_are(tmp_path: Path):
    done = run_script(SPILLING_PROCESS, tmp_path, str(tmp_path / "journal.db"), "exit")
    assert done.returncode == 0, done.stderr
    path = Path(done.stdout.strip())
    assert path.parent.name.startswith(SPILL_PREFIX) and path.parent.parent == tmp_path
    (said,) = [line for line in done.stderr.splitlines() if "journal exits with" in line]
    lines = path.read_text().splitlines()
    assert (
        f"50 events its store did not take, kept in {path} (one event a line, "
        "as `store.put_batch` takes them)"
    ) in said
    # Each line is an event as put_batch takes it, those held in memory (the bound, 10) first:
    # the user can write them all.
    async with SqliteRunEventStore(tmp_path / "recovered.db") as store:
        await store.put_batch([orjson.loads(line) for line in lines])
        events = await store.list_events("t", "r")
    assert [e["content"]["name"] for e in events] == [str(i) for i in range(50)]


async def test_a_spill_file_left_by_a_killed_process_is_reported(tmp_path: Path, caplog):
    done = run_script(SPILLING_PROCESS, tmp_path, str(tmp_path / "journal.db"), "kill")
    assert done.returncode != 0 and "journal exits with" not in done.stderr
    path = Path(done.stdout.strip())
    assert path.is_file()
    with caplog.at_level(logging.ERROR):
        found = report_leftover_spills(str(tmp_path), again=True)
    assert found == [path]
    (said,) = [r for r in caplog.records if str(path) in r.getMessage()]
    assert said.levelno == logging.ERROR and "never wrote" in said.getMessage()


async def test_a_left_spill_file_is_reported_though_its_process_id_is_in_use_again(
    tmp_path: Path, caplog
):
    # A container's main process has the same id after every restart: the id of the process
    # that left the file is then this process's own.
    done = run_script(SPILLING_PROCESS, tmp_path, str(tmp_path / "journal.db"), "kill")
    assert done.returncode != 0
    path = Path(done.stdout.strip())
    reused = tmp_path / f"{SPILL_PREFIX}{os.getpid()}-left"
    os.rename(path.parent, reused)
    with caplog.at_level(logging.ERROR):
        found = report_leftover_spills(str(tmp_path), again=True)
    assert found == [reused / path.name]
    assert f"events a process (pid {os.getpid()}) spilled and never wrote" in caplog.text


def test_a_spill_file_still_in_use_is_not_reported_whatever_its_process_id(tmp_path: Path):
    spill = SpillFile()
    spill.append({"n": 1})
    assert spill.path is not None
    moved = tmp_path / f"{SPILL_PREFIX}{dead_pid()}-x"  # named after a process that ended
    os.rename(spill.path.parent, moved)
    try:
        assert report_leftover_spills(str(tmp_path), again=True) == []
        spill._close_handles()  # as its process ending would
        assert report_leftover_spills(str(tmp_path), again=True) == [moved / "events.jsonl"]
    finally:
        shutil.rmtree(moved)


async def recovered(db: Path, lines: list[str]) -> list[str]:
    """The names of the events a journal stored in ``db`` once ``lines`` are written too."""
    async with SqliteRunEventStore(db) as store:
        await store.put_batch([orjson.loads(line) for line in lines])
        return [e["content"]["name"] for e in await store.list_events("t", "r", limit=100)]


async def test_a_process_that_exits_mid_drain_saves_only_the_events_not_written(tmp_path: Path):
    db = tmp_path / "journal.db"
    done = run_script(SPILLING_PROCESS, tmp_path, str(db), "drain")
    assert done.returncode == 0, done.stderr
    path = Path(done.stdout.strip())
    (said,) = [line for line in done.stderr.splitlines() if "journal exits with" in line]
    assert f"30 events its store did not take, kept in {path}" in said
    # Written as told, the file completes the journal: each event once, in order.
    assert await recovered(db, path.read_text().splitlines()) == [str(i) for i in range(50)]


async def test_a_file_left_by_a_process_killed_mid_drain_holds_only_what_it_never_took_back(
    tmp_path: Path, caplog
):
    db = tmp_path / "journal.db"
    done = run_script(SPILLING_PROCESS, tmp_path, str(db), "drain-kill")
    assert done.returncode != 0 and "journal exits with" not in done.stderr
    path = Path(done.stdout.strip())
    with caplog.at_level(logging.ERROR):
        assert report_leftover_spills(str(tmp_path), again=True) == [path]
    assert "found 20 events a process (pid" in caplog.text
    # 20..29 were taken back into memory and died with the process; the file keeps 30..49.
    names = await recovered(db, path.read_text().splitlines())
    assert names == [str(i) for i in range(20)] + [str(i) for i in range(30, 50)]


def test_a_journal_dropped_while_its_store_is_down_still_writes_its_events(tmp_path: Path, caplog):
    # A journal per request, as a server makes them: dropped while its write failed, its
    # events are written when the loop closes (before, they were lost without a word).
    store = OutageStore(tmp_path / "journal.db")

    async def request() -> str | None:
        journal = RunJournal(event_store=store)
        graph = agent_graph(scripted(ai("ok")))
        await graph.ainvoke(QUESTION, {"callbacks": [journal], "configurable": {"thread_id": "t"}})
        await asyncio.sleep(0.05)  # its background write fails
        return journal.run_id

    async def serve() -> str | None:
        await store.setup()
        store.down = True
        run = await request()
        assert store.refused
        gc.collect()  # the journal is gone
        store.down = False  # the store answers again; then the loop closes
        return run

    # Warnings unlogged: a captured record of the failed write would keep the journal alive.
    with caplog.at_level(logging.ERROR):
        run = asyncio.run(serve())

    async def read() -> list[str]:
        assert run is not None
        try:
            return [e["event_type"] for e in await store.list_events("t", run)]
        finally:
            await store.close()

    assert asyncio.run(read()) == ["run.start", "llm.human.input", "llm.ai.response", "run.end"]


class FlappingStore(OutageStore):
    """Fails the journal writes whose numbers are in ``fail``; notes each run whose success
    summary it stored while the run's ``run.end`` was not."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fail: set[int] = set()  # numbers of the writes to fail
        self.early: list[str] = []
        self.calls = 0

    async def _put_journal_batch(
        self, events: Any, summaries: Any, *args: Any, **kwargs: Any
    ) -> bool:
        self.calls += 1
        if self.calls in self.fail:
            raise ConnectionError("store unreachable")
        written = await super()._put_journal_batch(events, summaries, *args, **kwargs)
        for summary in summaries:
            if summary["status"] == "success":
                stored = await self.list_events(
                    summary["thread_id"], summary["run_id"], limit=10_000
                )
                if "run.end" not in [e["event_type"] for e in stored]:
                    self.early.append(summary["run_id"])
        return written


async def test_a_runs_success_summary_is_never_stored_before_its_run_end(tmp_path: Path):
    async with FlappingStore(tmp_path / "journal.db") as store:
        journal = RunJournal(event_store=store)

        def step(_: Any) -> str:
            for i in range(50):
                journal.record_middleware("guard", name=str(i), hook="h", action="a", changes={})
            return "done"

        store.down = True
        await RunnableLambda(step).ainvoke("x", {"callbacks": [journal]})
        await asyncio.sleep(0.05)  # the first batch fails
        store.down, store.fail = False, {store.calls + 2}
        # The failed batch is retried first; the write after it (run.end among its events)
        # fails once more: the store flaps.
        with pytest.raises(ConnectionError):
            await journal.flush()
        await journal.flush()
        assert journal.thread_id is not None and journal.run_id is not None
        summary = await store.get_run_summary(journal.thread_id, journal.run_id)
        events = await store.list_events(journal.thread_id, journal.run_id, limit=100)
    assert not store.early
    assert summary is not None and summary.status == "success"
    assert len(events) == 52 and events[-1]["event_type"] == "run.end"


def dead_pid() -> int:
    """The id of a process that has ended."""
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(done.stdout)


def left_spill(tmp_path: Path, total: int, read: int) -> Path:
    """A spill directory as a process killed after reading ``read`` of ``total`` events back
    leaves it."""
    spill = SpillFile()
    for n in range(total):
        spill.append({"n": n})
    assert len(spill.read(read)) == read
    assert spill.path is not None
    own = spill.path.parent
    spill._close_handles()
    left = tmp_path / f"{SPILL_PREFIX}{dead_pid()}-x"
    os.rename(own, left)
    return left


def kept(left: Path) -> list[int]:
    return [orjson.loads(line)["n"] for line in (left / "events.jsonl").read_text().splitlines()]


def test_two_processes_reporting_one_left_spill_file_cut_it_once(tmp_path: Path, monkeypatch):
    # Two workers of one server start together, and each reports the dead process's file.
    left = left_spill(tmp_path, total=10, read=4)
    replace, interleaved = os.replace, []

    def replace_then_report(src: Any, dst: Any) -> None:
        replace(src, dst)
        if not interleaved:
            interleaved.append(True)
            spill_module._unread_only(left / "events.jsonl")  # the other worker's report

    monkeypatch.setattr(spill_module.os, "replace", replace_then_report)
    report_leftover_spills(str(tmp_path), again=True)
    assert kept(left) == [4, 5, 6, 7, 8, 9]


def test_a_reporter_killed_after_cutting_a_left_file_leaves_it_cut_once(tmp_path, monkeypatch):
    left = left_spill(tmp_path, total=10, read=4)
    replace = os.replace

    def replace_then_die(src: Any, dst: Any) -> None:
        replace(src, dst)
        raise KeyboardInterrupt

    monkeypatch.setattr(spill_module.os, "replace", replace_then_die)
    with pytest.raises(KeyboardInterrupt):
        report_leftover_spills(str(tmp_path), again=True)
    monkeypatch.setattr(spill_module.os, "replace", replace)
    report_leftover_spills(str(tmp_path), again=True)  # the next process
    assert kept(left) == [4, 5, 6, 7, 8, 9]


def test_a_process_killed_while_saving_at_exit_loses_nothing(tmp_path: Path, monkeypatch):
    spill = SpillFile()
    for n in range(4, 10):
        spill.append({"n": n})
    assert len(spill.read(2)) == 2  # 4, 5 back in memory, the offset noted
    assert spill.path is not None
    own, replace = spill.path.parent, os.replace

    def replace_then_die(src: Any, dst: Any) -> None:
        replace(src, dst)
        raise KeyboardInterrupt

    monkeypatch.setattr(spill_module.os, "replace", replace_then_die)
    with pytest.raises(KeyboardInterrupt):
        spill.save([{"n": n} for n in range(6)])  # memory first: 0..5
    monkeypatch.setattr(spill_module.os, "replace", replace)
    spill._close_handles()
    left = tmp_path / f"{SPILL_PREFIX}{dead_pid()}-x"
    os.rename(own, left)
    report_leftover_spills(str(tmp_path), again=True)
    assert kept(left) == list(range(10))


async def stranded(tmp_path: Path, store: OutageStore, bad: bool = False) -> RunJournal:
    """A journal whose writes failed on ``store``, holding events 0..9 (and one that cannot
    be encoded, with ``bad``)."""
    journal = RunJournal(run_id="r", thread_id="t", event_store=store, flush_threshold=5)
    store.down = True
    for i in range(10):
        journal.record_middleware("guard", name=str(i), hook="h", action="a", changes={})
    if bad:  # two keys that encode alike: no store can take it
        journal.record_middleware("guard", name="x", hook="h", action="a", changes={1: 1, "1": 2})
    await asyncio.sleep(0.05)  # the background writes fail
    return journal


def saved_file(caplog: pytest.LogCaptureFixture) -> tuple[Path, str]:
    (said,) = [r.getMessage() for r in caplog.records if "journal exits with" in r.getMessage()]
    return Path(said.split(" kept in ")[1].split(" (one event")[0]), said


async def test_events_saved_at_exit_are_not_written_again_by_a_later_write(tmp_path, caplog):
    async with OutageStore(tmp_path / "journal.db") as store:
        journal = await stranded(tmp_path, store)
        with caplog.at_level(logging.ERROR):
            journal._writer.buffer.save_at_exit()
        path, _ = saved_file(caplog)
        store.down = False
        await journal.flush()  # what a daemon loop still running could do
    names = await recovered(tmp_path / "journal.db", path.read_text().splitlines())
    assert names == [str(i) for i in range(10)]


async def test_an_event_that_cannot_be_encoded_is_the_only_one_lost_at_exit(tmp_path, caplog):
    async with OutageStore(tmp_path / "journal.db") as store:
        journal = await stranded(tmp_path, store, bad=True)
        with caplog.at_level(logging.ERROR):
            journal._writer.buffer.save_at_exit()
    path, said = saved_file(caplog)
    assert "10 events its store did not take" in said and "1 could not be encoded" in said
    names = await recovered(tmp_path / "journal.db", path.read_text().splitlines())
    assert names == [str(i) for i in range(10)]


async def test_events_none_of_which_can_be_encoded_are_said_lost_at_exit(tmp_path, caplog):
    async with OutageStore(tmp_path / "journal.db") as store:
        journal = RunJournal(run_id="r", thread_id="t", event_store=store)
        store.down = True
        journal.record_middleware("guard", name="x", hook="h", action="a", changes={1: 1, "1": 2})
        with caplog.at_level(logging.ERROR):
            journal._writer.buffer.save_at_exit()
    (said,) = [r.getMessage() for r in caplog.records if "journal exits with" in r.getMessage()]
    assert "1 events its store did not take, lost: none could be encoded" in said


@pytest.fixture
def no_temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No spill directory can be made: the temporary directory is a file."""
    (tmp_path / "not-a-directory").write_text("")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "not-a-directory"))


@pytest.mark.usefixtures("no_temp_dir")
async def test_events_that_cannot_be_spilled_are_dropped_saying_why(tmp_path, caplog):
    # Past the bound, events are lost, and the log says it is no fault of theirs or of the
    # store.
    async with OutageStore(tmp_path / "journal.db") as store:
        journal = RunJournal(run_id="r", thread_id="t", event_store=store, max_buffered_events=10)
        store.down = True
        with caplog.at_level(logging.ERROR):
            await record(journal, 0, 15)
            store.down = False
            await journal.flush()
        names = [e["content"]["name"] for e in await store.list_events("t", "r", limit=100)]
    assert names == [str(i) for i in range(10)] and journal.dropped_events == 5
    said = [r.getMessage() for r in caplog.records if "journal dropped" in r.getMessage()]
    assert len(said) == 5
    assert all("could not be spilled to a file" in line for line in said), said
    assert not any("store can never store" in line for line in said)


# -- run summaries past their bound -----------------------------------------------------------


def summary_spill(journal: RunJournal) -> SpillFile:
    return journal._writer.buffer._summary_spill


async def test_run_summaries_past_their_bound_leave_memory_and_all_reach_the_store(tmp_path):
    # A reused journal holds one summary per run while its store is down: past a hundredth of
    # max_buffered_events they go to a file, and each run's summary is stored once it is back.
    graph = RunnableLambda(lambda x: x)
    async with OutageStore(tmp_path / "journal.db") as store:
        journal = RunJournal(thread_id="t", event_store=store, max_buffered_events=100)
        bound = journal._writer.buffer.max_summaries
        store.down = True
        held, spilled = [], None
        for i in range(60):
            await graph.ainvoke(i, {"callbacks": [journal]})
            await asyncio.sleep(0.005)  # the run's write, which fails
            # Those in memory, and those read back from the file for a write to try.
            buffer = journal._writer.buffer
            held.append(len(buffer._summaries) + len(buffer._summary_chunk))
            spilled = spilled or summary_spill(journal).path
        assert bound == 10 and max(held) <= 2 * bound and spilled is not None
        assert spilled.is_file() and len(spilled.read_text().splitlines()) >= 60 - 2 * bound
        store.down = False
        await journal.flush()
        summaries = await store.list_run_summaries("t")
        runs = [await store.list_events("t", s.run_id) for s in summaries]
    assert len({s.run_id for s in summaries}) == 60
    assert all(s.status == "success" for s in summaries)
    # Every run's start and end, once each, the runs one after another.
    assert all([e["event_type"] for e in events] == ["run.start", "run.end"] for events in runs)
    seqs = [e["seq"] for events in runs for e in events]
    assert seqs == list(range(1, 121))
    assert summary_spill(journal).path is None and not spilled.parent.exists()


async def test_a_runs_summary_moved_out_of_memory_is_never_stored_over_a_newer_one(tmp_path):
    # Concurrent runs: their running summaries leave memory while they run; their success
    # summaries, newer, stay in memory. Written back, the newer ones must win.
    gate, started = asyncio.Event(), []

    async def held(x: int) -> int:
        started.append(x)
        await gate.wait()
        return x

    graph = RunnableLambda(held)
    async with OutageStore(tmp_path / "journal.db") as store:
        journal = RunJournal(thread_id="t", event_store=store, max_buffered_events=100)
        buffer = journal._writer.buffer
        store.down = True
        await RunnableLambda(lambda x: x).ainvoke(0, {"callbacks": [journal]})
        runs = [
            asyncio.ensure_future(graph.ainvoke(i, {"callbacks": [journal]})) for i in range(10)
        ]
        while len(started) < 10:
            await asyncio.sleep(0.001)
        with pytest.raises(ConnectionError):
            await journal.flush()  # 11 summaries, over the bound of 10: they leave memory
        assert not buffer._summaries
        gate.set()
        await asyncio.gather(*runs)
        assert summary_spill(journal).path is not None
        # Every summary moved out, those read back for the flush to try included.
        left = [orjson.loads(line) for line in summary_spill(journal).path.read_text().splitlines()]
        assert sum(summary["status"] == "running" for summary in left) == 10
        assert len(buffer._summaries) == 10  # the success summaries, newer
        store.down = False
        await journal.flush()
        summaries = await store.list_run_summaries("t")
    assert len(summaries) == 11 and {s.status for s in summaries} == {"success"}


class HangingStore(OutageStore):
    """A real SQLite store whose journal writes hang until ``answer`` is set, as a database
    server's may behind a network partition."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.answer = asyncio.Event()

    async def _put_journal_batch(self, *args: Any, **kwargs: Any) -> bool:
        await self.answer.wait()
        return await super()._put_journal_batch(*args, **kwargs)


async def test_run_summaries_stay_bounded_while_a_write_hangs(tmp_path):
    # No write starts while one is in flight: the summaries must leave memory all the same.
    graph = RunnableLambda(lambda x: x)
    async with HangingStore(tmp_path / "journal.db") as store:
        journal = RunJournal(thread_id="t", event_store=store, max_buffered_events=100)
        buffer = journal._writer.buffer
        held = []
        for i in range(60):
            await graph.ainvoke(i, {"callbacks": [journal]})
            held.append(len(buffer._summaries))
        assert buffer._write is not None and max(held) <= 2 * buffer.max_summaries + 1
        store.answer.set()
        await journal.flush()
        summaries = await store.list_run_summaries("t")
    assert len(summaries) == 60 and {s.status for s in summaries} == {"success"}


async def test_run_summaries_out_of_memory_are_kept_and_reported_at_exit(tmp_path, caplog):
    graph = RunnableLambda(lambda x: x)
    async with OutageStore(tmp_path / "journal.db") as store:
        journal = RunJournal(thread_id="t", event_store=store, max_buffered_events=100)
        store.down = True
        for i in range(15):
            await graph.ainvoke(i, {"callbacks": [journal]})
            await asyncio.sleep(0.005)
        with caplog.at_level(logging.ERROR):
            journal._writer.buffer.save_at_exit()
        (said,) = [r.getMessage() for r in caplog.records if "journal exits with" in r.getMessage()]
        kept = said.split("run summaries are kept in ")[1].split(" (one a line")[0]
        lines = Path(kept).read_text().splitlines()
        assert f"{len(lines)} run summaries are kept in {kept}" in said
        # Those moved out of memory and those still in it (built at exit): every run's.
        assert "run summaries are lost" not in said
        # As the message says: each line written, in order, with put_run_summary.
        for line in lines:
            await store.put_run_summary(RunSummary.model_validate_json(line))
        summaries = await store.list_run_summaries("t")
    assert len(summaries) == 15 and {s.status for s in summaries} == {"success"}
    caplog.clear()
    with caplog.at_level(logging.ERROR):  # and the next process reports the file
        found = report_leftover_spills(str(Path(kept).parent.parent), again=True)
    assert Path(kept) in found and "run summaries a process" in caplog.text
    shutil.rmtree(Path(kept).parent)


LOST_ANSWER_PROCESS = """
    import asyncio, sys
    from tests.test_journal_spill import OutageStore, record
    from deerflow_journal import RunJournal

    class LostAnswerStore(OutageStore):
        # It commits the first batch, then the connection drops before the answer, and the
        # store stays unreachable until the process exits.
        async def _put_journal_batch(self, *args, **kwargs):
            if not self.down:
                await super()._put_journal_batch(*args, **kwargs)
                self.down = True
            raise ConnectionError("store unreachable")

    async def main():
        store = LostAnswerStore(sys.argv[1])
        await store.setup()
        journal = RunJournal(run_id="r", thread_id="t", event_store=store)
        await record(journal, 0, 50)
        try:
            await journal.flush()
        except ConnectionError:
            pass
        print(len(await store.list_events("t", "r", limit=100)), flush=True)

    asyncio.run(main())
"""


async def test_events_saved_at_exit_that_may_be_stored_already_are_said_so(tmp_path: Path):
    db = tmp_path / "journal.db"
    done = run_script(LOST_ANSWER_PROCESS, tmp_path, str(db))
    assert done.returncode == 0, done.stderr
    stored = int(done.stdout)
    (said,) = [line for line in done.stderr.splitlines() if "journal exits with" in line]
    assert stored > 0 and f"the first {stored} were in a write that failed" in said
    path = Path(said.split(" kept in ")[1].split(" (one event")[0])
    lines = path.read_text().splitlines()
    assert await recovered(db, lines[stored:]) == [str(i) for i in range(50)]


HANGING_WRITE_PROCESS = """
    import asyncio
    from deerflow_journal import MemoryRunEventStore, RunJournal
    from deerflow_journal.journal.writer import JournalWriter
    from tests.journal.agents import QUESTION, agent_graph, ai, scripted

    class Hanging(MemoryRunEventStore):
        async def _write(self, batch):
            await asyncio.Event().wait()  # a connection attempt that never ends

    JournalWriter.wait_timeout = 0.5  # how long invoke waits for the run's write
    journal = RunJournal(event_store=Hanging())
    agent_graph(scripted(ai("ok"))).invoke(QUESTION, {"callbacks": [journal]})
    # The program exits while the write runs on the journal's own loop.
"""


def test_events_a_write_still_running_at_exit_took_are_saved(tmp_path: Path):
    done = run_script(HANGING_WRITE_PROCESS, tmp_path)
    assert done.returncode == 0, done.stderr
    (said,) = [line for line in done.stderr.splitlines() if "journal exits with" in line]
    assert "journal exits with 4 events its store did not take, kept in " in said
    assert "1 run summaries are kept in " in said
    assert "the first 4 were in a write that failed or did not end" in said
    path = Path(said.split(" kept in ")[1].split(" (one event")[0])
    saved = [orjson.loads(line)["event_type"] for line in path.read_text().splitlines()]
    assert saved == ["run.start", "llm.human.input", "llm.ai.response", "run.end"]


class GatedStore(FlappingStore):
    """Its write number ``hold`` waits inside the store until ``gate`` is set."""

    hold: int | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.held, self.gate = asyncio.Event(), asyncio.Event()

    async def _put_journal_batch(self, *args: Any, **kwargs: Any) -> bool:
        if self.hold is not None and self.calls + 1 == self.hold and not self.down:
            self.held.set()
            await self.gate.wait()
        return await super()._put_journal_batch(*args, **kwargs)


async def test_a_write_running_when_the_exit_saved_its_queue_sends_no_more_of_it(tmp_path: Path):
    async with GatedStore(tmp_path / "journal.db") as store:
        journal = RunJournal(run_id="r", thread_id="t", event_store=store, flush_threshold=5000)
        store.down = True
        await record(journal, 0, 10)
        with pytest.raises(ConnectionError):
            await journal.flush()  # these ten wait to be retried first, as one batch
        store.down = False
        await record(journal, 10, 20)  # the next write's second batch
        store.hold = store.calls + 1
        flushing = asyncio.create_task(journal.flush())
        await store.held.wait()  # the retry waits inside the store: the write is running
        buffer = journal._writer.buffer
        assert buffer._sending is not None
        sending = [event["content"]["name"] for event in buffer._sending.events]
        buffer.save_at_exit()  # the program exits: all twenty are saved
        store.gate.set()
        await flushing
        stored = [e["content"]["name"] for e in await store.list_events("t", "r", limit=100)]
    # The batch in the store's hands when the exit saved may be stored too (said so); the
    # one after it is not sent, or it would be in the store and in the file for certain.
    assert stored == sending and len(sending) < 20


@pytest.mark.parametrize("outage", [True, False], ids=["a-retry", "a-long-batch"])
async def test_a_run_ending_while_a_write_is_in_flight_is_not_summed_up_ahead_of_it(
    tmp_path: Path, outage: bool
):
    # The write in flight is a retry after an outage, or the first 1,000 events of a long
    # batch: the run ends meanwhile, and its run.end waits for the next part or write.
    async with GatedStore(tmp_path / "journal.db") as store:
        journal = RunJournal(event_store=store, flush_threshold=5000)
        midway, finish = asyncio.Event(), asyncio.Event()

        async def step(_: Any) -> str:
            for i in range(50 if outage else 1500):
                journal.record_middleware("guard", name=str(i), hook="h", action="a", changes={})
            midway.set()
            await finish.wait()
            return "done"

        run = asyncio.create_task(RunnableLambda(step).ainvoke("x", {"callbacks": [journal]}))
        await midway.wait()
        if outage:
            store.down = True
            with pytest.raises(ConnectionError):
                await journal.flush()
            store.down = False
        store.hold = store.calls + 1
        flushing = asyncio.create_task(journal.flush())
        await store.held.wait()
        finish.set()
        await run  # the run ends while the write waits inside the store
        store.gate.set()
        await flushing
        await journal.flush()
        assert journal.thread_id is not None and journal.run_id is not None
        events = await store.list_events(journal.thread_id, journal.run_id, limit=2000)
    assert events[-1]["event_type"] == "run.end"
    assert not store.early


# -- what the bounds must not break -------------------------------------------------------


class LateSummaryStore(OutageStore):
    """Notes each summary it stores after ``returned`` is set (the invoke returned); a write
    carrying summaries waits a while for ``returned`` first, so that a summary written after
    the invoke returned is seen to be."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.returned = threading.Event()
        self.late: list[str] = []

    async def _put_journal_batch(self, events: Any, summaries: Any, *args: Any, **kw: Any) -> bool:
        if summaries and not self.down:
            await asyncio.to_thread(self.returned.wait, 5)  # a hang guard either way
        written = await super()._put_journal_batch(events, summaries, *args, **kw)
        if self.returned.is_set():
            self.late.extend(summary["status"] for summary in summaries)
        return written


def test_a_plain_invoke_returns_only_once_its_summary_is_stored_after_a_spill(tmp_path):
    # The store is down while the run records past max_buffered_events, and answers again
    # before the run ends: the invoke blocks until the run is stored, summary included.
    store = LateSummaryStore(tmp_path / "journal.db")
    journal = RunJournal(event_store=store, flush_threshold=5, max_buffered_events=10)

    def step(_: Any) -> str:
        for i in range(40):
            journal.record_middleware("guard", name=str(i), hook="h", action="a", changes={})
        store.down = False  # back before the run ends
        return "done"

    store.down = True
    RunnableLambda(step).invoke("x", {"callbacks": [journal]})
    store.returned.set()
    late = list(store.late)
    journal.close()  # which must write whatever is left too

    async def stored() -> Any:
        assert journal.thread_id is not None and journal.run_id is not None
        try:
            return await store.get_run_summary(journal.thread_id, journal.run_id)
        finally:
            await store.close()

    summary = asyncio.run(stored())
    assert summary is not None and summary.status == "success"
    assert late == []  # stored before the invoke returned


@pytest.mark.usefixtures("no_temp_dir")
def test_close_writes_every_run_summary_when_they_cannot_leave_memory(tmp_path):
    # Summaries past their bound stay in memory. Once the store answers, close() must write
    # them all.
    store = OutageStore(tmp_path / "journal.db")
    journal = RunJournal(thread_id="t", event_store=store, max_buffered_events=100)
    assert journal._writer.buffer.max_summaries == 10
    store.down = True
    for i in range(12):  # each plain invoke's write fails (logged, not raised)
        RunnableLambda(lambda x: x).invoke(i, {"callbacks": [journal]})
    assert len(journal._writer.buffer._summaries) == 12
    store.down = False
    journal.close()

    async def stored() -> int:
        try:
            return len(await store.list_run_summaries("t"))
        finally:
            await store.close()

    assert asyncio.run(stored()) == 12


def test_a_spill_file_being_removed_by_its_live_owner_is_never_reported(tmp_path, monkeypatch):
    # Another worker's journal reports left spill files while this one drains its own: the
    # lock must be held until the directory is gone.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    rmtree, reported = shutil.rmtree, []

    def report_then_rmtree(path: Any, *args: Any, **kwargs: Any) -> None:
        reported.extend(report_leftover_spills(str(tmp_path), again=True))
        rmtree(path, *args, **kwargs)

    monkeypatch.setattr(spill_module.shutil, "rmtree", report_then_rmtree)
    spill = SpillFile()
    for n in range(3):
        spill.append({"n": n})
    assert len(spill.read(3)) == 3  # all read back: the directory goes
    assert reported == []


FORKING_PROCESS = """
    import os, signal, sys, time
    from deerflow_journal.journal.spill import SpillFile

    spill = SpillFile()
    spill.append({"n": 1})
    child = os.fork()  # a worker forking a helper (multiprocessing's default on Linux)
    if child == 0:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        time.sleep(120)  # a long-lived helper; the test ends it
        os._exit(0)
    print(spill.path, child, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # the worker is killed (out of memory, say)
"""


def test_a_spill_file_left_by_a_killed_process_is_reported_while_its_fork_lives(tmp_path):
    done = run_script(FORKING_PROCESS, tmp_path)
    assert done.returncode != 0, done.stderr
    path, child = done.stdout.split()
    try:
        assert report_leftover_spills(str(tmp_path), again=True) == [Path(path)]
    finally:
        os.kill(int(child), signal.SIGKILL)


async def test_a_spill_directory_that_cannot_be_locked_is_not_left_behind(tmp_path, monkeypatch):
    # The disk has no room for the lock file (nor anything else): the events past the bound
    # are dropped, and no directory is made for each of them.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    os_open = os.open

    def no_room_for_the_lock(path: Any, *args: Any, **kwargs: Any) -> int:
        if str(path).endswith("owner.lock"):
            raise OSError(28, "No space left on device")
        return os_open(path, *args, **kwargs)

    async with OutageStore(tmp_path / "journal.db") as store:
        journal = RunJournal(run_id="r", thread_id="t", event_store=store, max_buffered_events=10)
        store.down = True
        monkeypatch.setattr(spill_module.os, "open", no_room_for_the_lock)
        await record(journal, 0, 15)
        monkeypatch.setattr(spill_module.os, "open", os_open)
        store.down = False
        await journal.flush()
    assert journal.dropped_events == 5
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("deerflow-journal-spill")] == []


async def test_summaries_kept_at_exit_never_make_an_ended_run_look_running(tmp_path, caplog):
    # Runs whose running summaries left memory end while the store is down; the program then
    # exits. Written back as the ERROR says, the kept file must not leave them "running".
    gate, started = asyncio.Event(), []

    async def held(x: int) -> int:
        started.append(x)
        await gate.wait()
        return x

    async with OutageStore(tmp_path / "journal.db") as store:
        journal = RunJournal(thread_id="t", event_store=store, max_buffered_events=100)
        store.down = True
        await RunnableLambda(lambda x: x).ainvoke(0, {"callbacks": [journal]})
        runs = [
            asyncio.ensure_future(RunnableLambda(held).ainvoke(i, {"callbacks": [journal]}))
            for i in range(10)
        ]
        while len(started) < 10:
            await asyncio.sleep(0.001)
        with contextlib.suppress(ConnectionError):
            await journal.flush()  # 11 summaries, over the bound: they leave memory
        gate.set()
        await asyncio.gather(*runs)  # each run ends: its success summary is in memory
        with caplog.at_level(logging.ERROR):
            journal._writer.buffer.save_at_exit()
        (said,) = [r.getMessage() for r in caplog.records if "journal exits with" in r.getMessage()]
        kept = Path(said.split("run summaries are kept in ")[1].split(" (one a line")[0])
        for line in kept.read_text().splitlines():
            await store.put_run_summary(RunSummary.model_validate_json(line))
        statuses = [s.status for s in await store.list_run_summaries("t")]
    shutil.rmtree(kept.parent)
    assert "running" not in statuses, (said, statuses)
