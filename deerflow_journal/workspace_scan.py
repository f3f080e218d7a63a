"""Workspace snapshots: what the files under a set of roots look like at one moment.

A snapshot records, per file, ``lstat`` facts (size, mtime, inode, symlink target). To diff a
file that a run later modifies, the before content must exist somewhere, so the snapshot also
keeps the bytes of small text files (at most ``max_file_bytes_for_diff`` each and
``max_snapshot_bytes`` in all; binary files keep only their digest). That read is the price of
before/after diffs: set ``max_snapshot_bytes=0`` to read nothing up front, and modified files
then carry ``diff_unavailable_reason="not_captured"``. Larger files, sensitive files and
symlink targets are never read by a snapshot.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from deerflow_journal.workspace_diff import is_binary

__all__ = [
    "WORKSPACE_SKIPPED_DIRS",
    "FileState",
    "WorkspaceChangeLimits",
    "WorkspaceRoot",
    "WorkspaceSnapshot",
    "check_roots",
    "file_digest",
    "is_sensitive_path",
    "read_small",
    "scan_workspace",
]

#: Directory names never descended into (VCS metadata, environments, caches, build output).
WORKSPACE_SKIPPED_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        ".bzr",
        "node_modules",
        "__pycache__",
        ".venv",
        "venv",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".tox",
        ".nox",
        ".cache",
        ".next",
        ".gradle",
        "dist",
        "build",
    }
)
_SENSITIVE_WORDS = ("secret", "token", "password", "credential", "api_key", "private_key")
_SENSITIVE_SUFFIXES = (".key", ".pem", ".env")
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
_HASH_CHUNK = 1 << 20

#: A traversal position: (root index, path components). Scans visit files in this order.
ScanKey = tuple[int, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class WorkspaceRoot:
    """A host directory whose changes are recorded, shown to readers under ``virtual_prefix``.

    ``host_path`` may be given as a string; it is stored as a ``Path``.
    """

    name: str
    host_path: Path
    virtual_prefix: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"workspace root name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.virtual_prefix, str):
            raise TypeError(f"virtual_prefix must be a string, got {self.virtual_prefix!r}")
        object.__setattr__(self, "host_path", Path(self.host_path))

    def virtual_path(self, relative: str) -> str:
        """The path readers see for ``relative`` (a POSIX path below the root).

        Bytes of a file name that are not UTF-8 (which the OS hands over as lone surrogates)
        are shown as U+FFFD: the path goes into diff headers and JSON.
        """
        prefix = self.virtual_prefix.rstrip("/")
        path = f"{prefix}/{relative}" if prefix or self.virtual_prefix else relative
        return path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class WorkspaceChangeLimits:
    """Bounds on how much a snapshot reads and a ``workspace_changes`` event carries."""

    max_files: int = 200
    max_scanned_files: int = 2000
    max_file_bytes_for_diff: int = 256 * 1024
    max_total_diff_bytes: int = 1024 * 1024
    #: Total bytes of before-content a snapshot keeps for diffs (a limit the contract's
    #: ``limits`` object does not list; the event carries it as an extra field).
    max_snapshot_bytes: int = 16 * 1024 * 1024

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")

    def to_dict(self) -> dict[str, int]:
        """The limits as the ``limits`` object of a ``workspace_changes`` payload."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class FileState:
    """One file or symlink as a snapshot saw it."""

    size: int
    mtime_ns: int
    inode: int
    symlink_target: str | None = None
    sensitive: bool = False
    #: Kept bytes of a small non-binary file (the base of a later diff).
    data: bytes | None = None
    #: Digest of a binary file that was read but not kept.
    sha256: str | None = None
    binary: bool | None = None

    @property
    def is_symlink(self) -> bool:
        """Whether this entry is a symlink (never followed)."""
        return self.symlink_target is not None

    @property
    def was_read(self) -> bool:
        """Whether the snapshot read the content (it kept the bytes or the digest)."""
        return self.data is not None or self.sha256 is not None

    def digest(self) -> str | None:
        """The SHA-256 of the content if the snapshot read it (hashed on demand, not at scan)."""
        if self.data is not None:
            return hashlib.sha256(self.data).hexdigest()
        return self.sha256

    def same_stat(self, other: FileState) -> bool:
        """Whether ``lstat`` facts say nothing changed."""
        return (self.size, self.mtime_ns, self.inode, self.symlink_target) == (
            other.size,
            other.mtime_ns,
            other.inode,
            other.symlink_target,
        )


