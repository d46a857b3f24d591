"""The writer RPC's codec (gpulayer/server/multiproc/codec.py) and `--front-ends`'s bad values, without processes.

Every write function the scheduler hands its writer travels by name and comes back as the same function; the
arguments and results writes take and give survive a round trip; what is not a registered write, and a frame that
would build anything but data, is refused.
"""
from __future__ import annotations

import ast
import importlib
import io
import pickle
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpulayer.cli.app import app
from gpulayer.cli.common import _front_ends
from gpulayer.server.config import ControlPlaneConfig
from gpulayer.server.errors import ConfigError, InvalidRequest, NotFound, Unavailable
from gpulayer.server.multiproc import codec
from gpulayer.server.process import check_config
from gpulayer.server.security.auth import Principal
from gpulayer.server.scheduler.spec import validate_job

ROOT = Path(__file__).resolve().parents[2]
SCHEDULER = ROOT / "gpulayer/server/scheduler"


class _Scheduler:
    """A stand-in with the scheduler's write methods and a secret box (only their identity matters here)."""

    secret_box = object()

    def _acquire_once(self, conn, *args):
        return args

    def _finish_many(self, conn, *args):
        return args

    def _gpu_reset(self, conn, *args):
        return args

    def _restarted(self, conn, *args):
        return args

    def _expire(self, conn, *args):
        return args


def _shared() -> dict:
    scheduler = _Scheduler()
    return {"scheduler": scheduler, "secret_box": scheduler.secret_box}


def _round_trip(value, shared=None, back=None):
    frame = codec.dumps(value, shared or _shared())
    assert codec.HEADER.unpack(frame[:4])[0] == len(frame) - 4
    return codec.loads(frame[4:], back or shared or _shared())


def _write_functions() -> list:
    """Every function named in a `self._write(fn, ...)` or `store.write(fn, ...)` call of the scheduler
    (`mod.fn` or a module-level `fn`): the write table the front ends use."""
    found = []
    for path in sorted(SCHEDULER.glob("*.py")):
        module = "gpulayer.server.scheduler." + path.stem
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in ("_write", "write") and node.args:
                first = node.args[0]
                loaded = importlib.import_module(module)
                if isinstance(first, ast.Attribute) and isinstance(first.value, ast.Name) and first.value.id != "self":
                    found.append(getattr(getattr(loaded, first.value.id), first.attr))
                elif isinstance(first, ast.Name) and callable(getattr(loaded, first.id, None)):
                    found.append(getattr(loaded, first.id))  # a module-level one (not `fn`, a local)
    return found


def test_every_write_function_of_the_scheduler_travels_by_name_and_comes_back_the_same():
    writes = _write_functions()
    assert len(writes) > 50  # the table is the scheduler's writes, not a handful
    for fn in writes:
        sent = codec.function_name(fn, _shared())
        assert sent[0] == "fn" and codec.resolve(sent, _shared()) is fn, fn
        assert _round_trip(("write", 1, fn, (), {}, {}, "system"))[2] is fn


def test_the_schedulers_own_write_methods_resolve_to_the_writers_scheduler():
    here, there = _shared(), _shared()
    for name in codec.SCHEDULER_WRITES:
        assert _round_trip(getattr(here["scheduler"], name), here, there) == getattr(there["scheduler"], name)
    assert _round_trip(here["secret_box"], here, there) is there["secret_box"]


def test_arguments_and_results_survive_a_round_trip():
    principal = Principal(kind="client", jti="abc", name="alice", labels={"team": "a"}, user_id=7, user="alice")
    spec = validate_job({"command": ["python", "train.py"], "gpus": 2, "env": {"A": "1"}, "array": "0-9"}, {})
    values = [principal, spec, {"tasks": [{"task_id": 1, "state": "running"}], "gpus": None}, [1, 2.5, "x", None],
              (1, (2, 3)), {1, 2}, frozenset({"a"}), b"\x00bytes", {"nested": [{"deep": {"k": [True, False]}}]},
              1e300, -0.0, "ünïcode"]
    for value in values:
        assert _round_trip(value) == value


def test_domain_errors_come_back_whole():
    for exc in (NotFound("no such job 9"), InvalidRequest("bad", code="grace_above_limit", limit=600),
                Unavailable("retry")):
        back = codec.error_in(_round_trip(codec.error_out(exc)))
        assert type(back) is type(exc) and back.to_dict() == exc.to_dict() and back.status == exc.status
    failure = codec.error_in(_round_trip(codec.error_out(TypeError("a bug"))))
    assert failure.status == 500 and "TypeError: a bug" in failure.message


