"""Tool-call outcomes: every tool call a lead-agent response requests ends with exactly one."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from deerflow_journal.summary import RunStatus

__all__ = ["ToolCallOutcomes"]


class ToolCallOutcomes:
    """The lead agent's requested tool calls that have no result or error yet, in order.

    A tool error is held back until the call can no longer be retried (the caller's next
    model call, or the run's end): a retry that succeeds replaces it with its result.
    """

    __slots__ = ("answers", "held", "pending", "settled")

    def __init__(self) -> None:
        #: Requested calls without an outcome: id -> (tool name, the control flow that stopped it).
        self.pending: dict[str, tuple[str | None, RunStatus | None]] = {}
        #: Held errors: id -> (caller, its ``tool.error``), until the call cannot be retried.
        self.held: dict[str, tuple[str, Mapping[str, Any]]] = {}
        #: The content of each call's latest result, until the run closes.
        self.answers: dict[str, Any] = {}
        #: Calls whose outcome no later callback may change: answered by a message no tool
        #: callback gave, ended by an error the model saw, or ended with the run. A tool
        #: still running then (one that ``asyncio.gather`` left going when another failed)
        #: ends too late for any model to see its result or error, which would be the call's
        #: second outcome; a tool that starts later is a new call (``started``).
        self.settled: set[str] = set()

    def requested(self, tool_calls: Iterable[Mapping[str, Any]]) -> None:
        """Start waiting for an outcome of each call (calls without an id cannot be matched)."""
        for call in tool_calls:
            call_id = call.get("id")
            if isinstance(call_id, str) and call_id:
                self.pending[call_id] = (call.get("name"), None)
                self.answers.pop(call_id, None)  # a model may use an id again: a new call
                self.settled.discard(call_id)

    def started(self, tool_call_id: str) -> None:
        """Note a tool starting: for a settled call it is a new call under a reused id (a
        subagent's model numbering its calls afresh), whose outcome is written."""
        self.settled.discard(tool_call_id)

    def resolve(self, tool_call_id: str | None) -> bool:
        """Mark a call as ended (dropping an error a retry made good); False if not pending."""
        if tool_call_id is None:
            return False
        self.held.pop(tool_call_id, None)
        return self.pending.pop(tool_call_id, False) is not False

    def answered(self, tool_call_id: str | None, content: Any) -> bool:
        """End a call with a result whose content is ``content``; False if that very result
        is its latest already (a tools node retried after another of its calls failed runs
        this one again): it is not written twice. A different one is: the model sees it.
        False too for a call already settled (see ``settled``)."""
        if not tool_call_id:  # no call to match (None, or a tool message without one)
            return True
        if tool_call_id in self.settled:
            return False
        if self.held:  # resolve(), inlined: one call per tool result
            self.held.pop(tool_call_id, None)
        self.pending.pop(tool_call_id, None)
        answers = self.answers
        if tool_call_id in answers and answers[tool_call_id] == content:
            return False
        answers[tool_call_id] = content
        return True

    def answered_without_callback(self, tool_call_id: str | None) -> bool:
        """End a call that a message answers though no tool callback saw it (LangGraph's
        ``ToolNode`` answers an unknown tool name itself); False if that is not the case."""
        if tool_call_id not in self.pending or tool_call_id in self.held:
            return False
        if self.pending[tool_call_id][1] is not None:  # stopped by control flow
            return False
        del self.pending[tool_call_id]
        self.settled.add(tool_call_id)
        return True

    def stopped(self, tool_call_id: str | None, status: RunStatus) -> None:
        """Note that a call was stopped by control flow (``status``: what the stop stands for);
        its last attempt decides, so an error an earlier attempt left is dropped."""
        if tool_call_id in self.pending:
            self.held.pop(tool_call_id, None)
            self.pending[tool_call_id] = (self.pending[tool_call_id][0], status)

    def failed(self, tool_call_id: str, caller: str, event: Mapping[str, Any]) -> None:
        """Hold the ``tool.error`` of a call made by ``caller`` (a later attempt replaces it),
        unless the call is settled already."""
        if tool_call_id not in self.settled:
            self.held[tool_call_id] = (caller, event)

    def settle(self, caller: str | None = None) -> list[Mapping[str, Any]]:
        """Return the held errors (of ``caller``, or all) and count their calls as ended."""
        settled: list[Mapping[str, Any]] = []
        if not self.held:
            return settled
        for call_id, (held_by, event) in list(self.held.items()):
            if caller is None or held_by == caller:
                self.resolve(call_id)
                self.settled.add(call_id)
                settled.append(event)
        return settled

    def unresolved(self, status: RunStatus) -> list[tuple[str, str | None, RunStatus]]:
        """Return and forget the pending calls as ``(tool_call_id, name, stopped by)`` in
        request order: a call's own stop, else the run's terminal ``status``."""
        pending = [(id_, name, own or status) for id_, (name, own) in self.pending.items()]
        # The run closed: what its calls still report comes too late to be their outcome.
        self.settled.update(self.pending)
        self.settled.update(self.answers)
        self.pending.clear()
        self.answers.clear()
        return pending
