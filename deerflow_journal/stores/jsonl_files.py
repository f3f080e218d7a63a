"""Crash-safe file steps of the JSONL store: the thread locks, the state file and recovery.

A thread's ``state`` file holds a fixed-size header (last seq, ``gen``, ``epoch``, length of
the pending record) followed by the pending record of the batch being written, if any. Each
change is one ``pwrite`` of the header, so no rename and no fsync is on the write path.

A batch is written as: record the size of every run file it touches (``begin``), append each
file's lines with one write call, then clear the pending record (``commit``). Whoever next takes
the thread's lock and finds a pending record truncates those files back to the recorded sizes
(``recover``), so a killed writer leaves all of its batch or none of it. A batch spanning
threads also creates a marker under ``batches/`` before it begins and removes it as its single
commit point; recovery rolls a thread forward when the marker is gone and back when it is not.
The marker lists the batch's threads, so the recovery that rolls back the last of them removes
it: no thread that might still roll forward can see it go.

A reader that may not write cannot recover: it reads without the lock and leaves out what a
batch still pending added (``pending_sizes``), unless the batch is committed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from filelock import lock_descriptor, unlock_descriptor

from deerflow_journal.stores.jsonl_paths import RUN_SUFFIX, ThreadPaths

__all__ = [
    "SUMMARIES_KEY",
    "LockedThread",
    "ThreadState",
    "append_file",
    "create_batch_marker",
    "cut_lines",
    "hold_lock",
    "lock_thread",
    "open_thread",
    "peek_state",
    "pending_sizes",
    "prepare_append",
    "read_lines",
    "rewrite_file",
    "run_file_sizes",
    "steady",
]

logger = logging.getLogger(__name__)

#: ``pending_sizes``'s key for the summaries file (never a run file name, which ends in .jsonl).
SUMMARIES_KEY = "summaries"
_HEADER = b"%020d %020d %020d %020d\n"
_HEADER_SIZE = len(_HEADER % (0, 0, 0, 0))
_LOCK_POLL_SECONDS = 0.001
_TAIL_CHUNK = 65536


@dataclass(slots=True)
class ThreadState:
    """A thread's counters: ``gen`` moves on every change, ``epoch`` when files shrink."""

    seq: int = 0
    gen: int = 0
    epoch: int = 0
    pending: dict[str, Any] | None = None


def _parse_state(data: bytes) -> ThreadState:
    if not data:
        return ThreadState()
    fields = data[:_HEADER_SIZE].split()
    if len(data) < _HEADER_SIZE or len(fields) != 4 or not all(f.isdigit() for f in fields):
        raise ValueError("malformed state header")
    seq, gen, epoch, pending_size = (int(f) for f in fields)
    pending = None
    if pending_size:
        pending = orjson.loads(data[_HEADER_SIZE : _HEADER_SIZE + pending_size])
    return ThreadState(seq, gen, epoch, pending)


def peek_state(paths: ThreadPaths) -> ThreadState | None:
    """Read the state without the lock: ``None`` for a thread never written.

    A torn or malformed read comes back with ``gen == -1`` so that it never matches a cache.
    """
    try:
        data = paths.state.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return _parse_state(data)
    except ValueError:
        return ThreadState(gen=-1)


def run_file_sizes(paths: ThreadPaths) -> dict[str, int]:
    """Map each run file name of the thread to its size."""
    try:
        entries = list(os.scandir(paths.runs))
    except FileNotFoundError:
        return {}
    return {e.name: e.stat().st_size for e in entries if e.name.endswith(RUN_SUFFIX)}


def pending_sizes(paths: ThreadPaths, state: ThreadState) -> dict[str, int]:
    """Each file's size before the batch ``state`` has pending (``SUMMARIES_KEY``: the
    summaries'), where a reader without the lock stops; empty if none is, or it is committed."""
    pending = state.pending
    if pending is None or _is_committed(paths.base_dir, pending):
        return {}
    sizes = dict(pending.get("files", {}))
    if isinstance(pending.get("summaries"), int):
        sizes[SUMMARIES_KEY] = pending["summaries"]
    return sizes


