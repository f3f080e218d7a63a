"""The README's main job and the example notebooks run for real, so none of them can rot."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

from tests.backends import PG_DSN_ENV, pg_test_dsn
from tests.journal.agents import ONE_TOOL_CALL_SEQUENCE

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def example_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a fresh checkout: the default store URL, the package importable."""
    env = {k: v for k, v in os.environ.items() if k != "DEERFLOW_JOURNAL_URL"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def test_quickstart_prints_the_timeline_and_summary_from_the_default_store(tmp_path):
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py")],
        cwd=tmp_path,
        env=example_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    lines = done.stdout.splitlines()
    assert "in sqlite:///.deer-flow/journal.db" in lines[0]
    assert lines[2].split() == ["seq", "time", "event", "caller", "details"]
    timeline = [line.split()[2] for line in lines[3:9]]
    assert timeline == ONE_TOOL_CALL_SEQUENCE
    assert "↳ #" in lines[6] and "get_weather ✓ sunny, 21 °C" in lines[6]
    assert "status success" in done.stdout
    assert "tokens: 312 total (280 in, 32 out) over 2 model calls" in done.stdout
    assert any(line.startswith("cost: $") for line in lines)  # priced as gpt-4o
    assert (tmp_path / ".deer-flow" / "journal.db").is_file()


def current_python_kernel(tmp_path: Path) -> KernelManager:
    """A kernel manager whose ``python3`` kernel runs this interpreter."""
    spec_dir = tmp_path / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (tests)",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    specs = KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")], ensure_native_kernel=False)
    return KernelManager(kernel_name="python3", kernel_spec_manager=specs)


