"""Record what a run changed under its workspace roots as one ``workspace_changes`` event.

Take ``capture_workspace_snapshot(roots)`` before the run and call
``record_workspace_changes(store, thread_id, run_id, before, roots)`` after it. The after scan
reads only ``lstat`` facts; a file is opened only when those facts changed (or when it was
written so shortly before the first snapshot that equal facts prove nothing), so unchanged
files are never read again. All file I/O runs in a worker thread.

When a file gets no diff, ``diff_unavailable_reason`` is one of
``WORKSPACE_DIFF_UNAVAILABLE_REASONS``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deerflow_journal.catalog import WORKSPACE_CHANGES_EVENT
from deerflow_journal.offload import to_thread
from deerflow_journal.records import RunEvent
from deerflow_journal.stores.base import RunEventStore
from deerflow_journal.workspace_diff import cut_diff, decode_text, is_binary, unified_diff
from deerflow_journal.workspace_scan import (
    WORKSPACE_SKIPPED_DIRS,
    FileState,
    WorkspaceChangeLimits,
    WorkspaceRoot,
    WorkspaceSnapshot,
    file_digest,
    read_small,
    scan_workspace,
)

__all__ = [
    "WORKSPACE_DIFF_UNAVAILABLE_REASONS",
    "WORKSPACE_SKIPPED_DIRS",
    "WorkspaceChangeLimits",
    "WorkspaceRoot",
    "WorkspaceSnapshot",
    "capture_workspace_snapshot",
    "compare_workspace_snapshots",
    "diff_workspace",
    "record_workspace_changes",
    "scan_workspace",
    "workspace_changes_event",
]

#: Why a changed file has no diff, most decisive first.
WORKSPACE_DIFF_UNAVAILABLE_REASONS = (
    "sensitive",  # a path that may hold secrets: never read
    "symlink",  # links are recorded with their targets, never followed
    "binary",
    "too_large",  # over max_file_bytes_for_diff
    "encoding",  # neither UTF-8 nor BOM-marked UTF-16/32
    "unreadable",
    "not_captured",  # the before snapshot kept no content (max_snapshot_bytes)
    "diff_budget",  # max_total_diff_bytes was spent on earlier files
)
#: Files whose mtime is this close to the first snapshot are re-checked by content.
RACY_WINDOW_NS = 1_000_000_000
_VERSION = 1


@dataclass(slots=True)
class _Content:
    """What is known of one side of a change; ``missing`` says why ``data`` is ``None``."""

    data: bytes | None = None
    sha256: str | None = None
    binary: bool = False
    missing: str | None = None


def _read_after(path: Path, state: FileState, limits: WorkspaceChangeLimits) -> _Content:
    """Read a changed file: whole when small enough to diff, else only streamed for a digest."""
    try:
        data = None
        if state.size <= limits.max_file_bytes_for_diff:
            data = read_small(path, state.size, limits.max_file_bytes_for_diff)
        if data is None:
            sha, head = file_digest(path)
            binary = is_binary(head)
            return _Content(None, sha, binary, "binary" if binary else "too_large")
    except OSError:
        return _Content(missing="unreadable")
    sha = hashlib.sha256(data).hexdigest()
    return _Content(None, sha, True, "binary") if is_binary(data) else _Content(data, sha)


def _before_content(state: FileState, limits: WorkspaceChangeLimits) -> _Content:
    if state.binary:
        return _Content(None, state.sha256, True, "binary")
    if state.data is not None:
        return _Content(state.data, state.digest())
    too_large = state.size > limits.max_file_bytes_for_diff
    return _Content(missing="too_large" if too_large else "not_captured")


def _status(before: FileState | None, after: FileState | None) -> str:
    if before is None:
        return "symlink_created" if after is not None and after.is_symlink else "created"
    if after is None:
        return "deleted"
    if after.is_symlink and not before.is_symlink:
        return "symlink_created"
    return "modified"


def _side_text(state: FileState | None, content: _Content) -> tuple[str | None, str | None]:
    """The text of one side of a change, or ``None`` and the reason it has none."""
    if state is None:
        return "", None
    if content.data is None:
        return None, content.missing or "not_captured"
    text = decode_text(content.data)
    return (text, None) if text is not None else (None, "encoding")


@dataclass(slots=True)
class _Change:
    root: WorkspaceRoot
    relative: str
    before: FileState | None
    after: FileState | None
    before_content: _Content
    after_content: _Content

    def entry(self) -> dict[str, Any]:
        """The ``files[]`` item of the payload, with the full diff (budget applied later)."""
        before, after = self.before, self.after
        symlink = any(s is not None and s.is_symlink for s in (before, after))
        sensitive = any(s is not None and s.sensitive for s in (before, after))
        path = self.root.virtual_path(self.relative)
        diff, additions, deletions, reason = "", 0, 0, None
        if sensitive or symlink:
            reason = "sensitive" if sensitive else "symlink"
        else:
            old, old_reason = _side_text(before, self.before_content)
            new, new_reason = _side_text(after, self.after_content)
            if old is not None and new is not None:
                labels = (_label("a", path, before), _label("b", path, after))
                diff, additions, deletions = unified_diff(old, new, *labels)
            else:
                reason = _first_reason(old_reason, new_reason)
        return {
            "path": path,
            "root": self.root.name,
            "status": _status(before, after),
            "binary": self.before_content.binary or self.after_content.binary,
            "sensitive": sensitive,
            "size_before": _size(before),
            "size_after": _size(after),
            "sha256_before": None if sensitive else self.before_content.sha256,
            "sha256_after": None if sensitive else self.after_content.sha256,
            "diff": diff,
            "diff_truncated": False,
            "diff_unavailable_reason": reason,
            "additions": additions,
            "deletions": deletions,
            "symlink": symlink,
            "symlink_target_before": before.symlink_target if before else None,
            "symlink_target_after": after.symlink_target if after else None,
        }


def _label(side: str, path: str, state: FileState | None) -> str:
    return f"{side}/{path.lstrip('/')}" if state is not None else "/dev/null"


def _size(state: FileState | None) -> int | None:
    return None if state is None or state.is_symlink else state.size


def _first_reason(*reasons: str | None) -> str:
    present = {r for r in reasons if r is not None}
    return next(r for r in WORKSPACE_DIFF_UNAVAILABLE_REASONS if r in present)


def _compare(
    before: WorkspaceSnapshot, after: WorkspaceSnapshot, limits: WorkspaceChangeLimits
) -> Iterator[_Change]:
    """Every change between the snapshots, in scan order, one at a time: each holds the
    content of its file, which must be let go before the next is read."""
    compared = {root.name for root in before.roots}
    for root in after.roots:
        if root.name not in compared:
            continue
        names = {rel for name, rel in (*before.files, *after.files) if name == root.name}
        for relative in sorted(names, key=lambda rel: rel.split("/")):
            if before.reached(root.name, relative) and after.reached(root.name, relative):
                change = _change(before, after, root, relative, limits)
                if change is not None:
                    yield change


def _change(
    before: WorkspaceSnapshot,
    after: WorkspaceSnapshot,
    root: WorkspaceRoot,
    relative: str,
    limits: WorkspaceChangeLimits,
) -> _Change | None:
    """The change of one path, or ``None`` when it is unchanged."""
    old = before.files.get((root.name, relative))
    new = after.files.get((root.name, relative))
    if old is not None and new is not None and (old.is_symlink or new.is_symlink):
        unchanged = old.symlink_target == new.symlink_target
        return None if unchanged else _Change(root, relative, old, new, _Content(), _Content())
    if old is not None and new is not None and old.same_stat(new):
        # Equal lstat facts prove nothing for a file written within a clock tick of the
        # snapshot; re-check those by content when the snapshot read it.
        racy = old.mtime_ns >= before.started_ns - RACY_WINDOW_NS
        if not (racy and old.was_read):
            return None
    old_content = _Content() if old is None else _before_content(old, limits)
    if new is None or new.sensitive or new.is_symlink:
        return _Change(root, relative, old, new, old_content, _Content())
    new_content = _read_after(root.host_path / relative, new, limits)
    if old is not None and old_content.sha256 and old_content.sha256 == new_content.sha256:
        return None
    return _Change(root, relative, old, new, old_content, new_content)


def _payload(
    changes: Iterable[_Change], limits: WorkspaceChangeLimits, scan_truncated: bool
) -> dict[str, Any] | None:
    """The ``workspace_changes`` payload, or ``None`` without changes.

    Each change's diff is cut to what is left of the budget as soon as it is made, and
    changes past ``max_files`` only count, so memory stays bounded by the limits.
    """
    summary = {status: 0 for status in ("created", "modified", "deleted", "symlink_created")}
    additions = deletions = 0
    listed: list[dict[str, Any]] = []
    budget = limits.max_total_diff_bytes
    truncated = scan_truncated
    for change in changes:
        entry = change.entry()
        summary[entry["status"]] += 1
        additions += entry["additions"]
        deletions += entry["deletions"]
        if len(listed) == limits.max_files:
            truncated = True  # counted, not listed
            continue
        if entry["diff"]:
            entry["diff"], entry["diff_truncated"] = cut_diff(entry["diff"], budget)
            budget -= len(entry["diff"].encode())
            if not entry["diff"]:
                entry["diff_unavailable_reason"] = "diff_budget"
        listed.append(entry)
    if not any(summary.values()):
        return None
    return {
        "version": _VERSION,
        "summary": {
            **summary,
            "additions": additions,
            "deletions": deletions,
            "truncated": truncated or any(entry["diff_truncated"] for entry in listed),
        },
        "files": listed,
        "limits": limits.to_dict(),
    }


def _summary_line(summary: dict[str, Any]) -> str:
    count = sum(summary[s] for s in ("created", "modified", "deleted", "symlink_created"))
    files = "file" if count == 1 else "files"
    return f"{count} {files} changed +{summary['additions']} -{summary['deletions']}"


def compare_workspace_snapshots(
    before: WorkspaceSnapshot,
    after: WorkspaceSnapshot,
    *,
    limits: WorkspaceChangeLimits | None = None,
) -> dict[str, Any] | None:
    """Build the ``workspace_changes`` event between two snapshots (blocking).

    Reads only files whose ``lstat`` facts differ (and racy ones, see the module docstring).
    Returns ``put`` kwargs without thread and run ids (``event_type``, ``category``,
    ``content``, ``metadata``), or ``None`` when nothing changed. Roots absent from
    ``before`` are not compared. ``limits`` defaults to the before snapshot's.
    """
    for snapshot in (before, after):
        if not isinstance(snapshot, WorkspaceSnapshot):
            raise TypeError(f"snapshots must be WorkspaceSnapshot, got {type(snapshot).__name__}")
    limits = limits or before.limits
    payload = _payload(_compare(before, after, limits), limits, before.truncated or after.truncated)
    if payload is None:
        return None
    return {
        "event_type": WORKSPACE_CHANGES_EVENT.event_type,
        "category": WORKSPACE_CHANGES_EVENT.category,
        "content": _summary_line(payload["summary"]),
        "metadata": {"workspace_changes": payload},
    }


def diff_workspace(
    before: WorkspaceSnapshot,
    roots: Iterable[WorkspaceRoot],
    *,
    limits: WorkspaceChangeLimits | None = None,
) -> dict[str, Any] | None:
    """Compare ``before`` with the files now under ``roots`` (blocking; stat-only rescan).

    Returns what ``compare_workspace_snapshots`` returns.
    """
    if not isinstance(before, WorkspaceSnapshot):
        raise TypeError(f"before must be a WorkspaceSnapshot, got {type(before).__name__}")
    limits = limits or before.limits
    after = scan_workspace(roots, limits=limits, keep_content=False)
    return compare_workspace_snapshots(before, after, limits=limits)


async def capture_workspace_snapshot(
    roots: Iterable[WorkspaceRoot], *, limits: WorkspaceChangeLimits | None = None
) -> WorkspaceSnapshot:
    """Snapshot the files under ``roots`` in a worker thread (see ``scan_workspace``)."""
    roots = tuple([roots] if isinstance(roots, WorkspaceRoot) else roots)
    return await to_thread(scan_workspace, roots, limits=limits)


async def workspace_changes_event(
    before: WorkspaceSnapshot,
    roots: Iterable[WorkspaceRoot],
    *,
    limits: WorkspaceChangeLimits | None = None,
) -> dict[str, Any] | None:
    """``diff_workspace`` in a worker thread: the event's ``put`` kwargs, or ``None``."""
    roots = tuple([roots] if isinstance(roots, WorkspaceRoot) else roots)
    return await to_thread(diff_workspace, before, roots, limits=limits)


async def record_workspace_changes(
    store: RunEventStore,
    thread_id: str,
    run_id: str,
    before: WorkspaceSnapshot,
    roots: Iterable[WorkspaceRoot],
    *,
    limits: WorkspaceChangeLimits | None = None,
) -> RunEvent | None:
    """Write one ``workspace_changes`` event if files changed since ``before``; return it."""
    event = await workspace_changes_event(before, roots, limits=limits)
    if event is None:
        return None
    return await store.put(thread_id=thread_id, run_id=run_id, **event)
