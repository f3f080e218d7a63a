"""The viewer's JSON API against SQLite and PostgreSQL journals filled by real runs: each
endpoint returns what the store's own read returns, pages the way the store pages, and
answers unknown ids with 404 and bad parameters with 422 naming them."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

import pytest
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from deerflow_journal import latest_workspace_changes, open_store, visible_messages
from deerflow_journal.web import CONTENT_SECURITY_POLICY, create_app
from deerflow_journal.web.params import MAX_LIMIT
from deerflow_journal.web.serve import LOOPBACK_NAMES
from tests.web.conftest import Viewer, client_of
from tests.web.journals import SLASHED_RUN, SLASHED_THREAD, tool_run


async def get(viewer: Viewer, path: str, expect: int = 200, **query: Any) -> Any:
    response = await viewer.client.get(path, params=query)
    assert response.status_code == expect, response.text
    assert response.headers["content-type"] == "application/json"
    return response.json()


def thread_json(t: Any) -> dict[str, Any]:
    return {
        "thread_id": t.thread_id,
        "last_seq": t.last_seq,
        "last_event_at": t.last_event_at,
        "run_count": t.run_count,
    }


# -- listings ----------------------------------------------------------------------------------


async def test_threads_pages_through_the_stores_threads_newest_first(viewer: Viewer):
    everything = await viewer.store.list_threads(limit=100)
    assert len(everything) == 8
    body = await get(viewer, "/api/threads")
    assert body == {"threads": [thread_json(t) for t in everything], "next": None}
    seen, query = [], {"limit": "3"}
    while True:
        body = await get(viewer, "/api/threads", **query)
        seen += body["threads"]
        if body["next"] is None:
            break
        query = {"limit": "3", **body["next"]}
    assert seen == [thread_json(t) for t in everything]


async def test_runs_pages_through_the_threads_summaries_newest_first(viewer: Viewer):
    store = viewer.store
    newest_first = await store.list_run_summaries("weather", limit=50)
    assert [s.run_id for s in newest_first] == viewer.ids["weather"][::-1]
    body = await get(viewer, "/api/threads/weather/runs")
    assert body == {"runs": [s.to_json_dict() for s in newest_first], "next_before": None}
    first = await get(viewer, "/api/threads/weather/runs", limit="2")
    assert first["runs"] == [s.to_json_dict() for s in newest_first[:2]]
    rest = await get(viewer, "/api/threads/weather/runs", limit="2", before=first["next_before"])
    assert rest == {"runs": [newest_first[2].to_json_dict()], "next_before": None}
    paused = viewer.ids["hitl"][0]
    body = await get(viewer, "/api/threads/hitl/runs", status="interrupted")
    assert [run["run_id"] for run in body["runs"]] == [paused]


# -- the consumer endpoints --------------------------------------------------------------------


async def test_messages_page_is_the_visible_part_of_the_stores_message_page(viewer: Viewer):
    store = viewer.store
    rows = await store.list_messages("weather", limit=1000)
    hidden = [r for r in rows if r not in visible_messages(rows)]
    assert len(hidden) == 2  # the middleware's row and the hide_from_ui one
    for limit in (1, 4, 50):
        before, pages = None, 0
        while True:
            query = {"limit": str(limit)} | ({} if before is None else {"before_seq": str(before)})
            body = await get(viewer, "/api/threads/weather/messages/page", **query)
            page = await store.list_messages("weather", limit=limit, before_seq=before)
            assert body["messages"] == visible_messages(page)
            assert body["has_more"] == (len(page) == limit)
            pages += 1
            if not body["has_more"]:
                break
            before = body["before_seq"]
            assert before == page[0]["seq"]
        assert pages == -(-len(rows) // limit) + (len(rows) % limit == 0)
    assert not [
        m
        for m in (await get(viewer, "/api/threads/weather/messages/page"))["messages"]
        if m in hidden
    ]


async def test_events_returns_the_stores_page_with_every_filter(viewer: Viewer):
    store = viewer.store
    run_id = viewer.ids["tasks"]
    path = f"/api/threads/tasks/runs/{run_id}/events"
    everything = await store.list_events("tasks", run_id)
    assert (await get(viewer, path)) == {"events": everything, "has_more": False, "after_seq": None}
    # after_seq and limit page the way the store does.
    after, walked = None, []
    while True:
        query = {"limit": "2"} | ({} if after is None else {"after_seq": str(after)})
        body = await get(viewer, path, **query)
        assert body["events"] == await store.list_events("tasks", run_id, limit=2, after_seq=after)
        walked += body["events"]
        if not body["has_more"]:
            break
        after = body["after_seq"]
    assert walked == everything
    # event_types: comma-separated or repeated; task_id: metadata.task_id; filters before limit.
    steps = await store.list_events("tasks", run_id, event_types=["subagent.start", "run.end"])
    assert [e["event_type"] for e in steps] == ["subagent.start", "subagent.start", "run.end"]
    body = await get(viewer, path, event_types="subagent.start,run.end")
    assert body["events"] == steps
    response = await viewer.client.get(
        path, params=[("event_types", "subagent.start"), ("event_types", "run.end")]
    )
    assert response.json()["events"] == steps
    task = await store.list_events("tasks", run_id, task_id="t2", limit=2)
    assert [e["event_type"] for e in task] == ["subagent.start", "subagent.step"]
    assert (await get(viewer, path, task_id="t2", limit="2"))["events"] == task
    past_the_end = everything[-1]["seq"]
    assert (await get(viewer, path, after_seq=str(past_the_end)))["events"] == []


async def test_workspace_changes_is_the_runs_latest_payload(viewer: Viewer):
    run_id = viewer.ids["work"]
    body = await get(viewer, f"/api/threads/work/runs/{run_id}/workspace-changes")
    payload = await latest_workspace_changes(viewer.store, "work", run_id)
    assert payload is not None and payload["summary"]["created"] == 1
    assert body == {"thread_id": "work", "run_id": run_id, "workspace_changes": payload}
    other = viewer.ids["weather"][0]
    body = await get(viewer, f"/api/threads/weather/runs/{other}/workspace-changes")
    assert body["workspace_changes"] is None


# -- mistakes ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/api/threads/nowhere/runs",
        "/api/threads/nowhere/messages/page",
        "/api/threads/nowhere/runs/r1/events",
        "/api/threads/nowhere/runs/r1/workspace-changes",
    ],
)
async def test_an_unknown_thread_is_404(viewer: Viewer, path: str):
    body = await get(viewer, path, 404)
    assert body == {"error": "the journal has no thread 'nowhere'", "status": 404}


async def test_ids_holding_slashes_and_percent_signs_are_one_path_segment(viewer: Viewer):
    store = viewer.store
    thread, run = quote(SLASHED_THREAD, safe=""), quote(SLASHED_RUN, safe="")
    body = await get(viewer, f"/api/threads/{thread}/runs")
    assert [r["run_id"] for r in body["runs"]] == [SLASHED_RUN]
    messages = await get(viewer, f"/api/threads/{thread}/messages/page")
    assert messages["messages"] == await store.list_messages(SLASHED_THREAD)
    events = await get(viewer, f"/api/threads/{thread}/runs/{run}/events")
    assert events["events"] == await store.list_events(SLASHED_THREAD, SLASHED_RUN)
    assert events["events"][0]["thread_id"] == SLASHED_THREAD
    await get(viewer, f"/api/threads/{thread}/runs/{run}/workspace-changes")
    # Decoded, the same ids are other paths: no thread "team" has a run "alpha 100%".
    await get(viewer, f"/api/threads/{quote(SLASHED_THREAD, safe='/')}/runs", 404)
    body = await get(viewer, f"/api/threads/{thread}/runs/{quote('run', safe='')}/events", 404)
    assert body["error"] == f"thread {SLASHED_THREAD!r} has no run 'run'"


async def test_without_a_raw_path_ids_holding_percent_signs_still_route(viewer: Viewer):
    """A server may leave ``raw_path`` out of the scope: the decoded path routes then, and
    only a "/" inside an id cannot be told from a separator."""
    app = create_app(viewer.store)

    async def without_raw_path(scope: Any, receive: Any, send: Any) -> None:
        await app({k: v for k, v in scope.items() if k != "raw_path"}, receive, send)

    thread = "odd%20thread 100%"
    async with viewer.backend.make() as writable:
        run_id = await tool_run(writable, thread, run_id="r%2F1")
    async with client_of(without_raw_path) as client:
        response = await client.get(f"/api/threads/{quote(thread, safe='')}/runs")
        assert [r["run_id"] for r in response.json()["runs"]] == [run_id]
        path = f"/api/threads/{quote(thread, safe='')}/runs/{quote(run_id, safe='')}/events"
        events = (await client.get(path)).json()["events"]
        assert events == await viewer.store.list_events(thread, run_id)
        slashed = f"/api/threads/{quote(SLASHED_THREAD, safe='')}/runs"
        assert (await client.get(slashed)).status_code == 404


async def test_a_raw_path_that_is_not_the_path_is_not_routed_on(viewer: Viewer):
    """A proxy may rewrite the path and leave the client's ``raw_path``: the path routes."""
    app = create_app(viewer.store)

    async def elsewhere(scope: Any, receive: Any, send: Any) -> None:
        await app({**scope, "raw_path": b"/api/threads/nowhere/runs"}, receive, send)

    async with client_of(elsewhere) as client:
        response = await client.get("/api/threads/weather/runs")
        assert response.status_code == 200
        assert [r["run_id"] for r in response.json()["runs"]] == viewer.ids["weather"][::-1]


