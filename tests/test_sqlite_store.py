"""What only the SQLite store promises: shared files, many processes, crashes, query plans."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiosqlite
import pytest
from langchain_core.runnables import RunnableLambda

from deerflow_journal import RunJournal, RunSummary, SqliteRunEventStore, open_store
from deerflow_journal.stores import sqlite as sqlite_module
from deerflow_journal.stores.sqlite_schema import MIGRATIONS

ROOT = Path(__file__).resolve().parent.parent
T = "thread-1"


def ev(run_id: str = "r1", content: Any = "", **extra: Any) -> dict[str, Any]:
    """A message event of thread ``T``."""
    return {
        "thread_id": T,
        "run_id": run_id,
        "event_type": "llm.ai.response",
        "category": "message",
        "content": content,
        **extra,
    }


def spawn(code: str, *args: str) -> subprocess.Popen[str]:
    """Run ``code`` in a new Python process that imports this checkout."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen[str], timeout: float = 120) -> str:
    """Wait for ``process`` and return its output; fail with its stderr if it failed."""
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    assert process.returncode == 0, err
    return out


def thread_rows(path: Path, thread_id: str = T) -> list[tuple[int, str]]:
    """(seq, content JSON) of a thread, read with the standard library's sqlite3."""
    with sqlite3.connect(path) as db:
        return db.execute(
            "SELECT seq, content FROM run_events WHERE thread_id = ? ORDER BY seq", (thread_id,)
        ).fetchall()


# -- connections -----------------------------------------------------------------------------


async def test_a_connection_passed_in_is_used_and_never_closed(tmp_path: Path):
    async with aiosqlite.connect(tmp_path / "j.db") as db:
        async with SqliteRunEventStore(db) as store:
            await store.put(**ev())
        await store.close()
        rows = await db.execute_fetchall("SELECT count(*) FROM run_events")
        assert list(rows) == [(1,)]


async def test_writes_on_a_connection_with_implicit_transactions_are_committed(tmp_path: Path):
    path = tmp_path / "j.db"
    async with aiosqlite.connect(path) as db:
        assert db.isolation_level == ""  # Python's implicit-transaction mode
        store = SqliteRunEventStore(db)
        await store.put(**ev())
        await store.put_batch([ev(), ev(run_id="r2")])
        await store.put_if_absent(**ev(run_id="r3"))
        await store.put_run_summary(RunSummary(thread_id=T, run_id="r1"))
        await store.delete_by_run(T, "r2")
        assert not db.in_transaction
        async with SqliteRunEventStore(path) as other:
            assert [r["seq"] for r in await other.list_messages(T)] == [1, 2, 4]
            assert await other.get_run_summary(T, "r1") is not None


async def test_writes_number_on_through_a_connection_with_its_own_row_and_text_factories(
    tmp_path: Path,
):
    async with aiosqlite.connect(tmp_path / "j.db", isolation_level=None) as db:
        db.row_factory = sqlite3.Row
        db.text_factory = bytes
        store = SqliteRunEventStore(db)
        await store.setup()
        for _ in range(2):
            await store.put_batch([ev(), ev(thread_id="t2")])
            await store._put_journal_batch([ev(), ev(thread_id="t2")], [])
    async with SqliteRunEventStore(tmp_path / "j.db") as store:
        for thread_id in (T, "t2"):
            seqs = [r["seq"] for r in await store.list_messages(thread_id)]
            assert seqs == [1, 2, 3, 4]


def _dict_rows(cursor: sqlite3.Cursor, row: tuple[Any, ...]) -> dict[str, Any]:
    return {column[0]: value for column, value in zip(cursor.description, row, strict=True)}


@pytest.mark.parametrize("isolation_level", [None, ""], ids=["autocommit", "implicit"])
@pytest.mark.parametrize(
    "factories",
    [(sqlite3.Row, bytes), (_dict_rows, str), (_dict_rows, bytes)],
    ids=["row-bytes", "dict-str", "dict-bytes"],
)
async def test_every_call_reads_plain_rows_whatever_factories_a_callers_connection_has(
    tmp_path: Path, isolation_level: str | None, factories: tuple[Any, Any]
):
    async with aiosqlite.connect(tmp_path / "j.db", isolation_level=isolation_level) as db:
        db.row_factory, db.text_factory = factories
        store = SqliteRunEventStore(db)
        await store.setup()
        written = await store.put(**ev())  # one event: it raised after its commit on bytes
        assert written["seq"] == 1
        started, created = await store.put_if_absent(**ev(event_type="run.start", category="t"))
        assert created and started["seq"] == 2
        assert await store.list_events(T, "r1") == [written, started]
        assert await store.list_messages(T) == [written]
        await store.put_run_summary(RunSummary(thread_id=T, run_id="r1"))
        assert (await store.get_run_summary(T, "r1")) is not None
        assert await store.delete_by_run(T, "r1") == 2
        assert (db.row_factory, db.text_factory) == factories  # the caller's, as they were


@pytest.mark.parametrize("isolation_level", [None, ""], ids=["autocommit", "implicit"])
async def test_a_failing_read_leaves_the_transaction_of_a_callers_connection_alone(
    tmp_path: Path, isolation_level: str | None
):
    async with aiosqlite.connect(tmp_path / "j.db", isolation_level=isolation_level) as db:
        store = SqliteRunEventStore(db)
        await store.put(**ev(content="héllo"))
        await db.execute("CREATE TABLE mine (x)")
        if isolation_level is None:
            await db.execute("BEGIN")
        await db.execute("INSERT INTO mine VALUES (1)")  # the caller's, not committed yet
        db.text_factory = lambda raw: raw.decode("ascii")  # refuses the store's text
        with pytest.raises(UnicodeDecodeError):
            await store.list_messages(T)
        db.text_factory = str
        assert db.in_transaction
        await db.commit()
        assert list(await db.execute_fetchall("SELECT x FROM mine")) == [(1,)]


async def test_from_conn_string_creates_parent_dirs_sets_up_and_closes(tmp_path: Path):
    path = tmp_path / "deep" / "er" / "journal.db"
    async with SqliteRunEventStore.from_conn_string(path) as store:
        assert (await store.put(**ev()))["seq"] == 1
    assert store._worker is None
    assert thread_rows(path) == [(1, '""')]


