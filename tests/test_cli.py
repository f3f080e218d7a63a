"""The ``deerflow-journal`` command line, run as a program (``python -m deerflow_journal``)
against SQLite journals that real journaled LangGraph runs filled."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import queue
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from deerflow_journal import RunJournal, RunSummary, open_store
from deerflow_journal.cli import EXPORT_FORMAT, width_of
from tests.journal.agents import QUESTION, agent_graph, ai, explode, scripted

ROOT = Path(__file__).resolve().parent.parent
HANG_GUARD = 120  # seconds: a guard against a hang, not a time limit


def cli(*args: str, env: dict[str, str] | None = None, stdin: str | None = None):
    """Run ``deerflow-journal args`` and return the finished process (text output)."""
    done = subprocess.run(
        [sys.executable, "-m", "deerflow_journal", *args],
        capture_output=True,
        text=True,
        input=stdin,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        cwd=ROOT,
        timeout=HANG_GUARD,
    )
    if not {"--json", "export"} & set(args):  # JSON lines are for programs
        for line in done.stdout.splitlines():
            assert width_of(line) <= 80, line
    return done


def ok(*args: str, **kwargs: Any) -> str:
    done = cli(*args, **kwargs)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    return done.stdout


def mistake(*args: str, status: int = 1, **kwargs: Any) -> str:
    """The one line a user mistake prints on stderr (it exits with ``status``, 2 for what
    argparse refuses, and prints no result)."""
    done = cli(*args, **kwargs)
    assert done.returncode == status
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    return lines[0]


async def journal_runs(url: str, thread_id: str, *, fail: bool = False, runs: int = 1) -> None:
    """Run a tool-calling agent ``runs`` times on ``thread_id`` with a journal writing to ``url``
    (``fail``: its tool raises, so the run ends in error)."""
    async with open_store(url) as store:
        for _ in range(runs):
            if fail:
                model = scripted(ai(calls=[("explode", {"reason": "boom"}, "c1")]))
                graph = agent_graph(model, tools=[explode], handle_tool_errors=False)
            else:
                model = scripted(ai(calls=[("add", {"a": 1, "b": 2}, "c1")]), ai("1 + 2 = 3"))
                graph = agent_graph(model)
            journal = RunJournal(event_store=store)
            config = {"callbacks": [journal], "configurable": {"thread_id": thread_id}}
            try:
                await graph.ainvoke(QUESTION, config)
            except RuntimeError:
                assert fail
            await journal.flush()


async def read_back(url: str, thread_id: str) -> tuple[list[dict[str, Any]], list[RunSummary]]:
    """Every event of the thread's summarised runs in seq order, and its summaries."""
    async with open_store(url, read_only=True) as store:
        summaries = await store.list_run_summaries(thread_id)
        events = [
            e for s in summaries for e in await store.list_events(thread_id, s.run_id, limit=10_000)
        ]
    return sorted(events, key=lambda e: e["seq"]), summaries


