"""A journaled run exported as OpenTelemetry spans (GenAI semantic conventions): to the SDK's
in-memory exporter, and over OTLP/HTTP to a receiver in the test that decodes the protobuf."""

from __future__ import annotations

import asyncio
import http.server
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import datetime
from typing import Any
from uuid import UUID

import pytest
from langchain_core.callbacks import dispatch_custom_event
from langchain_core.tools import tool
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from deerflow_journal import RunJournal, open_store
from deerflow_journal.cli import main
from deerflow_journal.otel import SpanExportingStore, export_run, run_spans
from tests.journal.agents import QUESTION, add, agent_graph, ai, explode, run_events, scripted


@tool
def delegate(description: str) -> str:
    """Hand the work to a subagent, which reports its steps as task_* custom events."""
    dispatch_custom_event("task_started", {"task_id": "t1", "description": description})
    step = {"type": "ai", "content": "looking", "tool_calls": [], "id": "s0"}
    dispatch_custom_event("task_running", {"task_id": "t1", "message_index": 0, "message": step})
    usage = {"input_tokens": 30, "output_tokens": 12, "total_tokens": 42}
    dispatch_custom_event(
        "task_completed",
        {"task_id": "t1", "result": "2 files", "usage": usage, "model_name": "gpt-4o-mini"},
    )
    return "found 2 files"


async def journaled_run(store: Any) -> list[Any]:
    """A run whose model asks for three tools (one succeeds, one raises, one runs a
    subagent) and then answers; its stored events."""
    model = scripted(
        ai(
            "",
            calls=[
                ("add", {"a": 1, "b": 2}, "c1"),
                ("explode", {"reason": "disk full"}, "c2"),
                ("delegate", {"description": "find files"}, "d1"),
            ],
            tokens=(120, 18),
            model="gpt-4o",
        ),
        ai("Done.", tokens=(160, 14), model="gpt-4o"),
    )
    journal = RunJournal(event_store=store)
    graph = agent_graph(model, [add, explode, delegate])
    await graph.ainvoke(QUESTION, {"callbacks": [journal], "configurable": {"thread_id": "t"}})
    return await run_events(journal, flush=True)


def nanos(created_at: str) -> int:
    return round(datetime.fromisoformat(created_at).timestamp() * 1e6) * 1000


def span_tree(spans: list[Any]) -> tuple[Any, dict[str, list[Any]]]:
    """The root span and its children by name; asserts every span is one level below it."""
    (root,) = [s for s in spans if s.parent is None]
    children: dict[str, list[Any]] = {}
    for span in spans:
        if span is not root:
            assert span.parent.span_id == root.context.span_id, span.name
            children.setdefault(span.name, []).append(span)
    assert {s.context.trace_id for s in spans} == {root.context.trace_id}
    return root, children


