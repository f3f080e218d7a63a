"""The catalog and the JSON contract describe the same events, and the contract is sound."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from jsonschema import Draft202012Validator

from deerflow_journal import catalog
from deerflow_journal.catalog import (
    FIXED_RUN_EVENT_DEFINITIONS,
    JOURNAL_RUN_EVENT_DEFINITIONS,
    MIDDLEWARE_EVENT_PATTERN,
    MIDDLEWARE_EVENT_TAG_MAX_LENGTH,
    MIDDLEWARE_EVENT_TAGS,
    RUN_EVENT_CATEGORY_MAX_LENGTH,
    RUN_EVENT_TYPE_MAX_LENGTH,
    SUBAGENT_RUN_EVENT_DEFINITIONS,
    WORKSPACE_RUN_EVENT_DEFINITIONS,
    RunEventDefinition,
    RunEventPattern,
)
from deerflow_journal.contract import load_contract, validate_event

ROOT = Path(__file__).resolve().parent.parent
# The upstream contract we stay wire-compatible with, kept verbatim as test data.
UPSTREAM = Path(__file__).resolve().parent / "data" / "upstream_run_event_stream_contract.json"
# The events this package writes beyond that upstream contract, the one it grew from.
BEYOND_UPSTREAM = {"run.interrupt", "run.resume", "tool.error", "tool.unresolved"}


@pytest.fixture(scope="module")
def contract() -> dict:
    return load_contract()


def test_contract_is_a_valid_draft_2020_12_document(contract):
    assert contract["schema_dialect"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(contract["record_schema"])
    for entry in contract["events"] + contract["dynamic_event_patterns"]:
        Draft202012Validator.check_schema(entry["content_schema"])
        Draft202012Validator.check_schema(entry["metadata_schema"])


def test_catalog_and_contract_have_the_same_event_category_pairs(contract):
    in_contract = {(e["event_type"], e["category"]) for e in contract["events"]}
    in_catalog = {(d.event_type, d.category) for d in FIXED_RUN_EVENT_DEFINITIONS}
    assert in_catalog == in_contract
    assert len(contract["events"]) == len(FIXED_RUN_EVENT_DEFINITIONS)


def test_catalog_and_contract_have_the_same_category_set(contract):
    used = {d.category for d in FIXED_RUN_EVENT_DEFINITIONS} | {MIDDLEWARE_EVENT_PATTERN.category}
    assert set(contract["categories"]) == used == set(catalog.RUN_EVENT_CATEGORIES)


def test_catalog_and_contract_have_the_same_length_limits(contract):
    props = contract["record_schema"]["properties"]
    assert props["event_type"]["maxLength"] == RUN_EVENT_TYPE_MAX_LENGTH == 32
    assert props["category"]["maxLength"] == RUN_EVENT_CATEGORY_MAX_LENGTH == 16
    (pattern,) = contract["dynamic_event_patterns"]
    assert pattern["pattern"] == MIDDLEWARE_EVENT_PATTERN.pattern
    assert pattern["category"] == MIDDLEWARE_EVENT_PATTERN.category
    assert pattern["tag_schema"]["maxLength"] == MIDDLEWARE_EVENT_TAG_MAX_LENGTH == 21
    assert pattern["event_type_schema"]["maxLength"] == RUN_EVENT_TYPE_MAX_LENGTH
    assert pattern["event_type_schema"]["minLength"] == len(MIDDLEWARE_EVENT_PATTERN.prefix) + 1
    assert tuple(pattern["known_tags"]) == MIDDLEWARE_EVENT_TAGS


def test_catalog_groups_partition_the_fixed_definitions():
    groups = (
        JOURNAL_RUN_EVENT_DEFINITIONS
        + SUBAGENT_RUN_EVENT_DEFINITIONS
        + WORKSPACE_RUN_EVENT_DEFINITIONS
    )
    assert groups == FIXED_RUN_EVENT_DEFINITIONS
    assert len({d.event_type for d in groups}) == len(groups)
    journal_types = {d.event_type for d in JOURNAL_RUN_EVENT_DEFINITIONS}
    assert journal_types >= BEYOND_UPSTREAM


def test_legacy_alias_is_in_the_contract_and_never_a_catalog_event(contract):
    (alias,) = contract["legacy_event_aliases"]
    assert {alias["event_type"]: alias["canonical_event_type"]} == catalog.LEGACY_EVENT_ALIASES
    assert alias["produced_by_current_runtime"] is False
    assert "ai_message" not in {d.event_type for d in FIXED_RUN_EVENT_DEFINITIONS}


def test_upstream_events_keep_their_names_categories_and_schemas(contract):
    """The upstream contract's events keep their names, categories and schemas here."""
    upstream = json.loads(UPSTREAM.read_text())
    ours = {e["event_type"]: e for e in contract["events"]}
    for event in upstream["events"]:
        mine = ours[event["event_type"]]
        assert mine["category"] == event["category"]
        assert mine["content_schema"] == event["content_schema"], event["event_type"]
        assert mine["metadata_schema"] == event["metadata_schema"], event["event_type"]
    assert set(ours) - {e["event_type"] for e in upstream["events"]} == BEYOND_UPSTREAM
    assert contract["record_schema"] == upstream["record_schema"]
    for key in ("pattern", "category", "known_tags", "event_type_schema", "tag_schema"):
        assert (
            contract["dynamic_event_patterns"][0][key] == upstream["dynamic_event_patterns"][0][key]
        )
    for key in ("content_schema", "metadata_schema"):
        assert (
            contract["dynamic_event_patterns"][0][key] == upstream["dynamic_event_patterns"][0][key]
        )
    assert (
        contract["compatibility"]["breaking_changes"]
        == upstream["compatibility"]["breaking_changes"]
    )


