"""The timeline renderer on real journaled runs: LangGraph agents with fake chat models write
into a memory store, and the rows and text the renderer makes of what the store holds."""

from __future__ import annotations

import hashlib
import random
import re
import unicodedata
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from deerflow_journal import (
    MemoryRunEventStore,
    RunEvent,
    RunJournal,
    RunSummary,
    TimelineRow,
    WorkspaceRoot,
    render_summary,
    render_timeline,
    timeline_rows,
)
from tests.journal.agents import (
    QUESTION,
    add,
    agent_graph,
    ai,
    ask_human,
    explode,
    run_events,
    scripted,
)
from tests.test_subagent_graph import lead_graph

ANSI = re.compile(r"\x1b\[[0-9;]*m")
CALLS = [("add", {"a": 1, "b": 2}, "c1"), ("explode", {"reason": "disk full"}, "c2")]


def columns(line: str) -> int:
    """Terminal columns a line takes: wide East Asian characters count two."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in line)


def rows_of(rows: list[TimelineRow], kind: str) -> list[TimelineRow]:
    return [row for row in rows if row.kind == kind]


def line_of(text: str, seq: int) -> str:
    """The rendered line of the event ``seq`` (the first line is the column header)."""
    lines = text.splitlines()[1:]
    (line,) = [line for line in lines if ANSI.sub("", line).split()[:1] == [str(seq)]]
    return line


def details_column(text: str) -> int:
    """Where the details column starts, from the header line."""
    return text.splitlines()[0].index("details")


async def tool_run(answer: str = "It is 3; the other tool failed.") -> tuple[list[RunEvent], Any]:
    """One model call asking for two tools, one answering and one raising, then the answer."""
    model = scripted(
        ai("", calls=CALLS, tokens=(120, 18)), ai(answer, tokens=(160, 14), cache_read=96)
    )
    journal = RunJournal(event_store=MemoryRunEventStore())
    await agent_graph(model, [add, explode]).ainvoke(QUESTION, {"callbacks": [journal]})
    events = await run_events(journal, flush=True)
    assert [e["event_type"] for e in events] == [
        "run.start",
        "llm.human.input",
        "llm.ai.response",
        "llm.tool.result",
        "tool.error",
        "llm.ai.response",
        "run.end",
    ]
    return events, journal.summary()


async def interrupted_then_resumed() -> tuple[list[RunEvent], list[RunEvent]]:
    """The events of a run paused by ``interrupt()`` and of the run that resumes it."""
    model = scripted(ai("", calls=[("ask_human", {"question": "Proceed?"}, "h1")]), ai("Done."))
    graph = agent_graph(model, [ask_human], checkpointer=InMemorySaver())
    journal = RunJournal(event_store=MemoryRunEventStore())
    config: dict[str, Any] = {"callbacks": [journal], "configurable": {"thread_id": "hitl"}}
    await graph.ainvoke(QUESTION, config)
    paused = await run_events(journal, flush=True)
    await graph.ainvoke(Command(resume="yes"), config)
    return paused, await run_events(journal, flush=True)


async def subagent_run() -> list[RunEvent]:
    """A lead agent whose tool runs two subagent tasks, their chunks recorded by the caller."""
    journal = RunJournal(event_store=MemoryRunEventStore())
    async for chunk in lead_graph().astream(
        {"messages": [HumanMessage("go")]}, {"callbacks": [journal]}, stream_mode="custom"
    ):
        journal.record_subagent_chunk(chunk)
    return await run_events(journal, flush=True)


# -- one line per event ---------------------------------------------------------------------


async def test_every_event_is_one_line_in_seq_order():
    events, _ = await tool_run()
    shuffled = list(events)
    random.Random(7).shuffle(shuffled)
    rows = timeline_rows(shuffled)
    assert [(r.seq, r.kind, r.run_id) for r in rows] == [
        (e["seq"], e["event_type"], e["run_id"]) for e in events
    ]
    lines = render_timeline(shuffled).splitlines()
    assert lines[0].split() == ["seq", "time", "event", "caller", "details"]
    assert [line.split()[0] for line in lines[1:]] == [str(e["seq"]) for e in events]
    assert [line.split()[2] for line in lines[1:]] == [e["event_type"] for e in events]
    assert rows_of(rows, "llm.human.input")[0].text == "'What is 1 + 2?'"
    assert {r.caller for r in rows if r.kind.startswith("llm.")} == {"lead_agent"}


async def test_offsets_count_from_the_first_event_of_each_run():
    paused, resumed = await interrupted_then_resumed()
    events = paused + resumed
    rows = timeline_rows(events)
    for run in (paused, resumed):
        origin = datetime.fromisoformat(run[0]["created_at"])
        for event, row in zip(run, [r for r in rows if r.run_id == run[0]["run_id"]], strict=True):
            expected = (datetime.fromisoformat(event["created_at"]) - origin).total_seconds()
            assert row.offset == pytest.approx(expected)
    text = render_timeline(events)
    assert line_of(text, paused[0]["seq"]).split()[1] == "+0.000s"
    assert line_of(text, resumed[0]["seq"]).split()[1] == "+0.000s"
    for line in text.splitlines()[1:]:
        assert re.fullmatch(r"[+-]\d+\.\d{3}s", line.split()[1])


# -- tool calls and their outcomes ----------------------------------------------------------


async def test_tool_outcomes_are_on_the_lines_that_answer_their_calls():
    events, _ = await tool_run()
    rows = timeline_rows(events)
    asked = rows_of(rows, "llm.ai.response")[0]
    assert "calls add({'a': 1, 'b': 2}), explode({'reason': 'disk full'})" in asked.text
    (result,) = rows_of(rows, "llm.tool.result")
    (error,) = rows_of(rows, "tool.error")
    assert (result.answers, result.tool_call_id, result.status) == (asked.seq, "c1", "ok")
    assert (error.answers, error.tool_call_id, error.status) == (asked.seq, "c2", "error")
    assert result.text == "add ✓ 3"
    assert error.text == "explode ✗ RuntimeError: tool exploded: disk full"
    text = render_timeline(events, width=120)
    assert line_of(text, result.seq).endswith(f"↳ #{asked.seq} add ✓ 3")
    assert line_of(text, error.seq).endswith(
        f"↳ #{asked.seq} explode ✗ RuntimeError: tool exploded: disk full"
    )


async def test_each_model_call_shows_its_tokens():
    events, _ = await tool_run()
    asking, answering = [e["seq"] for e in events if e["event_type"] == "llm.ai.response"]
    text = render_timeline(events, width=120)
    assert "[138 tok: 120 in, 18 out] calls add(" in line_of(text, asking)
    assert "[174 tok: 160 in (96 cached), 14 out] 'It is 3;" in line_of(text, answering)
    # The tokens come first, so a narrow line cuts the message, not them.
    narrow = line_of(render_timeline(events, width=90), answering)
    assert "[174 tok: 160 in (96 cached), 14 out] 'It" in narrow and narrow.endswith("…")


# -- human in the loop ----------------------------------------------------------------------


async def test_interrupt_and_resume_are_marked_and_linked():
    paused, resumed = await interrupted_then_resumed()
    rows = timeline_rows(paused + resumed)
    asked = rows_of(rows, "llm.ai.response")[0]
    (unresolved,) = rows_of(rows, "tool.unresolved")
    (interrupt,) = rows_of(rows, "run.interrupt")
    (resume,) = rows_of(rows, "run.resume")
    (result,) = rows_of(rows, "llm.tool.result")
    assert (unresolved.answers, unresolved.status) == (asked.seq, "unresolved")
    assert unresolved.text == "ask_human ⊘ unresolved (interrupted)"
    assert (interrupt.text, interrupt.status) == ("interrupted, asks 'Proceed?'", "interrupted")
    assert (resume.answers, resume.status) == (interrupt.seq, "resumed")
    # The resumed run answers the call the paused run asked for.
    assert (result.answers, result.text, result.run_id) == (
        asked.seq,
        "ask_human ✓ yes",
        resumed[0]["run_id"],
    )
    text = render_timeline(paused + resumed)
    column = details_column(text)
    assert line_of(text, interrupt.seq)[column:] == "interrupted, asks 'Proceed?'"
    assert line_of(text, resume.seq)[column:] == f"↳ #{interrupt.seq} resumed"


async def test_a_resumed_run_alone_names_the_call_and_checkpoint_it_continues():
    paused, resumed = await interrupted_then_resumed()
    rows = timeline_rows(resumed)
    (resume,) = rows_of(rows, "run.resume")
    checkpoint = next(e for e in paused if e["event_type"] == "run.interrupt")["content"]
    assert resume.answers is None
    assert resume.text == f"resumed from checkpoint {checkpoint['checkpoint_id']}"
    (result,) = rows_of(rows, "llm.tool.result")
    assert (result.answers, result.tool_call_id) == (None, "h1")
    assert line_of(render_timeline(resumed), result.seq).endswith("↳ h1 ask_human ✓ yes")


# -- subagents ------------------------------------------------------------------------------


async def test_subagent_steps_are_indented_under_their_task():
    events = await subagent_run()
    rows = timeline_rows(events)
    by_seq = {e["seq"]: e for e in events}
    starts = {by_seq[r.seq]["content"]["task_id"]: r for r in rows_of(rows, "subagent.start")}
    ends = {by_seq[r.seq]["content"]["task_id"]: r for r in rows_of(rows, "subagent.end")}
    assert sorted(starts) == sorted(ends) == ["ta", "tb"]
    assert starts["ta"].text == "task ta: find files"
    steps = rows_of(rows, "subagent.step")
    assert len(steps) == 7 + 3  # ta: three rounds and an answer; tb: one round and an answer
    for step in steps:
        task = by_seq[step.seq]["content"]["task_id"]
        assert starts[task].seq < step.seq < ends[task].seq
        assert step.depth == 1 and step.text.startswith(f"[{task}] ")
        if by_seq[step.seq]["content"]["kind"] == "tool":
            assert step.answers is not None and step.answers < step.seq
            asked = by_seq[step.answers]["content"]  # the step that asked for the tool
            assert (asked["task_id"], asked["kind"]) == (task, "ai")
            assert asked["tool_calls"][0]["name"] == "list_files"
            assert "list_files ✓ /d" in step.text
    for task, end in ends.items():
        assert (end.answers, end.status, end.depth) == (starts[task].seq, "completed", 0)
        assert end.text == (
            f"task {task} ✓ completed · fake [42 tok: 30 in, 12 out] · found 2 files"
        )
    text = render_timeline(events, width=200)
    column = details_column(text)
    for start in starts.values():
        assert line_of(text, start.seq)[column:].startswith("task ")
    for step in steps:
        assert line_of(text, step.seq)[column:].startswith("  ")
        assert (
            line_of(text, step.seq)[column + 2 :].lstrip() == line_of(text, step.seq)[column + 2 :]
        )


# -- middleware, memory and workspace -------------------------------------------------------


async def test_middleware_memory_and_workspace_changes_are_one_line_each(tmp_path: Path):
    root = tmp_path / "outputs"
    root.mkdir()
    (root / "notes.txt").write_text("old\n")
    digest = hashlib.sha256(b"remembered").hexdigest()
    journal = RunJournal(
        event_store=MemoryRunEventStore(),
        workspace_roots=[WorkspaceRoot("outputs", root, "/mnt/user-data/outputs")],
    )

    @tool
    def write_report(text: str) -> str:
        """Write the report and update the notes."""
        (root / "report.md").write_text(text)
        (root / "notes.txt").write_text("new\nmore\n")
        journal.record_middleware(
            "guardrail", name="Guardrail", hook="after_tool", action="allowed", changes={"x": 1}
        )
        journal.record_memory_context(content_sha256=digest)
        return "written"

    model = scripted(ai("", calls=[("write_report", {"text": "# Report\n"}, "w1")]), ai("Saved."))
    await agent_graph(model, [write_report]).ainvoke(QUESTION, {"callbacks": [journal]})
    events = await run_events(journal, flush=True)
    rows = timeline_rows(events)
    assert len(rows) == len(events)
    (middleware,) = rows_of(rows, "middleware:guardrail")
    (memory,) = rows_of(rows, "context:memory")
    (workspace,) = rows_of(rows, "workspace_changes")
    assert middleware.text == "Guardrail after_tool · allowed · changed x"
    assert memory.text == f"memory context sha256 {digest[:12]}"
    assert workspace.text == (
        "2 files changed (1 created, 1 modified) +3 -1 · "
        "/mnt/user-data/outputs/notes.txt, /mnt/user-data/outputs/report.md"
    )
    text = render_timeline(events, width=200)
    # The middleware event's caller only repeats its type: its caller cell stays blank.
    column = details_column(text)
    assert line_of(text, middleware.seq)[column:] == middleware.text
    assert line_of(text, workspace.seq)[column:] == workspace.text


# -- width and colour -----------------------------------------------------------------------


@pytest.mark.parametrize("width", [12, 40, 64, 80, 120])
async def test_every_line_fits_the_width(width: int):
    # Wide characters take two columns; control characters never reach the terminal.
    events, summary = await tool_run(answer="東京は晴れ \x1b[31mred\x1b[0m " + "very long " * 20)
    text = render_timeline(events, summary, width=width)
    assert "\x1b" not in text
    for line in text.splitlines():
        assert columns(line) <= width, line
    cut = line_of(text, events[-2]["seq"])
    assert cut.endswith("…") and columns(cut) >= width - 1
    wide = render_timeline(events, width=1000)
    assert "東京は晴れ \\x1b[31mred\\x1b[0m very long" in line_of(wide, events[-2]["seq"])


async def test_colour_only_when_asked():
    events, summary = await tool_run()
    plain = render_timeline(events, summary)
    assert "\x1b" not in plain and "\x1b" not in render_summary(summary)
    coloured = render_timeline(events, summary, color=True)
    assert ANSI.sub("", coloured) == plain
    error_seq = next(e["seq"] for e in events if e["event_type"] == "tool.error")
    assert "\x1b[31m" in line_of(coloured, error_seq)  # an error is red
    assert "\x1b[32msuccess\x1b[0m" in coloured  # the run's status, green


async def test_a_failed_run_shows_its_errors():
    model = scripted(ai("", calls=[("explode", {"reason": "disk full"}, "e1")]), ai("Sorry."))
    journal = RunJournal(event_store=MemoryRunEventStore())
    with pytest.raises(RuntimeError):
        await agent_graph(model, [explode], handle_tool_errors=False).ainvoke(
            QUESTION, {"callbacks": [journal]}
        )
    events = await run_events(journal, flush=True)
    (failed,) = rows_of(timeline_rows(events), "run.error")
    assert (failed.status, failed.text) == (
        "error",
        "✗ error: RuntimeError: tool exploded: disk full",
    )
    summary = render_summary(journal.summary())
    assert "status error" in summary
    assert "error: RuntimeError: tool exploded: disk full" in summary


# -- the run summary ------------------------------------------------------------------------


async def test_render_summary_shows_the_totals():
    events, summary = await tool_run()
    assert isinstance(summary, RunSummary) and summary.duration_ms is not None
    lines = render_summary(summary).splitlines()
    assert lines == [
        f"status success in {summary.duration_ms} ms",
        "tokens: 312 total (280 in, 32 out) over 2 model calls",
        "  fake-model: 312 total (280 in, 32 out; cache read 96)",
        "cost: unknown (no price for fake-model)",
        "first human message: 'What is 1 + 2?'",
        "last AI message:     'It is 3; the other tool failed.'",
    ]
    assert render_timeline(events, summary).endswith("\n\n" + render_summary(summary))
    more = summary.model_copy(update={"dropped_events": 2, "subagent_tokens": 40})
    extra = render_summary(more).splitlines()
    assert "dropped events: 2" in extra
    assert "  by caller: lead agent 312, subagents 40, middleware 0" in extra
