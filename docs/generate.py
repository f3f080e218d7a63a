#!/usr/bin/env python3
"""Generate ``docs/events.md`` from ``contracts/run_event_stream_contract.json``.

    .venv/bin/python docs/generate.py          # rewrite docs/events.md
    .venv/bin/python docs/generate.py --check  # exit 1 if docs/events.md is out of date

Names, categories, field tables and the contract's producer notes come from the contract.
What it does not say is kept in this file, checked against the package's code by hand: the
functions that write each event (``WRITTEN_BY``), a word on what each field means
(``FIELD_NOTES``), the fields this package writes beyond the contract (``ALSO_WRITTEN``), and
an example record per event (``EXAMPLES``, used only when the contract entry has no
``examples`` of its own).
Before writing, every example is checked with ``deerflow_journal.validate_event`` (which needs
jsonschema: the checkout's ``.venv`` has it). ``tests/test_docs.py`` fails while the page
differs from what this script renders.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from deerflow_journal import load_contract, validate_event
from deerflow_journal.records import make_record

ROOT = Path(__file__).resolve().parent.parent
CONTRACT_PATH = "contracts/run_event_stream_contract.json"
EVENTS_PAGE = ROOT / "docs" / "events.md"
COMMAND = ".venv/bin/python docs/generate.py"

# -- what the contract does not say ----------------------------------------------------------

#: Who writes each event: the RunJournal callback or recorder, and the function building it.
WRITTEN_BY: dict[str, str] = {
    "run.start": (
        "`RunJournal.on_chain_start` for a root chain (`_start_root` -> `_start_run`); a chat "
        "model, completion model, tool or retriever called with no chain around it starts a run "
        "too (`_start_leaf` from `on_chat_model_start`, `on_llm_start`, `on_tool_start`, "
        "`on_retriever_start`). Built by `mapping.run_start_event`."
    ),
    "run.end": (
        "`RunJournal.on_chain_end` of the root chain (or the end callback of a model, tool or "
        "retriever called directly, through `_leaf_ended`) -> `_end_run`, where "
        "`mapping.terminal_event` picks `mapping.run_end_event`; `_close_run` writes it last."
    ),
    "run.error": (
        "`RunJournal.on_chain_error` of the root chain (or `on_llm_error`, `on_tool_error`, "
        "`on_retriever_error` of one called directly) -> `_end_run` -> `mapping.terminal_event` "
        "-> `mapping.run_error_event`. A cancelled run, or a stream closed early, gets it too "
        "(summary status `cancelled`)."
    ),
    "run.interrupt": (
        "`RunJournal.on_interrupt` remembers the pause; the root chain's end (`_end_run`) then "
        "writes it through `mapping.terminal_event` -> `mapping.run_interrupt_event`. A "
        "`GraphInterrupt` reaching the root as an error is described by "
        "`mapping.interrupt_from_error` (no checkpoint: `checkpoint_id` is null)."
    ),
    "run.resume": "`RunJournal.on_resume` -> `mapping.run_resume_event`.",
    "llm.human.input": (
        "`RunJournal.on_chat_model_start` for a lead-agent call whose prompt holds a human "
        "message new in this run (`mapping.latest_visible_human`, `_write_human` -> "
        "`mapping.human_input_event`); once per run. A run interrupted before any model saw "
        "the question (`interrupt_before`) writes it in `_close_run`."
    ),
    "llm.ai.response": (
        "`RunJournal.on_llm_end` -> `mapping.response_messages` (one message per generation) "
        "-> `mapping.ai_response_event`."
    ),
    "llm.tool.result": (
        "`RunJournal.on_tool_end` -> `mapping.tool_result_messages` -> "
        "`mapping.tool_result_event`. A `ToolMessage` no tool callback produced (LangGraph's "
        "`ToolNode` answering an unknown tool) is written by `_reconcile`, from the next "
        "lead-agent prompt (`on_chat_model_start`) or the root outputs (`_end_run`). Of a "
        "`Command` update, only the messages that the state the tool's node started from "
        "does not hold (`_new_messages`: a handoff repeats that whole state). A result waits "
        "for the nested chain that made its call (a graph node) to end, or for a model call "
        "of its caller (`ToolCallOutcomes.returned`, `chain_ended`): a node attempt that "
        "fails (not by an interrupt, a cancellation or a handoff) holds its results like "
        "errors, and its retry's answer replaces them; an answer the same as the call's last "
        "one is not written again (`ToolCallOutcomes.answered`)."
    ),
    "llm.error": "`RunJournal.on_llm_error` -> `mapping.llm_error_event`.",
    "tool.error": (
        "`RunJournal.on_tool_error` -> `_tool_failed` -> `mapping.tool_error_event`. The error "
        "of a call with an id is held (`ToolCallOutcomes.failed`) and written at the caller's "
        "next model call, `flush()` or the run's end (`ToolCallOutcomes.settle`), so a retry "
        "that succeeds leaves only its result."
    ),
    "tool.unresolved": (
        "`RunJournal._close_run`, for each call `ToolCallOutcomes.unresolved` returns -> "
        "`mapping.tool_unresolved_event` (reason from `mapping.UNRESOLVED_REASONS`)."
    ),
    "context:memory": (
        "`RunJournal.record_memory_context(content_sha256=...)` -> "
        "`mapping.memory_context_event`; at most once per run."
    ),
    "subagent.start": (
        "`subagent.subagent_run_event` for a `task_started` chunk, called by "
        "`RunJournal.on_custom_event` (a `task_*` custom event, see `mapping.task_chunk`) and "
        "`RunJournal.record_subagent_chunk(s)`, or by your own code reading "
        '`stream_mode="custom"`.'
    ),
    "subagent.step": (
        "`subagent.subagent_run_event` for a `task_running` chunk (content built by "
        "`subagent.build_subagent_step`); same callers as `subagent.start`."
    ),
    "subagent.end": (
        "`subagent.subagent_run_event` for a `task_completed`, `task_failed`, `task_cancelled` "
        "or `task_timed_out` chunk (`subagent.SUBAGENT_END_STATUSES`); same callers as "
        "`subagent.start`."
    ),
    "workspace_changes": (
        "`RunJournal(workspace_roots=...)`: `journal/workspace.py`'s `WorkspaceTracker` "
        "snapshots at run start and builds the event at run end (`WorkspaceTracker.changes`), "
        "which `_close_run` writes before the terminal event. Without a journal: "
        "`workspace.record_workspace_changes` (-> `workspace_changes_event` -> `diff_workspace` "
        "-> `compare_workspace_snapshots`). Only written when something changed."
    ),
    "middleware:{tag}": (
        "`RunJournal.record_middleware(tag, name=..., hook=..., action=..., changes=...)` -> "
        "`mapping.middleware_event`."
    ),
}

#: A word on what a field means, by event and ``content.``/``metadata.`` path; ``*`` applies
#: to every event. A ``description`` in the contract's schema wins over these.
FIELD_NOTES: dict[str, dict[str, str]] = {
    "*": {
        "metadata.caller": (
            "Who made the call: the innermost `lead_agent`, `subagent:{name}` or "
            "`middleware:{name}` tag (`mapping.caller_from_tags`), else `lead_agent`."
        ),
        "content.task_id": "The subagent task, from the chunk's `task_id`.",
        "metadata.task_id": "Same as `content.task_id`; stores index it (at most 128 chars).",
        "content.additional_kwargs": (
            "Provider extras; `hide_from_ui: true` keeps a message out of `visible_messages`."
        ),
    },
    "run.start": {
        "content.chain": "Name of the root runnable (`LangGraph` for a compiled graph).",
    },
    "run.end": {"metadata.status": "Always `success`; the run summary has the same status."},
    "run.error": {
        "content": "`str(error)`.",
        "metadata.error_type": "The exception's class name (e.g. `CancelledError` if cancelled).",
    },
    "run.interrupt": {
        "content.checkpoint_id": "The checkpoint to resume from; null if none was saved.",
        "content.checkpoint_ns": "Checkpoint namespace of the pause (empty at the root graph).",
        "content.interrupts": "One entry per pending `interrupt()`.",
        "content.interrupts[].id": "LangGraph's interrupt id.",
        "content.interrupts[].value": "The value passed to `interrupt()`.",
        "metadata.status": "Always `interrupted`.",
    },
    "run.resume": {
        "content.checkpoint_id": "The checkpoint the invocation continues from.",
        "content.checkpoint_ns": "Its namespace.",
    },
    "llm.human.input": {
        "content": "The `HumanMessage` as its `model_dump()`.",
        "content.type": "Always `human`.",
        "content.content": "The message content (a string or content blocks).",
    },
    "llm.ai.response": {
        "content": "The generated `AIMessage` as its `model_dump()`.",
        "content.type": "Always `ai`.",
        "content.content": "The reply (a string or content blocks).",
        "content.tool_calls": "Tool calls the model asked for (`name`, `args`, `id`, `type`).",
        "content.response_metadata": "Provider metadata, e.g. `model_name`.",
        "metadata.usage": "The message's `usage_metadata` (`{}` when it has none).",
        "metadata.latency_ms": "Milliseconds the call took; null if its start was not seen.",
        "metadata.llm_call_index": (
            "1-based model call number within the run. Every call started takes one, a failed "
            "attempt that a retry or fallback replaced too; the run summary's `llm_call_count` "
            "counts the calls that answered."
        ),
    },
    "llm.tool.result": {
        "content": "The `ToolMessage` (or message of a `Command` update) as its `model_dump()`.",
        "content.type": "`tool` for a `ToolMessage`; a `Command` update may carry others.",
        "content.content": "What the tool returned.",
        "content.tool_call_id": "The tool call this message answers.",
    },
    "llm.error": {"content": "`str(error)`."},
    "tool.error": {
        "content.tool_call_id": "The failed call; null if the tool ran without one.",
        "content.name": "The tool's name.",
        "content.error_type": "The exception's class name.",
        "content.error": "`str(error)`.",
        "metadata.tool_call_id": "Same as `content.tool_call_id`.",
        "metadata.latency_ms": "Milliseconds the tool ran; null if its start was not seen.",
    },
    "tool.unresolved": {
        "content.tool_call_id": "The requested call that got no outcome.",
        "content.name": "The tool it asked for.",
        "content.reason": (
            "What stopped it: `interrupted`, `cancelled`, `run_failed` (the run raised) or "
            "`run_ended` (the run ended normally with the call unanswered)."
        ),
        "metadata.tool_call_id": "Same as `content.tool_call_id`.",
    },
    "context:memory": {
        "content.content_sha256": "SHA-256 (hex) of the memory context the run saw.",
    },
    "subagent.start": {"content.description": "The task's description, as text."},
    "subagent.step": {
        "content.message_index": "Position of the step message in the subagent's history.",
        "content.kind": "`ai` for a model message, `tool` for a tool result.",
        "content.text": "The message text, cut to 8192 characters.",
        "content.truncated": "Whether `text` was cut.",
        "content.tool_calls": "`ai` steps: the calls the model asked for.",
        "content.tool_calls[].name": "The tool asked for.",
        "content.tool_calls[].args": "The call's arguments; their JSON, cut, if over 8192 chars.",
        "content.tool_calls[].args_truncated": "Present (true) only when `args` was cut.",
        "content.tool_name": "`tool` steps: the tool that answered.",
        "metadata.message_index": "Same as `content.message_index`.",
    },
    "subagent.end": {
        "content.status": "From the chunk type: `task_completed` -> `completed`, and so on.",
        "content.model_name": "The subagent's model, when the chunk names one.",
        "content.usage": "`input_tokens`, `output_tokens`, `total_tokens`, when all are valid.",
        "content.result": "The result as text (JSON if not a string), cut to 8192 chars.",
        "content.result_truncated": "Whether `result` was cut.",
        "content.error": "The error as text, cut to 8192 chars.",
        "content.error_truncated": "Whether `error` was cut.",
    },
    "workspace_changes": {
        "content": "A one-line summary, e.g. `2 files changed +14 -3`.",
        "metadata.workspace_changes": "The changes, file by file.",
        **{
            f"metadata.workspace_changes.{path}": note
            for path, note in {
                "version": "Payload version.",
                "summary": "Counts over every change, listed or not.",
                "summary.created": "Files created.",
                "summary.modified": "Files modified.",
                "summary.deleted": "Files deleted.",
                "summary.symlink_created": "Symlinks created.",
                "summary.additions": "Lines added, over every diff.",
                "summary.deletions": "Lines deleted, over every diff.",
                "summary.truncated": (
                    "True when files were left out (over a limit, or a scan cut short) or a "
                    "diff was cut."
                ),
                "files": "At most `limits.max_files` changed files.",
                "files[].path": "Path under the root's `virtual_prefix`.",
                "files[].root": "Name of the `WorkspaceRoot`.",
                "files[].status": "What happened to the path.",
                "files[].binary": "Whether either side is binary.",
                "files[].sensitive": "A path that may hold secrets: never read, no digests.",
                "files[].size_before": "Bytes before; null if absent or a symlink.",
                "files[].size_after": "Bytes after; null if absent or a symlink.",
                "files[].sha256_before": "Digest before; null if not read or sensitive.",
                "files[].sha256_after": "Digest after; null if not read or sensitive.",
                "files[].diff": "Unified diff; empty when unavailable.",
                "files[].diff_truncated": "Whether the diff was cut to the diff budget.",
                "files[].diff_unavailable_reason": (
                    "Why there is no diff: one of `WORKSPACE_DIFF_UNAVAILABLE_REASONS`."
                ),
                "files[].additions": "Lines added.",
                "files[].deletions": "Lines deleted.",
                "files[].symlink": "Whether either side is a symlink.",
                "files[].symlink_target_before": "Its target before.",
                "files[].symlink_target_after": "Its target after.",
                "limits": "The `WorkspaceChangeLimits` in force.",
                "limits.max_files": "Most files listed in `files`.",
                "limits.max_scanned_files": "Most files a snapshot scans.",
                "limits.max_file_bytes_for_diff": "Largest file diffed.",
                "limits.max_total_diff_bytes": "Diff bytes over all files.",
            }.items()
        },
    },
    "middleware:{tag}": {
        "content.name": "The middleware's name.",
        "content.hook": "The hook that acted (e.g. `after_model`).",
        "content.action": "What it did.",
        "content.changes": "The state changes it made, as a JSON object.",
    },
}

#: Fields this package writes that the contract does not list (it allows them).
ALSO_WRITTEN: dict[str, list[str]] = {
    "run.start": [
        "`metadata`: the root call's config `metadata` (LangGraph adds `thread_id`, "
        "`ls_integration`), beside `caller`.",
    ],
    "llm.tool.result": [
        "`metadata.caller`; `metadata.tool_call_id` when the message has one.",
    ],
    "llm.error": ["`metadata.caller` and `metadata.error_type` (the exception's class name)."],
    "subagent.step": ["`content.tool_call_id` on `tool` steps whose message has one."],
    "workspace_changes": [
        "`metadata.workspace_changes.limits.max_snapshot_bytes`: the snapshot's budget for "
        "before-content.",
    ],
    "middleware:{tag}": ["`metadata.caller`: `middleware:{tag}`."],
}

_THREAD = "thread-42"
_RUN = "01a23227-6a38-7035-b9ff-8b33543ab0b0"  # asks for the weather, gets it, answers
_PAUSED = "01a23227-8361-70f0-b3fc-94a58854dd8b"  # pauses on ask_human
_RESUMED = "01a23227-83c7-74d5-abbf-262c36744c5f"  # resumes it
_FAILED = "01a23227-83cf-7268-95e4-6390cfb55c10"  # a tool raises and the run fails
_MODEL_DOWN = "01a23227-83d6-7196-90c1-7bbeb1078f2e"  # the model endpoint is down
_DELEGATED = "01a23227-9a10-7c4e-8f07-5b1e2d6c4a90"  # a subagent works, a file changes

_HUMAN = {
    "content": "What's the weather in Paris?",
    "additional_kwargs": {},
    "response_metadata": {},
    "type": "human",
    "name": None,
    "id": "c07aac89-c4d5-4c73-add1-30714f8f7983",
}
_ASKS = {
    "content": "",
    "additional_kwargs": {},
    "response_metadata": {"model_name": "gpt-4o"},
    "type": "ai",
    "name": None,
    "id": "lc_run--01a23227-6a3a-7526-a8b5-e76076b7acb7-0",
    "tool_calls": [
        {"name": "get_weather", "args": {"city": "Paris"}, "id": "call_1", "type": "tool_call"}
    ],
    "invalid_tool_calls": [],
    "usage_metadata": {"input_tokens": 120, "output_tokens": 18, "total_tokens": 138},
}
_TOOL = {
    "content": "sunny, 21 °C",
    "additional_kwargs": {},
    "response_metadata": {},
    "type": "tool",
    "name": "get_weather",
    "id": "6a86544d-19d7-4d85-9cef-769b69608a11",
    "tool_call_id": "call_1",
    "artifact": None,
    "status": "success",
}
_ANSWER = {
    "content": "It is sunny in Paris today, 21 °C.",
    "additional_kwargs": {},
    "response_metadata": {"model_name": "gpt-4o"},
    "type": "ai",
    "name": None,
    "id": "lc_run--01a23227-6a3e-750a-8505-f9f127fcbb44-0",
    "tool_calls": [],
    "invalid_tool_calls": [],
    "usage_metadata": {
        "input_tokens": 160,
        "output_tokens": 14,
        "total_tokens": 174,
        "input_token_details": {"cache_read": 96},
    },
}
_DIFF = (
    "--- a/mnt/user-data/workspace/notes.md\n"
    "+++ b/mnt/user-data/workspace/notes.md\n"
    "@@ -1,2 +1,3 @@\n"
    " # Trip\n"
    " - Paris\n"
    "+- flight AF1234, 09:05\n"
)


def _record(
    run_id: str,
    seq: int,
    event_type: str,
    category: str,
    content: Any,
    metadata: dict[str, Any],
    created_at: str,
) -> dict[str, Any]:
    return dict(
        make_record(_THREAD, run_id, seq, event_type, category, content, metadata, created_at, None)
    )


#: An example record per event, as a store returns it (shapes taken from real runs).
EXAMPLES: dict[str, dict[str, Any]] = {
    "run.start": _record(
        _RUN,
        1,
        "run.start",
        "trace",
        {"chain": "LangGraph"},
        {"thread_id": _THREAD, "ls_integration": "langgraph", "caller": "lead_agent"},
        "2026-01-15T09:30:12.104233+00:00",
    ),
    "run.end": _record(
        _RUN,
        8,
        "run.end",
        "outputs",
        {"messages": [_HUMAN, _ASKS, _TOOL, _ANSWER]},
        {"status": "success"},
        "2026-01-15T09:30:14.418620+00:00",
    ),
    "run.error": _record(
        _FAILED,
        17,
        "run.error",
        "error",
        "tool exploded: disk full",
        {"error_type": "RuntimeError"},
        "2026-01-15T09:41:03.772915+00:00",
    ),
    "run.interrupt": _record(
        _PAUSED,
        12,
        "run.interrupt",
        "outputs",
        {
            "checkpoint_id": "1f1ed993-aff2-6f04-8001-ef0216713322",
            "checkpoint_ns": [],
            "interrupts": [{"id": "7b028a3e2f3fb7f792c88743ad1d6218", "value": "Which city?"}],
        },
        {"status": "interrupted"},
        "2026-01-15T09:35:40.078968+00:00",
    ),
    "run.resume": _record(
        _RESUMED,
        14,
        "run.resume",
        "trace",
        {"checkpoint_id": "1f1ed993-aff2-6f04-8001-ef0216713322", "checkpoint_ns": []},
        {},
        "2026-01-15T09:36:02.168093+00:00",
    ),
    "llm.human.input": _record(
        _RUN,
        3,
        "llm.human.input",
        "message",
        _HUMAN,
        {"caller": "lead_agent"},
        "2026-01-15T09:30:12.106331+00:00",
    ),
    "llm.ai.response": _record(
        _RUN,
        4,
        "llm.ai.response",
        "message",
        _ASKS,
        {
            "caller": "lead_agent",
            "usage": {"input_tokens": 120, "output_tokens": 18, "total_tokens": 138},
            "latency_ms": 812,
            "llm_call_index": 1,
        },
        "2026-01-15T09:30:12.918819+00:00",
    ),
    "llm.tool.result": _record(
        _RUN,
        5,
        "llm.tool.result",
        "message",
        _TOOL,
        {"caller": "lead_agent", "tool_call_id": "call_1"},
        "2026-01-15T09:30:12.931217+00:00",
    ),
    "llm.error": _record(
        _MODEL_DOWN,
        20,
        "llm.error",
        "trace",
        "model endpoint unreachable",
        {"caller": "lead_agent", "error_type": "ConnectionError"},
        "2026-01-15T09:44:30.184634+00:00",
    ),
    "tool.error": _record(
        _FAILED,
        16,
        "tool.error",
        "error",
        {
            "tool_call_id": "call_9",
            "name": "cleanup_disk",
            "error_type": "RuntimeError",
            "error": "tool exploded: disk full",
        },
        {"caller": "lead_agent", "tool_call_id": "call_9", "latency_ms": 37},
        "2026-01-15T09:41:03.772911+00:00",
    ),
    "tool.unresolved": _record(
        _PAUSED,
        11,
        "tool.unresolved",
        "trace",
        {"tool_call_id": "call_7", "name": "ask_human", "reason": "interrupted"},
        {"tool_call_id": "call_7"},
        "2026-01-15T09:35:40.078964+00:00",
    ),
    "context:memory": _record(
        _RUN,
        2,
        "context:memory",
        "context",
        {"content_sha256": "26979408c1b19e36a3d5bc7f1abe800495345facf3ee3543c2a97b9d12568f96"},
        {},
        "2026-01-15T09:30:12.104722+00:00",
    ),
    "subagent.start": _record(
        _DELEGATED,
        24,
        "subagent.start",
        "subagent",
        {"task_id": "task-1", "description": "Find a morning flight to Paris"},
        {"task_id": "task-1"},
        "2026-01-15T10:02:11.530114+00:00",
    ),
    "subagent.step": _record(
        _DELEGATED,
        25,
        "subagent.step",
        "subagent",
        {
            "task_id": "task-1",
            "message_index": 0,
            "kind": "ai",
            "text": "Searching flights to CDG.",
            "truncated": False,
            "tool_calls": [{"name": "search_flights", "args": {"to": "CDG", "before": "10:00"}}],
        },
        {"task_id": "task-1", "message_index": 0},
        "2026-01-15T10:02:13.002871+00:00",
    ),
    "subagent.end": _record(
        _DELEGATED,
        27,
        "subagent.end",
        "subagent",
        {
            "task_id": "task-1",
            "status": "completed",
            "model_name": "gpt-4o-mini",
            "usage": {"input_tokens": 420, "output_tokens": 35, "total_tokens": 455},
            "result": "AF1234, departs 09:05",
            "result_truncated": False,
        },
        {"task_id": "task-1"},
        "2026-01-15T10:02:17.640295+00:00",
    ),
    "workspace_changes": _record(
        _DELEGATED,
        29,
        "workspace_changes",
        "workspace",
        "1 file changed +1 -0",
        {
            "workspace_changes": {
                "version": 1,
                "summary": {
                    "created": 0,
                    "modified": 1,
                    "deleted": 0,
                    "symlink_created": 0,
                    "additions": 1,
                    "deletions": 0,
                    "truncated": False,
                },
                "files": [
                    {
                        "path": "/mnt/user-data/workspace/notes.md",
                        "root": "workspace",
                        "status": "modified",
                        "binary": False,
                        "sensitive": False,
                        "size_before": 15,
                        "size_after": 38,
                        "sha256_before": (
                            "825a473f7de408cdaf6adf657556d52c79196dd76c3a3ca39984a68dce24399c"
                        ),
                        "sha256_after": (
                            "32e3909e0cff284b943155f2b77aeaeb6645b9bebf344b0b5ec728fa88196aeb"
                        ),
                        "diff": _DIFF,
                        "diff_truncated": False,
                        "diff_unavailable_reason": None,
                        "additions": 1,
                        "deletions": 0,
                        "symlink": False,
                        "symlink_target_before": None,
                        "symlink_target_after": None,
                    }
                ],
                "limits": {
                    "max_files": 200,
                    "max_scanned_files": 2000,
                    "max_file_bytes_for_diff": 262144,
                    "max_total_diff_bytes": 1048576,
                    "max_snapshot_bytes": 16777216,
                },
            }
        },
        "2026-01-15T10:02:19.911406+00:00",
    ),
    "middleware:{tag}": _record(
        _RUN,
        7,
        "middleware:guardrail",
        "middleware",
        {
            "name": "GuardrailMiddleware",
            "hook": "after_model",
            "action": "allowed",
            "changes": {},
        },
        {"caller": "middleware:guardrail"},
        "2026-01-15T09:30:14.402117+00:00",
    ),
}

# -- rendering -------------------------------------------------------------------------------


def _anchor(title: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _constraints(schema: Mapping[str, Any]) -> list[str]:
    found = []
    if "minimum" in schema:
        found.append(f"at least {schema['minimum']}")
    low, high = schema.get("minLength"), schema.get("maxLength")
    if low is not None and high is not None:
        found.append(f"{low} to {high} chars")
    elif low == 1:
        found.append("non-empty")
    elif low is not None:
        found.append(f"at least {low} chars")
    elif high is not None:
        found.append(f"at most {high} chars")
    if "pattern" in schema:
        found.append(f"matches `{schema['pattern']}`")
    if "format" in schema:
        found.append(f"format {schema['format']}")
    return found


def type_text(schema: Any) -> str:
    """A JSON schema's type in words: ``string or null``, ``array of string``, ``"ai"``."""
    if schema is True or schema == {}:
        text = "any JSON value"
    elif "const" in schema:
        text = f"`{_json(schema['const'])}`"
    elif "enum" in schema:
        text = " or ".join(f"`{_json(value)}`" for value in schema["enum"])
    else:
        declared = schema.get("type", "any JSON value")
        names = []
        for name in declared if isinstance(declared, list) else [declared]:
            items = schema.get("items")
            if name == "array" and isinstance(items, Mapping):
                names.append(f"array of {type_text(items)}")
            else:
                names.append(name)
        text = " or ".join(names)
    return ", ".join([text, *_constraints(schema)]) if isinstance(schema, Mapping) else text