async def test_open_store_with_an_absolute_url(tmp_path: Path):
    async with open_store(f"sqlite:///{tmp_path / 'j.db'}") as store:
        assert isinstance(store, SqliteRunEventStore)
        await store.put(**ev())
    assert len(thread_rows(tmp_path / "j.db")) == 1


def test_a_path_or_connection_is_required():
    with pytest.raises(TypeError, match=r"path or an aiosqlite\.Connection"):
        SqliteRunEventStore(42)  # type: ignore[arg-type]


@pytest.mark.slow
def test_an_open_store_does_not_keep_the_interpreter_from_exiting(tmp_path: Path):
    child = spawn(
        """
        import asyncio, sys
        from deerflow_journal import SqliteRunEventStore

        STORE = SqliteRunEventStore(sys.argv[1])

        async def main():
            await STORE.put(thread_id="t", run_id="r", event_type="run.start", category="trace")

        asyncio.run(main())
        print("done", flush=True)
        """,
        str(tmp_path / "j.db"),
    )
    assert finish(child, timeout=60).strip() == "done"


@pytest.mark.slow
def test_stores_left_open_when_their_event_loop_closes_print_nothing(tmp_path: Path):
    # Nothing may call back into a closed loop from a worker thread ("Event loop is closed").
    child = spawn(
        """
        import asyncio, gc, sys, threading
        from deerflow_journal import SqliteRunEventStore

        async def opened(path):
            store = SqliteRunEventStore(path)
            await store.put(thread_id="t", run_id="r", event_type="e", category="trace")
            return store

        async def main():
            await opened(sys.argv[1])  # dropped unclosed while its loop runs

        asyncio.run(main())
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)  # current still after it closes, as some runners leave it
        stale = loop.run_until_complete(opened(sys.argv[2]))
        loop.close()
        del stale
        gc.collect()  # its connection goes now, with only a closed loop to answer to
        for thread in threading.enumerate():  # the stores' threads end, saying what they say
            if thread is not threading.main_thread():
                thread.join()
        print("done", flush=True)
        """,
        str(tmp_path / "dropped.db"),
        str(tmp_path / "stale.db"),
    )
    out, err = child.communicate(timeout=60)
    assert (child.returncode, out.strip()) == (0, "done"), err
    assert err == ""


# -- schema ----------------------------------------------------------------------------------


async def test_setup_is_idempotent_and_records_the_schema_version(tmp_path: Path):
    path = tmp_path / "j.db"
    async with SqliteRunEventStore(path) as store:
        await store.setup()
        await store.put(**ev())
    async with SqliteRunEventStore(path) as store:
        assert (await store.put(**ev()))["seq"] == 2
    with sqlite3.connect(path) as db:
        versions = [v for (v,) in db.execute("SELECT v FROM run_event_migrations ORDER BY v")]
        (mode,) = db.execute("PRAGMA journal_mode").fetchone()
    assert versions == list(range(len(MIGRATIONS)))
    assert mode == "wal"


async def test_the_schema_refuses_a_seq_that_does_not_follow_the_counter(tmp_path: Path):
    path = tmp_path / "j.db"
    async with SqliteRunEventStore(path) as store:
        await store.put(**ev())
        await store.put(**ev())
    columns = "(thread_id, run_id, seq, event_type, category, content, metadata, created_at)"
    insert = f"INSERT INTO run_events {columns} VALUES (?, 'r', ?, 'x', 'trace', '1', '{{}}', '')"
    # A seq taken, one past the next, and a deleted one (the counter does not go back).
    with sqlite3.connect(path) as db, pytest.raises(sqlite3.IntegrityError, match="UNIQUE"):
        db.execute(insert, (T, 1))
    with sqlite3.connect(path) as db, pytest.raises(sqlite3.IntegrityError, match="last_seq"):
        db.execute(insert, (T, 4))
    with sqlite3.connect(path) as db:
        db.execute("DELETE FROM run_events WHERE seq = 2")
    with sqlite3.connect(path) as db, pytest.raises(sqlite3.IntegrityError, match="last_seq"):
        db.execute(insert, (T, 2))
    with sqlite3.connect(path) as db:
        assert [seq for (seq,) in db.execute("SELECT seq FROM run_events")] == [1]
    with sqlite3.connect(path) as db, pytest.raises(sqlite3.IntegrityError, match="keep their"):
        db.execute("UPDATE run_events SET category = 'trace'")


@pytest.mark.slow
def test_setup_from_several_processes_at_once(tmp_path: Path):
    path, go = tmp_path / "j.db", tmp_path / "go"
    children = [
        spawn(
            """
            import asyncio, os, sys, time
            from deerflow_journal import SqliteRunEventStore

            async def main(path, go):
                while not os.path.exists(go):
                    time.sleep(0.001)
                async with SqliteRunEventStore(path) as store:
                    await store.put(thread_id="t", run_id="r", event_type="e", category="trace")

            asyncio.run(main(*sys.argv[1:]))
            """,
            str(path),
            str(go),
        )
        for _ in range(4)
    ]
    go.touch()
    for child in children:
        finish(child)
    assert [seq for seq, _ in thread_rows(path, "t")] == [1, 2, 3, 4]
    with sqlite3.connect(path) as db:
        versions = [v for (v,) in db.execute("SELECT v FROM run_event_migrations ORDER BY v")]
    assert versions == list(range(len(MIGRATIONS)))


# -- several processes -------------------------------------------------------------------------

WRITER = """
import asyncio, os, sys, time
from deerflow_journal import SqliteRunEventStore

async def main(path, go, worker, count):
    worker, count = int(worker), int(count)
    while not os.path.exists(go):
        time.sleep(0.001)
    async with SqliteRunEventStore(path) as store:
        i = 0
        while i < count:
            if i % 4 == 0:
                await store.put(thread_id="thread-1", run_id=f"w{worker}", event_type="e",
                                category="message", content=[worker, i])
                i += 1
            else:
                n = min(count - i, 1 + i % 7)
                await store.put_batch([
                    {"thread_id": "thread-1", "run_id": f"w{worker}", "event_type": "e",
                     "category": "message", "content": [worker, j]}
                    for j in range(i, i + n)
                ])
                i += n

asyncio.run(main(*sys.argv[1:]))
"""


