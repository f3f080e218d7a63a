"""The journal benchmark still runs end to end (tiny sizes: figures are not checked)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from langchain_core.messages import HumanMessage

from deerflow_journal import MemoryRunEventStore, RunJournal

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "bench_journal.py"
TINY = ["--runs", "3", "--rounds", "1", "--invocations", "3", "--block", "2"]


def run_benchmark(*args: str, path: str | None = None) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if path is not None:
        env["PATH"] = path
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *TINY, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_journal_benchmark_prints_every_timed_figure():
    out = run_benchmark("--instructions", "0")
    figures = ("callback cost", "no-op handler", "floor+memory", "floor+sqlite", "journal+memory")
    for figure in (*figures, "journal+sqlite"):
        assert figure in out
    assert "instructions" not in out


def test_the_journal_benchmark_says_when_it_cannot_count_instructions(tmp_path):
    out = run_benchmark("--instructions", "1", path=str(tmp_path))  # no valgrind on PATH
    assert "instructions: not measured  (valgrind not found)" in out


def load_benchmark() -> Any:
    spec = importlib.util.spec_from_file_location("bench_journal", SCRIPT)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


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
        assert json.loads(row[6]).keys() <= event["metadata"].keys()
