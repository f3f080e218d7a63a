"""Load the run event stream contract and validate records against it."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = ["CONTRACT_FILENAME", "load_contract", "validate_event"]

CONTRACT_FILENAME = "run_event_stream_contract.json"


@functools.cache
def _contract_text() -> str:
    # An installed wheel carries the contract as package data; a source checkout keeps the one
    # copy at contracts/.
    packaged = resources.files("deerflow_journal") / CONTRACT_FILENAME
    if packaged.is_file():
        return packaged.read_text(encoding="utf-8")
    source = Path(__file__).resolve().parent.parent / "contracts" / CONTRACT_FILENAME
    return source.read_text(encoding="utf-8")


def load_contract() -> dict[str, Any]:
    """Return a fresh copy of the machine-readable contract."""
    return json.loads(_contract_text())


# What an event type must honour: (category, event type, content, metadata) validators; the
# event type validator only for patterns (a fixed name is matched exactly).
_Checks = tuple[Any, Any | None, Any, Any]


@functools.cache
def _validators() -> tuple[Any, dict[str, _Checks], list[tuple[str, _Checks]]]:
    try:
        from jsonschema import Draft202012Validator
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "validate_event needs jsonschema: pip install 'deerflow-journal[validate]'"
        ) from exc
    contract = load_contract()
    checker = Draft202012Validator.FORMAT_CHECKER

    def build(schema: Any) -> Any:
        Draft202012Validator.check_schema(schema)
        return Draft202012Validator(schema, format_checker=checker)

    fixed: dict[str, _Checks] = {
        e["event_type"]: (
            build({"const": e["category"]}),
            None,
            build(e["content_schema"]),
            build(e["metadata_schema"]),
        )
        for e in contract["events"]
    }
    for alias in contract["legacy_event_aliases"]:
        fixed[alias["event_type"]] = fixed[alias["canonical_event_type"]]
    patterns = [
        (
            p["pattern"].split("{", 1)[0],
            (
                build({"const": p["category"]}),
                build(p["event_type_schema"]),
                build(p["content_schema"]),
                build(p["metadata_schema"]),
            ),
        )
        for p in contract["dynamic_event_patterns"]
    ]
    return build(contract["record_schema"]), fixed, patterns


def validate_event(record: Mapping[str, Any]) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``record`` honours the contract.

    The envelope is checked against ``record_schema``; the category, content and metadata
    against what the record's event type (or the pattern it belongs to, whose name rules
    apply too) requires. Unknown event types are checked for the envelope only, as the
    compatibility rules say readers must accept them.
    """
    record_validator, fixed, patterns = _validators()
    record_validator.validate(dict(record))
    event_type = record["event_type"]
    checks = fixed.get(event_type)
    if checks is None:
        checks = next((c for prefix, c in patterns if event_type.startswith(prefix)), None)
    if checks is not None:
        category, name, content, metadata = checks
        category.validate(record["category"])
        if name is not None:
            name.validate(event_type)
        content.validate(record["content"])
        metadata.validate(record["metadata"])