def _required_when(schema: Mapping[str, Any]) -> dict[str, str]:
    """Fields an ``allOf`` of ``if {field: const} then required`` requires conditionally."""
    found: dict[str, str] = {}
    for rule in schema.get("allOf", []):
        condition = rule.get("if", {}).get("properties", {})
        for name in rule.get("then", {}).get("required", []):
            when = " and ".join(
                f"`{field}` is `{_json(test['const'])}`"
                for field, test in condition.items()
                if "const" in test
            )
            found[name] = f"when {when}"
    return found


def field_rows(schema: Any, path: str) -> Iterator[tuple[str, str, str]]:
    """``(path, type, required)`` of each property, nested objects and array items included."""
    if not isinstance(schema, Mapping):
        return
    required = set(schema.get("required", []))
    conditional = _required_when(schema)
    for name, sub in schema.get("properties", {}).items():
        here = f"{path}.{name}"
        need = "required" if name in required else conditional.get(name, "optional")
        yield here, type_text(sub), need
        if isinstance(sub, Mapping):
            yield from field_rows(sub, here)
            items = sub.get("items")
            if isinstance(items, Mapping) and "properties" in items:
                yield from field_rows(items, f"{here}[]")


def _note(event_type: str, path: str, schema: Any) -> str:
    if isinstance(schema, Mapping) and schema.get("description"):
        return str(schema["description"])
    notes = FIELD_NOTES.get(event_type, {})
    return notes.get(path) or FIELD_NOTES["*"].get(path, "")