async def test_mounted_under_a_path_the_api_and_the_pages_work_the_same(viewer: Viewer):
    parent = Starlette(routes=[Mount("/viewer", app=create_app(viewer.store))])
    thread, run = quote(SLASHED_THREAD, safe=""), quote(SLASHED_RUN, safe="")
    async with client_of(parent) as client:
        missing = await client.get("/viewer/api/threads/nowhere/runs")
        assert missing.status_code == 404
        assert missing.json() == {"error": "the journal has no thread 'nowhere'", "status": 404}
        events = await client.get(f"/viewer/api/threads/{thread}/runs/{run}/events")
        assert events.json()["events"] == await viewer.store.list_events(
            SLASHED_THREAD, SLASHED_RUN
        )
        page = await client.get(f"/viewer/threads/{thread}")
        assert page.status_code == 200
        assert f'href="/viewer/threads/{thread}/runs/{run}"' in page.text
        missing_page = await client.get("/viewer/threads/nowhere")
        assert missing_page.status_code == 404
        assert missing_page.headers["content-type"].startswith("text/html")


async def test_a_thread_of_trace_events_only_is_known(viewer: Viewer):
    async with viewer.backend.make() as writable:
        await writable.put(
            thread_id="traces", run_id="r1", event_type="run.start", category="trace"
        )
    assert await get(viewer, "/api/threads/traces/runs") == {"runs": [], "next_before": None}
    page = await get(viewer, "/api/threads/traces/messages/page")
    assert page["messages"] == []
    await get(viewer, "/api/threads/traces/runs/r2/events", 404)


