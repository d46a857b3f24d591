"""Declared wire fields: one dataclass field per field on the wire, with its default, bounds and help.

A wire object (the JobSpec, the Assignment, the worker's requests) is a dataclass
whose fields are made by `declare()`. What each layer needs is read from that one
declaration: the server's validation (types, bounds, defaults, the names it
knows), the OpenAPI schema (`json_schema`), the field tables of docs/protocol.md
(`markdown_table`, written by scripts/gen_docs.py), a typed object from a JSON
answer (`from_wire`) and a request's JSON object (`to_wire`: a field declared
`omit` is left out at its default). A field declared `of=Record` holds a plain
JSON object (or a list of them) that is a declared record: it goes on the wire
as it is, and its schema, docs and checks are the record's. docs/architecture.md,
"Adding a field".
"""
from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, Union


@dataclass(frozen=True)
class Declared:
    """What a field's type does not say: its help, bounds and how the docs show its default."""

    help: str
    required: bool = False            # no default: a reader refuses an object without it
    always: bool = False              # has a default for readers, yet a writer always sends it (OpenAPI `required`)
    minimum: float | None = None      # numbers (and the integer members of a union)
    maximum: float | None = None
    min_items: int | None = None      # lists
    max_items: int | None = None
    max_bytes: int | None = None      # strings: UTF-8 bytes
    pattern: str | None = None        # strings: a regex the whole value matches
    shows: str | None = None          # the docs' default, where the value alone does not say it
    schema: dict | None = None        # OpenAPI keys the type cannot say, laid over the generated ones
    of: type | None = None            # a dict (or each dict of a list) that is this declared record, as JSON
    omit: bool = False                # a writer leaves it out while it is its default (an older peer sees none)


def declare(default: Any = dataclasses.MISSING, *, help: str, **bounds: Any) -> Any:
    """A dataclass field with its `Declared` metadata; a list or dict default is copied for each object.

    No default: the field is required.
    """
    meta = {"declared": Declared(help=help, required=default is dataclasses.MISSING, **bounds)}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: default.copy(), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclass(frozen=True)
class WireField:
    """One declared field as read: its name, type (resolved), default (shared: never change it) and
    declaration; `kinds`, the members of its type (`int | None`: int, NoneType); `inner`, the declared
    dataclass it holds, if any; `listed`, the one a list of it may hold (`after`: After); `required`: it has
    no default."""

    name: str
    type: Any
    default: Any
    declared: Declared
    kinds: tuple[Any, ...]
    inner: type | None
    required: bool
    listed: type | None = None


_FIELDS: dict[type, tuple[WireField, ...]] = {}
_BY_NAME: dict[type, dict[str, WireField]] = {}


def wire_fields(cls: type) -> tuple[WireField, ...]:
    """The declared fields of `cls`, in declaration order (the wire's order)."""
    found = _FIELDS.get(cls)
    if found is None:
        hints = typing.get_type_hints(cls)
        found = _FIELDS[cls] = tuple(
            WireField(f.name, hints[f.name], _default(f), f.metadata["declared"], members(hints[f.name]),
                      nested(hints[f.name]), f.metadata["declared"].required, _listed(hints[f.name]))
            for f in dataclasses.fields(cls))
    return found


def field_of(cls: type, name: str) -> WireField:
    """The declared field `name` of `cls`; KeyError when there is none."""
    by_name = _BY_NAME.get(cls)
    if by_name is None:
        by_name = _BY_NAME[cls] = {f.name: f for f in wire_fields(cls)}
    return by_name[name]


def names(cls: type) -> tuple[str, ...]:
    """The field names of `cls` on the wire, in order."""
    return tuple(f.name for f in wire_fields(cls))


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def members(tp: Any) -> tuple[Any, ...]:
    """The members of a union (`int | None`), or the type alone."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        return typing.get_args(tp)
    return (tp,)


def nested(tp: Any) -> type | None:
    """The declared dataclass a field holds (`ServiceSpec | None` -> ServiceSpec), else None."""
    found = [m for m in members(tp) if dataclasses.is_dataclass(m)]
    return found[0] if len(found) == 1 else None  # type: ignore[return-value]


def _listed(tp: Any) -> type | None:
    """The declared dataclass a list field's items may be (`list[int | str | After]` -> After), else None."""
    found = [nested(typing.get_args(m)[0]) for m in members(tp) if typing.get_origin(m) is list]
    return found[0] if len(found) == 1 else None


def from_wire(cls: type, obj: Any) -> Any:
    """A `cls` from a JSON object: unknown keys (a newer peer's) are left out, missing optional ones default.

    Declared dataclasses inside (a service block) are built too. Raises TypeError for an object
    that is no dict or lacks a required field; the values' types are not checked (the peer's are).
    """
    if not isinstance(obj, dict):
        raise TypeError(f"{cls.__name__} is a JSON object, not {type(obj).__name__}")
    given: dict[str, Any] = {}
    for f in wire_fields(cls):
        if f.name not in obj:
            continue
        value = obj[f.name]
        given[f.name] = from_wire(f.inner, value) if f.inner is not None and value is not None else value
    missing = [f.name for f in wire_fields(cls) if f.required and f.name not in given]
    if missing:
        raise TypeError(f"{cls.__name__} lacks {', '.join(missing)}")
    return cls(**given)


