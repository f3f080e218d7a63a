"""A run's events laid out for the timeline page: the shared renderer's rows (``timeline_rows``)
with what a page adds, namely each event's JSON payload, links both ways between a call and its
outcome, subagent steps gathered under their task, workspace diffs split into lines, and links
to the interrupt or resume in another run of the thread."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import orjson

from deerflow_journal.catalog import (
    RUN_INTERRUPT_EVENT,
    RUN_RESUME_EVENT,
    WORKSPACE_CHANGES_EVENT,
)
from deerflow_journal.records import RunEvent
from deerflow_journal.timeline import TimelineRow, timeline_rows
from deerflow_journal.web.reads import RunLink

__all__ = ["DiffFile", "Item", "TaskGroup", "blocks", "items"]


@dataclass(frozen=True, slots=True)
class DiffFile:
    """One changed file of a ``workspace_changes`` event."""

    path: str
    status: str
    #: ``(css class, text)`` per line of the unified diff; empty when there is none.
    lines: list[tuple[str, str]]
    #: Why there is no diff (``binary``, ``sensitive``, ...), or ``""``.
    reason: str


@dataclass(slots=True)
class Item:
    """One event of the page: its timeline row and what the page shows beside it."""

    row: TimelineRow
    #: The caller, blank when it repeats the event type (a middleware event).
    caller: str
    #: The stored record as indented JSON.
    payload: str
    #: ``metadata.task_id`` or ``content.task_id`` of a subagent event, else ``""``.
    task: str
    #: Seqs of the listed events that answer this one (a call's outcomes).
    answered_by: list[int] = field(default_factory=list)
    #: An event of another run this one is linked to, and how (``"resumed in"``, ...).
    other_run: tuple[str, RunLink] | None = None
    #: The changed files of a ``workspace_changes`` event.
    diffs: list[DiffFile] = field(default_factory=list)

    @property
    def offset(self) -> str:
        """Seconds since the run's first event, e.g. ``+0.012s``."""
        return "" if self.row.offset is None else f"{self.row.offset:+.3f}s"


@dataclass(slots=True)
class TaskGroup:
    """A subagent task's events, shown together where the task first appears."""

    task: str
    items: list[Item] = field(default_factory=list)


def _payload(event: RunEvent) -> str:
    return orjson.dumps(event, default=str, option=orjson.OPT_INDENT_2).decode()


def _task(event: RunEvent) -> str:
    if not event["event_type"].startswith("subagent."):
        return ""
    for source in (event.get("metadata"), event.get("content")):
        task = source.get("task_id") if isinstance(source, Mapping) else None
        if isinstance(task, str) and task:
            return task
    return ""


def _diff_lines(diff: str) -> list[tuple[str, str]]:
    lines = []
    for line in diff.splitlines():
        if line.startswith(("+++", "---")):
            kind = "diff-name"
        elif line.startswith("@@"):
            kind = "diff-hunk"
        elif line.startswith("+"):
            kind = "diff-add"
        elif line.startswith("-"):
            kind = "diff-del"
        else:
            kind = "diff-ctx"
        lines.append((kind, line))
    return lines


def _diffs(event: RunEvent) -> list[DiffFile]:
    metadata = event.get("metadata")
    payload = metadata.get("workspace_changes") if isinstance(metadata, Mapping) else None
    files = payload.get("files") if isinstance(payload, Mapping) else None
    found = []
    for entry in files if isinstance(files, list) else ():
        if not isinstance(entry, Mapping):
            continue
        diff = entry.get("diff")
        reason = entry.get("diff_unavailable_reason")
        found.append(
            DiffFile(
                path=str(entry.get("path", "?")),
                status=str(entry.get("status", "")),
                lines=_diff_lines(diff) if isinstance(diff, str) else [],
                reason=reason if isinstance(reason, str) else "",
            )
        )
    return found


def _other_run(
    event: RunEvent, row: TimelineRow, pauses: Mapping[str, Mapping[str, RunLink]]
) -> tuple[str, RunLink] | None:
    content = event.get("content")
    checkpoint = content.get("checkpoint_id") if isinstance(content, Mapping) else None
    if not isinstance(checkpoint, str):
        return None
    if row.kind == RUN_RESUME_EVENT.event_type and row.answers is None:
        link = pauses.get(RUN_INTERRUPT_EVENT.event_type, {}).get(checkpoint)
        return None if link is None else ("resumes the interrupt of run", link)
    if row.kind == RUN_INTERRUPT_EVENT.event_type:
        link = pauses.get(RUN_RESUME_EVENT.event_type, {}).get(checkpoint)
        return None if link is None else ("resumed in run", link)
    return None


def items(
    events: Sequence[RunEvent], pauses: Mapping[str, Mapping[str, RunLink]] | None = None
) -> list[Item]:
    """One ``Item`` per event, in seq order; ``pauses`` are ``Reader.pauses`` of the thread."""
    ordered = sorted(events, key=lambda event: event["seq"])
    rows = timeline_rows(ordered)
    made = []
    for event, row in zip(ordered, rows, strict=True):
        made.append(
            Item(
                row=row,
                caller="" if row.caller == row.kind else row.caller,
                payload=_payload(event),
                task=_task(event),
                other_run=_other_run(event, row, pauses or {}),
                diffs=_diffs(event) if row.kind == WORKSPACE_CHANGES_EVENT.event_type else [],
            )
        )
    by_seq = {item.row.seq: item for item in made}
    for item in made:
        asked = by_seq.get(item.row.answers) if item.row.answers is not None else None
        if asked is not None:
            asked.answered_by.append(item.row.seq)
    return made


def blocks(made: Sequence[Item]) -> list[Item | TaskGroup]:
    """The items with each subagent task's events gathered into one group, placed where the
    task's first event is."""
    laid: list[Item | TaskGroup] = []
    groups: dict[str, TaskGroup] = {}
    for item in made:
        if not item.task:
            laid.append(item)
            continue
        group = groups.get(item.task)
        if group is None:
            group = groups[item.task] = TaskGroup(item.task)
            laid.append(group)
        group.items.append(item)
    return laid
