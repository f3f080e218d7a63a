"""A run's events as a readable timeline, and its ``RunSummary`` as a few lines of text.

``timeline_rows`` describes each stored event as a ``TimelineRow`` (one line's worth: offset,
kind, caller, text, indentation and the event it answers), for any viewer to lay out;
``render_timeline`` and ``render_summary`` lay them out as plain (or ANSI-coloured) text.
Rows are built defensively: an event of an unknown type or an odd shape still gets its line.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from deerflow_journal.catalog import (
    CANCELLED_ERROR_TYPES,
    LLM_AI_RESPONSE_EVENT,
    LLM_ERROR_EVENT,
    LLM_HUMAN_INPUT_EVENT,
    LLM_TOOL_RESULT_EVENT,
    MEMORY_CONTEXT_EVENT,
    MIDDLEWARE_EVENT_PATTERN,
    RUN_END_EVENT,
    RUN_ERROR_EVENT,
    RUN_INTERRUPT_EVENT,
    RUN_RESUME_EVENT,
    RUN_START_EVENT,
    SUBAGENT_END_EVENT,
    SUBAGENT_START_EVENT,
    SUBAGENT_STEP_EVENT,
    TOOL_ERROR_EVENT,
    TOOL_UNRESOLVED_EVENT,
    WORKSPACE_CHANGES_EVENT,
)
from deerflow_journal.cost import model_cost
from deerflow_journal.journal.usage import token_counts
from deerflow_journal.summary import RunSummary

__all__ = ["TimelineRow", "format_duration", "render_summary", "render_timeline", "timeline_rows"]

#: Longest piece of event text (a message, a result, call arguments) a row keeps.
_PIECE_CHARS = 240
_AI_TYPES = frozenset({LLM_AI_RESPONSE_EVENT.event_type, "ai_message"})

_RESET = "\x1b[0m"
_DIM = "\x1b[2m"
_BOLD = "\x1b[1m"
_GREEN = "\x1b[32m"
_RED = "\x1b[31m"
_YELLOW = "\x1b[33m"
_CYAN = "\x1b[36m"
#: Row and summary statuses by colour; anything else stays uncoloured.
_STATUS_COLORS = {
    **dict.fromkeys(("ok", "success", "completed"), _GREEN),
    **dict.fromkeys(("error", "failed"), _RED),
    **dict.fromkeys(("unresolved", "interrupted", "cancelled", "timed_out", "running"), _YELLOW),
    "resumed": _CYAN,
}


@dataclass(frozen=True, slots=True)
class TimelineRow:
    """One event of a timeline, described for a single line of a viewer."""

    #: The event's ``seq``.
    seq: int
    #: The event's run (a thread's timeline may hold several).
    run_id: str
    #: Seconds since the first listed event of its run; ``None`` if a time is unreadable.
    offset: float | None
    #: The event type, e.g. ``llm.tool.result``.
    kind: str
    #: ``metadata.caller`` (``lead_agent``, ``subagent:{name}``, ...), or ``""``.
    caller: str
    #: What happened, on one line (control characters escaped), without the link below.
    text: str
    #: Nesting level: 1 for a subagent step under its task, else 0.
    depth: int = 0
    #: ``seq`` of the event this one answers (the call of a tool outcome, the task a
    #: ``subagent.end`` closes, the interrupt a ``run.resume`` continues), when listed.
    answers: int | None = None
    #: The tool call a tool outcome answers, whether or not its call is listed.
    tool_call_id: str | None = None
    #: The outcome the line reports (``ok``, ``error``, ``unresolved``, ``success``,
    #: ``interrupted``, ``resumed``, ``cancelled``, a subagent status), else ``None``.
    status: str | None = None
    #: The estimated USD cost of a model response whose model has a price (see
    #: ``deerflow_journal.cost``), else ``None``.
    cost_usd: float | None = None


# -- reading events ---------------------------------------------------------------------


def _get(value: Any, key: str) -> Any:
    return value.get(key) if isinstance(value, Mapping) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _int(value: Any) -> int:
    return value if type(value) is int and value > 0 else 0


def _one_line(text: str) -> str:
    """Whitespace collapsed and control characters escaped, so a line stays one line and no
    stored text can steer the terminal."""
    text = " ".join(text.split())
    if text.isprintable():
        return text
    return "".join(
        ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text
    )


def _short(value: Any, limit: int = _PIECE_CHARS) -> str:
    text = _one_line(value if isinstance(value, str) else str(value))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _message_text(content: Any) -> str:
    """The text of message content: a string, or the text parts of a content-block list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            item if isinstance(item, str) else _get(item, "text")
            for item in content
            if isinstance(item, str) or _get(item, "type") in ("text", None)
        ]
        return " ".join(part for part in parts if isinstance(part, str))
    return "" if content is None else str(content)


