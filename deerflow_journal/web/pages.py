"""The viewer's HTML pages: threads, a thread's runs, and a run's timeline (live while the
run goes on). Pages are rendered on the server by Jinja2 with autoescaping on: every stored
value reaches the browser as text."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, urlencode

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from deerflow_journal.catalog import RUN_INTERRUPT_EVENT, RUN_RESUME_EVENT
from deerflow_journal.summary import RunSummary
from deerflow_journal.timeline import format_duration, render_summary
from deerflow_journal.web import params, timeline_view
from deerflow_journal.web.api import JSONResponse, reader, thread_cursor
from deerflow_journal.web.reads import NotFound
from deerflow_journal.web.urls import path_id, url, viewer_root

__all__ = ["MAX_TIMELINE_EVENTS", "error_page", "routes"]

#: Events a timeline page shows at most; the JSON API pages through longer runs.
MAX_TIMELINE_EVENTS = 5000
_PAGE = 50  # threads or runs per page
_PAUSES = frozenset({RUN_INTERRUPT_EVENT.event_type, RUN_RESUME_EVENT.event_type})

_env = Environment(
    loader=PackageLoader("deerflow_journal.web", "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
_env.globals["url"] = url  # the one way a page links a thread or run
_env.filters["q"] = lambda value: quote(str(value), safe="")  # a query parameter's value
_env.filters["when"] = lambda value: "-" if value is None else str(value)[:19].replace("T", " ")


_env.filters["duration"] = format_duration


def _page(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
    body = _env.get_template(template).render(
        root=viewer_root(request.scope),
        user=reader(request).user_id,
        **context,
    )
    return HTMLResponse(body, status_code=status)


def error_page(request: Request, status: int, message: str, *, headers: Any = None) -> Response:
    """An error as a page: the status and one line saying what is wrong."""
    body = _env.get_template("error.html").render(
        root=viewer_root(request.scope), user=None, status=status, message=message
    )
    return HTMLResponse(body, status_code=status, headers=headers)


async def threads_page(request: Request) -> Response:
    """``/``: threads, most recent activity first, a page at a time."""
    cursor = thread_cursor(request.query_params)
    threads = await reader(request).threads(_PAGE, cursor)
    following = None
    if len(threads) == _PAGE:
        last = threads[-1]
        following = urlencode({"before_at": last.last_event_at, "before_thread": last.thread_id})
    return _page(request, "threads.html", threads=threads, following=following, paged=cursor)


async def runs_page(request: Request) -> Response:
    """``/threads/{thread_id}``: the thread's runs, newest first, a page at a time."""
    thread_id = path_id(request.path_params, "thread_id")
    before = params.text(request.query_params, "before")
    runs = await reader(request).runs(thread_id, _PAGE, before)
    return _page(
        request,
        "runs.html",
        thread_id=thread_id,
        runs=runs,
        with_cost=any(s.estimated_cost_usd is not None for s in runs),
        following=runs[-1].run_id if len(runs) == _PAGE else None,
        paged=before,
    )


async def _timeline(
    request: Request, after_seq: int = 0
) -> tuple[str, str, list[timeline_view.Item], bool]:
    """The run's timeline items (the first ``MAX_TIMELINE_EVENTS``) and whether it was cut.

    Links to other runs are looked up only when an item after ``after_seq`` can have one.
    """
    thread_id = path_id(request.path_params, "thread_id")
    run_id = path_id(request.path_params, "run_id")
    read = reader(request)
    events = await read.run_events(thread_id, run_id, None, MAX_TIMELINE_EVENTS + 1)
    if not events:
        await read.check_run(thread_id, run_id)
    cut = len(events) > MAX_TIMELINE_EVENTS
    events = events[:MAX_TIMELINE_EVENTS]
    pausing = any(e["seq"] > after_seq and e["event_type"] in _PAUSES for e in events)
    pauses = await read.pauses(thread_id, run_id) if pausing else None
    return thread_id, run_id, timeline_view.items(events, pauses), cut


def _finished(summary: RunSummary | None) -> bool:
    # A run's summary is written at its outcome: until then the run may still be going.
    return summary is not None and summary.status != "running"


async def run_page(request: Request) -> Response:
    """``/threads/{thread_id}/runs/{run_id}``: the run's timeline and summary."""
    thread_id, run_id, made, cut = await _timeline(request)
    summary = await reader(request).summary(thread_id, run_id)
    return _page(
        request,
        "run.html",
        thread_id=thread_id,
        run_id=run_id,
        summary=summary,
        summary_text=render_summary(summary, width=100) if summary else "",
        blocks=timeline_view.blocks(made),
        last_seq=made[-1].row.seq if made else 0,
        live=not cut and not _finished(summary),
        cut=cut,
        max_events=MAX_TIMELINE_EVENTS,
        interval_ms=round(request.app.state.poll_interval * 1000),
    )


async def live_rows(request: Request) -> Response:
    """``/threads/{thread_id}/runs/{run_id}/live?after_seq=N``: the timeline rows after ``N``
    as HTML pieces, each with the seq it answers; whether the run has finished, and whether it
    has more events than a page holds (``cut``): the page stops asking at either."""
    after = params.count(request.query_params, "after_seq") or 0
    try:
        thread_id, run_id, made, cut = await _timeline(request, after)
    except NotFound:
        made, cut = [], False  # not written yet: the page waits for its first event
        thread_id = path_id(request.path_params, "thread_id")
        run_id = path_id(request.path_params, "run_id")
    summary = await reader(request).summary(thread_id, run_id)
    row = _env.get_template("row.html").module.row  # type: ignore[attr-defined]
    root = viewer_root(request.scope)
    fresh = [item for item in made if item.row.seq > after]
    return JSONResponse(
        {
            "rows": [
                {
                    "seq": item.row.seq,
                    "task": item.task,
                    # A row shown earlier gets its "→ #seq" from this: it is not sent again.
                    "answers": item.row.answers,
                    "html": str(row(item, root, thread_id)),
                }
                for item in fresh
            ],
            "last_seq": max([after, *(item.row.seq for item in fresh)]),
            # Apart: a run too long for the page may still be going.
            "finished": _finished(summary),
            "cut": cut,
        }
    )


def routes() -> list[Route]:
    """The pages' routes (GET only)."""
    return [
        Route("/", threads_page, methods=["GET"]),
        Route("/threads/{thread_id}", runs_page, methods=["GET"]),
        Route("/threads/{thread_id}/runs/{run_id}", run_page, methods=["GET"]),
        Route("/threads/{thread_id}/runs/{run_id}/live", live_rows, methods=["GET"]),
    ]
