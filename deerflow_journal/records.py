"""The record envelope and the one normalisation every backend runs before it writes.

Backends never see raw caller input: they receive ``PendingEvent`` objects whose ids, names and
timestamps are checked and whose content and metadata are already plain JSON values together
with their encoded text. That is what makes the same writes read back identically everywhere;
an event one backend could not hold is refused (``EventRefused``) before any backend sees it.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import math
import re
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypedDict

import orjson

from deerflow_journal.catalog import RUN_EVENT_CATEGORY_MAX_LENGTH, RUN_EVENT_TYPE_MAX_LENGTH

__all__ = [
    "AUTO",
    "DEFAULT_MAX_OUTPUTS_CONTENT",
    "DEFAULT_MAX_TRACE_CONTENT",
    "FIT_KEEPS_WHOLE",
    "ID_MAX_LENGTH",
    "JSON_MAX_LENGTH",
    "Auto",
    "EventRefused",
    "PendingEvent",
    "RunEvent",
    "check_max_outputs_content",
    "check_max_trace_content",
    "check_text",
    "current_user_id",
    "decode_json",
    "encode_json",
    "fit_json",
    "make_record",
    "normalise_batch",
    "normalise_created_at",
    "normalise_event",
    "normalise_journal_batch",
    "resolve_read_user",
    "some_names",
    "user_scope",
    "utc_timestamp",
]

ID_MAX_LENGTH = 128
DEFAULT_MAX_TRACE_CONTENT = 10240
#: Bytes of outputs-category content kept (``run.end`` holds the whole graph state, which a chat
#: thread rewrites every turn: uncut, its storage would grow with the square of its turns).
DEFAULT_MAX_OUTPUTS_CONTENT = 65536
#: Characters of JSON text an event's content, and its metadata, may each take. PostgreSQL
#: sets it: jsonb needs up to 6 bytes per character (an array of digits) and holds at most
#: 2**28 - 1 bytes, and numbers travel spelled in all their digits (``5e-324`` in 326
#: characters), while a statement's parameters, like a row read back, must stay under 1 GB:
#: an event whose two values are both at this limit still fits.
JSON_MAX_LENGTH = 8 * 1024 * 1024
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # C0, DEL and C1
_ALLOWED_KEYS = frozenset(
    {
        "thread_id",
        "run_id",
        "event_type",
        "category",
        "content",
        "metadata",
        "created_at",
        "user_id",
    }
)
# Without OPT_NON_STR_KEYS: a dict with other keys takes ``_plain``, which checks collisions.
_ORJSON_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
_ORJSON_INTS = (-(2**63), 2**64 - 1)  # the integers orjson writes, and reads back exactly
_NOT_BATCHES = (str, bytes, Mapping)  # sequences (or not) that are no list of events


class EventRefused(ValueError):
    """An event a store cannot hold as given: retrying the write cannot help."""


class RunEvent(TypedDict):
    """A stored event as every backend returns it (readers must ignore extra keys)."""

    thread_id: str
    run_id: str
    seq: int
    event_type: str
    category: str
    content: Any
    metadata: dict[str, Any]
    created_at: str
    user_id: str | None


class Auto(enum.Enum):
    """Type of the ``AUTO`` sentinel."""

    AUTO = "AUTO"

    def __repr__(self) -> str:
        return "AUTO"


#: Read argument meaning "the current ``user_scope`` user, or unscoped if none is set".
AUTO = Auto.AUTO

_current_user: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "deerflow_journal_user_id", default=None
)


def current_user_id() -> str | None:
    """Return the user set by the innermost ``user_scope``, or ``None``."""
    return _current_user.get()


@contextlib.contextmanager
def user_scope(user_id: str | None) -> Iterator[None]:
    """Stamp writes with ``user_id`` and scope ``AUTO`` reads to it inside the block."""
    if user_id is not None:
        check_text(user_id, "user_id")
    token = _current_user.set(user_id)
    try:
        yield
    finally:
        _current_user.reset(token)


def resolve_read_user(user_id: str | Auto | None) -> str | None:
    """Turn a read method's ``user_id`` argument into an explicit filter (``None``: unscoped)."""
    if user_id is AUTO:
        return _current_user.get()
    if user_id is not None:
        check_text(user_id, "user_id")
    return user_id


#: How many names an error message lists before it says how many more there are.
NAMES_LISTED = 5


