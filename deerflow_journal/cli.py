"""``deerflow-journal``: look at a journal from a terminal, and copy one store into another.

Commands read through ``SyncStore`` on a store opened ``read_only`` (``import`` alone writes):

- ``threads``: threads by latest activity; ``runs [THREAD]``: runs newest first;
- ``show THREAD RUN``: a run's timeline (``--json``: its events, one JSON record a line);
- ``summary THREAD RUN``: a run's summary; ``tail THREAD [--follow]``: a thread's latest
  events, and with ``--follow`` each new one as it lands, until Ctrl-C;
- ``export THREAD [RUN]``: the thread's (or run's) events and run summaries as JSON lines
  (``--format otlp --endpoint URL``: as OpenTelemetry spans sent to an OTLP/HTTP receiver);
  ``import FILE|-``: such a file into the store ``--url`` names, seqs given by that store;
- ``serve``: the web viewer and its JSON API (extra ``ui``), read-only, on loopback unless
  ``--expose`` says otherwise.

``--url`` defaults to ``$DEERFLOW_JOURNAL_URL``, then ``default_store_url()``. Lines fit the
terminal (80 columns when output is not a terminal), colour only on a terminal and never with
``NO_COLOR``. A mistake (a thread or run the journal does not have, a bad URL, a database that
cannot be reached, a missing file, a file that is no export) prints one line saying how to fix
it on stderr and exits with status 1 (2 for a command line argparse refuses), never a
traceback (``DEERFLOW_JOURNAL_DEBUG=1`` shows it for an unexpected error).

The export format, one JSON object per line, each with a ``kind``:

- ``{"kind": "header", "format": "deerflow-journal-export", "version": 1, "thread_id": ...,
  "run_id": ... or null}`` first;
- ``{"kind": "event", ...}``: a stored record (``thread_id``, ``run_id``, ``seq``,
  ``event_type``, ``category``, ``content``, ``metadata``, ``created_at``, ``user_id``), in seq
  order;
- ``{"kind": "summary", ...}``: a ``RunSummary`` as JSON;
- ``{"kind": "end", "events": N, "summaries": M}`` last, so a file cut short is refused.

``export THREAD`` copies every event of the thread and ``tail`` shows its latest, runs with
neither a summary nor a message row (trace events written by hand) included.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import sys
import tempfile
import time
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, NoReturn
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import orjson

from deerflow_journal.records import RunEvent, check_text, normalise_event
from deerflow_journal.stores import STORE_URL_ENV, default_store_url
from deerflow_journal.summary import RUN_STATUSES, RunSummary
from deerflow_journal.sync import SyncStore, open_sync_store
from deerflow_journal.timeline import render_summary, render_timeline, timeline_rows

__all__ = ["EXPORT_FORMAT", "CliError", "build_parser", "fit", "main", "width_of"]

PROG = "deerflow-journal"
#: The ``format`` of an export's header line.
EXPORT_FORMAT = "deerflow-journal-export"
EXPORT_VERSION = 1
DEBUG_ENV = "DEERFLOW_JOURNAL_DEBUG"

_PAGE = 500  # events per read
_IMPORT_BATCH = 1000  # events per write
_FINISHED = frozenset({"success", "error", "cancelled"})  # statuses a run never leaves

_RESET, _DIM, _BOLD = "\x1b[0m", "\x1b[2m", "\x1b[1m"
_STATUS_COLORS = {
    "success": "\x1b[32m",
    "error": "\x1b[31m",
    "cancelled": "\x1b[33m",
    "interrupted": "\x1b[33m",
    "running": "\x1b[36m",
}


class CliError(Exception):
    """A mistake the user can fix: its message is one line saying how."""


# -- output ---------------------------------------------------------------------------------


class _Out:
    """Where results go: stdout, as wide as the terminal (80 otherwise), coloured on one."""

    def __init__(self) -> None:
        self.stream = sys.stdout
        tty = self.stream.isatty()
        self.width = max(20, shutil.get_terminal_size((80, 24)).columns) if tty else 80
        self.color = tty and not os.environ.get("NO_COLOR")
        self.progress = sys.stderr.isatty()

    def line(self, text: str = "") -> None:
        """Print one line of results."""
        self.stream.write(text + "\n")

    def fit(self, text: str) -> str:
        """``text`` cut to the output's width."""
        return fit(text, self.width)

    def paint(self, text: str, style: str) -> str:
        """``text`` in an ANSI ``style`` when the output takes colour."""
        return f"{style}{text}{_RESET}" if self.color and style and text else text

    def note(self, text: str) -> None:
        """A progress note on stderr, on a terminal only, overwritten by the next."""
        if self.progress:
            sys.stderr.write(f"\r\x1b[2K{text}")
            sys.stderr.flush()

    def end_note(self) -> None:
        """Clear the progress note."""
        if self.progress:
            sys.stderr.write("\r\x1b[2K")
            sys.stderr.flush()