@dataclass(frozen=True, slots=True)
class WorkspaceSnapshot:
    """The files under some roots at one moment, keyed by ``(root name, relative path)``."""

    roots: tuple[WorkspaceRoot, ...]
    limits: WorkspaceChangeLimits
    files: Mapping[tuple[str, str], FileState]
    #: ``time.time_ns()`` when the scan started (files modified after it are re-verified).
    started_ns: int
    #: Where the scan stopped when it hit ``max_scanned_files``, else ``None``.
    boundary: ScanKey | None = None
    #: Folders it could not list, as ``(root name, relative path)``: what they hold is unknown.
    unreadable: frozenset[tuple[str, str]] = frozenset()

    @property
    def truncated(self) -> bool:
        """Whether the scan missed files: cut short by ``max_scanned_files``, or a folder it
        could not list."""
        return self.boundary is not None or bool(self.unreadable)

    def reached(self, root_name: str, relative: str) -> bool:
        """Whether the scan saw ``relative`` (a file path) as present or absent."""
        if self.unreadable:
            parts = relative.split("/")
            for depth in range(len(parts)):
                if (root_name, "/".join(parts[:depth])) in self.unreadable:
                    return False
        if self.boundary is None:
            return True
        names = [root.name for root in self.roots]
        return (names.index(root_name), tuple(relative.split("/"))) <= self.boundary


def is_sensitive_path(parts: Iterable[str]) -> bool:
    """Whether any component names a secret (*.env, .env.*, *.key, *.pem, secret, token, ...)."""
    for part in parts:
        name = part.lower()
        if ".env." in name or name.endswith(_SENSITIVE_SUFFIXES):
            return True
        if any(word in name for word in _SENSITIVE_WORDS):
            return True
    return False


def _read_head(path: str | Path, limit: int) -> bytes:
    fd = os.open(path, _OPEN_FLAGS)
    with os.fdopen(fd, "rb") as handle:
        return handle.read(limit + 1)


def read_small(path: str | Path, size: int, limit: int) -> bytes | None:
    """Read a regular file of ``size`` bytes whole, or ``None`` if it is over ``limit``.

    Never follows a symlink. ``size`` (from ``lstat``) sizes the read; a file that grew
    since is read again up to ``limit``.
    """
    data = _read_head(path, min(size, limit))
    if len(data) > size:
        data = _read_head(path, limit)
    return data if len(data) <= limit else None


def file_digest(path: str | Path) -> tuple[str, bytes]:
    """Stream a file's SHA-256; also return its first chunk (for binary detection)."""
    digest = hashlib.sha256()
    fd = os.open(path, _OPEN_FLAGS)
    with os.fdopen(fd, "rb") as handle:
        head = chunk = handle.read(_HASH_CHUNK)
        while chunk:
            digest.update(chunk)
            chunk = handle.read(_HASH_CHUNK)
    return digest.hexdigest(), head


_Found = tuple[ScanKey, os.DirEntry[str], bool]


def _listing(
    path: str | Path, parts: tuple[str, ...], unreadable: list[str]
) -> Iterator[os.DirEntry[str]]:
    """A folder's entries in name order; a folder that exists but cannot be listed is noted
    in ``unreadable`` (a missing one simply has no files)."""
    try:
        with os.scandir(path) as listing:
            return iter(sorted(listing, key=lambda entry: entry.name))
    except (FileNotFoundError, NotADirectoryError):
        return iter(())
    except OSError:
        unreadable.append("/".join(parts))
        return iter(())


