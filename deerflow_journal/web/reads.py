"""What the viewer reads from a store, every read scoped to the viewer's user (if any)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deerflow_journal.catalog import RUN_INTERRUPT_EVENT, RUN_RESUME_EVENT
from deerflow_journal.consumers import latest_workspace_changes, visible_messages
from deerflow_journal.records import RunEvent
from deerflow_journal.stores.base import RunEventStore
from deerflow_journal.stores.browsing import ThreadInfo
from deerflow_journal.summary import RunStatus, RunSummary

__all__ = ["MessagePage", "NotFound", "Reader", "RunLink"]

_PAGE = 500  # events per store read


class NotFound(LookupError):
    """A thread or run the journal does not have (for the viewer's user): HTTP 404."""


@dataclass(frozen=True, slots=True)
class MessagePage:
    """A page of a thread's visible messages, and the ``before_seq`` of the page before it."""

    messages: list[RunEvent]
    #: Whether an older page may exist: this one was full (the store's paging says no more).
    has_more: bool
    #: Pass as ``before_seq`` for the older page (``None`` when there is none).
    before_seq: int | None


@dataclass(frozen=True, slots=True)
class RunLink:
    """An event of another run of the thread: an interrupt's resume or a resume's interrupt."""

    run_id: str
    seq: int


class Reader:
    """A store's reads for the viewer; ``user_id`` (``None``: every user) scopes each of them."""

    def __init__(self, store: RunEventStore, user_id: str | None) -> None:
        self.store = store
        self.user_id = user_id

    async def threads(self, limit: int, before: tuple[str, str] | None) -> list[ThreadInfo]:
        """A page of threads, most recent activity first, after ``(last_event_at, thread_id)``."""
        cursor = None if before is None else ThreadInfo(before[1], 0, before[0], 0)
        return await self.store.list_threads(limit=limit, before=cursor, user_id=self.user_id)

    async def runs(
        self,
        thread_id: str,
        limit: int,
        before_run: str | None = None,
        status: RunStatus | None = None,
    ) -> list[RunSummary]:
        """A page of the thread's runs, newest first, after the run ``before_run``."""
        before = None
        if before_run is not None:
            before = await self.summary(thread_id, before_run)
            if before is None:
                raise NotFound(f"thread {thread_id!r} has no run {before_run!r}")
        runs = await self.store.list_run_summaries(
            thread_id, status=status, limit=limit, before=before, user_id=self.user_id
        )
        if not runs and before is None:
            await self.check_thread(thread_id)
        return runs

    async def summary(self, thread_id: str, run_id: str) -> RunSummary | None:
        """The run's summary, or ``None``."""
        return await self.store.get_run_summary(thread_id, run_id, user_id=self.user_id)

    async def check_thread(self, thread_id: str) -> None:
        """Raise ``NotFound`` unless the thread has a run summary or an event."""
        store, user = self.store, self.user_id
        if await store.list_run_summaries(thread_id, limit=1, user_id=user):
            return
        # Messages first: they have a per-user index, where the thread's events in seq order
        # are scanned for a user's first row.
        if await store.list_messages(thread_id, limit=1, user_id=user):
            return
        if not await store.list_events(thread_id, None, limit=1, user_id=user):
            raise NotFound(f"the journal has no thread {thread_id!r}")

    async def check_run(self, thread_id: str, run_id: str) -> None:
        """Raise ``NotFound`` unless the run has a summary or an event."""
        if await self.summary(thread_id, run_id) is not None:
            return
        if await self.store.list_events(thread_id, run_id, limit=1, user_id=self.user_id):
            return
        await self.check_thread(thread_id)
        raise NotFound(f"thread {thread_id!r} has no run {run_id!r}")

    async def messages(self, thread_id: str, limit: int, before_seq: int | None) -> MessagePage:
        """A page of the store's message rows (``list_messages``) less those a thread-history
        view hides; an empty page of an unknown thread raises ``NotFound``."""
        rows = await self.store.list_messages(
            thread_id, limit=limit, before_seq=before_seq, user_id=self.user_id
        )
        if not rows:
            await self.check_thread(thread_id)
        has_more = len(rows) == limit
        return MessagePage(visible_messages(rows), has_more, rows[0]["seq"] if has_more else None)

    async def events(
        self,
        thread_id: str,
        run_id: str,
        *,
        event_types: list[str] | None = None,
        task_id: str | None = None,
        limit: int = _PAGE,
        after_seq: int | None = None,
    ) -> list[RunEvent]:
        """``list_events`` as the store answers it; an empty page of an unknown run raises
        ``NotFound``."""
        events = await self.store.list_events(
            thread_id,
            run_id,
            event_types=event_types,
            task_id=task_id,
            limit=limit,
            after_seq=after_seq,
            user_id=self.user_id,
        )
        if not events:
            await self.check_run(thread_id, run_id)
        return events

    async def run_events(
        self, thread_id: str, run_id: str, after_seq: int | None, most: int
    ) -> list[RunEvent]:
        """Up to ``most`` of the run's events after ``after_seq``, read a page at a time."""
        events: list[RunEvent] = []
        while len(events) < most:
            page = await self.store.list_events(
                thread_id,
                run_id,
                limit=min(_PAGE, most - len(events)),
                after_seq=after_seq,
                user_id=self.user_id,
            )
            events += page
            if len(page) < _PAGE:
                break
            after_seq = page[-1]["seq"]
        return events

    async def workspace_changes(self, thread_id: str, run_id: str) -> dict[str, Any] | None:
        """The run's latest workspace changes payload, or ``None``; unknown run: ``NotFound``."""
        payload = await latest_workspace_changes(
            self.store, thread_id, run_id, user_id=self.user_id
        )
        if payload is None:
            await self.check_run(thread_id, run_id)
        return payload

    async def pauses(self, thread_id: str, run_id: str) -> dict[str, dict[str, RunLink]]:
        """The interrupts and resumes of the thread's other runs, by checkpoint id:
        ``{"run.interrupt": {checkpoint: link}, "run.resume": {...}}`` (the first of each)."""
        found: dict[str, dict[str, RunLink]] = {
            RUN_INTERRUPT_EVENT.event_type: {},
            RUN_RESUME_EVENT.event_type: {},
        }
        # One thread-wide read, paged: every run counts, however many runs the thread has.
        after_seq = None
        while True:
            page = await self.store.list_events(
                thread_id,
                None,
                event_types=list(found),
                limit=_PAGE,
                after_seq=after_seq,
                user_id=self.user_id,
            )
            for event in page:
                content = event["content"]
                checkpoint = content.get("checkpoint_id") if isinstance(content, dict) else None
                if event["run_id"] != run_id and isinstance(checkpoint, str):
                    link = RunLink(event["run_id"], event["seq"])
                    found[event["event_type"]].setdefault(checkpoint, link)
            if len(page) < _PAGE:
                return found
            after_seq = page[-1]["seq"]
