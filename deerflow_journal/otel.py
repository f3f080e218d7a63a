"""A stored run as OpenTelemetry spans, following the GenAI semantic conventions (extra ``[otel]``).

Each run is one trace (its id derived from the run id, so exporting a run again lands in the
same trace): a root ``invoke_agent {chain}`` span from ``run.start`` to the run's terminal
event; a ``chat {model}`` span for each model response (``gen_ai.request.model``,
``gen_ai.usage.input_tokens``/``output_tokens``, from the call's latency to its response); an
``execute_tool {name}`` span for each tool outcome (from the call's request, or its latency, to
its outcome; error status for ``tool.error`` and error results); an ``invoke_agent subagent``
span per subagent task (``subagent.start`` to ``subagent.end``, its steps as span events).
Every other event (human input, middleware, memory context, workspace changes, resumes) is a
span event on the root span. Span times are the events' ``created_at``.

``run_spans`` builds the SDK's ``ReadableSpan``s, which any SDK exporter takes;
``export_run`` reads a run from a store and hands its spans to an exporter;
``SpanExportingStore`` exports each run as it ends. See
https://opentelemetry.io/docs/specs/semconv/gen-ai/ for the conventions.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from importlib.metadata import PackageNotFoundError, version
from typing import Any
from uuid import UUID

from deerflow_journal.catalog import CANCELLED_ERROR_TYPES
from deerflow_journal.cost import model_cost
from deerflow_journal.journal.usage import token_counts
from deerflow_journal.offload import to_thread
from deerflow_journal.records import RunEvent, check_text
from deerflow_journal.stores.base import RunEventStore
from deerflow_journal.summary import RunSummary

try:
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.id_generator import IdGenerator
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON
    from opentelemetry.trace import Span, SpanKind, Status, StatusCode
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "exporting runs to OpenTelemetry needs the otel extra: pip install 'deerflow-journal[otel]'"
    ) from exc

__all__ = ["DEFAULT_SERVICE_NAME", "SpanExportingStore", "export_run", "run_spans"]

logger = logging.getLogger(__name__)

#: ``service.name`` of the exported spans unless the caller names another.
DEFAULT_SERVICE_NAME = "deerflow-journal"

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_PAGE = 1000
_TOOL_OUTCOMES = {"llm.tool.result", "tool.error", "tool.unresolved"}
_TERMINAL = {"run.end", "run.error", "run.interrupt"}
_FAILED_TASKS = {"failed", "timed_out"}


def _package_version() -> str:
    try:
        return version("deerflow-journal")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree
        return "0"


def _nanos(created_at: Any) -> int | None:
    """An event's ``created_at`` (ISO text or datetime) in nanoseconds since the epoch."""
    try:
        when = (
            created_at if isinstance(created_at, datetime) else datetime.fromisoformat(created_at)
        )
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return (when - _EPOCH) // timedelta(microseconds=1) * 1000


def _get(value: Any, key: str) -> Any:
    return value.get(key) if isinstance(value, Mapping) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


class _RunIds(IdGenerator):
    """Trace id from the run id; span ids numbered from it: a run exports the same ids."""

    def __init__(self, run_id: str) -> None:
        try:
            self._trace_id = UUID(run_id).int or 1
        except ValueError:
            self._trace_id = int.from_bytes(self._digest(run_id)[:16], "big") or 1
        self._run_id = run_id
        self._spans = 0

    @staticmethod
    def _digest(text: str) -> bytes:
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()

    def generate_trace_id(self) -> int:
        return self._trace_id

    def generate_span_id(self) -> int:
        self._spans += 1
        return int.from_bytes(self._digest(f"{self._run_id}/{self._spans}")[:8], "big") or 1


