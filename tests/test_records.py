"""The normalisation every store runs before a backend writes, and ``open_store`` URL handling."""

from __future__ import annotations

import asyncio
import math
import random
import re
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from types import MappingProxyType

import orjson
import pytest

from deerflow_journal import AUTO, EventRefused, MemoryRunEventStore, current_user_id, user_scope
from deerflow_journal.journal.mapping import MessageEncoder
from deerflow_journal.records import (
    FIT_KEEPS_WHOLE,
    JSON_MAX_LENGTH,
    PendingEvent,
    decode_json,
    encode_json,
    fit_json,
    normalise_batch,
    normalise_created_at,
    normalise_event,
    normalise_journal_batch,
    resolve_read_user,
    some_names,
    utc_timestamp,
)
from deerflow_journal.stores import DEFAULT_STORE_URL, STORE_URL_ENV, default_store_url, open_store
from tests.journal_events import journal_event, nasty_events


def event(**extra):
    return {
        "thread_id": "t",
        "run_id": "r",
        "event_type": "llm.error",
        "category": "trace",
        **extra,
    }


def test_normalise_event_returns_plain_values_and_their_json_text():
    pending = normalise_event(event(content={"when": datetime(2026, 1, 1, tzinfo=UTC)}))
    assert pending.content == {"when": "2026-01-01 00:00:00+00:00"}
    assert decode_json(pending.content_json) == pending.content
    assert pending.metadata == {} and pending.metadata_json == "{}"
    assert pending.user_id is None


def test_content_defaults_to_an_empty_string():
    assert normalise_event(event()).content == ""


def test_truncation_can_be_disabled_and_is_validated():
    assert normalise_event(event(content="x" * 20000), max_trace_content=None).content == (
        "x" * 20000
    )
    with pytest.raises(ValueError, match="max_trace_content"):
        MemoryRunEventStore(max_trace_content=0)
    with pytest.raises(ValueError, match="max_trace_content"):
        MemoryRunEventStore(max_trace_content=True)


def test_outputs_truncation_can_be_disabled_and_is_validated():
    outputs = event(event_type="run.end", category="outputs", content="x" * 70000)
    assert normalise_event(outputs).content == "x" * 65536
    assert normalise_event(outputs, max_outputs_content=None).content == "x" * 70000
    for bad in (0, -1, True, 1.5, "65536"):
        with pytest.raises(ValueError, match="max_outputs_content"):
            MemoryRunEventStore(max_outputs_content=bad)  # type: ignore[arg-type]


def test_truncation_keeps_existing_metadata():
    pending = normalise_event(
        event(content="y" * 50, metadata={"caller": "lead_agent"}), max_trace_content=10
    )
    assert pending.metadata == {
        "caller": "lead_agent",
        "content_truncated": True,
        "original_byte_length": 50,
    }


def test_fit_json_cuts_the_long_strings_to_one_length_and_keeps_the_short_ones():
    call_id = "call_kS2B3eY3nD9XyZ1aBcDeFgHi"
    message = {
        "type": "tool",
        "content": "chart rendered",
        "tool_call_id": call_id,
        "artifact": {"png": "x" * 5000, "labels": ["a"] * 50, "svg": "<" * 3000},
    }
    text = encode_json(message)
    assert fit_json(text, len(text)) is text  # fits: unchanged
    cut = decode_json(fit_json(text, 2000))
    assert {k: cut[k] for k in ("type", "content", "tool_call_id")} == {
        "type": "tool",
        "content": "chart rendered",
        "tool_call_id": call_id,
    }
    assert cut["artifact"]["labels"] == ["a"] * 50
    png, svg = cut["artifact"]["png"], cut["artifact"]["svg"]
    assert png == "x" * len(png) and svg == "<" * len(svg)
    assert FIT_KEEPS_WHOLE < len(png) == len(svg) < 3000  # both long ones, to one length
    assert len(encode_json(cut)) <= 2000
    # One character longer would not fit: the longest cut that does.
    longer = {**cut, "artifact": {**cut["artifact"], "png": png + "x", "svg": svg + "<"}}
    assert len(encode_json(longer)) > 2000