def run_notebook(
    notebook: nbformat.NotebookNode, tmp_path: Path, env: dict[str, str] | None = None
) -> Path:
    """Execute ``notebook`` top to bottom in a fresh kernel, in an empty working directory
    (returned); its outputs stay in ``notebook``, also when a cell fails."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    client = NotebookClient(
        notebook,
        km=current_python_kernel(tmp_path),
        timeout=120,
        resources={"metadata": {"path": str(workdir)}},
    )
    client.execute(cwd=str(workdir), env={**example_env(tmp_path), **(env or {})})
    return workdir


def cell_outputs(notebook: nbformat.NotebookNode) -> list[str]:
    """The text each code cell printed or returned, one string per code cell."""
    return [
        "".join(
            output.get("text", "") or output.get("data", {}).get("text/plain", "")
            for output in cell.get("outputs", [])
        )
        for cell in notebook.cells
        if cell.cell_type == "code"
    ]


def read_notebook(name: str) -> nbformat.NotebookNode:
    return nbformat.read(EXAMPLES / name, as_version=4)


def row(text: str, event_type: str, details: str) -> str:
    """The one timeline line of an ``event_type`` event whose details contain ``details``."""
    found = [
        line for line in text.splitlines() if line.split()[2:3] == [event_type] and details in line
    ]
    assert len(found) == 1, f"no single {event_type} row with {details!r} in:\n{text}"
    return found[0]


def test_the_quickstart_notebook_runs(tmp_path):
    notebook = read_notebook("quickstart.ipynb")
    workdir = run_notebook(notebook, tmp_path)
    text = "\n".join(cell_outputs(notebook))
    assert "It is sunny in Paris today" in text
    for event_type in ("run.start", "llm.human.input", "llm.tool.result", "run.end"):
        assert event_type in text
    assert "'status': 'success'" in text and "'total_tokens': 312" in text
    assert (workdir / ".deer-flow" / "journal.db").is_file()


def test_the_custom_middleware_notebook_shows_its_middleware_event(tmp_path):
    notebook = read_notebook("custom_middleware.ipynb")
    workdir = run_notebook(notebook, tmp_path)
    text = "\n".join(cell_outputs(notebook))
    row(text, "middleware:pii_redaction", "PiiRedactionMiddleware before_model · masked 1 email")
    row(text, "llm.human.input", "'Please reset the password of [email]'")
    assert "ada.lovelace@example.com" not in text  # the model never saw the address
    assert "refused: middleware:{tag} suffix must be a string of 1 to 21 characters" in text
    assert "{'name': 'PiiRedactionMiddleware', 'hook': 'before_model'" in text
    assert list(workdir.iterdir()) == []  # an in-memory store: nothing written


def test_the_interrupt_and_resume_notebook_shows_both_runs_and_the_thread(tmp_path):
    notebook = read_notebook("interrupt_and_resume.ipynb")
    run_notebook(notebook, tmp_path)
    outputs = cell_outputs(notebook)
    first = next(text for text in outputs if "\nstatus interrupted" in text)
    asks = "interrupted, asks {'question': 'Book the flight to Rome on 2 June?'}"
    assert row(first, "run.interrupt", asks).split()[0] == "5"
    row(first, "tool.unresolved", "↳ #3 book_flight ⊘ unresolved (interrupted)")
    second = next(text for text in outputs if "\nstatus success" in text)
    assert row(second, "run.resume", "resumed from checkpoint").split()[0] == "7"
    row(second, "llm.tool.result", "book_flight ✓ booked Rome on 2 June, reference BK-1042")
    thread = next(text for text in outputs if "interrupted 110 tokens" in text)
    assert "success 156 tokens" in thread
    row(thread, "run.resume", "↳ #5 resumed")  # the thread's view links it to the pause
    messages = outputs[-2].splitlines()
    assert [line.split()[2] for line in messages[1:]] == [
        "llm.human.input",
        "llm.ai.response",
        "llm.tool.result",
        "llm.ai.response",
    ]
    assert "↳ #3 book_flight ✓ booked Rome" in messages[3]


def test_the_subagents_and_workspace_notebook_indents_steps_and_shows_the_change(tmp_path):
    notebook = read_notebook("subagents_and_workspace.ipynb")
    workdir = run_notebook(notebook, tmp_path)
    text = "\n".join(cell_outputs(notebook))
    lines = text.splitlines()
    header = next(line for line in lines if line.split()[:3] == ["seq", "time", "event"])
    details = header.index("details")
    start = row(text, "subagent.start", "task weather: Today's weather in Paris and Oslo")
    assert start[details:].startswith("task weather")
    step = row(text, "subagent.step", "calls get_weather({'city': 'Paris'})")
    assert step[details:].startswith("  calls get_weather")  # indented under its task
    result = row(text, "subagent.step", "get_weather ✓ light rain, 9 °C")
    assert result[details:].startswith("  ↳ #")
    row(text, "subagent.end", "task weather ✓ completed · fake-gpt-mini [208 tok")
    row(text, "workspace_changes", "2 files changed (1 created, 1 modified) +5 -1")
    assert "\nmodified: /mnt/user-data/outputs/notes.md" in text
    assert "\n+- pack an umbrella for Oslo\n" in text
    assert list(workdir.iterdir()) == []  # the workspace was a directory of its own


def _drop_schemas(dsn: str, schemas: list[str]) -> list[str]:
    """Drop ``schemas``; return those that still existed."""
    import psycopg

    left = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for schema in schemas:
            if conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone():
                left.append(schema)
                conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    return left


@pytest.mark.postgres
def test_the_postgres_shared_pool_notebook_journals_through_the_checkpointers_pool(tmp_path):
    dsn = pg_test_dsn()
    notebook = read_notebook("postgres_shared_pool.ipynb")
    try:
        run_notebook(notebook, tmp_path, env={PG_DSN_ENV: dsn})
    finally:
        text = "\n".join(cell_outputs(notebook))
        schemas = re.findall(r"^schema (journal_demo_[0-9a-f]+)$", text, re.MULTILINE)
        left = _drop_schemas(dsn, schemas)
    assert len(schemas) == 1 and left == []  # the notebook dropped its schema itself
    row(text, "llm.tool.result", "↳ #3 get_weather ✓ sunny, 21 °C")
    assert "\nstatus success" in text
    tables = next(line for line in text.splitlines() if line.startswith("tables: "))
    assert {"checkpoints", "checkpoint_writes", "run_events", "run_summaries"} <= set(
        tables.removeprefix("tables: ").split(", ")
    )
    assert "checkpointed messages: 4" in text
    assert "pool still open after store.close(): True" in text
