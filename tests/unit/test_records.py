"""handler.core.records.record: what the classes that moved off @dataclass rely on, side by side with dataclass."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from pathlib import Path
from typing import ClassVar

import pytest

from handler.core.records import FrozenInstanceError, field, record, replace


def no_op(raw: dict[str, int]) -> dict[str, int]:
    return raw


@record
class Point:
    x: int
    y: int = 2
    tags: list[str] = field(default_factory=list)
    secret: str = field(default="s", repr=False)
    fn: object = no_op  # a function default stays a value, not a method
    kind: ClassVar[str] = "point"


@dataclasses.dataclass(frozen=True)
class DPoint:
    x: int
    y: int = 2
    tags: list[str] = dataclasses.field(default_factory=list)
    secret: str = dataclasses.field(default="s", repr=False)
    fn: object = no_op
    kind: ClassVar[str] = "point"


@record
class Pair:
    n: int
    s: str


@record(frozen=False)
class Mutable:
    a: int
    b: dict[str, int] = field(default_factory=dict)


def test_init_defaults_and_repr_as_dataclass_gives_them() -> None:
    for cls in (Point, DPoint):
        p = cls(1)
        assert (p.x, p.y, p.tags, p.secret, p.fn) == (1, 2, [], "s", no_op)
        assert cls(1, 3, ["a"]).tags == ["a"] and cls(x=1, y=5).y == 5
    assert repr(Point(1, tags=["a"])) == repr(DPoint(1, tags=["a"])).replace("DPoint", "Point")
    assert Point(1).tags is not Point(1).tags  # a fresh list each instance
    assert Point.y == 2 and Point.kind == "point" and Point.__match_args__ == ("x", "y", "tags", "secret", "fn")


def test_equality_and_hash_by_fields() -> None:
    assert Point(1, tags=["a"]) == Point(1, tags=["a"]) and Point(1) != Point(2)
    assert Point(1) != DPoint(1)  # another class is never equal, as dataclass
    assert hash(Pair(1, "x")) == hash(Pair(1, "x")) and len({Pair(1, "x"), Pair(1, "x"), Pair(2, "x")}) == 2
    with pytest.raises(TypeError):
        hash(Point(1))  # a list field: unhashable, as dataclass's hash of the fields is
    assert Mutable(1) == Mutable(1) and Mutable.__hash__ is None


def test_frozen_refuses_assignment_and_mutable_takes_it() -> None:
    p = Point(1)
    with pytest.raises(FrozenInstanceError, match="'x'"):
        p.x = 5  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del p.y  # type: ignore[misc]
    m = Mutable(1)
    m.a = 2
    m.b["k"] = 1
    assert m == Mutable(2, {"k": 1})


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: Point(), "missing required argument.*'x'"),
        (lambda: Point(1, 2, [], "s", no_op, 9), "takes 6 positional arguments but 7"),
        (lambda: Point(1, x=2), "multiple values for argument 'x'"),
        (lambda: Point(1, z=2), "unexpected keyword argument 'z'"),
    ],
)
def test_bad_arguments_are_type_errors(call: object, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        call()  # type: ignore[operator]


def test_a_non_default_field_after_a_default_one_is_refused() -> None:
    with pytest.raises(TypeError, match="non-default argument 'b' follows default argument 'a'"):

        @record
        class Bad:
            a: int = 1
            b: int


def test_a_field_without_default_may_hide_from_the_repr_and_stays_required() -> None:
    @record
    class Token:
        value: str = field(repr=False)
        kind: str = "bearer"

    assert repr(Token("secret")).endswith(".Token(kind='bearer')") and Token("a") == Token(value="a")
    with pytest.raises(TypeError, match=r"missing required argument.*'value'"):
        Token()  # type: ignore[call-arg]


def test_replace_copy_and_pickle() -> None:
    p = Point(1, tags=["a"], secret="x")
    q = replace(p, y=7)
    assert q == Point(1, 7, ["a"], "x") and p.y == 2
    with pytest.raises(TypeError, match="no field 'z'"):
        replace(p, z=1)
    assert copy.copy(p) == p and copy.deepcopy(p) == p
    m = Mutable(3, {"k": 1})
    assert pickle.loads(pickle.dumps(m)) == m


def test_the_init_path_classes_are_records() -> None:
    from handler.core.config import Config
    from handler.core.manifest import FileEntry

    c = Config(Path("/m"), None)
    assert c.max_inputs == 256 and Config.batch_tokens == c.batch_tokens  # class-level defaults still read
    assert replace(c, max_inputs=3).max_inputs == 3 and hash(c) == hash(Config(Path("/m"), None))
    assert "sha256='ab'" in repr(FileEntry(1, "ab"))
