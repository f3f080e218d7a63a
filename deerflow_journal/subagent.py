"""Map LangGraph ``task_*`` custom-stream chunks to ``subagent.*`` events (pure, no I/O).

A subagent executor streams ``task_started``, ``task_running`` (one per captured step
message) and one terminal ``task_*`` chunk. ``subagent_run_event`` turns each into ``put``
keyword arguments (without thread and run ids) or ``None`` when the chunk is malformed, and it
never raises, so a journal can call it from inside a callback.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, MutableSequence, MutableSet, Sequence
from typing import Any

from deerflow_journal.catalog import SUBAGENT_END_EVENT, SUBAGENT_START_EVENT, SUBAGENT_STEP_EVENT
from deerflow_journal.records import ID_MAX_LENGTH, encode_json

__all__ = [
    "SUBAGENT_END_STATUSES",
    "SUBAGENT_EVENT_CATEGORY",
    "SUBAGENT_STEP_MAX_CHARS",
    "build_subagent_step",
    "capture_new_step_messages",
    "capture_step_message",
    "subagent_run_event",
    "truncate_step_text",
]

logger = logging.getLogger(__name__)

#: Longest step text, tool-call argument JSON, result or error kept in an event.
SUBAGENT_STEP_MAX_CHARS = 8192
SUBAGENT_EVENT_CATEGORY = SUBAGENT_STEP_EVENT.category

#: Terminal chunk type -> ``subagent.end`` status.
SUBAGENT_END_STATUSES = {
    "task_completed": "completed",
    "task_failed": "failed",
    "task_cancelled": "cancelled",
    "task_timed_out": "timed_out",
}
_USAGE_KEYS = ("input_tokens", "output_tokens", "total_tokens")
_AI_TYPES = frozenset({"ai", "AIMessage", "AIMessageChunk", "assistant"})
_TOOL_TYPES = frozenset({"tool", "ToolMessage", "ToolMessageChunk"})


def truncate_step_text(text: str, max_chars: int) -> tuple[str, bool]:
    """Return ``text`` cut to ``max_chars`` characters and whether anything was cut."""
    if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 0:
        raise ValueError(f"max_chars must be a non-negative int, got {max_chars!r}")
    if len(text) <= max_chars:
        return text, False
    return text[:max_chars], True


def _message_dict(message: Any) -> dict[str, Any] | None:
    """A message as a dict: ``model_dump()`` of a message object, a mapping as it is."""
    if isinstance(message, Mapping):
        return dict(message)
    dump = getattr(message, "model_dump", None)
    if callable(dump) and hasattr(message, "content"):
        dumped = dump()
        return dumped if isinstance(dumped, dict) else None
    return None


def _message_kind(message: Mapping[str, Any]) -> str | None:
    """``"ai"``, ``"tool"`` or ``None`` from a message dict's ``type`` (or ``role``)."""
    kind = message.get("type", message.get("role"))
    if kind in _TOOL_TYPES:
        return "tool"
    if kind in _AI_TYPES:
        return "ai"
    return None


