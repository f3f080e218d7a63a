"""Event loops the journal runs store coroutines on.

Callbacks are plain functions and may run on an event loop (``ainvoke``), on a thread with no
loop at all (``invoke``) or on a loop they are blocking (``invoke`` inside Jupyter). Store work
therefore goes either to the caller's running loop or to one process-wide background loop in a
daemon thread, which never keeps the interpreter from exiting.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import weakref
from types import FrameType
from typing import TypeGuard

from langchain_core.callbacks import manager as callback_manager

__all__ = [
    "background_loop",
    "dispatched_synchronously",
    "is_background_loop",
    "looked_up_by_async_dispatcher",
    "loop_ending",
    "on_background_loop",
    "running_loop",
    "takes_work",
]

# LangChain's dispatchers live in this module; ``handle_event`` is its (public) sync one.
_MANAGER_GLOBALS = vars(callback_manager)
_SYNC_DISPATCH = callback_manager.handle_event.__code__
_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
#: Loops shutting down: still running their last work, but closing before new work ends.
_ENDING: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


def background_loop() -> asyncio.AbstractEventLoop:
    """Return the journal's background loop, started in a daemon thread on first use.

    Raises ``RuntimeError`` once the interpreter is finalizing (a generator left open is
    closed then): no thread starts, and the loop's own thread never runs again.
    """
    global _loop
    if sys.is_finalizing():
        raise RuntimeError("the journal's event loop cannot run: the interpreter is exiting")
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=loop.run_forever, name="deerflow-journal-loop", daemon=True
            )
            thread.start()
            _loop = loop
        return _loop


def is_background_loop(loop: asyncio.AbstractEventLoop | None) -> bool:
    """Tell whether ``loop`` is the journal's background loop."""
    return loop is not None and loop is _loop


def on_background_loop() -> bool:
    """Tell whether this thread runs the background loop (which must never block on itself)."""
    return is_background_loop(running_loop())


def loop_ending(loop: asyncio.AbstractEventLoop) -> None:
    """Note that ``loop`` shuts down (``asyncio.run`` finalises its async generators)."""
    _ENDING.add(loop)


def takes_work(loop: asyncio.AbstractEventLoop | None) -> TypeGuard[asyncio.AbstractEventLoop]:
    """Tell whether work sent to ``loop`` from another thread will run: it runs and is not
    shutting down."""
    return loop is not None and loop.is_running() and loop not in _ENDING


def running_loop() -> asyncio.AbstractEventLoop | None:
    """Return the loop running in this thread, or ``None``."""
    # What ``get_running_loop`` reads, without raising and catching a RuntimeError on every
    # call from a thread with no loop (a plain ``invoke``): several calls a run.
    return asyncio._get_running_loop()


def dispatched_synchronously() -> bool:
    """Tell whether the current callback came from LangChain's sync callback manager.

    A sync ``invoke`` inside Jupyter runs on a thread whose loop is running but blocked by
    the call, so "is a loop running" cannot tell ``invoke`` from ``ainvoke``; the dispatcher
    that called us can: the nearest caller defined in LangChain's callback manager module is
    its public ``handle_event`` for the sync manager, another of its functions for the async
    one. Without either on the stack, a running loop means async.
    """
    frame: FrameType | None = sys._getframe()  # inspect.currentframe(), without its call
    for _ in range(14):
        if frame is None:
            break
        if frame.f_globals is _MANAGER_GLOBALS:
            return frame.f_code is _SYNC_DISPATCH
        frame = frame.f_back
    return running_loop() is None


def looked_up_by_async_dispatcher() -> bool:
    """Tell whether the attribute being read (by a property calling this) is looked up by
    LangChain's async callback dispatcher, which awaits a coroutine function it gets.

    The sync dispatcher calls what it gets and only runs a coroutine on a throwaway loop, and
    any other caller (a subclass's ``super()`` call, a test) expects a plain method.
    """
    frame = sys._getframe()
    reader = None if frame.f_back is None else frame.f_back.f_back
    return (
        reader is not None
        and reader.f_globals is _MANAGER_GLOBALS
        and reader.f_code is not _SYNC_DISPATCH
    )
