"""Stores opened ``read_only``: every backend refuses writes; SQLite files and JSONL directories
are read on storage the reading process truly cannot write."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deerflow_journal import (
    JsonlRunEventStore,
    ReadOnlyStoreError,
    RunEventStore,
    RunJournal,
    RunSummary,
    SqliteRunEventStore,
    SyncStore,
    open_store,
)
from deerflow_journal.stores.jsonl_paths import ThreadPaths
from tests.backends import Backend, PostgresBackend
from tests.test_jsonl_store import KILLED_JOURNAL_WRITER, ROOT, _crash, run_python

EV = {
    "thread_id": "t",
    "run_id": "r1",
    "event_type": "llm.ai.response",
    "category": "message",
    "content": "hi",
}
WRITES = [
    "put",
    "put_batch",
    "put_if_absent",
    "delete_by_thread",
    "delete_by_run",
    "put_run_summary",
    "journal batch",
]


async def attempt_writes(store: RunEventStore) -> list[str]:
    """Try every write and delete; return the names of those refused as read-only."""
    summary = RunSummary(thread_id="t", run_id="r9")
    calls = {
        "put": lambda: store.put(**EV),
        "put_batch": lambda: store.put_batch([EV]),
        "put_if_absent": lambda: store.put_if_absent(**{**EV, "run_id": "r9"}),
        "delete_by_thread": lambda: store.delete_by_thread("t"),
        "delete_by_run": lambda: store.delete_by_run("t", "r1"),
        "put_run_summary": lambda: store.put_run_summary(summary),
        "journal batch": lambda: store._put_journal_batch([EV], [summary.to_json_dict()]),
    }
    refused = []
    for name, call in calls.items():
        try:
            await call()
        except ReadOnlyStoreError as exc:
            assert "read_only" in str(exc)
            refused.append(name)
    return refused


def snapshot(base: Path) -> dict[str, bytes | None]:
    """Every path under ``base`` with its bytes (``None`` for a directory)."""
    return {
        str(p.relative_to(base)): p.read_bytes() if p.is_file() else None
        for p in sorted(base.rglob("*"))
    }


# -- every backend --------------------------------------------------------------------------


async def test_a_read_only_store_refuses_every_write_and_delete_and_still_reads(backend):
    if backend.persistent:
        async with backend.make() as writer:
            await writer.put_batch([EV, {**EV, "content": "again"}])
            await writer.put_run_summary(RunSummary(thread_id="t", run_id="r1", status="success"))
    store = open_store(backend.url(), read_only=True)
    assert store.read_only and issubclass(ReadOnlyStoreError, PermissionError)
    assert await attempt_writes(store) == WRITES  # refused before the store is even set up
    async with store:
        assert await attempt_writes(store) == WRITES
        contents = [e["content"] for e in await store.list_events("t", "r1")]
        summaries = [(s.run_id, s.status) for s in await store.list_run_summaries("t")]
        if backend.persistent:
            assert contents == ["hi", "again"]
            assert summaries == [("r1", "success")]
            assert await store.count_messages("t") == 2
        else:
            assert (contents, summaries) == ([], [])
    if backend.persistent:
        async with backend.make() as writer:  # nothing changed
            assert [e["seq"] for e in await writer.list_events("t", "r1")] == [1, 2]
            assert [s.run_id for s in await writer.list_run_summaries("t")] == ["r1"]
            assert await writer.get_run_summary("t", "r9") is None


async def test_a_journal_refuses_a_read_only_store(backend):
    """Every write would be refused: kept and retried, its runs ended in a spill file. Also
    behind a facade, before the facade opens a database that may not even be there."""
    with pytest.raises(ValueError, match="read_only"):
        RunJournal(event_store=open_store(backend.url(), read_only=True))
    facade = SyncStore(open_store(backend.url(), read_only=True))
    try:
        with pytest.raises(ValueError, match="read_only"):
            RunJournal(event_store=facade)
    finally:
        facade.close()


async def test_a_read_only_store_where_no_journal_is_says_so_and_creates_nothing(
    persistent_backend: Backend,
):
    for _ in range(2):  # the second time proves the first created no journal
        store = open_store(persistent_backend.url(), read_only=True)
        with pytest.raises((FileNotFoundError, RuntimeError), match=r"no (JSONL |SQLite )?journal"):
            await store.setup()
    assert list(persistent_backend.tmp_path.iterdir()) == []


async def test_a_read_only_store_sees_what_a_writer_writes_and_deletes_later(
    persistent_backend: Backend,
):
    async with persistent_backend.make() as writer:
        await writer.put(**EV)
        async with open_store(persistent_backend.url(), read_only=True) as store:
            assert await store.count_messages("t") == 1
            await writer.put_batch([{**EV, "run_id": "r2"}, {**EV, "run_id": "r2"}])
            await writer.put_run_summary(RunSummary(thread_id="t", run_id="r2"))
            assert [e["seq"] for e in await store.list_messages("t")] == [1, 2, 3]
            assert [s.run_id for s in await store.list_run_summaries("t")] == ["r2"]
            await writer.delete_by_run("t", "r2")
            assert [e["seq"] for e in await store.list_messages("t")] == [1]
            assert await store.list_run_summaries("t") == []


# -- JSONL: a read-only reader cannot recover, so it leaves out unfinished batches -----------


async def test_a_read_only_jsonl_store_does_not_guess_past_an_unreadable_state_file(tmp_path):
    # Only a writer can rebuild it (from the lines' seq); a reader must not make one up.
    async with JsonlRunEventStore(tmp_path) as writer:
        await writer.put(**EV)
    ThreadPaths(tmp_path, "t").state.write_bytes(b"\0" * 40)
    async with JsonlRunEventStore(tmp_path, read_only=True) as store:
        with pytest.raises(OSError, match="unreadable"):
            await store.count_messages("t")
        with pytest.raises(OSError, match="unreadable"):
            await store.list_run_summaries("t")


@pytest.mark.slow
async def test_read_only_jsonl_reads_leave_out_a_journal_batch_a_dead_writer_left(tmp_path):
    async with JsonlRunEventStore(tmp_path) as writer:
        await writer._put_journal_batch(
            [{**EV, "content": "before"}], [RunSummary(thread_id="t", run_id="r0").to_json_dict()]
        )
    assert run_python(KILLED_JOURNAL_WRITER, str(tmp_path)) == 9
    before = snapshot(tmp_path)
    async with JsonlRunEventStore(tmp_path, read_only=True) as store:
        for _ in range(2):  # the cache must not take the batch in on a later read either
            assert [e["content"] for e in await store.list_messages("t")] == ["before"]
            assert await store.list_events("t", "r1", event_types=["run.end"]) == []
            assert await store.get_run_summary("t", "r1") is None
            assert [s.run_id for s in await store.list_run_summaries("t")] == ["r0"]
    assert snapshot(tmp_path) == before  # no rollback, no lock file: a writer rolls it back
    async with JsonlRunEventStore(tmp_path) as writer:
        assert await writer.get_run_summary("t", "r1") is None
    assert snapshot(tmp_path) != before


@pytest.mark.slow
@pytest.mark.parametrize(("point", "kept"), [("second-append", False), ("commit", True)])
async def test_read_only_jsonl_reads_see_a_batch_spanning_threads_only_past_its_commit_point(
    tmp_path, point, kept
):
    _crash(tmp_path, point, [{**EV, "thread_id": "a"}, {**EV, "thread_id": "b"}])
    before = snapshot(tmp_path)
    async with JsonlRunEventStore(tmp_path, read_only=True) as store:
        counts = [await store.count_messages(t) for t in ("a", "b")]
    assert counts == ([1, 1] if kept else [0, 0])
    assert snapshot(tmp_path) == before


# -- storage the reader truly cannot write ------------------------------------------------------

READER = """
import asyncio, json, os, sys
from deerflow_journal import open_store
from tests.test_store_read_only import attempt_writes