async def test_a_run_becomes_a_tree_of_genai_spans(store):
    events = await journaled_run(store)
    exporter = InMemorySpanExporter()
    count = await export_run(store, "t", events[0]["run_id"], exporter)
    spans = list(exporter.get_finished_spans())
    assert count == len(spans) == 7
    root, children = span_tree(spans)
    assert root.name == "invoke_agent LangGraph"
    assert root.context.trace_id == UUID(events[0]["run_id"]).int  # one trace per run
    assert root.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert root.attributes["gen_ai.conversation.id"] == "t"
    assert root.attributes["deerflow.run.status"] == "success"
    assert root.status.status_code is StatusCode.UNSET
    assert (root.start_time, root.end_time) == (
        nanos(events[0]["created_at"]),
        nanos(events[-1]["created_at"]),
    )
    assert "llm.human.input" in [e.name for e in root.events]
    assert sorted(children) == [
        "chat gpt-4o",
        "execute_tool add",
        "execute_tool delegate",
        "execute_tool explode",
        "invoke_agent subagent",
    ]

    chats = children["chat gpt-4o"]
    responses = [e for e in events if e["event_type"] == "llm.ai.response"]
    assert [
        (s.attributes["gen_ai.request.model"], s.attributes["gen_ai.usage.input_tokens"])
        for s in chats
    ] == [("gpt-4o", 120), ("gpt-4o", 160)]
    assert [s.attributes["gen_ai.usage.output_tokens"] for s in chats] == [18, 14]
    assert [s.end_time for s in chats] == [nanos(e["created_at"]) for e in responses]
    assert all(s.attributes["gen_ai.operation.name"] == "chat" for s in chats)

    (added,), (exploded,) = children["execute_tool add"], children["execute_tool explode"]
    assert added.status.status_code is StatusCode.UNSET
    assert added.attributes["deerflow.tool.outcome"] == "success"
    assert added.attributes["gen_ai.tool.call.id"] == "c1"
    assert exploded.status.status_code is StatusCode.ERROR
    assert exploded.attributes["error.type"] == "RuntimeError"
    assert "disk full" in exploded.status.description
    assert exploded.attributes["deerflow.tool.outcome"] == "error"

    ((task,),) = [children["invoke_agent subagent"]]
    assert task.attributes["deerflow.task_id"] == "t1"
    assert task.attributes["gen_ai.agent.description"] == "find files"
    assert task.attributes["gen_ai.usage.input_tokens"] == 30
    assert [e.name for e in task.events] == ["subagent.step"]
    for span in spans:
        assert root.start_time <= span.start_time <= span.end_time <= root.end_time


async def test_a_failed_run_has_an_error_root_span(tmp_path):
    async with open_store("memory://") as store:
        journal = RunJournal(event_store=store)
        model = scripted(ai("", calls=[("explode", {"reason": "disk full"}, "c1")]))
        with pytest.raises(RuntimeError):
            await agent_graph(model, [explode], handle_tool_errors=False).ainvoke(
                QUESTION, {"callbacks": [journal]}
            )
        events = await run_events(journal, flush=True)
    root, children = span_tree(run_spans(events))
    assert root.status.status_code is StatusCode.ERROR
    assert root.attributes["error.type"] == "RuntimeError"
    assert root.attributes["deerflow.run.status"] == "error"
    assert children["chat fake-model"][0].attributes["gen_ai.request.model"] == "fake-model"


def test_a_run_a_tool_ended_with_sys_exit_is_cancelled_not_an_error_span():
    @tool
    def leave(code: int) -> str:
        """Exit the program."""
        sys.exit(code)

    journal = RunJournal(event_store="memory://")
    model = scripted(ai("", calls=[("leave", {"code": 3}, "c1")]))
    with pytest.raises(SystemExit):
        agent_graph(model, [leave], handle_tool_errors=False).invoke(
            QUESTION, {"callbacks": [journal]}
        )
    root, _ = span_tree(run_spans(asyncio.run(run_events(journal))))
    assert root.status.status_code is not StatusCode.ERROR
    assert root.attributes["deerflow.run.status"] == "cancelled"


async def test_live_mode_exports_each_run_once_as_it_ends(store):
    exporter = InMemorySpanExporter()
    journal = RunJournal(event_store=SpanExportingStore(store, exporter))
    for thread_id in ("a", "b"):
        model = scripted(ai("", calls=[("add", {"a": 1, "b": 2}, "c1")]), ai("3"))
        config = {"callbacks": [journal], "configurable": {"thread_id": thread_id}}
        await agent_graph(model, [add]).ainvoke(QUESTION, config)
        await journal.flush()
        assert {
            s.attributes.get("gen_ai.conversation.id") for s in exporter.get_finished_spans()
        } >= {thread_id}
    # Usage reported after the end writes the summary again: the run is not exported twice.
    late = {"source_run_id": "late", "input_tokens": 5, "output_tokens": 1}
    assert journal.record_external_llm_usage_records([late]) == 1
    await journal.flush()
    spans = exporter.get_finished_spans()
    roots = [s for s in spans if s.parent is None]
    assert sorted(r.attributes["gen_ai.conversation.id"] for r in roots) == ["a", "b"]
    assert len(spans) == 2 * 4  # root, two chats, one tool each
    assert (await store.get_run_summary("b", journal.run_id)).total_tokens == 36


