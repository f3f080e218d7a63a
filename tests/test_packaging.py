"""What an installed user gets: the wheel's contents and the documented public surface."""

from __future__ import annotations

import ast
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
from deerflow_journal import catalog, records, subagent, workspace

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


def test_wheel_ships_the_viewers_templates_and_static_files(wheel):
    names = set(wheel.namelist())
    web = ROOT / "deerflow_journal" / "web"
    shipped = [p for p in (*web.glob("templates/*.html"), *web.glob("static/*")) if p.is_file()]
    assert len(shipped) >= 8
    for path in shipped:
        assert path.relative_to(ROOT).as_posix() in names


def test_wheel_ships_the_tracing_start_up_hook_once_at_the_top(wheel):
    names = set(wheel.namelist())
    assert "deerflow_journal_tracing.pth" in names  # site-packages runs it at start-up
    assert not [n for n in names if n.endswith(".pth") and "/" in n]
    line = wheel.read("deerflow_journal_tracing.pth").decode()
    assert line.startswith("import ") and "DEERFLOW_JOURNAL_TRACING" in line


def test_wheel_installs_the_deerflow_journal_command(wheel):
    (entry_points,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    text = wheel.read(entry_points).decode()
    assert "[console_scripts]" in text
    assert "deerflow-journal = deerflow_journal.cli:main" in text
    assert "deerflow_journal/__main__.py" in wheel.namelist()


def test_the_contract_is_one_file_in_the_source_tree():
    copies = [p for p in ROOT.rglob("run_event_stream_contract.json") if ".venv" not in p.parts]
    assert copies == [ROOT / "contracts" / "run_event_stream_contract.json"]


def own_docstring(value: Any) -> str | None:
    """The docstring ``value`` itself declares (not a base class's, nor a dataclass's repr)."""
    if inspect.isclass(value):
        doc = vars(value).get("__doc__")
        if doc and doc.startswith(f"{value.__name__}("):  # what @dataclass makes up
            return None
        return doc
    return value.__doc__


def test_every_public_name_has_a_summary_line_or_is_a_constant():
    for name in deerflow_journal.__all__:
        value = getattr(deerflow_journal, name)
        if inspect.isclass(value) or inspect.isroutine(value):
            doc = own_docstring(value)
            assert doc and doc.strip(), f"{name} has no docstring"
            lines = inspect.cleandoc(doc).splitlines()
            assert lines[0].strip(), f"{name}'s docstring does not start with a summary line"
            assert len(lines) == 1 or not lines[1].strip(), f"{name}: one summary line first"
        else:
            assert name.isupper() and not callable(value), (
                f"{name} is neither documented nor a constant"
            )


def test_all_has_no_duplicates():
    assert len(set(deerflow_journal.__all__)) == len(deerflow_journal.__all__)


def test_all_is_one_literal_list_that_nothing_changes():
    source = (ROOT / "deerflow_journal" / "__init__.py").read_text()
    tree = ast.parse(source)
    assignments = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign)
        and any(
            isinstance(target, ast.Name) and target.id == "__all__"
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        )
    ]
    assert len(assignments) == 1 and isinstance(assignments[0], ast.Assign)
    listed = assignments[0].value
    assert isinstance(listed, ast.List)
    assert all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in listed.elts)
    # No `__all__.append(...)`, `.remove(...)`, `+=` or `del __all__[...]` anywhere.
    uses = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Name)
        and node.id == "__all__"
        and not isinstance(node.ctx, ast.Store)
    ]
    assert uses == []
    assert deerflow_journal.__all__ == [e.value for e in listed.elts]


def test_star_import_gives_exactly_all():
    namespace: dict[str, Any] = {}
    exec("from deerflow_journal import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(deerflow_journal.__all__)


def test_catalog_names_are_importable_from_the_top_level():
    for name in catalog.__all__:
        assert getattr(deerflow_journal, name) is getattr(catalog, name)
    from deerflow_journal import MIDDLEWARE_GUARDRAIL_TAG, RUN_START_EVENT

    assert RUN_START_EVENT.event_type == "run.start"
    assert MIDDLEWARE_GUARDRAIL_TAG == "guardrail"


def test_postgres_store_is_importable_from_the_top_level_and_listed_by_dir():
    pytest.importorskip("psycopg")
    from deerflow_journal import PostgresRunEventStore
    from deerflow_journal.stores.postgres import PostgresRunEventStore as in_its_module

    assert PostgresRunEventStore is in_its_module
    assert "PostgresRunEventStore" in dir(deerflow_journal)


@pytest.mark.parametrize(
    ("name", "module"),
    [
        ("normalise_event", records),
        ("normalise_batch", records),
        ("scan_workspace", workspace),
        ("diff_workspace", workspace),
        ("compare_workspace_snapshots", workspace),
        ("build_subagent_step", subagent),
        ("truncate_step_text", subagent),
    ],
)
def test_building_blocks_live_in_their_modules_only(name, module):
    assert not hasattr(deerflow_journal, name)
    assert name in module.__all__ and callable(getattr(module, name))


def load_dev() -> Any:
    """``dev.py``, the entry point at the top of the checkout, as a module."""
    spec = importlib.util.spec_from_file_location("dev", ROOT / "dev.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dev_installs_the_test_extras_for_test_only_and_reinstalls_on_a_pyproject_change():
    install_spec = load_dev().install_spec
    everything = "d1 postgres cost otel test ui"
    assert install_spec("demo", "d1", "") == ".[cost]"  # the package and its prices
    assert install_spec("demo", "d1", "d1 cost") is None
    assert install_spec("test", "d1", "d1 cost") == ".[postgres,cost,otel,test,ui]"  # after a demo
    assert install_spec("test", "d1", everything) is None
    # a new extra
    assert (
        install_spec("test", "d1", "d1 postgres cost otel test") == ".[postgres,cost,otel,test,ui]"
    )
    assert install_spec("demo", "d1", everything) is None  # the extras do no harm
    assert install_spec("demo", "d2", everything) == ".[cost]"
    assert install_spec("test", "d2", everything) == ".[postgres,cost,otel,test,ui]"