def _content_text(content: Any) -> str:
    """The text of message content: a string, or the text parts of a content-block list."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, Mapping) and isinstance(block.get("text"), str):
                parts.append(block["text"])
        return "".join(parts)
    return encode_json(content)


def _step_tool_call(call: Any, max_chars: int) -> dict[str, Any] | None:
    if not isinstance(call, Mapping):
        return None
    name = call.get("name")
    args = call.get("args", {})
    args_json = encode_json(args)
    cut, args_truncated = truncate_step_text(args_json, max_chars)
    built: dict[str, Any] = {"name": name if isinstance(name, str) else None, "args": args}
    if args_truncated:  # the flag appears only on cut args
        built.update(args=cut, args_truncated=True)
    return built


def build_subagent_step(
    message: Mapping[str, Any] | Any,
    *,
    task_id: str,
    message_index: int,
    max_chars: int = SUBAGENT_STEP_MAX_CHARS,
) -> dict[str, Any]:
    """Build ``subagent.step`` content from one step message (a dict or a message object).

    Tool messages become kind ``"tool"`` with ``tool_name``; anything else kind ``"ai"`` with
    ``tool_calls`` as ``{name, args}``. ``text`` is cut to ``max_chars`` and ``truncated``
    says so; tool-call args whose JSON is longer become that JSON, cut, with
    ``args_truncated: true`` (absent otherwise).
    """
    data = _message_dict(message) or {}
    text, truncated = truncate_step_text(_content_text(data.get("content")), max_chars)
    step: dict[str, Any] = {
        "task_id": task_id,
        "message_index": message_index,
        "kind": "tool" if _message_kind(data) == "tool" else "ai",
        "text": text,
        "truncated": truncated,
    }
    if step["kind"] == "tool":
        name = data.get("name")
        step["tool_name"] = name if isinstance(name, str) else None
        call_id = data.get("tool_call_id")
        if isinstance(call_id, str):
            step["tool_call_id"] = call_id
    else:
        calls = data.get("tool_calls")
        calls = calls if isinstance(calls, list) else []
        built = (_step_tool_call(call, max_chars) for call in calls)
        step["tool_calls"] = [call for call in built if call is not None]
    return step


def _valid_task_id(chunk: Mapping[str, Any]) -> str | None:
    task_id = chunk.get("task_id")
    if not isinstance(task_id, str) or not task_id:
        return None
    if len(task_id) > ID_MAX_LENGTH:  # stores index it, and refuse a longer one
        _warn_task_id_too_long(task_id[:40], len(task_id))
        return None
    return task_id


@functools.lru_cache(maxsize=64)  # once per task, not once per chunk of it; keyed small
def _warn_task_id_too_long(start: str, length: int) -> None:
    logger.warning(
        "dropping the chunks of a subagent task whose id is %d characters (at most %d are "
        "stored): %s…",
        length,
        ID_MAX_LENGTH,
        start,
    )


def _start_event(chunk: Mapping[str, Any], task_id: str) -> dict[str, Any]:
    description = chunk.get("description")
    if description is not None and not isinstance(description, str):
        description = str(description)
    return _event(SUBAGENT_START_EVENT.event_type, {"task_id": task_id, "description": description})


def _step_event(chunk: Mapping[str, Any], task_id: str) -> dict[str, Any] | None:
    index = chunk.get("message_index")
    # Above 64 bits JSON stores would keep it as text, which the contract refuses.
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < 2**63:
        return None
    message = _message_dict(chunk.get("message"))
    if message is None:
        return None
    content = build_subagent_step(message, task_id=task_id, message_index=index)
    return _event(SUBAGENT_STEP_EVENT.event_type, content, message_index=index)


def _valid_usage(usage: Any) -> dict[str, int] | None:
    """The token counts of ``usage`` when all three are non-negative ints, else ``None``."""
    if not isinstance(usage, Mapping):
        return None
    counts = {key: usage.get(key) for key in _USAGE_KEYS}
    for value in counts.values():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return None
    return counts  # type: ignore[return-value]


def _end_event(chunk: Mapping[str, Any], task_id: str, status: str) -> dict[str, Any]:
    content: dict[str, Any] = {"task_id": task_id, "status": status}
    model_name = chunk.get("model_name")
    if isinstance(model_name, str) and model_name:
        content["model_name"] = model_name
    usage = _valid_usage(chunk.get("usage"))
    if usage is not None:
        content["usage"] = usage
    for key in ("result", "error"):
        value = chunk.get(key)
        if value is None:
            continue
        if isinstance(value, BaseException):  # its message (its JSON would be it in quotes)
            text = str(value) or type(value).__name__
        else:
            text = value if isinstance(value, str) else encode_json(value)
        content[key], content[f"{key}_truncated"] = truncate_step_text(
            text, SUBAGENT_STEP_MAX_CHARS
        )
    return _event(SUBAGENT_END_EVENT.event_type, content)


def _event(event_type: str, content: dict[str, Any], **metadata: Any) -> dict[str, Any]:
    return {
        "event_type": event_type,
        "category": SUBAGENT_EVENT_CATEGORY,
        "content": content,
        "metadata": {"task_id": content["task_id"], **metadata},
    }


def _map_chunk(chunk: Any) -> dict[str, Any] | None:
    if not isinstance(chunk, Mapping):
        return None
    chunk_type = chunk.get("type")
    task_id = _valid_task_id(chunk)
    if not isinstance(chunk_type, str) or task_id is None:
        return None
    if chunk_type == "task_started":
        return _start_event(chunk, task_id)
    if chunk_type == "task_running":
        return _step_event(chunk, task_id)
    status = SUBAGENT_END_STATUSES.get(chunk_type)
    return None if status is None else _end_event(chunk, task_id, status)


def subagent_run_event(chunk: Any) -> dict[str, Any] | None:
    """Map one ``task_*`` chunk to ``put`` kwargs (no thread/run ids), or ``None``.

    Returns ``{event_type, category, content, metadata}`` for ``task_started``,
    ``task_running`` and the terminal ``task_completed|failed|cancelled|timed_out`` chunks.
    Anything malformed (no non-empty string ``task_id``, a bad ``message_index`` or
    ``message``, an unknown type, a non-mapping chunk) gives ``None``; this never raises.
    """
    try:
        return _map_chunk(chunk)
    except Exception:
        logger.warning("dropping a subagent chunk that could not be mapped", exc_info=True)
        return None


def capture_step_message(
    message: Any, captured: MutableSequence[dict[str, Any]], seen_ids: MutableSet[str]
) -> bool:
    """Append the ``model_dump()`` of a new AI or tool message to ``captured``.

    A message is new when its id is not in ``seen_ids`` (which is updated) or, without an
    id, when no equal message was captured. Other message types are ignored. Returns whether
    the message was appended.
    """
    data = _message_dict(message)
    if data is None or _message_kind(data) is None:
        return False
    message_id = data.get("id")
    if isinstance(message_id, str) and message_id:
        if message_id in seen_ids:
            return False
        seen_ids.add(message_id)
    elif data in captured:
        return False
    captured.append(data)
    return True


def capture_new_step_messages(
    messages: Sequence[Any],
    captured: MutableSequence[dict[str, Any]],
    seen_ids: MutableSet[str],
    processed_count: int,
) -> int:
    """Capture the step messages a ``stream_mode="values"`` history gained; return the cursor.

    Every message from ``processed_count`` on is captured when the history grew. When it did
    not grow only its last message is re-checked; when it shrank (a summarisation rewrote
    it) the cursor restarts from the new end. Pass the returned cursor to the next call.
    """
    count = len(messages)
    if count > processed_count:
        for message in messages[max(processed_count, 0) :]:
            capture_step_message(message, captured, seen_ids)
    elif count:
        capture_step_message(messages[-1], captured, seen_ids)
    return count