def _quote(text: str) -> str:
    """``text`` in quotes, like ``repr`` picks them, without escaping it a second time."""
    quote = '"' if "'" in text and '"' not in text else "'"
    return f"{quote}{text}{quote}"


def _quoted(content: Any) -> str:
    return _quote(_short(_message_text(content)))


def _calls(tool_calls: Any) -> str:
    """``name(args), ...`` of a list of tool calls."""
    if not isinstance(tool_calls, list):
        return ""
    return ", ".join(
        f"{_get(call, 'name') or '?'}({_short(_get(call, 'args') or {}, 120)})"
        for call in tool_calls
    )


def _tokens(usage: Any) -> str:
    """``[138 tok: 120 in, 18 out]``, with cache reads and reasoning when reported."""
    if not isinstance(usage, Mapping):
        return ""
    input_tokens, output_tokens = _int(usage.get("input_tokens")), _int(usage.get("output_tokens"))
    total = _int(usage.get("total_tokens")) or input_tokens + output_tokens
    if not total:
        return ""
    cached = _int(_get(usage.get("input_token_details"), "cache_read"))
    reasoning = _int(_get(usage.get("output_token_details"), "reasoning"))
    inputs = f"{input_tokens} in" + (f" ({cached} cached)" if cached else "")
    outputs = f"{output_tokens} out" + (f" ({reasoning} reasoning)" if reasoning else "")
    return f"[{total} tok: {inputs}, {outputs}]"


def _call_cost(content: Any, usage: Mapping[str, Any], created_at: Any) -> float | None:
    """The estimated cost of one model response, priced when it was written."""
    response = _get(content, "response_metadata")
    model = _get(response, "model_name") or _get(response, "model")
    if not isinstance(model, str) or not model:
        return None
    try:
        at = datetime.fromisoformat(created_at) if isinstance(created_at, str) else None
    except ValueError:
        at = None
    return model_cost(model, token_counts(usage), at)


def _joined(*parts: str) -> str:
    return " · ".join(part for part in parts if part)


def _offsets(events: Sequence[Mapping[str, Any]]) -> list[float | None]:
    """Each event's seconds since the first event of its run (in ``seq`` order)."""
    origins: dict[Any, datetime | None] = {}
    offsets: list[float | None] = []
    for event in events:
        created = event.get("created_at")
        if isinstance(created, str):
            try:
                created = datetime.fromisoformat(created)
            except ValueError:
                created = None
        if not isinstance(created, datetime):
            created = None
        origin = origins.setdefault(event.get("run_id"), created)
        try:
            offsets.append((created - origin).total_seconds() if created and origin else None)
        except TypeError:  # a naive timestamp beside an aware one
            offsets.append(None)
    return offsets


# -- describing events ------------------------------------------------------------------