def some_names(names: Sequence[str], noun: str) -> str:
    """The first ``NAMES_LISTED`` of ``names`` and how many more ``noun`` there are, for an
    error message that must stay one readable line however many there are (``-``: none)."""
    listed = ", ".join(names[:NAMES_LISTED]) or "-"
    more = len(names) - NAMES_LISTED
    if more <= 0:
        return listed
    return f"{listed} and {more} more {noun}{'s' if more > 1 else ''}"


def check_text(value: object, field: str, max_length: int = ID_MAX_LENGTH, where: str = "") -> str:
    """Return ``value`` if it is a 1..max_length string with no control characters (C0, DEL,
    C1) or lone surrogates (what every backend can store and index); raise naming ``field``
    otherwise."""
    # Printable ASCII has neither: the common case needs no regex and no encoding.
    if (
        type(value) is str
        and 0 < len(value) <= max_length
        and value.isascii()
        and value.isprintable()
    ):
        return value
    if not isinstance(value, str):
        raise TypeError(f"{where}{field} must be a string, got {type(value).__name__}")
    if not value or len(value) > max_length:
        raise ValueError(f"{where}{field} must be 1 to {max_length} characters, got {value!r}")
    if _CONTROL_CHARS.search(value):
        raise ValueError(f"{where}{field} must not contain control characters, got {value!r}")
    if _clean_text(value) is not value:
        raise ValueError(f"{where}{field} must be valid Unicode (no lone surrogates)")
    return value


def _clean_text(text: str) -> str:
    """Replace U+0000 and lone surrogates (which jsonb refuses) with U+FFFD; keep valid pairs.

    Returns ``text`` itself when it has neither.
    """
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def _plain(value: Any, default: Callable[[Any], Any]) -> Any:
    """``value`` rebuilt as orjson would write it, less what orjson or jsonb refuse: strings
    cleaned, integers outside orjson's range as strings, dict keys as ``_key`` makes them.

    It follows orjson type for type (what orjson writes itself is kept or unpacked as orjson
    does, anything else is what ``default`` makes of it), so both paths of ``encode_json``
    give a value the same form.
    """
    if isinstance(value, str):
        return _clean_text(value)
    if value is None or isinstance(value, bool | uuid.UUID) or type(value) is float:
        return value
    if isinstance(value, int):
        return value if _ORJSON_INTS[0] <= value <= _ORJSON_INTS[1] else str(value)
    if isinstance(value, dict):
        plain: dict[str, Any] = {}
        for key, item in value.items():
            name = _key(key)
            if name in plain:
                first = next(k for k in value if _key(k) == name)
                raise ValueError(f"keys {first!r} and {key!r} would both be stored as {name!r}")
            plain[name] = _plain(item, default)
        return plain
    if isinstance(value, list) or type(value) is tuple:
        return [_plain(item, default) for item in value]
    if isinstance(value, enum.Enum):
        return _plain(value.value, default)
    return _plain(default(value), default)


def _key(key: Any) -> str:
    """The string a dict key is stored as."""
    if isinstance(key, str):
        return _clean_text(str.__str__(key))  # its characters as a str: orjson takes no subclass
    if key is None:
        return "null"
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, enum.Enum):
        return _key(key.value)
    return _clean_text(str(key))


def encode_json(value: Any, default: Callable[[Any], Any] = str) -> str:
    """Encode ``value`` as JSON text with ``json.dumps(default=str)`` semantics.

    Values JSON cannot hold become their ``str()`` (or what ``default`` makes of them); NaN
    and infinities become ``null`` and integers outside -2**63..2**64-1 become strings, and
    U+0000 and lone surrogates in strings become U+FFFD, so that every backend (PostgreSQL
    ``jsonb`` included) can store the text unchanged. Dict keys become strings: ``None`` and
    booleans as in JSON (``null``, ``true``), an enum as its value, any other key as its
    ``str()`` (``1``, ``1.5``, ``nan``, ``2024-05-06 07:08:09``). Two keys of one dict that
    would become the same string (``1`` and ``"1"``) raise ``ValueError``: one value would be
    lost. A value is encoded alike whatever sits beside it.
    """
    try:
        text = orjson.dumps(value, default=default, option=_ORJSON_OPTIONS).decode()
    except TypeError:  # a non-string key, an integer or a string orjson refuses
        text = None
    # A backslash is rare in JSON text and found by memchr: the longer search mostly skipped.
    if text is None or ("\\" in text and "\\u0000" in text):
        text = orjson.dumps(_plain(value, default), option=_ORJSON_OPTIONS).decode()
    return text


