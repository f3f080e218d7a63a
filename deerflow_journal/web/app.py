"""``create_app``: the viewer as a Starlette ASGI app over one read-only store.

Every response carries a strict Content-Security-Policy (scripts and styles only from the
app's own static files, no inline script, nothing from elsewhere): event payloads are model
output, so the pages escape them and the browser would refuse to run anything that slipped
through. Only GET (and HEAD) routes exist: the viewer never writes.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from deerflow_journal.records import check_text
from deerflow_journal.stores import open_store
from deerflow_journal.stores.base import RunEventStore
from deerflow_journal.web import api, pages
from deerflow_journal.web.params import ParamError
from deerflow_journal.web.reads import NotFound, Reader
from deerflow_journal.web.urls import ROOT_KEY, viewer_root

__all__ = ["CONTENT_SECURITY_POLICY", "create_app"]

logger = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"

#: Same-origin scripts, styles, images and fetches only; no inline script or style, no frames,
#: no plugins, forms only back to the viewer.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
_HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
]


class _HttpMiddleware:
    """An ASGI middleware for HTTP requests (``http``); other scopes pass through."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self.http(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Handle one HTTP request."""
        raise NotImplementedError


class SecurityHeaders(_HttpMiddleware):
    """Adds the security headers to every HTTP response (pages, API, static files, errors)."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Send the response with the headers added."""

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def host_name(header: str) -> str:
    """The host of a ``Host`` header, without its port (``[::1]:8765`` -> ``[::1]``)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[: header.find("]") + 1] if "]" in header else header
    return header.split(":", 1)[0]


class AllowedHosts:
    """Answers 400 to a request whose ``Host`` is not one of ``hosts`` (IPv6 in brackets)."""

    def __init__(self, app: ASGIApp, hosts: Sequence[str]) -> None:
        self.app = app
        self.hosts = frozenset(
            host_name(h if ":" not in h or h[0] == "[" else f"[{h}]") for h in hosts
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            headers = dict(scope["headers"])
            if host_name(headers.get(b"host", b"").decode("latin-1")) not in self.hosts:
                response = Response("Invalid host header", status_code=400)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class ViewerRoot(_HttpMiddleware):
    """Records where the viewer is mounted as a request enters it (``urls.viewer_root``).

    A mount inside the viewer (``/static``) extends ``root_path`` before a handler or an
    error page sees the scope; links are made from the viewer's own root all the same.
    """

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on with the viewer's root recorded."""
        await self.app({**scope, ROOT_KEY: scope.get("root_path", "")}, receive, send)


def _segment(raw: str) -> str:
    """A path segment as sent, decoded but for "%" and "/", which stay percent-encoded."""
    return unquote(raw).replace("%", "%25").replace("/", "%2F")


class EncodedSlashes(_HttpMiddleware):
    """Routes on the path as the client sent it, so an id holding "/" stays one segment.

    ASGI servers decode ``%2F`` before routing, which would split ``/threads/a%2Fb`` into
    more segments than any route has. The path is rebuilt from ``raw_path`` segment by
    segment, "/" and "%" inside a segment left encoded; ``urls.path_id`` decodes the ids.
    """

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on with its path as sent."""
        path = scope["path"]
        raw = scope.get("raw_path")
        routed = None
        if raw:
            text = raw.decode("latin-1").split("?", 1)[0]
            routed = "/".join(_segment(part) for part in text.split("/"))
            if unquote(routed) != path:  # raw_path is not this path (say, a proxy's)
                routed = None
        if routed is None:  # no "/" inside a segment can be told apart here
            routed = path.replace("%", "%25")
        await self.app({**scope, "path": routed}, receive, send)


def _wants_json(request: Request) -> bool:
    # The path below the app's mount point: under a root path, /viewer/api/... is the API too.
    return request.scope["path"].removeprefix(viewer_root(request.scope)).startswith("/api/")


async def _not_found(request: Request, exc: Exception) -> Response:
    return _error(request, 404, str(exc) if isinstance(exc, NotFound) else "no such page")


async def _bad_param(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ParamError)
    return _error(request, 422, str(exc), parameter=exc.name)


class ServerErrors(_HttpMiddleware):
    """Answers an unexpected exception (a store that fails, a bug) with the viewer's error,
    JSON or a page, status 500, and logs it with its traceback.

    Inside ``SecurityHeaders``, so the answer carries the headers; Starlette's own handler
    for ``Exception`` runs outside every middleware and would answer without them.
    """

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on; answer an exception that comes back before a response."""
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            if started:  # too late for another answer: the server closes the connection
                raise
            logger.error("%s %s failed", scope.get("method"), scope.get("path"), exc_info=exc)
            # The type only: a store's message may name its host or file; the log has it all.
            message = f"the viewer could not answer: {type(exc).__name__} (see the server's log)"
            await _error(Request(scope), 500, message)(scope, receive, send)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return _error(request, exc.status_code, str(exc.detail), headers=exc.headers)


def _error(
    request: Request,
    status: int,
    message: str,
    *,
    parameter: str | None = None,
    headers: Any = None,
) -> Response:
    if _wants_json(request):
        body: dict[str, Any] = {"error": message, "status": status}
        if parameter is not None:
            body["parameter"] = parameter
        return api.JSONResponse(body, status_code=status, headers=headers)
    return pages.error_page(request, status, message, headers=headers)


def create_app(
    store: RunEventStore | str | None = None,
    *,
    user_id: str | None = None,
    allowed_hosts: Sequence[str] | None = None,
    poll_interval: float = 1.0,
) -> Starlette:
    """The viewer over ``store``: a store URL (``None``: the default store) the app opens
    read-only while it runs, or a read-only store the caller has set up and will close.

    Args:
        store: What to show.
        user_id: Show only this user's rows (``None``: every user's).
        allowed_hosts: ``Host`` headers accepted (``None``: any); a loopback server lists its
            own names, so a web page elsewhere cannot reach it through DNS rebinding.
        poll_interval: Seconds between a live timeline's checks for new events.
    """
    if user_id is not None:
        check_text(user_id, "user_id")
    if isinstance(store, RunEventStore) and not store.read_only:
        raise ValueError(
            "the viewer only reads: pass a store opened with read_only=True, or a store URL"
        )
    if not 0 < poll_interval <= 3600:
        raise ValueError(f"poll_interval must be above 0 and at most 3600, got {poll_interval}")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if isinstance(store, RunEventStore):
            app.state.reader = Reader(store, user_id)
            yield
            return
        async with open_store(store, read_only=True) as opened:
            app.state.reader = Reader(opened, user_id)
            yield

    middleware = [
        Middleware(SecurityHeaders),
        Middleware(ViewerRoot),
        Middleware(EncodedSlashes),
        Middleware(ServerErrors),
    ]
    if allowed_hosts is not None:
        middleware.append(Middleware(AllowedHosts, hosts=list(allowed_hosts)))
    app = Starlette(
        routes=[
            *api.routes(),
            *pages.routes(),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ],
        middleware=middleware,
        exception_handlers={
            NotFound: _not_found,
            ParamError: _bad_param,
            HTTPException: _http_error,
        },
        lifespan=lifespan,
    )
    app.state.poll_interval = poll_interval
    if isinstance(store, RunEventStore):
        # Usable without the lifespan too (an in-process client that does not run it).
        app.state.reader = Reader(store, user_id)
    return app
