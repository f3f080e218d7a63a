"""``docs/events.md`` is generated from the contract, and its example records honour it."""

from __future__ import annotations

import difflib
import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from deerflow_journal import validate_event
from deerflow_journal.catalog import FIXED_RUN_EVENT_DEFINITIONS, MIDDLEWARE_EVENT_PATTERN
from deerflow_journal.records import normalise_event

ROOT = Path(__file__).resolve().parent.parent
GENERATOR = ROOT / "docs" / "generate.py"
EVENTS_PAGE = ROOT / "docs" / "events.md"
REGENERATE = ".venv/bin/python docs/generate.py"
_JSON_BLOCK = re.compile(r"^```json\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def load_generator() -> Any:
    """``docs/generate.py`` as a module (``docs/`` is no package)."""
    spec = importlib.util.spec_from_file_location("docs_generate", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def page_examples() -> list[dict[str, Any]]:
    """Every example record in the checked-in page, in page order."""
    return [json.loads(block) for block in _JSON_BLOCK.findall(EVENTS_PAGE.read_text("utf-8"))]


def test_events_page_is_up_to_date_with_the_contract():
    generator = load_generator()
    expected = generator.render(generator.load_contract())
    actual = EVENTS_PAGE.read_text(encoding="utf-8") if EVENTS_PAGE.exists() else ""
    if actual != expected:
        diff = "".join(
            list(
                difflib.unified_diff(
                    actual.splitlines(keepends=True),
                    expected.splitlines(keepends=True),
                    "docs/events.md",
                    "generated",
                )
            )[:40]
        )
        pytest.fail(
            "docs/events.md is out of date with contracts/run_event_stream_contract.json (or "
            f"docs/generate.py): regenerate it with `{REGENERATE}`\n{diff}",
            pytrace=False,
        )


def test_every_example_record_in_the_events_page_validates_against_the_contract():
    examples = page_examples()
    assert examples, "docs/events.md shows no example record"
    for example in examples:
        try:
            validate_event(example)
        except jsonschema.ValidationError as exc:
            pytest.fail(f"the {example['event_type']} example in docs/events.md: {exc.message}")
        # And it is what a store returns: normalising it again changes nothing.
        written = {key: value for key, value in example.items() if key != "seq"}
        assert normalise_event(written).record(example["seq"]) == example, example["event_type"]


def test_the_events_page_has_an_example_of_every_contract_event():
    shown = {example["event_type"] for example in page_examples()}
    assert {d.event_type for d in FIXED_RUN_EVENT_DEFINITIONS} <= shown
    assert any(name.startswith(MIDDLEWARE_EVENT_PATTERN.prefix) for name in shown)


def test_the_generator_check_mode_agrees_with_the_test(capsys):
    assert load_generator().main(["--check"]) == 0
    assert capsys.readouterr().err == ""
