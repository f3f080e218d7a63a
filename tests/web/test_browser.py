"""The viewer in a real browser: headless Chromium from the OS packages, driven by Playwright,
against ``deerflow-journal serve`` running as a program on a SQLite journal of real runs.

Without /usr/bin/chromium these tests skip, saying so, except in CI (``CI=true``), where
.ci/run installs it and they must run. Screenshots of the threads, runs and timeline pages go
to build/screenshots/ (the path is printed).
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from deerflow_journal import RunSummary, open_store
from deerflow_journal.web.pages import MAX_TIMELINE_EVENTS
from tests.backends import skip_unless_ci
from tests.journal.agents import ONE_TOOL_CALL_SEQUENCE
from tests.web.journals import SLASHED_RUN, SLASHED_THREAD, XSS_HUMAN, fill

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "build" / "screenshots"
HANG_GUARD = 60  # seconds: a guard against a hang, not a time limit
LIVE_THREAD, LIVE_RUN = "live", "live-run"
#: A running run whose tool call is answered while its page is open.
CALLS_THREAD, CALLS_RUN = "live-calls", "calls-run"
#: A running run one event short of what a timeline page holds.
LONG_THREAD, LONG_RUN = "live-long", "long-run"
#: Ids a browser would fold away as the path segments "." and ".." if put in a URL as they are.
DOTS_THREAD, DOTS_RUN = "..", "."

pytestmark = pytest.mark.slow


def chromium_or_skip() -> None:
    if CHROMIUM.exists():
        return
    message = (
        f"no Chromium at {CHROMIUM}: install the OS package (apt-get install -y chromium "
        "chromium-driver) to run the browser tests"
    )
    skip_unless_ci(message)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Served:
    """A running ``deerflow-journal serve`` and the journal it shows."""

    url: str  # the store URL
    base: str  # the server's address
    ids: dict[str, Any]


async def make_journal(url: str, tmp_path: Path) -> dict[str, Any]:
    async with open_store(url) as store:
        ids = await fill(store, tmp_path)
        # A run still going: its first event is written, its summary is not.
        await store.put(
            thread_id=LIVE_THREAD,
            run_id=LIVE_RUN,
            event_type="run.start",
            category="trace",
            content={"chain": "LangGraph"},
        )
        dots = {"thread_id": DOTS_THREAD, "run_id": DOTS_RUN}
        await store.put_batch(
            [
                {**dots, "event_type": "run.start", "category": "trace"},
                {
                    **dots,
                    "event_type": "llm.human.input",
                    "category": "message",
                    "content": {"type": "human", "content": "asked in thread .."},
                },
            ]
        )
        await store.put_run_summary(RunSummary(thread_id=DOTS_THREAD, run_id=DOTS_RUN))
        # The start of a weather run, up to its tool call; the test writes the call's result.
        weather = await store.list_events("weather", ids["weather"][0])
        await store.put_batch([copied(e, CALLS_THREAD, CALLS_RUN) for e in weather[:3]])
        step = {"thread_id": LONG_THREAD, "run_id": LONG_RUN, "category": "trace"}
        await store.put_batch([{**step, "event_type": "run.start"}] * (MAX_TIMELINE_EVENTS - 1))
    return ids


def copied(event: Any, thread_id: str, run_id: str) -> dict[str, Any]:
    """What to write for ``event`` as an event of another run."""
    keep = ("event_type", "category", "content", "metadata")
    return {"thread_id": thread_id, "run_id": run_id, **{k: event[k] for k in keep}}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    chromium_or_skip()
    tmp_path = tmp_path_factory.mktemp("browser")
    url = f"sqlite:///{tmp_path / 'journal.db'}"
    ids = asyncio.run(make_journal(url, tmp_path))
    port = free_port()
    log = (tmp_path / "server.log").open("w")
    command = ["-m", "deerflow_journal", "--url", url, "serve", "--port", str(port)]
    server = subprocess.Popen(
        [sys.executable, *command, "--interval", "0.2"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + HANG_GUARD
        while True:
            assert server.poll() is None, (tmp_path / "server.log").read_text()
            try:
                if httpx.get(f"{base}/api/threads", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.1)
        yield Served(url, base, ids)
    finally:
        server.terminate()
        server.wait(HANG_GUARD)
        log.close()


@pytest.fixture(scope="module")
def browser(served: Served) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM))
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh page that records every dialog (alert, confirm) and dismisses it."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    opened = context.new_page()
    opened.dialogs = []

    def dialog(d: Any) -> None:
        opened.dialogs.append(d.message)
        d.dismiss()

    opened.on("dialog", dialog)
    opened.set_default_timeout(HANG_GUARD * 1000)
    try:
        yield opened
    finally:
        context.close()


def screenshot(page: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")


def test_follow_a_run_from_the_threads_page_to_a_tool_calls_result(served: Served, page: Any):
    page.goto(served.base + "/")
    assert page.locator("a.thread").all_inner_texts()[-1] == "weather"  # the first filled
    screenshot(page, "1-threads")
    page.click("a.thread >> text=weather")
    page.wait_for_url(f"{served.base}/threads/weather")
    runs = page.locator("a.run").all_inner_texts()
    assert runs == served.ids["weather"][::-1]
    screenshot(page, "2-runs")
    page.click(f"a.run >> text={runs[-1]}")
    page.wait_for_url(f"**/threads/weather/runs/{runs[-1]}")
    rows = page.locator("#timeline .row[data-seq] .kind").all_inner_texts()
    assert rows == ONE_TOOL_CALL_SEQUENCE
    # Expand the tool call's payload: the JSON record of the call.
    call = page.locator("#timeline .row[data-seq]").nth(2)
    payload = call.locator("pre.payload")
    assert not payload.is_visible()
    call.locator("summary").click()
    assert payload.is_visible()
    assert '"tool_calls"' in payload.inner_text() and '"add"' in payload.inner_text()
    screenshot(page, "3-timeline")
    # Follow the call to its result.
    call.locator("a.answered-by").click()
    target = page.locator(".row:target")
    assert target.locator(".kind").inner_text() == "llm.tool.result"
    assert page.url.endswith(f"#e-{target.get_attribute('data-seq')}")
    assert target.locator("a.answers").inner_text() == f"↳ #{call.get_attribute('data-seq')}"


def test_ids_holding_slashes_and_percent_signs_open_from_their_links(served: Served, page: Any):
    page.goto(served.base + "/")
    page.click(f"a.thread >> text={SLASHED_THREAD}")
    page.wait_for_url(f"{served.base}/threads/team%2Falpha%20100%25")
    assert page.locator("a.run").all_inner_texts() == [SLASHED_RUN]
    page.click("a.run")
    page.wait_for_url("**/threads/team%2Falpha%20100%25/runs/run%2F1%20%252F")
    assert page.locator("#timeline .row[data-seq] .kind").all_inner_texts() == (
        ONE_TOOL_CALL_SEQUENCE
    )


def test_a_thread_and_run_named_with_dots_open_from_their_links(served: Served, page: Any):
    page.goto(served.base + "/")
    with page.expect_navigation():
        page.get_by_role("link", name=DOTS_THREAD, exact=True).click()
    assert page.locator("h1").text_content() == f"Thread {DOTS_THREAD}"
    # The run has no final summary: its page asks the server for the rows after the last one.
    with page.expect_navigation(), page.expect_response(lambda r: "/live?" in r.url) as live:
        page.get_by_role("link", name=DOTS_RUN, exact=True).click()
    assert page.locator("h1").text_content() == f"Run {DOTS_RUN}"
    kinds = page.locator("#timeline .row[data-seq] .kind").all_inner_texts()
    assert kinds == ["run.start", "llm.human.input"]
    assert page.locator("#timeline .row .text").last.inner_text() == "'asked in thread ..'"
    assert live.value.status == 200 and live.value.json()["rows"] == []


def test_stored_html_renders_as_text_and_runs_nothing(served: Served, page: Any):
    page.goto(f"{served.base}/threads/xss/runs/{served.ids['xss']}")
    for summary in page.locator("#timeline details > summary").all():
        summary.click()  # every payload open
    assert page.locator("#timeline pre.payload").first.is_visible()
    texts = page.locator("#timeline .row .text").all_inner_texts()
    assert f"'{XSS_HUMAN}'" in texts
    assert any("<script>window.__pwned = 2; alert(2)</script> done" in t for t in texts)
    assert page.locator("main img").count() == 0
    assert page.locator("script").count() == 1  # the viewer's own, from /static
    page.wait_for_timeout(500)  # an onerror would fire as the broken image loads
    assert page.evaluate("() => window.__pwned") is None
    assert page.dialogs == []
    screenshot(page, "4-escaped")


WRITER = """
import sys
from deerflow_journal import RunSummary, open_sync_store
from tests.web.test_browser import CALLS_RUN, CALLS_THREAD, LONG_RUN, LONG_THREAD, copied
step = sys.argv[2]
with open_sync_store(sys.argv[1]) as store:
    if step == "tool-result":  # the result of the weather run's call, the run's 4th event
        weather = store.list_events("weather", sys.argv[3])
        store.put_batch([copied(weather[3], CALLS_THREAD, CALLS_RUN)])
    elif step == "past-the-page":
        store.put_batch([{"thread_id": LONG_THREAD, "run_id": LONG_RUN, "category": "trace",
                          "event_type": "run.start"}] * 2)
    elif step == "message":
        store.put(thread_id="live", run_id="live-run", event_type="llm.human.input",
                  category="message",
                  content={"type": "human", "content": "written by another process"})
    else:
        store.put(thread_id="live", run_id="live-run", event_type="subagent.start",
                  category="subagent", content={"task_id": "t9", "description": "late task"},
                  metadata={"task_id": "t9"})
        store.put_run_summary(RunSummary(thread_id="live", run_id="live-run", status="success"))
