"""The README's main job and the notebook run for real, so neither can rot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

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


def test_the_quickstart_notebook_runs(tmp_path):
    notebook = nbformat.read(EXAMPLES / "quickstart.ipynb", as_version=4)
    workdir = tmp_path / "work"
    workdir.mkdir()
    client = NotebookClient(
        notebook,
        km=current_python_kernel(tmp_path),
        timeout=120,
        resources={"metadata": {"path": str(workdir)}},
    )
    client.execute(cwd=str(workdir), env=example_env(tmp_path))
    outputs = {
        index: "".join(
            output.get("text", "") or output.get("data", {}).get("text/plain", "")
            for output in cell.get("outputs", [])
        )
        for index, cell in enumerate(notebook.cells)
        if cell.cell_type == "code"
    }
    text = "\n".join(outputs.values())
    assert "It is sunny in Paris today" in text
    for event_type in ("run.start", "llm.human.input", "llm.tool.result", "run.end"):
        assert event_type in text
    assert "'status': 'success'" in text and "'total_tokens': 312" in text
    assert (workdir / ".deer-flow" / "journal.db").is_file()