class _Describer:
    """Describes events in ``seq`` order, remembering what later events answer."""

    def __init__(self, events: Sequence[Mapping[str, Any]]) -> None:
        self.calls: dict[str, tuple[int, str | None]] = {}  # tool_call_id -> (seq, name)
        self.tasks: dict[str, int] = {}  # task_id -> seq of its subagent.start
        self.step_calls: dict[str, list[tuple[int, str | None]]] = {}  # task_id -> asked
        self.interrupts: dict[str, int] = {}  # checkpoint_id -> seq of its run.interrupt
        task_ids = {
            _get(event.get("content"), "task_id")
            for event in events
            if str(event.get("event_type", "")).startswith("subagent.")
        }
        # Steps name their task only when several tasks share the timeline.
        self.name_tasks = len(task_ids) > 1

    def row(self, event: Mapping[str, Any], offset: float | None) -> TimelineRow:
        kind = str(event.get("event_type", ""))
        seq = event.get("seq")
        metadata = event.get("metadata")
        caller = _get(metadata, "caller")
        base = {
            "seq": seq if isinstance(seq, int) else 0,
            "run_id": str(event.get("run_id", "")),
            "offset": offset,
            "kind": kind,
            "caller": _one_line(caller) if isinstance(caller, str) else "",
        }
        return TimelineRow(**base, **self._describe(kind, base["seq"], event))

    def _describe(self, kind: str, seq: int, event: Mapping[str, Any]) -> dict[str, Any]:
        content, metadata = event.get("content"), event.get("metadata")
        if kind == RUN_START_EVENT.event_type:
            chain = _get(content, "chain")
            return {"text": f"chain {_short(chain)}" if chain else "run started"}
        if kind == LLM_HUMAN_INPUT_EVENT.event_type:
            return {"text": _quoted(_get(content, "content"))}
        if kind in _AI_TYPES:
            return self._ai_response(seq, content, metadata, event.get("created_at"))
        if kind in (
            LLM_TOOL_RESULT_EVENT.event_type,
            TOOL_ERROR_EVENT.event_type,
            TOOL_UNRESOLVED_EVENT.event_type,
        ):
            return self._tool_outcome(kind, content, metadata)
        if kind == LLM_ERROR_EVENT.event_type:
            error_type = _str(_get(metadata, "error_type")) or "error"
            return {"text": f"✗ {error_type}: {_short(content)}", "status": "error"}
        if kind == RUN_END_EVENT.event_type:
            messages = _get(content, "messages")
            count = f"{len(messages)} messages" if isinstance(messages, list) else ""
            status = _str(_get(metadata, "status")) or "success"
            mark = "✓ " if status == "success" else ""
            return {"text": _joined(f"{mark}{status}", count), "status": status}
        if kind == RUN_ERROR_EVENT.event_type:
            error_type = _str(_get(metadata, "error_type")) or "error"
            status = "cancelled" if error_type in CANCELLED_ERROR_TYPES else "error"
            return {"text": f"✗ {status}: {error_type}: {_short(content)}", "status": status}
        if kind == RUN_INTERRUPT_EVENT.event_type:
            return self._interrupt(seq, content)
        if kind == RUN_RESUME_EVENT.event_type:
            checkpoint = _str(_get(content, "checkpoint_id"))
            paused = self.interrupts.get(checkpoint) if checkpoint else None
            # The link names the pause; without it, the checkpoint is all there is to go on.
            text = f"resumed from checkpoint {checkpoint}" if checkpoint else "resumed"
            return {"text": "resumed" if paused else text, "status": "resumed", "answers": paused}
        if kind.startswith("subagent."):
            return self._subagent(kind, seq, content)
        if kind.startswith(MIDDLEWARE_EVENT_PATTERN.prefix):
            return {"text": self._middleware(content)}
        if kind == MEMORY_CONTEXT_EVENT.event_type:
            digest = _str(_get(content, "content_sha256"))
            return {"text": f"memory context sha256 {digest[:12]}" if digest else "memory context"}
        if kind == WORKSPACE_CHANGES_EVENT.event_type:
            return {"text": self._workspace(content, metadata)}
        if isinstance(content, Mapping) and "content" in content:
            return {"text": _quoted(content["content"])}
        return {"text": _short(content) if content is not None else ""}

    def _ai_response(
        self, seq: int, content: Any, metadata: Any, created_at: Any
    ) -> dict[str, Any]:
        tool_calls = _get(content, "tool_calls")
        for call in tool_calls if isinstance(tool_calls, list) else ():
            call_id = _str(_get(call, "id"))
            if call_id:
                self.calls[call_id] = (seq, _str(_get(call, "name")))
        calls = _calls(tool_calls)
        invalid = _get(content, "invalid_tool_calls")
        text = _message_text(_get(content, "content"))
        said = _joined(
            f"calls {calls}" if calls else "",
            f"{len(invalid)} invalid tool calls" if isinstance(invalid, list) and invalid else "",
            _quote(_short(text)) if text or not calls else "",
        )
        usage = _get(metadata, "usage") or _get(content, "usage_metadata")
        tokens = _tokens(usage)
        cost = _call_cost(content, usage, created_at) if tokens else None
        if cost is not None:
            tokens = f"[{_usd(cost)} · {tokens[1:]}"  # first: a narrow terminal cuts the end
        return {"text": f"{tokens} {said}" if tokens else said, "cost_usd": cost}

    def _tool_outcome(self, kind: str, content: Any, metadata: Any) -> dict[str, Any]:
        call_id = _str(_get(content, "tool_call_id")) or _str(_get(metadata, "tool_call_id"))
        asked_seq, asked_name = self.calls.get(call_id, (None, None)) if call_id else (None, None)
        name = asked_name or _str(_get(content, "name")) or "tool"
        if kind == TOOL_UNRESOLVED_EVENT.event_type:
            reason = _str(_get(content, "reason"))
            text, status = f"{name} ⊘ unresolved" + (f" ({reason})" if reason else ""), "unresolved"
        elif kind == TOOL_ERROR_EVENT.event_type:
            error_type = _str(_get(content, "error_type")) or "error"
            text = f"{name} ✗ {error_type}: {_short(_get(content, 'error') or '')}"
            status = "error"
        else:
            failed = _get(content, "status") == "error"
            mark, status = ("✗", "error") if failed else ("✓", "ok")
            text = f"{name} {mark} {_short(_message_text(_get(content, 'content')))}"
        return {"text": text, "status": status, "answers": asked_seq, "tool_call_id": call_id}

    def _interrupt(self, seq: int, content: Any) -> dict[str, Any]:
        checkpoint = _str(_get(content, "checkpoint_id"))
        if checkpoint:
            self.interrupts[checkpoint] = seq
        interrupts = _get(content, "interrupts")
        asks = "; ".join(
            _short(repr(_get(item, "value")), 120)
            for item in (interrupts if isinstance(interrupts, list) else ())
        )
        return {"text": "interrupted" + (f", asks {asks}" if asks else ""), "status": "interrupted"}

    def _subagent(self, kind: str, seq: int, content: Any) -> dict[str, Any]:
        task_id = _str(_get(content, "task_id")) or "?"
        if kind == SUBAGENT_START_EVENT.event_type:
            self.tasks[task_id] = seq
            description = _get(content, "description")
            return {"text": f"task {task_id}" + (f": {_short(description)}" if description else "")}
        if kind == SUBAGENT_END_EVENT.event_type:
            status = _str(_get(content, "status")) or "ended"
            mark = {"completed": "✓ ", "failed": "✗ "}.get(status, "")
            outcome = _get(content, "error") if status == "failed" else _get(content, "result")
            model = _short(_str(_get(content, "model_name")) or "", 60)
            usage = " ".join(filter(None, (model, _tokens(_get(content, "usage")))))
            return {
                "text": _joined(
                    f"task {task_id} {mark}{status}", usage, _short(outcome) if outcome else ""
                ),
                "status": status,
                "answers": self.tasks.pop(task_id, None),
            }
        if kind != SUBAGENT_STEP_EVENT.event_type:
            return {"text": _quoted(content)}
        prefix = f"[{task_id}] " if self.name_tasks else ""
        asked = self.step_calls.setdefault(task_id, [])
        if _get(content, "kind") == "tool":
            name = _str(_get(content, "tool_name"))
            # Step calls carry no ids: a tool step answers its task's oldest open call by name.
            index = next((i for i, (_, n) in enumerate(asked) if n == name or name is None), None)
            answers = asked.pop(index)[0] if index is not None else None
            text = f"{prefix}{name or 'tool'} ✓ {_short(_get(content, 'text') or '')}"
            return {"text": text, "depth": 1, "status": "ok", "answers": answers}
        tool_calls = _get(content, "tool_calls")
        asked.extend(
            (seq, _str(_get(call, "name")))
            for call in (tool_calls if isinstance(tool_calls, list) else ())
        )
        calls, text = _calls(tool_calls), _get(content, "text")
        said = _quote(_short(text)) if text or not calls else ""
        return {"text": prefix + _joined(f"calls {calls}" if calls else "", said), "depth": 1}

    @staticmethod
    def _middleware(content: Any) -> str:
        name, hook = _str(_get(content, "name")) or "middleware", _str(_get(content, "hook"))
        action = _str(_get(content, "action"))
        changes = _get(content, "changes")
        keys = changes if isinstance(changes, Mapping) else ()
        changed = ", ".join(_short(key, 40) for key in keys)
        return _joined(
            f"{_short(name, 60)}" + (f" {_short(hook, 40)}" if hook else ""),
            _short(action, 80) if action else "",
            f"changed {changed}" if changed else "",
        )

    @staticmethod
    def _workspace(content: Any, metadata: Any) -> str:
        payload = _get(metadata, "workspace_changes")
        summary, files = _get(payload, "summary"), _get(payload, "files")
        if not isinstance(summary, Mapping):
            return _short(content) if content else "workspace changed"
        counts = {
            status: _int(summary.get(status))
            for status in ("created", "modified", "deleted", "symlink_created")
        }
        changed = sum(counts.values())
        parts = ", ".join(f"{n} {s.replace('_', ' ')}" for s, n in counts.items() if n)
        lines = f"+{_int(summary.get('additions'))} -{_int(summary.get('deletions'))}"
        paths = ", ".join(
            _short(path, 120)
            for path in (_get(item, "path") for item in (files if isinstance(files, list) else ()))
            if isinstance(path, str)
        )
        head = f"{changed} file{'' if changed == 1 else 's'} changed" + (
            f" ({parts})" if parts else ""
        )
        return _joined(
            f"{head} {lines}", paths, "more not listed" if summary.get("truncated") else ""
        )


