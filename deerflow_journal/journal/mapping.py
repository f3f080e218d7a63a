"""Pure mapping from LangChain and LangGraph callback payloads to catalog events.

Every function takes what a callback received and returns the keyword arguments of one event
(``event_type``, ``category``, ``content``, ``metadata``) or the values they are built from.
Nothing here does I/O, so each rule is testable on its own (the only state is a cache of how
``detach`` treats each type).

Content may still hold the callback's LangChain messages: the batch that writes them encodes
each as its ``model_dump()`` (``MessageEncoder``), off the callback path (LangSmith's tracer
defers serialisation the same way). Containers, though, are copied in the callback
(``detach``/``detached_event``): the caller may change its own while the batch is encoded.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import fields, is_dataclass
from typing import Any, Literal, TypedDict

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    BaseMessageChunk,
    HumanMessage,
    ToolMessage,
    convert_to_messages,
    message_chunk_to_message,
)
from langchain_core.outputs import ChatGeneration, LLMResult
from langgraph.callbacks import GraphInterruptEvent, GraphResumeEvent
from langgraph.errors import GraphBubbleUp, GraphInterrupt
from langgraph.types import Command, Interrupt
from pydantic import BaseModel

from deerflow_journal.catalog import (
    LLM_AI_RESPONSE_EVENT,
    LLM_ERROR_EVENT,
    LLM_HUMAN_INPUT_EVENT,
    LLM_TOOL_RESULT_EVENT,
    MEMORY_CONTEXT_EVENT,
    MIDDLEWARE_EVENT_PATTERN,
    RUN_END_EVENT,
    RUN_ERROR_EVENT,
    RUN_EVENT_TYPE_MAX_LENGTH,
    RUN_INTERRUPT_EVENT,
    RUN_RESUME_EVENT,
    RUN_START_EVENT,
    TOOL_ERROR_EVENT,
    TOOL_UNRESOLVED_EVENT,
    RunEventDefinition,
)
from deerflow_journal.records import check_text
from deerflow_journal.summary import RunStatus

__all__ = [
    "LAST_AI_MESSAGE_MAX_CHARS",
    "LEAD_AGENT",
    "UNRESOLVED_REASONS",
    "EventKwargs",
    "MessageEncoder",
    "UnresolvedReason",
    "ai_fields",
    "ai_response_event",
    "caller_from_tags",
    "chain_name",
    "control_flow_status",
    "detach",
    "detached_event",
    "holds_messages",
    "human_input_event",
    "input_messages",
    "interrupt_from_error",
    "latest_visible_human",
    "llm_error_event",
    "loose_human_texts",
    "memory_context_event",
    "message_text",
    "messages_in",
    "middleware_event",
    "model_name",
    "node_state",
    "response_messages",
    "run_end_event",
    "run_error_event",
    "run_interrupt_event",
    "run_resume_event",
    "run_start_event",
    "task_chunk",
    "terminal_event",
    "tool_error_event",
    "tool_result_event",
    "tool_result_messages",
    "tool_unresolved_event",
]

logger = logging.getLogger(__name__)

LEAD_AGENT = "lead_agent"
LAST_AI_MESSAGE_MAX_CHARS = 2000
_CALLER_PREFIXES = ("subagent:", MIDDLEWARE_EVENT_PATTERN.prefix)
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")

UnresolvedReason = Literal["interrupted", "cancelled", "run_failed", "run_ended"]


class EventKwargs(TypedDict):
    """The part of a ``put`` call a mapping decides: what happened, not where it is stored."""

    event_type: str
    category: str
    content: Any
    metadata: dict[str, Any]


_AI_RESPONSE_TYPE = LLM_AI_RESPONSE_EVENT.event_type
_TOOL_RESULT_TYPE = LLM_TOOL_RESULT_EVENT.event_type
_MESSAGE_CATEGORY = LLM_AI_RESPONSE_EVENT.category


def _event(definition: RunEventDefinition, content: Any, metadata: dict[str, Any]) -> EventKwargs:
    return {
        "event_type": definition.event_type,
        "category": definition.category,
        "content": content,
        "metadata": metadata,
    }


# -- attribution ---------------------------------------------------------------------------


def caller_from_tags(tags: Sequence[str] | None) -> str:
    """Return the last ``lead_agent``, ``subagent:{name}`` or ``middleware:{name}`` tag.

    LangChain lists inherited (outer) tags first, so the last one is the innermost caller.
    """
    if tags:
        for tag in reversed(tags):
            if tag == LEAD_AGENT:
                return tag
            if tag.startswith(_CALLER_PREFIXES) and not tag.endswith(":"):
                return tag
    return LEAD_AGENT


def chain_name(serialized: Mapping[str, Any] | None, name: str | None) -> str | None:
    """Name a chain from ``serialized["name"]``, else the ``name`` keyword LangGraph passes."""
    if serialized:
        found = serialized.get("name")
        if isinstance(found, str) and found:
            return found
    return name


# -- run lifecycle -------------------------------------------------------------------------


def run_start_event(
    name: str | None, caller: str, metadata: Mapping[str, Any] | None
) -> EventKwargs:
    """``run.start`` for a root chain start."""
    detached = detach(metadata) if metadata else {}  # a copy of a dict: one is enough
    if detached is metadata or type(detached) is not dict:  # a kept object: copied as a dict
        detached = {**detached}
    detached["caller"] = caller
    return _event(RUN_START_EVENT, {"chain": name}, detached)


class MessageEncoder:
    """How one batch encodes what JSON cannot hold (the store's ``default`` hook).

    Pydantic models (LangChain messages) become their ``model_dump()``, computed once per
    object: the same message is often in two events of a batch (its own, and the run's final
    outputs). Other mappings become dicts and tuples (named ones too) lists, as LangGraph
    state holds them; anything else its ``str()``, as in every write.
    """

    __slots__ = ("_dumps",)

    def __init__(self) -> None:
        # Keyed by id(); each entry keeps its model alive, so an id is never reused meanwhile.
        self._dumps: dict[int, tuple[BaseModel, dict[str, Any]]] = {}

    def __call__(self, value: Any) -> Any:
        """Return what ``value`` is stored as."""
        if isinstance(value, BaseModel):
            entry = self._dumps.get(id(value))
            if entry is None:
                entry = self._dumps[id(value)] = (value, value.model_dump())
            return entry[1]
        if isinstance(value, Mapping):
            return dict(value)
        if isinstance(value, tuple):
            return list(value)
        return str(value)


# What ``detach`` does with a value of each type: keep it, copy it as a mapping, or as a list.
_KEEP, _MAPPING, _SEQUENCE = 0, 1, 2
_KINDS: dict[type, int] = {
    **dict.fromkeys((str, int, float, bool, type(None)), _KEEP),
    dict: _MAPPING,
    list: _SEQUENCE,
    tuple: _SEQUENCE,
}
#: The types ``_KINDS`` keeps as they are: a container holding only these is copied in C.
_KEPT = {cls for cls, kind in _KINDS.items() if kind == _KEEP}
# orjson refuses containers nested deeper than this; what lies deeper is left for it to refuse.
_MAX_DEPTH = 254


def _kind(cls: type) -> int:
    kind = _KINDS.get(cls)
    if kind is None:
        if issubclass(cls, BaseModel):  # dumped whole later, even if it is also a Mapping
            kind = _KEEP
        elif issubclass(cls, Mapping):
            kind = _MAPPING
        elif issubclass(cls, list | tuple):
            kind = _SEQUENCE
        else:
            kind = _KEEP
        if len(_KINDS) < 4096:  # bounded: classes made on the fly would pile up
            _KINDS[cls] = kind
            if kind == _KEEP:
                _KEPT.add(cls)
    return kind


def detach(value: Any) -> Any:
    """Copy the containers ``value`` is made of: dicts, other mappings, lists and tuples.

    Events are encoded later, possibly on another thread, and orjson walks a container
    without holding on to its items: one that another thread changes meanwhile (say, the
    outputs a graph returned) can crash the process. Copies taken in the callback cannot
    change, and they store what the callback saw. Mappings become dicts and tuples lists, as
    they are stored anyway; models and other objects are kept as they are (a model is encoded
    through ``model_dump()``, which builds containers of its own). A container found inside
    itself, or deeper than JSON goes, is kept as it is: encoding it fails as it always did.
    """
    cls = type(value)
    if cls is dict:
        # Most are flat (token usage, config metadata): one copy, the check in C.
        return (
            value.copy()
            if _KEPT.issuperset(map(type, value.values()))
            else _detach(value, _MAPPING, None)
        )
    kind = _KINDS.get(cls)
    if kind is None:
        kind = _kind(cls)
    return value if kind == _KEEP else _detach(value, kind, None)


def _detach(value: Any, kind: int, path: set[int] | None) -> Any:
    """Copy a container (``kind``) and the containers in it; ``path`` holds their ancestors
    (``None`` at the top, where it is only made once a container holds another)."""
    key = id(value)
    if path is not None and (key in path or len(path) > _MAX_DEPTH):
        return value
    copied: Any
    # A dict is one copy in C, and so is the check of a container holding no other (most
    # do: lists of messages, flat metadata).
    if kind == _MAPPING:
        copied = value.copy() if type(value) is dict else dict(value.items())
        if _KEPT.issuperset(map(type, copied.values())):
            return copied
        items = copied.items()
    else:
        copied = list(value)
        if _KEPT.issuperset(map(type, copied)):
            return copied
        items = enumerate(copied)
    inner = None
    # Items kept as they are (most of what callbacks see: scalars, messages) stay put.
    for index, item in items:
        item_kind = _KINDS.get(type(item))
        if item_kind is None:
            item_kind = _kind(type(item))
        if item_kind != _KEEP:
            if inner is None:
                inner = set() if path is None else path
                inner.add(key)
            copied[index] = _detach(item, item_kind, inner)
    if inner is not None:
        inner.discard(key)
    return copied


def detached_event(event: dict[str, Any]) -> dict[str, Any]:
    """``event`` with its content detached (see ``detach``); strings and messages stay as is.

    Metadata needs nothing here: the functions of this module build it afresh for each event
    and detach what they put in it from the caller (model usage, a run's config metadata).
    """
    content = event.get("content")
    if _KINDS.get(type(content)) != _KEEP:
        try:
            event["content"] = detach(content)
        except Exception:  # e.g. a mapping that fails to list itself: encoding will say so
            logger.warning("could not copy the content of a %s event", event.get("event_type"))
    return event


def run_end_event(outputs: Any) -> EventKwargs:
    """``run.end`` carrying the root outputs."""
    return _event(RUN_END_EVENT, outputs, {"status": "success"})


def run_error_event(error: BaseException) -> EventKwargs:
    """``run.error`` for a root chain error, cancellation included."""
    return _event(RUN_ERROR_EVENT, str(error), {"error_type": type(error).__name__})


def run_interrupt_event(event: GraphInterruptEvent) -> EventKwargs:
    """``run.interrupt``: the checkpoint a human-in-the-loop pause can be resumed from."""
    content = {
        "checkpoint_id": event.checkpoint_id,
        "checkpoint_ns": list(event.checkpoint_ns),
        "interrupts": [{"id": item.id, "value": item.value} for item in event.interrupts],
    }
    return _event(RUN_INTERRUPT_EVENT, content, {"status": "interrupted"})


def interrupt_from_error(error: GraphInterrupt) -> GraphInterruptEvent:
    """Describe an interrupt known from its error alone (no checkpoint saved, or none that
    LangGraph reported)."""
    interrupts = error.args[0] if error.args else ()
    return GraphInterruptEvent(
        run_id=None,
        status="pending",
        checkpoint_id=None,  # type: ignore[arg-type]
        checkpoint_ns=(),
        interrupts=tuple(item for item in interrupts if isinstance(item, Interrupt)),
    )


def run_resume_event(event: GraphResumeEvent) -> EventKwargs:
    """``run.resume``: the checkpoint a resumed invocation continues from."""
    content = {"checkpoint_id": event.checkpoint_id, "checkpoint_ns": list(event.checkpoint_ns)}
    return _event(RUN_RESUME_EVENT, content, {})


#: Why a requested tool call has no outcome, by what stopped it: the run's terminal status,
#: or the status a control-flow "error" inside the tool stands for (``control_flow_status``).
UNRESOLVED_REASONS: dict[RunStatus, UnresolvedReason] = {
    "success": "run_ended",
    "interrupted": "interrupted",
    "cancelled": "cancelled",
    "error": "run_failed",
}


#: What stops a run without failing it; readers of stored events go by these names
#: (``catalog.CANCELLED_ERROR_TYPES``). Not ``concurrent.futures.CancelledError``: code
#: raises it as a failure (a future cancelled under it), though its name reads cancelled.
_CANCELLED = (
    asyncio.CancelledError,
    GeneratorExit,
    KeyboardInterrupt,
    SystemExit,
)


def control_flow_status(error: BaseException) -> RunStatus | None:
    """The outcome a control-flow "error" stands for (``None`` when it is a real failure)."""
    if isinstance(error, GraphInterrupt):
        return "interrupted"
    # A cancelled task, a stream closed early, Ctrl-C in a sync invoke, or ``sys.exit()`` in
    # one (under ``ainvoke`` asyncio cancels the run's task for it).
    if isinstance(error, _CANCELLED):
        return "cancelled"
    if isinstance(error, GraphBubbleUp):
        return "success"
    return None


def terminal_event(
    outputs: Any, error: BaseException | None, interrupt: GraphInterruptEvent | None
) -> tuple[RunStatus, EventKwargs]:
    """Return a root chain's outcome and its last event.

    LangGraph reports a pause with ``on_interrupt`` and then ends the root chain normally: that
    is ``interrupted`` with ``run.interrupt`` (as is a ``GraphInterrupt`` reaching the root).
    A cancelled task, a stream closed early or Ctrl-C is ``cancelled``, any other error ``error``,
    both with ``run.error``. A handoff to the parent graph (``Command.PARENT``, out of a graph
    that is a root to the journal inside a node of a graph it does not journal) is ``success``,
    its ``run.end`` holding the command's update.
    """
    if error is None and interrupt is None:
        return "success", run_end_event(outputs)
    if error is None or isinstance(error, GraphInterrupt):
        return "interrupted", run_interrupt_event(interrupt or interrupt_from_error(error))
    stopped_by = control_flow_status(error)
    if stopped_by == "success":
        command = error.args[0] if error.args else None
        return "success", run_end_event(getattr(command, "update", None))
    status: RunStatus = "cancelled" if stopped_by == "cancelled" else "error"
    return status, run_error_event(error)


# -- model calls ---------------------------------------------------------------------------


def latest_visible_human(prompts: Sequence[Sequence[BaseMessage]]) -> HumanMessage | None:
    """Return the prompt's most recent human message that is neither hidden nor a summary."""
    if not prompts:
        return None
    for message in reversed(prompts[0]):
        if (
            isinstance(message, HumanMessage)
            and message.additional_kwargs.get("hide_from_ui") is not True
            and message.name != "summary"
        ):
            return message
    return None


def human_input_event(message: HumanMessage) -> EventKwargs:
    """``llm.human.input`` for the lead agent's first visible human message."""
    return _event(LLM_HUMAN_INPUT_EVENT, message, {"caller": LEAD_AGENT})


def message_text(message: BaseMessage) -> str:
    """Return the plain text of a message (text blocks joined)."""
    content = message.content
    return content if isinstance(content, str) else str(message.text)


def _message_list(value: Any) -> list[BaseMessage]:
    if isinstance(value, BaseMessage):
        return [value]
    if isinstance(value, Command):
        return tool_result_messages(value)
    if isinstance(value, list | tuple):
        found: list[BaseMessage] = []
        for item in value:
            if isinstance(item, BaseMessage):
                found.append(item)
            elif isinstance(item, Command):
                found.extend(tool_result_messages(item))
        return found
    return []


def _state_fields(value: Any) -> dict[str, Any] | None:
    """A pydantic or dataclass graph state as a dict of its fields (``None``: not one)."""
    if isinstance(value, BaseModel):
        return None if isinstance(value, BaseMessage) else dict(value)
    if is_dataclass(value) and not isinstance(value, type | Command):  # a Command is an update
        return {f.name: getattr(value, f.name) for f in fields(value)}
    return None


def messages_in(outputs: Any) -> list[BaseMessage]:
    """The messages a chain's inputs or outputs carry at the top level.

    A message, a list of them, a ``Command`` update, or a state dict whose values are those
    (what LangGraph nodes return). Nothing deeper is searched.
    """
    if type(outputs) is not dict:  # most are: no ABC checks for them
        state = _state_fields(outputs)
        if state is not None:
            outputs = state  # a pydantic or dataclass graph state
        elif not isinstance(outputs, Mapping):
            return _message_list(outputs)
    found: list[BaseMessage] = []
    for value in outputs.values():
        found.extend(_message_list(value))
    return found


def node_state(inputs: Any) -> Any:
    """The graph state a node's chain started from: its inputs, or the state beside the tool
    call when the prebuilt agent sends each call to its tool node with it."""
    if type(inputs) is dict and inputs.get("__type") == "tool_call_with_context":
        return inputs.get("state")
    return inputs


def holds_messages(value: Any) -> bool:
    """Whether ``messages_in(value)`` finds any: a graph state's message list is checked up
    to its first message, not through the thread's whole history."""
    if type(value) is not dict:
        state = _state_fields(value)
        if state is not None:
            value = state
        elif not isinstance(value, Mapping):
            return _holds(value)
    return any(_holds(item) for item in value.values())


def _holds(value: Any) -> bool:
    if isinstance(value, list | tuple):
        return any(
            isinstance(item, BaseMessage) or (isinstance(item, Command) and _message_list(item))
            for item in value
        )
    return bool(_message_list(value))


def input_messages(inputs: Any) -> tuple[list[BaseMessage], list[str]]:
    """What a root invocation's inputs bring as messages: the message objects, and the texts
    of human messages given as strings, tuples or dicts (LangGraph builds those anew).

    ``{"messages": ...}`` may hold anything LangGraph's ``add_messages`` takes; other keys
    count only for message objects; a ``Command`` counts for its update.
    """
    if type(inputs) is dict:  # the common case: no ABC checks
        pass
    elif isinstance(inputs, Command):
        inputs = {"messages": _update_messages(inputs.update)}
    elif (state := _state_fields(inputs)) is not None:
        inputs = state  # a pydantic or dataclass graph state
    if type(inputs) is dict or isinstance(inputs, Mapping):
        objects = [m for k, v in inputs.items() if k != "messages" for m in _message_list(v)]
        inputs = inputs.get("messages")
    else:
        objects = []
    if inputs is None:
        return objects, []
    texts: list[str] = []
    for item in inputs if isinstance(inputs, list) else [inputs]:  # as add_messages does
        if isinstance(item, BaseMessage):
            objects.append(item)
        elif (text := _human_text(item)) is not None:
            texts.append(text)
    return objects, texts


def _human_text(item: Any) -> str | None:
    """The text of ``item`` if LangChain makes a human message of it, else ``None``."""
    try:
        (message,) = convert_to_messages([item])
    except Exception:  # not message-like
        return None
    return message_text(message) if isinstance(message, HumanMessage) else None


def loose_human_texts(value: Any) -> list[str]:
    """The texts of the human messages given as dicts or tuples in the lists ``value`` holds
    at its top level, where ``messages_in`` finds message objects (a model called with such
    a list converts them)."""
    if type(value) is not dict:
        state = _state_fields(value)
        if state is not None:
            value = state
        elif not isinstance(value, Mapping):
            value = {None: value}
    texts: list[str] = []
    for items in value.values():
        if not isinstance(items, list):
            continue
        for item in items:
            if isinstance(item, dict | tuple) and (text := _human_text(item)) is not None:
                texts.append(text)
    return texts


def completion_usage(llm_output: Mapping[str, Any] | None) -> dict[str, int] | None:
    usage = (llm_output or {}).get("token_usage")
    if not isinstance(usage, Mapping):
        return None
    input_tokens = int(usage.get("prompt_tokens") or usage.get("input_tokens") or 0)
    output_tokens = int(usage.get("completion_tokens") or usage.get("output_tokens") or 0)
    total = int(usage.get("total_tokens") or 0) or input_tokens + output_tokens
    return {"input_tokens": input_tokens, "output_tokens": output_tokens, "total_tokens": total}


def response_messages(response: LLMResult) -> list[AIMessage]:
    """Return one plain AI message per generation of an LLM result.

    Streamed chunks become ordinary AI messages; a completion model's text becomes an AI
    message carrying the model name and token usage of the result's ``llm_output``.
    """
    first = response.generations
    if len(first) == 1 and len(first[0]) == 1:  # the common case: one message
        only = first[0][0]
        if type(only) is ChatGeneration and type(only.message) is AIMessage:
            return [only.message]
    messages: list[AIMessage] = []
    for generations in response.generations:
        for generation in generations:
            if isinstance(generation, ChatGeneration):
                message = generation.message
                if type(message) is not AIMessage and isinstance(message, BaseMessageChunk):
                    message = message_chunk_to_message(message)
                if isinstance(message, AIMessage):
                    messages.append(message)
                continue
            llm_output = response.llm_output or {}
            name = llm_output.get("model_name") or llm_output.get("model")
            usage = None if messages else completion_usage(llm_output)
            messages.append(
                AIMessage(
                    content=generation.text,
                    response_metadata={"model_name": name} if name else {},
                    usage_metadata=usage,
                )
            )
    return messages


def model_name(response_metadata: Mapping[str, Any]) -> str:
    """Name the model of a response from its metadata: ``model_name`` or ``model``, else
    ``unknown``."""
    found = response_metadata.get("model_name") or response_metadata.get("model")
    return found if isinstance(found, str) and found else "unknown"


def ai_fields(message: AIMessage) -> dict[str, Any]:
    """The fields the journal reads of a response, read one by one (a subclass may compute
    them; a plain ``AIMessage``'s are its ``__dict__``)."""
    return {
        "content": message.content,
        "tool_calls": message.tool_calls,
        "usage_metadata": message.usage_metadata,
        "response_metadata": message.response_metadata,
    }


def ai_response_event(
    message: AIMessage,
    values: Mapping[str, Any],
    *,
    caller: str,
    latency_ms: int | None,
    llm_call_index: int,
) -> EventKwargs:
    """``llm.ai.response`` for one generated message, given its ``ai_fields`` values."""
    usage = values["usage_metadata"]
    return {  # _event, inlined: one per model call
        "event_type": _AI_RESPONSE_TYPE,
        "category": _MESSAGE_CATEGORY,
        "content": message,
        "metadata": {
            "caller": caller,
            "usage": detach(usage) if usage else {},
            "latency_ms": latency_ms,
            "llm_call_index": llm_call_index,
        },
    }


def schema_name(structured_output_format: Any) -> str | None:
    """The tool name a ``with_structured_output`` call's schema answers with: the title of
    the JSON schema LangChain passes as ``ls_structured_output_format`` (``None``: unknown,
    then no call of the response is a tool's)."""
    schema = (
        structured_output_format.get("schema")
        if isinstance(structured_output_format, Mapping)
        else None
    )
    name = schema.get("title") if isinstance(schema, Mapping) else None
    return name if isinstance(name, str) else None


def llm_error_event(error: BaseException, caller: str) -> EventKwargs:
    """``llm.error`` for a failed model call."""
    return _event(
        LLM_ERROR_EVENT, str(error), {"caller": caller, "error_type": type(error).__name__}
    )


# -- tools ---------------------------------------------------------------------------------


def _update_messages(update: Any) -> Any:
    if isinstance(update, Mapping):
        return update.get("messages")
    if isinstance(update, list | tuple):
        found = [value for key, value in update if key == "messages"]
        return found[-1] if found else None
    return None


def tool_result_messages(output: Any) -> list[BaseMessage]:
    """Return the messages a tool output carries: a ``ToolMessage`` or a ``Command`` update."""
    if isinstance(output, ToolMessage):
        return [output]
    if not isinstance(output, Command):
        return []
    messages = _update_messages(output.update)
    if messages is None:
        return []
    # Like LangGraph's add_messages: anything but a list is one message-like value.
    return convert_to_messages(messages if isinstance(messages, list) else [messages])


def tool_result_event(message: BaseMessage, caller: str, tool_call_id: str | None) -> EventKwargs:
    """``llm.tool.result`` for one message a tool returned, answering ``tool_call_id``."""
    return {  # _event, inlined: one per tool call
        "event_type": _TOOL_RESULT_TYPE,
        "category": _MESSAGE_CATEGORY,
        "content": message,
        "metadata": {"caller": caller}
        if tool_call_id is None
        else {"caller": caller, "tool_call_id": tool_call_id},
    }


def tool_error_event(
    *,
    tool_call_id: str | None,
    name: str | None,
    error: BaseException,
    caller: str,
    latency_ms: int | None,
) -> EventKwargs:
    """``tool.error`` for a tool that raised."""
    content = {
        "tool_call_id": tool_call_id,
        "name": name,
        "error_type": type(error).__name__,
        "error": str(error),
    }
    metadata = {"caller": caller, "tool_call_id": tool_call_id, "latency_ms": latency_ms}
    return _event(TOOL_ERROR_EVENT, content, metadata)


def tool_unresolved_event(
    tool_call_id: str, name: str | None, reason: UnresolvedReason
) -> EventKwargs:
    """``tool.unresolved`` for a requested tool call the run ended without."""
    content = {"tool_call_id": tool_call_id, "name": name, "reason": reason}
    return _event(TOOL_UNRESOLVED_EVENT, content, {"tool_call_id": tool_call_id})


# -- subagents ----------------------------------------------------------------------------


def task_chunk(name: str, data: Any) -> dict[str, Any] | None:
    """Return the ``task_*`` subagent chunk a custom event carries, or ``None``.

    The chunk type comes from ``data["type"]`` or, when ``data`` has none, the event name.
    """
    if not isinstance(data, Mapping):
        return None
    chunk_type = data.get("type", name)
    if not isinstance(chunk_type, str) or not chunk_type.startswith("task_"):
        return None
    return {**data, "type": chunk_type}


# -- recorders -----------------------------------------------------------------------------


def middleware_event(
    tag: str, *, name: str, hook: str, action: str, changes: Mapping[str, Any]
) -> EventKwargs:
    """``middleware:{tag}``; ``ValueError`` for a tag outside the pattern's length limits or
    one no store can keep (control characters, lone surrogates), before anything is written."""
    event_type = check_text(
        MIDDLEWARE_EVENT_PATTERN.event_type(tag), "middleware tag", RUN_EVENT_TYPE_MAX_LENGTH
    )
    if not isinstance(changes, Mapping):
        raise TypeError(f"changes must be a dict, got {type(changes).__name__}")
    for field, value in (("name", name), ("hook", hook), ("action", action)):
        if not isinstance(value, str):
            raise TypeError(f"{field} must be a string, got {type(value).__name__}")
    return {
        "event_type": event_type,
        "category": MIDDLEWARE_EVENT_PATTERN.category,
        "content": {"name": name, "hook": hook, "action": action, "changes": dict(changes)},
        "metadata": {"caller": event_type},  # its caller name is its type
    }


def memory_context_event(content_sha256: str) -> EventKwargs:
    """``context:memory``; ``ValueError`` unless the digest is 64 lowercase hex characters."""
    if not isinstance(content_sha256, str) or not _SHA256_HEX.fullmatch(content_sha256):
        raise ValueError(
            f"content_sha256 must be 64 lowercase hex characters, got {content_sha256!r}"
        )
    return _event(MEMORY_CONTEXT_EVENT, {"content_sha256": content_sha256}, {})