def test_fit_json_counts_escapes_and_characters_not_bytes():
    quoted = encode_json(['"' * 3000, "\n" * 3000, "\x01" * 1000])
    assert 3990 <= len(fit_json(quoted, 4000)) <= 4000  # each cut to 399 characters
    emoji = encode_json("🧪" * 3000)  # four bytes each in UTF-8, one character
    assert fit_json(emoji, 1002) == encode_json("🧪" * 1000)
    assert fit_json(encode_json("y" * 500), 302) == encode_json("y" * 300)  # a string alone


def test_fit_json_gives_up_when_cutting_the_long_strings_is_not_enough():
    assert fit_json(encode_json(list(range(1000))), 500) is None
    assert fit_json(encode_json(["short id"] * 500), 500) is None  # short strings stay whole
    assert fit_json(encode_json({"k" * 600: ""}), 500) is None  # keys are not cut
    assert fit_json(encode_json({f"k{i}": i for i in range(1000)}), 500) is None


def test_fit_json_cuts_the_largest_field_when_cutting_long_strings_is_not_enough():
    message = {"type": "tool", "content": "3 rows", "artifact": {"rows": ["r1", "r2"] * 500}}
    cut = decode_json(fit_json(encode_json(message), 1000))
    assert (cut["type"], cut["content"]) == ("tool", "3 rows")
    assert encode_json(message["artifact"]).startswith(cut["artifact"])
    assert 900 < len(encode_json(cut)) <= 1000
    # A string is cut itself, below the length kept whole if it must.
    assert fit_json(encode_json(["x" * 1000]), 100) == encode_json(["x" * 96])


def test_error_outside_a_batch_has_no_index_prefix():
    with pytest.raises(ValueError) as info:
        normalise_event(event(thread_id=""))
    assert str(info.value).startswith("thread_id")


def test_normalise_batch_rejects_a_mapping_and_names_non_mapping_events():
    with pytest.raises(TypeError, match="list"):
        normalise_batch(event())
    with pytest.raises(TypeError, match="event 1: an event must be a mapping"):
        normalise_batch([event(), "nope"])


def test_missing_required_field_is_named():
    incomplete = event()
    del incomplete["category"]
    with pytest.raises(ValueError, match="category is required"):
        normalise_event(incomplete)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (datetime(2026, 1, 1, 12), "2026-01-01T12:00:00.000000+00:00"),
        (
            datetime(2026, 1, 1, 12, tzinfo=timezone(timedelta(hours=-7))),
            "2026-01-01T19:00:00.000000+00:00",
        ),
        ("2026-01-01T12:00:00Z", "2026-01-01T12:00:00.000000+00:00"),
        ("2026-01-01 12:00:00.5+01:00", "2026-01-01T11:00:00.500000+00:00"),
        ("2026-01-01", "2026-01-01T00:00:00.000000+00:00"),
    ],
)
def test_created_at_is_normalised_to_aware_utc(value, expected):
    assert normalise_created_at(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        "2026-13-01T00:00:00.000000+00:00",  # the stored form, but no such month
        "2026-02-30T00:00:00.000000+00:00",
        "2026-01-01T24:00:00.000000+00:00",
    ],
)
def test_created_at_in_the_stored_form_is_still_checked(value):
    normalise_created_at("2026-01-01T23:59:59.000000+00:00")  # a valid second, now cached
    with pytest.raises(ValueError, match="created_at"):
        normalise_created_at(value)


def test_created_at_in_the_stored_form_is_kept_as_it_is():
    for _ in range(2):  # checked the first time, known the second
        stored = "2026-03-04T05:06:07.123456+00:00"
        assert normalise_created_at(stored) is stored


def test_created_at_in_the_stored_form_needs_ascii_digits():
    normalise_created_at("2026-01-01T00:00:00.000000+00:00")  # its second is now cached
    arabic = "".join(chr(0x0660 + int(digit)) for digit in "123456")
    with pytest.raises(ValueError, match="created_at"):
        normalise_created_at(f"2026-01-01T00:00:00.{arabic}+00:00")


