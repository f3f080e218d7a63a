"""``SpillFile``: the events (or run summaries) a journal buffers past its memory bound, in a
temporary file.

A journal whose store is down keeps at most ``max_buffered_events`` in memory; the events after
those go, in order, to one file of JSON lines in a directory of its own under the system's
temporary directory, and are read back (oldest first) once the store answers. Each line is an
event as ``put_batch`` takes it, encoded like every store write (``records.encode_json``, with
LangChain messages as their ``model_dump()``), so it reads back as what the journal would have
written. The directory is removed once every event is read back. Beside the file, the offset
of the first line not read back yet is kept, so that a file a killed process left is cut down
to the events it never took back, and reported so by the next process that starts a journal.
The owning process holds a lock on a file in the directory while it is open: a directory whose
lock is free was left by a process that ended, even if a new process has its id since (a
container's main process always has the same one).
A process that exits with events unwritten has its journal save them all (those in memory
first) with ``SpillFile.save`` and say where at ERROR. Run summaries past the journal's bound
go the same way, to a file of their own (``SUMMARIES``): one summary a line, as
``RunSummary.model_validate_json`` takes them.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

try:
    import fcntl
except ImportError:  # Windows: a spill directory's owner is known by its process id alone
    fcntl = None  # type: ignore[assignment]

from deerflow_journal.journal.mapping import MessageEncoder
from deerflow_journal.records import decode_json, encode_json

__all__ = ["EVENTS", "SPILL_PREFIX", "SUMMARIES", "SpillFile", "report_leftover_spills"]

logger = logging.getLogger(__name__)

#: How a spill directory's name starts; the owning process's id follows.
SPILL_PREFIX = "deerflow-journal-spill-"
#: The file names of the two kinds of spill file, one per directory.
EVENTS = "events.jsonl"
SUMMARIES = "summaries.jsonl"
_OFFSET_NAME = "read-offset"  # bytes of the file read back, as decimal text
_LOCK_NAME = "owner.lock"  # locked (flock) by the process whose events are in the file
_leftovers_checked = False
_leftovers_lock = threading.Lock()


class SpillFile:
    """A first-in, first-out file of journal events (or, named ``SUMMARIES``, run summaries),
    created on the first ``append``.

    Not thread-safe: its journal's buffer calls it under its own lock.
    """

    def __init__(self, name: str = EVENTS) -> None:
        self.name = name
        self._dir: Path | None = None
        self._writer: IO[bytes] | None = None
        self._reader: IO[bytes] | None = None
        self._owner: int | None = None  # the descriptor holding the directory's lock
        #: Events appended and not read back yet.
        self.count = 0

    @property
    def path(self) -> Path | None:
        """The file while it holds events, else ``None``."""
        return None if self._dir is None else self._dir / self.name

    def append(self, event: dict[str, Any]) -> None:
        """Add ``event`` at the end; raise what encoding it raises (it could not be stored)."""
        line = _line(event)
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
        else:
            self._note_offset()
        return events

    def _note_offset(self) -> None:
        """Keep where the unread lines start, for the file's report if the process dies."""
        assert self._dir is not None and self._reader is not None
        noted = self._dir / f"{_OFFSET_NAME}.new"
        with contextlib.suppress(OSError):  # without it, the report says the whole file
            noted.write_text(str(self._reader.tell()))
            os.replace(noted, self._dir / _OFFSET_NAME)

    def save(
        self, first: Iterable[dict[str, Any]], last: Iterable[dict[str, Any]] = ()
    ) -> tuple[Path | None, int, list[tuple[dict[str, Any], Exception]]] | None:
        """Put ``first`` (older than the lines not read back yet) ahead of those lines, and
        ``last`` (newer) after them, in a file that holds only these; return it, its line
        count and the values that could not be encoded, with why (no file when none could;
        None: nothing to save).

        For a process that exits with events unwritten: the file outlives it.
        """
        failed: list[tuple[dict[str, Any], Exception]] = []
        lines, after = _lines(first, failed), _lines(last, failed)
        if not lines and not after and not self.count:
            return (None, 0, failed) if failed else None
        if self._writer is None:
            self._open()
        assert self._dir is not None and self._writer is not None and self._reader is not None
        path = self._dir / self.name
        self._writer.flush()
        # The offset goes first: a crash before the file is replaced keeps the whole old file
        # (read-back lines twice, none lost), never an offset that would cut the new one.
        with contextlib.suppress(FileNotFoundError):
            (self._dir / _OFFSET_NAME).unlink()
        saved = self._dir / f"{self.name}.new"
        with open(saved, "wb") as out:
            out.writelines(lines)
            shutil.copyfileobj(self._reader, out)
            out.writelines(after)
        os.replace(saved, path)
        count = len(lines) + self.count + len(after)
        self._forget()  # the file is the user's now
        return path, count, failed

    def remove(self) -> None:
        """Delete the file and its directory, with whatever they hold."""
        if self._dir is not None:
            self._close_files()  # Windows removes no open file
            shutil.rmtree(self._dir, ignore_errors=True)
        self._forget()  # the lock last: a live owner's directory is never found left

    def _close_handles(self) -> None:
        """Close the file, and give up the directory's lock: from then on it is left."""
        self._close_files()
        self._let_go()

    def _close_files(self) -> None:
        for handle in (self._writer, self._reader):
            if handle is not None:
                with contextlib.suppress(OSError):
                    handle.close()

    def _let_go(self) -> None:
        """Give up the directory's lock."""
        if self._owner is not None:
            with contextlib.suppress(OSError):
                os.close(self._owner)
            self._owner = None

    def _forget(self) -> None:
        """Start afresh, leaving the file where it is."""
        self._close_handles()
        self._dir = self._writer = self._reader = None
        self.count = 0

    def _open(self) -> None:
        directory = Path(tempfile.mkdtemp(prefix=f"{SPILL_PREFIX}{os.getpid()}-"))
        try:
            # Locked before the events file exists: a reporter that finds the file finds it
            # locked.
            self._owner = _lock(directory / _LOCK_NAME)
            path = directory / self.name
            self._writer = open(path, "xb")  # noqa: SIM115 - held open while events are spilled
            self._reader = open(path, "rb")  # noqa: SIM115
        except BaseException:  # nothing half made stays behind
            self._close_handles()
            self._writer = self._reader = None
            shutil.rmtree(directory, ignore_errors=True)
            raise
        self._dir = directory
        _OPEN.add(self)


