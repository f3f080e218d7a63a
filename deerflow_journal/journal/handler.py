"""``RunJournal``: the callback handler that turns a LangChain/LangGraph run into events.

The handler only keeps per-run state and dispatches: ``mapping`` decides what each callback
becomes, ``usage`` counts tokens, ``outcomes`` tracks tool calls and ``writer`` writes.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping
from types import MappingProxyType, TracebackType
from typing import Any, Self
from uuid import UUID

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, LLMResult
from langchain_core.runnables.config import var_child_runnable_config
from langgraph.callbacks import GraphCallbackHandler, GraphInterruptEvent, GraphResumeEvent

from deerflow_journal.journal import mapping
from deerflow_journal.journal.buffer import SummaryBuilder
from deerflow_journal.journal.loops import (
    dispatched_synchronously,
    looked_up_by_async_dispatcher,
    on_background_loop,
    running_loop,
)
from deerflow_journal.journal.progress import ProgressReporter, ProgressThrottle
from deerflow_journal.journal.state import RunState, ToolStart
from deerflow_journal.journal.workspace import Snapshot, WorkspaceTracker
from deerflow_journal.journal.writer import JournalWriter
from deerflow_journal.records import check_text, current_user_id
from deerflow_journal.stores import JournalStore, RunEventStore, open_store
from deerflow_journal.subagent import subagent_run_event
from deerflow_journal.summary import RunSummary
from deerflow_journal.sync import SyncStore
from deerflow_journal.workspace import WorkspaceChangeLimits, WorkspaceRoot

__all__ = ["RunJournal"]

logger = logging.getLogger(__name__)

#: How many recent runs a journal can still count refused events for (a write follows its
#: run closely; a reusable journal must not grow with every run it saw).
_RUNS_REMEMBERED = 64
#: How many calls still running when their run ended a journal keeps track of: their later
#: callbacks add to that run. Bounded, as a call whose end never arrives would stay forever.
_LATE_CALLS_REMEMBERED = 1024
#: A model call not made for structured output (``RunState.structured`` has no entry).
_NOT_STRUCTURED: Any = object()


def _ms_since(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def _key(run_id: Any) -> Hashable:
    """How the run maps key a LangChain run id: ``UUID.int`` (hashing a UUID runs Python
    code, hashing an int does not), or the id itself if a caller's config set it as text.

    The per-callback paths inline ``getattr(run_id, "int", run_id)`` to spare the call.
    """
    return getattr(run_id, "int", run_id)


def _names_no_thread(metadata: Mapping[str, Any] | None) -> bool:
    """Whether a callback's metadata carries no LangGraph ``thread_id`` at all."""
    return (metadata or {}).get("thread_id") in (None, "")


_NO_CONFIG: Mapping[str, Any] = MappingProxyType({})  # what _context gives without a context


def _context() -> tuple[Mapping[str, Any], Any]:
    """LangChain's config context of the runnable calling us, and the run its callbacks are
    children of (``None``: no context, or callbacks without a parent)."""
    config = var_child_runnable_config.get()
    if not config:  # most roots: no context, and no AttributeError raised to see it
        return _NO_CONFIG, None
    callbacks = config.get("callbacks")
    return config, None if callbacks is None else getattr(callbacks, "parent_run_id", None)


def _names_context_thread(thread_id: str) -> bool:
    """Whether LangChain's config context (the caller's config) names ``thread_id``."""
    found = (_context()[0].get("configurable") or {}).get("thread_id")
    return found is not None and str(found) == thread_id


def _config_thread_id(metadata: Mapping[str, Any] | None) -> str | None:
    """The LangGraph config's ``thread_id`` (in a callback's metadata or a config's
    ``configurable``), or ``None`` if absent or not a storable id."""
    found = (metadata or {}).get("thread_id")
    if found is None or found == "":
        return None
    try:
        return check_text(str(found), "thread_id")
    except ValueError as exc:
        logger.warning("ignoring the config's thread_id (%s); using the run id", exc)
        return None


def _summary_builder(lock: threading.Lock, state: RunState) -> SummaryBuilder:
    """What builds a run's summary under the journal's ``lock`` (it holds the lock, not the
    journal: a buffer still writing must not keep the journal alive)."""
    # A partial: a new object each time, as a closure was, made in C (twice a run).
    return functools.partial(_build_summary, lock, state)


def _build_summary(
    lock: threading.Lock, state: RunState, timeout: float = -1, *, locked: bool = False
) -> dict[str, Any]:
    if locked:
        return state.summary_json()
    if not lock.acquire(timeout=timeout):
        raise TimeoutError("the journal's lock is held")
    try:
        return state.summary_json()
    finally:
        lock.release()


def _checked_store(store: Any) -> Any:
    """``store`` if it has the two async methods a journal writes through, else TypeError
    (ValueError for one of our stores opened read-only)."""
    if isinstance(store, SyncStore | RunEventStore) and store.read_only:  # refuses every write
        raise ValueError("event_store is opened read_only: a journal needs a writable store")
    if isinstance(store, SyncStore):  # its async store, which is written on the facade's loop
        store.setup()
        store = store.store
    for name in ("put_batch", "put_run_summary"):
        if not callable(getattr(store, name, None)):
            raise TypeError(
                f"event_store must be a store URL or have an async {name}() method "
                f"(a RunEventStore does), got {type(store).__name__}"
            )
    return store


def _check_count(name: str, value: object) -> None:
    """Raise unless ``value`` is an int (not a bool) of at least 1."""
    if type(value) is int and value >= 1:  # the defaults: one test, no isinstance calls
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")


def _tell_dropped(journal: weakref.ref[RunJournal], events: list[dict[str, Any]]) -> None:
    """Count the dropped ``events`` in the journal, if it still exists."""
    alive = journal()
    if alive is not None:
        alive._events_dropped(events)