def test_contract_file_is_the_one_in_the_source_tree():
    assert load_contract() == json.loads(
        (ROOT / "contracts" / "run_event_stream_contract.json").read_text()
    )


def test_load_contract_returns_a_fresh_copy():
    first = load_contract()
    first["events"].clear()
    assert load_contract()["events"]


@pytest.mark.parametrize("bad", ["", "x" * 33, None])
def test_definition_rejects_bad_type(bad):
    with pytest.raises(ValueError, match="type"):
        RunEventDefinition(bad, "trace")


@pytest.mark.parametrize("bad", ["", "x" * 17])
def test_definition_rejects_bad_category(bad):
    with pytest.raises(ValueError, match="category"):
        RunEventDefinition("run.start", bad)


def test_definitions_are_frozen():
    with pytest.raises(AttributeError):
        catalog.RUN_START_EVENT.category = "message"  # type: ignore[misc]


def test_pattern_builds_names_within_the_suffix_limit():
    assert MIDDLEWARE_EVENT_PATTERN.event_type("guardrail") == "middleware:guardrail"
    longest = "x" * MIDDLEWARE_EVENT_TAG_MAX_LENGTH
    assert len(MIDDLEWARE_EVENT_PATTERN.event_type(longest)) == RUN_EVENT_TYPE_MAX_LENGTH
    for bad in ("", "x" * (MIDDLEWARE_EVENT_TAG_MAX_LENGTH + 1)):
        with pytest.raises(ValueError):
            MIDDLEWARE_EVENT_PATTERN.event_type(bad)


def test_pattern_rejects_a_category_over_the_limit():
    with pytest.raises(ValueError, match="category"):
        RunEventPattern("x:{s}", "x:", "c" * 17)


RUN_END_RECORD = {
    "thread_id": "t",
    "run_id": "r",
    "seq": 1,
    "event_type": "run.end",
    "category": "outputs",
    "content": {"anything": [1]},
    "metadata": {"status": "success"},
    "created_at": "2026-01-01T00:00:00+00:00",
}


def test_validate_event_checks_payload_schemas():
    record = RUN_END_RECORD
    validate_event(record)
    with pytest.raises(jsonschema.ValidationError):
        validate_event({**record, "metadata": {"status": "failed"}})
    with pytest.raises(jsonschema.ValidationError):
        validate_event({**record, "created_at": "yesterday"})
    validate_event({**record, "event_type": "future.event", "metadata": {}})
    middleware = {**record, "event_type": "middleware:guardrail", "category": "middleware"}
    with pytest.raises(jsonschema.ValidationError):
        validate_event({**middleware, "content": {"name": "g"}})
    validate_event(
        {**middleware, "content": {"name": "g", "hook": "h", "action": "a", "changes": {}}}
    )


def test_validate_event_checks_the_category_and_a_patterns_name_rules():
    record = RUN_END_RECORD
    for category in ("message", "bogus"):
        with pytest.raises(jsonschema.ValidationError):
            validate_event({**record, "category": category})
    middleware = {
        **record,
        "event_type": "middleware:guardrail",
        "category": "middleware",
        "content": {"name": "g", "hook": "h", "action": "a", "changes": {}},
        "metadata": {},
    }
    validate_event(middleware)
    with pytest.raises(jsonschema.ValidationError):
        validate_event({**middleware, "category": "trace"})
    with pytest.raises(jsonschema.ValidationError):
        validate_event({**middleware, "event_type": "middleware:"})  # an empty tag