class _RunSpans:
    """Builds one run's spans, in seq order, on a tracer of its own."""

    def __init__(self, tracer: trace.Tracer, events: Sequence[RunEvent]) -> None:
        self.tracer = tracer
        first = events[0]
        self.start = self.last = _nanos(first["created_at"]) or 0
        start = next((e for e in events if e["event_type"] == "run.start"), None)
        chain = _text(_get(start and start["content"], "chain")) or "run"
        self.root = tracer.start_span(
            f"invoke_agent {chain}",
            kind=SpanKind.INTERNAL,
            start_time=self.start,
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": chain,
                "gen_ai.conversation.id": first["thread_id"],
                "deerflow.thread_id": first["thread_id"],
                "deerflow.run_id": first["run_id"],
            },
        )
        self.context = trace.set_span_in_context(self.root)
        self.calls: dict[str, tuple[str | None, int]] = {}  # tool_call_id -> (name, asked at)
        self.tasks: dict[str, Span] = {}
        self.end = self.start

    def span(self, name: str, start: int, attributes: dict[str, Any]) -> Span:
        """A child of the root span, started at ``start`` (not before the root)."""
        return self.tracer.start_span(
            name,
            context=self.context,
            kind=SpanKind.CLIENT if name.startswith("chat") else SpanKind.INTERNAL,
            start_time=max(start, self.start),
            attributes={k: v for k, v in attributes.items() if v is not None},
        )

    def add(self, event: RunEvent) -> None:
        at = _nanos(event["created_at"]) or self.last
        kind = event["event_type"]
        content, metadata = event["content"], event["metadata"]
        if kind == "llm.ai.response":
            self.chat(event, at)
        elif kind == "llm.error":
            span = self.span(
                "chat",
                self.last,
                {"gen_ai.operation.name": "chat", "error.type": _get(metadata, "error_type")},
            )
            span.set_status(Status(StatusCode.ERROR, str(content)))
            span.end(at)
        elif kind in _TOOL_OUTCOMES:
            self.tool(event, at)
        elif kind.startswith("subagent."):
            self.subagent(kind, content, at)
        elif kind in _TERMINAL:
            self.terminal(kind, content, metadata)
        elif kind != "run.start":
            attributes = {"deerflow.seq": event["seq"], "deerflow.caller": _get(metadata, "caller")}
            self.root.add_event(
                kind, {k: v for k, v in attributes.items() if v is not None}, timestamp=at
            )
        self.last = self.end = max(self.end, at)

    def chat(self, event: RunEvent, at: int) -> None:
        content, metadata = event["content"], event["metadata"]
        response = _get(content, "response_metadata")
        model = _text(_get(response, "model_name")) or _text(_get(response, "model"))
        usage = _get(metadata, "usage") or _get(content, "usage_metadata") or {}
        counts = token_counts(usage if isinstance(usage, Mapping) else None)
        latency = _get(metadata, "latency_ms")
        start = at - latency * 1_000_000 if isinstance(latency, int) else self.last
        cost = model_cost(model, counts, datetime.fromtimestamp(at / 1e9, UTC)) if model else None
        span = self.span(
            f"chat {model}" if model else "chat",
            start,
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": model,
                "gen_ai.response.model": model,
                "gen_ai.provider.name": _text(_get(response, "model_provider")),
                "gen_ai.response.id": _text(_get(content, "id")),
                "gen_ai.usage.input_tokens": counts["input_tokens"],
                "gen_ai.usage.output_tokens": counts["output_tokens"],
                "gen_ai.usage.cache_read.input_tokens": counts.get("cache_read_tokens"),
                "gen_ai.usage.cache_creation.input_tokens": counts.get("cache_creation_tokens"),
                "deerflow.usage.reasoning_tokens": counts.get("reasoning_tokens"),
                "deerflow.cost_usd": cost,
                "deerflow.caller": _get(metadata, "caller"),
                "deerflow.seq": event["seq"],
            },
        )
        span.end(at)
        for call in _get(content, "tool_calls") or ():
            call_id = _text(_get(call, "id"))
            if call_id:
                self.calls[call_id] = (_text(_get(call, "name")), at)

    def tool(self, event: RunEvent, at: int) -> None:
        kind, content, metadata = event["event_type"], event["content"], event["metadata"]
        call_id = _text(_get(content, "tool_call_id")) or _text(_get(metadata, "tool_call_id"))
        name, asked = self.calls.pop(call_id, (None, self.last)) if call_id else (None, self.last)
        name = name or _text(_get(content, "name")) or "tool"
        latency = _get(metadata, "latency_ms")
        start = at - latency * 1_000_000 if isinstance(latency, int) else asked
        if kind == "tool.error":
            outcome, error = "error", _text(_get(content, "error_type")) or "error"
            description = f"{error}: {_get(content, 'error')}"
        elif kind == "tool.unresolved":
            outcome, error, description = "unresolved", None, None
        elif _get(content, "status") == "error":
            outcome, error = "error", "tool_error"
            description = str(_get(content, "content"))
        else:
            outcome, error, description = "success", None, None
        span = self.span(
            f"execute_tool {name}",
            start,
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": name,
                "gen_ai.tool.call.id": call_id,
                "error.type": error,
                "deerflow.tool.outcome": outcome,
                "deerflow.tool.unresolved_reason": _text(_get(content, "reason")),
                "deerflow.caller": _get(metadata, "caller"),
                "deerflow.seq": event["seq"],
            },
        )
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, description))
        span.end(at)

    def subagent(self, kind: str, content: Any, at: int) -> None:
        task_id = _text(_get(content, "task_id")) or "task"
        task = self.tasks.get(task_id)
        if task is None:
            description = _text(_get(content, "description"))
            task = self.tasks[task_id] = self.span(
                "invoke_agent subagent",
                at,
                {
                    "gen_ai.operation.name": "invoke_agent",
                    "gen_ai.agent.name": "subagent",
                    "gen_ai.agent.description": description,
                    "deerflow.task_id": task_id,
                },
            )
        if kind == "subagent.step":
            step = {
                "deerflow.step.kind": _text(_get(content, "kind")),
                "deerflow.step.text": _get(content, "text"),
                "gen_ai.tool.name": _text(_get(content, "tool_name")),
            }
            task.add_event(kind, {k: v for k, v in step.items() if v}, timestamp=at)
        elif kind == "subagent.end":
            self.end_task(task_id, content, at)

    def end_task(self, task_id: str, content: Any, at: int) -> None:
        task = self.tasks.pop(task_id)
        status = _text(_get(content, "status")) or "completed"
        model = _text(_get(content, "model_name"))
        usage = _get(content, "usage")
        task.set_attributes(
            {
                k: v
                for k, v in {
                    "deerflow.task.status": status,
                    "gen_ai.request.model": model,
                    "gen_ai.usage.input_tokens": _get(usage, "input_tokens"),
                    "gen_ai.usage.output_tokens": _get(usage, "output_tokens"),
                }.items()
                if v is not None
            }
        )
        if status in _FAILED_TASKS:
            task.set_status(Status(StatusCode.ERROR, str(_get(content, "error") or status)))
        task.end(at)

    def terminal(self, kind: str, content: Any, metadata: Any) -> None:
        status = _text(_get(metadata, "status"))
        if kind == "run.error":
            error_type = _text(_get(metadata, "error_type")) or "error"
            cancelled = error_type in CANCELLED_ERROR_TYPES
            status = "cancelled" if cancelled else "error"
            if not cancelled:
                self.root.set_attribute("error.type", error_type)
                self.root.set_status(Status(StatusCode.ERROR, f"{error_type}: {content}"))
        elif kind == "run.interrupt":
            status = "interrupted"
        self.root.set_attribute("deerflow.run.status", status or "success")

    def finish(self) -> None:
        for task_id in list(self.tasks):  # a task the run never saw end ends with it
            self.tasks.pop(task_id).end(self.end)
        self.root.end(self.end)