def _walk(root_index: int, top: str | Path, unreadable: list[str]) -> Iterator[_Found]:
    """Yield files and symlinks depth-first in name order, i.e. in ``ScanKey`` order.

    Each comes with whether its path is sensitive (a folder above it is). Iterative: a tree
    as deep as the OS allows must not exhaust Python's recursion limit.
    """
    stack = [(_listing(top, (), unreadable), (), False)]
    while stack:
        entries, parts, secret = stack[-1]
        entry = next(entries, None)
        if entry is None:
            stack.pop()
            continue
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
            is_file = entry.is_file(follow_symlinks=False) or entry.is_symlink()
        except OSError:
            continue
        sensitive = secret or is_sensitive_path((entry.name,))
        if is_dir:
            if entry.name not in WORKSPACE_SKIPPED_DIRS and not entry.name.endswith(".egg-info"):
                below = (*parts, entry.name)
                stack.append((_listing(entry.path, below, unreadable), below, sensitive))
        elif is_file:
            yield (root_index, (*parts, entry.name)), entry, sensitive


def _entry_state(entry: os.DirEntry[str], sensitive: bool, read_up_to: int) -> FileState | None:
    """The state of a file or symlink; a readable file of ``read_up_to`` bytes or less is read.

    A small non-binary file keeps its bytes, a binary one its digest.
    """
    try:
        info = entry.stat(follow_symlinks=False)
        if stat.S_ISLNK(info.st_mode):
            target = os.readlink(entry.path)
            return FileState(info.st_size, info.st_mtime_ns, info.st_ino, target, sensitive)
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode):
        return None
    data = None
    if not sensitive and info.st_size <= read_up_to:
        with contextlib.suppress(OSError):
            data = read_small(entry.path, info.st_size, read_up_to)
    facts = (info.st_size, info.st_mtime_ns, info.st_ino, None, sensitive)
    if data is None:
        return FileState(*facts)
    if is_binary(data):
        return FileState(*facts, sha256=hashlib.sha256(data).hexdigest(), binary=True)
    return FileState(*facts, data=data, binary=False)


def scan_workspace(
    roots: Iterable[WorkspaceRoot],
    *,
    limits: WorkspaceChangeLimits | None = None,
    keep_content: bool = True,
) -> WorkspaceSnapshot:
    """Scan ``roots`` (blocking; use ``capture_workspace_snapshot`` from async code).

    ``keep_content=False`` records ``lstat`` facts only and reads no file.
    """
    roots = check_roots(roots)
    limits = limits or WorkspaceChangeLimits()
    started_ns = time.time_ns()
    files: dict[tuple[str, str], FileState] = {}
    budget = limits.max_snapshot_bytes if keep_content else -1
    boundary: ScanKey | None = None
    last: ScanKey = (-1, ())
    unreadable: set[tuple[str, str]] = set()
    for index, root in enumerate(roots):
        folders: list[str] = []
        for key, entry, sensitive in _walk(index, root.host_path, folders):
            if len(files) == limits.max_scanned_files:
                boundary = last
                break
            last = key
            state = _entry_state(entry, sensitive, min(limits.max_file_bytes_for_diff, budget))
            if state is not None:
                budget -= len(state.data or b"")
                files[root.name, "/".join(key[1])] = state
        unreadable.update((root.name, folder) for folder in folders)
        if boundary is not None:
            break
    return WorkspaceSnapshot(roots, limits, files, started_ns, boundary, frozenset(unreadable))


def check_roots(roots: Iterable[WorkspaceRoot]) -> tuple[WorkspaceRoot, ...]:
    """``roots`` as a tuple (one root alone too); ``TypeError`` for anything but
    ``WorkspaceRoot`` objects, ``ValueError`` for a name used twice (changes are keyed by it)."""
    if isinstance(roots, WorkspaceRoot):
        roots = (roots,)
    checked = tuple(roots)
    for root in checked:
        if not isinstance(root, WorkspaceRoot):
            raise TypeError(f"roots must be WorkspaceRoot objects, got {type(root).__name__}")
    names = [root.name for root in checked]
    if len(set(names)) != len(names):
        raise ValueError(f"workspace root names must be unique, got {names}")
    return checked
