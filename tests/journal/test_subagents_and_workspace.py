"""Subagent chunks (custom events and recorders) and workspace changes (``workspace_roots``)
through the journal; the events they become are in docs/events.md."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path
from typing import Any

import pytest
from langchain_core.callbacks import (
    adispatch_custom_event,
    dispatch_custom_event,
)
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.config import get_stream_writer
from langgraph.graph import START, MessagesState, StateGraph
from langsmith.run_helpers import tracing_context
from langsmith.run_trees import RunTree

from deerflow_journal import (
    MemoryRunEventStore,
    RunJournal,
    WorkspaceRoot,
    latest_workspace_changes,
)
from deerflow_journal.journal import workspace as tracker_module
from deerflow_journal.journal.loops import background_loop
from tests.journal.agents import QUESTION, agent_graph, ai, run_events, scripted

STEP = {"type": "ai", "content": "looking", "tool_calls": [], "id": "s0"}
TASK_CHUNKS = [
    {"type": "task_started", "task_id": "t1", "description": "find files"},
    {"type": "task_running", "task_id": "t1", "message_index": 0, "message": STEP},
    {"type": "task_running", "task_id": "t1", "message": STEP},  # malformed: no index
    {"type": "task_completed", "task_id": "t1", "result": "found 2 files"},
]
SUBAGENT_TYPES = ["subagent.start", "subagent.step", "subagent.end"]


def single_node(fn: Any) -> Any:
    graph = StateGraph(MessagesState)
    graph.add_node("work", fn)
    graph.add_edge(START, "work")
    return graph.compile()


# -- subagent chunks -----------------------------------------------------------------------


async def test_task_chunks_dispatched_as_custom_events_become_subagent_events():
    async def work(state: MessagesState) -> dict[str, Any]:
        for chunk in TASK_CHUNKS:
            await adispatch_custom_event(
                chunk["type"], {k: v for k, v in chunk.items() if k != "type"}
            )
        await adispatch_custom_event("progress", {"percent": 50})  # not a task chunk
        return {}

    journal = RunJournal(event_store=MemoryRunEventStore())
    await single_node(work).ainvoke(QUESTION, {"callbacks": [journal]})
    events = await run_events(journal, flush=True)
    assert [e["event_type"] for e in events] == ["run.start", *SUBAGENT_TYPES, "run.end"]
    assert events[1]["content"] == {"task_id": "t1", "description": "find files"}
    assert events[2]["metadata"] == {"task_id": "t1", "message_index": 0}
    assert events[3]["content"]["status"] == "completed"


def test_a_custom_event_named_anything_carries_its_type_in_the_data():
    def work(state: MessagesState) -> dict[str, Any]:
        for chunk in TASK_CHUNKS:
            dispatch_custom_event("subagent", chunk)
        return {}

    journal = RunJournal(event_store=MemoryRunEventStore())
    single_node(work).invoke(QUESTION, {"callbacks": [journal]})
    events = asyncio.run(run_events(journal, flush=True))
    assert [e["event_type"] for e in events] == ["run.start", *SUBAGENT_TYPES, "run.end"]


@tool
def delegate(description: str) -> str:
    """Hand the work to a subagent that streams task_* chunks."""
    write = get_stream_writer()
    for chunk in TASK_CHUNKS:
        write(chunk)
    return "found 2 files"


async def test_chunks_from_the_custom_stream_are_recorded_by_the_caller():
    model = scripted(ai("", calls=[("delegate", {"description": "find"}, "d1")]), ai("Done."))
    journal = RunJournal(event_store=MemoryRunEventStore())
    recorded = []
    async for chunk in agent_graph(model, [delegate]).astream(
        QUESTION, {"callbacks": [journal]}, stream_mode="custom"
    ):
        recorded.append(journal.record_subagent_chunk(chunk))
    assert recorded == [True, True, False, True]
    types = [e["event_type"] for e in await run_events(journal, flush=True)]
    # The stream reaches the caller while the graph goes on: the chunks land in the run, in
    # order, somewhere after the model asked for the tool.
    assert [t for t in types if t.startswith("subagent.")] == SUBAGENT_TYPES
    assert types.index("subagent.start") > types.index("llm.ai.response")
    assert (types[0], types[-1]) == ("run.start", "run.end")


async def test_record_subagent_chunks_counts_the_well_formed_ones():
    journal = RunJournal(event_store=MemoryRunEventStore())

    def work(state: MessagesState) -> dict[str, Any]:
        assert journal.record_subagent_chunks(TASK_CHUNKS) == 3
        return {}

    await single_node(work).ainvoke(QUESTION, {"callbacks": [journal]})
    events = await run_events(journal, flush=True)
    assert [e["event_type"] for e in events] == ["run.start", *SUBAGENT_TYPES, "run.end"]


# -- workspace -----------------------------------------------------------------------------


def workspace(tmp_path: Path) -> WorkspaceRoot:
    root = tmp_path / "outputs"
    root.mkdir()
    (root / "notes.txt").write_text("old\n")
    return WorkspaceRoot("outputs", root, "/mnt/user-data/outputs")


def writer_agent(root: Path) -> Any:
    @tool
    def write_report(text: str) -> str:
        """Write the report file."""
        (root / "report.md").write_text(text)
        return "written"

    model = scripted(ai("", calls=[("write_report", {"text": "# Report\n"}, "w1")]), ai("Saved."))
    return agent_graph(model, [write_report])


async def test_workspace_roots_record_the_runs_file_changes(tmp_path):
    root = workspace(tmp_path)
    journal = RunJournal(event_store=MemoryRunEventStore(), workspace_roots=[root])
    await writer_agent(root.host_path).ainvoke(QUESTION, {"callbacks": [journal]})
    events = await run_events(journal, flush=True)
    assert [e["event_type"] for e in events][-2:] == ["workspace_changes", "run.end"]
    assert events[-2]["content"] == "1 file changed +1 -0"
    assert journal.thread_id is not None and journal.run_id is not None
    payload = await latest_workspace_changes(journal.event_store, journal.thread_id, journal.run_id)
    assert payload is not None
    (change,) = payload["files"]
    assert (change["path"], change["status"]) == ("/mnt/user-data/outputs/report.md", "created")


def test_workspace_roots_are_checked_when_the_journal_is_made(tmp_path):
    """A bad root is refused by the constructor: found at each run's snapshot, it made every
    run log a traceback and record no workspace event."""
    root = workspace(tmp_path)
    other = WorkspaceRoot(root.name, tmp_path, "/mnt/other")
    with pytest.raises(ValueError, match="unique"):
        RunJournal(event_store=MemoryRunEventStore(), workspace_roots=[root, other])
    with pytest.raises(TypeError, match="WorkspaceRoot"):
        RunJournal(event_store=MemoryRunEventStore(), workspace_roots=[str(tmp_path)])


async def test_with_workspace_roots_run_end_stores_the_outputs_as_the_run_ended(tmp_path):
    # The run's end waits for the workspace diff: the caller has its outputs back by then.
    root = workspace(tmp_path)
    journal = RunJournal(event_store=MemoryRunEventStore(), workspace_roots=[root])
    outputs = await writer_agent(root.host_path).ainvoke(QUESTION, {"callbacks": [journal]})
    ended_with = [message.content for message in outputs["messages"]]
    outputs["messages"].append(AIMessage("added by the caller afterwards"))
    events = await run_events(journal, flush=True)
    stored = events[-1]["content"]["messages"]
    assert events[-1]["event_type"] == "run.end"
    assert [message["content"] for message in stored] == ended_with


def test_workspace_changes_under_invoke(tmp_path):
    root = workspace(tmp_path)
    journal = RunJournal(event_store=MemoryRunEventStore(), workspace_roots=[root])
    writer_agent(root.host_path).invoke(QUESTION, {"callbacks": [journal]})
    types = [e["event_type"] for e in asyncio.run(run_events(journal, flush=True))]
    assert types[-2:] == ["workspace_changes", "run.end"]


async def test_a_run_that_changes_no_file_records_no_workspace_event(tmp_path):
    root = workspace(tmp_path)
    journal = RunJournal(event_store=MemoryRunEventStore(), workspace_roots=[root])
    await agent_graph(scripted(AIMessage("nothing to write"))).ainvoke(
        QUESTION, {"callbacks": [journal]}
    )
    types = [e["event_type"] for e in await run_events(journal, flush=True)]
    assert "workspace_changes" not in types and types[-1] == "run.end"


def gated_snapshots(monkeypatch: pytest.MonkeyPatch, order: list[str]) -> threading.Event:
    """Make each workspace snapshot wait until the returned event is set (10 s at most)."""
    release = threading.Event()
    real_capture = tracker_module.capture_workspace_snapshot

    async def slow_capture(*args: Any, **kwargs: Any) -> Any:
        if not await asyncio.to_thread(release.wait, 10):
            order.append("the snapshot was never released")
        snapshot = await real_capture(*args, **kwargs)
        order.append("snapshot")
        return snapshot

    monkeypatch.setattr(tracker_module, "capture_workspace_snapshot", slow_capture)
    return release


def setup_node(root: Path, order: list[str], kind: str) -> Any:
    """A plain node (no tool) that creates a file as the run's first step."""

    def write(state: MessagesState) -> dict[str, Any]:
        order.append("node")
        (root / "setup.txt").write_text("x\n")
        return {}

    async def awrite(state: MessagesState) -> dict[str, Any]:
        return write(state)

    return single_node(awrite if kind == "async node" else write)


