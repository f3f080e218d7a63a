"""The journal benchmark still runs end to end (tiny sizes: figures are not checked)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
    for figure in ("callback cost", "no-op handler", "journal+memory", "journal+sqlite"):
        assert figure in out
    assert "instructions" not in out


def test_the_journal_benchmark_says_when_it_cannot_count_instructions(tmp_path):
    out = run_benchmark("--instructions", "1", path=str(tmp_path))  # no valgrind on PATH
    assert "instructions: not measured  (valgrind not found)" in out