def decode_json(text: str | bytes) -> Any:
    """Decode JSON text written by ``encode_json``."""
    return orjson.loads(text)


# The stored form of a timestamp; a string already in it is kept once its date and time of
# day (up to the second) are known to be valid, which is cached: events come in bursts.
_STORED_TIMESTAMP = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}\+00:00"
)
_VALID_SECONDS: dict[str, None] = {}
# "YYYY-MM-DDTHH:MM:SS." of recent epoch seconds, keyed by the whole second as a float.
_SECOND_PREFIXES: dict[float, str] = {}
_THREE_DIGITS = [f"{n:03d}" for n in range(1000)]  # microseconds as two halves: no formatting


def utc_timestamp(seconds: float) -> str:
    """Format a ``time.time()`` value as a stored timestamp, without building a datetime.

    Microseconds are rounded as ``datetime.fromtimestamp`` rounds them.
    """
    fraction, whole = math.modf(seconds)
    micro = round(fraction * 1e6)  # NaN raises here, as int(whole) would
    if micro >= 1_000_000:
        whole, micro = whole + 1, micro - 1_000_000
    elif micro < 0:
        whole, micro = whole - 1, micro + 1_000_000
    prefix = _SECOND_PREFIXES.get(whole)
    if prefix is None:
        prefix = _second_prefix(whole)
    return f"{prefix}{_THREE_DIGITS[micro // 1000]}{_THREE_DIGITS[micro % 1000]}+00:00"


def _second_prefix(whole: float) -> str:
    """The cached ``"YYYY-MM-DDTHH:MM:SS."`` of an epoch second."""
    second = int(whole)  # an infinity raises OverflowError here
    if len(_SECOND_PREFIXES) >= 1024:
        _SECOND_PREFIXES.clear()
    prefix = _SECOND_PREFIXES[whole] = datetime.fromtimestamp(second, UTC).isoformat()[:19] + "."
    return prefix


def normalise_created_at(value: datetime | str | None, field: str = "created_at") -> str:
    """Return ``value`` as an ISO-8601 UTC timestamp; naive values are taken as UTC."""
    if type(value) is str and _STORED_TIMESTAMP.fullmatch(value):
        if value[:19] in _VALID_SECONDS:
            return value
        try:
            valid = datetime.fromisoformat(value).isoformat(timespec="microseconds") == value
        except ValueError:
            valid = False
        if valid:
            if len(_VALID_SECONDS) >= 1024:
                _VALID_SECONDS.clear()
            _VALID_SECONDS[value[:19]] = None
            return value
    if value is None:  # now, without building a datetime (half the time)
        return utc_timestamp(time.time())
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"{field} is not an ISO-8601 timestamp: {value!r}") from None
    else:
        raise TypeError(f"{field} must be a datetime or an ISO-8601 string, got {value!r}")
    if moment.tzinfo is UTC:  # the common case, and it cannot overflow
        return moment.isoformat(timespec="microseconds")
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    try:
        return moment.astimezone(UTC).isoformat(timespec="microseconds")
    except OverflowError:
        raise ValueError(f"{field} is outside the years 1 to 9999 in UTC: {value!r}") from None


def make_record(
    thread_id: str,
    run_id: str,
    seq: int,
    event_type: str,
    category: str,
    content: Any,
    metadata: Any,
    created_at: str,
    user_id: str | None,
) -> RunEvent:
    """The stored record of these fields, its keys in the order every backend returns."""
    # Built only here, so the order is one: JSONL lines and JSON dumps of records show it.
    return {
        "thread_id": thread_id,
        "run_id": run_id,
        "seq": seq,
        "event_type": event_type,
        "category": category,
        "content": content,
        "metadata": metadata,
        "created_at": created_at,
        "user_id": user_id,
    }


