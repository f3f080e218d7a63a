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

__all__ = [
    "background_loop",
    "dispatched_synchronously",
    "looked_up_by_async_dispatcher",
    "on_background_loop",
    "running_loop",
]

_MANAGER = "langchain_core.callbacks.manager"
_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def background_loop() -> asyncio.AbstractEventLoop:
    """Return the journal's background loop, started in a daemon thread on first use."""
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=loop.run_forever, name="deerflow-journal-loop", daemon=True
            )
            thread.start()
            _loop = loop
        return _loop


def on_background_loop() -> bool:
    """Tell whether this thread runs the background loop (which must never block on itself)."""
    return _loop is not None and running_loop() is _loop


def running_loop() -> asyncio.AbstractEventLoop | None:
    """Return the loop running in this thread, or ``None``."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def dispatched_synchronously() -> bool:
    """Tell whether the current callback came from LangChain's sync callback manager.

    A sync ``invoke`` inside Jupyter runs on a thread whose loop is running but blocked by
    the call, so "is a loop running" cannot tell ``invoke`` from ``ainvoke``; the dispatcher
    that called us can.
    """
    frame = sys._getframe(1)
    for _ in range(12):
        frame = frame.f_back
        if frame is None:
            break
        if frame.f_globals.get("__name__") == _MANAGER:
            return frame.f_code.co_name == "handle_event"
    return running_loop() is None


def looked_up_by_async_dispatcher() -> bool:
    """Tell whether the attribute being read (by a property calling this) is looked up by
    LangChain's async callback dispatcher, which awaits a coroutine function it gets.

    The sync dispatcher calls what it gets and only runs a coroutine on a throwaway loop, and
    any other caller (a subclass's ``super()`` call, a test) expects a plain method.
    """
    frame = sys._getframe(2)  # 0: here, 1: the property, 2: whoever read it
    return frame.f_globals.get("__name__") == _MANAGER and frame.f_code.co_name != "handle_event"