def _schema_at(schema: Any, path: str) -> Any:
    """The sub-schema at a dotted ``field_rows`` path (``a.b[].c``), below its first part."""
    for part in path.split(".")[1:]:
        name = part.removesuffix("[]")
        schema = schema.get("properties", {}).get(name, {})
        if part.endswith("[]"):
            schema = schema.get("items", {})
    return schema


def _payload(entry: Mapping[str, Any], key: str) -> list[str]:
    """The lines describing ``content`` or ``metadata`` of one event."""
    event_type = _title(entry)
    schema = entry[f"{key}_schema"]
    lines = [f"**{key}**: {type_text(schema)}."]
    description = entry.get(f"{key}_description") or _note(event_type, key, schema)
    if description:
        lines[0] += f" {description}"
    rows = list(field_rows(schema, key))
    if rows:
        lines += ["", "| Field | Type | Required | Meaning |", "|---|---|---|---|"]
        for path, kind, need in rows:
            note = _note(event_type, path, _schema_at(schema, path))
            lines.append(f"| `{path}` | {_cell(kind)} | {_cell(need)} | {_cell(note)} |")
    elif isinstance(schema, Mapping) and schema.get("type") == "object":
        lines[0] += " The contract requires no field."
    return lines


def _title(entry: Mapping[str, Any]) -> str:
    return entry.get("event_type") or entry["pattern"]


