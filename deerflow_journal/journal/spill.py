"""``SpillFile``: the events a journal buffers past its memory bound, in a temporary file.

A journal whose store is down keeps at most ``max_buffered_events`` in memory; the events after
those go, in order, to one file of JSON lines in a directory of its own under the system's
temporary directory, and are read back (oldest first) once the store answers. Each line is an
event as ``put_batch`` takes it, encoded like every store write (``records.encode_json``, with
LangChain messages as their ``model_dump()``), so it reads back as what the journal would have
written. The directory is removed once every event is read back. A process that exits with
events still spilled keeps the file and says where it is at ERROR; one killed before it could
say so is reported by the next process that starts a journal.
"""

from __future__ import annotations

import atexit
import contextlib
import inspect
import logging
import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from deerflow_journal.journal.mapping import MessageEncoder
from deerflow_journal.records import decode_json, encode_json

__all__ = ["SPILL_PREFIX", "SpillFile", "report_leftover_spills"]

logger = logging.getLogger(__name__)

#: How a spill directory's name starts; the owning process's id follows.
SPILL_PREFIX = "deerflow-journal-spill-"
_FILE_NAME = "events.jsonl"

# Spill files holding events, reported at exit if they still do then (held strongly: a
# journal dropped meanwhile still has its file reported).
_HOLDING: set[SpillFile] = set()
_leftovers_checked = False
_leftovers_lock = threading.Lock()


class SpillFile:
    """A first-in, first-out file of journal events, created on the first ``append``.

    Not thread-safe: its journal's buffer calls it under its own lock.

    Args:
        in_memory: How many more events the journal holds in memory (said at exit: those
            are lost with the process); called without the buffer's lock.
    """

    def __init__(self, in_memory: Callable[[], int] = lambda: 0) -> None:
        # A method of the buffer that owns this file is held weakly (strongly it would keep a
        # dropped journal alive), and strongly only while events are spilled, so that the exit
        # report still counts what its owner held.
        self._in_memory: Callable[[], Callable[[], int] | None] = (
            weakref.WeakMethod(in_memory) if inspect.ismethod(in_memory) else lambda: in_memory
        )
        self._pinned: Callable[[], int] | None = None
        self._dir: Path | None = None
        self._writer: IO[bytes] | None = None
        self._reader: IO[bytes] | None = None
        #: Events appended and not read back yet.
        self.count = 0

    @property
    def path(self) -> Path | None:
        """The file while it holds events, else ``None``."""
        return None if self._dir is None else self._dir / _FILE_NAME

    def append(self, event: dict[str, Any]) -> None:
        """Add ``event`` at the end; raise what encoding it raises (it could not be stored)."""
        line = encode_json(event, MessageEncoder()).encode() + b"\n"
        if self._writer is None:
            self._open()
        assert self._writer is not None
        self._writer.write(line)
        self.count += 1

    def read(self, limit: int) -> list[dict[str, Any]]:
        """Take up to ``limit`` events from the front; the file goes once it is emptied."""
        if not self.count or self._writer is None or self._reader is None:
            return []
        try:
            self._writer.flush()
            lines = [self._reader.readline() for _ in range(min(limit, self.count))]
            events = [decode_json(line) for line in lines]
        except (OSError, ValueError) as exc:  # a full disk cut a line short, say
            logger.error(
                "journal cannot read back the %d events it spilled to %s (%r): they are lost "
                "(the file is kept)",
                self.count,
                self.path,
                exc,
            )
            self._forget()
            return []
        self.count -= len(events)
        if not self.count:
            self.remove()
        return events

    def remove(self) -> None:
        """Delete the file and its directory, with whatever they hold."""
        if self._dir is not None:
            self._close_handles()
            shutil.rmtree(self._dir, ignore_errors=True)
        self._forget()

    def _close_handles(self) -> None:
        for handle in (self._writer, self._reader):
            if handle is not None:
                with contextlib.suppress(OSError):
                    handle.close()

    def _forget(self) -> None:
        """Start afresh, leaving the file where it is."""
        self._close_handles()
        self._dir = self._writer = self._reader = None
        self.count = 0
        _HOLDING.discard(self)
        self._pinned = None

    def _open(self) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix=f"{SPILL_PREFIX}{os.getpid()}-"))
        path = self._dir / _FILE_NAME
        self._writer = open(path, "xb")  # noqa: SIM115 - held open while events are spilled
        self._reader = open(path, "rb")  # noqa: SIM115
        _HOLDING.add(self)
        self._pinned = self._in_memory()

    def report_at_exit(self) -> None:
        """Keep the file for the user and say at ERROR where it is and what it holds."""
        if not self.count or self._writer is None:
            return
        with contextlib.suppress(OSError):
            self._writer.flush()
        logger.error(
            "journal exits with %d events its store did not take, kept in %s (one event a "
            "line, as `store.put_batch` takes them), and %d more in memory, lost",
            self.count,
            self.path,
            self._held_in_memory(),
        )

    def _held_in_memory(self) -> int:
        counter = self._pinned or self._in_memory()
        return 0 if counter is None else counter()


@atexit.register
def _report_at_exit() -> None:
    for spill in list(_HOLDING):
        spill.report_at_exit()


def report_leftover_spills(directory: str | None = None, *, again: bool = False) -> list[Path]:
    """Say at ERROR which spill files processes that have ended left behind; return them.

    Runs once per process (``again``: once more); ``directory`` defaults to the system's
    temporary directory.
    """
    global _leftovers_checked
    if _leftovers_checked and not again:  # every journal asks: the common case, unlocked
        return []
    with _leftovers_lock:
        if _leftovers_checked and not again:
            return []
        _leftovers_checked = True
    found = []
    root = Path(directory or tempfile.gettempdir())
    with contextlib.suppress(OSError):
        for entry in root.iterdir():
            pid = _owner(entry.name)
            path = entry / _FILE_NAME
            if pid is None or _alive(pid) or not path.is_file():
                continue
            found.append(path)
            logger.error(
                "journal found events a process (pid %d) spilled and never wrote, kept in %s "
                "(%d bytes; one event a line, as `store.put_batch` takes them): write them "
                "with put_batch, then delete %s",
                pid,
                path,
                path.stat().st_size,
                entry,
            )
    return found


def _owner(name: str) -> int | None:
    """The process id in a spill directory's name, else ``None``."""
    if not name.startswith(SPILL_PREFIX):
        return None
    pid, _, _ = name.removeprefix(SPILL_PREFIX).partition("-")
    return int(pid) if pid.isascii() and pid.isdigit() else None


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process
        return True
    return True