def test_utc_timestamp_is_the_stored_form_of_what_fromtimestamp_gives():
    rng = random.Random(7)
    values = [0.0, -0.0, 1.5, 0.9999995, 1_796_000_000.0000005, 1_796_000_000.9999995]
    # Microseconds that round into the next second, the previous one, or across a day.
    values += [-0.5e-6, -1.0000004, -1.9999996, 86_399.9999996, 1_796_083_199.9999997]
    values += [rng.uniform(1.6e9, 1.9e9) for _ in range(20_000)]
    for seconds in values:
        stamp = utc_timestamp(seconds)
        assert stamp == datetime.fromtimestamp(seconds, UTC).isoformat(timespec="microseconds")
        assert normalise_created_at(stamp) == stamp


def test_utc_timestamp_refuses_what_fromtimestamp_refuses():
    with pytest.raises(ValueError):
        utc_timestamp(math.nan)
    for infinite in (math.inf, -math.inf):
        with pytest.raises(OverflowError):
            utc_timestamp(infinite)


def test_created_at_of_another_type_is_a_type_error():
    with pytest.raises(TypeError, match="created_at"):
        normalise_created_at(1700000000)  # type: ignore[arg-type]


def test_encode_json_matches_json_dumps_default_str_for_ordinary_values():
    import json

    value = {"a": [1, 2.5, None, True], "b": {"c": "é"}, "d": {1, 2}, "e": (1,)}
    assert decode_json(encode_json(value)) == json.loads(json.dumps(value, default=str))


def test_encode_json_replaces_nul_but_not_an_escaped_backslash_u0000():
    assert decode_json(encode_json("a\x00b")) == "a\ufffdb"
    literal = "a\\u0000b"
    assert decode_json(encode_json(literal)) == literal
    assert decode_json(encode_json("\\\x00")) == "\\\ufffd"


def test_user_scope_nests_and_resets():
    assert current_user_id() is None
    with user_scope("a"):
        assert current_user_id() == "a"
        with user_scope(None):
            assert current_user_id() is None
        assert current_user_id() == "a"
    assert current_user_id() is None


async def test_user_scope_is_per_task():
    async def read_in(user: str) -> str | None:
        with user_scope(user):
            await asyncio.sleep(0)
            return current_user_id()

    assert await asyncio.gather(read_in("a"), read_in("b")) == ["a", "b"]


def test_resolve_read_user():
    assert resolve_read_user(AUTO) is None
    with user_scope("u"):
        assert resolve_read_user(AUTO) == "u"
        assert resolve_read_user(None) is None
        assert resolve_read_user("v") == "v"
    assert repr(AUTO) == "AUTO"


# -- open_store -----------------------------------------------------------------------------


def test_unknown_scheme_lists_the_known_ones():
    with pytest.raises(ValueError) as info:
        open_store("redis://localhost")
    message = str(info.value)
    for scheme in ("memory://", "jsonl://", "sqlite://", "postgresql://"):
        assert scheme in message


@pytest.mark.parametrize("url", ["sqlite:///", "sqlite://relative.db", "jsonl://", "nothing"])
def test_malformed_urls_are_value_errors(url):
    with pytest.raises(ValueError):
        open_store(url)


def test_memory_url_takes_no_path():
    assert isinstance(open_store("memory://"), MemoryRunEventStore)
    with pytest.raises(ValueError):
        open_store("memory://somewhere")


def test_open_store_rejects_a_non_string():
    with pytest.raises(TypeError):
        open_store(Path("x.db"))  # type: ignore[arg-type]


def test_default_url_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(STORE_URL_ENV, raising=False)
    assert default_store_url() == DEFAULT_STORE_URL == "sqlite:///.deer-flow/journal.db"
    monkeypatch.setenv(STORE_URL_ENV, "memory://")
    assert default_store_url() == "memory://"
    assert isinstance(open_store(), MemoryRunEventStore)


