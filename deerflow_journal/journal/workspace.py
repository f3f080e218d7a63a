"""Workspace changes of a run: a snapshot at run start, a diff at run end, off every event loop.

Both scans run on the journal's background loop (in its worker threads), so a callback running
on the caller's loop never scans. ``wait`` and ``wait_async`` let a run's root chain wait for
its snapshot, so no step of the run changes a file before the snapshot saw it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Iterable
from typing import Any

from deerflow_journal.journal.loops import background_loop, on_background_loop
from deerflow_journal.workspace import (
    WorkspaceChangeLimits,
    WorkspaceRoot,
    WorkspaceSnapshot,
    capture_workspace_snapshot,
    workspace_changes_event,
)
from deerflow_journal.workspace_scan import check_roots

__all__ = ["Snapshot", "WorkspaceTracker"]

logger = logging.getLogger(__name__)

Snapshot = concurrent.futures.Future[WorkspaceSnapshot]


class WorkspaceTracker:
    """Snapshots ``roots`` when a run starts and builds its ``workspace_changes`` event."""

    def __init__(
        self, roots: Iterable[WorkspaceRoot], limits: WorkspaceChangeLimits | None = None
    ) -> None:
        self.roots = check_roots(roots)  # here, not at each run's snapshot
        self.limits = limits

    def snapshot(self) -> Snapshot:
        """Start the before-snapshot in the background."""
        coro = capture_workspace_snapshot(self.roots, limits=self.limits)
        return asyncio.run_coroutine_threadsafe(coro, background_loop())

    @staticmethod
    def wait(snapshot: Snapshot | None) -> None:
        """Block until ``snapshot`` is taken (it usually already is).

        On the background loop's own thread (a run started from code running there) the
        snapshot could never finish while we block: the run goes on without waiting.
        """
        if snapshot is None or snapshot.done():
            return
        if on_background_loop():
            logger.warning(
                "a run started on the journal's background loop does not wait for its "
                "workspace snapshot: a file its first step writes may not be recorded"
            )
            return
        concurrent.futures.wait([snapshot])

    @staticmethod
    async def wait_async(snapshot: Snapshot | None) -> None:
        """Wait, without blocking the event loop, until ``snapshot`` is taken."""
        if snapshot is not None and not snapshot.done():
            await asyncio.wait([asyncio.wrap_future(snapshot)])

    async def changes(self, snapshot: Snapshot) -> dict[str, Any] | None:
        """Return the run's ``workspace_changes`` event kwargs, or ``None`` (also on failure)."""
        try:
            before = await asyncio.wrap_future(snapshot)
            return await workspace_changes_event(before, self.roots, limits=self.limits)
        except Exception:
            logger.exception("workspace changes could not be recorded")
            return None

    def changes_blocking(self, snapshot: Snapshot) -> dict[str, Any] | None:
        """``changes`` for a caller that may block (a sync run's terminal outcome)."""
        return asyncio.run_coroutine_threadsafe(self.changes(snapshot), background_loop()).result()
