"""What the JSONL store promises beyond the shared suite: safe paths, processes, torn writes."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from deerflow_journal import JsonlRunEventStore, RunSummary
from deerflow_journal.stores.jsonl_paths import MAX_NAME_LENGTH, ThreadPaths, encode_id

ROOT = Path(__file__).resolve().parent.parent
NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789_-%~")
HOSTILE = [
    "../x",
    "..",
    ".",
    "/etc/passwd",
    "a/b\\c",
    "C:\\windows",
    'it\'s "quoted"',
    "%2e%2e",
    "~",
    "name.jsonl",
    "ünï©ødé-🧵",
    "CON",
    "nul",
    "Thread",
    "thread",
    "THREAD",
    "i" * 128,
    "é" * 128,
    "🧵" * 128,
    "🧵" * 127 + "x",
]


def ev(thread_id: str = "t", run_id: str = "r1", content: Any = "", **extra: Any) -> dict:
    """A message event for ``put``/``put_batch``."""
    return {
        "thread_id": thread_id,
        "run_id": run_id,
        "event_type": "llm.ai.response",
        "category": "message",
        "content": content,
        **extra,
    }


def run_python(code: str, *args: str, wait: bool = True) -> subprocess.Popen | int:
    """Run ``code`` in a new interpreter that imports this checkout."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    process = subprocess.Popen([sys.executable, "-c", code, *args], env=env)
    return process.wait(timeout=120) if wait else process


def stored_lines(base: Path) -> list[bytes]:
    """Every line of every run file under ``base``."""
    return [
        line
        for path in base.rglob("*.jsonl")
        if path.parent.name == "runs"
        for line in path.read_bytes().splitlines()
    ]


# -- path encoding ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", HOSTILE)
def test_encoded_ids_are_one_plain_file_name(value):
    name = encode_id(value)
    assert set(name) <= NAME_CHARS
    assert name not in {".", ".."} and len(name) <= MAX_NAME_LENGTH
    assert name.lower() not in {"con", "prn", "aux", "nul"}


def test_encoding_is_injective_and_readable_names_round_trip():
    names = [encode_id(v) for v in HOSTILE]
    assert len(set(names)) == len(HOSTILE)
    for value, name in zip(HOSTILE, names, strict=True):
        if "~" not in name:
            assert unquote(name, errors="strict") == value
    assert encode_id("0b7c4e1a-run_1") == "0b7c4e1a-run_1"


def test_long_ids_keep_a_readable_head_and_a_digest():
    name = encode_id("🧵" * 128)
    head, digest = name.split("~")
    assert unquote(head) == "🧵" * (len(head) // 12) and len(digest) == 64
    assert encode_id("🧵" * 128) != encode_id("🧵" * 127 + "x")


async def test_hostile_ids_stay_inside_the_base_dir_in_distinct_files(tmp_path):
    base = tmp_path / "store"
    async with JsonlRunEventStore(base) as store:
        for value in HOSTILE:
            await store.put(**ev(thread_id=value, run_id=value, content=value))
        for value in HOSTILE:
            (record,) = await store.list_messages(value)
            assert (record["thread_id"], record["run_id"], record["content"]) == (value,) * 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]
    files = [p for p in base.rglob("*.jsonl") if p.parent.name == "runs"]
    assert len(files) == len(HOSTILE)
    assert all(p.resolve().is_relative_to(base.resolve()) for p in base.rglob("*"))


# -- torn writes and crashes ------------------------------------------------------------------


async def test_a_torn_last_line_is_skipped_and_later_appends_still_work(tmp_path):
    async with JsonlRunEventStore(tmp_path) as store:
        await store.put_batch([ev(content="a"), ev(content="b")])
        assert await store.count_messages("t") == 2
        run_file = ThreadPaths(tmp_path, "t").run_file("r1")
        with run_file.open("ab") as f:
            f.write(b'{"thread_id":"t","run_id":"r1","seq":3,"event_t')
        async with JsonlRunEventStore(tmp_path) as other:
            assert [r["content"] for r in await other.list_messages("t")] == ["a", "b"]
            assert (await other.put(**ev(content="c")))["seq"] == 3
        assert [r["content"] for r in await store.list_messages("t")] == ["a", "b", "c"]
    assert [json.loads(line)["content"] for line in stored_lines(tmp_path)] == ["a", "b", "c"]