@pytest.mark.slow
async def test_processes_writing_one_thread_keep_seq_unique_increasing_and_gapless(
    tmp_path: Path,
):
    path, go, workers, count = tmp_path / "j.db", tmp_path / "go", 4, 300
    children = [spawn(WRITER, str(path), str(go), str(w), str(count)) for w in range(workers)]
    go.touch()
    for child in children:
        finish(child)

    rows = thread_rows(path)
    assert [seq for seq, _ in rows] == list(range(1, workers * count + 1))
    contents = [tuple(sqlite_module.decode_json(content)) for _, content in rows]
    assert sorted(contents) == [(w, i) for w in range(workers) for i in range(count)]
    for w in range(workers):  # each process's events landed in the order it wrote them
        assert [i for cw, i in contents if cw == w] == list(range(count))
    async with SqliteRunEventStore(path) as store:
        assert await store.count_messages(T) == workers * count
        assert (await store.put(**ev()))["seq"] == workers * count + 1


@pytest.mark.slow
def test_put_if_absent_across_processes_creates_exactly_one_per_run(tmp_path: Path):
    path, go, runs = tmp_path / "j.db", tmp_path / "go", 25
    children = [
        spawn(
            """
            import asyncio, os, sys, time
            from deerflow_journal import SqliteRunEventStore

            async def main(path, go, runs):
                while not os.path.exists(go):
                    time.sleep(0.001)
                async with SqliteRunEventStore(path) as store:
                    for r in range(int(runs)):
                        _, created = await store.put_if_absent(
                            thread_id="thread-1", run_id=f"r{r}", event_type="context:memory",
                            category="context", content=os.getpid())
                        print(r, created)

            asyncio.run(main(*sys.argv[1:]))
            """,
            str(path),
            str(go),
            str(runs),
        )
        for _ in range(4)
    ]
    go.touch()
    created = [line for child in children for line in finish(child).splitlines()]
    assert sorted(line for line in created if line.endswith("True")) == sorted(
        f"{r} True" for r in range(runs)
    )
    assert len(thread_rows(path)) == runs