@dataclass(slots=True)
class PendingEvent:
    """A validated, normalised event on its way into a backend (seq not yet assigned)."""

    thread_id: str
    run_id: str
    event_type: str
    category: str
    content_json: str
    metadata_json: str
    created_at: str
    user_id: str | None
    #: ``metadata.task_id`` and ``metadata.caller`` when they are text: stores index them.
    task_id: str | None = None
    caller: str | None = None
    #: The metadata as plain JSON values, if decoded already (``metadata`` decodes it once).
    decoded_metadata: dict[str, Any] | None = field(default=None, compare=False, repr=False)

    @property
    def content(self) -> Any:
        """The content as plain JSON values, decoded afresh from ``content_json``."""
        return orjson.loads(self.content_json)

    @property
    def metadata(self) -> dict[str, Any]:
        """The metadata as plain JSON values (decoded from ``metadata_json`` on first use)."""
        metadata = self.decoded_metadata
        if metadata is None:
            metadata = self.decoded_metadata = orjson.loads(self.metadata_json)
        return metadata

    def columns(self) -> tuple[Any, ...]:
        """The row the SQL backends store, in their ``INSERT``'s column order."""
        return (
            self.thread_id,
            self.run_id,
            self.event_type,
            self.category,
            self.content_json,
            self.metadata_json,
            self.created_at,
            self.user_id,
            self.task_id,
            self.caller,
        )

    def record(self, seq: int) -> RunEvent:
        """Return the stored record this event becomes once it has ``seq``."""
        return make_record(
            self.thread_id,
            self.run_id,
            seq,
            self.event_type,
            self.category,
            orjson.loads(self.content_json),
            self.metadata,
            self.created_at,
            self.user_id,
        )


def normalise_event(
    event: Mapping[str, Any],
    *,
    max_trace_content: int | None = DEFAULT_MAX_TRACE_CONTENT,
    max_outputs_content: int | None = DEFAULT_MAX_OUTPUTS_CONTENT,
    index: int | None = None,
    now: str | None = None,
    default: Callable[[Any], Any] = str,
) -> PendingEvent:
    """Validate one event mapping (``put`` keyword arguments) and normalise it for storage.

    Raises ``TypeError`` or ``EventRefused`` naming the field, prefixed with ``event {index}:``
    when the event is part of a batch. ``now`` is the timestamp for events without
    ``created_at`` (a batch shares one); ``default`` encodes values JSON cannot hold. Trace
    content over ``max_trace_content`` bytes, and outputs content over ``max_outputs_content``,
    is cut (``None``: kept whole).
    """
    where = "" if index is None else f"event {index}: "
    try:  # free in the common case: no extra call per event
        if type(event) is not dict and not isinstance(event, Mapping):  # dicts skip the ABC check
            raise TypeError(f"{where}an event must be a mapping, got {type(event).__name__}")
        if not _ALLOWED_KEYS.issuperset(event):
            unknown = event.keys() - _ALLOWED_KEYS
            raise EventRefused(
                f"{where}unknown event field(s) {sorted(unknown)}; seq is assigned by the store"
                if "seq" in unknown
                else f"{where}unknown event field(s) {sorted(unknown)}"
            )
        for required in ("thread_id", "run_id", "event_type", "category"):
            if required not in event:
                raise EventRefused(f"{where}{required} is required")
        thread_id = check_text(event["thread_id"], "thread_id", where=where)
        run_id = check_text(event["run_id"], "run_id", where=where)
        event_type = check_text(event["event_type"], "event type", RUN_EVENT_TYPE_MAX_LENGTH, where)
        category = check_text(event["category"], "category", RUN_EVENT_CATEGORY_MAX_LENGTH, where)
        if "user_id" in event:
            user_id = event["user_id"]
            if user_id is not None:
                check_text(user_id, "user_id", where=where)
        else:
            user_id = _current_user.get()

        metadata = event.get("metadata")
        if metadata is None:
            metadata = {}
        elif type(metadata) is not dict:
            if not isinstance(metadata, Mapping):
                raise TypeError(f"{where}metadata must be a dict, got {type(metadata).__name__}")
            metadata = dict(metadata)
        content = event.get("content", "")

        content_json = _encode_field(content, "content", where, default)
        content_json, metadata = _cut(
            category, content, content_json, metadata, max_trace_content, max_outputs_content
        )
        metadata_json = _encode_field(metadata, "metadata", where, default)
        if len(content_json) > JSON_MAX_LENGTH or len(metadata_json) > JSON_MAX_LENGTH:
            _too_long(content_json, metadata_json, where)
        metadata = orjson.loads(metadata_json)
        task_id = metadata.get("task_id")
        if type(task_id) is not str:
            task_id = None
        elif len(task_id) > ID_MAX_LENGTH:
            raise EventRefused(_long_task_id(len(task_id), where))
        created_at = event.get("created_at")
        return PendingEvent(
            thread_id,
            run_id,
            event_type,
            category,
            content_json,
            metadata_json,
            now
            if now is not None and created_at is None
            else normalise_created_at(created_at, f"{where}created_at"),
            user_id,
            task_id,
            caller if type(caller := metadata.get("caller")) is str else None,
            metadata,
        )
    except EventRefused:
        raise
    except ValueError as exc:  # check_text and normalise_created_at, which reads share
        raise EventRefused(*exc.args) from None