def steady(before: ThreadState, after: ThreadState | None) -> bool:
    """Whether no file shrank between two state reads made without the lock, neither torn."""
    return after is not None and min(before.gen, after.gen) >= 0 and after.epoch == before.epoch


def _is_committed(base_dir: Path, pending: dict[str, Any]) -> bool:
    """Whether a pending batch reached its commit point (a batch spanning threads whose marker
    is gone); a single-thread batch commits only when its pending record is cleared."""
    marker = pending.get("batch")
    return marker is not None and not (base_dir / "batches" / marker).exists()


def read_lines(path: Path, offset: int) -> tuple[list[bytes], int]:
    """Return the complete lines after ``offset`` (newline kept) and the offset past them.

    An unfinished last line (a torn write) is left for later: it is not returned.
    """
    lines = []
    with open(path, "rb") as f:
        f.seek(offset)
        for line in f:
            if not line.endswith(b"\n"):
                break
            lines.append(line)
            offset += len(line)
    return lines, offset


def cut_lines(lines: list[bytes], offset: int, end: int) -> list[bytes]:
    """The first of ``lines`` (read from ``offset`` on) that end by offset ``end``."""
    kept = []
    for line in lines:
        offset += len(line)
        if offset > end:
            break
        kept.append(line)
    return kept


def prepare_append(path: Path) -> int:
    """Create ``path`` if needed, cut off a torn last line, and return its size."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            size = _cut_torn_tail(fd, size)
            logger.warning("dropped an unfinished last line of %s", path)
        return size
    finally:
        os.close(fd)


def _cut_torn_tail(fd: int, size: int) -> int:
    end = size
    while end > 0:
        start = max(0, end - _TAIL_CHUNK)
        newline = os.pread(fd, end - start, start).rfind(b"\n")
        if newline >= 0:
            end = start + newline + 1
            break
        end = start
    os.ftruncate(fd, end)
    return end


def append_file(path: Path, data: bytes) -> None:
    """Append ``data`` with one write call (repeated only if the OS writes less)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def create_batch_marker(base_dir: Path, threads: list[ThreadPaths]) -> Path:
    """Create the marker of a batch spanning ``threads``; removing it commits the batch."""
    marker = base_dir / "batches" / uuid.uuid4().hex
    marker.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, "\n".join(t.dir.name for t in threads).encode())
    finally:
        os.close(fd)
    return marker


def _remove_rolled_back_marker(base_dir: Path, name: str) -> None:
    """Remove a rolled-back batch's marker once none of its threads still has it pending."""
    marker = base_dir / "batches" / name
    try:
        threads = marker.read_text().split()
    except FileNotFoundError:
        return
    if threads and not any(_refers_to(base_dir / "threads" / t / "state", name) for t in threads):
        marker.unlink(missing_ok=True)


def _refers_to(state_path: Path, marker: str) -> bool:
    """Whether the state file may still have the batch ``marker`` pending (unsure: yes)."""
    try:
        state = _parse_state(state_path.read_bytes())
    except FileNotFoundError:
        return False
    except ValueError:
        return True
    return state.pending is not None and state.pending.get("batch") == marker


