"""``ProgressThrottle``: a snapshot still being delivered outlives the journal that sent it."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from deerflow_journal.journal.progress import ProgressThrottle

ROOT = Path(__file__).resolve().parent.parent


def hung_throttle(started: asyncio.Event | None = None) -> ProgressThrottle:
    """A throttle whose reporter never returns, waiting on what nothing else holds."""

    async def reporter(snapshot: dict[str, Any]) -> None:
        if started is not None:
            started.set()
        await asyncio.Event().wait()

    return ProgressThrottle(reporter, 0.0, dict)


async def test_a_hung_delivery_is_not_destroyed_pending_when_its_throttle_is_dropped(caplog):
    gc.collect()  # tasks earlier tests left on loops they closed on purpose go now, not below
    caplog.set_level(logging.ERROR, logger="asyncio")
    caplog.clear()
    started = asyncio.Event()
    throttle = hung_throttle(started)
    throttle.changed(asyncio.get_running_loop())  # the first change is sent at once
    await started.wait()
    del throttle  # as a journal is, once the run that gave up waiting for it is over
    gc.collect()
    await asyncio.sleep(0)
    assert not [r for r in caplog.records if "destroyed but it is pending" in r.getMessage()]
    (delivery,) = asyncio.all_tasks() - {asyncio.current_task()}
    assert not delivery.done()  # still running: a reporter may yet return
    delivery.cancel()
    await asyncio.gather(delivery, return_exceptions=True)


def test_a_delivery_still_running_at_exit_is_cancelled_quietly():
    code = """
        import asyncio, gc, threading
        from deerflow_journal.journal.progress import ProgressThrottle

        async def reporter(snapshot):
            started.set()
            await asyncio.Event().wait()  # never returns

        started = threading.Event()
        loop = asyncio.new_event_loop()  # runs on in a daemon thread, as the journal's own
        threading.Thread(target=loop.run_forever, daemon=True).start()
        ProgressThrottle(reporter, 0.0, dict).changed(loop)
        started.wait()
        gc.collect()
        print("exit")
    """
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,  # a hang guard, not a time limit
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "exit\n"
    assert done.stderr == ""  # no "Task was destroyed but it is pending!" at shutdown


async def test_aclose_gives_up_on_a_reporter_that_never_returns(monkeypatch, caplog):
    from deerflow_journal import MemoryRunEventStore, RunJournal
    from deerflow_journal.journal.writer import JournalWriter
    from tests.journal.agents import QUESTION, agent_graph, ai, run_events, scripted

    monkeypatch.setattr(JournalWriter, "wait_timeout", 0.5)
    started = asyncio.Event()

    async def reporter(snapshot: dict[str, Any]) -> None:
        started.set()
        await asyncio.Event().wait()  # never returns

    journal = RunJournal(event_store=MemoryRunEventStore(), progress_reporter=reporter)
    await agent_graph(scripted(ai("ok"))).ainvoke(QUESTION, {"callbacks": [journal]})
    await started.wait()
    await journal.aclose()  # without a bound, this waited for the reporter for ever
    assert "journal gave up after 0.5 s waiting for" in caplog.text
    assert [e["event_type"] for e in await run_events(journal)][-1] == "run.end"