def _cut(
    category: str,
    content: Any,
    content_json: str,
    metadata: dict[str, Any],
    max_trace_content: int | None,
    max_outputs_content: int | None,
) -> tuple[str, dict[str, Any]]:
    """The content JSON and metadata to store: trace and outputs content over its category's
    limit (``None``: no limit) cut to it, with metadata that says so; the rest as it is."""
    if category == "trace":
        limit = max_trace_content
    elif category == "outputs":
        limit = max_outputs_content
    else:
        return content_json, metadata
    if limit is None:
        return content_json, metadata
    # Content stored as a JSON string (text, or an id, a path, bytes as their ``str()``) is
    # cut as that string, cleaned as stored, as it is once read back and written again.
    text = decode_json(content_json) if content_json.startswith('"') else content_json
    raw = text.encode()
    if len(raw) <= limit:
        return content_json, metadata
    cut = encode_json(raw[:limit].decode("utf-8", "ignore"))
    return cut, {**metadata, "content_truncated": True, "original_byte_length": len(raw)}


#: Strings this short (ids, types, names, the text of most messages) ``fit_json`` keeps whole.
FIT_KEEPS_WHOLE = 256


def fit_json(text: str, limit: int = JSON_MAX_LENGTH) -> str | None:
    """``text`` (JSON from ``encode_json``) cut to take at most ``limit`` characters, keeping
    the value's shape and its short fields (a message stays a message, its ids whole).

    Its strings longer than ``FIT_KEEPS_WHOLE`` are cut to one length, the longest that
    fits. If that is not enough (a list of a million short rows), the largest field of the
    top-level object or list is cut instead, as much as needed: a string to its start, any
    other value to the start of its JSON text, as a string. ``None`` if neither fits.
    """
    if len(text) <= limit:
        return text
    value = orjson.loads(text)
    fitted = _fit_strings(value, text, limit)
    return fitted if fitted is not None else _fit_largest_field(orjson.loads(text), limit)


def _fit_strings(value: Any, text: str, limit: int) -> str | None:
    """``value`` (``text`` decoded) as JSON with its long strings cut to fit, or ``None``."""
    long: list[tuple[Any, Any, str]] = []  # (container, key or index, string)
    if isinstance(value, str):
        long.append((None, None, value))
    stack = [value] if isinstance(value, dict | list) else []
    while stack:
        node = stack.pop()
        for key, item in node.items() if isinstance(node, dict) else enumerate(node):
            if isinstance(item, str):
                if len(item) > FIT_KEEPS_WHOLE:
                    long.append((node, key, item))
            elif isinstance(item, dict | list):
                stack.append(item)
    # The JSON of the whole is the rest plus each long string's own JSON: only those are
    # encoded again while the length is searched for.
    rest = len(text) - sum(_json_length(string) for _, _, string in long)

    def fits(length: int) -> bool:
        return rest + sum(_json_length(string[:length]) for _, _, string in long) <= limit

    # A character takes one or more: no string longer than the limit fits.
    high = min(max((len(string) for _, _, string in long), default=0), limit)
    low = _longest_fitting(FIT_KEEPS_WHOLE, high, fits) if long else None
    if low is None:
        return None
    if long[0][0] is None:
        value = long[0][2][:low]
    else:
        for node, key, string in long:
            node[key] = string[:low]
    fitted = orjson.dumps(value).decode()
    return fitted if len(fitted) <= limit else None


def _fit_largest_field(value: Any, limit: int) -> str | None:
    """``value`` as JSON with its largest top-level field cut to fit as a string, or ``None``."""
    if isinstance(value, dict):
        fields = list(value.items())
    elif isinstance(value, list):
        fields = list(enumerate(value))
    else:
        return None
    if not fields:
        return None
    sizes = {key: len(orjson.dumps(item).decode()) for key, item in fields}
    largest = max(sizes, key=sizes.__getitem__)
    whole = orjson.dumps(value).decode()
    room = limit - (len(whole) - sizes[largest])  # what the largest field may take
    field = value[largest]
    field_text = field if isinstance(field, str) else orjson.dumps(field).decode()
    # The longest start of its text that fits, as a JSON string.
    length = _longest_fitting(
        0, min(len(field_text), limit), lambda n: _json_length(field_text[:n]) <= room
    )
    if length is None:
        return None
    value[largest] = field_text[:length]
    fitted = orjson.dumps(value).decode()
    return fitted if len(fitted) <= limit else None