def test_what_is_not_a_registered_write_is_refused_before_anything_is_sent():
    def local(conn):
        return None
    for fn in (lambda conn: None, local, print, Path.exists, codec.dumps):
        with pytest.raises(codec.NotRegistered):
            codec.dumps(("write", 1, fn, (), {}, {}, "system"), _shared())
    with pytest.raises(codec.NotRegistered):
        codec.resolve(("fn", "os", "system"), _shared())
    with pytest.raises(codec.NotRegistered):
        codec.resolve(("method", "wake"), _shared())


def test_a_frame_that_would_build_anything_but_data_is_refused():
    calls = (b"cposix\nsystem\n(S'true'\ntR.", b"cbuiltins\neval\n(S'1'\ntR.", b"cbuiltins\ngetattr\n.",
             b"cgpulayer.server.multiproc.codec\ndumps\n.")
    for made in calls:
        with pytest.raises(pickle.UnpicklingError):
            codec.loads(made, _shared())
    with pytest.raises(pickle.UnpicklingError):  # a reference to an object that is not one of the shared ones
        codec._Unpickler(io.BytesIO(b""), _shared()).persistent_load(("shared", "store"))


@pytest.mark.parametrize("command", [["server", "start"], ["up"]])
@pytest.mark.parametrize("value, words", [("0", "1 or more"), ("-2", "1 or more"), ("two", "not a whole number")])
def test_bad_front_ends_exit_2_and_start_nothing(tmp_path, command, value, words):
    home = tmp_path / "home"
    result = CliRunner().invoke(app, [*command, "--home", str(home), "--front-ends", value])
    assert result.exit_code == 2 and "--front-ends" in result.output and words in result.output, result.output
    assert not [p for p in home.rglob("*") if p.is_file()]


def test_more_front_ends_than_cores_is_allowed_with_a_warning(capsys):
    assert _front_ends(10_000) == 10_000
    assert "more than the" in capsys.readouterr().err


def test_several_front_ends_need_granian(tmp_path):
    with pytest.raises(ConfigError, match="--front-ends"):
        check_config(ControlPlaneConfig(home=tmp_path, front_ends=2, http="cheroot"))
    with pytest.raises(ConfigError, match="--front-ends"):
        check_config(ControlPlaneConfig(home=tmp_path, front_ends=0))


class _Restored:
    def active(self) -> bool:
        return True

    def paused(self) -> bool:
        return False

    def describe(self) -> dict:
        return {"awaiting_workers": 3}


class _WriterScheduler(_Scheduler):
    """What rpc.WriterServer uses of the writer's scheduler, recording each `_write`."""

    def __init__(self, restored=None):
        from types import SimpleNamespace

        from gpulayer.server.runtime import gpu_samples, renewals
        self.restored, self.calls = restored, []
        self.log_followers = SimpleNamespace(written=lambda: None)
        self.auth = SimpleNamespace(on_invalidate=lambda listener: None)
        self.renewals, self.gpu_samples = renewals.Renewals(), gpu_samples.Buffer()
        self.cadence = SimpleNamespace(workers=5)

    def wake(self) -> None:
        pass

    def _adopting(self, fn):
        return ("adopting", fn)

    def _write(self, fn, *args, **kwargs):
        self.calls.append((fn, args, kwargs))
        if args and isinstance(args[-1], list):
            args[-1].append("filled")  # a list argument the write fills in (acquire's `ahead`)
        return "done"


def test_the_writer_runs_a_write_and_sends_back_what_it_filled_in(tmp_path):
    from gpulayer.server.multiproc.rpc import WriterServer
    from gpulayer.server.scheduler import leases
    scheduler = _WriterScheduler()
    server = WriterServer(tmp_path / "w.sock", scheduler)
    result, outs = server._write(leases.heartbeat, (1, []), {"restored": None}, {"wake": True}, "worker:1")
    assert (result, outs) == ("done", [(1, ["filled"])])
    assert scheduler.calls == [(leases.heartbeat, (1, ["filled"]), {"wake": True, "restored": None})]
    assert server._notes({7: 100.0}, []) == {"workers": 5, "restoring": None}
    assert scheduler.renewals.pending() == {7: 100.0}


def test_a_restored_homes_rules_are_the_writers(tmp_path):
    from gpulayer.server.multiproc.rpc import WriterServer
    from gpulayer.server.scheduler import leases, lifecycle
    restored = _Restored()
    scheduler = _WriterScheduler(restored)
    server = WriterServer(tmp_path / "w.sock", scheduler)
    server._write(leases.heartbeat, (1,), {"restored": "the front end's view"}, {}, "worker:1")
    server._write(lifecycle.start, (1, 2), {}, {}, "worker:1")
    assert scheduler.calls[0][2]["restored"] is restored
    assert scheduler.calls[1][0] == ("adopting", lifecycle.start)
    assert server._notes({}, [])["restoring"] == {"paused": False, "describe": {"awaiting_workers": 3}}