@pytest.mark.slow
async def test_committed_events_survive_sigkill(tmp_path: Path):
    path = tmp_path / "j.db"
    child = spawn(
        """
        import asyncio, sys
        from deerflow_journal import SqliteRunEventStore

        async def main(path):
            store = SqliteRunEventStore(path)
            written = await store.put_batch([
                {"thread_id": "thread-1", "run_id": "r1", "event_type": "e",
                 "category": "message", "content": i}
                for i in range(50)
            ])
            await store.put(thread_id="thread-1", run_id="r1", event_type="e",
                            category="message", content=50)
            print(written[-1]["seq"] + 1, flush=True)
            await asyncio.sleep(3600)

        asyncio.run(main(sys.argv[1]))
        """,
        str(path),
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "51"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(timeout=60)
        child.stdout.close()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL
    async with SqliteRunEventStore(path) as store:
        records = await store.list_messages(T, limit=100)
        assert [r["content"] for r in records] == list(range(51))
        assert (await store.put(**ev()))["seq"] == 52


# -- indexed columns ---------------------------------------------------------------------------


@pytest.mark.parametrize("given", [False, True], ids=["path", "given connection"])
async def test_indexed_columns_hold_null_when_absent_and_their_exact_text_otherwise(
    tmp_path: Path, given: bool
):
    """The store binds an absent user, task or caller in its own way: whatever it binds, the
    row holds NULL for it, and any text (empty, "0") as it is, by every write path."""
    path = tmp_path / "j.db"
    values = [None, "", "0", "k"]
    events = [
        ev(metadata={"task_id": task, "caller": caller}, user_id=user)
        for task in values
        for caller in values
        for user in (None, "u1")
    ]
    expected = [(e["user_id"], e["metadata"]["task_id"], e["metadata"]["caller"]) for e in events]
    async with contextlib.AsyncExitStack() as stack:
        conn = await stack.enter_async_context(aiosqlite.connect(path)) if given else None
        store = await stack.enter_async_context(SqliteRunEventStore(conn or path))
        await store.put_batch(events)
        for event in events:
            await store.put(**event)
        journal = RunJournal(event_store=store)
        await RunnableLambda(lambda x: x).ainvoke("hi", {"callbacks": [journal]})
        await journal.flush()
    with sqlite3.connect(path) as db:
        rows = db.execute(
            "SELECT run_id, user_id, task_id, caller, json_extract(metadata, '$.caller')"
            " FROM run_events ORDER BY seq"
        ).fetchall()
    assert [row[1:4] for row in rows if row[0] == "r1"] == expected * 2
    journaled = [row[1:] for row in rows if row[0] != "r1"]
    assert [row[:2] for row in journaled] == [(None, None)] * 2  # run.start, run.end
    assert [row[2] for row in journaled] == [row[3] for row in journaled] == ["lead_agent", None]


# -- journal batches ---------------------------------------------------------------------------


@pytest.mark.parametrize("connection", ["path", "given", "given counting changes"])
async def test_batch_ids_and_summaries_of_others_are_told_by_the_rows_a_write_changed(
    tmp_path: Path, connection: str, monkeypatch: pytest.MonkeyPatch
):
    """The store tells a batch id taken already, and another user's summary, by the rows its
    statement changed (and a batch's number by its rowid), on its own connection and on a
    caller's, even one whose (deprecated) count_changes pragma makes inserts return rows."""
    monkeypatch.setattr(sqlite_module, "BATCH_IDS_KEPT", 2)
    monkeypatch.setattr(sqlite_module, "BATCH_IDS_PRUNED_EVERY", 3)
    path = tmp_path / "j.db"

    def summary(run_id: str, user_id: str | None) -> dict[str, Any]:
        return RunSummary(thread_id=T, run_id=run_id, user_id=user_id).to_json_dict()

    async with contextlib.AsyncExitStack() as stack:
        conn = None
        if connection != "path":
            conn = await stack.enter_async_context(aiosqlite.connect(path))
            if connection == "given counting changes":
                await conn.execute("PRAGMA count_changes = ON")
        store = await stack.enter_async_context(SqliteRunEventStore(conn or path))
        for n in range(1, 7):  # numbered 1-6: the 3rd and the 6th forget n <= 1 and n <= 4
            assert await store._put_journal_batch([ev()], [summary("r1", None)], batch_id=f"b{n}")
        assert not await store._put_journal_batch([ev()], [], batch_id="b6")  # taken
        assert not await store._put_journal_batch([ev()], [], batch_id="b5")
        with pytest.raises(PermissionError):  # another user's summary: nothing is written
            await store._put_journal_batch([ev()], [summary("r1", "mallory")], batch_id="b7")
        assert await store._put_journal_batch([ev()], [summary("r2", "alice")], batch_id="b7")
        assert await store.count_messages(T) == 7
    with sqlite3.connect(path) as db:
        kept = db.execute("SELECT n, batch_id FROM run_journal_batches ORDER BY n").fetchall()
        users = db.execute("SELECT run_id, user_id FROM run_summaries ORDER BY run_id").fetchall()
    # The refused batch took number 7 and gave it back: b7 is the 7th, not the 8th.
    assert kept == [(5, "b5"), (6, "b6"), (7, "b7")]
    assert users == [("r1", None), ("r2", "alice")]


# -- large batches -----------------------------------------------------------------------------


async def test_a_batch_over_the_variable_limit_is_written_whole_in_order(tmp_path: Path):
    size = 2 * sqlite_module.ROWS_PER_STATEMENT + 7
    assert size * sqlite_module._PARAMS_PER_EVENT > sqlite_module._MAX_VARIABLES
    async with SqliteRunEventStore(tmp_path / "j.db") as store:
        await store.put(**ev())
        records = await store.put_batch(
            [ev(content=i, thread_id=f"t{i % 2}") for i in range(size)] + [ev()]
        )
        assert [r["seq"] for r in records[:4]] == [1, 1, 2, 2]
        assert records[-1]["seq"] == 2
        latest = await store.list_messages("t1", limit=3)
        assert [r["content"] for r in latest] == [i for i in range(size) if i % 2][-3:]
        assert await store.count_messages("t0") + await store.count_messages("t1") == size


async def test_a_batch_over_the_variable_limit_is_atomic(tmp_path: Path):
    path = tmp_path / "j.db"
    size = 2 * sqlite_module.ROWS_PER_STATEMENT + 7
    async with aiosqlite.connect(path, isolation_level=None) as db:
        store = SqliteRunEventStore(db)
        await store.setup()
        # A real SQLite failure in the last chunk, long after the first chunks went in.
        await db.execute_fetchall(
            "CREATE TRIGGER poison BEFORE INSERT ON run_events WHEN NEW.run_id = 'poison' "
            "BEGIN SELECT RAISE(ABORT, 'poisoned'); END"
        )
        batch = [ev(content=i) for i in range(size - 1)] + [ev(run_id="poison")]
        with pytest.raises(sqlite3.IntegrityError, match="poisoned"):
            await store.put_batch(batch)
        assert await store.count_messages(T) == 0
        assert not db.in_transaction
        assert (await store.put(**ev()))["seq"] == 1
        await db.execute_fetchall("DROP TRIGGER poison")
        records = await store.put_batch(batch)
        assert [r["seq"] for r in records] == list(range(2, size + 2))


@pytest.mark.parametrize("isolation_level", [None, ""])
async def test_puts_running_beside_a_failing_large_batch_are_kept(
    tmp_path: Path, isolation_level: str | None
):
    size = sqlite_module.ROWS_PER_STATEMENT + 1
    async with aiosqlite.connect(tmp_path / "j.db", isolation_level=isolation_level) as db:
        store = SqliteRunEventStore(db)
        await store.setup()
        await db.execute_fetchall(
            "CREATE TRIGGER poison BEFORE INSERT ON run_events WHEN NEW.run_id = 'poison' "
            "BEGIN SELECT RAISE(ABORT, 'poisoned'); END"
        )
        await db.commit()
        batch = [ev(content=i) for i in range(size)] + [ev(run_id="poison")]
        results = await asyncio.gather(
            *[store.put(**ev(content=-i)) for i in range(1, 6)],
            store.put_batch(batch),
            *[store.put_batch([ev(content=-i)]) for i in range(6, 11)],
            return_exceptions=True,
        )
        assert isinstance(results[5], sqlite3.IntegrityError)
        kept = await store.list_messages(T, limit=100)
        assert [r["seq"] for r in kept] == list(range(1, 11))
        assert sorted(r["content"] for r in kept) == list(range(-10, 0))


# -- query plans -------------------------------------------------------------------------------


def read_calls(
    store: SqliteRunEventStore, user: str | None
) -> list[tuple[str, Callable[[], Awaitable[Any]]]]:
    """Every read path, each with the index it must search (scoped reads when ``user``)."""
    by_user = "run_events_thread_user_category" if user else "run_events_thread_category"
    return [
        (by_user, lambda: store.list_messages(T, user_id=user)),
        (by_user, lambda: store.list_messages(T, before_seq=4, user_id=user)),
        (by_user, lambda: store.list_messages(T, after_seq=2, before_seq=9, user_id=user)),
        ("run_events_thread_run ", lambda: store.list_messages_by_run(T, "r1", user_id=user)),
        (
            "run_events_thread_run ",
            lambda: store.list_messages_by_run(T, "r1", before_seq=3, user_id=user),
        ),
        ("run_events_thread_run ", lambda: store.list_events(T, "r1", user_id=user)),
        (
            "run_events_thread_run ",
            lambda: store.list_events(T, "r1", event_types=["a", "b"], user_id=user),
        ),
        (
            "run_events_thread_run ",
            lambda: store.list_events(T, "r1", event_types=list("abcd" * 40), user_id=user),
        ),
        (
            "run_events_thread_run_task",
            lambda: store.list_events(T, "r1", task_id="k", user_id=user),
        ),
        (
            "run_events_thread_run ",
            lambda: store.get_last_visible_ai_seq_by_run(T, ["r1", "r2"], user_id=user),
        ),
        ("run_message_counts USING PRIMARY KEY", lambda: store.count_messages(T, user_id=user)),
        ("sqlite_autoindex_run_summaries_1", lambda: store.get_run_summary(T, "r1", user_id=user)),
        ("sqlite_autoindex_run_summaries_1", lambda: store.list_run_summaries(T, user_id=user)),
    ]


@pytest.mark.parametrize("user", [None, "u1"])
async def test_read_queries_search_their_index_and_never_scan(tmp_path: Path, user: str | None):
    async with aiosqlite.connect(tmp_path / "j.db", isolation_level=None) as db:
        store = SqliteRunEventStore(db)
        await store.put_batch(
            [ev(metadata={"task_id": "k"}, user_id="u1") for _ in range(5)]
            + [ev(run_id="r2") for _ in range(5)]
        )
        await store.put_run_summary(RunSummary(thread_id=T, run_id="r1"))
        statements: list[str] = []
        await db.set_trace_callback(statements.append)
        for index, call in read_calls(store, user):
            statements.clear()
            await call()
            (sql,) = statements
            plan = [row[3] for row in await db.execute_fetchall(f"EXPLAIN QUERY PLAN {sql}")]
            assert not [d for d in plan if d.startswith("SCAN run_")], (sql, plan)
            assert any(d.startswith("SEARCH run_") and index in d for d in plan), (sql, plan)
        await db.set_trace_callback(None)


@pytest.mark.parametrize("size", [1, 3000, sqlite_module.ROWS_PER_STATEMENT + 1])
async def test_a_cancelled_write_is_committed_when_the_cancellation_is_seen(tmp_path, size):
    """Another connection, not the store's own queue, sees the whole write at once."""
    path = tmp_path / "j.db"
    async with SqliteRunEventStore(path) as store:
        write = store.put(**ev()) if size == 1 else store.put_batch([ev()] * size)
        task = asyncio.ensure_future(write)
        for _ in range(3):  # into the write: normalised, handed to the worker thread
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with sqlite3.connect(path) as other:
            assert other.execute("SELECT count(*) FROM run_events").fetchone() == (size,)


async def test_a_setup_cancelled_while_waiting_for_the_write_lock_leaves_it_free(tmp_path):
    # Writes are shielded; setup is not. On a connection the store does not own (and so does
    # not close on failure), what setup began when the cancel came must end and unlock.
    path = tmp_path / "j.db"
    with contextlib.closing(sqlite3.connect(path)) as empty:
        empty.execute("PRAGMA journal_mode = WAL")  # no schema: setup needs the write lock
    holder = sqlite3.connect(path, isolation_level=None, timeout=0)
    async with aiosqlite.connect(path, isolation_level=None) as db:
        holder.execute("BEGIN IMMEDIATE")  # the store's BEGIN now waits for this lock
        task = asyncio.ensure_future(SqliteRunEventStore(db).setup())
        for _ in range(20):
            await asyncio.sleep(0.01)
        for _ in range(3):  # as anyio's timeouts do: cancelled again and again
            task.cancel()
            await asyncio.sleep(0.02)
        holder.rollback()  # the waiting BEGIN gets the lock now, and must give it back
        with pytest.raises(asyncio.CancelledError):
            await task
        # What the store began goes on in a task of its own: wait for every such task.
        await asyncio.gather(*asyncio.all_tasks() - {asyncio.current_task()})
        await asyncio.sleep(0.3)  # ample for SQLite's busy handler to retry a stray BEGIN
        assert not db.in_transaction
        holder.execute("BEGIN IMMEDIATE")  # free: with timeout=0 a held lock would raise
        holder.rollback()
    holder.close()


async def test_setup_waits_for_another_connection_holding_the_write_lock(tmp_path):
    # SQLite refuses a switch to WAL at once (no busy wait) while another connection of a
    # file not yet in WAL mode holds its write lock, as another process setting up may.
    path = tmp_path / "j.db"
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("CREATE TABLE unrelated (x)")
    other.execute("BEGIN IMMEDIATE")
    store = SqliteRunEventStore(path)
    setup = asyncio.ensure_future(store.setup())
    await asyncio.sleep(0.2)
    assert not setup.done()
    other.rollback()
    other.close()
    await setup
    await store.put(**ev())
    assert [e["seq"] for e in await store.list_messages(T)] == [1]
    await store.close()


async def test_a_relative_path_stays_where_it_was_after_a_chdir(tmp_path: Path, monkeypatch):
    # The store reopens its file after close() (a journal's own store does, between runs).
    monkeypatch.chdir(tmp_path)
    store = SqliteRunEventStore("journal.db")
    await store.setup()
    await store.put(**ev(content="before"))
    await store.close()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    await store.setup()
    await store.put(**ev(content="after"))
    events = await store.list_events(T, "r1")
    await store.close()
    assert [(e["seq"], e["content"]) for e in events] == [(1, "before"), (2, "after")]
    assert not (tmp_path / "elsewhere" / "journal.db").exists()


# -- the counters the triggers keep --------------------------------------------------------

#: What run_threads must hold, recomputed from run_events: per thread, over every user ('')
#: and per user, its last row's seq, time and run, and how many runs it has.
EXPECTED_THREADS = """
    WITH keyed AS (
        SELECT '' AS user_key, thread_id, run_id, seq, created_at FROM run_events
        UNION ALL
        SELECT user_id, thread_id, run_id, seq, created_at FROM run_events
        WHERE user_id IS NOT NULL
    )
    SELECT k.user_key, k.thread_id, k.seq, k.created_at,
        (SELECT count(DISTINCT run_id) FROM keyed
         WHERE user_key = k.user_key AND thread_id = k.thread_id),
        k.run_id
    FROM keyed AS k
    WHERE k.seq = (SELECT max(seq) FROM keyed
                   WHERE user_key = k.user_key AND thread_id = k.thread_id)
    ORDER BY 1, 2
"""
EXPECTED_MESSAGES = """
    SELECT thread_id, coalesce(user_id, ''), count(*) FROM run_events
    WHERE category = 'message' GROUP BY 1, 2 ORDER BY 1, 2
"""


def assert_counters_exact(db: sqlite3.Connection) -> None:
    """run_threads (with each thread's last run), run_message_counts and run_thread_seq hold
    what run_events says."""
    assert (
        db.execute(
            "SELECT user_key, thread_id, last_seq, last_event_at, run_count, last_run_id "
            "FROM run_threads ORDER BY 1, 2"
        ).fetchall()
        == db.execute(EXPECTED_THREADS).fetchall()
    )
    assert (
        db.execute(
            "SELECT thread_id, user_key, messages FROM run_message_counts WHERE messages > 0 "
            "ORDER BY 1, 2"
        ).fetchall()
        == db.execute(EXPECTED_MESSAGES).fetchall()
    )
    # The counter never falls below a row's seq (deletes leave it where it was).
    assert not db.execute(
        "SELECT 1 FROM run_events AS e JOIN run_thread_seq AS s USING (thread_id) "
        "WHERE e.seq > s.last_seq"
    ).fetchall()


def insert_raw(db: sqlite3.Connection, thread: str, run: str, user: str | None, at: str) -> None:
    """Insert one row as another program would, numbered on from the thread's counter."""
    db.execute(
        "INSERT INTO run_events (thread_id, run_id, seq, event_type, category, content, "
        "metadata, created_at, user_id) VALUES (?1, ?2, coalesce((SELECT last_seq FROM "
        "run_thread_seq WHERE thread_id = ?1), 0) + 1, 'e', 'message', '1', '{}', ?3, ?4)",
        (thread, run, at, user),
    )


def at(second: int) -> str:
    return f"2026-01-02T03:04:{second:02d}.000000+00:00"


async def test_every_writer_keeps_the_thread_list_and_message_counts_exact(tmp_path: Path):
    # The store's batches share a time and mostly a run (the triggers' cheap path); rows of
    # other programs, in any order of runs, users and times, and deletes must agree too.
    path = tmp_path / "j.db"
    async with SqliteRunEventStore(path) as store:
        with sqlite3.connect(path, isolation_level=None) as db:
            for users in ([None] * 3, ["alice", None, "bob"], ["alice"] * 3):
                batch = [ev(run, user_id=user) for run in ("r1", "r1", "r2") for user in users]
                await store.put_batch(batch)
                assert_counters_exact(db)
            await store.put(**ev("r1", created_at=at(1), user_id="bob"))
            steps = [
                ("a", "r1", None, at(5)),
                ("a", "r1", None, at(5)),
                ("a", "r2", "alice", at(5)),
                ("a", "r1", "alice", at(5)),  # an earlier run, back after another
                ("a", "r1", "alice", at(4)),  # an earlier time
                ("b", "r9", "bob", at(3)),
                (T, "r2", None, at(6)),
            ]
            for thread, run, user, when in steps:
                insert_raw(db, thread, run, user, when)
                assert_counters_exact(db)
            db.execute("DELETE FROM run_events WHERE thread_id = 'a' AND seq = 5")
            assert_counters_exact(db)
            db.execute("DELETE FROM run_events WHERE thread_id = 'a' AND user_id = 'alice'")
            assert_counters_exact(db)
            insert_raw(db, "a", "r2", "alice", at(5))  # alice's run again: it counts anew
            await store.put_batch([{**ev("r3"), "thread_id": "a"}] * 2)
            assert_counters_exact(db)
            await store.delete_by_run(T, "r2")
            await store.delete_by_thread("b")
            assert_counters_exact(db)
            await store.put_batch([ev("r2"), ev("r2", user_id="alice")])
            assert_counters_exact(db)


SHARED = ("thread_id", "run_id", "user_id")


async def test_a_batch_of_many_threads_is_left_to_the_trigger(tmp_path: Path):
    # A booking statement costs about what the trigger does for two rows: a batch needing
    # more than one per two rows is not booked. Either way the counters come out exact.
    path = tmp_path / "j.db"
    async with SqliteRunEventStore(path) as store:
        many = [{**ev(f"r{i}", user_id=f"u{i}"), "thread_id": f"t{i}"} for i in range(6)]
        await store.put_batch(many)
        one_run = [ev("r1", user_id="alice") for _ in range(8)]
        await store.put_batch(one_run)
        with contextlib.closing(sqlite3.connect(path)) as db:
            rows = db.execute("SELECT thread_id, booked FROM run_events ORDER BY id").fetchall()
            assert rows == [(f"t{i}", None) for i in range(6)] + [(T, 1)] * 8
            assert_counters_exact(db)


async def test_a_booked_batch_that_fails_moves_no_counter(tmp_path: Path):
    # A batch of several INSERT statements whose last row is refused: its rows and its
    # bookings go together. The same batch then goes in whole, booked.
    path = tmp_path / "j.db"
    size = 2 * sqlite_module.ROWS_PER_STATEMENT + 7
    batch = [ev(f"r{i % 3}", content=i, user_id=[None, "bob"][i % 2]) for i in range(size)]
    tables = ("run_events", "run_threads", "run_message_counts", "run_thread_seq")
    async with SqliteRunEventStore(path) as store:
        await store.put_batch([ev("r0", user_id="alice")] * 3)
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:

            def snapshot() -> list[list[Any]]:
                return [db.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall() for t in tables]

            before = snapshot()
            db.execute(
                "CREATE TRIGGER poison BEFORE INSERT ON run_events WHEN NEW.run_id = 'poison' "
                "BEGIN SELECT RAISE(ABORT, 'poisoned'); END"
            )
            with pytest.raises(sqlite3.IntegrityError, match="poisoned"):
                await store.put_batch([*batch, ev("poison")])
            assert snapshot() == before
            db.execute("DROP TRIGGER poison")
            await store.put_batch(batch)
            assert_counters_exact(db)
            (booked,) = db.execute("SELECT count(*) FROM run_events WHERE booked = 1").fetchone()
            assert booked == size  # the first three rows needed four bookings: not booked


@pytest.mark.parametrize("given", [False, True], ids=["own", "given"])
@pytest.mark.parametrize("seed", range(4))
async def test_booked_batches_keep_the_counters_exact_among_other_writers(
    tmp_path: Path, seed: int, given: bool
):
    # On its own connection the store books its batches' counters per batch (on a caller's it
    # leaves them to the trigger), the trigger books every other row: in any mix of threads,
    # runs, users, categories and times, interleaved with other programs' rows and with
    # deletes, both must leave what a recount from the rows gives.
    rng = random.Random(seed)
    path = tmp_path / "j.db"

    def event() -> dict[str, Any]:
        return {
            "thread_id": rng.choice("ab"),
            "run_id": rng.choice(["r1", "r2", "r3"]),
            "event_type": "e",
            "category": rng.choice(["message", "trace"]),
            "user_id": rng.choice([None, "alice", "bob"]),
            "created_at": at(rng.randrange(4)),
        }

    def stretch(size: int) -> list[dict[str, Any]]:
        """``size`` events of one thread, run and user (their categories and times vary)."""
        first = event()
        return [{**event(), **{k: first[k] for k in SHARED}} for _ in range(size)]

    async with contextlib.AsyncExitStack() as stack:
        conn = await stack.enter_async_context(aiosqlite.connect(path)) if given else None
        store = await stack.enter_async_context(SqliteRunEventStore(conn or path))
        db = stack.enter_context(contextlib.closing(sqlite3.connect(path, isolation_level=None)))
        for _ in range(60):
            step = rng.random()
            if step < 0.5:
                kind = rng.random()
                if kind < 0.3:  # rows of many keys: mostly left to the trigger
                    batch = [event() for _ in range(rng.randint(1, 12))]
                elif kind < 0.6:  # as a journal writes: one thread, run and user
                    batch = stretch(rng.randint(1, 12))
                else:  # stretches of one thread, run and user each, booked once per stretch
                    batch = [
                        e for _ in range(rng.randint(2, 4)) for e in stretch(rng.randint(4, 8))
                    ]
                await store.put_batch(batch)
            elif step < 0.65:
                await store.put(**event())
            elif step < 0.85:
                e = event()
                insert_raw(db, e["thread_id"], e["run_id"], e["user_id"], e["created_at"])
            elif step < 0.95:
                await store.delete_by_run(rng.choice("ab"), rng.choice(["r1", "r2", "r3"]))
            else:
                db.execute(
                    "DELETE FROM run_events WHERE thread_id = ? AND seq = "
                    "(SELECT max(seq) FROM run_events WHERE thread_id = ?)",
                    (rng.choice("ab"),) * 2,
                )
            assert_counters_exact(db)
        (booked,) = db.execute("SELECT count(*) FROM run_events WHERE booked = 1").fetchone()
        assert bool(booked) is not given


@pytest.mark.parametrize("before", range(3, len(MIGRATIONS) - 1))
async def test_an_upgrade_keeps_the_counters_of_a_database_filled_before_it(
    tmp_path: Path, before: int
):
    # A database with the thread list (version 3 on), filled by the triggers of its version.
    path = tmp_path / "j.db"
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute(sqlite_module.SCHEMA.create_table)
        for version in range(before + 1):
            for statement in MIGRATIONS[version]:
                db.execute(statement)
            db.execute(sqlite_module.SCHEMA.record_version, (version,))
        for thread, run, user, when in [
            ("a", "r1", "alice", at(1)),
            ("a", "r2", None, at(2)),
            ("a", "r2", "bob", at(2)),
            ("a", "r1", "alice", at(3)),
            ("b", "r1", None, at(4)),
            ("b", "r1", None, at(4)),
        ]:
            insert_raw(db, thread, run, user, when)
        db.execute("DELETE FROM run_events WHERE thread_id = 'a' AND seq = 4")
    async with SqliteRunEventStore(path) as store:
        with sqlite3.connect(path, isolation_level=None) as db:
            assert db.execute("SELECT max(v) FROM run_event_migrations").fetchall() == [
                (len(MIGRATIONS) - 1,)
            ]
            assert_counters_exact(db)
            # The same run and time again (the cheap path), then a new run, then a delete.
            await store.put_batch([{**ev("r2"), "thread_id": "a", "created_at": at(2)}] * 2)
            await store.put_batch([{**ev("r1"), "thread_id": "b", "created_at": at(4)}] * 2)
            assert_counters_exact(db)
            await store.put_batch([{**ev("r3", user_id="alice"), "thread_id": "a"}])
            await store.delete_by_run("a", "r2")
            assert_counters_exact(db)
            threads = await store.list_threads()
            assert [(t.thread_id, t.run_count) for t in threads] == [("a", 2), ("b", 1)]


# -- a file that changes under an open store -------------------------------------------------


def block_wal_index(path: Path) -> Callable[[], None]:
    """Put a directory where SQLite makes the ``-shm`` WAL index: it opens that read-only, and so
    the database (root too). Returns what takes it away."""
    shm = Path(f"{path}-shm")
    shm.mkdir()
    return shm.rmdir


def block_file(path: Path) -> Callable[[], None]:
    """Make the database file unwritable, so SQLite opens it read-only; returns the undo."""
    if os.geteuid() != 0:
        path.chmod(0o444)
        return lambda: path.chmod(0o644)
    # Root writes whatever the mode bits say; an immutable file it cannot.
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", path], capture_output=True).returncode:
        pytest.skip("as root a file is unwritable only immutable, and chattr +i failed here")
    return lambda: subprocess.run([chattr, "-i", path], check=True)


@pytest.mark.parametrize("block", [block_wal_index, block_file], ids=["wal-index", "file"])
async def test_a_file_sqlite_opened_read_only_is_reopened_once_it_can_be_written(
    tmp_path: Path, block: Callable[[Path], Callable[[], None]]
):
    path = tmp_path / "j.db"
    async with SqliteRunEventStore(path) as store:
        await store.put(**ev(content="before"))
    unblock = block(path)
    store = SqliteRunEventStore(path)
    try:
        await store.setup()  # it reads: SQLite opened the file read-only without a word
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            await store.put(**ev(content="refused"))
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            await store._put_journal_batch([ev(content="batch")], [], batch_id="b1")
    finally:
        unblock()
    # The connection opened read-only is replaced: the retries are written, once each.
    assert (await store.put(**ev(content="after")))["seq"] == 2
    assert await store._put_journal_batch([ev(content="batch")], [], batch_id="b1")
    await store.close()
    assert thread_rows(path) == [(1, '"before"'), (2, '"after"'), (3, '"batch"')]


async def test_a_journal_on_a_file_sqlite_opened_read_only_writes_each_event_once_later(
    tmp_path: Path,
):
    path = tmp_path / "j.db"
    async with SqliteRunEventStore(path) as store:
        await store.put(**ev())
    unblock = block_wal_index(path)
    store = SqliteRunEventStore(path)
    await store.setup()
    journal = RunJournal(run_id="r", thread_id=T, event_store=store)
    for name in "abc":
        journal.record_middleware("guardrail", name=name, hook="h", action="allow", changes={})
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        await journal.flush()  # the events stay buffered
    unblock()
    await journal.flush()
    assert [e["content"]["name"] for e in await store.list_events(T, "r")] == ["a", "b", "c"]
    await store.close()


async def test_a_given_connection_sqlite_opened_read_only_is_kept_with_its_error(tmp_path):
    path = tmp_path / "j.db"
    async with SqliteRunEventStore(path) as store:
        await store.put(**ev())
    unblock = block_wal_index(path)
    async with aiosqlite.connect(path) as db:
        store = SqliteRunEventStore(db)
        await store.setup()
        unblock()
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            await store.put(**ev())  # the caller's connection: the store never replaces it
        assert store._given is db
    assert len(thread_rows(path)) == 1


@pytest.mark.parametrize("files", [("",), ("", "-wal", "-shm")], ids=["file", "with-wal"])
async def test_a_file_deleted_under_an_open_store_is_made_anew(tmp_path, files):
    path = tmp_path / "j.db"
    async with SqliteRunEventStore(path) as store:
        await store.put_batch([ev(content="gone"), ev(content="gone")])
        for suffix in files:
            os.remove(f"{path}{suffix}")
        assert [e["seq"] for e in await store.put_batch([ev(content="new")])] == [1]
        assert (await store.put(**ev(content="one")))["seq"] == 2
        assert thread_rows(path) == [(1, '"new"'), (2, '"one"')]  # seen while the store is open
    assert thread_rows(path) == [(1, '"new"'), (2, '"one"')]


@pytest.mark.parametrize("files", [("",), ("", "-wal", "-shm"), "replaced"])
async def test_two_stores_of_a_process_reopening_a_new_file_keep_each_others_rows(tmp_path, files):
    """The second store's old connection shares the -wal at the path with the first store's
    new one unless the first gave the new file sidecars of its own."""
    path, other = tmp_path / "j.db", tmp_path / "other.db"
    async with SqliteRunEventStore(other) as store:
        await store.put(**ev(content="theirs"))
    first, second = SqliteRunEventStore(path), SqliteRunEventStore(path)
    async with first, second:
        await first.put_batch([ev(content="old")] * 3)
        await second.list_events(T, "r1")
        if files == "replaced":
            os.replace(other, path)
        else:
            for suffix in files:
                os.remove(f"{path}{suffix}")
        for n in range(3):
            await first.put(**ev(content=f"first {n}"))
        await second.put(**ev(content="second"))
    contents = [content for _, content in thread_rows(path)]
    mine = ['"first 0"', '"first 1"', '"first 2"', '"second"']
    assert contents == (['"theirs"', *mine] if files == "replaced" else mine)
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]