def _longest_fitting(low: int, high: int, fits: Callable[[int], bool]) -> int | None:
    """The largest ``n`` from ``low`` to ``high`` for which ``fits(n)`` (true up to some ``n``,
    false past it); ``None`` if not even ``low`` fits."""
    if not fits(low):
        return None
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def _json_length(string: str) -> int:
    """How many characters ``string`` takes as JSON (escapes and quotes included)."""
    encoded = orjson.dumps(string)
    return len(encoded) if string.isascii() else len(encoded.decode())


def _encode_field(value: Any, field: str, where: str, default: Callable[[Any], Any]) -> str:
    try:
        return encode_json(value, default)
    except MemoryError:
        raise  # says nothing about the value: the write is retried
    except Exception as exc:
        # orjson says "Recursion limit reached" for deep or circular values, and a value's own
        # code (a mapping's iteration, a __str__) may raise anything: either way this value
        # cannot be stored, which is refused naming the field.
        raise EventRefused(f"{where}{field} cannot be stored as JSON: {exc!r}") from None


def _long_task_id(length: int, where: str) -> str:
    # Stores index it: PostgreSQL refuses an index entry over about 2.7 kB.
    return f"{where}metadata.task_id must be at most {ID_MAX_LENGTH} characters, got {length}"


def _too_long(content_json: str, metadata_json: str, where: str) -> None:
    field, text = (
        ("content", content_json)
        if len(content_json) > JSON_MAX_LENGTH
        else ("metadata", metadata_json)
    )
    raise EventRefused(
        f"{where}{field} is {len(text)} characters of JSON, over the limit of "
        f"{JSON_MAX_LENGTH} that every store can hold"
    )


#: (event type, category) pairs found valid: ``check_text`` depends on nothing else, and a
#: journal writes a few kinds over and over.
_VALID_KINDS: set[tuple[str, str]] = set()


def _check_kind(event_type: str, category: str) -> None:
    """Check an event type and category as ``normalise_event`` does, and note them valid."""
    check_text(event_type, "event type", RUN_EVENT_TYPE_MAX_LENGTH)
    check_text(category, "category", RUN_EVENT_CATEGORY_MAX_LENGTH)
    if len(_VALID_KINDS) >= 1024:  # bounded: tags made on the fly would pile up
        _VALID_KINDS.clear()
    _VALID_KINDS.add((event_type, category))


def normalise_batch(
    events: Sequence[Mapping[str, Any]],
    *,
    max_trace_content: int | None = DEFAULT_MAX_TRACE_CONTENT,
    max_outputs_content: int | None = DEFAULT_MAX_OUTPUTS_CONTENT,
    default: Callable[[Any], Any] = str,
) -> list[PendingEvent]:
    """Normalise a whole batch before anything is written; errors name the event's index."""
    if isinstance(events, _NOT_BATCHES) or not isinstance(events, Sequence):
        raise TypeError(f"events must be a list of event dicts, got {type(events).__name__}")
    # One timestamp for the events without one, taken only if there are any.
    undated = any(type(e) is not dict or e.get("created_at") is None for e in events)
    now = normalise_created_at(None) if undated else None
    ids: set[str] = set()  # ids found valid in this batch, which repeats a few
    uncut = _uncut_length(max_trace_content, max_outputs_content)
    pending = []
    for i, event in enumerate(events):
        found = _batch_event(
            event, i, ids, now, uncut, max_trace_content, max_outputs_content, default
        )
        if found is None:  # not the usual shape, or refused: normalise_event decides it
            found = normalise_event(
                event,
                max_trace_content=max_trace_content,
                max_outputs_content=max_outputs_content,
                index=i,
                now=now,
                default=default,
            )
        pending.append(found)
    return pending