def test_spans_need_one_runs_events():
    with pytest.raises(ValueError, match="no events"):
        run_spans([])


# -- OTLP/HTTP -----------------------------------------------------------------------------


class _Receiver(http.server.BaseHTTPRequestHandler):
    """Keeps each POSTed body; answers as an OTLP/HTTP collector does."""

    bodies: list[tuple[str, bytes]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.bodies.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[tuple[str, bytes]]]]:
    """An OTLP/HTTP receiver on 127.0.0.1: its base URL and the bodies it got."""
    bodies: list[tuple[str, bytes]] = []
    handler = type("Receiver", (_Receiver,), {"bodies": bodies})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", bodies
    finally:
        server.shutdown()
        server.server_close()


def decoded(body: bytes) -> list[tuple[str, bytes, bytes, int, dict[str, Any]]]:
    """(name, span id, parent span id, status code, attributes) of each span in a request."""
    request = ExportTraceServiceRequest.FromString(body)
    found = []
    for resource_spans in request.resource_spans:
        service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
        assert service["service.name"] == "deerflow-journal"
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                attributes = {
                    a.key: getattr(a.value, a.value.WhichOneof("value")) for a in span.attributes
                }
                found.append(
                    (span.name, span.span_id, span.parent_span_id, span.status.code, attributes)
                )
    return found


async def test_the_cli_sends_the_same_spans_over_otlp_http(tmp_path, receiver, capsys):
    url = f"sqlite:///{tmp_path / 'journal.db'}"
    async with open_store(url) as store:
        events = await journaled_run(store)
    run_id = events[0]["run_id"]
    base, bodies = receiver
    assert main(["--url", url, "export", "t", run_id, "--format", "otlp", "--endpoint", base]) == 0
    assert capsys.readouterr().out == f"exported 7 spans of 1 run to {base}/v1/traces\n"
    ((path, body),) = bodies
    assert path == "/v1/traces"
    sent = decoded(body)
    expected = run_spans(events)
    assert sorted((name, span_id) for name, span_id, *_ in sent) == sorted(
        (s.name, s.context.span_id.to_bytes(8, "big")) for s in expected
    )
    by_name = {name: (parent, code, attributes) for name, _, parent, code, attributes in sent}
    root_id = next(s.context.span_id for s in expected if s.parent is None).to_bytes(8, "big")
    assert by_name["invoke_agent LangGraph"][0] == b""
    assert all(
        parent == root_id for name, (parent, *_) in by_name.items() if "LangGraph" not in name
    )
    assert by_name["execute_tool explode"][1] == StatusCode.ERROR.value
    assert by_name["chat gpt-4o"][2]["gen_ai.request.model"] == "gpt-4o"
    assert by_name["invoke_agent subagent"][2]["deerflow.task_id"] == "t1"


def test_the_cli_says_how_to_fix_a_bad_endpoint(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'journal.db'}"
    assert main(["--url", url, "export", "t", "--format", "otlp", "--endpoint", "localhost"]) == 1
    assert "--endpoint must be an http(s) URL" in capsys.readouterr().err
    assert main(["--url", url, "export", "t", "--endpoint", "http://127.0.0.1:1"]) == 1
    assert "go with --format otlp" in capsys.readouterr().err


def test_without_the_otel_extra_the_import_names_it():
    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "try:\n"
        "    import deerflow_journal.otel\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert "pip install 'deerflow-journal[otel]'" in done.stdout


async def test_export_run_refuses_a_missing_run_id(store):
    await store.put(thread_id="t1", run_id="r1", event_type="run.start", category="trace")
    exporter = InMemorySpanExporter()
    with pytest.raises(TypeError, match="run_id"):
        await export_run(store, "t1", None, exporter)  # type: ignore[arg-type]
    assert exporter.get_finished_spans() == ()
