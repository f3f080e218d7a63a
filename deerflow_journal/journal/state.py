"""``RunState``: what the journal knows about one run while its callbacks arrive."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from langchain_core.messages import BaseMessage, HumanMessage
from langgraph.callbacks import GraphInterruptEvent, GraphResumeEvent
from langgraph.types import Command

from deerflow_journal.cost import estimate_cost
from deerflow_journal.journal.mapping import (
    holds_messages,
    input_messages,
    latest_visible_human,
    loose_human_texts,
    message_text,
    messages_in,
    node_state,
)
from deerflow_journal.journal.outcomes import ToolCallOutcomes
from deerflow_journal.journal.usage import TokenUsage
from deerflow_journal.summary import RunStatus, RunSummary

__all__ = ["NewHumans", "RunState", "ToolStart"]


@dataclass(slots=True)
class ToolStart:
    """A running tool: when it started and which call it answers."""

    started: float
    tool_call_id: str | None
    name: str | None
    #: Its call's outcome is written already (the run ended, or its node answered the call
    #: itself): what this tool ends with is too late for any model to see.
    late: bool = False


class NewHumans:
    """Which human messages are new in a run, so its ``llm.human.input`` never repeats one
    that a resumed run finds in its checkpointed state.

    Old are the human messages of the state the run's first nested chain given messages (a
    graph's first node, unless it reads no messages) starts from, except those its inputs
    brought or a nested chain ending before it added (matched by text: LangGraph builds
    messages given as text itself). Anything else is new: a message a node added, one built
    for the prompt, every message of a run with no nested chain. The state is kept as given
    and looked into only when a question is checked: most runs check one.

    Messages are told apart by id. Those without one (a state without LangGraph's
    ``add_messages``, the functional API) are told apart by text, and only in a run resumed
    with a ``Command``: old are the humans the run's first nested chain starts from (a
    graph's interrupted node, a functional entrypoint's checkpointed input; not the
    prompt a task was given, which may hold a question built in this run), as many times
    as they occur there, so an answer given twice in a row is new the second time.
    """

    __slots__ = (
        "_added",
        "_asked",
        "_first",
        "_first_seen",
        "_inputs",
        "_old_ids",
        "_old_texts",
        "_state",
        "state_seen",
    )

    def __init__(self) -> None:
        self._inputs: Any = None
        self._state: Any = None
        self._old_ids: set[str] | None = None
        #: The first nested chain's inputs (kept in a run resumed with a ``Command`` only).
        self._first: Any = None
        self._first_seen = False
        self._old_texts: Counter[str] | None = None  # for the humans without an id
        self._added: set[str] = set()  # texts of humans added before the state was seen
        self._asked: HumanMessage | bool | None = False  # False: not looked for yet
        #: True once a nested chain started from the run's state (read at every chain).
        self.state_seen = False

    def add_inputs(self, inputs: Any) -> None:
        """Note a root invocation's inputs."""
        self._inputs = inputs

    def saw_state(self, inputs: Any) -> None:
        """Note the inputs of a nested chain started before the run's state was seen: the
        state, if they hold messages (a node may declare an input without them)."""
        if not self._first_seen:
            self._first_seen = True
            if isinstance(self._inputs, Command):
                self._first = inputs
        inputs = node_state(inputs)
        if holds_messages(inputs):
            self._state = inputs
            self.state_seen = True

    def saw_outputs(self, outputs: Any) -> None:
        """Note the outputs of a nested chain that ended before the run's state was seen: the
        human messages they add are new."""
        for message in messages_in(outputs):
            if isinstance(message, HumanMessage):
                self._added.add(message_text(message))

    def is_new(self, message: BaseMessage, prompt: Sequence[BaseMessage]) -> bool:
        """True if ``message`` (the latest human of ``prompt``) was not in the state the run
        resumed from."""
        if message.id is None:
            return self._is_new_text(message, prompt)
        if not self.state_seen:
            return True
        if self._old_ids is None:
            brought = self._brought()
            self._old_ids = {
                m.id
                for m in messages_in(self._state)
                if isinstance(m, HumanMessage)
                and m.id is not None
                and message_text(m) not in brought
            }
            self._state = None  # seen, and no longer needed
        return message.id not in self._old_ids

    def _is_new_text(self, message: BaseMessage, prompt: Sequence[BaseMessage]) -> bool:
        if self._first is None and self._old_texts is None:  # not resumed: every one is new
            return True
        if self._old_texts is None:
            old: Counter[str] = Counter()
            first = node_state(self._first)
            if first is not None:
                old.update(
                    message_text(m) for m in messages_in(first) if isinstance(m, HumanMessage)
                )
                old.update(loose_human_texts(first))
                for text in self._brought():
                    del old[text]
            self._old_texts, self._first = old, None
        text = message_text(message)
        old_count = self._old_texts[text]
        if not old_count:
            return True
        asked = sum(
            1
            for m in prompt
            if isinstance(m, HumanMessage) and m.id is None and message_text(m) == text
        )
        return asked > old_count

    def _brought(self) -> set[str]:
        """The texts of the human messages the run's inputs brought, or a nested chain
        ending before the run's state was seen added."""
        objects, texts = input_messages(self._inputs)
        brought = {message_text(m) for m in objects if isinstance(m, HumanMessage)}
        brought.update(texts)
        brought.update(self._added)
        return brought

    def asked(self) -> HumanMessage | None:
        """``last_input()``, looked for once: the question the run's inputs brought."""
        if self._asked is False:
            self._asked = self.last_input()
        return self._asked

    def last_input(self) -> HumanMessage | None:
        """The last visible human message the run's inputs brought, if any."""
        objects, texts = input_messages(self._inputs)
        humans = [m for m in objects if isinstance(m, HumanMessage)]
        humans += [HumanMessage(text) for text in texts]
        return latest_visible_human([humans])


