"""``encode_json`` gives a value one form, whether orjson writes it alone or the slower path
that rewrites what orjson refuses has to take the whole container."""

from __future__ import annotations

import collections
import dataclasses
import decimal
import enum
import re
import uuid
from datetime import UTC, date, datetime, time
from types import MappingProxyType
from typing import Any

import pytest

from deerflow_journal.records import decode_json, encode_json


class Colour(enum.Enum):
    RED = "red"
    DEEP = {"depth": 2**70}


class Level(enum.IntEnum):
    HIGH = 2**63


class Name(enum.StrEnum):
    ADA = "ada"


class Ratio(float):
    pass


class Items(list):
    pass


@dataclasses.dataclass
class Point:
    x: int


Pair = collections.namedtuple("Pair", "a b")
WHEN = datetime(2024, 5, 6, 7, 8, 9, 123456)

AWKWARD_VALUES: list[Any] = [
    2**63 - 1,
    2**63,
    2**64 - 1,
    2**64,
    -(2**63),
    -(2**63) - 1,
    2**70,
    "lone \ud800 surrogate",
    "nul \x00 inside",
    "a literal \\u0000",
    float("nan"),
    float("inf"),
    -0.0,
    1e16,
    5e-324,
    True,
    None,
    WHEN,
    WHEN.replace(tzinfo=UTC),
    date(2024, 5, 6),
    time(7, 8, 9),
    Colour.RED,
    Colour.DEEP,
    Level.HIGH,
    Name.ADA,
    uuid.UUID(int=5),
    decimal.Decimal("1.10"),
    b"\x00\x01",
    {1, 2},
    (1, "\ud800"),
    Pair(1, 2),
    Ratio(1.5),
    Items([2**64]),
    Point(1),
    MappingProxyType({"a": 1}),
    collections.OrderedDict(a=2**64),
    {"nested": [{"deeper": [2**63, "\x00", float("nan")]}]},
    {WHEN: 1, 2**70: 2, Colour.RED: 3, uuid.UUID(int=5): 4},
]
# Each sends its container down the slower path, for a different reason.
FORCING = [2**70, "\ud800", "\x00", {1: "non-string key"}]


def test_a_value_is_encoded_alike_alone_and_beside_what_orjson_refuses():
    differing = []
    for value in AWKWARD_VALUES:
        alone = encode_json(value)
        for forcing in FORCING:
            beside = encode_json([value, forcing])
            if beside != f"[{alone},{encode_json(forcing)}]":
                differing.append((value, forcing, alone, beside))
            in_dict = encode_json({"v": value, "f": forcing})
            if in_dict != f'{{"v":{alone},"f":{encode_json(forcing)}}}':
                differing.append((value, forcing, alone, in_dict))
    assert differing == []


AWKWARD_KEYS: list[tuple[Any, str]] = [
    ("plain", "plain"),
    ("lone \ud800", "lone \ufffd"),
    ("nul \x00", "nul \ufffd"),
    (1, "1"),
    (-1, "-1"),
    (2**63, "9223372036854775808"),
    (2**70, "1180591620717411303424"),
    (1.5, "1.5"),
    (1e16, "1e+16"),
    (1e-7, "1e-07"),
    (-0.0, "-0.0"),
    (float("nan"), "nan"),
    (float("inf"), "inf"),
    (float("-inf"), "-inf"),
    (True, "true"),
    (False, "false"),
    (None, "null"),
    (WHEN, "2024-05-06 07:08:09.123456"),
    (date(2024, 5, 6), "2024-05-06"),
    (time(7, 8, 9), "07:08:09"),
    (Colour.RED, "red"),
    (Level.HIGH, "9223372036854775808"),
    (Name.ADA, "ada"),
    (uuid.UUID(int=5), "00000000-0000-0000-0000-000000000005"),
]


def test_a_dict_key_is_encoded_as_one_string_whatever_sits_beside_it():
    differing = []
    for key, stored in AWKWARD_KEYS:
        for forcing in [None, *FORCING]:
            value = {key: 0} if forcing is None else {key: 0, "f": forcing}
            read = decode_json(encode_json(value))
            if next(iter(read)) != stored:
                differing.append((key, forcing, read))
    assert differing == []


def test_a_key_that_is_a_string_as_a_value_is_the_same_string_as_a_key():
    for key, _ in AWKWARD_KEYS:
        as_value = decode_json(encode_json(key))
        if isinstance(as_value, str):
            assert decode_json(encode_json({key: 0})) == {as_value: 0}


@pytest.mark.parametrize(
    "keys",
    [
        {1: "a", "1": "b"},
        {None: "a", "null": "b"},
        {WHEN: "a", str(WHEN): "b"},
        {chr(0xD800): "a", "\ufffd": "b"},
    ],
)
def test_keys_that_would_collide_raise_naming_both(keys):
    first, second = keys
    with pytest.raises(ValueError, match=re.escape(f"keys {first!r} and {second!r}")):
        encode_json({"outer": keys})