@pytest.fixture(scope="module")
def journal_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A SQLite journal: thread 'weather' with two successful runs, 'broken' with a failed one."""
    path = tmp_path_factory.mktemp("cli") / "journal.db"
    url = f"sqlite:///{path}"

    async def fill() -> None:
        await journal_runs(url, "weather", runs=2)
        await journal_runs(url, "broken", fail=True)

    asyncio.run(fill())
    return url


def summaries_of(url: str, thread_id: str) -> list[RunSummary]:
    return asyncio.run(read_back(url, thread_id))[1]


# -- reading ---------------------------------------------------------------------------------


def test_threads_lists_each_thread_newest_first(journal_db: str):
    lines = ok("--url", journal_db, "threads").splitlines()
    assert lines[0].split() == ["last", "event", "(UTC)", "runs", "last", "seq", "thread"]
    assert [line.split()[-1] for line in lines[1:]] == ["broken", "weather"]
    assert [line.split()[2] for line in lines[1:]] == ["1", "2"]  # runs
    records = [json.loads(line) for line in ok("--url", journal_db, "threads", "--json").split()]
    assert [(r["thread_id"], r["run_count"]) for r in records] == [("broken", 1), ("weather", 2)]
    assert records[1]["last_seq"] == 12
    assert len(ok("--url", journal_db, "threads", "--limit", "1").splitlines()) == 2


def test_runs_lists_runs_of_every_thread_or_one_by_status(journal_db: str):
    weather = summaries_of(journal_db, "weather")
    (broken,) = summaries_of(journal_db, "broken")
    lines = ok("runs", env={"DEERFLOW_JOURNAL_URL": journal_db}).splitlines()
    newest_first = [broken.run_id, weather[1].run_id, weather[0].run_id]
    assert [line.split()[-1] for line in lines[1:]] == newest_first
    assert [line.split()[2] for line in lines[1:]] == ["error", "success", "success"]
    errors = ok("--url", journal_db, "runs", "--status", "error").splitlines()[1:]
    assert [line.split()[-1] for line in errors] == [broken.run_id]
    one = ok("runs", "weather", "--url", journal_db, "--limit", "1").splitlines()[1:]
    assert [line.split()[3:5] for line in one] == [["30", weather[1].run_id]]
    as_json = ok("--url", journal_db, "runs", "weather", "--json").splitlines()
    assert [RunSummary.model_validate_json(line) for line in as_json] == weather[::-1]
    assert (
        ok("--url", journal_db, "runs", "--status", "cancelled")
        == "no runs with status cancelled\n"
    )


def test_show_lists_every_event_of_the_run_in_seq_order(journal_db: str):
    events, summaries = asyncio.run(read_back(journal_db, "weather"))
    run_id = summaries[1].run_id
    run = [e for e in events if e["run_id"] == run_id]
    lines = ok("--url", journal_db, "show", "weather", run_id).splitlines()
    rows = lines[1 : 1 + len(run)]
    assert [int(row.split()[0]) for row in rows] == [e["seq"] for e in run]
    assert [row.split()[2] for row in rows] == [e["event_type"] for e in run]
    assert lines[1 + len(run)] == ""
    assert lines[2 + len(run)].startswith("status success")  # the summary follows
    as_json = ok("--url", journal_db, "show", "weather", run_id, "--json").splitlines()
    assert [json.loads(line) for line in as_json] == run


def test_summary_shows_status_tokens_and_messages(journal_db: str):
    (broken,) = summaries_of(journal_db, "broken")
    text = ok("--url", journal_db, "summary", "broken", broken.run_id)
    assert text.splitlines()[0] == f"run {broken.run_id} of thread broken"
    assert "status error" in text and "RuntimeError" in text and "tokens: 15 total" in text
    as_json = ok("--url", journal_db, "summary", "broken", broken.run_id, "--json")
    assert RunSummary.model_validate_json(as_json) == broken


def test_tail_prints_the_threads_latest_events(journal_db: str):
    events, summaries = asyncio.run(read_back(journal_db, "weather"))
    lines = ok("--url", journal_db, "tail", "weather", "-n", "4").splitlines()
    assert lines[0] == f"-- run {events[-1]['run_id']}"  # where a run starts in the output
    assert [int(line.split()[0]) for line in lines[1:]] == [e["seq"] for e in events[-4:]]
    assert [line.split()[2] for line in lines[1:]] == [e["event_type"] for e in events[-4:]]
    eight = ok("--url", journal_db, "tail", "weather", "-n", "8").splitlines()
    runs = [line.split()[-1] for line in eight if line.startswith("-- run ")]
    assert runs == [s.run_id for s in summaries] and len(eight) == 10


# -- tail --follow -----------------------------------------------------------------------------


class Lines:
    """A running program's output lines, read on a thread."""

    def __init__(self, stream: Any) -> None:
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def take(self, count: int) -> tuple[list[str], list[str]]:
        """The next ``count`` event lines, and the runs that began among them."""
        got: list[str] = []
        runs: list[str] = []
        while len(got) < count:
            line = self._lines.get(timeout=HANG_GUARD)
            assert line is not None, f"the program ended after {got}"
            if line.startswith("-- run "):
                runs.append(line.split()[-1])
            else:
                got.append(line)
        return got, runs


@pytest.fixture
def own_journal(tmp_path: Path) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'journal.db'}"
    asyncio.run(journal_runs(url, "live"))
    yield url