def test_two_connections_reopening_a_moved_file_at_once_keep_the_new_files_sidecars(
    tmp_path, monkeypatch
):
    """The slower one must not take the -wal the faster one made for the new file for its own
    (it removed it: the new file's rows were lost to every other reader). Each connection is
    used on a thread of its own, as each store's is."""
    path = str(tmp_path / "j.db")
    table = "CREATE TABLE IF NOT EXISTS t (x)"

    def opened() -> Any:
        connection = sqlite_module._Connection(path, read_only=False)
        connection.run(lambda: sqlite_module._statement(table), True)
        return connection

    opened_first, moved, unlinking = threading.Event(), threading.Event(), threading.Event()

    def reopen_slowly() -> None:
        connection = opened()
        opened_first.set()
        moved.wait(10)
        connection._reopen(moved=True)
        connection.close()

    unlink = os.unlink

    def slow_unlink(name: Any, *args: Any, **kwargs: Any) -> None:
        if threading.current_thread().name == "slow":
            unlinking.set()
            time.sleep(0.3)  # its checkpoint of the old -wal took a while, say
        unlink(name, *args, **kwargs)

    slow = threading.Thread(target=reopen_slowly, name="slow")
    slow.start()
    opened_first.wait(10)
    fast = opened()
    os.rename(path, f"{path}.old")
    monkeypatch.setattr(sqlite_module.os, "unlink", slow_unlink)
    moved.set()
    unlinking.wait(10)
    fast._reopen(moved=True)
    fast.run(lambda: sqlite_module._statement(table), True)
    insert = "INSERT INTO t VALUES ('fast')"
    fast.run(lambda: sqlite_module._write_transaction(sqlite_module._statement(insert)), True)
    slow.join(10)
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        assert db.execute("SELECT x FROM t").fetchall() == [("fast",)]
    fast.close()