def _examples(entry: Mapping[str, Any]) -> list[Any]:
    if entry.get("examples"):
        return list(entry["examples"])
    title = _title(entry)
    if title not in EXAMPLES:
        raise KeyError(f"no example for {title}: add one to EXAMPLES in docs/generate.py")
    return [EXAMPLES[title]]


def _event_section(entry: Mapping[str, Any]) -> list[str]:
    title = _title(entry)
    if title not in WRITTEN_BY:
        raise KeyError(f"no writer for {title}: add it to WRITTEN_BY in docs/generate.py")
    category = entry["category"]
    lines = [f"## `{title}`", ""]
    if "pattern" in entry:
        tags = ", ".join(f"`{tag}`" for tag in entry.get("known_tags", []))
        lines += [
            f"A family of event names: `{title}` with a tag of {type_text(entry['tag_schema'])}"
            f" (the whole name: {type_text(entry['event_type_schema'])}). Known tags: {tags}.",
            "",
        ]
    lines += [
        f"- **Category**: [`{category}`](#categories)",
        f"- **Producer** (contract): {entry['producer']}",
        f"- **Written by**: {WRITTEN_BY[title]}",
        "",
        *_payload(entry, "content"),
        "",
        *_payload(entry, "metadata"),
        "",
    ]
    also = ALSO_WRITTEN.get(title)
    if also:
        lines += ["Also written by this package, beyond the contract:", ""]
        lines += [f"- {item}" for item in also]
        lines.append("")
    for example in _examples(entry):
        lines += [
            "Example record:",
            "",
            "```json",
            json.dumps(example, indent=2, ensure_ascii=False),
            "```",
            "",
        ]
    return lines