"""


def write_from_another_process(url: str, step: str, *args: str) -> None:
    subprocess.run(
        [sys.executable, "-c", WRITER, url, step, *args],
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=HANG_GUARD,
    )


def test_a_row_appears_while_another_process_writes_to_the_run(served: Served, page: Any):
    page.goto(f"{served.base}/threads/{LIVE_THREAD}/runs/{LIVE_RUN}")
    assert page.locator("#timeline").get_attribute("data-live") == "1"
    assert page.locator("#timeline .row[data-seq]").count() == 1
    write_from_another_process(served.url, "message")
    row = page.locator("#timeline .row", has_text="written by another process")
    row.wait_for()
    assert row.locator(".kind").inner_text() == "llm.human.input"
    assert page.locator("#timeline .row[data-seq]").count() == 2
    screenshot(page, "5-live")
    # A new task gets its group; the run's summary ends the polling.
    write_from_another_process(served.url, "task-and-summary")
    task = page.locator("#timeline section.task")
    task.wait_for()
    assert task.locator("h3").inner_text() == "task t9"
    assert task.locator(".kind").all_inner_texts() == ["subagent.start"]
    page.wait_for_function(
        "() => document.getElementById('live-status').textContent.includes('finished')"
    )


def test_a_call_shown_live_links_to_its_outcome_when_that_is_written(served: Served, page: Any):
    page.goto(f"{served.base}/threads/{CALLS_THREAD}/runs/{CALLS_RUN}")
    assert page.locator("#timeline").get_attribute("data-live") == "1"
    call = page.locator("#timeline .row[data-seq]").nth(2)
    assert call.locator(".kind").inner_text() == "llm.ai.response"
    assert call.locator("a.answered-by").count() == 0
    write_from_another_process(served.url, "tool-result", served.ids["weather"][0])
    result = page.locator("#timeline .row[data-seq]").nth(3)
    result.wait_for()
    seq = result.get_attribute("data-seq")
    assert call.locator("a.answered-by").inner_text() == f"→ #{seq}"
    shown = call.locator("summary").inner_text()
    call.locator("a.answered-by").click()
    assert page.locator(".row:target .kind").inner_text() == "llm.tool.result"
    page.reload()
    assert page.locator("#timeline .row[data-seq]").nth(2).locator("summary").inner_text() == (
        shown
    )


def test_a_running_run_past_what_the_page_holds_is_not_called_finished(served: Served, page: Any):
    page.goto(f"{served.base}/threads/{LONG_THREAD}/runs/{LONG_RUN}")
    assert page.locator("#timeline").get_attribute("data-live") == "1"
    write_from_another_process(served.url, "past-the-page")
    rest = page.locator("#live-status a.rest")
    rest.wait_for()
    status = page.locator("#live-status").inner_text()
    assert status == "the run has more events than this page holds: the rest from the JSON API"
    rows = page.locator("#timeline .row[data-seq]")
    assert rows.count() == MAX_TIMELINE_EVENTS
    last = rows.last.get_attribute("data-seq")
    assert rest.get_attribute("href") == (
        f"/api/threads/{LONG_THREAD}/runs/{LONG_RUN}/events?after_seq={last}"
    )
    with page.expect_response(lambda r: "/events?" in r.url) as answer:
        rest.click()
    (event,) = answer.value.json()["events"]
    assert event["seq"] == int(last) + 1


def test_tasks_diffs_and_an_interrupt_linked_to_its_resume(served: Served, page: Any):
    page.goto(f"{served.base}/threads/tasks/runs/{served.ids['tasks']}")
    tasks = page.locator("#timeline section.task")
    assert tasks.locator("h3").all_inner_texts() == ["task t1", "task t2"]
    assert tasks.nth(1).locator(".kind").all_inner_texts() == [
        "subagent.start",
        "subagent.step",
        "subagent.end",
    ]
    screenshot(page, "6-subagent-tasks")
    page.goto(f"{served.base}/threads/work/runs/{served.ids['work']}")
    added = page.locator("pre.diff .diff-add")
    assert "+new line" in added.all_inner_texts()
    assert page.locator("pre.diff .diff-del").all_inner_texts() == ["-old line"]
    screenshot(page, "7-workspace-diff")
    paused, resumed = served.ids["hitl"]
    page.goto(f"{served.base}/threads/hitl/runs/{paused}")
    page.click("a.other-run")
    page.wait_for_url(f"**/threads/hitl/runs/{resumed}#e-*")
    assert page.locator(".row:target .kind").inner_text() == "run.resume"
    page.click(".row:target a.other-run")
    page.wait_for_url(f"**/threads/hitl/runs/{paused}#e-*")
    assert page.locator(".row:target .kind").inner_text() == "run.interrupt"
    screenshot(page, "8-interrupt")
