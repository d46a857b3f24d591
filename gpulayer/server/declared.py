"""Reading a request body through its declaration (gpulayer/protocol/): each field checked as its type and
bounds say, defaulted, or refused naming it (a 400 `invalid_field`).

The JobSpec (scheduler/spec.py) and the worker's requests (http/wire.py: register, heartbeat, finish,
finish-many) are read here: a field whose type says all (a bool, a bounded number, a string, a choice)
needs nothing more; one with rules of its own gets its function in `checks`.
"""
from __future__ import annotations

import typing
from functools import partial
from typing import Any, Callable, Literal

from gpulayer.protocol.fields import WireField, wire_fields
from gpulayer.protocol.jobspec import MAX_STR
from gpulayer.server.errors import InvalidRequest
from gpulayer.server.validators import fail, integer, mapping, number, string


def flag(value: Any, field: str) -> bool:
    """A JSON boolean; raises InvalidRequest naming `field`."""
    if not isinstance(value, bool):
        raise fail(field, "must be true or false")
    return value


def given(obj: dict, declared: WireField) -> Any:
    """The field's value in `obj`, or its declared default (None for a required one)."""
    return obj.get(declared.name, None if declared.required else declared.default)


def checked(declared: WireField, value: Any, field: str) -> Any:
    """`value` checked against what the declaration says: null where allowed, a bool, an integer or a number
    within its bounds, a string within its bytes, or one of its choices. Raises InvalidRequest naming `field`."""
    check = _CHECKS.get(id(declared))
    if check is None:
        check = _CHECKS[id(declared)] = _check_of(declared)
    if value is None and type(None) in declared.kinds:
        return None
    return check(value, field)


#: The check of each declared field (by the id of its WireField, which gpulayer.protocol.fields keeps).
_CHECKS: dict[int, Callable[[Any, str], Any]] = {}


def _check_of(declared: WireField) -> Callable[[Any, str], Any]:
    """The function that checks a value of `declared` (not null), made once from its type and bounds."""
    kinds, d = declared.kinds, declared.declared
    if bool in kinds:
        return flag
    if (int in kinds or float in kinds) and (d.minimum is None or d.maximum is None):
        raise TypeError(f"{declared.name}: a number is declared with its minimum and maximum")
    if int in kinds:
        lo, hi = int(d.minimum), int(d.maximum)  # type: ignore[arg-type]
        return lambda value, field: integer(value, field, lo, hi)
    if float in kinds:
        low, high = float(d.minimum), float(d.maximum)  # type: ignore[arg-type]
        return lambda value, field: number(value, field, low, high)
    if str in kinds:
        limit = d.max_bytes or MAX_STR
        return lambda value, field: string(value, field, limit=limit)
    choices = [c for kind in kinds if typing.get_origin(kind) is Literal for c in typing.get_args(kind)]
    if not choices:
        raise TypeError(f"{declared.name}: its type ({declared.type}) needs a check of its own")
    named = " or ".join([repr(c) for c in choices] + (["null"] if type(None) in kinds else []))

    def choice(value: Any, field: str) -> Any:
        if value not in choices:
            raise fail(field, f"must be {named}")
        return value
    return choice


def fields(obj: dict, cls: type, prefix: str, checks: dict, done: dict | None = None) -> dict:
    """Every field of `cls` from `obj`, in declaration order: a value `done` already checked, else its
    function in `checks` applied to the given value, else `checked` (`prefix` names it: "service.")."""
    out, done = {}, done or {}
    for declared in wire_fields(cls):
        name = declared.name
        if name in done:
            out[name] = done[name]
        elif name in checks:
            out[name] = checks[name](given(obj, declared))
        else:
            out[name] = checked(declared, given(obj, declared), prefix + name)
    return out


def records(value: Any, declared: WireField, field: str, refusal: str,
            checks: dict[str, Callable[[Any, str], Any]] | None = None) -> list[dict]:
    """The list of records a field declares (`of`), each field read as `checked` reads it, or by its function
    in `checks` (given the value and its name, `field[i].name`); 400 `field: refusal` for anything but a list
    of at most its declared `max_items`."""
    record, limit, checks = declared.declared.of, declared.declared.max_items, checks or {}
    if record is None or limit is None:
        raise TypeError(f"{declared.name}: a list of records is declared with its record (`of`) and `max_items`")
    if not isinstance(value, list) or len(value) > limit:
        raise fail(field, refusal)
    out = []
    for i, item in enumerate(value):
        where = f"{field}[{i}]"
        item = mapping(item, where)
        out.append({f.name: checks.get(f.name, partial(checked, f))(given(item, f), f"{where}.{f.name}")
                    for f in wire_fields(record)})
    return out


def unknown(obj: dict, cls: type) -> None:
    """Refuse a field `cls` does not declare: 400 `unknown field NAME`."""
    extra = sorted(set(obj) - {f.name for f in wire_fields(cls)})
    if extra:
        raise InvalidRequest(f"unknown field {extra[0]}")
