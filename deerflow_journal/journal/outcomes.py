"""Tool-call outcomes: every tool call a lead-agent response requests ends with exactly one."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["ToolCallOutcomes"]


class ToolCallOutcomes:
    """The lead agent's requested tool calls that have no result or error yet, in order."""

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending: dict[str, str | None] = {}

    def requested(self, tool_calls: Iterable[Mapping[str, Any]]) -> None:
        """Start waiting for an outcome of each call (calls without an id cannot be matched)."""
        for call in tool_calls:
            call_id = call.get("id")
            if isinstance(call_id, str) and call_id:
                self._pending[call_id] = call.get("name")

    def resolve(self, tool_call_id: str | None) -> bool:
        """Mark a call as ended; False if it was not pending (another run's call, say)."""
        return tool_call_id is not None and self._pending.pop(tool_call_id, False) is not False

    def unresolved(self) -> list[tuple[str, str | None]]:
        """Return and forget the pending calls as ``(tool_call_id, name)`` in request order."""
        pending = list(self._pending.items())
        self._pending.clear()
        return pending