async def test_an_unknown_run_of_a_known_thread_is_404(viewer: Viewer):
    for tail in ("events", "workspace-changes"):
        body = await get(viewer, f"/api/threads/weather/runs/nope/{tail}", 404)
        assert body["error"] == "thread 'weather' has no run 'nope'"
    body = await get(viewer, "/api/threads/weather/runs", 404, before="nope")
    assert body["error"] == "thread 'weather' has no run 'nope'"


@pytest.mark.parametrize(
    ("path", "query", "parameter"),
    [
        ("/api/threads", {"limit": "0"}, "limit"),
        ("/api/threads", {"limit": str(MAX_LIMIT + 1)}, "limit"),
        ("/api/threads", {"limit": "ten"}, "limit"),
        ("/api/threads", {"before_at": "2026-01-01T00:00:00+00:00"}, "before_thread"),
        ("/api/threads", {"before_at": "yesterday", "before_thread": "t"}, "before_at"),
        ("/api/threads/weather/runs", {"status": "finished"}, "status"),
        ("/api/threads/weather/messages/page", {"before_seq": "-1"}, "before_seq"),
        ("/api/threads/weather/messages/page", {"limit": "1.5"}, "limit"),
        ("/api/threads/weather/runs/r/events", {"after_seq": "x"}, "after_seq"),
        ("/api/threads/weather/runs/r/events", {"event_types": "x" * 33}, "event_types"),
        ("/api/threads/weather/runs/r/events", {"event_types": "run.start,"}, "event_types"),
        ("/api/threads/weather/runs/r/events", {"task_id": "\x07"}, "task_id"),
        ("/api/threads/%20x%07/runs", {}, "thread_id"),
    ],
)
async def test_a_bad_parameter_is_422_naming_it(viewer: Viewer, path, query, parameter):
    body = await get(viewer, path, 422, **query)
    assert body["parameter"] == parameter
    assert body["error"].startswith(f"{parameter}: ")


async def test_a_parameter_given_twice_is_422(viewer: Viewer):
    response = await viewer.client.get("/api/threads", params=[("limit", "1"), ("limit", "2")])
    assert response.status_code == 422 and response.json()["parameter"] == "limit"


# -- safety ------------------------------------------------------------------------------------


async def test_no_route_writes(viewer: Viewer):
    run_id = viewer.ids["weather"][0]
    paths = ["/api/threads", f"/api/threads/weather/runs/{run_id}/events", "/threads/weather", "/"]
    for path in paths:
        for method in ("POST", "PUT", "PATCH", "DELETE"):
            response = await viewer.client.request(method, path)
            assert response.status_code == 405, (method, path)
    assert len(await viewer.store.list_events("weather", run_id)) == 6


async def test_the_app_refuses_a_writable_store(tmp_path):
    async with open_store(f"sqlite:///{tmp_path / 'j.db'}") as store:
        with pytest.raises(ValueError, match="read_only=True"):
            create_app(store)


