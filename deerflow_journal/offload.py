"""``to_thread``: ``asyncio.to_thread`` that still works while the program exits.

Python shuts the default executor down before ``atexit`` handlers run, and ``asyncio.run``
shuts its loop's executor down when its main task ends; from then on ``to_thread`` raises
``RuntimeError`` without running anything. A journal writes what it still holds exactly then
(its ``atexit`` handler, its loop-closing guard), so file work it hands to a thread would fail
and leave events in a spill file although their store is there. Here the call runs on the
calling thread instead: blocking the loop briefly is better than losing the write.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

__all__ = ["to_thread"]

P = ParamSpec("P")
T = TypeVar("T")


async def to_thread(func: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """Run ``func`` in the loop's default executor, or here once that refuses new work."""
    call = functools.partial(contextvars.copy_context().run, func, *args, **kwargs)
    try:
        future = asyncio.get_running_loop().run_in_executor(None, call)
    except RuntimeError:  # "cannot schedule new futures after (interpreter) shutdown"
        future = None
    # Called outside the handler: an error of its own is not chained to the refusal.
    return call() if future is None else await future