def run_spans(
    events: Iterable[RunEvent], *, service_name: str = DEFAULT_SERVICE_NAME
) -> list[ReadableSpan]:
    """One run's events (in seq order, as a store lists them) as finished spans.

    ``ValueError`` for no events or events of several runs.
    """
    events = list(events)
    if not events:
        raise ValueError("a run with no events has no spans")
    runs = {(e["thread_id"], e["run_id"]) for e in events}
    if len(runs) > 1:
        raise ValueError(f"events of {len(runs)} runs given; pass one run's events at a time")
    collected = InMemorySpanExporter()
    provider = TracerProvider(
        sampler=ALWAYS_ON,
        resource=Resource.create({"service.name": service_name}),
        shutdown_on_exit=False,
        id_generator=_RunIds(events[0]["run_id"]),
    )
    provider.add_span_processor(SimpleSpanProcessor(collected))
    spans = _RunSpans(provider.get_tracer("deerflow_journal", _package_version()), events)
    for event in events:
        spans.add(event)
    spans.finish()
    provider.shutdown()
    return list(collected.get_finished_spans())


async def export_run(
    store: RunEventStore,
    thread_id: str,
    run_id: str,
    exporter: SpanExporter,
    *,
    service_name: str = DEFAULT_SERVICE_NAME,
) -> int:
    """Read a run's events from ``store`` and export its spans; return how many.

    The spans are built and exported in a worker thread (an exporter may block on the
    network). ``LookupError`` if the store has no events of the run; ``RuntimeError`` if the
    exporter reports a failure.
    """
    check_text(run_id, "run_id")  # None would read the whole thread
    events: list[RunEvent] = []
    after = None
    while True:
        page = await store.list_events(thread_id, run_id, limit=_PAGE, after_seq=after)
        events += page
        if len(page) < _PAGE:
            break
        after = page[-1]["seq"]
    if not events:
        raise LookupError(f"thread {thread_id!r} has no events of run {run_id!r}")

    def send() -> int:
        spans = run_spans(events, service_name=service_name)
        if exporter.export(spans) is not SpanExportResult.SUCCESS:
            raise RuntimeError(
                f"the exporter could not export the {len(spans)} spans of {run_id!r}"
            )
        return len(spans)

    return await to_thread(send)


