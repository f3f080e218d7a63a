"""Journals keep writing through a PostgreSQL restart, in every way a run can be dispatched.

Each test restarts this module's throwaway server (``initdb`` and ``pg_ctl`` in a temporary
directory, never the shared test server) in the middle of a run, while the journal writes
after every event. A run that ends under a plain ``invoke`` must return only once its events
are stored: the wait timeout is far above any write, and a run end that gave up instead is
caught by its events missing from the store and by the ERROR it logs. Then every run must be
stored exactly once, and no journal write may have failed.
"""

from __future__ import annotations

import asyncio
import glob
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from langchain_core.tools import BaseTool, tool
from langgraph.graph.state import CompiledStateGraph
from psycopg_pool import AsyncConnectionPool

from deerflow_journal import PostgresRunEventStore, RunJournal
from deerflow_journal.journal.loops import background_loop
from deerflow_journal.journal.writer import JournalWriter
from tests.journal.agents import ONE_TOOL_CALL_SEQUENCE, QUESTION, agent_graph, ai, scripted

pytestmark = pytest.mark.postgres

ANSWER_SEQUENCE = ["run.start", "llm.human.input", "llm.ai.response", "run.end"]
#: Far above any write here: a run end that returns before it timed out.
WAIT_TIMEOUT = 60.0
#: A small cluster made fast: no locale, no fsync.
INITDB_OPTIONS = ("-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale", "--no-sync")


def _postgres_bindir() -> Path | None:
    """Where ``initdb`` and ``pg_ctl`` are: on PATH, else Debian's newest version directory."""
    found = shutil.which("initdb")
    if found is not None and shutil.which("pg_ctl") is not None:
        return Path(found).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_version_key)
    return Path(versions[-1]).parent if versions else None