@dataclass(slots=True)
class RunState:
    """Counters, timings and outcomes of one run.

    A run is *bound* once its ids are known (at the root chain start); recorders called
    before that keep their events in ``unbound_events`` until then.
    """

    thread_id: str | None = None
    run_id: str | None = None
    user_id: str | None = None
    root: UUID | None = None
    root_key: Hashable = None  # the root's key in the journal's maps (``UUID.int``)
    sync: bool = False
    status: RunStatus = "running"
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    started: float = field(default_factory=time.monotonic)
    ended_at: datetime | None = None
    duration_ms: int | None = None
    error: dict[str, str] | None = None
    llm_calls: int = 0  # numbers the run's model calls (``llm_call_index``)
    # Keyed by LangChain run id, as UUID.int (cheaper to hash than the UUID; see RunJournal).
    llm_starts: dict[Hashable, tuple[float, int]] = field(default_factory=dict)
    answered: set[Hashable] = field(default_factory=set)
    # Model calls made for structured output (``with_structured_output``): the name of the
    # schema, whose "tool call" is the answer itself, never run by a tool.
    structured: dict[Hashable, str | None] = field(default_factory=dict)
    tool_starts: dict[Hashable, ToolStart] = field(default_factory=dict)
    new_humans: NewHumans = field(default_factory=NewHumans)
    human_written: bool = False  # the run's one ``llm.human.input`` is written
    on_thread: bool = False  # the root config names a LangGraph thread (a checkpoint to resume)
    lead_root: bool = True  # the root is not tagged as a subagent's or middleware's
    memory_recorded: bool = False
    usage: TokenUsage = field(default_factory=TokenUsage)
    outcomes: ToolCallOutcomes = field(default_factory=ToolCallOutcomes)
    message_count: int = 0
    dropped_events: int = 0  # refused by the store for good
    last_ai_message: str | None = None
    first_human_message: str | None = None
    interrupt: GraphInterruptEvent | None = None
    # The latest resume written: a journal among the callbacks twice is told it twice.
    resumed: GraphResumeEvent | None = None
    # An ``interrupt()`` a node of the run's own graph raised: the run pauses, though a stream
    # closed at its ``__interrupt__`` chunk ends the run before ``on_interrupt`` comes.
    pausing: BaseException | None = None
    # The thread a root's metadata named where it may be its caller's, while the run waits
    # to see its own config's (see ``RunJournal._start_run``).
    inherited_thread: str | None = None
    # While it waits: the chains the root (or a top chain) called, whose config is the run's.
    root_steps: set[Hashable] | None = None
    # Chains the root called itself that are not nodes of a root graph (under a wrapped root:
    # its graph, a sequence's steps), by key: their pauses and resumes are the run's.
    top_chains: set[Hashable] = field(default_factory=set)
    closed: bool = False  # its terminal event is written: what comes later follows it
    unbound_events: list[Mapping[str, Any]] = field(default_factory=list)
    workspace_before: Any = None

    def outcome_written(self, tool_call_id: str) -> None:
        """Mark the tools still running for the lead agent's ``tool_call_id`` late: its
        outcome is written, so theirs would be a second one (``asyncio.gather`` leaves a tool
        running when another fails). A subagent's tool under the same id is marked too, and
        told apart by its caller when it ends."""
        for start in self.tool_starts.values():
            if start.tool_call_id == tool_call_id:
                start.late = True

    @property
    def bound(self) -> bool:
        """True once thread and run ids are known."""
        return self.thread_id is not None and self.run_id is not None

    @property
    def ended(self) -> bool:
        """True once the run reached a terminal outcome."""
        return self.status != "running"

    def bind(
        self, root: UUID, run_id: str, thread_id: str | None, *, sync: bool, user_id: str | None
    ) -> list[Mapping[str, Any]]:
        """Start the run under its ids (``thread_id`` ``None``: found later); return the
        events recorded before it started."""
        self.root, self.run_id, self.thread_id = root, run_id, thread_id
        self.root_key = getattr(root, "int", root)
        self.sync, self.user_id = sync, user_id
        self.started_at, self.started = datetime.now(UTC), time.monotonic()
        unbound, self.unbound_events = self.unbound_events, []
        return unbound

    def end(self, status: RunStatus, error: BaseException | None = None) -> None:
        """Record the terminal outcome and its timing."""
        self.status = status
        self.ended_at = datetime.now(UTC)
        self.duration_ms = int((time.monotonic() - self.started) * 1000)
        if error is not None:
            self.error = {"type": type(error).__name__, "message": str(error)}

    def completion_data(self) -> dict[str, Any]:
        """Return exactly the keys of ``RunJournal.get_completion_data()``."""
        return {
            **self.usage.completion_data(),
            "message_count": self.message_count,
            "last_ai_message": self.last_ai_message,
            "first_human_message": self.first_human_message,
        }

    def summary_fields(self) -> dict[str, Any]:
        """The run's ``RunSummary`` fields as of now, in the model's field order."""
        data = self.completion_data()
        cost, cost_by_model = estimate_cost(data["token_usage_by_model"], self.started_at)
        return {
            "thread_id": self.thread_id or "",
            "run_id": self.run_id or "",
            "user_id": self.user_id,
            "status": self.status,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "duration_ms": self.duration_ms,
            "error": None if self.error is None else dict(self.error),
            **data,
            "dropped_events": self.dropped_events,
            "estimated_cost_usd": cost,
            "estimated_cost_by_model": cost_by_model,
        }

    def summary(self) -> RunSummary:
        """Return the run's ``RunSummary`` as of now."""
        return RunSummary(**self.summary_fields())

    def summary_json(self) -> dict[str, Any]:
        """``summary().to_json_dict()``, without the model: the journal writes one per run,
        and building and dumping a pydantic model costs more than the rest of it."""
        fields = self.summary_fields()
        fields["started_at"] = _json_time(self.started_at)
        if self.ended_at is not None:
            fields["ended_at"] = _json_time(self.ended_at)
        return fields


def _json_time(at: datetime) -> str:
    """A UTC time as pydantic writes it in JSON: ISO 8601 ending in ``Z``."""
    text = at.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text