async def test_unreadable_lines_are_skipped_and_logged(tmp_path, caplog):
    async with JsonlRunEventStore(tmp_path) as store:
        await store.put(**ev(content="a"))
        with ThreadPaths(tmp_path, "t").run_file("r1").open("ab") as f:
            f.write(b'not json\n{"thread_id":"another","seq":9}\n[1]\n')
        await store.put(**ev(content="b"))
        caplog.set_level(logging.WARNING)
        async with JsonlRunEventStore(tmp_path) as other:
            assert [r["content"] for r in await other.list_messages("t")] == ["a", "b"]
    assert "skipped 3 unreadable line(s)" in caplog.text


async def test_a_torn_summary_line_is_skipped(tmp_path):
    async with JsonlRunEventStore(tmp_path) as store:
        await store.put_run_summary(RunSummary(thread_id="t", run_id="r1"))
        with ThreadPaths(tmp_path, "t").summaries.open("ab") as f:
            f.write(b'{"thread_id":"t","run_id":"r2","sta')
        assert [s.run_id for s in await store.list_run_summaries("t")] == ["r1"]
        await store.put_run_summary(RunSummary(thread_id="t", run_id="r1", status="success"))
        assert [s.status for s in await store.list_run_summaries("t")] == ["success"]


async def test_an_unreadable_state_file_is_rebuilt_from_the_highest_stored_seq(tmp_path, caplog):
    async with JsonlRunEventStore(tmp_path) as store:
        await store.put_batch([ev(), ev(run_id="r2"), ev()])
        ThreadPaths(tmp_path, "t").state.write_bytes(b"\0" * 40)
        assert await store.count_messages("t") == 3
        assert (await store.put(**ev()))["seq"] == 4
        assert await store.count_messages("t") == 4
    assert caplog.text.count("rebuilding the unreadable state file") == 1


CRASHING_WRITER = """
import asyncio, json, os, sys
from deerflow_journal.stores import jsonl, jsonl_files

base, point, events = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
appends = 0

def append_then_die(path, data):
    global appends
    appends += 1
    if appends == 2:
        whole = point == "whole-second-append"
        jsonl_files.append_file(path, data if whole else data[: len(data) // 2])
        os._exit(9)
    jsonl_files.append_file(path, data)

def die(self):
    os._exit(9)

if point in ("second-append", "whole-second-append"):
    jsonl.append_file = append_then_die
else:
    jsonl_files.LockedThread.commit = die

async def main():
    async with jsonl.JsonlRunEventStore(base) as store:
        await store.put_batch(events)

asyncio.run(main())
"""


def _crash(base: Path, point: str, events: list[dict]) -> None:
    assert run_python(CRASHING_WRITER, str(base), point, json.dumps(events)) == 9


@pytest.mark.slow
@pytest.mark.parametrize("point", ["second-append", "commit"])
async def test_a_writer_killed_inside_a_batch_leaves_none_of_it(tmp_path, point):
    async with JsonlRunEventStore(tmp_path) as store:
        await store.put(**ev(content="before"))
        _crash(tmp_path, point, [ev(content="x1"), ev(run_id="r2", content="x2"), ev(content="x3")])
        assert [r["content"] for r in await store.list_messages("t")] == ["before"]
        after = await store.put(**ev(run_id="r2", content="after"))
        assert after["seq"] > 1
        assert [r["content"] for r in await store.list_messages("t")] == ["before", "after"]
    assert sorted(json.loads(line)["content"] for line in stored_lines(tmp_path)) == [
        "after",
        "before",
    ]