def _version_key(path: str) -> tuple[int, ...]:
    return tuple(int(part) for part in Path(path).parts[-3].split(".") if part.isdigit())


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ThrowawayServer:
    """A PostgreSQL server in a temporary directory, which tests may restart."""

    def __init__(self, bindir: Path, user: str | None) -> None:
        self.bindir = bindir
        self.user = user  # who runs it when we are root (PostgreSQL refuses root)
        self.root = Path(tempfile.mkdtemp(prefix="deerflow-journal-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        if self.user is not None:
            shutil.chown(self.root, user=self.user)
        self._run("initdb", "-D", self.data, *INITDB_OPTIONS)
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(
                f"port = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.root}'\nfsync = off\n"
            )
        self._run("pg_ctl", "-D", self.data, "-l", self.root / "log", "-w", "start")

    def _run(self, program: str, *args: Any, check: bool = True) -> None:
        command = [str(self.bindir / program), *map(str, args)]
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        done = subprocess.run(
            command, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120
        )
        if check and done.returncode:
            raise RuntimeError(f"{' '.join(command)} failed: {done.stdout}{done.stderr}")

    def started_at(self) -> Any:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            return conn.execute("SELECT pg_postmaster_start_time()").fetchone()

    def restart(self) -> None:
        """Restart the server (every connection to it is closed) and wait until it answers."""
        before = self.started_at()
        self._run("pg_ctl", "-D", self.data, "-l", self.root / "log", "-m", "fast", "-w", "restart")
        assert self.started_at() != before

    def schema_dsn(self) -> str:
        """The DSN of a new, empty schema."""
        schema = f"t_{uuid.uuid4().hex}"
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        return f"{self.dsn}?options={quote(f'-csearch_path={schema}', safe='')}"

    def remove(self) -> None:
        self._run("pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop", check=False)
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def server() -> Iterator[ThrowawayServer]:
    """A server of this module's own, which it may restart (CI only: it runs initdb, and in
    CI a missing tool fails the tests, since they must run there)."""
    if os.environ.get("CI") != "true":
        pytest.skip(
            "restarts a PostgreSQL server, so it starts a throwaway one with initdb and "
            "pg_ctl: runs with CI=true only"
        )
    bindir = _postgres_bindir()
    if bindir is None:
        pytest.fail("no initdb and pg_ctl (PATH, /usr/lib/postgresql/*/bin) to start a server")
    user = None
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        import pwd

        user = "postgres"
        try:
            pwd.getpwnam(user)
        except KeyError:
            pytest.fail("running as root without a postgres user to run a throwaway server")
        if shutil.which("runuser") is None:
            pytest.fail("running as root without runuser to start a throwaway server")
    made = ThrowawayServer(bindir, user)
    try:
        made.start()
        yield made
    finally:
        made.remove()


@pytest.fixture
def dsn(server: ThrowawayServer) -> str:
    """A fresh schema on the restartable server."""
    return server.schema_dsn()


@pytest.fixture(autouse=True)
def strict_journal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Journal errors fail the run, and a blocking run end waits far longer than any write."""
    monkeypatch.setattr(RunJournal, "raise_error", True)
    monkeypatch.setattr(JournalWriter, "wait_timeout", WAIT_TIMEOUT)


@pytest.fixture
async def app_store(request: pytest.FixtureRequest, dsn: str) -> AsyncIterator[Any]:
    """A store set up on the test's (the application's) loop: with its own pool, or with a
    pool the application opened and configured as it likes (no connection check)."""
    if request.param == "own pool":
        async with PostgresRunEventStore(dsn) as store:
            yield store
        return
    pool = AsyncConnectionPool(dsn, min_size=2, open=False, kwargs={"autocommit": True})
    await pool.open(wait=True)
    try:
        async with PostgresRunEventStore(pool) as store:
            yield store
    finally:
        await pool.close()


APP_STORES = pytest.mark.parametrize("app_store", ["own pool", "app's pool"], indirect=True)


def restarting_tool(server: ThrowawayServer) -> BaseTool:
    @tool
    def restart_server() -> str:
        """Restart the database server."""
        server.restart()
        return "restarted"

    return restart_server


def runs(server: ThrowawayServer) -> Iterator[tuple[CompiledStateGraph, list[str]]]:
    """The graphs of one test and the events each run writes: one run before the restart, one
    whose tool restarts the server while the journal writes, two after it."""
    yield agent_graph(scripted(ai("3"))), ANSWER_SEQUENCE
    model = scripted(ai(calls=[("restart_server", {}, "call-1")]), ai("Restarted."))
    yield agent_graph(model, [restarting_tool(server)]), ONE_TOOL_CALL_SEQUENCE
    for _ in range(2):
        yield agent_graph(scripted(ai("3"))), ANSWER_SEQUENCE


def stored_types(dsn: str, run_id: str | None) -> list[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT event_type FROM run_events WHERE run_id = %s ORDER BY seq", (run_id,)
        ).fetchall()
    return [row[0] for row in rows]


def assert_all_stored(dsn: str, ran: list[tuple[str | None, list[str]]]) -> None:
    """Every run's events once each, in order, and its summary; nothing else."""
    for run_id, expected in ran:
        assert stored_types(dsn, run_id) == expected, run_id
    with psycopg.connect(dsn, autocommit=True) as conn:
        events = conn.execute("SELECT count(*) FROM run_events").fetchone()
        summaries = conn.execute("SELECT run_id FROM run_summaries ORDER BY run_id").fetchall()
    assert events == (sum(len(expected) for _, expected in ran),)
    assert [row[0] for row in summaries] == sorted(run_id for run_id, _ in ran)


def assert_no_failed_write(caplog: pytest.LogCaptureFixture) -> None:
    """No journal write failed (nor gave up waiting) on the way."""
    complaints = [
        record.getMessage()
        for record in caplog.records
        if record.name.startswith(("deerflow_journal", "langchain_core"))
        and record.levelno >= logging.WARNING
    ]
    assert not complaints


@APP_STORES
async def test_ainvoke_on_the_app_loop_writes_through_a_restart(
    app_store: PostgresRunEventStore,
    server: ThrowawayServer,
    dsn: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    journal = RunJournal(event_store=app_store, flush_threshold=1)
    ran = []
    for graph, expected in runs(server):
        await graph.ainvoke(QUESTION, {"callbacks": [journal]})
        if not ran:
            await journal.flush()  # the pool's connections are to the server before the restart
        ran.append((journal.run_id, expected))
    await journal.flush()
    assert_all_stored(dsn, ran)
    assert_no_failed_write(caplog)


@APP_STORES
async def test_invoke_from_worker_threads_writes_through_a_restart(
    app_store: PostgresRunEventStore,
    server: ThrowawayServer,
    dsn: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    journal = RunJournal(event_store=app_store, flush_threshold=1)
    ran = []
    for graph, expected in runs(server):
        await asyncio.to_thread(graph.invoke, QUESTION, {"callbacks": [journal]})
        # Written before invoke returned, with no flush on the application's loop.
        assert stored_types(dsn, journal.run_id) == expected
        ran.append((journal.run_id, expected))
    assert_all_stored(dsn, ran)
    assert_no_failed_write(caplog)


def test_invoke_without_a_loop_writes_through_a_restart(
    server: ThrowawayServer, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = PostgresRunEventStore(dsn)  # set up by the journal's first write
    journal = RunJournal(event_store=store, flush_threshold=1)
    ran = []
    try:
        for graph, expected in runs(server):
            graph.invoke(QUESTION, {"callbacks": [journal]})
            assert stored_types(dsn, journal.run_id) == expected
            ran.append((journal.run_id, expected))
        journal.close()
    finally:
        asyncio.run_coroutine_threadsafe(store.close(), background_loop()).result(WAIT_TIMEOUT)
    assert_all_stored(dsn, ran)
    assert_no_failed_write(caplog)


def test_invoke_with_a_journal_owned_store_writes_through_a_restart(
    server: ThrowawayServer, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    journal = RunJournal(event_store=dsn, flush_threshold=1)
    ran = []
    try:
        for graph, expected in runs(server):
            graph.invoke(QUESTION, {"callbacks": [journal]})
            assert stored_types(dsn, journal.run_id) == expected
            ran.append((journal.run_id, expected))
    finally:
        journal.close()
    assert_all_stored(dsn, ran)
    assert_no_failed_write(caplog)


async def test_ainvoke_with_a_journal_owned_store_writes_through_a_restart(
    server: ThrowawayServer, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    journal = RunJournal(event_store=dsn, flush_threshold=1)
    ran = []
    try:
        for graph, expected in runs(server):
            await graph.ainvoke(QUESTION, {"callbacks": [journal]})
            if not ran:
                await journal.flush()  # its first setup (which fails fast) is before the restart
            ran.append((journal.run_id, expected))
    finally:
        await journal.aclose()
    assert_all_stored(dsn, ran)
    assert_no_failed_write(caplog)