url, location = sys.argv[1], sys.argv[2]

async def main():
    store = open_store(url, read_only=True)
    refused = await attempt_writes(store)
    async with store:
        seen = {
            "events": [e["content"] for e in await store.list_events("t", "r1")],
            "messages": await store.count_messages("t"),
            "summaries": [s.run_id for s in await store.list_run_summaries("t")],
            "r1": (await store.get_run_summary("t", "r1")) is not None,
        }
        refused += await attempt_writes(store)
    print(json.dumps({"writable": os.access(location, os.W_OK), "seen": seen, "refused": refused}))

asyncio.run(main())
"""


class ReadOnlyStorage:
    """A directory made read-only for a reader process: root ignores permissions, so as root
    the reader runs as ``nobody``; any other user takes the write bits off its own files."""

    def __init__(self) -> None:
        self.root = os.geteuid() == 0
        # Not under pytest's own temp dir, which other users cannot enter.
        self.dir = Path(tempfile.mkdtemp(prefix="deerflow-read-only-"))
        self._user = self._nobody() if self.root else None

    def _nobody(self) -> tuple[int, int]:
        try:
            entry = pwd.getpwnam("nobody")
        except KeyError:
            pytest.skip("running as root with no user 'nobody' to read as")
        return entry.pw_uid, entry.pw_gid

    def freeze(self) -> None:
        """Leave the directory readable and not writable for the reader."""
        dir_mode, file_mode = (0o755, 0o644) if self.root else (0o555, 0o444)
        for path in [self.dir, *self.dir.rglob("*")]:
            path.chmod(dir_mode if path.is_dir() else file_mode)

    def read(self, url: str) -> dict[str, Any]:
        """Run ``READER`` on ``url`` as the reader; its report."""
        user: dict[str, Any] = {}
        if self._user is not None:
            uid, gid = self._user
            user = {"user": uid, "group": gid, "extra_groups": []}
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
        try:
            done = subprocess.run(
                [sys.executable, "-c", READER, url, str(self.dir)],
                env=env,
                cwd=self.dir,
                capture_output=True,
                text=True,
                timeout=120,
                **user,
            )
        except PermissionError as exc:  # no right to change user here (a container, say)
            pytest.skip(f"cannot run a process as user 'nobody': {exc}")
        if done.returncode and self.root and "ModuleNotFoundError" in done.stderr:
            pytest.skip(f"user 'nobody' cannot read this checkout: {done.stderr[-300:]}")
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["writable"] is False
        return report

    def thaw(self) -> None:
        """Give the write bits back."""
        for path in [self.dir, *self.dir.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)


@pytest.fixture
def storage() -> Iterator[ReadOnlyStorage]:
    made = ReadOnlyStorage()
    try:
        yield made
    finally:
        made.thaw()
        shutil.rmtree(made.dir)


async def write_journal(store: RunEventStore) -> None:
    await store.put_batch([EV, {**EV, "content": "again"}])
    await store.put_run_summary(RunSummary(thread_id="t", run_id="r0"))


@pytest.mark.slow
@pytest.mark.parametrize("writer_open", [False, True])
async def test_a_read_only_sqlite_store_reads_a_database_it_cannot_write(storage, writer_open):
    # A closed writer leaves no -wal or -shm file (opened immutable); an open one leaves both.
    path = storage.dir / "journal.db"
    writer = SqliteRunEventStore(path)
    await writer.setup()
    try:
        await write_journal(writer)
        if not writer_open:
            await writer.close()
        storage.freeze()
        before = snapshot(storage.dir)
        report = storage.read(f"sqlite:///{path}")
        assert snapshot(storage.dir) == before
    finally:
        storage.thaw()  # the writer removes its -wal and -shm files as it closes
        await writer.close()
    assert report["seen"] == {
        "events": ["hi", "again"],
        "messages": 2,
        "summaries": ["r0"],
        "r1": False,
    }
    assert report["refused"] == WRITES * 2


@pytest.mark.slow
async def test_a_read_only_jsonl_store_reads_a_directory_it_cannot_write(storage):
    async with JsonlRunEventStore(storage.dir) as writer:
        await write_journal(writer)
    # A writer died inside a journal batch of run r1: its event and summary are not committed.
    assert run_python(KILLED_JOURNAL_WRITER, str(storage.dir)) == 9
    storage.freeze()
    before = snapshot(storage.dir)
    report = storage.read(f"jsonl:///{storage.dir}")
    assert snapshot(storage.dir) == before
    assert report["seen"] == {
        "events": ["hi", "again"],
        "messages": 2,
        "summaries": ["r0"],
        "r1": False,
    }
    assert report["refused"] == WRITES * 2


@pytest.mark.postgres
async def test_a_read_only_postgres_store_runs_read_only_sessions(tmp_path, request):
    # The server refuses writes too, should a statement ever get past the store.
    import psycopg

    backend = PostgresBackend(tmp_path, request)
    try:
        async with backend.make() as writer:
            await writer.put(**EV)
        async with open_store(backend.url(), read_only=True) as store:
            async with store._connection() as (_, cur):
                with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                    await cur.execute("DELETE FROM run_events")
            assert await store.count_messages("t") == 1
    finally:
        await backend.cleanup()