def _batch_event(
    event: Any,
    index: int,
    ids: set[str],
    now: str | None,
    uncut: int,
    max_trace_content: int | None,
    max_outputs_content: int | None,
    default: Callable[[Any], Any],
) -> PendingEvent | None:
    """``normalise_event`` of the batch's event ``index`` when it is a dict of the usual shape,
    its ids and kinds checked once per value; ``None``, before anything is encoded, for any
    other (``normalise_event`` then decides it). Once its content is encoded, an event is
    refused here as ``normalise_event`` would: encoding it again would run ``default`` again."""
    try:
        if type(event) is not dict or not _ALLOWED_KEYS.issuperset(event):
            return None
        thread_id, run_id = event["thread_id"], event["run_id"]  # a missing one: KeyError
        event_type, category = event["event_type"], event["category"]
        # Plain str only: the caches would take an object equal to a checked id for it.
        if type(thread_id) is not str or type(run_id) is not str or type(event_type) is not str:
            return None
        if type(category) is not str:
            return None
        if thread_id not in ids:
            ids.add(check_text(thread_id, "thread_id"))
        if run_id not in ids:
            ids.add(check_text(run_id, "run_id"))
        if (event_type, category) not in _VALID_KINDS:
            _check_kind(event_type, category)
        if "user_id" in event:
            user_id = event["user_id"]
            if user_id is not None:
                if type(user_id) is not str:
                    return None
                if user_id not in ids:
                    ids.add(check_text(user_id, "user_id"))
        else:
            user_id = _current_user.get()
        metadata = event.get("metadata")
        if metadata is None:
            metadata = {}
        elif type(metadata) is not dict:
            return None
        created_at = event.get("created_at")
        if now is None or created_at is not None:
            created_at = normalise_created_at(created_at)
        else:
            created_at = now
    except Exception:
        return None
    content = event.get("content", "")
    try:
        # encode_json's first step inlined; what it would clean takes all of encode_json.
        dumps = orjson.dumps
        try:
            content_json = dumps(content, default=default, option=_ORJSON_OPTIONS).decode()
        except TypeError:
            content_json = _encode_field(content, "content", "", default)
        else:
            if "\\" in content_json and "\\u0000" in content_json:
                content_json = _encode_field(content, "content", "", default)
        if len(content_json) > uncut:  # else no limit could cut it: _cut is skipped
            content_json, metadata = _cut(
                category, content, content_json, metadata, max_trace_content, max_outputs_content
            )
        try:
            metadata_json = dumps(metadata, default=default, option=_ORJSON_OPTIONS).decode()
        except TypeError:
            metadata_json = _encode_field(metadata, "metadata", "", default)
        else:
            if "\\" in metadata_json and "\\u0000" in metadata_json:
                metadata_json = _encode_field(metadata, "metadata", "", default)
        if len(content_json) > JSON_MAX_LENGTH or len(metadata_json) > JSON_MAX_LENGTH:
            _too_long(content_json, metadata_json, "")
        metadata = orjson.loads(metadata_json)
        task_id = metadata.get("task_id")
        if type(task_id) is not str:
            task_id = None
        elif len(task_id) > ID_MAX_LENGTH:
            raise EventRefused(_long_task_id(len(task_id), ""))
    except EventRefused as exc:  # as normalise_event words it, naming the event
        raise EventRefused(f"event {index}: {exc}") from None
    except ValueError as exc:  # as normalise_event turns them
        raise EventRefused(*exc.args) from None
    caller = metadata.get("caller")
    return PendingEvent(
        thread_id,
        run_id,
        event_type,
        category,
        content_json,
        metadata_json,
        created_at,
        user_id,
        task_id,
        caller if type(caller) is str else None,
        metadata,
    )


def normalise_journal_batch(
    events: Sequence[Mapping[str, Any]],
    *,
    max_trace_content: int | None = DEFAULT_MAX_TRACE_CONTENT,
    max_outputs_content: int | None = DEFAULT_MAX_OUTPUTS_CONTENT,
    default: Callable[[Any], Any] = str,
) -> list[PendingEvent]:
    """``normalise_batch`` for the events a journal built: the same events, or the same error.

    A journal's event is a dict with every field, its ids and kinds drawn from a few values:
    those are checked once per value, not once per event. Its ``created_at`` may also be the
    ``time.time()`` float a journal notes, stored as its ``utc_timestamp``. Content and
    metadata are encoded, cut and measured as ``normalise_event`` does, and the metadata is
    not decoded (``PendingEvent.metadata`` decodes it if a backend reads it). Any event not of
    that shape, or that would be refused, sends the whole batch through ``normalise_batch``,
    which stores the same or raises what it always raised.
    """
    if type(events) is list:
        pending = []
        ids: set[tuple[str, str, str | None]] = set()  # (thread, run, user) found valid
        uncut = _uncut_length(max_trace_content, max_outputs_content)
        for event in events:
            found = _journal_event(
                event, ids, uncut, max_trace_content, max_outputs_content, default
            )
            if found is None:
                break
            pending.append(found)
        else:
            return pending
    return normalise_batch(
        [_dated(event) for event in events] if type(events) is list else events,
        max_trace_content=max_trace_content,
        max_outputs_content=max_outputs_content,
        default=default,
    )


