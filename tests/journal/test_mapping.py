"""The pure mapping rules of SPEC §5.1-§5.5, one test per rule (no journal, no store)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from langchain_core.messages import AIMessage, HumanMessage

from deerflow_journal.journal import mapping
from deerflow_journal.records import decode_json, encode_json


def plain(value: Any) -> Any:
    """``value`` as a journal batch stores it."""
    return decode_json(encode_json(value, mapping.MessageDumps()))


def test_caller_is_the_last_caller_tag():
    assert mapping.caller_from_tags(["lead_agent", "seq:step:1", "subagent:research"]) == (
        "subagent:research"
    )
    assert mapping.caller_from_tags(["middleware:guardrail"]) == "middleware:guardrail"
    assert mapping.caller_from_tags(["subagent:x", "lead_agent", "graph:step:2"]) == "lead_agent"


def test_caller_defaults_to_the_lead_agent():
    assert mapping.caller_from_tags(None) == "lead_agent"
    assert mapping.caller_from_tags(["graph:step:1", "subagent:"]) == "lead_agent"


def test_chain_name_prefers_serialized_then_the_name_keyword():
    assert mapping.chain_name({"name": "Chain"}, "other") == "Chain"
    assert mapping.chain_name(None, "LangGraph") == "LangGraph"
    assert mapping.chain_name({}, None) is None


def test_run_start_carries_the_chain_caller_and_callback_metadata():
    event = mapping.run_start_event("LangGraph", "lead_agent", {"thread_id": "t", "caller": 1})
    assert event == {
        "event_type": "run.start",
        "category": "trace",
        "content": {"chain": "LangGraph"},
        "metadata": {"thread_id": "t", "caller": "lead_agent"},
    }


def test_run_end_carries_the_outputs_with_messages_dumped_when_written():
    event = mapping.run_end_event({"messages": [HumanMessage("hi", id="h")], "n": (1, 2)})
    assert event["event_type"] == "run.end" and event["category"] == "outputs"
    assert event["metadata"] == {"status": "success"}
    content = plain(event["content"])
    assert content["messages"][0] == HumanMessage("hi", id="h").model_dump()
    assert content["n"] == [1, 2]


def test_message_dumps_encode_models_anywhere_and_everything_else_as_stores_do():
    message = AIMessage("x", id="a")
    assert plain(message) == message.model_dump()
    assert plain({"a": [message, 1, "s", None]}) == {"a": [message.model_dump(), 1, "s", None]}
    marker = object()
    assert plain({"m": marker}) == {"m": str(marker)}
    # Beyond 64 bits orjson refuses an int: the fallback still dumps the model around it.
    big = AIMessage("x", id="b", additional_kwargs={"n": 2**70})
    assert plain(big)["additional_kwargs"] == {"n": str(2**70)}


def test_message_dumps_dump_each_model_once_per_batch():
    message = AIMessage("x", id="a")
    dumps = mapping.MessageDumps()
    assert dumps(message) is dumps(message)


class Point(NamedTuple):
    x: Any
    y: Any


def test_message_dumps_store_tuples_named_or_not_as_lists():
    message = HumanMessage("hi", id="h")
    assert plain({"p": Point(1, message), "t": (2, 3)}) == {
        "p": [1, message.model_dump()],
        "t": [2, 3],
    }


class FreshMessage(Mapping[str, Any]):
    """A one-key mapping that builds a new message on every read: each message dies as soon
    as it is dumped, so the next one may be allocated at the same address (the same id)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __getitem__(self, key: str) -> Any:
        return AIMessage(self.text)

    def __iter__(self) -> Iterator[str]:
        return iter(["m"])

    def __len__(self) -> int:
        return 1


def test_message_dumps_never_mistake_a_new_model_for_a_dead_one():
    stored = plain([FreshMessage(f"m{i}") for i in range(10)])
    assert [item["m"]["content"] for item in stored] == [f"m{i}" for i in range(10)]