@pytest.mark.parametrize("traced", [False, True], ids=["", "in a langsmith trace"])
@pytest.mark.parametrize("kind", ["sync node", "async node"])
async def test_the_first_step_waits_for_the_snapshot_without_blocking_the_loop(
    tmp_path, monkeypatch, kind, traced
):
    """The snapshot is released by a task on the caller's loop: a run start that blocked the
    loop would keep it waiting until its deadline. In a LangSmith trace the graph has a
    parent (the trace's run) that the journal never saw: a root all the same."""
    root = workspace(tmp_path)
    order: list[str] = []
    release = gated_snapshots(monkeypatch, order)

    async def release_soon() -> None:
        await asyncio.sleep(0.05)
        release.set()

    journal = RunJournal(event_store=MemoryRunEventStore(), workspace_roots=[root])
    releasing = asyncio.create_task(release_soon())
    trace = RunTree(name="request", run_type="chain")
    with tracing_context(parent=trace, enabled=False) if traced else contextlib.nullcontext():
        await setup_node(root.host_path, order, kind).ainvoke(QUESTION, {"callbacks": [journal]})
    await releasing
    assert order == ["snapshot", "node"]
    await journal.flush()
    payload = await latest_workspace_changes(journal.event_store, journal.thread_id, journal.run_id)
    assert payload is not None
    assert [(f["path"], f["status"]) for f in payload["files"]] == [
        ("/mnt/user-data/outputs/setup.txt", "created")
    ]


