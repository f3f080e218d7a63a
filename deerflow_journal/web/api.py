"""The JSON API: the upstream consumer endpoints (thread history, run events, workspace review)
plus thread and run listings, answered by the store's own reads and paging."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from deerflow_journal.records import normalise_created_at
from deerflow_journal.web import params
from deerflow_journal.web.reads import Reader
from deerflow_journal.web.urls import path_id

__all__ = ["JSONResponse", "routes"]


class JSONResponse(Response):
    """A JSON body encoded by orjson (the package's codec); odd values become strings."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, default=str)


def reader(request: Request) -> Reader:
    """The app's reader (its store and user)."""
    return request.app.state.reader


def thread_cursor(query: Any) -> tuple[str, str] | None:
    """``before_at`` and ``before_thread`` (both or neither): where a threads page starts."""
    before_at, before_thread = params.text(query, "before_at"), params.text(query, "before_thread")
    if (before_at is None) != (before_thread is None):
        missing = "before_thread" if before_thread is None else "before_at"
        raise params.ParamError(missing, "give before_at and before_thread together")
    if before_at is None or before_thread is None:
        return None
    try:  # checked here to name the parameter; the store would only raise ValueError
        return normalise_created_at(before_at, "before_at"), before_thread
    except ValueError:
        raise params.ParamError(
            "before_at", f"must be an ISO-8601 time (the previous page's next), got {before_at!r}"
        ) from None


async def threads(request: Request) -> Response:
    """``GET /api/threads``: threads, most recent activity first (``limit``, ``before_at`` and
    ``before_thread`` from the previous page's ``next``)."""
    limit = params.limit(request.query_params, 50)
    page = await reader(request).threads(limit, thread_cursor(request.query_params))
    last = page[-1] if len(page) == limit else None
    following = (
        None if last is None else {"before_at": last.last_event_at, "before_thread": last.thread_id}
    )
    return JSONResponse({"threads": [t.to_json_dict() for t in page], "next": following})


async def runs(request: Request) -> Response:
    """``GET /api/threads/{thread_id}/runs``: the thread's run summaries, newest first
    (``limit``, ``status``, ``before``: the last run id of the previous page)."""
    query = request.query_params
    limit = params.limit(query, 50)
    page = await reader(request).runs(
        path_id(request.path_params, "thread_id"),
        limit,
        params.text(query, "before"),
        params.status(query),
    )
    following = page[-1].run_id if len(page) == limit else None
    return JSONResponse({"runs": [s.to_json_dict() for s in page], "next_before": following})


async def messages_page(request: Request) -> Response:
    """``GET /api/threads/{thread_id}/messages/page``: the visible messages of a page of the
    thread's message rows (``before_seq``, ``limit``: the latest page without ``before_seq``)."""
    query = request.query_params
    limit = params.limit(query, 50)
    page = await reader(request).messages(
        path_id(request.path_params, "thread_id"), limit, params.count(query, "before_seq")
    )
    return JSONResponse(
        {"messages": page.messages, "has_more": page.has_more, "before_seq": page.before_seq}
    )


async def events(request: Request) -> Response:
    """``GET /api/threads/{thread_id}/runs/{run_id}/events``: the run's events in seq order
    (``event_types``, ``task_id``, ``limit``, ``after_seq``; filters before the limit)."""
    query = request.query_params
    limit = params.limit(query, 500)
    page = await reader(request).events(
        path_id(request.path_params, "thread_id"),
        path_id(request.path_params, "run_id"),
        event_types=params.texts(query, "event_types"),
        task_id=params.text(query, "task_id"),
        limit=limit,
        after_seq=params.count(query, "after_seq"),
    )
    has_more = len(page) == limit
    return JSONResponse(
        {"events": page, "has_more": has_more, "after_seq": page[-1]["seq"] if has_more else None}
    )


async def workspace_changes(request: Request) -> Response:
    """``GET /api/threads/{thread_id}/runs/{run_id}/workspace-changes``: the run's latest
    ``workspace_changes`` payload (``null`` when the run changed no file)."""
    thread_id = path_id(request.path_params, "thread_id")
    run_id = path_id(request.path_params, "run_id")
    payload = await reader(request).workspace_changes(thread_id, run_id)
    return JSONResponse({"thread_id": thread_id, "run_id": run_id, "workspace_changes": payload})


def routes() -> list[Route]:
    """The API's routes (GET only: the viewer never writes)."""
    return [
        Route("/api/threads", threads, methods=["GET"]),
        Route("/api/threads/{thread_id}/runs", runs, methods=["GET"]),
        Route("/api/threads/{thread_id}/messages/page", messages_page, methods=["GET"]),
        Route("/api/threads/{thread_id}/runs/{run_id}/events", events, methods=["GET"]),
        Route(
            "/api/threads/{thread_id}/runs/{run_id}/workspace-changes",
            workspace_changes,
            methods=["GET"],
        ),
    ]
