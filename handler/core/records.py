"""`record`: the part of `dataclasses.dataclass` this package uses, for the classes on the Lambda init path.

Why not `dataclass`: it writes each class's methods as source text and compiles them (`exec`); for the 21
classes on the init chain, the parser and compiler that ran were ~18 M instructions of a start (callgrind,
docs/benchmarks.md, "Against a tuned floor"). Here one set of methods is written once, in this module, and each
class gets them with its field names bound: nothing is compiled per class.

What a class gets, as `@dataclass` gives it (tests/unit/test_records.py holds each one):
- `__init__(self, *fields)`: positional or keyword, in annotation order; defaults (a value, or
  `field(default_factory=...)` for a fresh one each instance); a non-default field after a default one, an
  unknown, missing or repeated argument is a TypeError, as dataclass raises it.
- `__repr__` `Name(a=1, b='x')` (fields with `field(repr=False)` left out), `__eq__` on the same class and
  equal fields, `__match_args__`.
- frozen (the default, as every record here is): assigning or deleting an attribute raises
  FrozenInstanceError (an AttributeError), `__hash__` from the fields; `frozen=False`: assignable, unhashable.
- `replace(obj, **changes)`: a copy with some fields changed (dataclasses.replace).
- Pickle and `copy` through `__reduce__` (the class called with the fields).
Not: ordering, `__post_init__`, keyword-only fields, `InitVar`, slots (the classes keep their defaults as
class attributes, which callers read: `Config.batch_tokens`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, dataclass_transform, overload

_T = TypeVar("_T")
_MISSING: Any = object()
_FIELDS = "__record_fields__"


class FrozenInstanceError(AttributeError):
    """An attribute of a frozen record was assigned or deleted."""


class Field:
    """A field's default when it is not a plain value: `field(default_factory=list)`, `field(repr=False)`."""

    __slots__ = ("default", "default_factory", "repr")

    def __init__(self, default: Any, default_factory: Callable[[], Any] | None, repr: bool) -> None:
        self.default, self.default_factory, self.repr = default, default_factory, repr


def field(*, default: Any = _MISSING, default_factory: Callable[[], Any] | None = None, repr: bool = True) -> Any:
    """A field's default made fresh per instance (`default_factory`), or a field left out of the repr."""
    if default is not _MISSING and default_factory is not None:
        raise ValueError("cannot specify both default and default_factory")
    return Field(default, default_factory, repr)


@overload
def record(cls: type[_T], /) -> type[_T]: ...


@overload
def record(*, frozen: bool = True) -> Callable[[type[_T]], type[_T]]: ...


@dataclass_transform(frozen_default=True, field_specifiers=(field, Field))
def record(cls: type[_T] | None = None, /, *, frozen: bool = True) -> Any:
    """The class with the methods above generated from its annotations (in order; `ClassVar`s are not fields)."""
    if cls is None:
        return lambda c: _build(c, frozen)
    return _build(cls, frozen)


def replace(obj: _T, /, **changes: Any) -> _T:
    """A new record of obj's class with `changes` applied; an unknown field name is a TypeError."""
    names: tuple[str, ...] = getattr(type(obj), _FIELDS)
    unknown = [n for n in changes if n not in names]
    if unknown:
        raise TypeError(f"{type(obj).__qualname__} has no field {unknown[0]!r}")
    return type(obj)(**{n: changes[n] if n in changes else getattr(obj, n) for n in names})


def _build(cls: Any, frozen: bool) -> Any:
    if any(hasattr(base, _FIELDS) for base in cls.__mro__[1:]):
        raise TypeError(f"{cls.__qualname__}: a record subclassing a record is not supported")
    names: list[str] = []
    plain: dict[str, Any] = {}  # name -> default value
    factories: dict[str, Callable[[], Any]] = {}
    hidden: list[str] = []
    first_default = ""
    namespace = cls.__dict__
    # Not inspect.get_annotations: importing inspect is what this module saves.
    for name, annotation in namespace.get("__annotations__", {}).items():
        if str(annotation).startswith(("ClassVar", "typing.ClassVar")):
            continue
        names.append(name)
        value = namespace.get(name, _MISSING)
        if type(value) is Field and value.default is _MISSING and value.default_factory is None:
            delattr(cls, name)  # `field(repr=False)` alone: a required field
            if not value.repr:
                hidden.append(name)
            value = _MISSING
        if value is _MISSING:
            if first_default:
                raise TypeError(f"non-default argument {name!r} follows default argument {first_default!r}")
            continue
        first_default = first_default or name
        if type(value) is Field:
            if value.default_factory is not None:
                factories[name] = value.default_factory
                delattr(cls, name)  # as dataclass leaves it: no class attribute for a factory's field
            else:
                plain[name] = value.default
                setattr(cls, name, value.default)
            if not value.repr:
                hidden.append(name)
        else:
            plain[name] = value
    fields = tuple(names)
    field_set = frozenset(fields)
    required = len(fields) - len(plain) - len(factories)  # the first `required` fields have no default
    title = cls.__qualname__
    shown = tuple(n for n in fields if n not in hidden) if hidden else fields

    # Per instance: the instance's __dict__ filled with dict operations (C), defaults first, then the
    # arguments over them; a Python step per field only for a factory's field or an error.
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        given = len(args)
        if given > len(fields):
            raise TypeError(
                f"{title}.__init__() takes {len(fields) + 1} positional arguments but {given + 1} were given"
            )
        if kwargs:
            if not field_set.issuperset(kwargs):
                extra = next(k for k in kwargs if k not in field_set)
                raise TypeError(f"{title}.__init__() got an unexpected keyword argument {extra!r}")
            if given and not kwargs.keys().isdisjoint(fields[:given]):
                twice = next(k for k in fields[:given] if k in kwargs)
                raise TypeError(f"{title}.__init__() got multiple values for argument {twice!r}")
        if given < required:
            missing = [n for n in fields[given:required] if n not in kwargs]
            if missing:
                raise TypeError(f"{title}.__init__() missing required argument(s): {', '.join(map(repr, missing))}")
        attrs = self.__dict__
        attrs.update(plain)
        attrs.update(zip(fields, args))  # noqa: B905 (args is never longer: checked above)
        attrs.update(kwargs)
        for name, make in factories.items():
            if name not in kwargs and fields.index(name) >= given:
                attrs[name] = make()

    def values(self: Any) -> tuple[Any, ...]:
        return tuple([getattr(self, n) for n in fields])

    def __repr__(self: Any) -> str:
        return f"{type(self).__qualname__}({', '.join(f'{n}={getattr(self, n)!r}' for n in shown)})"

    def __eq__(self: Any, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return values(self) == values(other)

    def __reduce__(self: Any) -> tuple[Any, tuple[Any, ...]]:
        return type(self), values(self)

    cls.__init__ = __init__
    cls.__repr__ = __repr__
    cls.__eq__ = __eq__
    cls.__reduce__ = __reduce__
    cls.__match_args__ = fields  # type: ignore[misc]
    setattr(cls, _FIELDS, fields)
    if frozen:

        def __setattr__(self: Any, name: str, value: Any) -> None:
            raise FrozenInstanceError(f"cannot assign to field {name!r}")

        def __delattr__(self: Any, name: str) -> None:
            raise FrozenInstanceError(f"cannot delete field {name!r}")

        def __hash__(self: Any) -> int:
            return hash(values(self))

        cls.__setattr__ = __setattr__
        cls.__delattr__ = __delattr__
        cls.__hash__ = __hash__
    else:
        cls.__hash__ = None  # mutable and compared by value, as dataclass(eq=True) leaves it
    return cls
