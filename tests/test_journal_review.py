"""Reproductions of bugs found in review of the bounded run summaries and the spill lock."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path
from typing import Any

from langchain_core.runnables import RunnableLambda

from deerflow_journal import RunJournal, RunSummary
from deerflow_journal.journal import spill as spill_module
from deerflow_journal.journal.spill import SpillFile, report_leftover_spills
from tests.test_journal_spill import OutageStore, record, run_script


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


def test_close_writes_every_run_summary_when_they_cannot_leave_memory(tmp_path, monkeypatch):
    # No spill directory can be made (the temporary directory is a file): summaries past
    # their bound stay in memory. Once the store answers, close() must write them all.
    (tmp_path / "not-a-directory").write_text("")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "not-a-directory"))
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