class LockedThread:
    """A thread whose lock is held: its state and the write steps that keep it crash-safe."""

    def __init__(self, paths: ThreadPaths, state_fd: int | None) -> None:
        """``state_fd``: the open state file, or ``None`` to open it for each step."""
        self.paths = paths
        self._fd = state_fd
        fd = self._open_state()
        try:
            data = os.pread(fd, os.fstat(fd).st_size, 0)
        finally:
            self._close_state(fd)
        try:
            self.state = _parse_state(data)
        except ValueError:
            logger.warning("rebuilding the unreadable state file %s", paths.state)
            # New counters no cache can hold, and the highest seq any line still carries.
            now = time.time_ns()
            self.state = ThreadState(seq=_max_seq(paths), gen=now, epoch=now)
            self._save()
        if self.state.pending is not None:
            self.recover()

    def _open_state(self) -> int:
        if self._fd is not None:
            return self._fd
        return os.open(self.paths.state, os.O_RDWR | os.O_CREAT, 0o644)

    def _close_state(self, fd: int) -> None:
        if fd != self._fd:
            os.close(fd)

    def _save(self) -> None:
        state = self.state
        pending = b"" if state.pending is None else orjson.dumps(state.pending)
        header = _HEADER % (state.seq, state.gen, state.epoch, len(pending))
        fd = self._open_state()
        try:
            if pending:
                os.pwrite(fd, pending, _HEADER_SIZE)
            os.pwrite(fd, header, 0)
        finally:
            self._close_state(fd)

    def begin(
        self, last_seq: int, sizes: dict[str, int], batch: Path | None, summaries: int | None
    ) -> None:
        """Record the run file sizes before a batch (and the summaries file's, if the batch
        has summaries), and the seq it will end at."""
        marker = None if batch is None else batch.name
        self.state.seq = last_seq
        self.state.gen += 1
        self.state.pending = {"files": sizes, "batch": marker}
        if summaries is not None:
            self.state.pending["summaries"] = summaries
        self._save()

    def commit(self) -> None:
        """Clear the pending record: the batch is in."""
        self.state.pending = None
        self._save()

    def recover(self) -> None:
        """Finish a batch a dead writer left: forward if it was committed, else back."""
        pending = self.state.pending or {}
        marker = pending.get("batch")
        if _is_committed(self.paths.base_dir, pending):
            self.state.gen += 1
            self.commit()
        else:
            logger.warning("rolling back an unfinished batch in %s", self.paths.dir)
            self.rollback()
            if marker is not None:
                _remove_rolled_back_marker(self.paths.base_dir, marker)

    def rollback(self) -> None:
        """Truncate the files of the pending batch back to their sizes before it."""
        pending = self.state.pending or {}
        for name, size in pending.get("files", {}).items():
            with contextlib.suppress(FileNotFoundError):
                os.truncate(self.paths.runs / name, size)
        summaries = pending.get("summaries")
        if isinstance(summaries, int):
            with contextlib.suppress(FileNotFoundError):
                os.truncate(self.paths.summaries, summaries)
        self.mark_shrunk()

    def mark_shrunk(self) -> None:
        """Note that run files shrank or went away, so every reader re-reads them."""
        self.state.gen += 1
        self.state.epoch += 1
        self.state.pending = None
        self._save()


def _max_seq(paths: ThreadPaths) -> int:
    best = 0
    for name in run_file_sizes(paths):
        for line in read_lines(paths.runs / name, 0)[0]:
            with contextlib.suppress(orjson.JSONDecodeError, AttributeError, TypeError):
                seq = orjson.loads(line).get("seq")
                best = max(best, seq if isinstance(seq, int) else 0)
    return best


@contextlib.contextmanager
def hold_lock(path: Path) -> Iterator[None]:
    """Hold the file lock ``path`` (one of ``locks/``, created if missing)."""
    try:
        lock_fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        lock_descriptor(lock_fd, poll_interval=_LOCK_POLL_SECONDS)
        try:
            yield
        finally:
            unlock_descriptor(lock_fd)
    finally:
        os.close(lock_fd)


@contextlib.contextmanager
def open_thread(paths: ThreadPaths, *, keep_open: bool = True) -> Iterator[LockedThread]:
    """Yield the thread, recovered (creating its directory); call with its lock held.

    Without ``keep_open`` the state file is opened for each step, not held: a batch over
    many threads then holds no file per thread.
    """
    paths.runs.mkdir(parents=True, exist_ok=True)
    state_fd = os.open(paths.state, os.O_RDWR | os.O_CREAT, 0o644) if keep_open else None
    try:
        yield LockedThread(paths, state_fd)
    finally:
        if state_fd is not None:
            os.close(state_fd)


@contextlib.contextmanager
def lock_thread(paths: ThreadPaths) -> Iterator[LockedThread]:
    """Hold the thread's file lock and yield it, recovered."""
    with hold_lock(paths.lock), open_thread(paths) as held:
        yield held


def rewrite_file(path: Path, lines: list[bytes]) -> None:
    """Replace ``path`` with ``lines`` (each ending in a newline) in one atomic rename."""
    tmp = path.with_name(f"{path.name}.tmp")
    tmp.write_bytes(b"".join(lines))
    os.replace(tmp, path)