def timeline_rows(events: Iterable[Mapping[str, Any]]) -> list[TimelineRow]:
    """Describe stored events (one run's or a thread's) as one ``TimelineRow`` each, by ``seq``."""
    ordered = sorted(events, key=lambda event: _int(event.get("seq")))
    describer = _Describer(ordered)
    return [
        describer.row(event, offset)
        for event, offset in zip(ordered, _offsets(ordered), strict=True)
    ]


# -- laying out -------------------------------------------------------------------------


def _char_width(ch: str) -> int:
    if unicodedata.combining(ch):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def _width(text: str) -> int:
    return sum(_char_width(ch) for ch in text)


Segment = tuple[str, str]  # (text, ANSI style or "")


def _fit(segments: list[Segment], width: int) -> list[Segment]:
    """Cut a line of styled segments to ``width`` columns, ending a cut line with ``…``."""
    if sum(_width(text) for text, _ in segments) <= width:
        return segments
    budget, kept = width - 1, []
    for text, style in segments:
        taken = []
        for ch in text:
            need = _char_width(ch)
            if need > budget:
                kept.append(("".join(taken).rstrip() + "…", style))
                return kept
            budget -= need
            taken.append(ch)
        kept.append(("".join(taken), style))
    return kept  # not reached: the segments were wider than the width