class RunJournal(GraphCallbackHandler):
    """Journals LangChain and LangGraph runs as catalog events plus a ``RunSummary``.

    Pass it as a callback (``config={"callbacks": [journal]}``). Each root chain invocation is
    one run: ``run.start`` ... ``run.end``/``run.error``/``run.interrupt``, with model, tool and
    recorder events in between, and the run's summary written at every terminal outcome.

    Args:
        run_id: Run id to write under; ``None`` uses each root invocation's LangChain run id,
            which makes the journal reusable across invocations. Fixed ids must follow the
            store's id rules (``ValueError`` otherwise).
        thread_id: Thread id; ``None`` takes LangGraph's ``thread_id`` from the callback
            metadata, else (also when that one is no valid id, with a warning) the run id.
        event_store: Where events go: a store, any object with async ``put_batch`` and
            ``put_run_summary`` methods, or a store URL. ``None`` or a URL opens
            ``open_store(url)`` (``None``: the default URL); the journal then owns that
            store, runs it on its background loop and closes it when a run ends and on
            ``aclose()``/``close()``. A store passed in belongs to the caller and is used on
            the loop it was set up on while that loop runs (a plain ``invoke`` in a worker
            thread beside it included), else on the loop the callbacks run on, else on the
            journal's background loop. A ``SyncStore`` hands over its store, run on its loop.
        track_token_usage: Count tokens (``False`` leaves every token figure at zero).
        flush_threshold: Write a batch in the background once this many events are pending.
        max_buffered_events: Events kept in memory at most while the store does not take
            them (it is down, say); the next ones go in order to a file in a temporary
            directory and are written once the store answers, then the file is removed. A
            process that exits with events in that file says at ERROR where it is.
        progress_reporter: Async callable receiving ``get_completion_data()`` snapshots (a
            plain function works too: it is called on the event loop, so keep it quick).
        progress_flush_interval: Minimum seconds between two progress snapshots.
        workspace_roots: Directories whose file changes each run records as one
            ``workspace_changes`` event (snapshot at run start, which the run's first step
            waits for; diff at run end).
        workspace_limits: Bounds of those snapshots and diffs.
    """

    run_inline: bool = True
    """Callbacks run inline on the caller's thread or loop; they only touch memory."""

    raise_error: bool = False
    """Journal errors are logged by LangChain and never break the graph (tests turn it on)."""

    def __init__(
        self,
        run_id: str | None = None,
        thread_id: str | None = None,
        event_store: RunEventStore | JournalStore | SyncStore | str | None = None,
        *,
        track_token_usage: bool = True,
        flush_threshold: int = 20,
        max_buffered_events: int = 100_000,
        progress_reporter: ProgressReporter | None = None,
        progress_flush_interval: float = 5.0,
        workspace_roots: Iterable[WorkspaceRoot] | None = None,
        workspace_limits: WorkspaceChangeLimits | None = None,
    ) -> None:
        _check_count("flush_threshold", flush_threshold)
        _check_count("max_buffered_events", max_buffered_events)
        if progress_flush_interval < 0:
            raise ValueError("progress_flush_interval must not be negative")
        if progress_reporter is not None and not callable(progress_reporter):
            raise TypeError(f"progress_reporter must be callable, got {progress_reporter!r}")
        if run_id is not None:
            check_text(run_id, "run_id")
        if thread_id is not None:
            check_text(thread_id, "thread_id")
        self._run_id = run_id
        self._thread_id = thread_id
        self.track_token_usage = track_token_usage
        self._lock = threading.Lock()
        self._runs: dict[Hashable, RunState] = {}  # keyed by _key(run id)
        # The inputs of the nested chains running (a node's: the state it started from).
        self._chain_inputs: dict[Hashable, Any] = {}
        self._open_runs = 0  # runs started and not ended
        # Keys left in _runs by calls still running when their run ended, oldest first.
        self._late_calls: OrderedDict[Hashable, None] = OrderedDict()
        self._latest: RunState | None = None
        self._next: RunState | None = None  # recorded before any run, without a fixed id
        self._outside: RunState | None = None  # recorded before any run, under the fixed id
        # The latest runs by (thread id, run id), to count events their store refused.
        # An OrderedDict: dropping a plain dict's first key scans the keys deleted before it.
        self._bound: OrderedDict[tuple[str | None, str | None], RunState] = OrderedDict()
        self._dropped_events = 0
        self._workspace = (
            None if workspace_roots is None else WorkspaceTracker(workspace_roots, workspace_limits)
        )
        progress = (
            None
            if progress_reporter is None
            else ProgressThrottle(
                progress_reporter, progress_flush_interval, self.get_completion_data
            )
        )
        owned = event_store is None or isinstance(event_store, str)
        self._writer = JournalWriter(
            open_store(event_store) if owned else _checked_store(event_store),
            owns_store=owned,
            flush_threshold=flush_threshold,
            progress=progress,
            max_buffered_events=max_buffered_events,
        )
        self._buffer = self._writer.buffer
        # Weakly: the buffer may outlive the journal (a write still running, say).
        self._buffer.on_dropped = functools.partial(_tell_dropped, weakref.ref(self))

    # -- properties --------------------------------------------------------------------------

    @property
    def event_store(self) -> RunEventStore | JournalStore:
        """The store events are written to."""
        return self._writer.store

    @property
    def dropped_events(self) -> int:
        """How many events the store refused for good: each is logged at ERROR and counted in
        its run's summary; the rest of its batch is written."""
        return self._dropped_events

    @property
    def run_id(self) -> str | None:
        """The id of the latest run (the fixed one before a run starts)."""
        latest = self._latest
        return self._run_id if latest is None else latest.run_id

    @property
    def thread_id(self) -> str | None:
        """The thread of the latest run (the fixed one before a run starts); ``None`` while
        a run waits to learn it, until its first step (see README, "How runs are formed")."""
        latest = self._latest
        return self._thread_id if latest is None else latest.thread_id

    # -- run state (call with self._lock held) -------------------------------------------------

    def _emit(self, state: RunState, event: Any) -> None:
        """Count and buffer one event, copying the containers in its content now (see
        ``mapping.detach``)."""
        self._emit_own(state, mapping.detached_event(event))

    def _emit_own(self, state: RunState, event: Any) -> None:
        """Count and buffer one event whose content needs no copy (a message, or copied
        already)."""
        thread_id, run_id = state.thread_id, state.run_id
        if thread_id is not None and run_id is not None:  # state.bound, inlined
            if event["category"] == "message":
                state.message_count += 1
            # The event dict is ours (built for this event, emitted once): it becomes the
            # buffered record in place; a write starts in the background at the threshold.
            event["thread_id"] = thread_id
            event["run_id"] = run_id
            event["user_id"] = state.user_id
            event["created_at"] = time.time()
            if self._buffer.add(event):
                self._buffer.start_write(self._writer.write_loop(state.sync))
        elif run_id is not None and state.root is not None:
            # A run still waiting for its thread: its first event settles it.
            found = self._root_config_thread(state)
            self._bind_thread(state, found or state.inherited_thread or "")
            self._emit_own(state, event)
        else:
            state.unbound_events.append(event)

    def _write_outcomes(self, state: RunState, caller: str | None = None) -> None:
        """Write the tool outcomes held for a retry and the results waiting for their chain to
        end (of ``caller``'s calls, or all): its model call, or the run's end, follows them."""
        outcomes = state.outcomes
        for event in outcomes.settle(caller):
            self._emit(state, event)
        if outcomes.attempts:
            for event in outcomes.returned_so_far(caller):
                self._emit_own(state, event)

    def _bind(self, state: RunState) -> None:
        """Remember a run just bound to its ids (the latest few)."""
        self._bound[(state.thread_id, state.run_id)] = state
        if len(self._bound) > _RUNS_REMEMBERED:
            self._bound.popitem(last=False)

    def _events_dropped(self, events: list[dict[str, Any]]) -> None:
        """Count events the store refused, in the journal and in their runs' summaries."""
        with self._lock:
            self._dropped_events += len(events)
            for event in events:
                state = self._bound.get((event.get("thread_id"), event.get("run_id")))
                if state is not None:
                    state.dropped_events += 1
                    if event.get("category") == "message":  # counted as written, never was
                        state.message_count -= 1
                    if state.root is not None:  # a run of ours, not a fixed-id recorder's
                        self._queue_summary(state)

    def _queue_summary(self, state: RunState) -> None:
        """Queue the run's summary; it is built from the run's state when written."""
        # A new builder each time: a write keeps a summary it built only if the builder queued
        # is still the one it built with (else the run changed meanwhile: the newer is kept).
        build = _summary_builder(self._lock, state)
        self._buffer.put_summary((state.thread_id or "", state.run_id or ""), build)

    def _root_config_thread(self, state: RunState) -> str | None:
        """The thread of a run's root config where the caller runs in the root's config context
        (its callbacks' parent is the root; for a root that may have inherited its thread,
        also a step the root or a top chain called, such as a node of a root graph: not a
        graph deeper down, which may name a thread of its own): ``""`` for none; ``None``
        elsewhere (a batch starts its items outside their contexts, an executor thread has
        none)."""
        config, caller = _context()
        if caller is None:
            return None
        if caller != state.root and (
            state.root_steps is None or getattr(caller, "int", caller) not in state.root_steps
        ):
            return None
        return _config_thread_id(config.get("configurable")) or ""

    def _parent_run(self, parent_run_id: UUID | None) -> RunState | None:
        return (
            None
            if parent_run_id is None
            else self._runs.get(getattr(parent_run_id, "int", parent_run_id))
        )

    def _caller_run(self) -> RunState | None:
        """The run whose runnable called us (LangChain's config context names its run)."""
        return self._parent_run(_context()[1])

    def _recorder_state(self, *, after_end: bool = True) -> RunState:
        """The run a recorder acts on (call with the lock held).

        The caller's run, else the latest run in progress, else (``after_end``) the latest
        run that ended, else, before any run, the fixed ids' (both known), else the next run.
        """
        state = self._caller_run()
        if state is not None:
            return state
        latest = self._latest
        if latest is not None and not latest.ended:
            return latest
        active = list(self._runs.values())  # one C-level copy: other threads may add runs
        for state in reversed(active):  # ended: a call still running when its run ended
            if not state.ended:
                return state
        if after_end and latest is not None:
            return latest
        if self._run_id is not None and self._thread_id is not None:
            if self._outside is None:
                self._outside = state = RunState()
                state.bind(
                    None,
                    self._run_id,
                    self._thread_id or self._run_id,
                    sync=running_loop() is None,
                    user_id=current_user_id(),
                )
                self._bind(state)
            return self._outside
        if self._next is None:
            self._next = RunState()
        return self._next

    def _recorded(self, state: RunState) -> None:
        """Start writing what a recorder added outside a run in progress: nothing else would
        (call without the lock)."""
        if state.bound and (state.ended or state.root is None):
            self._writer.buffer.write_pending(self._writer.write_loop(state.sync))

    # -- chains --------------------------------------------------------------------------------

    @property
    def on_chain_start(self) -> Callable[..., Any]:
        """Start a run at a root chain; remember nested chains as part of their run.

        With ``workspace_roots``, the root chain waits for the run's workspace snapshot, so no
        step of the run changes a file before the snapshot saw it. LangChain's async
        dispatcher is handed a coroutine function that awaits it without blocking the event
        loop; everyone else (the sync dispatcher, a subclass's override, direct calls) gets the
        plain method, which blocks until the snapshot is taken.
        """
        if self._workspace is not None and looked_up_by_async_dispatcher():
            return self._await_chain_start
        return self._chain_start

    def _chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        if parent_run_id is not None:  # the common case, inlined: most chains are nested
            # One dict lookup and one store, each atomic: nested chains need no lock.
            parent = getattr(parent_run_id, "int", parent_run_id)
            state = self._runs.get(parent)
            if state is not None:
                key = getattr(run_id, "int", run_id)
                self._runs[key] = state
                self._chain_inputs[key] = inputs
                if not state.new_humans.state_seen:  # usually the first nested chain only
                    state.new_humans.saw_state(inputs)
                top = parent == state.root_key or parent in state.top_chains
                if top and state.thread_id is None and state.inherited_thread is not None:
                    # A step that runs in the run's own config (see _root_config_thread).
                    if state.root_steps is None:
                        state.root_steps = set()
                    state.root_steps.add(key)
                top = top and self._top_chain(state, key, kwargs)
                if state.thread_id is None:
                    self._thread_found(state, top, kwargs.get("metadata"))
                return
            # A parent the journal never saw: a root all the same (see ``_rooted_elsewhere``).
        if self._joined_caller_run(run_id, parent_run_id):
            return
        # _start_root, inlined: no keyword arguments packed again
        name = mapping.chain_name(serialized, kwargs.get("name"))
        tags, metadata = kwargs.get("tags"), kwargs.get("metadata")
        WorkspaceTracker.wait(self._start_run(run_id, name, tags, metadata, inputs, chain=True))

    def _joined_caller_run(self, run_id: UUID, parent_run_id: UUID | None = None) -> bool:
        """A root call given the journal as its own callbacks inside a node of a run in
        progress (``chain.invoke(x, {"callbacks": [journal]})``, a model or tool alike), or
        inside such a call still running after its run ended, is part of that run; True if it
        joined one, or if it is no run at all: a call with a parent whose caller has the
        journal among its callbacks was called from a run the journal saw and forgot (a task
        a node left running, started after the node ended), not from outside."""
        config, caller = _context()
        if caller is None:  # most roots: no run called them, and no lock is needed to see it
            return False
        with self._lock:
            active = self._parent_run(caller)
            if active is None:
                handlers = getattr(config.get("callbacks"), "inheritable_handlers", ())
                return parent_run_id is not None and self in handlers
            key = getattr(run_id, "int", run_id)
            self._runs[key] = active
            caller_key = getattr(caller, "int", caller)
            if not active.ended and (
                caller_key == active.root_key or caller_key in active.top_chains
            ):
                # A wrapper handed the root's own config (``with_fallbacks`` does): a chain the
                # root called itself.
                active.top_chains.add(key)
        return True

    async def _await_chain_start(
        self, serialized: dict[str, Any] | None, inputs: Any, **kwargs: Any
    ) -> None:
        parent = kwargs.get("parent_run_id")
        if parent is not None and getattr(parent, "int", parent) in self._runs:
            self._chain_start(serialized, inputs, **kwargs)
            return
        if self._joined_caller_run(kwargs["run_id"], parent):
            return
        snapshot = self._start_root(serialized, inputs, **kwargs)
        try:
            await WorkspaceTracker.wait_async(snapshot)
        except BaseException as error:
            # Cancelled while waiting: LangChain has no run manager for the chain yet, so no
            # chain error callback will end the run; end it here.
            self._end_run(kwargs["run_id"], None, error)
            raise

    def _start_root(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any = None,
        *,
        run_id: UUID,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Snapshot | None:
        """Start a run at a root call; return its workspace snapshot (``None``: none)."""
        name = mapping.chain_name(serialized, kwargs.get("name"))
        return self._start_run(run_id, name, tags, metadata, inputs, chain=True)

    def _start_run(
        self,
        root: UUID,
        name: str | None,
        tags: list[str] | None,
        metadata: dict[str, Any] | None,
        inputs: Any,
        *,
        chain: bool = False,
    ) -> Snapshot | None:
        """Bind the next run to a root call, write its ``run.start``, start its snapshot.

        A root ``chain`` whose metadata names no thread may be a graph's wrapper
        (``with_retry()``, a function or sequence calling it): LangGraph copies the config's
        thread into the metadata of its own chain only, so the thread waits for the first
        nested chain, which can read the root's config (``_thread_found``).

        So does a root whose metadata names the thread its caller's config names: it may have
        inherited it from its caller (LangChain and LangGraph keep the thread of the metadata
        a call inherits, not the one its own config names: a subagent's graph on a thread of
        its own, called from a node with a journal of its own).
        """
        if _key(root) in self._runs:  # the journal is among the root's callbacks twice
            return None
        sync = dispatched_synchronously()
        loop = running_loop()
        snapshot = None if self._workspace is None else self._workspace.snapshot()
        with self._lock:
            # Recorders used before the run (waiting in _next, or written under the fixed id)
            # hand over their counts; what they recorded is written (or goes out) first.
            state = self._next or self._outside or RunState()
            self._next = self._outside = None
            state.new_humans.add_inputs(inputs)
            run_id = self._run_id or str(root)
            thread_id = self._thread_id
            if thread_id is None:
                thread_id = _config_thread_id(metadata)
                if thread_id is not None and _names_context_thread(thread_id):
                    # Perhaps its caller's: the run's own config tells, once a chain of the
                    # run runs in it (else, at its first event, this one it is).
                    state.inherited_thread, thread_id = thread_id, None
                elif thread_id is None and not (chain and _names_no_thread(metadata)):
                    thread_id = run_id
            unbound = state.bind(root, run_id, thread_id, sync=sync, user_id=current_user_id())
            state.on_thread = bool(metadata and metadata.get("thread_id"))
            caller = mapping.caller_from_tags(tags) if tags else mapping.LEAD_AGENT
            state.lead_root = caller == mapping.LEAD_AGENT
            if thread_id is not None:
                self._bind(state)
            state.workspace_before = snapshot
            self._runs[_key(root)] = self._latest = state
            self._open_runs += 1
            if not sync and loop is not None:
                self._writer.home_loop = loop
            start = mapping.run_start_event(name, caller, metadata)
            # Built afresh, its metadata detached: only an odd chain name needs a copy.
            if name is not None and type(name) is not str:
                start = mapping.detached_event(start)
            if thread_id is None:
                state.unbound_events = [start, *unbound]  # held until the thread is known
                return snapshot
            self._emit_own(state, start)
            for event in unbound:
                self._emit_own(state, event)  # copied when recorded
            self._queue_summary(state)
        return snapshot

    @staticmethod
    def _top_chain(state: RunState, key: Hashable, kwargs: Mapping[str, Any]) -> bool:
        """Remember a chain the root (or such a chain) called itself, unless it is a graph's
        node: wrappers (a retry around a graph under fallbacks) stack up. True if remembered."""
        metadata = kwargs.get("metadata")
        if metadata and "langgraph_node" in metadata:
            return False
        state.top_chains.add(key)
        return True

    def _thread_found(self, state: RunState, top: bool, metadata: Mapping[str, Any] | None) -> None:
        """Bind a run waiting for its thread, if a nested chain tells it: the root's own config
        (LangChain's config context, where it runs in the root's; not a graph nested deeper,
        such as a subagent's, which may name a thread of its own), else the metadata of a
        graph the root called itself (LangGraph copies the thread there), else not yet."""
        found = self._root_config_thread(state)
        if found is None and top and not _names_no_thread(metadata):
            found = _config_thread_id(metadata) or ""
        if found is None:
            return
        with self._lock:
            if state.thread_id is None:
                self._bind_thread(state, found)

    def _bind_thread(self, state: RunState, found: str) -> None:
        """Give a started run the thread its config named (``""``: none, the run id) and
        write what it held until then (call with the lock held)."""
        state.on_thread = bool(found)
        state.thread_id = found or state.run_id
        self._bind(state)
        held, state.unbound_events = state.unbound_events, []
        for event in held:
            self._emit_own(state, event)
        self._queue_summary(state)

    def on_chain_end(
        self,
        outputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        """End the run at its root chain (``run.end``, or ``run.interrupt`` after a pause)."""
        if parent_run_id is None:
            self._end_run(run_id, outputs, None)
        else:
            key = getattr(run_id, "int", run_id)
            state = self._runs.pop(key, None)  # one atomic pop
            self._chain_inputs.pop(key, None)
            if state is not None:
                if state.root_key == key:
                    self._rooted_elsewhere(state, run_id, outputs, None)
                    return
                if not state.new_humans.state_seen:
                    state.new_humans.saw_outputs(outputs)
                if state.outcomes.attempts:
                    self._chain_ended(state, key, failed=False)

    def _chain_ended(self, state: RunState, key: Hashable, *, failed: bool) -> None:
        """Write the results of the tool calls a chain made, now that it ended; a failed
        chain's are held (call without the lock)."""
        with self._lock:
            events = state.outcomes.chain_ended(key, failed=failed)
            for event in events:
                self._emit_own(state, event)
        if events and state.closed:
            self._wrote_late(state)
        elif events and self._writer.progress is not None:
            self._writer.changed(state)

    def _reconcile(self, state: RunState, messages: Iterable[BaseMessage]) -> bool:
        """Write ``llm.tool.result`` for each tool message answering a pending call that no
        tool callback saw (call with the lock held); True if any was written."""
        written = False
        for message in messages:
            if isinstance(message, ToolMessage) and state.outcomes.answered_without_callback(
                message.tool_call_id
            ):
                self._emit_own(
                    state,
                    mapping.tool_result_event(message, mapping.LEAD_AGENT, message.tool_call_id),
                )
                state.outcome_written(message.tool_call_id)
                written = True
        return written

    def on_chain_error(
        self,
        error: BaseException,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        """End the run at its root chain with ``run.error``; a nested chain's error holds the
        results of the tool calls it made (its graph node may be retried)."""
        if parent_run_id is None:
            self._end_run(run_id, None, error)
        else:
            key = getattr(run_id, "int", run_id)
            state = self._runs.pop(key, None)
            self._chain_inputs.pop(key, None)
            if state is not None and state.root_key == key:
                self._rooted_elsewhere(state, run_id, None, error)
            elif state is not None:  # rare: taking the lock waits for a tool ending meanwhile
                stopped_by = mapping.control_flow_status(error)
                if stopped_by in ("interrupted", "cancelled"):
                    parent = getattr(parent_run_id, "int", parent_run_id)
                    if parent == state.root_key or parent in state.top_chains:
                        # The run's own graph pauses: a stream its caller stops at the
                        # ``__interrupt__`` chunk ends the run before LangGraph reports it.
                        # A step of its own cut short is no pause: the run was cancelled.
                        state.pausing = error if stopped_by == "interrupted" else None
                # An interrupt, a cancellation or a handoff is no failed attempt to retry.
                self._chain_ended(state, key, failed=stopped_by is None)

    def _rooted_elsewhere(
        self, state: RunState, root: UUID, outputs: Any, error: BaseException | None
    ) -> None:
        """End the run of a root chain that has a parent all the same, one the journal never
        saw: LangGraph makes the caller's run the parent of a graph given the journal inside
        a runnable that is not journaled (a function chain, another graph's node), and
        LangChain makes a LangSmith trace's run the parent of what it calls. Its nested end
        popped the run already."""
        self._end_run(root, outputs, error, state)

    def _end_run(
        self,
        root: UUID,
        outputs: Any,
        error: BaseException | None,
        popped: RunState | None = None,
    ) -> None:
        with self._lock:
            state = self._runs.pop(_key(root), popped)
            if state is None or state.ended or state.root != root:
                return  # a chain that joined the run of its caller ends nothing
            if state.outcomes.pending and outputs is not None:
                self._reconcile(state, mapping.messages_in(outputs))
            if (
                state.pausing is not None
                and state.interrupt is None
                and error is not None
                and mapping.control_flow_status(error) == "cancelled"
            ):
                error = state.pausing  # paused, then its stream was closed (see pausing)
            status, terminal = mapping.terminal_event(outputs, error, state.interrupt)
            # Copied now: with workspace roots it is written after the caller has its outputs.
            mapping.detached_event(terminal)
            state.end(status, error if status in ("error", "cancelled") else None)
            state.top_chains.clear()  # the run is kept a while; its pauses are settled
            self._open_runs -= 1
            self._keep_late_calls(state)
        loop = self._writer.caller_loop(state.sync)
        workspace, snapshot = self._workspace, state.workspace_before
        if workspace is None or snapshot is None:
            self._close_run(state, terminal, None, loop)
        elif state.sync and not on_background_loop():
            self._close_run(state, terminal, workspace.changes_blocking(snapshot), loop)
        else:

            async def close_when_diffed() -> None:
                self._close_run(state, terminal, await workspace.changes(snapshot), loop)

            self._writer.run_in_background(close_when_diffed())

    def _keep_late_calls(self, state: RunState) -> None:
        """Keep the calls of a run that just ended that are still running (a task a node did
        not wait for): their later callbacks add to it (call with the lock held). Calls such
        a call started since an earlier run ended are counted in too, so that the latest
        ``_LATE_CALLS_REMEMBERED`` are all that is kept."""
        runs, late = self._runs, self._late_calls
        for key, value in list(runs.items()):
            if value is state or value.ended:
                late[key] = None  # a key already there keeps its place
        while len(late) > _LATE_CALLS_REMEMBERED:
            key, _ = late.popitem(last=False)
            found = runs.get(key)
            if found is not None and found.ended:
                runs.pop(key, None)  # its end may pop it meanwhile: nested ends take no lock
                self._chain_inputs.pop(key, None)

    def _wrote_late(self, state: RunState) -> None:
        """Write what was added to a run after its terminal event, and its summary again
        (call without the lock). Tool errors are not held for a retry then: the run's end
        settled those."""
        with self._lock:
            self._write_outcomes(state)
            # Under a fixed run id a later run may hold the same ids: its summary is kept.
            holder = self._bound.get((state.thread_id, state.run_id))
            if holder is None or holder is state:
                self._queue_summary(state)
            last = not self._open_runs
        self._writer.run_ended(state, self._writer.caller_loop(state.sync), last)

    def _close_run(
        self,
        state: RunState,
        terminal: mapping.EventKwargs,
        workspace_event: dict[str, Any] | None,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        """Write a run's closing events and summary: held tool errors, workspace, unresolved
        calls, terminal."""
        with self._lock:
            if not state.human_written and (
                state.status == "interrupted" or (state.on_thread and state.status != "success")
            ):
                # Stopped before any model saw the question (``interrupt_before``; a failed
                # or cancelled step of a checkpointed thread, retried with ``invoke(None)``):
                # the run that resumes finds it in its state, so this one records it.
                asked = state.new_humans.last_input()
                if asked is not None:
                    self._write_human(state, asked)
            self._write_outcomes(state)
            if workspace_event is not None:
                self._emit(state, workspace_event)
            for tool_call_id, name, stopped_by in state.outcomes.unresolved(state.status):
                reason = mapping.UNRESOLVED_REASONS[stopped_by]
                self._emit(state, mapping.tool_unresolved_event(tool_call_id, name, reason))
                state.outcome_written(tool_call_id)
            self._emit_own(state, terminal)  # copied in _end_run, under the lock
            state.closed = True
            self._queue_summary(state)
            last = not self._open_runs
        self._writer.run_ended(state, loop, last)

    # -- retrievers -----------------------------------------------------------------------------

    def on_retriever_start(
        self,
        serialized: dict[str, Any],
        query: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        """Remember a retriever as part of its run, so model calls inside it are attributed;
        a retriever called directly is a run of its own."""
        state = self._parent_run(parent_run_id)
        if state is None:  # called directly, or a root all the same (see _rooted_elsewhere)
            tags, metadata = kwargs.get("tags"), kwargs.get("metadata")
            self._start_leaf(serialized, query, run_id, tags, metadata, kwargs, parent_run_id)
        else:
            self._runs[_key(run_id)] = state

    def on_retriever_end(
        self, documents: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        """Forget a finished retriever (end the run of one called directly)."""
        self._retriever_ended(run_id, parent_run_id, documents, None)

    def on_retriever_error(
        self,
        error: BaseException,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        """Forget a failed retriever (end the run of one called directly)."""
        self._retriever_ended(run_id, parent_run_id, None, error)

    def _retriever_ended(
        self,
        run_id: UUID,
        parent_run_id: UUID | None,
        documents: Any,
        error: BaseException | None,
    ) -> None:
        key = _key(run_id)
        state = self._runs.get(key)
        if state is not None and (parent_run_id is None or state.root_key == key):
            self._leaf_ended(state, run_id, documents, error)
        else:
            self._runs.pop(key, None)

    # -- LangGraph lifecycle -------------------------------------------------------------------

    def on_interrupt(self, event: GraphInterruptEvent) -> None:
        """Remember the pause; the root chain's end then writes ``run.interrupt``."""
        with self._lock:
            state = self._top_graphs_run(event)
            if state is not None:
                state.interrupt = event

    def on_resume(self, event: GraphResumeEvent) -> None:
        """Write ``run.resume`` when a root invocation resumes from a checkpoint (a wrapper
        resuming its graph within the run ends the pause it recorded)."""
        with self._lock:
            state = self._top_graphs_run(event)
            if state is not None and state.resumed is not event:  # once per duplicate handler
                state.resumed = event
                state.interrupt = state.pausing = None
                self._emit(state, mapping.run_resume_event(event))

    def _top_graphs_run(self, event: GraphInterruptEvent | GraphResumeEvent) -> RunState | None:
        """The run whose own graph paused or resumed: the root, or a top-level graph the root
        calls itself (``with_retry()``, a sequence or function around it), not a subgraph or
        a graph a node runs on a thread of its own, whose pause is not the run's."""
        key = _key(event.run_id)
        state = self._runs.get(key) if event.run_id is not None else None
        if state is None or state.root == event.run_id:
            return state
        return state if not event.checkpoint_ns and key in state.top_chains else None

    # -- models --------------------------------------------------------------------------------

    def _start_leaf(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        run_id: UUID,
        tags: list[str] | None,
        metadata: dict[str, Any] | None,
        kwargs: Mapping[str, Any],
        parent: UUID | None = None,
    ) -> None:
        """Start a run at a model, tool or retriever called directly (no chain around it), or
        with a ``parent`` the journal never saw (see ``_rooted_elsewhere``).

        One called with its own callbacks from inside a run of ours (a graph node passing
        ``{"callbacks": [journal]}``) is part of that run instead. Its workspace snapshot is
        waited for only under a sync dispatcher: an async one would block its event loop.
        """
        if self._joined_caller_run(run_id, parent):
            return
        name = mapping.chain_name(serialized, kwargs.get("name"))
        snapshot = self._start_run(run_id, name, tags, metadata, inputs)
        if snapshot is not None and dispatched_synchronously():
            WorkspaceTracker.wait(snapshot)

    def _leaf_ended(
        self, state: RunState, run_id: UUID, outputs: Any, error: BaseException | None
    ) -> None:
        """End the run of a model, tool or retriever called directly, or forget the call if
        it was part of a run it was called from."""
        if state.root == run_id:
            self._end_run(run_id, outputs, error)
        else:
            self._runs.pop(getattr(run_id, "int", run_id), None)
            if state.closed:
                self._wrote_late(state)

    def _own_run(self, run_id: UUID, parent_run_id: UUID | None) -> RunState | None:
        """The run a model call belongs to: its parent's, else its own (a call that started a
        run, or joined its caller's: see ``_start_leaf``)."""
        if parent_run_id is not None:
            state = self._runs.get(getattr(parent_run_id, "int", parent_run_id))
            if state is not None:
                return state
        return self._runs.get(getattr(run_id, "int", run_id))

    def _llm_started(
        self, run_id: UUID, parent_run_id: UUID | None, caller: str
    ) -> RunState | None:
        """Time a model call: the caller's held tool outcomes can no longer be retried, and
        the results still waiting for their chain came before it."""
        owner = run_id if parent_run_id is None else parent_run_id  # _own_run, inlined
        state = self._runs.get(getattr(owner, "int", owner))
        if state is not None:
            state.llm_calls += 1
            state.llm_starts[getattr(run_id, "int", run_id)] = (time.monotonic(), state.llm_calls)
            outcomes = state.outcomes
            if outcomes.held or outcomes.attempts:  # most calls follow none
                self._write_outcomes(state, caller)
        return state

    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Time the call; a lead-agent call whose prompt ends with a human message new in this
        run records it as the run's one human input (a model called directly: its prompt).
        A subagent's or middleware's call before any of the lead agent's records the question
        the run's inputs brought, if any, so that it comes before their answers (unless the
        run's root itself is tagged as theirs)."""
        key, runs = getattr(run_id, "int", run_id), self._runs
        # The run it belongs to (_llm_started, inlined from here): its parent's, one lookup
        # without the lock as a nested chain's; else its own, once it is started.
        parent = None if parent_run_id is None else getattr(parent_run_id, "int", parent_run_id)
        state = None if parent is None else runs.get(parent)
        if state is None:  # called directly, or a root all the same (see _rooted_elsewhere)
            self._start_leaf(serialized, messages[0], run_id, tags, metadata, kwargs, parent_run_id)
            state = runs.get(key)
        caller = mapping.caller_from_tags(tags) if tags else mapping.LEAD_AGENT
        options = kwargs.get("options")
        structured = options.get("ls_structured_output_format") if options else None
        self._lock.acquire()  # not `with`: half the cost on CPython 3.11, on every event
        try:
            if state is None:
                return
            state.llm_calls += 1
            state.llm_starts[key] = (time.monotonic(), state.llm_calls)
            outcomes = state.outcomes
            if outcomes.held or outcomes.attempts:  # most calls follow none
                self._write_outcomes(state, caller)
            if caller != mapping.LEAD_AGENT:
                # Not in a run whose root is a subagent's or middleware's: its inputs are a
                # task's prompt, not a user's question.
                if (
                    state.human_written
                    or not state.lead_root
                    or (asked := state.new_humans.asked()) is None
                ):
                    return
                self._write_human(state, asked)
                changed = True
            elif structured or outcomes.pending or not state.human_written:
                changed = self._lead_agent_prompt(state, run_id, messages, structured)
            else:  # most lead-agent calls: nothing to note in their prompt
                changed = False
        finally:
            self._lock.release()
        if changed:
            if state.closed:  # a call left running when its run ended
                self._wrote_late(state)
            else:
                self._writer.changed(state)

    def _lead_agent_prompt(
        self,
        state: RunState,
        run_id: UUID,
        messages: list[list[BaseMessage]],
        structured: Any,
    ) -> bool:
        """Note a lead-agent call's prompt (call with the lock held); True if it wrote."""
        if structured:
            state.structured[getattr(run_id, "int", run_id)] = mapping.schema_name(structured)
        if state.outcomes.pending and messages:
            # The prompt may hold answers no tool callback gave (ToolNode answers an
            # unknown tool itself); looked for only here and at the run's end, which is
            # before anything could follow them, and costs nothing on the common path.
            changed = self._reconcile(state, messages[0])
        else:
            changed = False
        if not state.human_written:
            human = mapping.latest_visible_human(messages)
            if human is not None and state.new_humans.is_new(human, messages[0]):
                self._write_human(state, human)
                changed = True
        return changed

    def _write_human(self, state: RunState, human: HumanMessage) -> None:
        """Write the run's one ``llm.human.input`` (call with the lock held)."""
        state.human_written = True
        if state.first_human_message is None:  # an image alone has no text: stays None
            state.first_human_message = mapping.message_text(human) or None
        self._emit_own(state, mapping.human_input_event(human))  # a message

    def on_llm_start(
        self,
        serialized: dict[str, Any],
        prompts: list[str],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Time a completion (non-chat) model call."""
        if self._parent_run(parent_run_id) is None:  # none, or a root all the same
            self._start_leaf(serialized, prompts, run_id, tags, metadata, kwargs, parent_run_id)
            parent_run_id = None
        caller = mapping.caller_from_tags(tags)
        with self._lock:
            self._llm_started(run_id, parent_run_id, caller)

    def on_llm_end(
        self,
        response: LLMResult,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        """Write one ``llm.ai.response`` per generated message and count its tokens once.

        A repeated callback writes nothing; usage already reported for this run id (as an
        external record) is not counted again, but the response is still written.
        """
        # response_messages, inlined for the common case: one plain message
        generations = response.generations
        if (
            len(generations) == 1
            and len(generations[0]) == 1
            and type(only := generations[0][0]) is ChatGeneration
            and type(first := only.message) is AIMessage
        ):
            messages = [first]
        else:
            messages = mapping.response_messages(response)
        caller = mapping.caller_from_tags(tags) if tags else mapping.LEAD_AGENT
        self._lock.acquire()  # not `with`: half the cost on CPython 3.11, on every event
        try:
            key = getattr(run_id, "int", run_id)
            # _own_run, inlined
            parent = key if parent_run_id is None else getattr(parent_run_id, "int", parent_run_id)
            state = self._runs.get(parent)
            if state is None and parent_run_id is not None:
                state = self._runs.get(key)  # a root all the same, or joined its caller's run
                if state is None:
                    return
                parent_run_id = None
            if state is None or key in state.answered:
                return
            state.answered.add(key)
            start = state.llm_starts.pop(key, None)
            if start is None:
                state.llm_calls += 1
                start = (None, state.llm_calls)
            # _ms_since, inlined
            latency = None if start[0] is None else int((time.monotonic() - start[0]) * 1000)
            lead = caller == mapping.LEAD_AGENT
            # A structured-output call's schema name (None: unknown), popped for every choice
            schema = (
                state.structured.pop(key, _NOT_STRUCTURED) if state.structured else _NOT_STRUCTURED
            )
            usages = []  # the events' copies of each message's usage_metadata
            model = None
            for message in messages:
                # A plain message's fields in one read: a pydantic model's attribute reads
                # cost more than dict lookups, on every model call.
                fields = (
                    message.__dict__ if type(message) is AIMessage else mapping.ai_fields(message)
                )
                if model is None:  # the first message names the model
                    model = mapping.model_name(fields["response_metadata"])
                event = mapping.ai_response_event(
                    message, fields, caller=caller, latency_ms=latency, llm_call_index=start[1]
                )
                usages.append(event["metadata"]["usage"])
                self._emit_own(state, event)
                calls = fields["tool_calls"]
                if lead:
                    if calls:
                        if schema is not _NOT_STRUCTURED:  # the schema's call is the answer
                            calls = [c for c in calls if schema is not None and c["name"] != schema]
                        state.outcomes.requested(calls)
                    text = fields["content"]
                    if type(text) is not str:
                        text = mapping.message_text(message)
                    if text.strip():  # the last lead-agent response with text
                        state.last_ai_message = text[: mapping.LAST_AI_MESSAGE_MAX_CHARS]
                elif calls and state.outcomes.answers:
                    state.outcomes.requested(calls, caller)
            if self.track_token_usage:
                if model is None:
                    model = "unknown"
                # One usage per call: with several choices (n > 1) each carries all of it.
                used = usages[0] if usages else None
                if len(usages) > 1 and not used:
                    used = next((usage for usage in usages if usage), used)
                if not used and response.llm_output:
                    # A chat model reporting its usage the older way (``llm_output``'s
                    # ``token_usage``, as a completion model does) and not on the message.
                    used = mapping.completion_usage(response.llm_output)
                # Counted when the totals are read (a copy: the message may change meanwhile).
                state.usage.add_call_later(key, caller, model, used)
        finally:
            self._lock.release()
        if parent_run_id is None:
            self._leaf_ended(state, run_id, messages[0] if len(messages) == 1 else messages, None)
        elif state.closed:  # a call left running when its run ended
            self._wrote_late(state)
        elif self._writer.progress is not None:
            self._writer.changed(state)

    def on_llm_error(
        self,
        error: BaseException,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        """Write ``llm.error`` (and end the run of a model called directly)."""
        with self._lock:
            state = self._own_run(run_id, parent_run_id)
            if state is None:
                return
            key = _key(run_id)
            if key in self._runs:  # in a run of its own or joined (see _own_run): ends so
                parent_run_id = None
            state.llm_starts.pop(key, None)
            if state.structured:
                state.structured.pop(key, None)
            self._emit(state, mapping.llm_error_event(error, mapping.caller_from_tags(tags)))
        if parent_run_id is None:
            self._leaf_ended(state, run_id, None, error)
        elif state.closed:
            self._wrote_late(state)

    # -- tools ---------------------------------------------------------------------------------

    def on_tool_start(
        self,
        serialized: dict[str, Any] | None,
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        """Time the tool and remember which call it answers."""
        name = kwargs.get("name") or (serialized or {}).get("name")
        key, runs = getattr(run_id, "int", run_id), self._runs
        # The run it belongs to, looked up once as a chat model's start does: its parent's,
        # else its own once started (called directly, or a root all the same: see
        # ``_rooted_elsewhere``).
        parent = None if parent_run_id is None else getattr(parent_run_id, "int", parent_run_id)
        state = None if parent is None else runs.get(parent)
        if state is None:
            inputs = kwargs.get("inputs", input_str)
            tags, metadata = kwargs.get("tags"), kwargs.get("metadata")
            self._start_leaf(serialized, inputs, run_id, tags, metadata, kwargs, parent_run_id)
            state = runs.get(key)
        self._lock.acquire()  # not `with`: half the cost on CPython 3.11, on every event
        try:
            if state is None:
                return
            runs[key] = state
            state.tool_starts[key] = ToolStart(time.monotonic(), kwargs.get("tool_call_id"), name)
        finally:
            self._lock.release()

    def on_tool_end(
        self,
        output: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        """Write ``llm.tool.result`` for each message the tool returned (and end the run of a
        tool called directly)."""
        # tool_result_messages, inlined for the common case: a tool returned its message
        messages = [output] if type(output) is ToolMessage else mapping.tool_result_messages(output)
        caller = mapping.caller_from_tags(tags) if tags else mapping.LEAD_AGENT
        key = getattr(run_id, "int", run_id)
        # The nested chain that made the call (a graph node) may still fail, and be run again
        # (not the run's root, nor a tool: their ends do not release results).
        chain = None if parent_run_id is None else getattr(parent_run_id, "int", parent_run_id)
        self._lock.acquire()  # not `with`: half the cost on CPython 3.11, on every event
        try:
            runs = self._runs
            if parent_run_id is None:  # _tool_run, inlined
                state = runs.get(key)
            else:
                state = runs.pop(key, None) or runs.get(chain)
                if state is not None and state.root_key == key:
                    runs[key] = state  # a root all the same (see ``_rooted_elsewhere``)
                    parent_run_id = chain = None
            if state is None:
                return
            start = state.tool_starts.pop(key, None)
            if start is not None and start.late and caller == mapping.LEAD_AGENT:
                messages = []  # its call's outcome is written: this one came too late
            elif type(output) is not ToolMessage and messages:  # a Command's update
                messages = self._new_messages(parent_run_id, messages)
            outcomes = state.outcomes
            waits = chain in self._chain_inputs and not state.closed
            written = False
            for message in messages:
                if type(message) is ToolMessage:  # its fields in one read (see on_llm_end)
                    fields = message.__dict__  # one built by model_construct may lack an id
                    call_id, content = fields.get("tool_call_id"), fields["content"]
                else:
                    call_id, content = getattr(message, "tool_call_id", None), message.content
                if outcomes.answered(call_id, content, caller):
                    event = mapping.tool_result_event(message, caller, call_id)
                    if waits:
                        outcomes.returned(chain, call_id, caller, event)
                    else:
                        self._emit_own(state, event)
                        written = True
        finally:
            self._lock.release()
        if parent_run_id is None:
            self._leaf_ended(state, run_id, output, None)
        elif state.closed:  # a call left running when its run ended
            self._wrote_late(state)
        elif written and self._writer.progress is not None:
            self._writer.changed(state)

    def _new_messages(
        self, parent_run_id: UUID | None, messages: list[BaseMessage]
    ) -> list[BaseMessage]:
        """The messages of a tool's ``Command`` update that the state its node started from
        does not hold (call with the lock held): a handoff repeats that whole state, of which
        LangGraph's ``add_messages`` keeps one message per id. A message sent again under its
        id with new content (``add_messages`` replaces it) is not written either."""
        inputs = self._chain_inputs.get(getattr(parent_run_id, "int", parent_run_id))
        state = mapping.node_state(inputs)
        known = {m.id for m in mapping.messages_in(state)} if state is not None else ()
        return [m for m in messages if m.id is None or m.id not in known]

    def on_tool_error(
        self,
        error: BaseException,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        """Write ``tool.error``; an interrupt or a cancellation leaves the call unresolved.

        The error of a call with an id is held until the caller's next model call or the
        run's end, so a retry that succeeds leaves only its result.
        """
        caller = mapping.caller_from_tags(tags)
        key = getattr(run_id, "int", run_id)
        with self._lock:
            state = self._tool_run(key, parent_run_id)
            if state is None:
                return
            self._tool_failed(state, key, error, caller, kwargs)
        if parent_run_id is None or state.root_key == key:
            self._leaf_ended(state, run_id, None, error)
        elif state.closed:
            self._wrote_late(state)

    def _tool_run(self, key: Hashable, parent_run_id: UUID | None) -> RunState | None:
        """The run of an ending tool; a nested tool is forgotten, a root one is left for
        ``_end_run`` (call with the lock held)."""
        runs = self._runs
        if parent_run_id is None:
            return runs.get(key)
        state = runs.pop(key, None)
        if state is not None and state.root_key == key:
            runs[key] = state  # a root all the same (see ``_rooted_elsewhere``)
        return state or runs.get(getattr(parent_run_id, "int", parent_run_id))

    def _tool_failed(
        self,
        state: RunState,
        key: Hashable,
        error: BaseException,
        caller: str,
        kwargs: Mapping[str, Any],
    ) -> None:
        """Write or hold a tool's error (call with the lock held)."""
        start = state.tool_starts.pop(key, None)
        if start is not None and start.late and caller == mapping.LEAD_AGENT:
            return  # its call's outcome is written: this error came too late
        tool_call_id = kwargs.get("tool_call_id") or (start and start.tool_call_id)
        stopped_by = mapping.control_flow_status(error)
        if stopped_by is not None:
            state.outcomes.stopped(tool_call_id, stopped_by)
            return
        event = mapping.tool_error_event(
            tool_call_id=tool_call_id,
            name=start.name if start else kwargs.get("name"),
            error=error,
            caller=caller,
            latency_ms=_ms_since(start.started) if start else None,
        )
        if tool_call_id:
            state.outcomes.failed(tool_call_id, caller, event)
        else:
            self._emit(state, event)

    # -- subagents ----------------------------------------------------------------------------

    def on_custom_event(
        self,
        name: str,
        data: Any,
        *,
        run_id: UUID,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Journal ``task_*`` subagent chunks dispatched as custom events: they become
        ``subagent.*`` events (see docs/events.md)."""
        chunk = mapping.task_chunk(name, data)
        event = None if chunk is None else subagent_run_event(chunk)
        if event is None:
            return
        with self._lock:
            state = self._runs.get(_key(run_id))
            if state is None:
                return
            self._emit(state, event)
        if state.closed:
            self._wrote_late(state)

    def record_subagent_chunk(self, chunk: Mapping[str, Any]) -> bool:
        """Journal one ``task_*`` chunk (e.g. from ``stream_mode="custom"``); False if malformed."""
        event = subagent_run_event(chunk)
        if event is None:
            return False
        with self._lock:
            state = self._recorder_state()
            self._emit(state, event)
        self._recorded(state)
        return True

    def record_subagent_chunks(self, chunks: Iterable[Mapping[str, Any]]) -> int:
        """Journal several ``task_*`` chunks in order; return how many were well formed."""
        return sum(self.record_subagent_chunk(chunk) for chunk in chunks)

    # -- recorders -----------------------------------------------------------------------------

    def record_middleware(
        self, tag: str, *, name: str, hook: str, action: str, changes: Mapping[str, Any]
    ) -> None:
        """Write ``middleware:{tag}`` with content {name, hook, action, changes}.

        Recorders act on the run whose graph calls them (with several runs in flight), else
        on the latest run (one that ended gets the event after its end). Before any run, a
        journal with a fixed ``run_id`` writes under that id; one without keeps the event for
        the next run (right after its ``run.start``). Subclasses add their own tags by
        calling this method; ``ValueError`` for a tag outside 1..21 characters.
        """
        event = mapping.middleware_event(tag, name=name, hook=hook, action=action, changes=changes)
        with self._lock:
            state = self._recorder_state()
            self._emit(state, event)
        self._recorded(state)

    def record_memory_context(self, *, content_sha256: str) -> bool:
        """Write the run's one ``context:memory``; False if it already has one."""
        event = mapping.memory_context_event(content_sha256)
        with self._lock:
            state = self._recorder_state()
            if state.memory_recorded:
                return False
            state.memory_recorded = True
            self._emit(state, event)
        self._recorded(state)
        return True

    def set_first_human_message(self, text: str) -> None:
        """Set the run's ``first_human_message`` (overrides the one taken from the prompt)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a string, got {type(text).__name__}")
        with self._lock:
            state = self._recorder_state(after_end=False)
            state.first_human_message = text
        if state.closed:  # called from a call left running when its run ended
            self._wrote_late(state)

    def record_external_llm_usage_records(self, records: Iterable[Mapping[str, Any]]) -> int:
        """Add token usage of model calls made elsewhere; return how many records counted.

        Records reported after a run ended count toward that run, whose stored summary is then
        written again.
        """
        records = [records] if isinstance(records, Mapping) else list(records)
        for index, record in enumerate(records):  # checked whole: nothing counts half-way
            if not isinstance(record, Mapping):
                raise TypeError(f"usage record {index} must be a dict, got {type(record).__name__}")
        if not self.track_token_usage:
            return 0
        with self._lock:
            state = self._recorder_state()
            counted = state.usage.add_external(records)
        if counted and state.closed:
            self._wrote_late(state)
        elif counted:
            self._writer.changed(state)
        return counted

    # -- reading -------------------------------------------------------------------------------

    def get_completion_data(self) -> dict[str, Any]:
        """Token totals and message facts of the latest run (zeros before any run)."""
        with self._lock:
            state = self._latest or self._next or RunState()
            return state.completion_data()

    def summary(self) -> RunSummary:
        """Return the latest run's ``RunSummary``; ``RuntimeError`` before any run started."""
        with self._lock:
            if self._latest is None:
                raise RuntimeError(
                    "no run has started yet: a run starts when a graph, chain, model, tool or "
                    "retriever is called with the journal in its callbacks"
                )
            return self._latest.summary()

    # -- flushing and closing ------------------------------------------------------------------

    async def flush(self) -> None:
        """Write every event that has a run, and the summaries; raise if the store fails
        (they stay buffered).

        Tool errors held back in case a retry succeeds are written too: a retry after the
        flush adds its outcome beside the error. A journal with a fixed ``run_id`` but no
        ``thread_id`` that has not seen a run writes what it recorded under the thread named
        like the run.
        """
        self._settle()
        await self._writer.flush()

    def _settle(self) -> None:
        """Give every recorded event a run it can be written under, now."""
        with self._lock:
            for state in {id(state): state for state in self._runs.values()}.values():
                self._write_outcomes(state)
            waiting = self._next
            if self._run_id is None or waiting is None or not waiting.unbound_events:
                return
            unbound = waiting.bind(
                None,
                self._run_id,
                self._thread_id or self._run_id,
                sync=running_loop() is None,
                user_id=current_user_id(),
            )
            self._next, self._outside = None, waiting
            self._bind(waiting)
            for event in unbound:
                self._emit_own(waiting, event)

    async def aclose(self) -> None:
        """Flush, wait for progress snapshots, and close the store if the journal opened it."""
        self._settle()
        self._warn_waiting()
        await self._writer.aclose()

    def close(self) -> None:
        """Blocking ``aclose()`` for code without an event loop (inside a coroutine whose loop
        runs one of the journal's writes it cannot wait for it, and logs a WARNING)."""
        self._settle()
        self._warn_waiting()
        self._writer.close()

    def _warn_waiting(self) -> None:
        """Say so when recorders called after the last run ended left events for a next run."""
        with self._lock:
            waiting = 0 if self._next is None else len(self._next.unbound_events)
        if waiting:
            logger.warning(
                "journal closed with %d recorded events waiting for a run to start (they were "
                "recorded when no run was in progress): they are written only if one starts",
                waiting,
            )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
