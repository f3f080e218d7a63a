"""Query parameters of the viewer's routes, checked: a bad one is a ``ParamError`` (HTTP 422)."""

from __future__ import annotations

from collections.abc import Mapping

from starlette.datastructures import QueryParams

from deerflow_journal.records import check_text
from deerflow_journal.summary import RUN_STATUSES, RunStatus

__all__ = ["MAX_LIMIT", "ParamError", "count", "limit", "status", "text", "texts"]

#: The largest page a route returns, so one request cannot ask the store for everything.
MAX_LIMIT = 1000


class ParamError(ValueError):
    """A query parameter the route cannot use; ``name`` says which."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name
        self.message = message


def _one(params: QueryParams | Mapping[str, str], name: str) -> str | None:
    if isinstance(params, QueryParams) and len(params.getlist(name)) > 1:
        raise ParamError(name, "give it once")
    return params.get(name)


def count(params: QueryParams | Mapping[str, str], name: str) -> int | None:
    """A non-negative whole number, or ``None`` when absent."""
    raw = _one(params, name)
    if raw is None:
        return None
    if not raw.isascii() or not raw.isdigit():
        raise ParamError(name, f"must be a non-negative whole number, got {raw!r}")
    value = int(raw)
    if value > 2**63 - 1:
        raise ParamError(name, f"must be at most {2**63 - 1}, got {raw}")
    return value


def limit(params: QueryParams | Mapping[str, str], default: int) -> int:
    """``limit``: 1 to ``MAX_LIMIT`` (``default`` when absent)."""
    value = count(params, "limit")
    if value is None:
        return default
    if not 1 <= value <= MAX_LIMIT:
        raise ParamError("limit", f"must be 1 to {MAX_LIMIT}, got {value}")
    return value


def text(params: QueryParams | Mapping[str, str], name: str) -> str | None:
    """An id-like text (what the store accepts as an id), or ``None`` when absent."""
    raw = _one(params, name)
    if raw is None:
        return None
    try:
        return check_text(raw, name)
    except (TypeError, ValueError) as exc:
        raise ParamError(name, str(exc)) from None


def texts(params: QueryParams, name: str) -> list[str] | None:
    """Texts given as repeated parameters or comma-separated (``a,b`` or ``a&name=b``)."""
    given = params.getlist(name)
    if not given:
        return None
    values = [part.strip() for raw in given for part in raw.split(",")]
    for value in values:
        try:
            check_text(value, name, 32)
        except (TypeError, ValueError) as exc:
            raise ParamError(name, str(exc)) from None
    return values


def status(params: QueryParams | Mapping[str, str]) -> RunStatus | None:
    """``status``: one of the run statuses, or ``None`` when absent."""
    raw = _one(params, "status")
    if raw is None:
        return None
    if raw not in RUN_STATUSES:
        raise ParamError("status", f"must be one of {', '.join(RUN_STATUSES)}, got {raw!r}")
    return raw  # type: ignore[return-value]