def render(contract: Mapping[str, Any]) -> str:
    """The text of ``docs/events.md`` for ``contract``."""
    entries = [*contract["events"], *contract["dynamic_event_patterns"]]
    categories = contract["categories"]
    compatibility = contract["compatibility"]
    sequence = contract["sequence"]
    lines = [
        "# Run events",
        "",
        f"<!-- Generated from {CONTRACT_PATH} by docs/generate.py;"
        f" do not edit by hand. Regenerate: {COMMAND} -->",
        "",
        f"{contract['description']} Source: [`{CONTRACT_PATH}`](../{CONTRACT_PATH}),"
        f" version {contract['version']}.",
        "",
        "Every stored event is one record: the envelope below, with `content` and `metadata`"
        " shaped by its `event_type`. `deerflow_journal.validate_event(record)` checks a record"
        " against the contract. Each section lists the fields the contract names; objects may"
        " carry more, and readers ignore fields they do not know. How an event travels from a"
        " callback to a stored row: [architecture.md](architecture.md).",
        "",
        f"**Compatibility**: {compatibility['consumer_rule']} Additive changes:"
        f" {', '.join(f'`{c}`' for c in compatibility['additive_changes'])}. Breaking changes:"
        f" {', '.join(f'`{c}`' for c in compatibility['breaking_changes'])}.",
        "",
        "## Envelope",
        "",
        "| Field | Type | Required |",
        "|---|---|---|",
    ]
    record = contract["record_schema"]
    for path, kind, need in field_rows(record, "record"):
        lines.append(f"| `{path.removeprefix('record.')}` | {_cell(kind)} | {need} |")
    lines += [
        "",
        f"`seq` is {sequence['guarantee']} (scope: `{sequence['scope']}`)."
        f" {sequence['multi_process']}",
        "",
        "Before a store writes an event it normalises it the same way on every backend"
        " (`records.normalise_event`): `trace` content longer than the store's"
        " `max_trace_content` (10240 bytes by default) is cut, and so is `outputs` content"
        " longer than its `max_outputs_content` (65536 bytes by default); the metadata then"
        " gets `content_truncated: true` and `original_byte_length`.",
        "",
    ]
    for alias in contract["legacy_event_aliases"]:
        lines += [
            f"Legacy name `{alias['event_type']}` ({alias['status']}): read as"
            f" `{alias['canonical_event_type']}`. {alias['compatibility_scope']}"
            f" {alias['notes']}",
            "",
        ]
    names = {_title(e) for e in entries}
    lines += ["## Categories", "", "| Category | Meaning | Events |", "|---|---|---|"]
    for category, meaning in categories.items():
        names = ", ".join(
            f"[`{_title(e)}`](#{_anchor(_title(e))})" for e in entries if e["category"] == category
        )
        lines.append(f"| `{category}` | {_cell(meaning)} | {names} |")
    lines.append("")
    for entry in entries:
        lines += _event_section(entry)
    for key, heading in (("known_gaps", "Known gaps"), ("closed_gaps", "Closed gaps")):
        gaps = contract.get(key, [])
        if not gaps:
            continue
        lines += [f"## {heading}", ""]
        for gap in gaps:
            status = gap.get("status") or "closed by " + ", ".join(
                f"`{c}`" if c in names else c for c in gap.get("closed_by", [])
            )
            lines.append(f"- **{gap['id']}** ({status}): {gap['notes']}")
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def example_records(contract: Mapping[str, Any]) -> list[Any]:
    """Every example record the page shows."""
    entries = [*contract["events"], *contract["dynamic_event_patterns"]]
    return [example for entry in entries for example in _examples(entry)]


def main(argv: list[str] | None = None) -> int:
    """Write (or, with ``--check``, compare) ``docs/events.md``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    args = parser.parse_args(argv)
    contract = load_contract()
    text = render(contract)
    if args.check:
        if EVENTS_PAGE.exists() and EVENTS_PAGE.read_text(encoding="utf-8") == text:
            return 0
        print(f"docs/events.md is out of date: run `{COMMAND}`", file=sys.stderr)
        return 1
    for example in example_records(contract):
        validate_event(example)
    EVENTS_PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {EVENTS_PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