@pytest.mark.parametrize(
    ("url", "message"), [("nope://x", "unknown store URL"), ("sqlite://x", "three slashes")]
)
def test_a_bad_url_from_the_environment_names_the_variable(monkeypatch, url, message):
    monkeypatch.setenv(STORE_URL_ENV, url)
    with pytest.raises(ValueError, match=message) as info:
        open_store()
    assert str(info.value).endswith(f"(from ${STORE_URL_ENV})")
    assert repr(url) in str(info.value)
    with pytest.raises(ValueError) as passed:  # a URL passed in is the caller's own
        open_store(url)
    assert STORE_URL_ENV not in str(passed.value)


def test_options_reach_the_constructor():
    assert open_store("memory://", max_trace_content=5).max_trace_content == 5
    assert open_store("memory://", max_outputs_content=7).max_outputs_content == 7
    assert open_store("memory://", max_outputs_content=None).max_outputs_content is None


def test_lone_surrogates_in_content_become_replacement_characters():
    pending = normalise_event(event(content={"k\ud800": ["a\udfffb", "ok 🌍"]}))
    assert pending.content == {"k\ufffd": ["a\ufffdb", "ok 🌍"]}


def test_ids_with_lone_surrogates_are_rejected():
    with pytest.raises(ValueError, match="Unicode"):
        normalise_event(event(thread_id="a\ud800"))


@pytest.mark.parametrize(
    "url", ["sqlite:///j.db?mode=ro", "sqlite:////tmp/j.db#x", "jsonl:///dir?x=1"]
)
def test_a_path_url_with_a_query_or_fragment_is_refused(url):
    # Taken as part of the file name, it would quietly create another file.
    with pytest.raises(ValueError, match="path only"):
        open_store(url)


def test_three_slashes_are_relative_and_four_absolute(tmp_path, monkeypatch):
    from deerflow_journal import JsonlRunEventStore

    monkeypatch.chdir(tmp_path)
    relative = open_store("jsonl:///sub/journal")
    absolute = open_store(f"jsonl:///{tmp_path}/abs")
    assert isinstance(relative, JsonlRunEventStore)
    assert relative.base_dir == Path.cwd() / "sub" / "journal"  # relative to the cwd then
    assert str(absolute.base_dir) == f"{tmp_path}/abs"
    assert absolute.base_dir.is_absolute()


def test_names_share_the_id_rules():
    with pytest.raises(ValueError, match="event type must not contain control characters"):
        normalise_event(event(event_type="a\tb"))
    with pytest.raises(ValueError, match="category must be valid Unicode"):
        normalise_event(event(category="\udc00"))


def _stored(pending: PendingEvent) -> tuple[object, ...]:
    """What a backend stores of a normalised event, and what its record returns."""
    return (*pending.columns(), orjson.dumps(pending.metadata), orjson.dumps(pending.content))


@pytest.mark.parametrize("limits", [(10240, 65536), (None, None), (5, 7)])
def test_the_journal_batch_normalises_as_normalise_batch_does(limits):
    trace, outputs = limits
    events = nasty_events("t")
    options = {"max_trace_content": trace, "max_outputs_content": outputs}
    expected = normalise_batch(events, **options, default=MessageEncoder())
    whole = normalise_journal_batch(events, **options, default=MessageEncoder())
    alone = [normalise_journal_batch([e], **options, default=MessageEncoder())[0] for e in events]
    # Content of every kind stays on the journal's path (its metadata not decoded), unless
    # the metadata needs cleaning.
    fast = [p.decoded_metadata is None for p in alone]
    assert fast == [True, False, False, True, True, True] + [False] * 5 + [True] * 3
    assert [_stored(p) for p in whole] == [_stored(p) for p in expected]
    assert [_stored(p) for p in alone] == [_stored(p) for p in expected]


@pytest.mark.parametrize(
    "bad",
    [
        {"metadata": {"task_id": "x" * 129}},
        {"content": {"a": 1, 1: 2, "1": 3}},
        {"event_type": "bad\x00type"},
        {"thread_id": ""},
        {"user_id": 5},
        {"created_at": "yesterday"},
        {"seq": 3},
    ],
)
def test_the_journal_batch_refuses_what_normalise_batch_refuses(bad):
    events = [journal_event("t", "run.start", "trace", "", {}), {**event(), **bad}]
    events[1] = {**journal_event("t", "llm.error", "trace", "", {}), **bad}
    with pytest.raises((TypeError, ValueError)) as expected:
        normalise_batch(events)
    with pytest.raises(type(expected.value), match=re.escape(str(expected.value))):
        normalise_journal_batch(events)


