"""The viewer's HTML pages, read as HTML: what each page lists and links, and that stored
text is escaped. (tests/web/test_browser.py looks at the same pages in a real browser.)"""

from __future__ import annotations

import html
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from urllib.parse import unquote

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount

from deerflow_journal import open_store
from deerflow_journal.summary import RunSummary
from deerflow_journal.web import create_app, pages, reads
from tests.web.conftest import Viewer, client_of
from tests.web.journals import SLASHED_RUN, SLASHED_THREAD, XSS_AI


async def page(viewer: Viewer, path: str, expect: int = 200) -> str:
    response = await viewer.client.get(path)
    assert response.status_code == expect, response.text
    assert response.headers["content-type"].startswith("text/html")
    return response.text


def row_of(text: str, seq: int) -> str:
    """The HTML of the timeline row of event ``seq``."""
    start = text.index(f'id="e-{seq}"')
    end = text.find('<div class="row', start)
    return text[start : end if end > 0 else len(text)]


async def test_the_threads_page_links_each_thread_newest_first(viewer: Viewer):
    text = await page(viewer, "/")
    listed = re.findall(r'class="thread" href="/threads/([^"/]+)"', text)
    threads = await viewer.store.list_threads()
    assert [unquote(link) for link in listed] == [t.thread_id for t in threads]


async def test_links_to_ids_holding_slashes_and_percent_signs_lead_to_them(viewer: Viewer):
    text = await page(viewer, "/")
    (thread,) = re.findall(r'class="thread" href="(/threads/team[^"]*)"', text)
    text = await page(viewer, thread)
    (run,) = re.findall(r'class="run" href="([^"]+)"', text)
    text = await page(viewer, run)
    assert f'<span class="id">{SLASHED_RUN}</span>' in text
    events = await viewer.store.list_events(SLASHED_THREAD, SLASHED_RUN)
    assert re.findall(r'data-seq="(\d+)"', text) == [str(e["seq"]) for e in events]
    (live,) = re.findall(r'data-live-url="([^"]+)"', text)
    assert live == f"{run}/live"
    rows = await viewer.client.get(live, params={"after_seq": events[-2]["seq"]})
    assert [row["seq"] for row in rows.json()["rows"]] == [events[-1]["seq"]]


async def test_the_runs_page_shows_each_runs_status_and_tokens(viewer: Viewer):
    text = await page(viewer, "/threads/hitl")
    paused, resumed = viewer.ids["hitl"]
    assert re.findall(r'class="run" href="/threads/hitl/runs/([^"]+)"', text) == [resumed, paused]
    assert re.findall(r'<span class="status status-(\w+)">', text) == ["success", "interrupted"]
    assert "cost (USD)" not in text  # no summary here carries a cost


async def test_a_tool_call_links_to_its_outcome_and_back(viewer: Viewer):
    run_id = viewer.ids["weather"][0]
    events = await viewer.store.list_events("weather", run_id)
    call, result = events[2]["seq"], events[3]["seq"]
    text = await page(viewer, f"/threads/weather/runs/{run_id}")
    assert [e["event_type"] for e in events][2:4] == ["llm.ai.response", "llm.tool.result"]
    assert f'class="answered-by" href="#e-{result}"' in row_of(text, call)
    assert f'class="answers" href="#e-{call}"' in row_of(text, result)


async def test_stored_html_is_shown_as_text(viewer: Viewer):
    text = await page(viewer, f"/threads/xss/runs/{viewer.ids['xss']}")
    assert "<img" not in text and "<script>" not in text
    assert "&lt;img src=x onerror=&#34;window.__pwned = 1; alert(1)&#34;&gt;" in text
    assert "&lt;script&gt;window.__pwned = 2" in text
    assert XSS_AI not in text


async def test_subagent_steps_are_grouped_under_their_task(viewer: Viewer):
    text = await page(viewer, f"/threads/tasks/runs/{viewer.ids['tasks']}")
    sections = re.findall(r'<section class="task" data-task="(\w+)">(.*?)</section>', text, re.S)
    assert [task for task, _ in sections] == ["t1", "t2"]
    for task, body in sections:
        kinds = re.findall(r'<span class="kind">([\w.]+)</span>', body)
        assert kinds == ["subagent.start", "subagent.step", "subagent.end"], task
        assert set(re.findall(r'data-task="(\w+)"', body)) == {task}