def test_the_first_step_of_an_invoke_waits_for_the_snapshot(tmp_path, monkeypatch):
    root = workspace(tmp_path)
    order: list[str] = []
    release = gated_snapshots(monkeypatch, order)
    threading.Timer(0.05, release.set).start()
    journal = RunJournal(event_store=MemoryRunEventStore(), workspace_roots=[root])
    setup_node(root.host_path, order, "sync node").invoke(QUESTION, {"callbacks": [journal]})
    assert order == ["snapshot", "node"]
    types = [e["event_type"] for e in asyncio.run(run_events(journal, flush=True))]
    assert types[-2:] == ["workspace_changes", "run.end"]


class OwnChainStart(RunJournal):
    """A subclass that overrides ``on_chain_start`` (LangChain then calls it inline)."""

    def on_chain_start(self, serialized: Any, inputs: Any, **kwargs: Any) -> None:
        super().on_chain_start(serialized, inputs, **kwargs)


async def test_a_subclass_overriding_chain_start_still_waits_for_the_snapshot(
    tmp_path, monkeypatch
):
    root = workspace(tmp_path)
    order: list[str] = []
    release = gated_snapshots(monkeypatch, order)
    threading.Timer(0.05, release.set).start()  # the override blocks the loop meanwhile
    journal = OwnChainStart(event_store=MemoryRunEventStore(), workspace_roots=[root])
    await setup_node(root.host_path, order, "async node").ainvoke(
        QUESTION, {"callbacks": [journal]}
    )
    assert order == ["snapshot", "node"]


async def test_a_run_cancelled_while_waiting_for_its_snapshot_ends_cancelled(tmp_path, monkeypatch):
    root = workspace(tmp_path)
    order: list[str] = []
    release = gated_snapshots(monkeypatch, order)
    journal = RunJournal(event_store=MemoryRunEventStore(), workspace_roots=[root])
    graph = setup_node(root.host_path, order, "async node")
    running = asyncio.create_task(graph.ainvoke(QUESTION, {"callbacks": [journal]}))
    await asyncio.sleep(0.1)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    release.set()
    types = [e["event_type"] for e in await run_events(journal, flush=True)]
    assert types == ["run.start", "run.error"]
    assert order == ["snapshot"]  # the node never ran
    stored = await journal.event_store.get_run_summary(journal.thread_id, journal.run_id)
    assert stored is not None and stored.status == "cancelled"


def test_a_run_started_on_the_background_loop_never_waits_on_itself(tmp_path, caplog):
    """Code running on the journal's own loop (a progress reporter, say) that invokes a graph:
    the snapshot and the diff need that loop, so blocking on them would hang forever."""
    root = workspace(tmp_path)
    order: list[str] = []
    journal = RunJournal(event_store=MemoryRunEventStore(), workspace_roots=[root])
    graph = setup_node(root.host_path, order, "sync node")

    async def on_the_background_loop() -> None:
        graph.invoke(QUESTION, {"callbacks": [journal]})

    running = asyncio.run_coroutine_threadsafe(on_the_background_loop(), background_loop())
    running.result(timeout=30)  # a hang fails here instead of blocking the suite
    assert order == ["node"]
    assert "does not wait for its workspace snapshot" in caplog.text
    types = [e["event_type"] for e in asyncio.run(run_events(journal, flush=True))]
    assert types[0] == "run.start" and types[-1] == "run.end"
