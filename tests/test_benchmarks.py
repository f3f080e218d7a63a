"""The journal benchmark still runs end to end (tiny sizes: figures are not checked)."""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiosqlite
import pytest
from langchain_core.messages import HumanMessage

from deerflow_journal import MemoryRunEventStore, RunJournal
from tests.backends import DEFAULT_PG_DSN, PG_DSN_ENV

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--runs", "3", "--rounds", "1", "--invocations", "3", "--block", "2"]
NO_STORE_FIGURES = ["--skip-writes", "--skip-reads", "--browse-sizes", ""]


def run_script(name: str, *args: str, **env: str) -> str:
    """Run ``benchmarks/{name}`` with ``args`` (and ``env`` on top of ours); its output, once
    it has exited cleanly."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / name), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def run_benchmark(*args: str, path: str | None = None) -> str:
    """The journal benchmark at tiny sizes (``path``: the PATH it runs with)."""
    return run_script("bench_journal.py", *TINY, *args, **({} if path is None else {"PATH": path}))


def test_the_journal_benchmark_prints_every_timed_figure():
    out = run_benchmark("--instructions", "0")
    figures = ("callback cost", "no-op handler", "floor+memory", "floor+sqlite", "journal+memory")
    for figure in (*figures, "journal+sqlite", "journal+memory above floor+memory"):
        assert figure in out
    # The callback cost has a baseline measured in the same run: the floor handler's.
    assert re.search(r"callback cost floor handler: [\d.]+ us per callback .*[\d.]+x", out)
    assert "instructions" not in out


@pytest.mark.slow
def test_the_journal_benchmark_counts_the_instructions_of_the_callbacks():
    out = run_benchmark("--instructions", "1")
    journal = re.search(r"instructions callback cost: ([\d.]+) k per callback", out)
    floor = re.search(
        r"instructions callback cost floor handler: ([\d.]+) k per callback .*[\d.]+x", out
    )
    assert journal and floor
    # Counted only inside the runs' callbacks: a toggle that missed them would count nothing.
    assert float(journal[1]) >= 1 and float(floor[1]) >= 1
    assert re.search(r"instructions x1 journal\+memory: [\d.]+x no callbacks", out)


def test_the_journal_benchmark_says_when_it_cannot_count_instructions(tmp_path):
    out = run_benchmark("--instructions", "1", path=str(tmp_path))  # no valgrind on PATH
    assert "instructions: not measured  (valgrind not found)" in out


def load_benchmark(name: str = "bench_journal.py") -> Any:
    """``benchmarks/{name}`` as a module."""
    spec = importlib.util.spec_from_file_location(name[:-3], ROOT / "benchmarks" / name)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def without_ids(value: Any) -> Any:
    """``value`` less every ``id`` key (LangGraph gives each run's messages new ids)."""
    if isinstance(value, dict):
        return {k: without_ids(v) for k, v in value.items() if k != "id"}
    if isinstance(value, list):
        return [without_ids(v) for v in value]
    return value


async def test_the_floor_writes_the_events_the_journal_writes():
    bench = load_benchmark()
    agent = bench.build_agent()
    store = MemoryRunEventStore()
    journal = RunJournal(thread_id="bench", event_store=store)
    await agent.ainvoke({"messages": [HumanMessage("weather?")]}, {"callbacks": [journal]})
    await journal.flush()
    events = await store.list_events("bench", journal.run_id)
    table = bench.FloorTable(None)
    floor = bench.FloorHandler(table.write)
    await agent.ainvoke({"messages": [HumanMessage("weather?")]}, {"callbacks": [floor]})
    await floor.written
    assert [(row[3], row[4]) for row in table.rows] == [
        (event["event_type"], event["category"]) for event in events
    ]
    for row, event in zip(table.rows, events, strict=True):
        assert without_ids(json.loads(row[5])) == without_ids(event["content"])
        assert json.loads(row[6]).keys() <= event["metadata"].keys()


async def test_the_sqlite_floor_stores_every_run_numbered_in_its_thread(tmp_path):
    bench = load_benchmark()
    async with bench.variants(str(tmp_path)) as found:
        await found["floor+sqlite"](bench.build_agent(), 2)
    async with aiosqlite.connect(tmp_path / "floor.db") as db:
        rows = await db.execute_fetchall("SELECT seq, run_id, event_type FROM events ORDER BY id")
    assert [seq for seq, _, _ in rows] == list(range(1, 17))
    assert len({run_id for _, run_id, _ in rows}) == 2
    assert [event_type for _, _, event_type in rows[:8]] == [t for _, _, t in rows[8:]]


def test_the_store_benchmark_prints_every_browsing_figure():
    tiny = ["--skip-writes", "--skip-reads", "--browse-sizes", "60,120", "--show-events", "50"]
    out = run_script("bench_stores.py", *tiny)
    for backend in ("memory", "sqlite"):
        for figure in ("list_threads", "list_run_summaries", "list_run_summaries error"):
            for page in ("first page", "deep page"):
                if figure.endswith("error") and page == "first page":
                    continue
                assert f"browse {backend} 120 threads {figure} {page}" in out
                assert f"browse {backend} {figure} {page}: 120 vs 60 threads = " in out
        assert f"browse {backend} show a 50-event run (read + render)" in out


def test_the_serve_benchmark_prints_every_figure_against_the_direct_read():
    tiny = ["--events", "1200", "--requests", "6", "--concurrency", "2"]
    out = run_script("bench_serve.py", *tiny)
    for page in ("events page of 500", "messages page of 50"):
        assert f"{page}: direct" in out
        assert f"{page}: HTTP, 2 clients" in out
        (http,) = [line for line in out.splitlines() if f"{page}: HTTP, 1 client" in line]
        assert "req/s" in http and "p99" in http and "x direct p50" in http


def test_the_integrations_benchmark_prints_every_figure():
    out = run_script("bench_integrations.py", "--invocations", "2", "--rounds", "1")
    for figure in ("invoke, enable()", "estimate_cost, 2 models", "run_spans, per event"):
        assert figure in out


def pg_dsn() -> str:
    """The test server the benchmark's PostgreSQL part uses (it says so if unreachable)."""
    return os.environ.get(PG_DSN_ENV) or DEFAULT_PG_DSN


def test_the_concurrent_runs_benchmark_prints_journal_and_floor_rates():
    tiny = ["--concurrent", "4", "--waves", "1", "--rounds", "1"]
    out = run_script("bench_concurrent.py", *tiny, DEERFLOW_JOURNAL_TEST_PG_DSN=pg_dsn())
    assert "4 concurrent runs sqlite floor: " in out
    assert re.search(r"4 concurrent runs sqlite journal CPU: [\d.]+ ms per run", out)
    assert re.search(r"4 concurrent runs sqlite journal: [\d.]+ runs/s  \([\d.]+x floor", out)
    if "4 concurrent runs postgres: skipped" in out:
        assert os.environ.get("CI") != "true", out  # CI has a server: it must run
    else:
        assert re.search(r"4 concurrent runs postgres journal: [\d.]+ runs/s  \([\d.]+x floor", out)


@pytest.mark.slow
def test_the_store_benchmark_counts_the_instructions_of_sqlite_writes():
    out = run_script("bench_stores.py", *NO_STORE_FIGURES, "--instructions", "5")
    for workload in ("put_batch(20)", "single put"):
        floor = re.escape(f"write instructions floor aiosqlite {workload}")
        assert re.search(rf"{floor} +[\d,.]+ k/event", out)
        (mine,) = [line for line in out.splitlines() if f"instructions sqlite {workload}" in line]
        assert re.search(r"the floor does [\d.]+x as many", mine)


def test_the_store_benchmark_says_when_it_cannot_count_instructions(tmp_path):
    out = run_script("bench_stores.py", *NO_STORE_FIGURES, PATH=str(tmp_path))  # no valgrind
    assert "write instructions: not measured (valgrind not found)" in out


@pytest.mark.slow
def test_the_breakdown_benchmark_counts_the_instructions_of_each_part():
    parts = "on_llm_end,floor callbacks"
    out = run_script("bench_breakdown.py", "--invocations", "1", "--warm-up", "1", "--parts", parts)
    journal = re.search(r"breakdown journal\+memory on_llm_end: ([\d.]+) k per invocation", out)
    floor = re.search(r"breakdown floor\+memory floor callbacks: ([\d.]+) k per invocation", out)
    assert journal is not None and floor is not None, out
    assert float(journal.group(1)) > 0 and float(floor.group(1)) > 0  # the parts were called


def test_the_breakdown_benchmark_says_when_it_cannot_count_instructions(tmp_path):
    out = run_script("bench_breakdown.py", "--invocations", "1", PATH=str(tmp_path))  # no valgrind
    assert "breakdown: not measured  (valgrind not found)" in out


def test_every_part_of_the_breakdown_names_a_plain_function():
    module = load_benchmark("bench_breakdown.py")
    for _, targets in module.PARTS.values():
        for target in targets:
            found = inspect.getattr_static(*module.resolve(target))
            # A property (RunJournal.on_chain_start is one) wrapped as a function would fail
            # on every call, and a coroutine function would count only its coroutine's making.
            assert inspect.isfunction(found), target
            assert not inspect.iscoroutinefunction(found), target


async def test_every_part_of_the_breakdown_is_called_in_an_invocation():
    module = load_benchmark("bench_breakdown.py")
    calls = await module.calls_per_invocation(list(module.PARTS))
    assert all(calls.values()), calls
    assert calls["on_llm_end"] == 3 and calls["on_tool_end"] == 2  # the agent's 3 and 2 calls