def test_a_store_reopening_one_file_does_not_wait_for_another_files_reopening(tmp_path):
    """Reopens are one at a time per file: another file's may wait on a busy database."""
    busy, path = str(tmp_path / "busy.db"), str(tmp_path / "free.db")
    reopened = threading.Event()

    def reopen() -> None:  # on one thread, as a store's connection is used
        connection = sqlite_module._Connection(path, read_only=False)
        connection.run(lambda: sqlite_module._statement("SELECT 1"), False)
        os.rename(path, f"{path}.old")
        connection._reopen(moved=True)
        connection.close()
        reopened.set()

    with sqlite_module._reopening(busy):  # held as long as that file's reopen waits
        thread = threading.Thread(target=reopen)
        thread.start()
        thread.join(10)
        assert reopened.is_set()


async def test_a_file_replaced_under_an_open_store_takes_the_writes_and_keeps_its_own(tmp_path):
    path, other = tmp_path / "j.db", tmp_path / "other.db"
    async with SqliteRunEventStore(other) as store:
        await store.put(**ev(content="theirs"))
    async with SqliteRunEventStore(path) as store:
        await store.put_batch([ev(content="old")] * 3)
        os.replace(other, path)
        # Numbered on from the new file's counter; the old file's WAL is not read into it.
        assert (await store.put(**ev(content="ours")))["seq"] == 2
        assert thread_rows(path) == [(1, '"theirs"'), (2, '"ours"')]
    assert thread_rows(path) == [(1, '"theirs"'), (2, '"ours"')]
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
