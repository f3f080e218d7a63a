"""Journals for the viewer's tests, filled by real journaled LangGraph runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from langchain_core.callbacks import adispatch_custom_event
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.types import Command

from deerflow_journal import RunEventStore, RunJournal, WorkspaceRoot, user_scope
from tests.journal.agents import QUESTION, agent_graph, ai, ask_human, scripted

#: Ids a URL path can only hold percent-encoded: "/" splits a path, "%" starts an escape.
SLASHED_THREAD, SLASHED_RUN = "team/alpha 100%", "run/1 %2F"

#: Text that would run script if a page put it into the document as HTML.
XSS_HUMAN = '<img src=x onerror="window.__pwned = 1; alert(1)">'
XSS_AI = "<script>window.__pwned = 2; alert(2)</script> done"

TASK_CHUNKS = [
    {"type": "task_started", "task_id": "t1", "description": "find files"},
    {"type": "task_started", "task_id": "t2", "description": "read files"},
    {
        "type": "task_running",
        "task_id": "t1",
        "message_index": 0,
        "message": {"type": "ai", "content": "looking", "tool_calls": [], "id": "s1"},
    },
    {
        "type": "task_running",
        "task_id": "t2",
        "message_index": 0,
        "message": {"type": "ai", "content": "reading", "tool_calls": [], "id": "s2"},
    },
    {"type": "task_completed", "task_id": "t1", "result": "found 2 files"},
    {"type": "task_completed", "task_id": "t2", "result": "read 2 files"},
]


async def tool_run(
    store: RunEventStore, thread_id: str, question: Any = QUESTION, run_id: str | None = None
) -> str:
    """A lead agent calling ``add`` once, then answering; the run's id."""
    model = scripted(ai(calls=[("add", {"a": 1, "b": 2}, "c1")]), ai("1 + 2 = 3"))
    journal = RunJournal(event_store=store, run_id=run_id)
    config = {"callbacks": [journal], "configurable": {"thread_id": thread_id}}
    await agent_graph(model).ainvoke(question, config)
    await journal.flush()
    assert journal.run_id is not None
    return journal.run_id


async def xss_run(store: RunEventStore, thread_id: str) -> str:
    """A run whose human input and answer are HTML that would run script."""
    model = scripted(ai(XSS_AI))
    journal = RunJournal(event_store=store)
    config = {"callbacks": [journal], "configurable": {"thread_id": thread_id}}
    await agent_graph(model).ainvoke({"messages": [HumanMessage(XSS_HUMAN)]}, config)
    await journal.flush()
    assert journal.run_id is not None
    return journal.run_id


async def subagent_run(store: RunEventStore, thread_id: str) -> str:
    """A run whose node streams two subagent tasks' chunks."""

    async def work(state: MessagesState) -> dict[str, Any]:
        for chunk in TASK_CHUNKS:
            data = {k: v for k, v in chunk.items() if k != "type"}
            await adispatch_custom_event(chunk["type"], data)
        return {}

    graph = StateGraph(MessagesState)
    graph.add_node("work", work)
    graph.add_edge(START, "work")
    journal = RunJournal(event_store=store)
    config = {"callbacks": [journal], "configurable": {"thread_id": thread_id}}
    await graph.compile().ainvoke(QUESTION, config)
    await journal.flush()
    assert journal.run_id is not None
    return journal.run_id


async def workspace_run(store: RunEventStore, thread_id: str, root: Path) -> str:
    """A run whose tool writes a file and changes another under a workspace root."""
    root.mkdir(parents=True)
    (root / "notes.txt").write_text("old line\nkept\n")

    @tool
    def write_report(text: str) -> str:
        """Write the report and update the notes."""
        (root / "report.md").write_text(text)
        (root / "notes.txt").write_text("new line\nkept\n")
        return "written"

    model = scripted(ai("", calls=[("write_report", {"text": "# Report\n"}, "w1")]), ai("Saved."))
    journal = RunJournal(
        event_store=store,
        workspace_roots=[WorkspaceRoot("outputs", root, "/mnt/user-data/outputs")],
    )
    config = {"callbacks": [journal], "configurable": {"thread_id": thread_id}}
    await agent_graph(model, [write_report]).ainvoke(QUESTION, config)
    await journal.flush()
    assert journal.run_id is not None
    return journal.run_id


async def interrupted_runs(store: RunEventStore, thread_id: str) -> tuple[str, str]:
    """A run paused by ``interrupt()`` and the run that resumes it."""
    model = scripted(ai("", calls=[("ask_human", {"question": "Proceed?"}, "h1")]), ai("Done."))
    graph = agent_graph(model, [ask_human], checkpointer=InMemorySaver())
    journal = RunJournal(event_store=store)
    config = {"callbacks": [journal], "configurable": {"thread_id": thread_id}}
    await graph.ainvoke(QUESTION, config)
    await journal.flush()
    paused = journal.run_id
    await graph.ainvoke(Command(resume="yes"), config)
    await journal.flush()
    assert paused is not None and journal.run_id is not None
    return paused, journal.run_id


async def hidden_messages(store: RunEventStore, thread_id: str, run_id: str) -> None:
    """Message rows a thread-history view hides: a middleware's and one marked hide_from_ui."""
    await store.put(
        thread_id=thread_id,
        run_id=run_id,
        event_type="llm.ai.response",
        category="message",
        content={"type": "ai", "content": "summary of earlier turns"},
        metadata={"caller": "middleware:summarize"},
    )
    await store.put(
        thread_id=thread_id,
        run_id=run_id,
        event_type="llm.human.input",
        category="message",
        content={"type": "human", "content": "hidden", "additional_kwargs": {"hide_from_ui": True}},
        metadata={"caller": "lead_agent"},
    )


async def fill(store: RunEventStore, tmp_path: Path) -> dict[str, Any]:
    """Every kind of run the viewer shows, in several threads and for two users; their ids."""
    ids: dict[str, Any] = {}
    ids["weather"] = [await tool_run(store, "weather") for _ in range(3)]
    await hidden_messages(store, "weather", ids["weather"][1])
    ids["tasks"] = await subagent_run(store, "tasks")
    ids["work"] = await workspace_run(store, "work", tmp_path / "outputs")
    ids["hitl"] = await interrupted_runs(store, "hitl")
    ids["xss"] = await xss_run(store, "xss")
    with user_scope("alice"):
        ids["alice"] = await tool_run(store, "alice-thread")
    with user_scope("bob"):
        ids["bob"] = await tool_run(store, "bob-thread")
    ids["slashed"] = await tool_run(store, SLASHED_THREAD, run_id=SLASHED_RUN)
    return ids