def to_wire(obj: Any) -> dict:
    """A declared dataclass as its JSON object, field by field (nested ones too, and those in a list: `after`)."""
    out: dict[str, Any] = {}
    for f in wire_fields(type(obj)):
        value = getattr(obj, f.name)
        if f.declared.omit and value == f.default:
            continue
        if f.inner is not None and value is not None:
            value = to_wire(value)
        elif f.listed is not None and isinstance(value, list):
            value = [to_wire(v) if isinstance(v, f.listed) else v for v in value]
        out[f.name] = value
    return out


# -- OpenAPI -----------------------------------------------------------------

_JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}


def json_schema(cls: type, *, closed: bool = True) -> dict:
    """The OpenAPI (JSON Schema) object for a declared dataclass; `closed`: unknown fields refused (a request's
    rule; an answer may carry fields a newer server adds)."""
    props = {f.name: field_schema(f) for f in wire_fields(cls)}
    required = [f.name for f in wire_fields(cls) if f.required or f.declared.always]
    return {"type": "object", **({"required": required} if required else {}),
            **({"additionalProperties": False} if closed else {}), "properties": props}


def field_schema(f: WireField) -> dict:
    """One field's schema: its type's, its bounds, its help as the description."""
    d = f.declared
    schema = _type_schema(f.type) if d.of is None else _record_schema(f)
    bounds = {"minimum": d.minimum, "maximum": d.maximum, "minItems": d.min_items, "maxItems": d.max_items,
              "pattern": None if d.pattern is None else "^" + d.pattern.removesuffix(r"\Z") + "$"}
    schema.update({k: v for k, v in bounds.items() if v is not None})
    schema.update(d.schema or {})
    if d.help:
        schema["description"] = d.help
    return schema


def _record_schema(f: WireField) -> dict:
    """A field that holds a declared record as a plain JSON object (`of`), or a list of them; open unless the
    record says `CLOSED = True` (the reader refuses fields it does not know)."""
    record = json_schema(f.declared.of, closed=getattr(f.declared.of, "CLOSED", False))  # type: ignore[arg-type]
    null = ["null"] if type(None) in f.kinds else []
    if _is_list(f):
        return {"type": ["array", *null] if null else "array", "items": record}
    return {**record, "type": ["object", *null] if null else "object"}


def _is_list(f: WireField) -> bool:
    return any(typing.get_origin(m) is list for m in f.kinds)


def _type_schema(tp: Any) -> dict:
    found = members(tp)
    if len(found) > 1:
        parts = [_type_schema(m) for m in found]
        if all(set(p) <= {"type", "items"} for p in parts):  # simple types: one `type` list
            merged: dict = {"type": [p["type"] for p in parts]}
            for p in parts:
                merged.update({"items": p["items"]} if "items" in p else {})
            return merged
        if all("enum" in p or p == {"type": "null"} for p in parts):
            return {"enum": [v for p in parts for v in p.get("enum", [None])]}
        return {"oneOf": parts}
    origin = typing.get_origin(tp)
    if origin is Literal:
        return {"enum": list(typing.get_args(tp))}
    if origin is list:
        return {"type": "array", "items": _type_schema(typing.get_args(tp)[0])}
    if origin is dict:
        return {"type": "object", "additionalProperties": _type_schema(typing.get_args(tp)[1])}
    if dataclasses.is_dataclass(tp):
        return json_schema(tp)  # type: ignore[arg-type]
    return {"type": _JSON_TYPES[tp]}


# -- docs --------------------------------------------------------------------

def default_text(f: WireField) -> str:
    """How docs/protocol.md shows a field's default."""
    if f.declared.shows is not None:
        return f.declared.shows
    if f.required:
        return "required"
    return json.dumps(f.default)


def markdown_table(cls: type) -> str:
    """The `| field | default | meaning |` table of docs/protocol.md for a declared dataclass."""
    rows = ["| field | default | meaning |", "|---|---|---|"]
    for f in wire_fields(cls):
        meaning = f.declared.help
        record = f.inner or f.declared.of
        if record is not None and f.declared.shows is None:  # what `shows` says of it is enough
            shape = brief(record)
            meaning = f"{meaning}: [{shape}]" if _is_list(f) else f"{meaning}: {shape}"
        rows.append(f"| `{f.name}` | {default_text(f)} | {meaning} |")
    return "\n".join(rows) + "\n"


def brief(cls: type) -> str:
    """A nested object in one line, each field with its default: {`replicas` 1, `health` null or {...}}."""
    parts = []
    for f in wire_fields(cls):
        if f.required and f.declared.of is not None:  # a list of records, say: `files` [{`path`, ...}]
            shape = brief(f.declared.of)
            parts.append(f"`{f.name}` [{shape}]" if _is_list(f) else f"`{f.name}` {shape}")
        elif f.required:
            parts.append(f"`{f.name}`")
        elif (f.inner or f.declared.of) is not None:
            parts.append(f"`{f.name}` {default_text(f)} or {brief(f.inner or f.declared.of)}")  # type: ignore[arg-type]
        else:
            parts.append(f"`{f.name}` {default_text(f)}")
    return "{" + ", ".join(parts) + "}"