async def test_a_user_sees_only_their_own_threads_and_runs(viewer: Viewer):
    alice = create_app(viewer.store, user_id="alice")
    async with client_of(alice) as client:
        threads = (await client.get("/api/threads")).json()["threads"]
        assert [t["thread_id"] for t in threads] == ["alice-thread"]
        mine = await client.get(f"/api/threads/alice-thread/runs/{viewer.ids['alice']}/events")
        assert [e["user_id"] for e in mine.json()["events"]] == ["alice"] * 6
        for path in (
            "/api/threads/bob-thread/runs",
            "/api/threads/bob-thread/messages/page",
            f"/api/threads/bob-thread/runs/{viewer.ids['bob']}/events",
            f"/api/threads/bob-thread/runs/{viewer.ids['bob']}/workspace-changes",
            "/threads/bob-thread",
            f"/threads/bob-thread/runs/{viewer.ids['bob']}",
        ):
            assert (await client.get(path)).status_code == 404, path
    everyone = (await viewer.client.get("/api/threads")).json()["threads"]
    assert {"alice-thread", "bob-thread"} <= {t["thread_id"] for t in everyone}


async def test_every_response_carries_the_content_security_policy(viewer: Viewer):
    run_id = viewer.ids["xss"]
    for path in (
        "/",
        "/threads/xss",
        f"/threads/xss/runs/{run_id}",
        "/api/threads",
        "/static/viewer.js",
        "/api/threads/nowhere/runs",
        "/no/such/page",
    ):
        response = await viewer.client.get(path)
        assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY, path
        assert response.headers["x-content-type-options"] == "nosniff"
    assert "script-src 'self'" in CONTENT_SECURITY_POLICY
    assert "unsafe-inline" not in CONTENT_SECURITY_POLICY


async def test_a_store_that_fails_mid_serve_answers_500_with_the_viewers_error(
    viewer: Viewer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    async def down(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("server closed the connection unexpectedly")

    # The real store, its reads failing as a server's that went away would.
    monkeypatch.setattr(viewer.store, "list_threads", down)
    monkeypatch.setattr(viewer.store, "list_run_summaries", down)
    parent = Starlette(routes=[Mount("/viewer", app=create_app(viewer.store))])
    async with client_of(parent) as mounted:
        for client, root in ((viewer.client, ""), (mounted, "/viewer")):
            caplog.clear()
            response = await client.get(f"{root}/api/threads")
            assert response.status_code == 500
            assert response.headers["content-type"] == "application/json"
            assert response.json() == {
                "error": "the viewer could not answer: ConnectionError (see the server's log)",
                "status": 500,
            }
            assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
            (logged,) = [r for r in caplog.records if r.levelname == "ERROR"]
            assert logged.exc_info is not None and logged.exc_info[0] is ConnectionError
            for path in ("/", "/threads/weather"):
                page = await client.get(root + path)
                assert page.status_code == 500
                assert page.headers["content-type"].startswith("text/html")
                assert page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
                assert "the viewer could not answer: ConnectionError" in page.text
                assert f'<a class="home" href="{root}/">' in page.text
    # The reads that still work answer as before.
    run_id = viewer.ids["weather"][0]
    await get(viewer, f"/api/threads/weather/runs/{run_id}/events")


def test_the_app_opens_a_store_url_read_only_while_it_runs(tmp_path):
    url = f"sqlite:///{tmp_path / 'journal.db'}"

    async def write() -> str:
        async with open_store(url) as store:
            return await tool_run(store, "t")

    run_id = asyncio.run(write())
    with TestClient(create_app(url), base_url="http://127.0.0.1") as client:
        events = client.get(f"/api/threads/t/runs/{run_id}/events").json()["events"]
        assert len(events) == 6
        assert client.app.state.reader.store.read_only  # type: ignore[attr-defined]


def test_a_loopback_server_answers_only_requests_for_this_machine(tmp_path):
    url = f"sqlite:///{tmp_path / 'journal.db'}"

    async def create() -> None:
        async with open_store(url):  # an empty journal
            pass

    asyncio.run(create())
    app = create_app(url, allowed_hosts=LOOPBACK_NAMES)
    for host in ("attacker.example", "attacker.example:8765", "127.0.0.1.attacker.example"):
        with TestClient(app, base_url=f"http://{host}") as client:
            assert client.get("/api/threads").status_code == 400, host
    for host in ("127.0.0.1:8765", "localhost:8765", "[::1]:8765", "LOCALHOST"):
        with TestClient(app, base_url=f"http://{host}") as client:
            assert client.get("/api/threads").json() == {"threads": [], "next": None}, host