@pytest.mark.slow
@pytest.mark.parametrize("point", ["second-append", "whole-second-append"])
@pytest.mark.parametrize("recovery_order", [("a", "b"), ("b", "a")])
async def test_a_batch_spanning_threads_killed_before_its_commit_point_rolls_back_everywhere(
    tmp_path, point, recovery_order
):
    _crash(tmp_path, point, [ev(thread_id="a"), ev(thread_id="b"), ev(thread_id="a")])
    assert len(list((tmp_path / "batches").iterdir())) == 1
    async with JsonlRunEventStore(tmp_path) as store:
        first, second = recovery_order
        assert await store.count_messages(first) == 0
        # The marker outlives the first rollback: the other thread still has to roll back.
        assert len(list((tmp_path / "batches").iterdir())) == 1
        assert await store.count_messages(second) == 0
        assert list((tmp_path / "batches").iterdir()) == []
        assert (await store.put(**ev(thread_id="b")))["seq"] > 0
        assert await store.count_messages("a") == 0


@pytest.mark.slow
async def test_a_batch_spanning_threads_killed_after_its_commit_point_is_kept_everywhere(tmp_path):
    _crash(tmp_path, "commit", [ev(thread_id="a"), ev(thread_id="b"), ev(thread_id="a")])
    async with JsonlRunEventStore(tmp_path) as store:
        assert [r["seq"] for r in await store.list_messages("a")] == [1, 2]
        assert [r["seq"] for r in await store.list_messages("b")] == [1]
        assert (await store.put(**ev(thread_id="a")))["seq"] == 3
    assert list((tmp_path / "batches").iterdir()) == []


# -- the read cache ---------------------------------------------------------------------------


async def test_reads_see_appends_and_deletes_made_by_another_store(tmp_path):
    async with JsonlRunEventStore(tmp_path) as reader, JsonlRunEventStore(tmp_path) as writer:
        assert await reader.count_messages("t") == 0
        await writer.put_batch([ev(content=i) for i in range(5)])
        assert await reader.count_messages("t") == 5
        await writer.put(**ev(run_id="r2", content=5))
        assert [r["content"] for r in await reader.list_messages("t", limit=2)] == [4, 5]
        assert await writer.delete_by_run("t", "r1") == 5
        assert [r["content"] for r in await reader.list_messages("t")] == [5]
        assert (await reader.put(**ev(content=6)))["seq"] == 7
        assert [r["seq"] for r in await writer.list_messages("t")] == [6, 7]


async def test_reads_after_an_append_read_only_the_new_bytes(tmp_path):
    async with JsonlRunEventStore(tmp_path) as reader, JsonlRunEventStore(tmp_path) as writer:
        await writer.put(**ev(content="first"))
        assert await reader.count_messages("t") == 1
        # Spoil the bytes the reader has already taken in: a re-read would drop the record.
        run_file = ThreadPaths(tmp_path, "t").run_file("r1")
        with run_file.open("r+b") as f:
            f.write(b"#")
        await writer.put(**ev(content="second"))
        records = await reader.list_messages("t")
        assert [r["content"] for r in records] == ["first", "second"]


APPENDER = """
import asyncio, sys
from deerflow_journal import JsonlRunEventStore

async def main():
    async with JsonlRunEventStore(sys.argv[1]) as store:
        await store.put_batch([
            {"thread_id": "t", "run_id": "r9", "event_type": "llm.ai.response",
             "category": "message", "content": i}
            for i in range(3)
        ])

asyncio.run(main())
"""


@pytest.mark.slow
async def test_reads_see_appends_made_by_another_process(tmp_path):
    async with JsonlRunEventStore(tmp_path) as store:
        await store.put(**ev(content="mine"))
        assert await store.count_messages("t") == 1
        assert run_python(APPENDER, str(tmp_path)) == 0
        assert [r["content"] for r in await store.list_messages("t")] == ["mine", 0, 1, 2]
        assert await store.get_last_visible_ai_seq_by_run("t", ["r1", "r9"]) == {"r1": 1, "r9": 4}


# -- several processes ------------------------------------------------------------------------

