"""Where the JSONL store keeps a thread: path-safe names for ids and the per-thread layout.

Layout under the base dir::

    locks/{stripe}                     the lock file of every thread in the stripe
    threads/{thread}/state             last seq, change counters, the batch in flight
    threads/{thread}/summaries.jsonl   run summaries, one per line, the last line wins
    threads/{thread}/runs/{run}.jsonl  one run's events, one record per line
    batches/{id}                       marks a batch spanning threads as not yet committed

``{thread}`` and ``{run}`` are ``encode_id`` of the real ids, which each record also carries.
Threads share ``LOCK_STRIPES`` lock files (by a stable hash of ``{thread}``), so a batch over
any number of threads holds a bounded number of open files.
"""

from __future__ import annotations

import hashlib
import zlib
from pathlib import Path

__all__ = ["LOCK_STRIPES", "MAX_NAME_LENGTH", "RUN_SUFFIX", "ThreadPaths", "encode_id"]

#: How many lock files the threads share (at most this many are open for one batch).
LOCK_STRIPES = 64

#: Longest encoded name before it is shortened with a digest (file names allow 255 bytes).
MAX_NAME_LENGTH = 120
RUN_SUFFIX = ".jsonl"
_SAFE = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-")
_DEVICE_NAMES = frozenset(
    {"con", "prn", "aux", "nul"} | {f"{p}{i}" for p in ("com", "lpt") for i in range(10)}
)


def _escape(char: str) -> str:
    return "".join(f"%{byte:02x}" for byte in char.encode("utf-8", "surrogatepass"))


def encode_id(value: str) -> str:
    """Return a file name for ``value`` that is the same on every file system, and unique.

    Lowercase ASCII letters, digits, ``_`` and ``-`` stay as they are; every other character
    (upper case too, so case-insensitive file systems cannot merge two ids) becomes ``%xx``
    per UTF-8 byte, which also rules out ``.``, ``..``, separators and Windows device names.
    Decoding the escapes gives the id back. A name longer than ``MAX_NAME_LENGTH`` keeps a
    readable head and ends in ``~`` plus the id's SHA-256, a character plain names never hold.
    """
    pieces = [c if c in _SAFE else _escape(c) for c in value]
    if "".join(pieces) in _DEVICE_NAMES:
        pieces[0] = _escape(value[0])
    name = "".join(pieces)
    if len(name) <= MAX_NAME_LENGTH:
        return name
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()
    head, room = [], MAX_NAME_LENGTH - len(digest) - 1
    for piece in pieces:
        room -= len(piece)
        if room < 0:
            break
        head.append(piece)
    return f"{''.join(head)}~{digest}"


class ThreadPaths:
    """The files of one thread under a base dir."""

    __slots__ = ("base_dir", "dir", "lock", "runs", "state", "stripe", "summaries", "thread_id")

    def __init__(self, base_dir: Path, thread_id: str) -> None:
        self.base_dir = base_dir
        self.thread_id = thread_id
        name = encode_id(thread_id)
        #: The thread's directory.
        self.dir = base_dir / "threads" / name
        #: The thread's lock stripe: the same in every process.
        self.stripe = zlib.crc32(name.encode()) % LOCK_STRIPES
        #: The file every writer of the thread locks, shared with the other threads of its stripe.
        self.lock = base_dir / "locks" / str(self.stripe)
        #: The thread's last seq, change counters and the batch in flight.
        self.state = self.dir / "state"
        #: The thread's run summaries.
        self.summaries = self.dir / "summaries.jsonl"
        #: The directory of the thread's run files.
        self.runs = self.dir / "runs"

    def run_file(self, run_id: str) -> Path:
        """The file holding ``run_id``'s events."""
        return self.runs / f"{encode_id(run_id)}{RUN_SUFFIX}"