#: Spill files holding a lock: a forked child lets go of its copies, which would otherwise
#: keep the directory locked after its owner died.
_OPEN: weakref.WeakSet[SpillFile] = weakref.WeakSet()


def _drop_inherited_locks() -> None:
    for spill in list(_OPEN):
        spill._let_go()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_inherited_locks)


def _lock(path: Path) -> int | None:
    """Create ``path`` and hold an exclusive lock on it until the descriptor is closed."""
    if fcntl is None:
        return None
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a reporter's probe holds it for an instant at most
    except OSError:  # a file system without locks: the process id alone tells
        os.close(fd)
        return None
    return fd


def _left(directory: Path, pid: int) -> bool:
    """Whether the process that spilled to ``directory`` has ended: its lock is free (its
    process id is no longer running, where no lock tells)."""
    if fcntl is not None:
        try:
            fd = os.open(directory / _LOCK_NAME, os.O_RDONLY)
        except OSError:  # none (an older version's), or another user's
            return not _alive(pid)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False
            return not _alive(pid)  # a file system without locks
        finally:
            os.close(fd)  # which lets go of a lock taken
        return True
    return not _alive(pid)


def _lines(
    values: Iterable[dict[str, Any]], failed: list[tuple[dict[str, Any], Exception]]
) -> list[bytes]:
    """The lines of ``values``; those that cannot be encoded go to ``failed``, with why."""
    lines = []
    for value in values:
        try:
            lines.append(_line(value))
        except Exception as exc:  # no store could take it either
            failed.append((value, exc))
    return lines


def _line(event: dict[str, Any]) -> bytes:
    """An event's line in a spill file: encoded as every store write encodes it."""
    return encode_json(event, MessageEncoder()).encode() + b"\n"


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
            if pid is None:
                continue
            for name, what, how in _KINDS:
                path = entry / name
                # The file first: its owner locked the directory before creating it; and once
                # more after the lock was found free (a live owner removes it locked).
                if not path.is_file() or not _left(entry, pid) or not path.is_file():
                    continue
                found.append(path)
                logger.error(
                    "journal found %d %s a process (pid %d) spilled and never wrote, kept in %s "
                    "(%s), then delete %s",
                    _unread_only(path),
                    what,
                    pid,
                    path,
                    how,
                    entry,
                )
    return found


#: Each kind of spill file: its name, what it holds, and how its lines are written back.
_KINDS = (
    (
        EVENTS,
        "events",
        "one event a line, as `store.put_batch` takes them: write them with put_batch",
    ),
    (
        SUMMARIES,
        "run summaries",
        "one run summary a line: write each, in order, with "
        "`store.put_run_summary(RunSummary.model_validate_json(line))`",
    ),
)


def _unread_only(path: Path) -> int:
    """Cut a left spill file down to the lines its process never read back; count them."""
    directory = path.parent
    # Claimed by renaming it, so that one reporter alone cuts the file, once: another one
    # finds no offset, and one killed after the cut leaves none to cut the file again.
    claimed = directory / f"{_OFFSET_NAME}.{os.getpid()}"
    with contextlib.suppress(OSError, ValueError):
        os.rename(directory / _OFFSET_NAME, claimed)
        offset = int(claimed.read_text())
        kept = directory / f"{path.name}.{os.getpid()}"
        with open(path, "rb") as source, open(kept, "wb") as out:
            source.seek(offset)
            shutil.copyfileobj(source, out)
        os.replace(kept, path)
    with contextlib.suppress(OSError):
        claimed.unlink()
    try:
        with open(path, "rb") as source:
            return sum(1 for line in source if line.strip())
    except OSError:  # gone meanwhile: another reporter's user wrote it back, say
        return 0


def _owner(name: str) -> int | None:
    """The process id in a spill directory's name, else ``None``."""
    if not name.startswith(SPILL_PREFIX):
        return None
    pid, _, _ = name.removeprefix(SPILL_PREFIX).partition("-")
    return int(pid) if pid.isascii() and pid.isdigit() else None


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True  # no lock tells: assume it is this process's own
    if os.name == "nt":  # signal 0 is CTRL_C_EVENT there: it would interrupt the process
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process
        return True
    return True