WORKER = """
import asyncio, sys, time
from pathlib import Path
from deerflow_journal import JsonlRunEventStore

base, worker, count = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
(base / f"ready-{worker}").touch()
while not (base / "go").exists():
    time.sleep(0.002)

def event(thread, i):
    return {"thread_id": thread, "run_id": f"run-{worker}-{i % 3}", "event_type": "llm.ai.response",
            "category": "message", "content": {"worker": worker, "i": i}}

async def main():
    async with JsonlRunEventStore(base / "store") as store:
        for i in range(count):
            if i % 4 == 3:
                # Batches spanning threads, listed in a different order by each worker.
                threads = ["shared", "side"] if int(worker) % 2 else ["side", "shared"]
                await store.put_batch([event(threads[0], i), event(threads[1], i)])
            else:
                await store.put(**event("shared", i))
        await store.put_if_absent(**{**event("shared", -1), "run_id": "once",
                                     "event_type": "run.start", "category": "trace"})

asyncio.run(main())
"""


@pytest.mark.slow
async def test_processes_writing_one_thread_get_unique_increasing_seq_and_whole_lines(tmp_path):
    workers, count = 4, 60
    processes = [
        run_python(WORKER, str(tmp_path), str(w), str(count), wait=False) for w in range(workers)
    ]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("ready-*"))) < workers and time.monotonic() < deadline:
        time.sleep(0.01)
    (tmp_path / "go").touch()
    assert [p.wait(timeout=120) for p in processes] == [0] * workers

    async with JsonlRunEventStore(tmp_path / "store") as store:
        shared = await store.list_messages("shared", limit=10_000)
        side = await store.list_messages("side", limit=10_000)
        once = await store.list_events("shared", "once")
    seen = [(r["content"]["worker"], r["content"]["i"]) for r in shared]
    assert sorted(seen) == sorted((str(w), i) for w in range(workers) for i in range(count))
    assert [r["seq"] for r in shared] == sorted({r["seq"] for r in shared})
    assert len(side) == workers * (count // 4)
    assert len(once) == 1
    lines = stored_lines(tmp_path / "store")
    assert all(line.startswith(b"{") and json.loads(line) for line in lines)
    assert len(lines) == len(shared) + len(side) + 1


async def test_a_relative_base_dir_stays_where_it_was_after_a_chdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = JsonlRunEventStore("journal")
    await store.setup()
    await store.put(**ev(content="before"))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    await store.put(**ev(content="after"))
    events = await store.list_events("t", "r1")
    assert [(e["seq"], e["content"]) for e in events] == [(1, "before"), (2, "after")]
    assert not (tmp_path / "elsewhere" / "journal").exists()


def summary(run_id: str = "r1") -> RunSummary:
    return RunSummary(thread_id="t", run_id=run_id, status="success")


async def test_a_journal_batch_whose_summary_fails_writes_no_events(tmp_path):
    # The journal retries a failed batch whole: events left written would be written twice.
    store = JsonlRunEventStore(tmp_path)
    await store.setup()
    await store.put(**ev(content="earlier"))
    blocker = ThreadPaths(store.base_dir, "t").summaries
    # Reads as no summaries yet (the owner check passes), but appending to it fails.
    blocker.symlink_to(tmp_path / "missing" / "summaries.jsonl")
    with pytest.raises(OSError):
        await store._put_journal_batch([ev(content="new")], [summary().to_json_dict()])
    assert [e["content"] for e in await store.list_events("t", "r1")] == ["earlier"]
    blocker.unlink()
    await store._put_journal_batch([ev(content="new")], [summary().to_json_dict()])
    assert [e["content"] for e in await store.list_events("t", "r1")] == ["earlier", "new"]
    assert (await store.get_run_summary("t", "r1")) is not None


async def test_a_journal_batch_whose_events_fail_keeps_no_summary(tmp_path):
    # Thread "t" goes first: its summary is written when thread "t2"'s events then fail.
    store = JsonlRunEventStore(tmp_path)
    await store.setup()
    await store._put_journal_batch([], [summary("r0").to_json_dict()])
    blocked = ThreadPaths(store.base_dir, "t2")
    blocked.runs.mkdir(parents=True)
    blocked.run_file("r1").mkdir()  # the events cannot be appended
    with pytest.raises(OSError):
        await store._put_journal_batch([ev(thread_id="t2")], [summary().to_json_dict()])
    assert (await store.get_run_summary("t", "r1")) is None
    assert (await store.get_run_summary("t", "r0")) is not None
    assert b"r1" not in ThreadPaths(store.base_dir, "t").summaries.read_bytes()


async def test_reads_work_with_the_thread_cache_turned_off(tmp_path):
    store = JsonlRunEventStore(tmp_path)
    store.max_cached_threads = 0
    await store.setup()
    await store.put_batch([ev(content="a"), ev(content="b")])
    assert [e["content"] for e in await store.list_events("t", "r1")] == ["a", "b"]
    assert await store.count_messages("t") == 2


KILLED_JOURNAL_WRITER = """
import asyncio, os, sys
from deerflow_journal import RunSummary
from deerflow_journal.stores import jsonl, jsonl_files

def die(self):
    os._exit(9)

jsonl_files.LockedThread.commit = die  # killed with the batch's lines and summary written

async def main():
    async with jsonl.JsonlRunEventStore(sys.argv[1]) as store:
        event = dict(thread_id="t", run_id="r1", event_type="run.end", category="outputs")
        summary = RunSummary(thread_id="t", run_id="r1").to_json_dict()
        await store._put_journal_batch([event], [summary])

asyncio.run(main())
"""


@pytest.mark.slow
async def test_a_journal_batch_killed_before_its_commit_leaves_neither_events_nor_summary(
    tmp_path,
):
    async with JsonlRunEventStore(tmp_path) as store:
        await store._put_journal_batch([], [summary("r0").to_json_dict()])
        assert run_python(KILLED_JOURNAL_WRITER, str(tmp_path)) == 9
        assert b'"r1"' in ThreadPaths(store.base_dir, "t").summaries.read_bytes()
        await store.put(**ev(run_id="r2"))  # the next writer recovers the thread
        assert (await store.get_run_summary("t", "r1")) is None
        assert (await store.get_run_summary("t", "r0")) is not None
        assert [e["run_id"] for e in await store.list_messages("t")] == ["r2"]


@pytest.mark.slow
@pytest.mark.parametrize("read", ["get_run_summary", "list_run_summaries"])
async def test_summary_reads_finish_a_journal_batch_a_dead_writer_left(tmp_path, read):
    # Read before anything else touches the thread: the batch's summary must not show, for
    # the next writer's rollback would take it away again.
    async with JsonlRunEventStore(tmp_path) as store:
        await store._put_journal_batch([], [summary("r0").to_json_dict()])
        assert run_python(KILLED_JOURNAL_WRITER, str(tmp_path)) == 9
        if read == "get_run_summary":
            assert (await store.get_run_summary("t", "r1")) is None
        else:
            assert [s.run_id for s in await store.list_run_summaries("t")] == ["r0"]
        assert b'"r1"' not in ThreadPaths(store.base_dir, "t").summaries.read_bytes()
        assert await store.list_events("t", "r1") == []


MANY_THREADS_WRITER = """
import asyncio, resource, sys
from deerflow_journal import JsonlRunEventStore

base, limit, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

async def main():
    async with JsonlRunEventStore(base) as store:
        written = await store.put_batch([
            {"thread_id": f"t{i}", "run_id": "r", "event_type": "llm.ai.response",
             "category": "message", "content": i}
            for i in range(threads)
        ])
        assert [r["seq"] for r in written] == [1] * threads
        for i in range(threads):
            assert [e["content"] for e in await store.list_events(f"t{i}", "r")] == [i]

asyncio.run(main())
"""


@pytest.mark.slow
async def test_a_batch_over_more_threads_than_the_open_file_limit_allows_succeeds(tmp_path):
    limit = 128
    threads = 3 * limit  # a file or two held per thread would need several times the limit
    assert run_python(MANY_THREADS_WRITER, str(tmp_path), str(limit), str(threads)) == 0
    async with JsonlRunEventStore(tmp_path) as store:
        for i in range(threads):
            assert [e["content"] for e in await store.list_events(f"t{i}", "r")] == [i]
        assert (await store.put(**ev(thread_id="t7")))["seq"] == 2
