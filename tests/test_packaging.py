"""What an installed user gets: the wheel's contents and the documented public surface."""

from __future__ import annotations

import importlib.util
import inspect
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

import deerflow_journal

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
    )
    (built,) = out.glob("deerflow_journal-*.whl")
    return zipfile.ZipFile(built)


def test_wheel_ships_the_contract_and_py_typed(wheel):
    names = set(wheel.namelist())
    assert "deerflow_journal/py.typed" in names
    shipped = json.loads(wheel.read("deerflow_journal/run_event_stream_contract.json"))
    assert shipped == json.loads(
        (ROOT / "contracts" / "run_event_stream_contract.json").read_text()
    )


def test_the_contract_is_one_file_in_the_source_tree():
    copies = [p for p in ROOT.rglob("run_event_stream_contract.json") if ".venv" not in p.parts]
    assert copies == [ROOT / "contracts" / "run_event_stream_contract.json"]


def test_every_public_name_is_importable_and_documented():
    for name in deerflow_journal.__all__:
        value = getattr(deerflow_journal, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            doc = inspect.getdoc(value)
            assert doc and doc.strip(), f"{name} has no docstring"


def test_all_has_no_duplicates():
    assert len(set(deerflow_journal.__all__)) == len(deerflow_journal.__all__)


def load_dev() -> Any:
    """``dev.py``, the entry point at the top of the checkout, as a module."""
    spec = importlib.util.spec_from_file_location("dev", ROOT / "dev.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dev_installs_the_test_extras_for_test_only_and_reinstalls_on_a_pyproject_change():
    install_spec = load_dev().install_spec
    assert install_spec("demo", "d1", "") == "."  # the package alone runs the demo
    assert install_spec("demo", "d1", "d1") is None
    assert install_spec("test", "d1", "d1") == ".[postgres,test]"  # after a demo
    assert install_spec("test", "d1", "d1 postgres test") is None
    assert install_spec("demo", "d1", "d1 postgres test") is None  # the extras do no harm
    assert install_spec("demo", "d2", "d1 postgres test") == "."
    assert install_spec("test", "d2", "d1 postgres test") == ".[postgres,test]"
