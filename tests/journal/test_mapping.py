"""The pure callback-to-event rules of ``journal/mapping.py``, one test per rule (no journal,
no store); the events are described in docs/events.md."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, NamedTuple

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, Generation, LLMResult
from langgraph.callbacks import GraphInterruptEvent, GraphResumeEvent
from langgraph.errors import GraphInterrupt
from langgraph.types import Command, Interrupt
from pydantic import BaseModel, Field, PlainSerializer, field_serializer

from deerflow_journal import timeline_rows
from deerflow_journal.catalog import CANCELLED_ERROR_TYPES
from deerflow_journal.journal import mapping
from deerflow_journal.records import decode_json, encode_json
from tests.journal.agents import ai


def plain(value: Any) -> Any:
    """``value`` as a journal batch stores it."""
    return decode_json(encode_json(value, mapping.MessageEncoder()))


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


@dataclass
class Hit:
    doc: str
    score: float


def test_message_dumps_store_every_message_kind_exactly_as_its_model_dump():
    messages = [
        HumanMessage("hi", id="h", name="ann", custom_field={"x": 1}),
        AIMessage(
            "",
            id="a",
            tool_calls=[{"name": "f", "args": {"q": 1}, "id": "c1"}],
            usage_metadata={"input_tokens": 1, "output_tokens": 2, "total_tokens": 3},
            response_metadata={"model_name": "m"},
        ),
        AIMessageChunk("part", id="k"),
        ToolMessage("out", tool_call_id="c1", artifact={"rows": (1, 2)}, status="error"),
        ToolMessage("found", tool_call_id="c2", artifact=Hit("doc", 0.5)),
    ]
    for message in messages:
        assert plain(message) == decode_json(encode_json(message.model_dump()))


class Celsius(BaseModel):
    degrees: float

    @field_serializer("degrees")
    def _rounded(self, degrees: float) -> str:
        return f"{degrees:.0f} C"


class Reading(BaseModel):
    when: str = Field(exclude=True)
    value: Celsius


class Labelled(BaseModel):
    label: Annotated[str, PlainSerializer(lambda text: text.upper())]


def test_message_dumps_keep_custom_model_serialisation():
    # Serializers and excluded fields only take effect through model_dump().
    assert plain(Celsius(degrees=21.4)) == {"degrees": "21 C"}
    assert plain(Reading(when="now", value=Celsius(degrees=3))) == {"value": {"degrees": "3 C"}}
    assert plain(Labelled(label="warm")) == {"label": "WARM"}


def test_message_dumps_dump_each_model_once_per_batch():
    message = AIMessage("x", id="a")
    dumps = mapping.MessageEncoder()
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


def test_run_error_names_the_error_type():
    event = mapping.run_error_event(asyncio.CancelledError())
    assert event == {
        "event_type": "run.error",
        "category": "error",
        "content": "",
        "metadata": {"error_type": "CancelledError"},
    }


def test_run_interrupt_links_the_checkpoint_and_interrupts():
    event = mapping.run_interrupt_event(
        GraphInterruptEvent(
            run_id=None,
            status="pending",
            checkpoint_id="cp1",
            checkpoint_ns=("a", "b"),
            interrupts=(Interrupt(value={"q": "ok?"}, id="i1"),),
        )
    )
    assert event["event_type"] == "run.interrupt" and event["category"] == "outputs"
    assert event["content"] == {
        "checkpoint_id": "cp1",
        "checkpoint_ns": ["a", "b"],
        "interrupts": [{"id": "i1", "value": {"q": "ok?"}}],
    }
    assert event["metadata"] == {"status": "interrupted"}


def test_interrupt_from_an_error_has_no_checkpoint():
    error = GraphInterrupt((Interrupt(value="v", id="i"),))
    event = mapping.run_interrupt_event(mapping.interrupt_from_error(error))
    assert event["content"] == {
        "checkpoint_id": None,
        "checkpoint_ns": [],
        "interrupts": [{"id": "i", "value": "v"}],
    }


def test_run_resume_carries_the_checkpoint():
    event = mapping.run_resume_event(
        GraphResumeEvent(run_id=None, status="pending", checkpoint_id="cp", checkpoint_ns=())
    )
    assert event["event_type"] == "run.resume" and event["category"] == "trace"
    assert event["content"] == {"checkpoint_id": "cp", "checkpoint_ns": []}


def test_latest_visible_human_skips_hidden_and_summary_messages():
    prompt = [
        HumanMessage("first"),
        AIMessage("reply"),
        HumanMessage("visible"),
        HumanMessage("hidden", additional_kwargs={"hide_from_ui": True}),
        HumanMessage("the summary so far", name="summary"),
    ]
    found = mapping.latest_visible_human([prompt])
    assert found is not None and found.content == "visible"
    assert mapping.latest_visible_human([[AIMessage("x")]]) is None
    assert mapping.latest_visible_human([]) is None


def test_human_input_is_the_message_dump_for_the_lead_agent():
    message = HumanMessage("hi", id="h1")
    event = mapping.human_input_event(message)
    assert event["event_type"] == "llm.human.input" and event["category"] == "message"
    assert plain(event["content"]) == message.model_dump()
    assert event["metadata"] == {"caller": "lead_agent"}


def test_ai_response_is_the_message_dump_with_call_metadata():
    message = ai("hello", calls=[("add", {"a": 1}, "c1")], msg_id="m1")
    event = mapping.ai_response_event(
        message, mapping.ai_fields(message), caller="lead_agent", latency_ms=7, llm_call_index=2
    )
    assert event["event_type"] == "llm.ai.response" and event["category"] == "message"
    content = plain(event["content"])
    assert content == message.model_dump() and content["type"] == "ai"
    assert event["metadata"] == {
        "caller": "lead_agent",
        "usage": dict(message.usage_metadata),
        "latency_ms": 7,
        "llm_call_index": 2,
    }


def test_streamed_chunks_become_a_plain_ai_message():
    chunk = AIMessageChunk(content="hel", id="m") + AIMessageChunk(
        content="lo",
        id="m",
        tool_call_chunks=[{"name": "add", "args": '{"a": 1}', "id": "c1", "index": 0}],
        usage_metadata={"input_tokens": 3, "output_tokens": 2, "total_tokens": 5},
    )
    result = LLMResult(generations=[[ChatGenerationChunk(message=chunk)]])
    (message,) = mapping.response_messages(result)
    assert type(message) is AIMessage
    dump = message.model_dump()
    assert dump["type"] == "ai" and dump["content"] == "hello"
    assert "tool_call_chunks" not in dump and "chunk_position" not in dump
    assert dump["tool_calls"][0]["args"] == {"a": 1}


def test_completion_text_becomes_an_ai_message_with_model_and_usage():
    result = LLMResult(
        generations=[[Generation(text="forty-two")]],
        llm_output={
            "model_name": "text-model",
            "token_usage": {"prompt_tokens": 4, "completion_tokens": 3},
        },
    )
    (message,) = mapping.response_messages(result)
    assert message.content == "forty-two"
    assert mapping.model_name(message.response_metadata) == "text-model"
    assert message.usage_metadata == {"input_tokens": 4, "output_tokens": 3, "total_tokens": 7}


def test_one_ai_message_per_generation():
    result = LLMResult(
        generations=[
            [ChatGeneration(message=AIMessage("a")), ChatGeneration(message=AIMessage("b"))]
        ]
    )
    assert [m.content for m in mapping.response_messages(result)] == ["a", "b"]


def test_model_name_falls_back_to_model_then_unknown():
    assert mapping.model_name({"model": "m2"}) == "m2"
    assert mapping.model_name(AIMessage("").response_metadata) == "unknown"


def test_llm_error_is_the_error_text():
    event = mapping.llm_error_event(ValueError("rate limited"), "lead_agent")
    assert event["event_type"] == "llm.error" and event["category"] == "trace"
    assert event["content"] == "rate limited"


def test_tool_message_output_is_one_tool_result():
    message = ToolMessage("3", tool_call_id="c1", name="add")
    assert mapping.tool_result_messages(message) == [message]
    event = mapping.tool_result_event(message, "lead_agent", message.tool_call_id)
    assert event["event_type"] == "llm.tool.result" and event["category"] == "message"
    assert plain(event["content"]) == message.model_dump()
    assert event["metadata"] == {"caller": "lead_agent", "tool_call_id": "c1"}


def test_command_output_gives_one_tool_result_per_message():
    first = ToolMessage("done", tool_call_id="c1")
    second = ToolMessage("also", tool_call_id="c2")
    assert mapping.tool_result_messages(Command(update={"messages": [first, second]})) == [
        first,
        second,
    ]
    assert mapping.tool_result_messages(Command(update=[("messages", [first])])) == [first]
    assert mapping.tool_result_messages(Command(update={"other": 1})) == []
    assert mapping.tool_result_messages("plain string") == []


def test_tool_error_content_and_metadata():
    event = mapping.tool_error_event(
        tool_call_id="c1", name="add", error=KeyError("x"), caller="lead_agent", latency_ms=3
    )
    assert event["event_type"] == "tool.error" and event["category"] == "error"
    assert event["content"] == {
        "tool_call_id": "c1",
        "name": "add",
        "error_type": "KeyError",
        "error": "'x'",
    }
    assert event["metadata"] == {"caller": "lead_agent", "tool_call_id": "c1", "latency_ms": 3}


def test_tool_unresolved_names_the_reason():
    event = mapping.tool_unresolved_event("c1", "add", "interrupted")
    assert event == {
        "event_type": "tool.unresolved",
        "category": "trace",
        "content": {"tool_call_id": "c1", "name": "add", "reason": "interrupted"},
        "metadata": {"tool_call_id": "c1"},
    }


def test_middleware_event_validates_the_tag_length():
    event = mapping.middleware_event(
        "guardrail", name="g", hook="before_model", action="blocked", changes={"x": 1}
    )
    assert event["event_type"] == "middleware:guardrail"
    assert event["category"] == "middleware"
    assert event["content"] == {
        "name": "g",
        "hook": "before_model",
        "action": "blocked",
        "changes": {"x": 1},
    }
    for bad in ("", "t" * 22):
        with pytest.raises(ValueError):
            mapping.middleware_event(bad, name="g", hook="h", action="a", changes={})
    with pytest.raises(TypeError, match="changes"):
        mapping.middleware_event("guardrail", name="g", hook="h", action="a", changes=[])


def test_memory_context_needs_64_lowercase_hex_characters():
    digest = "ab" * 32
    assert mapping.memory_context_event(digest)["content"] == {"content_sha256": digest}
    for bad in ("AB" * 32, "ab" * 31, "zz" * 32, None):
        with pytest.raises(ValueError, match="content_sha256"):
            mapping.memory_context_event(bad)  # type: ignore[arg-type]


def test_detach_copies_every_container_and_keeps_everything_else():
    message = AIMessage("x", id="a")
    value = {"p": Point(1, [2]), "m": FreshMessage("f"), "list": [message, (3, {"k": "v"})]}
    copied = mapping.detach(value)
    assert copied == {"p": [1, [2]], "m": {"m": AIMessage("f")}, "list": [message, [3, {"k": "v"}]]}
    assert copied["list"][0] is message
    assert copied["p"][1] is not value["p"][1]
    assert copied["list"][1][1] is not value["list"][1][1]
    assert plain(copied) == plain(value)


def test_detach_keeps_a_container_found_inside_itself():
    looped: list[Any] = []
    looped.append(looped)
    copied = mapping.detach(looped)
    assert copied is not looped and copied[0] is looped
    twice: dict[str, Any] = {}
    twice["a"] = twice["b"] = twice  # two ways back in: copying it whole would never end
    assert mapping.detach(twice) == {"a": twice, "b": twice}


def test_detach_stops_at_the_depth_json_refuses_anyway():
    deep: list[Any] = []
    for _ in range(300):
        deep = [deep]
    copied, depth = mapping.detach(deep), 0
    while copied is not deep:
        copied, deep, depth = copied[0], deep[0], depth + 1
    assert depth == 255  # levels 0 to 254 are copies, then the original goes on


@pytest.mark.parametrize(
    "error",
    [
        asyncio.CancelledError(),
        GeneratorExit(),
        KeyboardInterrupt(),
        SystemExit(3),
    ],
)
def test_what_cancels_a_run_is_read_back_as_cancelled(error):
    """The summary decides by type, the timeline and OTel by the stored name: they agree."""
    assert mapping.control_flow_status(error) == "cancelled"
    assert type(error).__name__ in CANCELLED_ERROR_TYPES
    event = {**mapping.run_error_event(error), "seq": 1, "created_at": "2026-12-03T00:00:00Z"}
    (row,) = timeline_rows([event])
    assert row.status == "cancelled"