def _char_width(ch: str) -> int:
    if unicodedata.combining(ch):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def width_of(text: str) -> int:
    """Columns ``text`` takes on a terminal."""
    return sum(_char_width(ch) for ch in text)


def fit(text: str, width: int) -> str:
    """``text`` cut to ``width`` columns, ending with ``…`` when cut."""
    if width_of(text) <= width:
        return text
    kept, used = [], 0
    for ch in text:
        need = _char_width(ch)
        if used + need > width - 1:
            break
        kept.append(ch)
        used += need
    return "".join(kept).rstrip() + "…"


def _middle(text: str, width: int) -> str:
    """``text`` cut in the middle to ``width`` columns (both ends of an id stay readable)."""
    if width_of(text) <= width or width < 3:
        return text if width_of(text) <= width else fit(text, width)
    head = fit(text, (width + 1) // 2)[:-1]
    room, start = width - width_of(head) - 1, len(text)
    while start > 0 and _char_width(text[start - 1]) <= room:  # columns, not characters
        start -= 1
        room -= _char_width(text[start])
    while start < len(text) and unicodedata.combining(text[start]):  # it would mark the …
        start += 1
    return f"{head}…{text[start:]}"


def _one_line(text: str) -> str:
    text = " ".join(str(text).split())
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def _when(iso: str | datetime | None) -> str:
    """A stored time as ``YYYY-MM-DD HH:MM:SS`` (UTC), or ``-``."""
    if iso is None:
        return "-"
    moment = iso if isinstance(iso, datetime) else datetime.fromisoformat(iso)
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def _json_line(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_APPEND_NEWLINE)


# -- stores ---------------------------------------------------------------------------------


def _shown_url(url: str) -> str:
    """``url`` without its passwords (in the user part, or parameters such as ``password``
    and ``sslpassword``)."""
    try:
        parts = urlsplit(url)
        if parts.password is None and "password" not in parts.query.lower():
            return url  # as given: rebuilt, sqlite:///x would lose its empty host
        if parts.password is not None:
            host = parts.hostname or ""
            port = f":{parts.port}" if parts.port else ""
            user = f"{parts.username}:" if parts.username else ""
            parts = parts._replace(netloc=f"{user}***@{host}{port}")
        if "password" in parts.query.lower():
            query = parse_qsl(parts.query, keep_blank_values=True)
            hidden = [(k, "***" if "password" in k.lower() else v) for k, v in query]
            parts = parts._replace(query=urlencode(hidden, safe="*"))
        return urlunsplit(parts)
    except ValueError:
        return url


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return _one_line(text.splitlines()[0])


@contextlib.contextmanager
def opened(url: str | None, *, read_only: bool = True) -> Iterator[SyncStore]:
    """The store ``url`` names behind ``SyncStore``, set up (``read_only`` unless writing)."""
    where = url or default_store_url()
    source = "--url" if url else (f"${STORE_URL_ENV}" if os.environ.get(STORE_URL_ENV) else "")
    # An import copies records exactly: nothing is cut again.
    options: dict[str, Any] = (
        {} if read_only else {"max_trace_content": None, "max_outputs_content": None}
    )
    try:
        store = open_sync_store(url, read_only=read_only, **options)
    except (ValueError, TypeError) as exc:
        raise CliError(
            f"{_first_line(exc)}: pass a store URL with --url, e.g. sqlite:///journal.db"
        ) from None
    except ImportError as exc:
        raise CliError(_first_line(exc)) from None
    try:
        store.setup()
    except FileNotFoundError as exc:
        store.close()
        from_where = f" (from {source})" if source else " (the default)"
        raise CliError(
            f"{_first_line(exc)}{from_where}: pass the journal's URL with --url, or run a "
            "journaled program first"
        ) from None
    except Exception as exc:
        store.close()
        raise CliError(
            f"cannot open the journal at {_shown_url(where)}: {_first_line(exc)}: check the URL "
            "and that the database is reachable"
        ) from None
    try:
        yield store
    finally:
        store.close()


def run_events(
    store: SyncStore, thread_id: str, run_id: str | None, after: int | None = None
) -> Iterator[RunEvent]:
    """Every event of a run (``None``: of the whole thread) after seq ``after``, in seq
    order, read a page at a time."""
    while True:
        page = store.list_events(thread_id, run_id, limit=_PAGE, after_seq=after)
        yield from page
        if len(page) < _PAGE:
            return
        after = page[-1]["seq"]


def has_thread(store: SyncStore, thread_id: str) -> bool:
    """Whether the thread has an event or a run summary."""
    return bool(
        store.list_events(thread_id, None, limit=1) or store.list_run_summaries(thread_id, limit=1)
    )


def _no_thread(thread_id: str) -> CliError:
    return CliError(
        f"the journal has no thread {thread_id!r}: `{PROG} threads` lists the threads it has"
    )


def _ids(*ids: str) -> str:
    """Ids as arguments a shell passes on as they are (``--`` first if one starts with a
    dash, which would read as an option)."""
    dashes = "-- " if any(i.startswith("-") for i in ids) else ""
    return dashes + " ".join(shlex.quote(i) for i in ids)


def _no_run(store: SyncStore, thread_id: str, run_id: str) -> CliError:
    if not has_thread(store, thread_id):
        return _no_thread(thread_id)
    return CliError(
        f"thread {thread_id!r} has no run {run_id!r}: `{PROG} runs {_ids(thread_id)}` "
        "lists its runs"
    )


# -- commands -------------------------------------------------------------------------------


def cmd_threads(args: argparse.Namespace, out: _Out) -> None:
    """``threads``: a page of threads, most recent activity first."""
    with opened(args.url) as store:
        threads = store.list_threads(limit=args.limit)
    if args.json:
        for t in threads:
            out.line(orjson.dumps(t.to_json_dict()).decode())
        return
    if not threads:
        out.line("no threads yet")
        return
    runs = max(4, *(len(str(t.run_count)) for t in threads))
    seqs = max(8, *(len(str(t.last_seq)) for t in threads))
    out.line(
        out.paint(
            out.fit(f"{'last event (UTC)':<19}  {'runs':>{runs}}  {'last seq':>{seqs}}  thread"),
            _BOLD,
        )
    )
    for t in threads:
        head = f"{_when(t.last_event_at):<19}  {t.run_count:>{runs}}  {t.last_seq:>{seqs}}  "
        out.line(head + _middle(t.thread_id, out.width - width_of(head)))


def cmd_runs(args: argparse.Namespace, out: _Out) -> None:
    """``runs [THREAD]``: a page of runs, newest first."""
    with opened(args.url) as store:
        summaries = store.list_run_summaries(args.thread, status=args.status, limit=args.limit)
        if not summaries and args.thread is not None and not has_thread(store, args.thread):
            raise _no_thread(args.thread)
    if args.json:
        for s in summaries:
            out.line(orjson.dumps(s.to_json_dict()).decode())
        return
    if not summaries:
        out.line("no runs" + (f" with status {args.status}" if args.status else ""))
        return
    # Run ids stay whole (`show` needs them) while the line can hold them: a long thread id is
    # cut in the middle first, down to three columns. Tokens and the first message are left
    # to `summary` when every thread's runs are listed.
    status_width = max(6, *(len(s.status) for s in summaries))
    tokens = max(6, *(len(str(s.total_tokens)) for s in summaries))
    one_thread = args.thread is not None
    title = f"{'started (UTC)':<16}  {'status':<{status_width}}  "
    title += f"{'tokens':>{tokens}}  run" if one_thread else "thread  run"
    out.line(out.paint(out.fit(title), _BOLD))
    for s in summaries:
        head = f"{_when(s.started_at)[:16]:<16}  {s.status:<{status_width}}  "
        room = out.width - width_of(head) - width_of(s.run_id) - 2
        if one_thread:
            head += f"{s.total_tokens:>{tokens}}  "
            room -= tokens + 2
            text = s.run_id
            if s.first_human_message and room >= 20:  # a wide terminal has room for it
                text += f"  {fit(_one_line(s.first_human_message), room)}"
        else:
            text = f"{_middle(s.thread_id, max(room, 3))}  {s.run_id}"
        out.line(_paint_status(out, head, s.status) + fit(text, out.width - width_of(head)))


def _paint_status(out: _Out, head: str, status: str) -> str:
    if not out.color:
        return head
    return head.replace(f"  {status}", "  " + out.paint(status, _STATUS_COLORS.get(status, "")), 1)


def cmd_show(args: argparse.Namespace, out: _Out) -> None:
    """``show THREAD RUN``: the run's timeline and summary, or its events as JSON."""
    with opened(args.url) as store:
        summary = store.get_run_summary(args.thread, args.run)
        if args.json:
            wrote = False
            for event in run_events(store, args.thread, args.run):
                out.line(orjson.dumps(event).decode())
                wrote = True
            if not wrote and summary is None:
                raise _no_run(store, args.thread, args.run)
            return
        events = list(run_events(store, args.thread, args.run))
        if not events and summary is None:
            raise _no_run(store, args.thread, args.run)
    out.line(render_timeline(events, summary, width=out.width, color=out.color))


def cmd_summary(args: argparse.Namespace, out: _Out) -> None:
    """``summary THREAD RUN``: the run's summary."""
    with opened(args.url) as store:
        summary = store.get_run_summary(args.thread, args.run)
        if summary is None:
            if store.list_events(args.thread, args.run, limit=1):
                raise CliError(
                    f"run {args.run!r} of thread {args.thread!r} has no summary (its journal "
                    f"never wrote one): `{PROG} show {_ids(args.thread, args.run)}` shows its "
                    "events"
                )
            raise _no_run(store, args.thread, args.run)
    if args.json:
        out.line(orjson.dumps(summary.to_json_dict()).decode())
        return
    out.line(f"run {summary.run_id} of thread {summary.thread_id}")
    out.line(render_summary(summary, width=out.width, color=out.color))


# -- tail -----------------------------------------------------------------------------------


class _TailPrinter:
    """Events as ``tail`` prints them: a ``-- run ID`` line where the run changes, then one
    line per event: seq, time (UTC), event type, caller and what happened."""

    def __init__(self, out: _Out) -> None:
        self.out = out
        self.run_id: str | None = None

    def print(self, events: Sequence[RunEvent]) -> None:
        """Print ``events`` (in seq order) and flush."""
        out = self.out
        for event, row in zip(events, timeline_rows(events), strict=True):
            if row.run_id != self.run_id:
                self.run_id = row.run_id
                out.line(out.paint(out.fit(f"-- run {row.run_id}"), _BOLD))
            caller = "" if row.caller == row.kind else row.caller
            head = f"{row.seq:>6}  {event['created_at'][11:23]}  "
            kind = f"{row.kind:<16}  "
            rest = out.fit(head + kind + (f"{caller}  {row.text}" if caller else row.text))
            rest = rest[len(head) + len(kind) :]
            tone = _STATUS_COLORS.get(row.status or "", "")
            out.line(out.paint(head, _DIM) + out.paint(kind, tone) + rest)
        out.stream.flush()


class _Follower:
    """Where ``tail`` is in a thread: the last seq it printed, and what it polls after it.

    A thread's seqs only grow and have no gaps but those deletes leave, so its last seq is
    found by a few probes, its latest events are those just below it, and every event
    written later comes after it.
    """

    def __init__(self, store: SyncStore, thread_id: str) -> None:
        self.store = store
        self.thread_id = thread_id
        self.after: int | None = None  # the last seq read

    def _first_after(self, seq: int) -> int | None:
        page = self.store.list_events(self.thread_id, None, limit=1, after_seq=seq)
        return page[0]["seq"] if page else None

    def _last_seq(self) -> int | None:
        """The thread's last seq (``None``: no events): ahead in doubling steps, then halving."""
        known = self._first_after(0)
        if known is None:
            return None
        step = 1
        while (beyond := self._first_after(known + step)) is not None:
            known, step = beyond, step * 2
        low, high = known, known + step  # an event at low, none above high
        while low < high:
            middle = (low + high + 1) // 2
            found = self._first_after(middle - 1)
            if found is None:
                high = middle - 1
            else:
                low = found
        return low

    def start(self, last: int) -> list[RunEvent]:
        """The thread's latest ``last`` events; following starts after them."""
        newest = self._last_seq()
        if newest is None:
            return []
        span = max(last, 1)
        while True:  # more than the window when deletes left gaps in it
            start = newest - span
            events = list(run_events(self.store, self.thread_id, None, max(start, 0)))
            if len(events) >= last or start <= 0:
                # Written meanwhile, events above newest are shown now, not again by poll.
                self.after = events[-1]["seq"] if events else newest
                return events[len(events) - last :] if last else []
            span *= 2

    def poll(self) -> list[RunEvent]:
        """Every event written since the last poll, in seq order."""
        new = list(run_events(self.store, self.thread_id, None, self.after))
        if new:
            self.after = new[-1]["seq"]
        return new


def cmd_tail(args: argparse.Namespace, out: _Out) -> None:
    """``tail THREAD``: the thread's latest events, then with ``--follow`` new ones."""
    try:
        with opened(args.url) as store:
            follower = _Follower(store, args.thread)
            first = follower.start(args.lines)
            if not first and not has_thread(store, args.thread):
                raise _no_thread(args.thread)
            printer = _TailPrinter(out)
            printer.print(first)
            while args.follow:
                time.sleep(args.interval)
                printer.print(follower.poll())
    except KeyboardInterrupt:
        # Ctrl-C is how --follow ends.
        with contextlib.suppress(BrokenPipeError):
            out.stream.flush()


# -- export and import ----------------------------------------------------------------------


def cmd_export(args: argparse.Namespace, out: _Out) -> None:
    """``export THREAD [RUN]``: the export format on stdout, or (``--format otlp``) the runs
    as OpenTelemetry spans sent to an OTLP/HTTP endpoint."""
    if args.format == "otlp":
        _export_otlp(args, out)
        return
    if args.endpoint is not None or args.service_name is not None or args.header:
        raise CliError("--endpoint, --header and --service-name go with --format otlp")
    stream = out.stream.buffer if hasattr(out.stream, "buffer") else None
    write: Callable[[bytes], Any] = (
        stream.write if stream is not None else (lambda b: out.stream.write(b.decode()))
    )
    with opened(args.url) as store:
        if args.run is not None:
            summaries = [s for s in [store.get_run_summary(args.thread, args.run)] if s]
            if not summaries and not store.list_events(args.thread, args.run, limit=1):
                raise _no_run(store, args.thread, args.run)
        else:  # every event of the thread: runs with no summary or message too
            summaries = store.list_run_summaries(args.thread)
            if not summaries and not has_thread(store, args.thread):
                raise _no_thread(args.thread)
        write(
            _json_line(
                {
                    "kind": "header",
                    "format": EXPORT_FORMAT,
                    "version": EXPORT_VERSION,
                    "thread_id": args.thread,
                    "run_id": args.run,
                }
            )
        )
        count = 0
        for event in run_events(store, args.thread, args.run):
            write(_json_line({"kind": "event", **event}))
            count += 1
            if count % 1000 == 0:
                out.note(f"exported {count:,} events")
        for summary in summaries:
            write(_json_line({"kind": "summary", **summary.to_json_dict()}))
        write(_json_line({"kind": "end", "events": count, "summaries": len(summaries)}))
        out.end_note()
        if stream is not None:
            stream.flush()


def _otlp_endpoint(url: str | None) -> str | None:
    """The traces URL: ``url`` as given, ``/v1/traces`` added to one without a path."""
    if url is None:
        return None  # the SDK's: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else localhost:4318
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise CliError(
            f"--endpoint must be an http(s) URL, e.g. http://localhost:4318, not {url!r}"
        )
    return url if parts.path.strip("/") else urlunsplit(parts._replace(path="/v1/traces"))


def _export_otlp(args: argparse.Namespace, out: _Out) -> None:
    """``export --format otlp``: each run's spans, one OTLP/HTTP request per run."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import SpanExportResult

        from deerflow_journal.otel import DEFAULT_SERVICE_NAME, run_spans
    except ImportError:
        raise CliError(
            "--format otlp needs the otel extra: pip install 'deerflow-journal[otel]'"
        ) from None
    endpoint = _otlp_endpoint(args.endpoint)
    headers = dict(_header(h) for h in args.header or ())
    exporter = OTLPSpanExporter(endpoint=endpoint, headers=headers or None)
    where = endpoint or "the endpoint $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT names (or localhost)"
    spans = 0
    try:
        with opened(args.url) as store:
            runs = _runs_to_export(store, args.thread, args.run)
            for run_id in runs:
                built = run_spans(
                    run_events(store, args.thread, run_id),
                    service_name=args.service_name or DEFAULT_SERVICE_NAME,
                )
                if exporter.export(built) is not SpanExportResult.SUCCESS:
                    raise CliError(
                        f"could not send the spans of run {run_id} to {where}: check that an "
                        "OTLP/HTTP receiver listens there (see the log above)"
                    )
                spans += len(built)
    finally:
        exporter.shutdown()
    out.line(f"exported {spans} spans of {len(runs)} run{'s' * (len(runs) != 1)} to {where}")


def _runs_to_export(store: SyncStore, thread_id: str, run_id: str | None) -> list[str]:
    """The run asked for, else every run of the thread (those with events)."""
    if run_id is None:
        runs = list(dict.fromkeys(e["run_id"] for e in run_events(store, thread_id, None)))
        if not runs:
            raise _no_thread(thread_id)
        return runs
    if not store.list_events(thread_id, run_id, limit=1):
        raise _no_run(store, thread_id, run_id)
    return [run_id]


def _header(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise CliError(f"--header takes KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def _not_an_export(name: str, why: str) -> CliError:
    return CliError(f"{name} is not a {PROG} export ({why}): make one with `{PROG} export THREAD`")


def _read_export(path: str, name: str) -> tuple[list[tuple[str, str]], int]:
    """Check the export at ``path`` line by line before anything is written (each event and
    summary as a store would check it); the runs it holds and how many events."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        raise CliError(f"no file {name}: give the path of a file `{PROG} export` wrote") from None
    except OSError as exc:
        raise CliError(f"cannot read {name}: {exc.strerror or exc}: check the path") from None
    with f:
        first = f.readline()
        if not first.strip():
            raise _not_an_export(name, "it is empty" if not first else "its first line is empty")
        try:
            header = orjson.loads(first)
        except orjson.JSONDecodeError:
            raise _not_an_export(name, "its first line is not JSON") from None
        if not (isinstance(header, dict) and header.get("format") == EXPORT_FORMAT):
            raise _not_an_export(name, "no export header on its first line")
        if header.get("version") != EXPORT_VERSION:
            raise CliError(
                f"{name} is a version {header.get('version')} export; this {PROG} reads "
                f"version {EXPORT_VERSION}: upgrade deerflow-journal"
            )
        runs: dict[tuple[str, str], None] = {}
        events = summaries = 0
        end = None
        for number, line in enumerate(f, start=2):
            if end is not None:
                raise _not_an_export(name, f"line {number} follows its end line")
            try:
                item = orjson.loads(line)
                kind = item.pop("kind")
                if kind == "event":
                    item.pop("seq")
                    event = normalise_event(item, max_trace_content=None, max_outputs_content=None)
                    runs[event.thread_id, event.run_id] = None
                    events += 1
                elif kind == "summary":
                    summary = RunSummary.model_validate(item)
                    runs[summary.thread_id, summary.run_id] = None
                    summaries += 1
                elif kind == "end":
                    end = item
                else:
                    raise _not_an_export(name, f"line {number} has kind {kind!r}")
            except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
                raise _not_an_export(name, f"line {number} is no export record") from None
            except ValueError as exc:  # a refused event, an invalid summary
                raise _not_an_export(name, f"line {number}: {_first_line(exc)}") from None
        if end is None or (end.get("events"), end.get("summaries")) != (events, summaries):
            raise CliError(
                f"{name} is cut short (its end line is missing or does not match): export it again"
            )
    return list(runs), events


def cmd_import(args: argparse.Namespace, out: _Out) -> None:
    """``import FILE|-``: an export written into the store ``--url`` names."""
    with contextlib.ExitStack() as stack:
        if args.file == "-":
            # Read twice (checked, then written): stdin goes to a file first.
            spool = stack.enter_context(tempfile.NamedTemporaryFile(suffix=".jsonl"))
            shutil.copyfileobj(sys.stdin.buffer, spool)
            spool.flush()
            path, name = spool.name, "standard input"
        else:
            path, name = args.file, args.file
        runs, total = _read_export(path, name)
        store = stack.enter_context(opened(args.url, read_only=False))
        for thread_id, run_id in runs:
            if store.list_events(thread_id, run_id, limit=1, user_id=None) or (
                store.get_run_summary(thread_id, run_id, user_id=None)
            ):
                raise CliError(
                    f"the target journal already has run {run_id!r} of thread {thread_id!r}: "
                    "import into another store, or delete that run there first"
                )
        try:
            events, summaries = _write_export(store, path, total, out)
        except (Exception, KeyboardInterrupt) as exc:
            out.end_note()
            raise _import_undone(store, runs, exc) from exc
    out.line(f"imported {events} events and {summaries} run summaries")


def _import_undone(
    store: SyncStore, runs: list[tuple[str, str]], failure: BaseException
) -> CliError:
    """Remove the runs an import that failed part way had begun (none of them was in the
    target before it); the error that says so, or which runs are left half written."""
    why = "interrupted" if isinstance(failure, KeyboardInterrupt) else _first_line(failure)
    left = []
    for thread_id, run_id in runs:
        try:
            store.delete_by_run(thread_id, run_id, user_id=None)
        except Exception:
            left.append(f"{run_id!r} of thread {thread_id!r}")
    if not left:
        return CliError(f"the import failed ({why}); nothing of it was kept: import it again")
    others = f" and {len(left) - 1} more of its runs" if len(left) > 1 else ""
    return CliError(
        f"the import failed ({why}) and left run {left[0]}{others} half written there: "
        f"delete {'them' if others else 'it'}, then import it again"
    )


def _write_export(store: SyncStore, path: str, total: int, out: _Out) -> tuple[int, int]:
    batch: list[dict[str, Any]] = []
    written = 0
    summaries: list[RunSummary] = []
    with open(path, "rb") as f:
        f.readline()  # the header
        for line in f:
            item = orjson.loads(line)
            kind = item.pop("kind")
            if kind == "event":
                item.pop("seq", None)  # the target gives its own, in the same order
                batch.append(item)
                if len(batch) == _IMPORT_BATCH:
                    written += len(store.put_batch(batch))
                    batch = []
                    out.note(f"imported {written:,} of {total:,} events")
            elif kind == "summary":
                summaries.append(RunSummary.model_validate(item))
    if batch:
        written += len(store.put_batch(batch))
    for summary in summaries:
        store.put_run_summary(summary)
    out.end_note()
    return written, len(summaries)


# -- serve --------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace, out: _Out) -> None:
    """``serve``: the web viewer on ``--host``:``--port`` until Ctrl-C."""
    try:
        from deerflow_journal.web import is_loopback, serve
    except ImportError as exc:
        raise CliError(
            f"the web viewer needs its extra ({_first_line(exc)}): "
            "pip install 'deerflow-journal[ui]'"
        ) from None
    if not is_loopback(args.host) and not args.expose:
        raise CliError(
            f"{args.host} is not a loopback address and the viewer has no login: pass --expose "
            "to serve the journal to everyone who can reach it there"
        )
    with opened(args.url):  # a bad URL or a missing journal fails here, in one line
        pass
    with contextlib.suppress(KeyboardInterrupt):
        serve(
            args.url,
            host=args.host,
            port=args.port,
            user_id=args.user,
            expose=args.expose,
            poll_interval=args.interval,
        )


def _port(text: str) -> int:
    value = _positive(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be at most 65535, got {value}")
    return value


def _user(text: str) -> str:
    return _checked(text, "--user")


def _thread(text: str) -> str:
    return _checked(text, "THREAD")


def _run(text: str) -> str:
    return _checked(text, "RUN")


def _checked(text: str, name: str) -> str:
    """An id as the stores check it: a bad one is a usage error, not a failed read."""
    try:
        return check_text(text, name)
    except (TypeError, ValueError) as exc:
        said = str(exc)  # it quotes the id, which may be very long
        if len(said) > 200:
            said = f"{name} is {len(text)} characters; {said[:120]}…"
        raise argparse.ArgumentTypeError(said) from None


# -- the command line -----------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on stderr."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")
        sys.exit(2)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 3600, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``deerflow-journal`` argument parser."""
    url_help = f"the journal's store URL (default: ${STORE_URL_ENV}, else {default_store_url()})"
    parser = _Parser(
        prog=PROG,
        description="Look at a deerflow-journal store, or copy runs into another one.",
    )
    parser.add_argument("--url", help=url_help)
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_Parser
    )

    def command(name: str, run: Callable[..., None], help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        # Also after the command; SUPPRESS keeps a --url given before it.
        sub.add_argument("--url", default=argparse.SUPPRESS, help=url_help)
        sub.set_defaults(handler=run)
        return sub

    sub = command("threads", cmd_threads, "threads, most recent activity first")
    sub.add_argument("--limit", type=_positive, default=20, help="how many (default 20)")
    sub.add_argument("--json", action="store_true", help="one JSON object per thread")

    sub = command("runs", cmd_runs, "runs (of one thread, or of every thread), newest first")
    sub.add_argument("thread", nargs="?", type=_thread, metavar="THREAD")
    sub.add_argument("--status", choices=RUN_STATUSES)
    sub.add_argument("--limit", type=_positive, default=20, help="how many (default 20)")
    sub.add_argument("--json", action="store_true", help="one run summary (JSON) per line")

    sub = command("show", cmd_show, "a run's timeline and summary")
    sub.add_argument("thread", type=_thread, metavar="THREAD")
    sub.add_argument("run", type=_run, metavar="RUN")
    sub.add_argument("--json", action="store_true", help="the run's events, one JSON per line")

    sub = command("summary", cmd_summary, "a run's summary: status, timing, tokens")
    sub.add_argument("thread", type=_thread, metavar="THREAD")
    sub.add_argument("run", type=_run, metavar="RUN")
    sub.add_argument("--json", action="store_true", help="the summary as JSON")

    sub = command("tail", cmd_tail, "a thread's latest events; with --follow, new ones too")
    sub.add_argument("thread", type=_thread, metavar="THREAD")
    sub.add_argument("--follow", "-f", action="store_true", help="print new events until Ctrl-C")
    sub.add_argument("--lines", "-n", type=_positive, default=10, help="how many (default 10)")
    sub.add_argument("--interval", type=_seconds, default=0.5, help="seconds between polls")

    sub = command("export", cmd_export, "a thread's (or run's) events and summaries as JSONL")
    sub.add_argument("thread", type=_thread, metavar="THREAD")
    sub.add_argument("run", nargs="?", type=_run, metavar="RUN")
    sub.add_argument(
        "--format",
        choices=("jsonl", "otlp"),
        default="jsonl",
        help="jsonl (default): the export format on stdout; otlp: OpenTelemetry spans sent to "
        "--endpoint (needs the otel extra)",
    )
    sub.add_argument(
        "--endpoint",
        metavar="URL",
        help="OTLP/HTTP traces URL (default: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else "
        "http://localhost:4318/v1/traces; a URL without a path gets /v1/traces)",
    )
    sub.add_argument(
        "--header", action="append", metavar="KEY=VALUE", help="an HTTP header to send (repeat)"
    )
    sub.add_argument("--service-name", help="service.name of the spans (default deerflow-journal)")

    sub = command("import", cmd_import, "write an export into the store --url names")
    sub.add_argument("file", metavar="FILE|-", help="an export file, or - for standard input")

    sub = command("serve", cmd_serve, "a read-only web viewer and JSON API (extra ui)")
    sub.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    sub.add_argument("--port", type=_port, default=8765, help="port (default 8765)")
    sub.add_argument("--user", type=_user, help="show only this user's runs")
    sub.add_argument(
        "--expose", action="store_true", help="allow a --host that is not loopback (no login!)"
    )
    sub.add_argument(
        "--interval", type=_seconds, default=1.0, help="seconds between live timeline polls"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); the exit status."""
    args = build_parser().parse_args(argv)
    out = _Out()
    try:
        args.handler(args, out)
        out.stream.flush()
    except CliError as exc:
        out.end_note()
        _say(str(exc))
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # A reader that stopped early (| head): nothing more to say, and no traceback at exit.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:
        if os.environ.get(DEBUG_ENV):
            raise
        _say(
            f"unexpected {type(exc).__name__}: {_first_line(exc)} (set {DEBUG_ENV}=1 to see "
            "where; please report it)"
        )
        return 1
    return 0


def _say(message: str) -> None:
    sys.stderr.write(f"{PROG}: error: {_one_line(message)}\n")
    sys.stderr.flush()
