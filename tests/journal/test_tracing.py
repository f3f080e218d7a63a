"""Journaling every root run of a process: the environment variable, ``enable()``/``disable()``
and ``journaling()``, through langchain-core's configure hook, with no callbacks passed."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import nbformat
import pytest

import deerflow_journal
from deerflow_journal import RunJournal, open_sync_store
from deerflow_journal.tracing import active_journal
from tests.journal.agents import ONE_TOOL_CALL_SEQUENCE, QUESTION, add, agent_graph, ai, scripted
from tests.journal.test_examples import run_notebook

ROOT = Path(__file__).resolve().parents[2]

# A LangGraph agent that knows nothing of deerflow-journal: no import, no callbacks.
UNMODIFIED_AGENT = textwrap.dedent(
    """
    import asyncio
    import sys

    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.tools import tool
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition


    @tool
    def add(a: int, b: int) -> int:
        "Add two numbers."
        return a + b


    def agent():
        usage = {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}
        model = GenericFakeChatModel(messages=iter([
            AIMessage("", tool_calls=[{"name": "add", "args": {"a": 1, "b": 2}, "id": "c1"}],
                      usage_metadata=usage),
            AIMessage("3", usage_metadata=usage),
        ]))
        graph = StateGraph(MessagesState)
        graph.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
        graph.add_node("tools", ToolNode([add]))
        graph.add_edge(START, "agent")
        graph.add_conditional_edges("agent", tools_condition)
        graph.add_edge("tools", "agent")
        return graph.compile()


    question = {"messages": [HumanMessage("What is 1 + 2?")]}
    config = {"configurable": {"thread_id": sys.argv[2]}}
    if sys.argv[1] == "sync":
        agent().invoke(question, config)
    else:
        asyncio.run(agent().ainvoke(question, config))
    """
)

# The same agent, also given a journal explicitly (on the same store the variable names).
EXPLICIT_TOO = UNMODIFIED_AGENT.replace(
    'config = {"configurable": {"thread_id": sys.argv[2]}}',
    "from deerflow_journal import RunJournal\n"
    'config = {"configurable": {"thread_id": sys.argv[2]}, "callbacks": [RunJournal()]}',
)


def run_script(tmp_path: Path, source: str, *args: str, **env: str) -> None:
    """Run ``source`` as a program in a fresh interpreter with ``env`` added."""
    script = tmp_path / "agent.py"
    script.write_text(source)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DEERFLOW_JOURNAL")}
    subprocess.run(
        [sys.executable, str(script), *args],
        cwd=tmp_path,
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


def stored_runs(url: str, thread_id: str) -> list[tuple[str, list[str]]]:
    """Each run of the thread: its status and its event types in seq order."""
    with open_sync_store(url, read_only=True) as store:
        return [
            (s.status, [e["event_type"] for e in store.list_events(thread_id, s.run_id)])
            for s in store.list_run_summaries(thread_id)
        ]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_variable_alone_journals_an_unmodified_agent(tmp_path, mode):
    url = f"sqlite:///{tmp_path / 'journal.db'}"
    run_script(
        tmp_path, UNMODIFIED_AGENT, mode, "t1", DEERFLOW_JOURNAL_TRACING="true",
        DEERFLOW_JOURNAL_URL=url,
    )  # fmt: skip
    assert stored_runs(url, "t1") == [("success", ONE_TOOL_CALL_SEQUENCE)]


@pytest.mark.slow
def test_a_store_the_variable_cannot_open_leaves_the_agent_running(tmp_path):
    """A mistyped store URL is said once at ERROR; the agent itself runs as without the
    variable (it raised at its first call)."""
    script = tmp_path / "agent.py"
    script.write_text(UNMODIFIED_AGENT + "\nagent().invoke(question, config)\nprint('ran')\n")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DEERFLOW_JOURNAL")}
    done = subprocess.run(
        [sys.executable, str(script), "sync", "t1"],
        cwd=tmp_path,
        env={**environ, "DEERFLOW_JOURNAL_TRACING": "true", "DEERFLOW_JOURNAL_URL": "bogus://x"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ran"
    assert done.stderr.count("runs are not journaled") == 1, done.stderr
    assert "bogus://x" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_without_the_variable_nothing_is_journaled(tmp_path):
    url = f"sqlite:///{tmp_path / 'journal.db'}"
    run_script(
        tmp_path, UNMODIFIED_AGENT, "sync", "t1", DEERFLOW_JOURNAL_TRACING="false",
        DEERFLOW_JOURNAL_URL=url,
    )  # fmt: skip
    assert not (tmp_path / "journal.db").exists()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_run_with_the_variable_and_an_explicit_journal_is_journaled_once(tmp_path, mode):
    url = f"sqlite:///{tmp_path / 'journal.db'}"
    run_script(
        tmp_path, EXPLICIT_TOO, mode, "t1", DEERFLOW_JOURNAL_TRACING="1", DEERFLOW_JOURNAL_URL=url
    )
    assert stored_runs(url, "t1") == [("success", ONE_TOOL_CALL_SEQUENCE)]


def one_tool_agent():
    """A fresh agent that calls ``add`` once and answers."""
    model = scripted(ai(calls=[("add", {"a": 1, "b": 2}, "c1")]), ai("3"))
    return agent_graph(model, [add])


def config(thread_id: str) -> dict:
    return {"configurable": {"thread_id": thread_id}}


@pytest.fixture
def process_journal_off():
    """Leave the process as found: journaling disabled."""
    assert active_journal() is None
    yield
    deerflow_journal.disable()
    assert active_journal() is None


def test_enable_journals_every_root_run_until_disable(tmp_path, process_journal_off):
    url = f"sqlite:///{tmp_path / 'journal.db'}"
    journal = deerflow_journal.enable(url)
    assert isinstance(journal, RunJournal) and active_journal() is journal
    one_tool_agent().invoke(QUESTION, config("sync"))
    asyncio.run(one_tool_agent().ainvoke(QUESTION, config("async")))
    worker = threading.Thread(target=one_tool_agent().invoke, args=(QUESTION, config("thread")))
    worker.start()
    worker.join()
    deerflow_journal.disable()
    assert active_journal() is None
    one_tool_agent().invoke(QUESTION, config("after"))
    asyncio.run(one_tool_agent().ainvoke(QUESTION, config("after")))
    for thread_id in ("sync", "async", "thread"):
        assert stored_runs(url, thread_id) == [("success", ONE_TOOL_CALL_SEQUENCE)]
    assert stored_runs(url, "after") == []


def test_each_root_invocation_is_one_run(tmp_path, process_journal_off):
    url = f"sqlite:///{tmp_path / 'journal.db'}"
    deerflow_journal.enable(url)
    graph = agent_graph(scripted(ai("1"), ai("2"), ai("3")), [])
    for _ in range(3):
        graph.invoke(QUESTION, config("t1"))
    model = scripted(ai("4"))
    model.invoke("What is 2 + 2?", {"metadata": {"thread_id": "t1"}})  # called directly
    deerflow_journal.disable()
    runs = stored_runs(url, "t1")
    assert [status for status, _ in runs] == ["success"] * 4
    assert [events[0] for _, events in runs] == ["run.start"] * 4
    assert [events.count("llm.ai.response") for _, events in runs] == [1] * 4


def test_an_explicit_journal_keeps_its_runs_to_itself(tmp_path, process_journal_off):
    auto_url = f"sqlite:///{tmp_path / 'auto.db'}"
    own_url = f"sqlite:///{tmp_path / 'own.db'}"
    deerflow_journal.enable(auto_url)
    with RunJournal(event_store=own_url) as own:
        one_tool_agent().invoke(QUESTION, {**config("t1"), "callbacks": [own]})
    deerflow_journal.disable()
    assert stored_runs(own_url, "t1") == [("success", ONE_TOOL_CALL_SEQUENCE)]
    assert not (tmp_path / "auto.db").exists()  # the enabled journal never wrote


async def test_journaling_covers_the_block_and_wins_over_enable(tmp_path, process_journal_off):
    inner_url = f"sqlite:///{tmp_path / 'inner.db'}"
    outer_url = f"sqlite:///{tmp_path / 'outer.db'}"
    deerflow_journal.enable(outer_url)
    with deerflow_journal.journaling(inner_url) as journal:
        assert active_journal() is journal
        await one_tool_agent().ainvoke(QUESTION, config("inside"))
        # Tasks inherit the block's context; so does a sync graph in LangChain's executor.
        await asyncio.gather(
            asyncio.create_task(one_tool_agent().ainvoke(QUESTION, config("task"))),
            asyncio.to_thread(one_tool_agent().invoke, QUESTION, config("to_thread")),
        )
    await one_tool_agent().ainvoke(QUESTION, config("outside"))
    deerflow_journal.disable()
    for thread_id in ("inside", "task", "to_thread"):
        assert stored_runs(inner_url, thread_id) == [("success", ONE_TOOL_CALL_SEQUENCE)]
        assert stored_runs(outer_url, thread_id) == []
    assert stored_runs(outer_url, "outside") == [("success", ONE_TOOL_CALL_SEQUENCE)]
    assert stored_runs(inner_url, "outside") == []


@pytest.mark.slow
def test_disable_stops_what_the_variable_started(tmp_path):
    url = f"sqlite:///{tmp_path / 'journal.db'}"
    source = UNMODIFIED_AGENT.replace(
        'if sys.argv[1] == "sync":',
        'agent().invoke(question, {"configurable": {"thread_id": "on"}})\n'
        "import deerflow_journal\n"
        "deerflow_journal.disable()\n"
        'if sys.argv[1] == "sync":',
    )
    run_script(tmp_path, source, "sync", "off", DEERFLOW_JOURNAL_TRACING="true",
               DEERFLOW_JOURNAL_URL=url)  # fmt: skip
    assert stored_runs(url, "on") == [("success", ONE_TOOL_CALL_SEQUENCE)]
    assert stored_runs(url, "off") == []


@pytest.mark.slow
def test_enable_journals_runs_in_a_notebook(tmp_path):
    agent_source = UNMODIFIED_AGENT.split("question = ", 1)[0]
    cells = [
        "import deerflow_journal\njournal = deerflow_journal.enable('sqlite:///journal.db')",
        agent_source + 'question = {"messages": [HumanMessage("What is 1 + 2?")]}',
        'agent().invoke(question, {"configurable": {"thread_id": "sync"}});',
        'await agent().ainvoke(question, {"configurable": {"thread_id": "async"}});',
        "deerflow_journal.disable()",
        'agent().invoke(question, {"configurable": {"thread_id": "after"}});',
    ]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    workdir = run_notebook(notebook, tmp_path)
    url = f"sqlite:///{workdir / 'journal.db'}"
    for thread_id in ("sync", "async"):
        assert stored_runs(url, thread_id) == [("success", ONE_TOOL_CALL_SEQUENCE)]
    assert stored_runs(url, "after") == []