def _line(segments: list[Segment], width: int, color: bool) -> str:
    fitted = _fit(segments, width)
    while fitted and not fitted[-1][0].strip():  # no trailing blanks, styled or not
        fitted.pop()
    if fitted:
        fitted[-1] = (fitted[-1][0].rstrip(), fitted[-1][1])
    if not color:
        return "".join(text for text, _ in fitted)
    return "".join(f"{style}{text}{_RESET}" if style and text else text for text, style in fitted)


def _offset_text(offset: float | None) -> str:
    return "" if offset is None else f"{offset:+.3f}s"


def _check_width(width: int) -> None:
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ValueError(f"width must be a positive int, got {width!r}")


def render_timeline(
    events: Iterable[Mapping[str, Any]],
    summary: RunSummary | None = None,
    *,
    width: int = 80,
    color: bool = False,
) -> str:
    """Lay events out as a header and one line per event, each at most ``width`` columns.

    Columns: ``seq``, the offset from the run's first event, the event type, the caller and
    what happened; tool outcomes, closed tasks and resumes point (``↳ #seq``) at the event
    they answer, subagent steps are indented under their task. With ``summary``, its
    ``render_summary`` follows after a blank line. ``color`` adds ANSI colours.
    """
    _check_width(width)
    rows = timeline_rows(events)
    # A middleware event's caller repeats its type: the column stays blank for it.
    callers = ["" if row.caller == row.kind else row.caller for row in rows]
    seq_width = max([3, *(len(str(row.seq)) for row in rows)])
    time_width = max([4, *(len(_offset_text(row.offset)) for row in rows)])
    # Rare long names (a middleware tag, a subagent caller) overflow their column rather than
    # widen it for every line.
    kind_width = min(max([5, *(_width(row.kind) for row in rows)]), 17)
    caller_width = min(max([0, *(_width(caller) for caller in callers)]), 16)
    if caller_width:
        caller_width = max(caller_width, 6)
    widths = [seq_width, time_width, kind_width, caller_width]
    header = _cells(
        [
            "seq".rjust(seq_width),
            "time".rjust(time_width),
            "event",
            "caller" if caller_width else "",
        ],
        widths,
    )
    lines = [_line([("".join(header) + "details", _BOLD)], width, color)]
    for row, caller in zip(rows, callers, strict=True):
        tone = _STATUS_COLORS.get(row.status or "", "")
        link = ""
        if row.answers is not None:
            link = f"↳ #{row.answers} "
        elif row.tool_call_id:
            link = f"↳ {_short(row.tool_call_id, 40)} "
        seq, offset, kind, who = _cells(
            [
                str(row.seq).rjust(seq_width),
                _offset_text(row.offset).rjust(time_width),
                row.kind,
                caller,
            ],
            widths,
        )
        segments = [
            (seq + offset, _DIM),
            (kind, tone),
            (who, ""),
            ("  " * row.depth + link + row.text, _RED if tone == _RED else ""),
        ]
        lines.append(_line(segments, width, color))
    text = "\n".join(lines)
    if summary is not None:
        text += "\n\n" + render_summary(summary, width=width, color=color)
    return text


