"""Store backends and ``open_store``, which builds one from a URL."""

from __future__ import annotations

import importlib
import os
from typing import Any

from deerflow_journal.stores.base import JournalStore, ReadOnlyStoreError, RunEventStore
from deerflow_journal.stores.browsing import ThreadInfo

__all__ = [
    "DEFAULT_STORE_URL",
    "STORE_URL_ENV",
    "JournalStore",
    "ReadOnlyStoreError",
    "RunEventStore",
    "ThreadInfo",
    "default_store_url",
    "open_store",
]

STORE_URL_ENV = "DEERFLOW_JOURNAL_URL"
DEFAULT_STORE_URL = "sqlite:///.deer-flow/journal.db"

# scheme -> (module, class, whether the rest of the URL is a path)
_SCHEMES: dict[str, tuple[str, str, bool]] = {
    "memory": ("deerflow_journal.stores.memory", "MemoryRunEventStore", False),
    "jsonl": ("deerflow_journal.stores.jsonl", "JsonlRunEventStore", True),
    "sqlite": ("deerflow_journal.stores.sqlite", "SqliteRunEventStore", True),
    "postgresql": ("deerflow_journal.stores.postgres", "PostgresRunEventStore", False),
    "postgres": ("deerflow_journal.stores.postgres", "PostgresRunEventStore", False),
}


def default_store_url() -> str:
    """Return ``$DEERFLOW_JOURNAL_URL``, else the default SQLite file under ``.deer-flow/``."""
    return os.environ.get(STORE_URL_ENV) or DEFAULT_STORE_URL


def open_store(url: str | None = None, *, read_only: bool = False, **options: Any) -> RunEventStore:
    """Build the store a URL names; ``None`` means ``default_store_url()``.

    ``memory://``, ``jsonl:///dir``, ``sqlite:///path.db`` and ``postgresql://...``. As in
    SQLAlchemy URLs, three slashes start a relative path and four an absolute one
    (``sqlite:////var/lib/journal.db``). Extra keyword options (``max_trace_content``,
    ``max_outputs_content``) go to the store's constructor. The store is not set up yet: use
    ``async with open_store(url)``.

    ``read_only=True`` opens a store that only reads: it refuses writes and deletes with
    ``ReadOnlyStoreError``, creates and migrates nothing, and reads SQLite files and JSONL
    directories on storage this process cannot write. A keyword, not a URL option, so that the
    URL stays just a location and a URL taken from the environment cannot change what the
    code that opens it may do.
    """
    from_env = url is None and bool(os.environ.get(STORE_URL_ENV))
    if url is None:
        url = default_store_url()
    if not isinstance(url, str):
        raise TypeError(f"store URL must be a string, got {type(url).__name__}")
    try:
        module_name, class_name, args = _parse(url)
    except ValueError as exc:
        if from_env:  # the caller passed no URL: tell them where the bad one came from
            raise ValueError(f"{exc} (from ${STORE_URL_ENV})") from None
        raise
    if read_only:
        options["read_only"] = True
    store_class = getattr(importlib.import_module(module_name), class_name)
    return store_class(*args, **options)


def _parse(url: str) -> tuple[str, str, tuple[str, ...]]:
    """The module, class and constructor arguments of the store ``url`` names."""
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower().split("+", 1)[0]
    if not sep or scheme not in _SCHEMES:
        known = ", ".join(f"{s}://" for s in _SCHEMES)
        raise ValueError(f"unknown store URL {url!r}; known schemes: {known}")
    module_name, class_name, takes_path = _SCHEMES[scheme]
    if scheme == "memory":
        if rest:
            raise ValueError(f"memory:// takes no path, got {url!r}")
        args: tuple[str, ...] = ()
    elif takes_path:
        if not rest.startswith("/") or rest == "/":
            raise ValueError(
                f"{scheme} URL needs a path after three slashes ({scheme}:///relative or "
                f"{scheme}:////absolute), got {url!r}"
            )
        if "?" in rest or "#" in rest:  # SQLAlchemy would read options there: say so, not guess
            raise ValueError(
                f"{scheme} URLs take a path only (no ?query or #fragment), got {url!r}"
            )
        args = (rest[1:],)
    else:
        args = (f"postgresql://{rest}",)
    return module_name, class_name, args
