"""deerflow-journal: a durable, queryable record of LangChain and LangGraph agent runs."""

import importlib.util
from typing import Any

from deerflow_journal.catalog import (
    FIXED_RUN_EVENT_DEFINITIONS,
    JOURNAL_RUN_EVENT_DEFINITIONS,
    LEGACY_EVENT_ALIASES,
    LLM_AI_RESPONSE_EVENT,
    LLM_ERROR_EVENT,
    LLM_HUMAN_INPUT_EVENT,
    LLM_TOOL_RESULT_EVENT,
    MEMORY_CONTEXT_EVENT,
    MIDDLEWARE_EVENT_PATTERN,
    MIDDLEWARE_EVENT_TAG_MAX_LENGTH,
    MIDDLEWARE_EVENT_TAGS,
    MIDDLEWARE_GUARDRAIL_TAG,
    MIDDLEWARE_SAFETY_TERMINATION_TAG,
    MIDDLEWARE_SKILL_ACTIVATION_TAG,
    MIDDLEWARE_SKILL_SECRETS_TAG,
    RUN_END_EVENT,
    RUN_ERROR_EVENT,
    RUN_EVENT_CATEGORIES,
    RUN_EVENT_CATEGORY_MAX_LENGTH,
    RUN_EVENT_TYPE_MAX_LENGTH,
    RUN_INTERRUPT_EVENT,
    RUN_RESUME_EVENT,
    RUN_START_EVENT,
    SUBAGENT_END_EVENT,
    SUBAGENT_RUN_EVENT_DEFINITIONS,
    SUBAGENT_START_EVENT,
    SUBAGENT_STEP_EVENT,
    TOOL_ERROR_EVENT,
    TOOL_UNRESOLVED_EVENT,
    WORKSPACE_CHANGES_EVENT,
    WORKSPACE_RUN_EVENT_DEFINITIONS,
    RunEventDefinition,
    RunEventPattern,
)
from deerflow_journal.consumers import (
    latest_workspace_changes,
    memory_context_digests,
    visible_messages,
)
from deerflow_journal.contract import load_contract, validate_event
from deerflow_journal.journal import RunJournal
from deerflow_journal.records import (
    AUTO,
    EventRefused,
    RunEvent,
    current_user_id,
    normalise_batch,
    normalise_event,
    user_scope,
)
from deerflow_journal.stores import (
    DEFAULT_STORE_URL,
    JournalStore,
    ReadOnlyStoreError,
    RunEventStore,
    default_store_url,
    open_store,
)
from deerflow_journal.stores.jsonl import JsonlRunEventStore
from deerflow_journal.stores.memory import MemoryRunEventStore
from deerflow_journal.stores.sqlite import SqliteRunEventStore
from deerflow_journal.subagent import (
    SUBAGENT_END_STATUSES,
    SUBAGENT_EVENT_CATEGORY,
    SUBAGENT_STEP_MAX_CHARS,
    build_subagent_step,
    capture_new_step_messages,
    capture_step_message,
    subagent_run_event,
    truncate_step_text,
)
from deerflow_journal.summary import RunSummary
from deerflow_journal.workspace import (
    WORKSPACE_DIFF_UNAVAILABLE_REASONS,
    WORKSPACE_SKIPPED_DIRS,
    WorkspaceChangeLimits,
    WorkspaceRoot,
    WorkspaceSnapshot,
    capture_workspace_snapshot,
    compare_workspace_snapshots,
    diff_workspace,
    record_workspace_changes,
    scan_workspace,
    workspace_changes_event,
)

__all__ = [
    "AUTO",
    "DEFAULT_STORE_URL",
    "FIXED_RUN_EVENT_DEFINITIONS",
    "JOURNAL_RUN_EVENT_DEFINITIONS",
    "LEGACY_EVENT_ALIASES",
    "LLM_AI_RESPONSE_EVENT",
    "LLM_ERROR_EVENT",
    "LLM_HUMAN_INPUT_EVENT",
    "LLM_TOOL_RESULT_EVENT",
    "MEMORY_CONTEXT_EVENT",
    "MIDDLEWARE_EVENT_PATTERN",
    "MIDDLEWARE_EVENT_TAGS",
    "MIDDLEWARE_EVENT_TAG_MAX_LENGTH",
    "MIDDLEWARE_GUARDRAIL_TAG",
    "MIDDLEWARE_SAFETY_TERMINATION_TAG",
    "MIDDLEWARE_SKILL_ACTIVATION_TAG",
    "MIDDLEWARE_SKILL_SECRETS_TAG",
    "RUN_END_EVENT",
    "RUN_ERROR_EVENT",
    "RUN_EVENT_CATEGORIES",
    "RUN_EVENT_CATEGORY_MAX_LENGTH",
    "RUN_EVENT_TYPE_MAX_LENGTH",
    "RUN_INTERRUPT_EVENT",
    "RUN_RESUME_EVENT",
    "RUN_START_EVENT",
    "SUBAGENT_END_EVENT",
    "SUBAGENT_END_STATUSES",
    "SUBAGENT_EVENT_CATEGORY",
    "SUBAGENT_RUN_EVENT_DEFINITIONS",
    "SUBAGENT_START_EVENT",
    "SUBAGENT_STEP_EVENT",
    "SUBAGENT_STEP_MAX_CHARS",
    "TOOL_ERROR_EVENT",
    "TOOL_UNRESOLVED_EVENT",
    "WORKSPACE_CHANGES_EVENT",
    "WORKSPACE_DIFF_UNAVAILABLE_REASONS",
    "WORKSPACE_RUN_EVENT_DEFINITIONS",
    "WORKSPACE_SKIPPED_DIRS",
    "EventRefused",
    "JournalStore",
    "JsonlRunEventStore",
    "MemoryRunEventStore",
    "PostgresRunEventStore",
    "ReadOnlyStoreError",
    "RunEvent",
    "RunEventDefinition",
    "RunEventPattern",
    "RunEventStore",
    "RunJournal",
    "RunSummary",
    "SqliteRunEventStore",
    "WorkspaceChangeLimits",
    "WorkspaceRoot",
    "WorkspaceSnapshot",
    "build_subagent_step",
    "capture_new_step_messages",
    "capture_step_message",
    "capture_workspace_snapshot",
    "compare_workspace_snapshots",
    "current_user_id",
    "default_store_url",
    "diff_workspace",
    "latest_workspace_changes",
    "load_contract",
    "memory_context_digests",
    "normalise_batch",
    "normalise_event",
    "open_store",
    "record_workspace_changes",
    "scan_workspace",
    "subagent_run_event",
    "truncate_step_text",
    "user_scope",
    "validate_event",
    "visible_messages",
    "workspace_changes_event",
]


def _has_psycopg() -> bool:
    try:
        return all(importlib.util.find_spec(name) for name in ("psycopg", "psycopg_pool"))
    except ImportError:
        return False


if not _has_psycopg():
    # Without the postgres extra, `from deerflow_journal import *` must still work; the name
    # itself still explains what to install.
    __all__.remove("PostgresRunEventStore")


def __getattr__(name: str) -> Any:
    # PostgresRunEventStore is imported on first use, so psycopg stays an optional extra.
    if name == "PostgresRunEventStore":
        from deerflow_journal.stores.postgres import PostgresRunEventStore

        return PostgresRunEventStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
