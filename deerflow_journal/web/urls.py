"""Thread and run ids in the viewer's URL paths: ``url`` builds them, ``path_id`` reads them.

Ids are free text, so each id is one percent-encoded path segment (``quote(id, safe="")``:
``team/a 1%`` is ``team%2Fa%201%25``; ``EncodedSlashes`` in app.py keeps an encoded "/" inside
its segment). Browsers and URL parsers drop or fold the segments ``.`` and ``..`` even when
they are written ``%2E`` (WHATWG URL), so those two ids get the escape prefix ``~``: ``.`` is
``/threads/~.``. So does an id of tildes then ``.`` or ``..`` (``~..`` is ``~~..``), and reading
removes one ``~`` from such a segment only. Every other id keeps its plain form
(``/threads/thread-1``, ``/threads/~x``): a URL built before this rule means what it meant.

The API's paths are the pages' paths after ``/api``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, unquote

from deerflow_journal.records import check_text
from deerflow_journal.web.params import ParamError

__all__ = ["ESCAPE", "ROOT_KEY", "path_id", "url", "viewer_root"]

#: Starts an escaped id's segment; "~" is never percent-encoded, so it reaches the app as is.
ESCAPE = "~"


#: The scope key holding the viewer's own root path, recorded as a request enters the viewer.
ROOT_KEY = "deerflow_journal.root"


def viewer_root(scope: Mapping[str, Any]) -> str:
    """The path the viewer is mounted at (``""`` at the server's root), for its links."""
    return scope.get(ROOT_KEY, scope.get("root_path", ""))


def _dots(text: str) -> bool:
    """``.`` or ``..``, after any escapes."""
    return text.lstrip(ESCAPE) in (".", "..")


def _segment(id_: str) -> str:
    return quote(ESCAPE + id_ if _dots(id_) else id_, safe="")


def url(thread_id: str, run_id: str | None = None) -> str:
    """``/threads/{thread}`` or ``/threads/{thread}/runs/{run}``, the ids encoded as above."""
    path = f"/threads/{_segment(thread_id)}"
    return path if run_id is None else f"{path}/runs/{_segment(run_id)}"


def path_id(path_params: Mapping[str, str], name: str) -> str:
    """The id ``name`` (``thread_id``, ``run_id``) of the route's path, checked like the store
    does; a bad one is a ``ParamError``."""
    # "/" and "%" reach the route still encoded (``EncodedSlashes``).
    segment = unquote(path_params[name])
    if _dots(segment):
        segment = segment.removeprefix(ESCAPE)
    try:
        return check_text(segment, name)
    except (TypeError, ValueError) as exc:
        raise ParamError(name, str(exc)) from None