@pytest.mark.parametrize("fallback", [False, True])
def test_the_journal_batch_stores_a_float_created_at_as_its_timestamp(fallback):
    moment = 1_780_000_000.123456
    metadata = {1: "goes down put_batch's path"} if fallback else {}
    events = [journal_event("t", "llm.error", "trace", "", metadata, created_at=moment)]
    (pending,) = normalise_journal_batch(events)
    assert pending.created_at == utc_timestamp(moment)
    assert events[0]["created_at"] == moment  # the caller's event is left as it is


class _EqualToT:
    """Not a string, but equal to ``"t"`` and hashed alike."""

    def __eq__(self, other: object) -> bool:
        return other == "t"

    def __hash__(self) -> int:
        return hash("t")


@pytest.mark.parametrize("field", ["thread_id", "run_id", "user_id", "event_type", "category"])
def test_the_journal_batch_checks_an_object_equal_to_an_id_it_checked(field):
    checked = journal_event("t", "t", "t", "", {}, run_id="t", user_id="t")
    with pytest.raises(TypeError, match=r"event 1: .*must be a string, got _EqualToT"):
        normalise_journal_batch([checked, {**checked, field: _EqualToT()}])


@pytest.mark.parametrize("moment", [float("nan"), float("inf"), 1e20])
def test_the_journal_batch_refuses_a_float_created_at_no_timestamp_can_hold(moment):
    events = [
        {**journal_event("t", "run.start", "trace", "", {}), "thread_id": ""},
        journal_event("t", "llm.error", "trace", "", {}, created_at=moment),
    ]
    with pytest.raises(EventRefused, match="event 0: thread_id"):  # the first error first
        normalise_journal_batch(events)
    with pytest.raises(TypeError, match="event 0: created_at must be a datetime"):
        normalise_journal_batch(events[1:])


def test_a_pending_event_compares_alike_whether_its_metadata_was_read_or_not():
    (event,) = [journal_event("t", "llm.error", "trace", "", {"caller": "lead_agent"})]
    (fast,), (slow,) = normalise_journal_batch([event]), normalise_batch([event])
    assert fast.decoded_metadata is None and slow.decoded_metadata is not None
    assert fast == slow and repr(fast) == repr(slow)


class _Name(str):
    """A str subclass: checked as a string, never taken from a batch's cache."""


def _batch_events() -> list[object]:
    """Events that need every part of ``normalise_event``, ids and kinds repeated."""
    events: list[object] = []
    for e in nasty_events("t"):
        events += [e, {k: v for k, v in e.items() if k not in ("user_id", "created_at")}]
    return [
        *events,
        event(thread_id="thé", run_id="rün", user_id="ü", metadata=None),
        event(thread_id="thé", run_id="rün", content="x" * 50_000),
        event(thread_id=_Name("t"), run_id=_Name("r"), event_type=_Name("llm.error")),
        event(user_id=_Name("u"), category=_Name("trace")),
        event(metadata=MappingProxyType({"caller": "lead_agent", "task_id": "task-1"})),
        MappingProxyType(event(content={"a": [1, 2]})),
        event(user_id=None),
    ]


@pytest.mark.parametrize("limits", [(10240, 65536), (None, None), (5, 7)])
def test_normalise_batch_normalises_each_event_as_normalise_event_does(limits):
    trace, outputs = limits
    options = {"max_trace_content": trace, "max_outputs_content": outputs}
    events = _batch_events()
    with user_scope("scoped"):
        now = normalise_created_at(None)
        batch = normalise_batch(events, **options, default=MessageEncoder())
        alone = [
            normalise_event(e, **options, now=batch[1].created_at, default=MessageEncoder())
            for e in events
        ]
    assert batch[1].created_at >= now  # the batch's one timestamp
    assert [_stored(p) for p in batch] == [_stored(p) for p in alone]
    assert [p.user_id for p in batch[:2]] == [None, "scoped"]


