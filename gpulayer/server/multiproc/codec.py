"""The writer RPC's codec: frames of pickled data in which a function travels as a NAME, never as code.

A front end's write is `(function, args, kwargs)` as the scheduler hands it to `Store.write`. The function is
sent by name only: a module-level function of a registered write module (`WRITE_MODULES`: the scheduler's,
the notifications', the provisioning's SQL functions), or one of the scheduler's own write methods
(`SCHEDULER_WRITES`), which the writer looks up on its own scheduler. The objects each process has its own of
(the scheduler, the secret box) travel as their names too (`SHARED`). Anything else callable (a lambda, a
closure) is refused at the front end (`NotRegistered`), before anything is sent.

The data is pickle, read back by an unpickler that builds no global but plain data classes: gpulayer's own
classes (its errors, Principal, ValidSpec...), functools.partial and the standard containers and times. So a
frame can make no call but a class's constructor, and the socket is the owner's alone (0600, in the home).
"""
from __future__ import annotations

import importlib
import io
import pickle
import struct
import types
from typing import Any, Callable

from gpulayer.server.errors import GpulayerError

PROTOCOL = 5
HEADER = struct.Struct("!I")
MAX_FRAME = 256 * 1024 * 1024   # a frame past this is a broken peer, not a write
# Modules whose module-level functions are writes a front end may name (each takes `conn` first).
WRITE_MODULES = ("gpulayer.server.scheduler.", "gpulayer.server.notify.", "gpulayer.server.provisioning.",
                 "gpulayer.server.security.", "gpulayer.server.store.", "gpulayer.server.replication.")
# The scheduler's methods that are write functions (they read its in-memory state: the writer's is the one).
SCHEDULER_WRITES = frozenset({"_acquire_once", "_finish_many", "_gpu_reset", "_restarted", "_expire"})
# Objects each process has its own of: sent as their name, read back as the writer's own.
SHARED = ("scheduler", "secret_box")
_DATA_MODULES = {"builtins", "collections", "datetime", "decimal", "pathlib"}
_DATA_GLOBALS = {("functools", "partial"), ("copyreg", "_reconstructor"), ("builtins", "set"),
                 ("builtins", "frozenset"), ("builtins", "complex"), ("builtins", "bytearray"),
                 ("builtins", "object"), ("builtins", "slice"), ("builtins", "range")}


class NotRegistered(GpulayerError):
    """A write whose function is not in the registered write table: a bug, never sent."""

    code = "internal"
    status = 500


class RemoteFailure(GpulayerError):
    """The writer process failed a write with an error that is not a domain error (a bug there): a 500."""

    code = "internal"
    status = 500


def function_name(fn: Callable[..., Any], shared: dict[str, object]) -> tuple:
    """The name `fn` travels as: ("fn", module, qualname) or ("method", name); NotRegistered for anything else."""
    owner = getattr(fn, "__self__", None)
    if isinstance(fn, types.MethodType) and owner is not None and owner is shared.get("scheduler"):
        if fn.__name__ in SCHEDULER_WRITES:
            return ("method", fn.__name__)
    elif isinstance(fn, types.FunctionType) and "<" not in fn.__qualname__ and fn.__module__.startswith(WRITE_MODULES):
        return ("fn", fn.__module__, fn.__qualname__)
    raise NotRegistered(f"{getattr(fn, '__qualname__', fn)!r} is not a registered write: it cannot be sent to the "
                        "writer process")


def resolve(name: tuple, shared: dict[str, object]) -> Callable[..., Any]:
    """The writer's function for a name function_name gave; NotRegistered for any other name."""
    if name[0] == "method" and name[1] in SCHEDULER_WRITES:
        return getattr(shared["scheduler"], name[1])
    if name[0] == "fn" and isinstance(name[1], str) and name[1].startswith(WRITE_MODULES) and "<" not in name[2]:
        found: Any = importlib.import_module(name[1])
        for part in name[2].split("."):
            found = getattr(found, part)
        if isinstance(found, types.FunctionType) and found.__module__ == name[1]:
            return found
    raise NotRegistered(f"{name!r} names no registered write")


class _Pickler(pickle.Pickler):
    def __init__(self, file, shared: dict[str, object]):
        super().__init__(file, protocol=PROTOCOL)
        self._shared = shared
        self._ids = {id(obj): key for key, obj in shared.items() if obj is not None}

    def persistent_id(self, obj):  # noqa: D102 - pickle's hook
        key = self._ids.get(id(obj))
        if key is not None:
            return ("shared", key)
        if isinstance(obj, (types.FunctionType, types.MethodType, types.BuiltinFunctionType)):
            return ("call",) + function_name(obj, self._shared)
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, shared: dict[str, object]):
        super().__init__(file)
        self._shared = shared

    def persistent_load(self, pid):  # noqa: D102 - pickle's hook
        if pid[0] == "shared" and pid[1] in SHARED:
            return self._shared[pid[1]]
        if pid[0] == "call":
            return resolve(pid[1:], self._shared)
        raise pickle.UnpicklingError(f"unknown reference {pid!r}")

    def find_class(self, module, name):  # noqa: D102 - only data classes
        if (module, name) in _DATA_GLOBALS:
            return super().find_class(module, name)
        if module.startswith("gpulayer.") or module in _DATA_MODULES:
            found = super().find_class(module, name)
            if isinstance(found, type) and (module != "builtins" or issubclass(found, BaseException)):
                return found
        raise pickle.UnpicklingError(f"{module}.{name} is not data: refused")


def dumps(message: Any, shared: dict[str, object]) -> bytes:
    """`message` as one frame (length first); NotRegistered for a function that is not a registered write."""
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    _Pickler(out, shared).dump(message)
    data = out.getbuffer()
    HEADER.pack_into(data, 0, len(data) - HEADER.size)
    return bytes(data)


def loads(payload: bytes, shared: dict[str, object]) -> Any:
    """A frame's payload (without its length) read back; pickle.UnpicklingError for a refused class or name."""
    return _Unpickler(io.BytesIO(payload), shared).load()


def error_out(exc: BaseException) -> tuple:
    """An error as the writer sends it: a GpulayerError (any subclass) whole, anything else as a failure's text."""
    if isinstance(exc, GpulayerError):
        return ("domain", type(exc), exc.args, dict(exc.__dict__))
    return ("failure", f"{type(exc).__name__}: {exc}")


def error_in(sent: tuple) -> GpulayerError:
    """The error a front end raises for what error_out sent."""
    if sent[0] == "domain" and isinstance(sent[1], type) and issubclass(sent[1], GpulayerError):
        exc = sent[1].__new__(sent[1])
        Exception.__init__(exc, *sent[2])
        exc.__dict__.update(sent[3])
        return exc
    return RemoteFailure(f"the writer process failed this write: {sent[-1]}")


def read_frame(sock) -> bytes | None:
    """One frame's payload from a blocking socket; None at the end of the stream."""
    head = _read_exactly(sock, HEADER.size)
    if head is None:
        return None
    (size,) = HEADER.unpack(head)
    if size > MAX_FRAME:
        raise ConnectionError(f"a frame of {size} bytes: the peer is broken")
    return _read_exactly(sock, size)


def _read_exactly(sock, size: int) -> bytes | None:
    parts, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            return None
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)