async def test_workspace_changes_are_shown_as_diffs(viewer: Viewer):
    text = await page(viewer, f"/threads/work/runs/{viewer.ids['work']}")
    assert '<span class="diff-del">-old line</span>' in text
    assert '<span class="diff-add">+new line</span>' in text
    assert '<span class="diff-add">+# Report</span>' in text
    assert re.search(r'<span class="file-status">created</span> [^<]*report\.md', text)


async def test_an_interrupt_and_its_resume_stay_linked_however_many_runs_follow(
    viewer: Viewer, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(reads, "_PAGE", 1)  # the thread's pauses are read a page at a time
    paused, resumed = viewer.ids["hitl"]
    started = datetime.now(UTC)  # after both runs: the later runs are listed first
    async with viewer.backend.make() as writable:
        for n in range(250):
            later = RunSummary(thread_id="hitl", run_id=f"later-{n}", started_at=started)
            await writable.put_run_summary(later)
    listed = await viewer.store.list_run_summaries("hitl", limit=252)
    assert [s.run_id for s in listed[-2:]] == [resumed, paused]  # the oldest
    first = await page(viewer, f"/threads/hitl/runs/{paused}")
    assert re.findall(r'class="other-run" href="/threads/hitl/runs/([^"#]+)#', first) == [resumed]
    second = await page(viewer, f"/threads/hitl/runs/{resumed}")
    assert re.findall(r'class="other-run" href="/threads/hitl/runs/([^"#]+)#', second) == [paused]


async def test_an_interrupt_and_its_resume_link_to_each_other_across_runs(viewer: Viewer):
    paused, resumed = viewer.ids["hitl"]
    (interrupt,) = await viewer.store.list_events("hitl", paused, event_types="run.interrupt")
    (resume,) = await viewer.store.list_events("hitl", resumed, event_types="run.resume")
    first = await page(viewer, f"/threads/hitl/runs/{paused}")
    link = f'href="/threads/hitl/runs/{resumed}#e-{resume["seq"]}">resumed in run {resumed}'
    assert link in row_of(first, interrupt["seq"])
    second = await page(viewer, f"/threads/hitl/runs/{resumed}")
    back = f'href="/threads/hitl/runs/{paused}#e-{interrupt["seq"]}">resumes the interrupt of run'
    assert back in row_of(second, resume["seq"])


async def test_the_live_rows_are_those_after_the_seq_asked(viewer: Viewer):
    run_id = viewer.ids["weather"][2]
    events = await viewer.store.list_events("weather", run_id)
    after = events[3]["seq"]
    response = await viewer.client.get(f"/threads/weather/runs/{run_id}/live?after_seq={after}")
    body = response.json()
    assert [row["seq"] for row in body["rows"]] == [e["seq"] for e in events[4:]]
    assert body["last_seq"] == events[-1]["seq"] and body["finished"] is True
    assert all(f'id="e-{row["seq"]}"' in row["html"] for row in body["rows"])
    text = await page(viewer, f"/threads/weather/runs/{run_id}")
    assert 'data-live="0"' in text  # a finished run is not polled


async def test_a_live_row_names_the_row_it_answers(viewer: Viewer):
    run_id = viewer.ids["weather"][0]
    events = await viewer.store.list_events("weather", run_id)
    call, result = events[2]["seq"], events[3]["seq"]
    response = await viewer.client.get(f"/threads/weather/runs/{run_id}/live?after_seq={call}")
    rows = response.json()["rows"]
    # The call was shown before: only the result's row says it has an answer now.
    assert [(row["seq"], row["answers"]) for row in rows[:2]] == [
        (result, call),
        (result + 1, None),
    ]


async def write_steps(viewer: Viewer, count: int) -> None:
    """``count`` more events of run ``r`` of thread ``long``, written as a running run does."""
    step = {"thread_id": "long", "run_id": "r", "event_type": "run.start", "category": "trace"}
    async with viewer.backend.make() as writable:
        await writable.put_batch([step] * count)


async def test_a_running_run_longer_than_the_page_is_cut_not_finished(
    viewer: Viewer, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(pages, "MAX_TIMELINE_EVENTS", 3)
    live = "/threads/long/runs/r/live"
    await write_steps(viewer, 2)  # no summary yet: the run is going
    body = (await viewer.client.get(live, params={"after_seq": 0})).json()
    assert (body["finished"], body["cut"], len(body["rows"])) == (False, False, 2)
    await write_steps(viewer, 2)
    events = await viewer.store.list_events("long", "r")
    body = (await viewer.client.get(live, params={"after_seq": body["last_seq"]})).json()
    assert (body["finished"], body["cut"]) == (False, True)
    assert [row["seq"] for row in body["rows"]] == [events[2]["seq"]]
    # The page says where the rest is, and does not poll.
    text = await page(viewer, "/threads/long/runs/r")
    assert 'data-live="0"' in text and "Showing the first 3 events; the run has more" in text
    (rest,) = re.findall(r'class="rest" href="([^"]+)"', text)
    assert rest == f"/api/threads/long/runs/r/events?after_seq={events[2]['seq']}"
    assert (await viewer.client.get(rest)).json()["events"] == events[3:]
    async with viewer.backend.make() as writable:
        await writable.put_run_summary(RunSummary(thread_id="long", run_id="r", status="success"))
    body = (await viewer.client.get(live, params={"after_seq": body["last_seq"]})).json()
    assert (body["finished"], body["cut"]) == (True, True)


async def test_a_missing_static_file_is_a_404_page_linking_the_viewers_own_root(viewer: Viewer):
    parent = Starlette(routes=[Mount("/viewer", app=create_app(viewer.store))])
    async with client_of(parent) as mounted:
        for client, root in ((viewer.client, ""), (mounted, "/viewer")):
            response = await client.get(f"{root}/static/nope.js")
            assert response.status_code == 404
            assert response.headers["content-type"].startswith("text/html")
            hrefs = re.findall(r'(?:href|src)="([^"]+)"', response.text)
            assert hrefs == [
                f"{root}/static/viewer.css",
                f"{root}/static/viewer.js",
                f"{root}/",
                f"{root}/",
            ]
            for href in hrefs[:2]:
                assert (await client.get(href)).status_code == 200, href


async def test_unknown_threads_and_runs_are_404_pages(viewer: Viewer):
    assert "the journal has no thread" in await page(viewer, "/threads/nowhere", 404)
    text = await page(viewer, "/threads/weather/runs/nope", 404)
    assert "thread &#39;weather&#39; has no run &#39;nope&#39;" in text


def test_the_runs_page_shows_a_cost_column_when_summaries_carry_a_cost():
    runs = [
        RunSummary(thread_id="t", run_id="r2", status="success", estimated_cost_usd=0.0015),
        RunSummary(thread_id="t", run_id="r1", status="success"),  # an unpriced model
    ]
    text = pages._env.get_template("runs.html").render(
        root="", user=None, thread_id="t", runs=runs, with_cost=True, following=None, paged=None
    )
    assert "cost (USD)" in text
    assert re.findall(r'<td class="num cost">([^<]*)</td>', text) == ["0.0015", "-"]


async def test_the_threads_and_runs_pages_page_through_everything(viewer: Viewer, monkeypatch):
    monkeypatch.setattr(pages, "_PAGE", 2)
    listed, path = [], "/"
    while True:
        text = await page(viewer, path)
        listed += re.findall(r'class="thread" href="/threads/([^"]+)"', text)
        older = re.search(r'class="older" href="([^"]+)"', text)
        if older is None:
            break
        path = older.group(1).replace("&amp;", "&")
    threads = await viewer.store.list_threads()
    assert [unquote(link) for link in listed] == [t.thread_id for t in threads]
    first = await page(viewer, "/threads/weather")
    older = re.search(r'class="older" href="([^"]+)"', first)
    assert older is not None
    second = await page(viewer, older.group(1))
    link = r'class="run" href="/threads/weather/runs/([^"]+)"'
    runs = [re.findall(link, t) for t in (first, second)]
    assert runs == [viewer.ids["weather"][:0:-1], viewer.ids["weather"][:1]]


async def test_a_long_run_shows_its_first_events_and_says_so(viewer: Viewer, monkeypatch):
    monkeypatch.setattr(pages, "MAX_TIMELINE_EVENTS", 3)
    text = await page(viewer, f"/threads/weather/runs/{viewer.ids['weather'][0]}")
    assert len(re.findall(r'<div class="row depth', text)) == 3
    assert "Showing the first 3 events" in text and 'data-live="0"' in text


# -- ids a URL path cannot hold as they are ----------------------------------------------------

#: Dot segments (which URL parsers fold), reserved and non-ASCII characters, and ids that look
#: like the escaped form of another.
AWKWARD_IDS = [".", "..", "a/b", "a?b", "a#b", "%41", "x y", "é", "~..", "~", "~~x"]


@pytest.fixture
async def awkward(tmp_path) -> AsyncIterator[httpx.AsyncClient]:
    """A viewer over a SQLite journal with a thread and a run named after each awkward id."""
    journal = f"sqlite:///{tmp_path / 'journal.db'}"
    async with open_store(journal) as store:
        for id_ in AWKWARD_IDS:
            await store.put_batch(
                [
                    {"thread_id": id_, "run_id": id_, "event_type": kind, "category": "trace"}
                    for kind in ("run.start", "run.end")
                ]
            )
            await store.put_run_summary(RunSummary(thread_id=id_, run_id=id_, status="running"))
        # Run "." of thread "paused" is interrupted and resumed in its run "..".
        for run_id, kind in ((".", "run.interrupt"), ("..", "run.resume")):
            await store.put(
                thread_id="paused",
                run_id=run_id,
                event_type=kind,
                category="trace",
                content={"checkpoint_id": "c1"},
            )
            await store.put_run_summary(RunSummary(thread_id="paused", run_id=run_id))
    # client_of sends the path as a server does; Starlette's TestClient decodes it twice
    # (encode/starlette#2587), so "%41" would reach the app as "A".
    async with (
        open_store(journal, read_only=True) as store,
        client_of(create_app(store)) as client,
    ):
        yield client


def links(text: str, css_class: str) -> dict[str, str]:
    """The ``<a class=css_class>`` links of a page: their text to their href."""
    found = re.findall(rf'<a class="{css_class}" href="([^"]*)">([^<]*)</a>', text)
    return {html.unescape(label): html.unescape(href) for href, label in found}


async def follow(client: httpx.AsyncClient, href: str, heading: str) -> str:
    """The page at ``href``, checked to be headed ``heading`` (say, ``Thread ..``)."""
    response = await client.get(href)
    assert response.status_code == 200, (href, response.text)
    shown = re.search(r'<h1>(\w+) <span class="id">([^<]*)</span></h1>', response.text)
    assert shown is not None, (href, response.text)
    assert f"{shown[1]} {html.unescape(shown[2])}" == heading, href
    return response.text


async def run_page(client: httpx.AsyncClient, thread_id: str, run_id: str) -> str:
    """The run's page, reached by its links from the threads page."""
    threads = links((await client.get("/")).text, "thread")
    text = await follow(client, threads[thread_id], f"Thread {thread_id}")
    return await follow(client, links(text, "run")[run_id], f"Run {run_id}")


async def test_links_to_awkward_ids_lead_to_their_threads_and_runs(awkward: httpx.AsyncClient):
    for id_ in AWKWARD_IDS:
        text = await run_page(awkward, id_, id_)
        assert re.findall(r'data-seq="(\d+)"', text) == ["1", "2"], id_
        (live,) = re.findall(r'data-live-url="([^"]+)"', text)
        response = await awkward.get(html.unescape(live), params={"after_seq": 1})
        assert [row["seq"] for row in response.json()["rows"]] == [2], id_
        crumb = re.search(r'thread <a class="id" href="([^"]+)">', text)
        assert crumb is not None
        await follow(awkward, html.unescape(crumb[1]), f"Thread {id_}")


async def test_api_links_of_awkward_ids_answer_for_them(awkward: httpx.AsyncClient):
    for id_ in AWKWARD_IDS:
        run = await run_page(awkward, id_, id_)
        crumb = re.search(r'thread <a class="id" href="([^"]+)">', run)
        assert crumb is not None
        thread = (await awkward.get(html.unescape(crumb[1]))).text
        answers = {}
        for href in re.findall(r'<a href="(/api/[^"]+)"', thread + run):
            response = await awkward.get(html.unescape(href))
            assert response.status_code == 200, (id_, href, response.text)
            answers[href.rsplit("/", 1)[1]] = response.json()
        assert set(answers) == {"runs", "page", "events", "workspace-changes"}, id_
        assert [r["run_id"] for r in answers["runs"]["runs"]] == [id_]
        assert {(e["thread_id"], e["run_id"]) for e in answers["events"]["events"]} == {(id_, id_)}
        assert answers["workspace-changes"]["run_id"] == id_
        assert answers["page"]["messages"] == []


async def test_an_interrupt_links_to_its_resume_in_a_run_named_dot_dot(awkward: httpx.AsyncClient):
    text = await run_page(awkward, "paused", ".")
    (link,) = re.findall(r'class="other-run" href="([^"#]+)#e-\d+"', text)
    text = await follow(awkward, html.unescape(link), "Run ..")
    (back,) = re.findall(r'class="other-run" href="([^"#]+)#e-\d+"', text)
    await follow(awkward, html.unescape(back), "Run .")
