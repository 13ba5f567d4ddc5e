"""`Record`: the base of the immutable records one look of the policy builds and reads (the
snapshot it is given, the state it keeps), built, copied, compared and `_replace`d by field
name like a NamedTuple. Why not a NamedTuple: compiled by mypyc (`autoscaler.native`) with the
policy, a subclass is a native object, built by a C call and read as a struct, where a
NamedTuple built by keyword runs an interpreted `__new__` through a dict and is read through
Python properties (about a third of a look's instructions in the scale run). A subclass's
fields are its `__init__`'s parameters, each set once as a `Final` attribute: read-only where
compiled, and interpreted refused a second time by `set_once`, which each subclass calls from a
`__setattr__` of its own (mypyc sets the fields of a class natively only where the class itself
defines `__setattr__`, not where it inherits one). Unlike a NamedTuple, a record is not a
tuple: no indexing, unpacking or iteration, and its constructor takes keywords past the fields
it names first.
"""

from __future__ import annotations

import copy
import inspect
from typing import TypeVar

R = TypeVar("R", bound="Record")


class Record:
    def _replace(self: R, **changes: object) -> R:
        """A copy with `changes`, as NamedTuple._replace."""
        names = fields_of(type(self))
        unknown = set(changes) - set(names)
        if unknown:
            raise ValueError(f"{type(self).__name__} has no field {sorted(unknown)[0]!r}")
        return type(self)(**{name: changes.get(name, getattr(self, name)) for name in names})

    def _asdict(self) -> dict[str, object]:
        """The fields by name, as NamedTuple._asdict: e.g. to build the same record from
        another module's class (the compiled one from the interpreted one)."""
        return {name: getattr(self, name) for name in fields_of(type(self))}

    def __eq__(self, other: object) -> bool:
        # by class name: the compiled module's class and the interpreted one compare equal
        if type(other).__name__ != type(self).__name__:
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in fields_of(type(self)))

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, name) for name in fields_of(type(self))))  # as a tuple's

    def __repr__(self) -> str:
        values = ", ".join(f"{name}={getattr(self, name)!r}" for name in fields_of(type(self)))
        return f"{type(self).__name__}({values})"

    def __copy__(self: R) -> R:
        return self  # immutable, as a tuple is

    def __deepcopy__(self: R, memo: dict[int, object]) -> R:
        # a field may hold a mutable object (a snapshot's `extra`): copied, as a tuple's items are
        return type(self)(**{name: copy.deepcopy(value, memo) for name, value in self._asdict().items()})


_fields: dict[type, tuple[str, ...]] = {}
_field_set: dict[type, frozenset[str]] = {}  # the same names, for set_once's test


def fields_of(cls: type) -> tuple[str, ...]:
    """The fields of a Record class, in order: its __init__'s parameters; compiled, where the
    signature is not kept, the native attributes mypyc lists (the same names, in the order
    __init__ sets them)."""
    if cls not in _fields:
        names = getattr(cls, "__mypyc_attrs__", None)
        _fields[cls] = tuple(n for n in names if not n.startswith("__")) if names is not None \
            else tuple(inspect.signature(cls).parameters)
    return _fields[cls]


def set_once(record: Record, name: str, value: object) -> None:
    """A Record's __setattr__: interpreted, a field once set by __init__ is not set again, and
    nothing else is set; compiled, the fields are read-only and __init__ sets them without
    coming here."""
    names = _field_set.get(type(record))
    if names is None:
        names = _field_set[type(record)] = frozenset(fields_of(type(record)))
    attributes = getattr(record, "__dict__", None)  # interpreted: where the fields are; compiled: none
    if name not in names or attributes is None or name in attributes:
        raise AttributeError(f"{type(record).__name__} is immutable: {name} cannot be set (use _replace)")
    attributes[name] = value