def test_tail_follow_prints_events_another_process_writes_and_stops_on_ctrl_c(own_journal):
    command = ["--url", own_journal, "tail", "live", "-f", "-n", "2", "--interval", "0.05"]
    tail = subprocess.Popen(
        [sys.executable, "-m", "deerflow_journal", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        lines = Lines(tail.stdout)
        first, runs = lines.take(2)
        assert [int(line.split()[0]) for line in first] == [5, 6] and len(runs) == 1
        # This test process is the other writer: two more runs land while tail follows.
        asyncio.run(journal_runs(own_journal, "live", runs=2))
        events, summaries = asyncio.run(read_back(own_journal, "live"))
        new = [e for e in events if e["seq"] > 6]
        followed, runs = lines.take(len(new))
        assert [int(line.split()[0]) for line in followed] == [e["seq"] for e in new] != []
        assert [line.split()[2] for line in followed] == [e["event_type"] for e in new]
        assert runs == [s.run_id for s in summaries[1:]]
        tail.send_signal(signal.SIGINT)
        assert tail.wait(timeout=HANG_GUARD) == 0
        assert tail.stderr.read() == ""
        assert all(width_of(line) <= 80 for line in followed)
    finally:
        tail.kill()
        tail.wait()


# -- export and import ---------------------------------------------------------------------


def test_export_then_import_copies_runs_events_and_summaries(journal_db: str, tmp_path: Path):
    exported = ok("--url", journal_db, "export", "weather")
    lines = [json.loads(line) for line in exported.splitlines()]
    assert lines[0] == {
        "kind": "header",
        "format": EXPORT_FORMAT,
        "version": 1,
        "thread_id": "weather",
        "run_id": None,
    }
    events, summaries = asyncio.run(read_back(journal_db, "weather"))
    assert [{**e, "kind": "event"} for e in events] == [x for x in lines if x["kind"] == "event"]
    assert lines[-1] == {"kind": "end", "events": len(events), "summaries": 2}
    file = tmp_path / "weather.jsonl"
    file.write_text(exported)
    targets = [f"sqlite:///{tmp_path / 'copy.db'}", f"jsonl:///{tmp_path / 'copy'}"]
    for target in targets:
        said = ok("import", str(file), "--url", target)
        assert said == f"imported {len(events)} events and 2 run summaries\n"
        copied, copied_summaries = asyncio.run(read_back(target, "weather"))
        assert copied_summaries == summaries
        assert [{**e, "seq": 0} for e in copied] == [{**e, "seq": 0} for e in events]
        seqs = [e["seq"] for e in copied]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        # The copy reads as the original does.
        run_id = summaries[0].run_id
        assert ok("--url", target, "show", "weather", run_id) == ok(
            "--url", journal_db, "show", "weather", run_id
        )
    # One run, from standard input.
    (broken,) = summaries_of(journal_db, "broken")
    one_run = ok("--url", journal_db, "export", "broken", broken.run_id)
    target = f"sqlite:///{tmp_path / 'one.db'}"
    ok("--url", target, "import", "-", stdin=one_run)
    assert asyncio.run(read_back(target, "broken"))[1] == [broken]


def test_import_copies_large_trace_and_outputs_content_whole(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'whole.db'}"
    big = {"messages": ["x" * 100_000]}

    async def write() -> None:
        async with open_store(url, max_trace_content=None, max_outputs_content=None) as store:
            await store.put_batch(
                [
                    {
                        "thread_id": "big",
                        "run_id": "r",
                        "event_type": t,
                        "category": c,
                        "content": big,
                    }
                    for t, c in (("run.start", "trace"), ("run.end", "outputs"))
                ]
            )
            await store.put_run_summary(RunSummary(thread_id="big", run_id="r", status="success"))

    asyncio.run(write())
    file = tmp_path / "big.jsonl"
    file.write_text(ok("--url", url, "export", "big"))
    target = f"sqlite:///{tmp_path / 'copy.db'}"
    assert ok("import", str(file), "--url", target).startswith("imported 2 events")
    copied, _ = asyncio.run(read_back(target, "big"))
    assert [(e["content"], e["metadata"]) for e in copied] == [(big, {}), (big, {})]


def test_an_import_that_fails_part_way_keeps_nothing_of_it(tmp_path: Path):
    source = f"sqlite:///{tmp_path / 'source.db'}"

    async def write() -> None:
        async with open_store(source) as store:
            for run_id, count in (("first", 600), ("second", 900)):
                await store.put_batch(
                    [
                        {
                            "thread_id": "long",
                            "run_id": run_id,
                            "event_type": "llm.tool.result",
                            "category": "message",
                            "content": f"result {i}",
                        }
                        for i in range(count)
                    ]
                )
                await store.put_run_summary(
                    RunSummary(thread_id="long", run_id=run_id, status="success")
                )

    asyncio.run(write())
    file = tmp_path / "long.jsonl"
    file.write_text(ok("--url", source, "export", "long"))

    def target(name: str, *refusals: str) -> str:
        """A new journal whose database refuses what ``refusals`` (SQL triggers) say."""
        path = tmp_path / name
        asyncio.run(open_store(f"sqlite:///{path}").setup())
        with sqlite3.connect(path) as db:
            for refusal in refusals:
                db.execute(refusal)
        return f"sqlite:///{path}"

    # The disk fills after the first 1,000-event write.
    full = (
        "CREATE TRIGGER full BEFORE INSERT ON run_events "
        "WHEN (SELECT count(*) FROM run_events) >= 1200 "
        "BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END"
    )
    url = target("full.db", full)
    assert mistake("import", str(file), "--url", url) == (
        "deerflow-journal: error: the import failed (database or disk is full); nothing of it "
        "was kept: import it again"
    )
    assert asyncio.run(read_back(url, "long")) == ([], [])
    with sqlite3.connect(tmp_path / "full.db") as db:
        assert db.execute("SELECT count(*) FROM run_events").fetchone() == (0,)
        db.execute("DROP TRIGGER full")
    assert ok("import", str(file), "--url", url) == "imported 1500 events and 2 run summaries\n"

    # Deletes fail too: the runs left behind are named.
    stuck = "CREATE TRIGGER stuck BEFORE DELETE ON run_events BEGIN SELECT RAISE(ABORT, 'no'); END"
    url = target("stuck.db", full, stuck)
    assert mistake("import", str(file), "--url", url) == (
        "deerflow-journal: error: the import failed (database or disk is full) and left run "
        "'first' of thread 'long' and 1 more of its runs half written there: delete them, then "
        "import it again"
    )


def test_export_finds_runs_without_a_summary_through_all_their_messages(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'plain.db'}"

    async def write() -> None:
        async with open_store(url) as store:  # events put directly: no run summaries
            for run_id in ("early", "late"):
                await store.put_batch(
                    [
                        {
                            "thread_id": "plain",
                            "run_id": run_id,
                            "event_type": "llm.human.input",
                            "category": "message",
                            "content": i,
                        }
                        for i in range(700)
                    ]
                )

    asyncio.run(write())
    lines = [json.loads(line) for line in ok("--url", url, "export", "plain").splitlines()]
    events = [line for line in lines if line["kind"] == "event"]
    assert [e["seq"] for e in events] == list(range(1, 1401))
    assert [e["run_id"] for e in events[::700]] == ["early", "late"]


def test_runs_made_only_of_trace_events_are_found_exported_and_tailed(tmp_path: Path):
    """Events written by hand with neither a run summary nor a message row: the thread exists,
    and an export copies them (it used to leave them out, and say nothing)."""
    url, target = f"sqlite:///{tmp_path / 'traces.db'}", f"sqlite:///{tmp_path / 'copy.db'}"

    def event(run_id: str, event_type: str, category: str) -> dict[str, Any]:
        return {"thread_id": "t1", "run_id": run_id, "event_type": event_type,
                "category": category, "content": {"run": run_id}}  # fmt: skip

    async def write() -> None:
        async with open_store(url) as store:
            await store.put_batch([event("r1", "subagent.start", "subagent")] * 3)
            await store.put_batch([event("r2", "run.start", "trace")])

    asyncio.run(write())
    assert "no runs" in ok("--url", url, "runs", "t1")  # the thread is there, no summaries
    exported = ok("--url", url, "export", "t1")
    events = [json.loads(line) for line in exported.splitlines()[1:-1]]
    assert [(e["run_id"], e["seq"]) for e in events] == [("r1", 1), ("r1", 2), ("r1", 3), ("r2", 4)]
    ok("import", "-", "--url", target, stdin=exported)
    again = ok("--url", target, "export", "t1")
    assert again.splitlines()[1:] == exported.splitlines()[1:]
    lines = ok("--url", url, "tail", "t1", "-n", "2").splitlines()
    assert [line.split()[0] for line in lines if not line.startswith("--")] == ["3", "4"]


def test_tail_prints_exactly_the_latest_events_of_runs_written_in_turns(tmp_path: Path):
    """Runs whose events interleave, one with a summary and one of trace events only, and a
    deleted run's gap: ``-n N`` is the thread's last N events, whatever their runs."""
    url = f"sqlite:///{tmp_path / 'turns.db'}"

    def event(run_id: str, i: int) -> dict[str, Any]:
        return {"thread_id": "t", "run_id": run_id, "event_type": "run.start",
                "category": "trace", "content": {"i": i}}  # fmt: skip

    async def write() -> list[int]:
        async with open_store(url) as store:
            for i in range(30):
                await store.put(**event(("summed", "traced", "gone")[i % 3], i))
            await store.put_run_summary(RunSummary(thread_id="t", run_id="summed"))
            await store.delete_by_run("t", "gone")
            return [e["seq"] for e in await store.list_events("t", None, limit=100)]

    seqs = asyncio.run(write())
    for lines in (1, 4, 9, 20, 50):
        out = ok("--url", url, "tail", "t", "-n", str(lines)).splitlines()
        shown = [int(line.split()[0]) for line in out if not line.startswith("-- run ")]
        assert shown == seqs[-lines:], lines


# -- mistakes ------------------------------------------------------------------------------


def test_each_mistake_prints_one_line_naming_the_fix(journal_db: str, tmp_path: Path):
    (broken,) = summaries_of(journal_db, "broken")
    url = ["--url", journal_db]
    assert "no thread 'nope'" in mistake(*url, "runs", "nope")
    assert "`deerflow-journal threads`" in mistake(*url, "tail", "nope")
    assert "no thread 'nope'" in mistake(*url, "export", "nope")
    assert "no thread 'nope'" in mistake(*url, "show", "nope", "r1")
    no_run = mistake(*url, "show", "broken", "r1")
    assert "thread 'broken' has no run 'r1'" in no_run
    assert "`deerflow-journal runs broken`" in no_run
    assert "has no run 'r1'" in mistake(*url, "summary", "broken", "r1")
    assert "has no run 'r1'" in mistake(*url, "export", "broken", "r1")
    # An id no store could hold is the user's mistake, not an unexpected error.
    for words in (["show", "a\tb", "r1"], ["runs", "x" * 129], ["summary", "broken", "r\x7f"]):
        said = mistake(*url, *words, status=2)
        assert "unexpected" not in said and "characters" in said, said
    assert "unknown store URL 'nosuch://x'" in mistake("--url", "nosuch://x", "threads")
    missing = mistake("--url", f"sqlite:///{tmp_path / 'none.db'}", "threads")
    assert "no SQLite journal at" in missing and "--url" in missing
    from_env = mistake("threads", env={"DEERFLOW_JOURNAL_URL": f"jsonl:///{tmp_path / 'no'}"})
    assert "no JSONL journal directory" in from_env and "$DEERFLOW_JOURNAL_URL" in from_env
    down = mistake("--url", "postgresql://nobody:secret@127.0.0.1:1/journal", "threads")
    assert "cannot open the journal at postgresql://nobody:***@127.0.0.1:1/journal" in down
    assert "secret" not in down and "check the URL" in down
    in_query = mistake("--url", "postgresql://nobody@127.0.0.1:1/journal?password=secret", "runs")
    assert "journal?password=***" in in_query and "secret" not in in_query
    bad = mistake("--url", "postgresql://u@127.0.0.1/db?options=-csearch_path=s", "threads")
    assert "not a PostgreSQL connection string" in bad and "unexpected" not in bad
    bad = mistake("--url", "postgresql://u:p%zzsecret@127.0.0.1/db", "threads")
    assert "percent-encoded" in bad and "secret" not in bad
    ssl = mistake("--url", "postgresql://u@127.0.0.1:1/db?sslpassword=secret", "threads")
    assert "sslpassword=***" in ssl and "secret" not in ssl
    # Files for import.
    target = ["--url", f"sqlite:///{tmp_path / 'target.db'}"]
    assert "no file" in mistake("import", str(tmp_path / "none.jsonl"), *target)
    (tmp_path / "notes.txt").write_text("hello\n")
    assert "is not a deerflow-journal export" in mistake(
        "import", str(tmp_path / "notes.txt"), *target
    )
    assert "is not a deerflow-journal export" in mistake("import", "-", *target, stdin='{"a": 1}\n')
    assert "is empty" in mistake("import", "-", *target, stdin="")
    whole = ok(*url, "export", "broken")
    cut = "".join(whole.splitlines(keepends=True)[:-1])
    assert "cut short" in mistake("import", "-", *target, stdin=cut)
    records = whole.splitlines(keepends=True)
    bad_event = json.loads(records[1]) | {"thread_id": ""}
    tampered = "".join([records[0], json.dumps(bad_event) + "\n", *records[2:]])
    assert "line 2: thread_id" in mistake("import", "-", *target, stdin=tampered)
    ok("import", "-", *target, stdin=whole)
    again = mistake("import", "-", *target, stdin=whole)
    assert f"already has run '{broken.run_id}' of thread 'broken'" in again
    # What argparse refuses is one line too.
    assert "required: THREAD, RUN" in mistake(*url, "show", status=2)
    assert "invalid choice: 'done'" in mistake(*url, "runs", "--status", "done", status=2)
    assert "must be at least 1" in mistake(*url, "threads", "--limit", "0", status=2)


def test_a_hint_names_odd_ids_so_that_a_shell_passes_them_on(tmp_path: Path):
    """Ids with spaces, or starting with a dash, are quoted in the command a hint suggests,
    and that command works as pasted."""
    url = f"sqlite:///{tmp_path / 'odd.db'}"

    async def fill() -> None:
        async with open_store(url) as store:
            await store.put(
                thread_id="my thread", run_id="-r1", event_type="run.start", category="trace"
            )

    asyncio.run(fill())
    said = mistake("--url", url, "summary", "--", "my thread", "-r1")
    assert "`deerflow-journal show -- 'my thread' -r1`" in said, said
    assert "run.start" in ok("--url", url, "show", "--", "my thread", "-r1")
    said = mistake("--url", url, "show", "--", "my thread", "r2")
    assert "`deerflow-journal runs 'my thread'`" in said, said


def test_wide_thread_ids_fit_the_line_and_run_ids_stay_whole_while_they_fit(tmp_path: Path):
    """A thread id of wide characters is cut to the columns left; a thread id gives up its
    columns, down to three, before the run id beside it is cut (`show` needs it)."""
    url = f"sqlite:///{tmp_path / 'wide.db'}"
    wide, long_thread, long_run = "漢" * 60, "t" * 40, "job-" + "r" * 37 + "-end"
    now = datetime.now(UTC)

    async def fill() -> None:
        async with open_store(url) as store:
            for thread_id, run_id in ((wide, "r1"), (long_thread, long_run)):
                await store.put(
                    thread_id=thread_id, run_id=run_id, event_type="run.start", category="trace"
                )
                await store.put_run_summary(
                    RunSummary(thread_id=thread_id, run_id=run_id, status="success", started_at=now)
                )

    asyncio.run(fill())
    threads = ok("--url", url, "threads").splitlines()
    assert any("漢…漢" in line for line in threads), threads
    runs = ok("--url", url, "runs").splitlines()
    assert any("漢…漢" in line and line.endswith("  r1") for line in runs), runs
    assert any(line.endswith(f"tt…ttt  {long_run}") for line in runs), runs


# -- terminals -----------------------------------------------------------------------------


def on_a_terminal(*args: str, env: dict[str, str]) -> str:
    """The output of ``deerflow-journal args`` written to a pseudo-terminal."""
    leader, follower = pty.openpty()
    done = subprocess.run(
        [sys.executable, "-m", "deerflow_journal", *args],
        stdout=follower,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "60", **env},
        timeout=HANG_GUARD,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed: everything was read
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert (done.returncode, done.stderr) == (0, b"")
    return b"".join(chunks).decode()


def test_a_terminal_gets_its_width_and_colour_unless_no_color(journal_db: str):
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    coloured = on_a_terminal("--url", journal_db, "runs", env=env)
    assert "\x1b[31merror\x1b[0m" in coloured
    plain = on_a_terminal("--url", journal_db, "runs", env={**env, "NO_COLOR": "1"})
    assert "\x1b[" not in plain
    assert max(width_of(line) for line in plain.splitlines()) <= 60
