"""Tool-call outcomes: every tool call a lead-agent response requests ends with exactly one."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

from deerflow_journal.journal.mapping import LEAD_AGENT
from deerflow_journal.summary import RunStatus

__all__ = ["ToolCallOutcomes"]

#: A result waiting for its chain: (that chain's key, tool call id, caller, its event).
_Waiting = tuple[Hashable, str | None, str, Mapping[str, Any]]


class ToolCallOutcomes:
    """The lead agent's requested tool calls that have no result or error yet, in order.

    A tool error is held back until the call can no longer be retried (the caller's next
    model call, or the run's end): a retry that succeeds replaces it with its result. A result
    waits for the chain that made the call (a graph node) to end: if that attempt fails, the
    graph may run the node again (a retry policy) and drop its output, so the result is held
    like an error and a retry's answer replaces it.
    """

    __slots__ = ("answers", "attempts", "held", "pending")

    def __init__(self) -> None:
        #: Requested calls without an outcome: id -> (tool name, the control flow that stopped it).
        self.pending: dict[str, tuple[str | None, RunStatus | None]] = {}
        #: Held errors: id -> (caller, its ``tool.error``), until the call cannot be retried.
        self.held: dict[str, tuple[str, Mapping[str, Any]]] = {}
        #: The content of each call's latest result, by caller and id (a subagent's model may
        #: number its calls as the lead agent's does), until the run closes.
        self.answers: dict[tuple[str, str], Any] = {}
        #: Results waiting for the chain that made their call to end, in the order they came.
        self.attempts: list[_Waiting] = []

    def requested(self, tool_calls: Iterable[Mapping[str, Any]], caller: str = LEAD_AGENT) -> None:
        """Start waiting for an outcome of each lead-agent call (calls without an id cannot be
        matched); a call of any caller forgets the latest answer to its id."""
        lead = caller == LEAD_AGENT
        for call in tool_calls:
            call_id = call.get("id")
            if isinstance(call_id, str) and call_id:
                if lead:
                    self.pending[call_id] = (call.get("name"), None)
                # A model may use an id again (some number their calls afresh each turn): a
                # new call, whose answer is written even if it repeats the last one.
                self.answers.pop((caller, call_id), None)

    def resolve(self, tool_call_id: str | None) -> bool:
        """Mark a call as ended (dropping an error a retry made good); False if not pending."""
        if tool_call_id is None:
            return False
        self.held.pop(tool_call_id, None)
        return self.pending.pop(tool_call_id, False) is not False

    def answered(self, tool_call_id: str | None, content: Any, caller: str) -> bool:
        """End a call of ``caller`` with a result whose content is ``content``; False if that
        very result is its latest already (a tools node retried after another of its calls
        failed runs this one again): it is not written twice. A different one is: the model
        sees it."""
        if not tool_call_id:  # no call to match (None, or a tool message without one)
            return True
        # resolve(), inlined (one call per tool result), for this caller's call alone: a
        # subagent's model may number its calls as the lead agent's does.
        held = self.held
        if held and tool_call_id in held and held[tool_call_id][0] == caller:
            del held[tool_call_id]
        if caller == LEAD_AGENT:  # only the lead agent's calls wait for an outcome
            self.pending.pop(tool_call_id, None)
        answers, key = self.answers, (caller, tool_call_id)
        if key in answers and answers[key] == content:
            return False
        answers[key] = content
        return True

    def answered_without_callback(self, tool_call_id: str | None) -> bool:
        """End a call that a message answers though no tool callback saw it (LangGraph's
        ``ToolNode`` answers an unknown tool name itself); False if that is not the case."""
        if tool_call_id not in self.pending or tool_call_id in self.held:
            return False
        if self.pending[tool_call_id][1] is not None:  # stopped by control flow
            return False
        del self.pending[tool_call_id]
        return True

    def stopped(self, tool_call_id: str | None, status: RunStatus) -> None:
        """Note that a call was stopped by control flow (``status``: what the stop stands for);
        its last attempt decides, so an error an earlier attempt left is dropped."""
        if tool_call_id in self.pending:
            self.held.pop(tool_call_id, None)
            self.pending[tool_call_id] = (self.pending[tool_call_id][0], status)

    def returned(
        self, chain: Hashable, tool_call_id: str | None, caller: str, event: Mapping[str, Any]
    ) -> None:
        """Keep a result until ``chain``, which made its call, ends."""
        self.attempts.append((chain, tool_call_id, caller, event))

    def chain_ended(self, chain: Hashable, *, failed: bool) -> list[Mapping[str, Any]]:
        """Return the results of ``chain``'s calls to write now; a failed chain's are held (a
        retry of it answers its calls again: the latest answer is written, once)."""
        ended = self._take(lambda attempt: attempt[0] == chain)
        if not failed:
            return [event for _, _, _, event in ended]
        written = []
        for _, tool_call_id, caller, event in ended:
            if tool_call_id:
                self.held[tool_call_id] = (caller, event)
                self.answers.pop((caller, tool_call_id), None)  # a retry's like answer is new
            else:  # no retry can be matched to it
                written.append(event)
        return written

    def returned_so_far(self, caller: str | None = None) -> list[Mapping[str, Any]]:
        """Return the results of ``caller``'s calls (or all) still waiting for their chain: a
        model call of that caller, or the run's end, comes after them."""
        waiting = self._take(lambda attempt: caller is None or attempt[2] == caller)
        return [event for _, _, _, event in waiting]

    def _take(self, taken: Callable[[_Waiting], bool]) -> list[_Waiting]:
        """Remove the waiting results ``taken`` picks and return them, in order."""
        took, kept = [], []
        for attempt in self.attempts:
            (took if taken(attempt) else kept).append(attempt)
        self.attempts = kept
        return took

    def failed(self, tool_call_id: str, caller: str, event: Mapping[str, Any]) -> None:
        """Hold the ``tool.error`` of a call made by ``caller`` (a later attempt replaces it)."""
        self.held[tool_call_id] = (caller, event)

    def settle(self, caller: str | None = None) -> list[Mapping[str, Any]]:
        """Return the held errors (of ``caller``, or all) and count their calls as ended."""
        settled: list[Mapping[str, Any]] = []
        if not self.held:
            return settled
        for call_id, (held_by, event) in list(self.held.items()):
            if caller is None or held_by == caller:
                self.resolve(call_id)
                settled.append(event)
        return settled

    def unresolved(self, status: RunStatus) -> list[tuple[str, str | None, RunStatus]]:
        """Return and forget the pending calls as ``(tool_call_id, name, stopped by)`` in
        request order: a call's own stop, else the run's terminal ``status``."""
        pending = [(id_, name, own or status) for id_, (name, own) in self.pending.items()]
        self.pending.clear()
        self.answers.clear()  # the run closed: nothing of it runs again
        return pending