class SpanExportingStore:
    """A journal's store that also exports each run's spans once the run has ended (live mode).

    ``RunJournal(event_store=SpanExportingStore(store, exporter))`` writes through ``store``
    (events, then summaries); the first time a run's summary arrives with a terminal status,
    its events are read back and exported, in a worker thread. An export that fails is logged
    at ERROR and never fails the journal's write. A run is exported once, however often its
    summary is written again afterwards; reads and everything else go to ``store``.

    Args:
        store: Where the journal's events go (one of ours, set up by the caller).
        exporter: Any OpenTelemetry SDK span exporter, e.g. ``OTLPSpanExporter``.
        service_name: ``service.name`` of the spans.
    """

    #: How many ended runs are remembered so that each is exported once.
    remembered_runs: int = 1024

    def __init__(
        self,
        store: RunEventStore,
        exporter: SpanExporter,
        *,
        service_name: str = DEFAULT_SERVICE_NAME,
    ) -> None:
        self.store = store
        self.exporter = exporter
        self.service_name = service_name
        self._exported: OrderedDict[tuple[str, str], None] = OrderedDict()

    async def put_batch(self, events: list[dict[str, Any]]) -> list[RunEvent]:
        """Write events through the store (its batch id, and so exactly once, kept)."""
        return await self.store.put_batch(events)

    async def put_run_summary(self, summary: RunSummary) -> RunSummary:
        """Write the summary; export the run's spans if it just ended."""
        stored = await self.store.put_run_summary(summary)
        key = (summary.thread_id, summary.run_id)
        if summary.status == "running" or key in self._exported:
            return stored
        self._exported[key] = None
        if len(self._exported) > self.remembered_runs:
            self._exported.popitem(last=False)
        try:
            await export_run(
                self.store,
                summary.thread_id,
                summary.run_id,
                self.exporter,
                service_name=self.service_name,
            )
        except Exception:
            logger.exception("could not export the spans of run %r", summary.run_id)
        return stored

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)