@pytest.mark.parametrize("field", ["thread_id", "run_id", "user_id", "event_type", "category"])
def test_normalise_batch_checks_an_object_equal_to_an_id_it_checked(field):
    checked = event(thread_id="t", run_id="t", event_type="t", category="t", user_id="t")
    with pytest.raises(TypeError, match=r"event 1: .*must be a string, got _EqualToT"):
        normalise_batch([checked, {**checked, field: _EqualToT()}])


@pytest.mark.parametrize(
    "bad",
    [
        {"metadata": {"task_id": "x" * 129}},
        {"metadata": ["not", "a", "dict"]},
        {"content": {"a": 1, 1: 2, "1": 3}},
        {"content": "x" * (JSON_MAX_LENGTH + 1), "category": "message"},
        {"event_type": "bad\x00type"},
        {"category": "c" * 200},
        {"thread_id": ""},
        {"run_id": "r\ud800"},
        {"user_id": 5},
        {"created_at": "yesterday"},
        {"created_at": 5},
        {"seq": 3},
    ],
)
def test_normalise_batch_refuses_a_repeated_kind_of_event_as_normalise_event_does(bad):
    good = event(user_id="u", metadata={"caller": "lead_agent"})
    events = [good, good, {**good, **bad}, good]
    with pytest.raises((TypeError, ValueError)) as expected:
        normalise_event(events[2], index=2)
    with pytest.raises(type(expected.value), match=f"^{re.escape(str(expected.value))}$"):
        normalise_batch(events)


@pytest.mark.parametrize(
    ("content", "metadata", "iterated"),
    [
        ("x" * JSON_MAX_LENGTH, {}, {}),
        ("x", {"task_id": "x" * 129}, {}),
        ("x", {}, {"a": "x" * JSON_MAX_LENGTH}),
        ("x", {"task_id": "t"}, {"a": "x"}),
    ],
    ids=["content over the limit", "task_id too long", "metadata over the limit", "kept"],
)
def test_normalise_batch_encodes_an_events_values_once_whether_kept_or_refused(
    content, metadata, iterated
):
    """``default`` may turn a value into JSON only once (an iterator): each value of an event
    is encoded once, so an event refused alone is refused in a batch too."""
    calls: list[object] = []

    def once(value: object) -> object:
        calls.append(value)
        return list(value)  # type: ignore[call-overload]

    def make() -> dict[str, object]:
        values = {key: iter([value]) for key, value in iterated.items()}
        return event(category="message", content=iter([content]), metadata={**metadata, **values})

    outcomes = []
    for normalise in (
        lambda e: normalise_event(e, index=0, default=once),
        lambda e: normalise_batch([e], default=once)[0],
    ):
        calls.clear()
        try:
            outcomes.append(normalise(make()).content_json)
        except EventRefused as exc:
            outcomes.append(str(exc))
        assert len(calls) == 1 + len(iterated), calls
    assert outcomes[0] == outcomes[1]
    assert outcomes[0].startswith("event 0: ") == (outcomes[0] != '["x"]')


def test_normalise_batch_checks_each_distinct_id_and_kind_once(monkeypatch):
    import deerflow_journal.records as records

    checked: list[object] = []

    def check_text(value, *args, **kwargs):
        checked.append(value)
        return real(value, *args, **kwargs)

    real = records.check_text
    monkeypatch.setattr(records, "check_text", check_text)
    monkeypatch.setattr(records, "_VALID_KINDS", set())
    events = [event(run_id=f"r{i % 2}", user_id="u", content=i) for i in range(10)]
    assert [p.content for p in normalise_batch(events)] == list(range(10))
    assert sorted(checked) == ["llm.error", "r0", "r1", "t", "trace", "u"]


def test_some_names_lists_five_and_counts_the_rest():
    names = [f"r{i}" for i in range(7)]
    assert some_names(names[:5], "run") == "r0, r1, r2, r3, r4"
    assert some_names(names[:6], "run") == "r0, r1, r2, r3, r4 and 1 more run"
    assert some_names(names, "thread") == "r0, r1, r2, r3, r4 and 2 more threads"
    assert some_names([], "run") == "-"
