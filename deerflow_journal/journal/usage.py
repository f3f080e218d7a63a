"""Token accounting for one run: totals, per-caller and per-model buckets, counted once per call.

LangChain's convention is that input tokens include cache reads and creations and output tokens
include reasoning tokens; those details are reported beside the totals, never added to them.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping
from typing import Any
from uuid import UUID

from deerflow_journal.catalog import MIDDLEWARE_EVENT_PATTERN

__all__ = ["TokenCounts", "TokenUsage", "token_counts"]

# Detail buckets kept per model only when non-zero: (bucket, usage details key, detail name).
_DETAILS = (
    ("cache_read_tokens", "input_token_details", "cache_read"),
    ("cache_creation_tokens", "input_token_details", "cache_creation"),
    ("reasoning_tokens", "output_token_details", "reasoning"),
)
TokenCounts = dict[str, int]
_MIDDLEWARE_PREFIX = MIDDLEWARE_EVENT_PATTERN.prefix
_NUMBERS = (int, float)  # built once: an ``int | float`` union is a new object on every call


def _int(value: Any) -> int:
    """A token figure as a non-negative int: 0 for non-numbers, bools, NaN and infinities."""
    if type(value) is int:  # the common case, on every model call: one check
        return value if value > 0 else 0
    if isinstance(value, bool) or not isinstance(value, _NUMBERS):
        return 0
    return max(int(value), 0) if -math.inf < value < math.inf else 0


def token_counts(usage: Mapping[str, Any] | None) -> TokenCounts:
    """Read a LangChain ``usage_metadata`` dict into input/output/total and non-zero details."""
    if not usage:
        return {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
    # _int inlined for the common case, a positive int (one call per model response).
    input_tokens = usage.get("input_tokens")
    if type(input_tokens) is not int or input_tokens < 0:
        input_tokens = _int(input_tokens)
    output_tokens = usage.get("output_tokens")
    if type(output_tokens) is not int or output_tokens < 0:
        output_tokens = _int(output_tokens)
    total = usage.get("total_tokens")
    if type(total) is not int or total < 0:
        total = _int(total)
    counts = {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "total_tokens": total or input_tokens + output_tokens,
    }
    # Most responses have no details: a falsy check spares the loop and the ABC isinstance.
    if usage.get("input_token_details") or usage.get("output_token_details"):
        for bucket, section, key in _DETAILS:
            details = usage.get(section)
            value = _int(details.get(key)) if details and isinstance(details, Mapping) else 0
            if value:
                counts[bucket] = value
    return counts


def _source_key(source: Any) -> Hashable:
    """LangChain run ids are counted as ``UUID.int``: an external record names them as text."""
    try:
        return UUID(str(source)).int
    except ValueError:
        return str(source)


class TokenUsage:
    """Accumulates the token usage of one run.

    Each model call counts once, under its LangChain run id (or an external record's
    ``source_run_id``), however often its callback repeats; ``llm_call_count`` is the number
    of calls counted. Calls added with ``add_call_later`` are counted, in order, before any
    other is and before ``completion_data`` or ``llm_call_count`` reads the totals (the
    attributes alone may lag until then).
    """

    __slots__ = (
        "_counted",
        "_later",
        "by_model",
        "lead_agent_tokens",
        "middleware_tokens",
        "subagent_tokens",
        "total_input_tokens",
        "total_output_tokens",
        "total_tokens",
    )

    def __init__(self) -> None:
        self._counted: set[Hashable] = set()
        self.total_input_tokens = 0
        self.total_output_tokens = 0
        self.total_tokens = 0
        self.lead_agent_tokens = 0
        self.subagent_tokens = 0
        self.middleware_tokens = 0
        self.by_model: dict[str, TokenCounts] = {}
        #: Calls to count before the totals are next read: ``add_call_later``'s arguments,
        #: four items a call (flat: no tuple per call kept alive for the collector to scan).
        self._later: list[Any] = []

    @property
    def llm_call_count(self) -> int:
        """How many model calls were counted."""
        self._count_later()
        return len(self._counted)

    def add_call_later(
        self, source_id: Hashable, caller: str, model: str, usage: Mapping[str, Any] | None
    ) -> None:
        """``add_call`` of a response's ``usage_metadata`` (``None``: no response), made when
        the totals are next read or counted: a model callback spends no time on it. ``usage``
        must not change meanwhile (the journal passes its own copy)."""
        self._later += (source_id, caller, model, usage)

    def _count_later(self) -> None:
        later = self._later
        if later:
            self._later = []
            items = iter(later)
            for source_id, caller, model, usage in zip(items, items, items, items, strict=True):
                counts = () if usage is None else (token_counts(usage),)
                self.add_call(source_id, caller, model, counts)

    def add_call(
        self, source_id: Hashable, caller: str, model: str, counts: Iterable[TokenCounts]
    ) -> bool:
        """Count the call ``source_id`` whose generations used ``counts``; False on a repeat."""
        self._count_later()
        if source_id in self._counted:
            return False
        self._counted.add(source_id)
        for one in counts:  # one per call but for external records: no method call each
            total = one["total_tokens"]
            self.total_input_tokens += one["input_tokens"]
            self.total_output_tokens += one["output_tokens"]
            self.total_tokens += total
            if caller.startswith("subagent:"):
                self.subagent_tokens += total
            elif caller.startswith(_MIDDLEWARE_PREFIX):  # is_middleware_caller, for a str
                self.middleware_tokens += total
            else:
                self.lead_agent_tokens += total
            bucket = self.by_model.get(model)
            if bucket is None:  # the model's first call: its counts (input, output, total, ...)
                self.by_model[model] = dict(one)
            else:
                for key, value in one.items():
                    bucket[key] = bucket.get(key, 0) + value
        return True

    def add_external(self, records: Iterable[Mapping[str, Any]]) -> int:
        """Count usage records made elsewhere; return how many were counted.

        A record needs a ``source_run_id`` (each counts once) and some tokens; ``model_name``
        ``None`` counts as ``unknown`` and ``caller`` defaults to the lead agent.
        """
        counted = 0
        for record in records:
            source = record.get("source_run_id")
            if not source:
                continue
            counts = token_counts(record)
            cache_read = _int(record.get("cache_read_tokens"))
            if cache_read:
                counts["cache_read_tokens"] = cache_read
            if not counts["total_tokens"]:
                continue
            caller = record.get("caller")
            model = record.get("model_name")
            counted += self.add_call(
                _source_key(source),
                caller if isinstance(caller, str) and caller else "lead_agent",
                model if isinstance(model, str) and model else "unknown",
                [counts],
            )
        return counted

    def completion_data(self) -> dict[str, Any]:
        """Return the token keys of ``get_completion_data()`` (a copy)."""
        self._count_later()
        return {
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
            "total_tokens": self.total_tokens,
            "llm_call_count": self.llm_call_count,
            "lead_agent_tokens": self.lead_agent_tokens,
            "subagent_tokens": self.subagent_tokens,
            "middleware_tokens": self.middleware_tokens,
            "token_usage_by_model": {model: dict(c) for model, c in self.by_model.items()},
        }
