"""deerflow-journal: a durable, queryable record of LangChain and LangGraph agent runs.

``__all__`` lists what an application calls, catches or subclasses. The event catalog
(``RUN_START_EVENT``, ``MIDDLEWARE_*`` and the rest of ``deerflow_journal.catalog``) is
importable from here too without being listed, and ``PostgresRunEventStore`` is imported on
first use so that psycopg stays an optional extra. Building blocks live in their modules
(``deerflow_journal.records``, ``.subagent``, ``.workspace``, ``.stores``).
"""

from typing import Any

# Every catalog name stays importable from the top level (and counts as re-exported for type
# checkers) without `__all__` listing them: `from deerflow_journal import RUN_START_EVENT`.
from deerflow_journal.catalog import *  # noqa: F403
from deerflow_journal.consumers import (
    latest_workspace_changes,
    memory_context_digests,
    visible_messages,
)
from deerflow_journal.contract import load_contract, validate_event
from deerflow_journal.journal import RunJournal
from deerflow_journal.records import AUTO, EventRefused, RunEvent, current_user_id, user_scope
from deerflow_journal.stores import (
    DEFAULT_STORE_URL,
    JournalStore,
    ReadOnlyStoreError,
    RunEventStore,
    ThreadInfo,
    default_store_url,
    open_store,
)
from deerflow_journal.stores.jsonl import JsonlRunEventStore
from deerflow_journal.stores.memory import MemoryRunEventStore
from deerflow_journal.stores.sqlite import SqliteRunEventStore
from deerflow_journal.subagent import (
    capture_new_step_messages,
    capture_step_message,
    subagent_run_event,
)
from deerflow_journal.summary import RunSummary
from deerflow_journal.sync import SyncStore, open_sync_store
from deerflow_journal.timeline import (
    TimelineRow,
    render_summary,
    render_timeline,
    timeline_rows,
)
from deerflow_journal.tracing import disable, enable, journaling
from deerflow_journal.workspace import (
    WorkspaceChangeLimits,
    WorkspaceRoot,
    WorkspaceSnapshot,
    capture_workspace_snapshot,
    record_workspace_changes,
    workspace_changes_event,
)

# A literal list. PostgresRunEventStore is not in it: `from deerflow_journal import *` must work
# without the postgres extra, and a star import fetches every listed name.
__all__ = [
    "AUTO",
    "DEFAULT_STORE_URL",
    "EventRefused",
    "JournalStore",
    "JsonlRunEventStore",
    "MemoryRunEventStore",
    "ReadOnlyStoreError",
    "RunEvent",
    "RunEventStore",
    "RunJournal",
    "RunSummary",
    "SqliteRunEventStore",
    "SyncStore",
    "ThreadInfo",
    "TimelineRow",
    "WorkspaceChangeLimits",
    "WorkspaceRoot",
    "WorkspaceSnapshot",
    "capture_new_step_messages",
    "capture_step_message",
    "capture_workspace_snapshot",
    "current_user_id",
    "default_store_url",
    "disable",
    "enable",
    "journaling",
    "latest_workspace_changes",
    "load_contract",
    "memory_context_digests",
    "open_store",
    "open_sync_store",
    "record_workspace_changes",
    "render_summary",
    "render_timeline",
    "subagent_run_event",
    "timeline_rows",
    "user_scope",
    "validate_event",
    "visible_messages",
    "workspace_changes_event",
]


def __getattr__(name: str) -> Any:
    # PostgresRunEventStore is imported on first use, so psycopg stays an optional extra.
    if name == "PostgresRunEventStore":
        from deerflow_journal.stores.postgres import PostgresRunEventStore

        return PostgresRunEventStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), "PostgresRunEventStore"})