def _uncut_length(*limits: int | None) -> int:
    """The longest content JSON that no limit can cut, whatever its category (-1: none)."""
    # A character of JSON text is at most 4 bytes of the UTF-8 that ``_cut`` measures, and
    # decoding a JSON string gives no more characters than its text has.
    if any(type(n) is not int for n in limits if n is not None):
        return -1  # not a store's checked limit: ``_cut`` decides every event
    known = [n for n in limits if n is not None]
    return min(known) // 4 if known else JSON_MAX_LENGTH


def _dated(event: Any) -> Any:
    """``event`` with a float ``created_at`` as its ``utc_timestamp`` (a copy), else itself."""
    if type(event) is dict and type(event.get("created_at")) is float:
        try:
            return {**event, "created_at": utc_timestamp(event["created_at"])}
        except (ValueError, OverflowError, OSError):  # NaN, or out of range: refused as it is
            return event
    return event


def _journal_event(
    event: Any,
    ids: set[tuple[str, str, str | None]],
    uncut: int,
    max_trace_content: int | None,
    max_outputs_content: int | None,
    default: Callable[[Any], Any],
) -> PendingEvent | None:
    """``normalise_event`` of a journal's event, or ``None`` if it is not of the usual shape
    (``normalise_event`` then decides it)."""
    try:
        # Eight keys, all read below (a missing one raises KeyError): the allowed keys exactly.
        if type(event) is not dict or len(event) != 8:
            return None
        thread_id, run_id, user_id = event["thread_id"], event["run_id"], event["user_id"]
        event_type, category = event["event_type"], event["category"]
        # Plain str only: the caches below would take an object equal to a checked id for it.
        if type(thread_id) is not str or type(run_id) is not str or type(event_type) is not str:
            return None
        if type(category) is not str or (user_id is not None and type(user_id) is not str):
            return None
        if (thread_id, run_id, user_id) not in ids:
            check_text(thread_id, "thread_id")
            check_text(run_id, "run_id")
            if user_id is not None:
                check_text(user_id, "user_id")
            ids.add((thread_id, run_id, user_id))
        if (event_type, category) not in _VALID_KINDS:
            _check_kind(event_type, category)
        created_at = event["created_at"]
        metadata = event["metadata"]
        if created_at is None or type(metadata) is not dict:
            return None  # a batch's shared now, an empty or copied metadata: not here
        if type(created_at) is float:
            created_at = utc_timestamp(created_at)  # a stored timestamp as it is made
        else:
            created_at = normalise_created_at(created_at)
        content = event["content"]
        content_json = encode_json(content, default)
        if len(content_json) > uncut:  # else no limit could cut it: _cut is skipped
            content_json, metadata = _cut(
                category, content, content_json, metadata, max_trace_content, max_outputs_content
            )
        # orjson alone (no TypeError, no U+0000 to clean): every key is a str, and a str value
        # decodes as itself, so task_id and caller are read without decoding the metadata.
        metadata_json = orjson.dumps(metadata, default=default, option=_ORJSON_OPTIONS).decode()
        if "\\" in metadata_json and "\\u0000" in metadata_json:
            return None
        if len(content_json) > JSON_MAX_LENGTH or len(metadata_json) > JSON_MAX_LENGTH:
            return None
        task_id, caller = metadata.get("task_id"), metadata.get("caller")
        if (task_id is not None and (type(task_id) is not str or len(task_id) > ID_MAX_LENGTH)) or (
            caller is not None and type(caller) is not str
        ):
            return None
    except Exception:
        return None
    return PendingEvent(
        thread_id,
        run_id,
        event_type,
        category,
        content_json,
        metadata_json,
        created_at,
        user_id,
        task_id,
        caller,
    )


def check_max_trace_content(value: int | None, name: str = "max_trace_content") -> int | None:
    """Validate a store's ``max_trace_content`` option (``None`` disables truncation)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be a positive int or None, got {value!r}")
    return value


def check_max_outputs_content(value: int | None) -> int | None:
    """Validate a store's ``max_outputs_content`` option (``None`` disables truncation)."""
    return check_max_trace_content(value, "max_outputs_content")
