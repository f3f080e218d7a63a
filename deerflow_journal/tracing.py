"""Journal every LangChain/LangGraph root run of a process without passing callbacks.

Three switches, like LangSmith's tracing variable: ``DEERFLOW_JOURNAL_TRACING=true`` in the
environment (the store from ``DEERFLOW_JOURNAL_URL``, else the default), ``enable()`` /
``disable()`` for the whole process, and ``with journaling():`` for the code inside the block
(its context, which asyncio tasks and LangChain's executor threads inherit).

They work through langchain-core's configure hook (``register_configure_hook``): whenever
LangChain sets up the callbacks of a call, it asks the hook for the active journal and adds it
unless a ``RunJournal`` is among the callbacks already, so a call that got a journal explicitly
is journaled once. Nested calls inherit the journal, and a ``RunJournal`` without a fixed run
id starts a run at each root call, keyed by its LangChain run id: one run per root invocation,
from any thread or event loop. The journal opens its own store and writes it on its background
loop; what it still holds when the program exits is written then.

An installed package also ships ``deerflow_journal_tracing.pth``, which imports this package at
interpreter start-up when the variable is set, so a program that never imports
deerflow-journal is journaled too.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, cast

from langchain_core.tracers.context import register_configure_hook
from langchain_core.utils.env import env_var_is_set

from deerflow_journal.journal import RunJournal

__all__ = ["TRACING_ENV", "active_journal", "disable", "enable", "journaling"]

#: The environment variable that journals every root run of a process (as LangChain reads
#: its own: set and not ``""``, ``"0"``, ``"false"`` or ``"False"``).
TRACING_ENV = "DEERFLOW_JOURNAL_TRACING"

logger = logging.getLogger(__name__)

_scoped: ContextVar[RunJournal | None] = ContextVar("deerflow_journal_scoped", default=None)
_lock = threading.Lock()
_process: RunJournal | None = None  # enable()'s, or the one the variable started
_disabled = False  # disable() was called, or the variable's journal could not open its store


def active_journal() -> RunJournal | None:
    """The journal new root runs started here go to, or ``None``.

    ``journaling()``'s, else the process's (the first call with the variable set opens it).
    """
    scoped = _scoped.get()
    if scoped is not None:
        return scoped
    return _process or _from_environment()


def _from_environment() -> RunJournal | None:
    global _process, _disabled
    if _disabled or not env_var_is_set(TRACING_ENV):
        return None
    with _lock:
        if _process is None and not _disabled:
            try:
                _process = RunJournal()
            except Exception as exc:  # a bad $DEERFLOW_JOURNAL_URL, say: the agent runs on
                _disabled = True  # said once, not at every call
                logger.error("%s is set but runs are not journaled: %s", TRACING_ENV, exc)
        return _process


def enable(url: str | None = None, **options: Any) -> RunJournal:
    """Journal every root run of the process from now on; return the journal.

    Args:
        url: The store URL (``None``: ``$DEERFLOW_JOURNAL_URL``, else the default SQLite file).
            The journal opens the store and closes it when ``disable()`` is called or the
            program exits.
        **options: Keyword options of ``RunJournal`` (``workspace_roots``, ...).

    A journal enabled before (by this function or by the variable) is closed and replaced.
    """
    global _process, _disabled
    journal = RunJournal(event_store=url, **options)
    with _lock:
        previous, _process, _disabled = _process, journal, False
    if previous is not None:
        previous.close()
    return journal


def disable() -> None:
    """Stop journaling new root runs of the process, the variable's too.

    Runs in progress finish; everything the journal holds is written before this returns.
    """
    global _process, _disabled
    with _lock:
        previous, _process, _disabled = _process, None, True
    if previous is not None:
        previous.close()


@contextmanager
def journaling(url: str | None = None, **options: Any) -> Iterator[RunJournal]:
    """Journal every root run started inside the block; yield the journal.

    The block's context decides (asyncio tasks and LangChain's worker threads started in it
    inherit it; a ``threading.Thread`` does not: use ``enable()`` there). It wins over
    ``enable()`` and the variable. Leaving the block writes everything and closes the store.
    ``url`` and ``options`` are those of ``enable()``.
    """
    journal = RunJournal(event_store=url, **options)
    token = _scoped.set(journal)
    try:
        yield journal
    finally:
        _scoped.reset(token)
        journal.close()


class _HookVariable:
    """What langchain-core's configure hook reads: only ``get()``, as of a ``ContextVar``.

    A ``ContextVar`` cannot carry ``enable()``'s journal: threads start with an empty context.
    """

    def get(self) -> RunJournal | None:
        return active_journal()


# ``RunJournal`` as the handler class: LangChain adds the hook's journal to a call only when
# no RunJournal (an explicit one, or the one a parent call inherited) is among its callbacks.
register_configure_hook(
    cast("ContextVar[Any | None]", _HookVariable()), inheritable=True, handle_class=RunJournal
)