def _cells(values: list[str], widths: list[int]) -> list[str]:
    """Values padded into columns two spaces apart; one wider than its column pushes the next
    along only as far as that one's padding cannot absorb. An empty zero-width column vanishes."""
    cells, used, end = [], 0, 0
    for value, column in zip(values, widths, strict=True):
        if not column and not value:
            cells.append("")
            continue
        end += column + 2
        used += _width(value)
        pad = max(end - used, 2 if value else 0)
        cells.append(value + " " * pad)
        used += pad
    return cells


def format_duration(ms: int | None) -> str:
    """A run's duration in a table cell: ``-`` when unknown."""
    if ms is None:
        return "-"
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    return f"{ms // 60_000} min {ms % 60_000 // 1000} s"


def _model_usage(counts: Mapping[str, int]) -> str:
    details = [
        f"{label} {counts[key]}"
        for key, label in (
            ("cache_read_tokens", "cache read"),
            ("cache_creation_tokens", "cache write"),
            ("reasoning_tokens", "reasoning"),
        )
        if counts.get(key)
    ]
    extra = f"; {', '.join(details)}" if details else ""
    return (
        f"{counts.get('total_tokens', 0)} total "
        f"({counts.get('input_tokens', 0)} in, {counts.get('output_tokens', 0)} out{extra})"
    )


def _usd(amount: float) -> str:
    """Dollars to the millionth (model calls cost fractions of a cent), trailing zeros cut."""
    text = f"{amount:.6f}".rstrip("0")
    return f"${text}{'0' * max(0, 2 - len(text.partition('.')[2]))}"


def _model_cost(cost: float | None) -> str:
    return "" if cost is None else f" · {_usd(cost)}"


def render_summary(summary: RunSummary, *, width: int = 80, color: bool = False) -> str:
    """Lay a ``RunSummary`` out as lines: status, duration, tokens, cost, messages, drops."""
    _check_width(width)
    tone = _STATUS_COLORS.get(summary.status, "")
    calls = summary.llm_call_count
    rows: list[list[Segment]] = [
        [
            ("status ", ""),
            (summary.status, tone),
            (
                ""
                if summary.duration_ms is None
                else f" in {format_duration(summary.duration_ms)}",
                "",
            ),
        ],
        [
            (
                f"tokens: {summary.total_tokens} total ({summary.total_input_tokens} in, "
                f"{summary.total_output_tokens} out) over {calls} model "
                f"call{'' if calls == 1 else 's'}",
                "",
            )
        ],
    ]
    costs = summary.estimated_cost_by_model
    rows += [
        [(f"  {_one_line(model)}: {_model_usage(counts)}{_model_cost(costs.get(model))}", "")]
        for model, counts in summary.token_usage_by_model.items()
    ]
    if summary.estimated_cost_usd is not None:
        rows.append([(f"cost: {_usd(summary.estimated_cost_usd)} (estimated)", "")])
    elif summary.token_usage_by_model:
        # Models priced as unknown; none at all: written without genai-prices, or before it.
        unpriced = [_one_line(model) for model, cost in costs.items() if cost is None]
        why = f"no price for {', '.join(unpriced)}" if unpriced else "not estimated"
        rows.append([(f"cost: unknown ({why})", "")])
    if summary.subagent_tokens or summary.middleware_tokens:
        rows.append(
            [
                (
                    f"  by caller: lead agent {summary.lead_agent_tokens}, subagents "
                    f"{summary.subagent_tokens}, middleware {summary.middleware_tokens}",
                    "",
                )
            ]
        )
    if summary.error:
        error = ": ".join(
            _short(summary.error[key]) for key in ("type", "message") if key in summary.error
        )
        rows.append([("error: ", _RED), (error, _RED)])
    if summary.first_human_message is not None:
        rows.append([(f"first human message: {_quoted(summary.first_human_message)}", "")])
    if summary.last_ai_message is not None:
        rows.append([(f"last AI message:     {_quoted(summary.last_ai_message)}", "")])
    if summary.dropped_events:
        rows.append([(f"dropped events: {summary.dropped_events}", _RED)])
    return "\n".join(_line(segments, width, color) for segments in rows)
