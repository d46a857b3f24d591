"""JobSpec validation: every field checked, normalised with its default, or refused by name.

The fields, their types, defaults and bounds are gpulayer/protocol/jobspec.py's declaration: a field
whose type says all (a bool, a bounded number, a string, a choice) needs nothing here. What comes out
is a `ValidSpec`: a JobSpec, typed, which jobs.submit writes as columns and JSON (`to_wire`).
"""
from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass
from typing import Any

from gpulayer.protocol import MAX_ARRAY, MAX_ARRAY_INDEX, array_ranges, array_text, parse_signal
from gpulayer.protocol.fields import field_of, names
from gpulayer.protocol.jobspec import (
    AFTER_CONDITIONS, ENV_NAME_PATTERN, MAX_AFTER, MAX_ARG_BYTES, MAX_ARGS, MAX_IMAGE_BLOBS, MAX_PATHS,
    RETRY_REASONS, SHA256_HEX_PATTERN, After, AfterCondition, AutoscaleSpec, HealthSpec, ImageSpec, IngressSpec, JobSpec, RetrySpec,
    ServiceSpec,
)
from gpulayer.server.config import PRIORITY_CLASSES, SERVICE_MAX_ATTEMPTS
from gpulayer.server.declared import checked as _checked, fields as _fields, given as _given
from gpulayer.server.errors import InvalidRequest
from gpulayer.server.validators import (digest, fail as _fail, integer, label_key, labels, mapping, relative_path,
                                        string)

ENV_NAME = re.compile(ENV_NAME_PATTERN)

JOB_FIELDS = set(names(JobSpec))
SERVICE_FIELDS = set(names(ServiceSpec))
HEALTH_FIELDS = set(names(HealthSpec))
INGRESS_FIELDS = set(names(IngressSpec))
AUTOSCALE_FIELDS = set(names(AutoscaleSpec))
RETRY_FIELDS = set(names(RetrySpec))
AFTER_FIELDS = set(names(After))
IMAGE_FIELDS = set(names(ImageSpec))


def _narrowed(name: str) -> Any:
    """JobSpec's field `name` again, with its declaration (so `to_wire` and the wire's order keep it), but no
    default: a ValidSpec is made with every field."""
    return dataclasses.field(metadata=JobSpec.__dataclass_fields__[name].metadata)


@dataclass(frozen=True, kw_only=True)
class ValidSpec(JobSpec):
    """A JobSpec as `validate_job` made it: every field checked and defaulted, and those a client may write in
    more than one way in the one form they are stored in (docs/protocol.md: "Stored as ...")."""

    gpus: int = _narrowed("gpus")                # null: 1 with accelerator "cuda", else 0
    retry: RetrySpec = _narrowed("retry")        # null: the default, 10 attempts for a service
    priority: int = _narrowed("priority")        # a class's name: its number
    array: str | None = _narrowed("array")       # ranges ("0-999"), its %N moved to max_running
    # each dependency an After, each job once (read only: a list of a narrower type, which mypy refuses)
    after: list[After] = _narrowed("after")  # type: ignore[assignment]


def _known(obj: dict, allowed: set[str], field: str) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        where = f"{field}." if field else ""
        raise InvalidRequest(f"unknown field {where}{unknown[0]} (known: {', '.join(sorted(allowed))})")


def _command(value: Any) -> list[str]:
    if not isinstance(value, list) or not value:
        raise _fail("command", "must be a non-empty list of strings (argv)")
    if len(value) > MAX_ARGS:
        raise _fail("command", f"at most {MAX_ARGS} arguments")
    for i, arg in enumerate(value):
        string(arg, f"command[{i}]", limit=MAX_ARG_BYTES)
    if not value[0]:
        raise _fail("command", "the program name (command[0]) is empty")
    return list(value)


def _env(value: Any) -> dict[str, str]:
    obj = mapping(value, "env")
    for key, val in obj.items():
        if not ENV_NAME.fullmatch(key):
            raise _fail("env", f"{key!r} is not a valid environment variable name")
        string(val, f"env.{key}")
    return dict(obj)


def _paths_map(value: Any, field: str) -> dict[str, str]:
    obj = mapping(value, field)
    if len(obj) > MAX_PATHS:
        raise _fail(field, f"at most {MAX_PATHS} entries")
    return {relative_path(k, f"{field} key"): digest(v, f"{field}.{k}", allow_none=False) for k, v in obj.items()}


def _outputs(value: Any) -> list[str]:
    if not isinstance(value, list):
        raise _fail("outputs", "must be a list of relative paths")
    if len(value) > MAX_PATHS:
        raise _fail("outputs", f"at most {MAX_PATHS} paths")
    return [relative_path(p, f"outputs[{i}]") for i, p in enumerate(value)]


def _retry(value: Any, is_service: bool) -> RetrySpec:
    obj = mapping({} if value is None else value, "retry")
    _known(obj, RETRY_FIELDS, "retry")
    declared = field_of(RetrySpec, "max_attempts")
    default = SERVICE_MAX_ATTEMPTS if is_service else declared.default
    attempts = _checked(declared, obj.get("max_attempts", default), "retry.max_attempts")
    return RetrySpec(**_fields(obj, RetrySpec, "retry.", {"retry_on": _retry_on}, {"max_attempts": attempts}))


def _retry_on(value: Any) -> list[str]:
    if not isinstance(value, list) or any(r not in RETRY_REASONS for r in value):
        raise _fail("retry.retry_on", f"must be a list drawn from {', '.join(RETRY_REASONS)}")
    return list(dict.fromkeys(value))


def _health(value: Any) -> HealthSpec | None:
    if value is None:
        return None
    obj = mapping(value, "service.health")
    _known(obj, HEALTH_FIELDS, "service.health")
    return HealthSpec(**_fields(obj, HealthSpec, "service.health.", {"http_path": _http_path}))


def _http_path(value: Any) -> str:
    path = _checked(field_of(HealthSpec, "http_path"), value, "service.health.http_path")
    if not path.startswith("/"):
        raise _fail("service.health.http_path", "must start with /")
    return path


def _service(value: Any) -> ServiceSpec | None:
    if value is None:
        return None
    obj = mapping(value, "service")
    _known(obj, SERVICE_FIELDS, "service")
    service = ServiceSpec(**_fields(obj, ServiceSpec, "service.", {
        "health": _health, "ingress": _ingress, "autoscale": _autoscale,
        "weights": lambda given: digest(given, "service.weights")}))
    if service.ingress is not None and not service.port:
        raise _fail("service.ingress", "needs `port`: the ingress proxies to the port the worker picks ($PORT)")
    scale = service.autoscale
    if scale is not None and "replicas" not in obj:  # the starting count: autoscale's min (at least one)
        service = dataclasses.replace(service, replicas=max(scale.min, 1))
    if scale is not None and service.ingress is None:
        raise _fail("service.autoscale", "scales on the requests in flight through the service's ingress: it needs "
                                         "`service.ingress` (`submit --ingress`); a service without one runs `replicas`")
    if scale is not None and not max(scale.min, 1) <= service.replicas <= scale.max:
        raise _fail("service.replicas", f"the starting count ({service.replicas}) must be within autoscale's "
                                        f"{max(scale.min, 1)} and `max` ({scale.max})")
    return service


def _autoscale(value: Any) -> AutoscaleSpec | None:
    """`service.autoscale`: min <= max, a target above 0 (its declaration's bounds)."""
    if value is None:
        return None
    obj = mapping(value, "service.autoscale")
    _known(obj, AUTOSCALE_FIELDS, "service.autoscale")
    scale = AutoscaleSpec(**_fields(obj, AutoscaleSpec, "service.autoscale.", {}))
    if scale.min > scale.max:
        raise _fail("service.autoscale.min", f"must be at most `max` ({scale.min} > {scale.max})")
    return scale


def _ingress(value: Any) -> IngressSpec | None:
    """`service.ingress`: `access` token, key (with the key's `key_sha256`) or public."""
    if value is None:
        return None
    obj = mapping(value, "service.ingress")
    _known(obj, INGRESS_FIELDS, "service.ingress")
    ingress = IngressSpec(**_fields(obj, IngressSpec, "service.ingress.", {"key_sha256": _key_sha256}))
    if ingress.access == "key" and ingress.key_sha256 is None:
        raise _fail("service.ingress.key_sha256", "`access: key` needs the SHA-256 (hex) of the service's key")
    if ingress.access != "key" and ingress.key_sha256 is not None:
        raise _fail("service.ingress.key_sha256", f"a key goes with `access: key`, not `access: {ingress.access}`")
    return ingress


def _key_sha256(value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not re.fullmatch(SHA256_HEX_PATTERN, value)):
        raise _fail("service.ingress.key_sha256", "must be a SHA-256 in hex (64 of 0-9a-f)")
    return value


def _image(value: Any) -> ImageSpec | None:
    """`image`: a manifest digest with its blobs' digests, and/or a name the worker has cached (`ref`)."""
    if value is None:
        return None
    obj = mapping(value, "image")
    _known(obj, IMAGE_FIELDS, "image")
    blobs = obj.get("blobs", [])
    if not isinstance(blobs, list) or len(blobs) > MAX_IMAGE_BLOBS:
        raise _fail("image.blobs", f"must be a list of at most {MAX_IMAGE_BLOBS} artifact digests")
    out = _fields(obj, ImageSpec, "image.", {
        "manifest": lambda given: digest(given, "image.manifest"),
        "blobs": lambda given: [digest(d, f"image.blobs[{i}]", allow_none=False) for i, d in enumerate(blobs)]})
    if out["manifest"] is None and out["ref"] is None:
        raise _fail("image", "needs a `manifest` digest (its blobs uploaded) or a `ref` the worker has cached")
    if out["manifest"] is None and out["blobs"]:
        raise _fail("image.blobs", "names the blobs of a `manifest`: give it")
    return ImageSpec(**out)


def _secret_names(value: Any) -> list[str]:
    if not isinstance(value, list) or any(not isinstance(v, str) or not ENV_NAME.fullmatch(v) for v in value):
        raise _fail("secrets", "must be a list of secret names (letters, digits and _)")
    return list(dict.fromkeys(value))


def array_indices(value: Any) -> list[int]:
    """An array's indices, ascending: from "0-999", "1,5,9-12", "0-15:4" (a step) or a list of integers.

    Raises InvalidRequest naming `array` for a malformed, repeated or out-of-range index, or
    more than MAX_ARRAY of them.
    """
    if isinstance(value, list):
        found = [integer(v, f"array[{i}]", 0, MAX_ARRAY_INDEX) for i, v in enumerate(value[:MAX_ARRAY + 1])]
    elif isinstance(value, str):
        try:
            found = array_ranges(value)
        except ValueError as exc:
            raise _fail("array", str(exc)) from None
    else:
        raise _fail("array", f"must be a string like \"0-999\" or a list of indices, not {type(value).__name__}")
    if not found:
        raise _fail("array", "names no index")
    if len(found) > MAX_ARRAY:
        raise _fail("array", f"at most {MAX_ARRAY} elements")
    ordered = sorted(set(found))
    if len(ordered) != len(found):
        seen: set[int] = set()
        twice = next(i for i in found if i in seen or seen.add(i))  # type: ignore[func-returns-value]
        raise _fail("array", f"index {twice} appears twice")
    return ordered


def _array(spec: dict) -> tuple[str | None, int | None]:
    """The array (normalised to ranges) and its running cap, from `array` ("0-999%16") and `max_running`."""
    value = spec.get("array")
    cap = _job_field(spec, "max_running")
    if value is None:
        if cap is not None:
            raise _fail("max_running", "caps an array's running elements: give `array` too")
        return None, None
    if isinstance(value, str) and "%" in value:
        value, _, limit = value.partition("%")
        if _whole(limit.strip()) is None:
            raise _fail("array", f"%{limit}: the running cap after % is a whole number (0-999%16)")
        inline = integer(_whole(limit.strip()), "array (its %N)", 1, MAX_ARRAY)
        if cap is not None and cap != inline:
            raise _fail("max_running", f"is {cap} but array says %{inline}: give one")
        cap = inline
    return array_text(array_indices(value)), cap


def _whole(text: str) -> int | None:
    """`text` as a whole number when it is one in ASCII digits (at most 19 of them), else None."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 19 else None


def _after(value: Any) -> list[After]:
    """Dependencies: each an id (ends ok), "ID[:ok|notok|any]" or {"job": ID, "condition": ...}."""
    if not isinstance(value, list):
        raise _fail("after", "must be a list of job ids, \"ID:ok|notok|any\" strings or {job, condition} objects")
    if len(value) > MAX_AFTER:
        raise _fail("after", f"at most {MAX_AFTER} dependencies")
    found: dict[int, AfterCondition] = {}
    for i, entry in enumerate(value):
        field = f"after[{i}]"
        if isinstance(entry, str):
            job, _, condition = entry.strip().partition(":")
            if _whole(job) is None:
                raise _fail(field, f"{entry!r} is not a job id, ID:ok, ID:notok or ID:any")
            job_id, condition = _whole(job), condition or "ok"
        elif isinstance(entry, dict):
            _known(entry, AFTER_FIELDS, field)
            job_id, condition = entry.get("job"), entry.get("condition", "ok")
        else:
            job_id, condition = entry, "ok"
        job_id = _checked(field_of(After, "job"), job_id, f"{field}.job" if isinstance(entry, dict) else field)
        if condition not in AFTER_CONDITIONS:
            raise _fail(field, f"the condition is one of {', '.join(AFTER_CONDITIONS)}, not {condition!r}")
        if found.get(job_id, condition) != condition:
            raise _fail(field, f"job {job_id} is named twice with different conditions")
        found[job_id] = typing.cast(AfterCondition, condition)
    return [After(job=job_id, condition=condition) for job_id, condition in found.items()]


def _priority(value: Any, classes: dict[str, int] | None) -> int:
    """A priority number, or the number of a named class (`high`) of the server's config."""
    classes = PRIORITY_CLASSES if classes is None else classes
    if isinstance(value, str):
        if value not in classes:
            known = ", ".join(f"{name}={number}" for name, number in sorted(classes.items(), key=lambda c: c[1]))
            raise _fail("priority", f"{value!r} is no priority class of this server (known: {known}) nor a number")
        return classes[value]
    return _checked(field_of(JobSpec, "priority"), value, "priority")


#: A priority as a job's `priority` takes it (job update reads it the same way).
priority_number = _priority


def _job_field(spec: dict, name: str) -> Any:
    """The JobSpec's field `name` from `spec` (else its default), checked as its declaration says."""
    declared = field_of(JobSpec, name)
    return _checked(declared, _given(spec, declared), name)


def validate_job(raw: Any, priority_classes: dict[str, int] | None = None) -> ValidSpec:
    """The JobSpec `raw` (a JSON object) says, checked and normalised; raises InvalidRequest naming the first
    bad field.

    `priority` may name one of `priority_classes` (the server's; default low, normal, high).
    """
    spec = mapping(raw, "job")
    _known(spec, JOB_FIELDS, "")
    service = _service(spec.get("service"))
    accelerator = _job_field(spec, "accelerator")
    gpus = _job_field(spec, "gpus")
    gpus = (1 if accelerator == "cuda" else 0) if gpus is None else gpus
    nodes = _job_field(spec, "nodes")
    accelerator, gpus = _gpu_share(spec, accelerator, gpus, nodes)
    _gpu_link(spec, gpus)
    if service and nodes > 1:
        raise _fail("nodes", "a service runs replicas; multi-node (nodes > 1) is for jobs")
    array, max_running = _array(spec)
    if array is not None and (service or nodes > 1):
        raise _fail("array", "an array's elements are single tasks: not with `service` or `nodes` > 1")
    done = {"service": service, "accelerator": accelerator, "gpus": gpus, "nodes": nodes, "array": array,
            "max_running": max_running}
    return ValidSpec(**_fields(spec, JobSpec, "", {
        "command": _command, "env": _env, "labels": labels, "retry": lambda given: _retry(given, service is not None),
        "source": lambda given: digest(given, "source"), "inputs": lambda given: _paths_map(given, "inputs"),
        "outputs": _outputs, "priority": lambda given: _priority(given, priority_classes),
        "secrets": _secret_names, "after": _after, "image": _image, "signal": _signal,
        "same": lambda given: _same(given, nodes)}, done))


def _gpu_link(spec: dict, gpus: int) -> None:
    """`gpu_link` nvlink asks for GPUs joined to one another: at least two whole GPUs (issue 40)."""
    if _job_field(spec, "gpu_link") is not None and gpus < 2:
        raise _fail("gpu_link", f"GPUs joined by NVLink are two or more: `gpu_link` goes with `gpus` 2 or more, not {gpus}")


def _same(value: Any, nodes: int) -> list[str]:
    """`same`: label keys, each once, for a multi-node job (every rank on workers sharing their values)."""
    limit = field_of(JobSpec, "same").declared.max_items or 0
    if not isinstance(value, list) or len(value) > limit:
        raise _fail("same", f"a list of at most {limit} label keys")
    keys = value
    if keys and nodes < 2:
        raise _fail("same", "ranks that share a label's value are those of a multi-node job: `same` goes with "
                            "`nodes` 2 or more")
    for key in keys:
        if isinstance(key, str) and "=" in key:
            raise _fail("same", f"{key!r}: `same` names label keys; a value is pinned by `labels` "
                                "(`submit --same rack=r1` writes both)")
        label_key(key, "same")
    if len(set(keys)) < len(keys):
        raise _fail("same", "each label key once")
    return list(keys)


def _gpu_share(spec: dict, accelerator: str | None, gpus: int, nodes: int) -> tuple[str | None, int]:
    """The accelerator and `gpus` of a job: a share of one GPU (`gpu_fraction`, `gpu_memory_mb`; issue 40) is
    stored as `cuda` with `gpus` 0 (it holds no whole GPU); the share's rules a declaration cannot say."""
    fraction = _job_field(spec, "gpu_fraction")
    memory = _job_field(spec, "gpu_memory_mb")
    if fraction is None and memory is None:
        return accelerator, gpus
    name = "gpu_fraction" if fraction is not None else "gpu_memory_mb"
    if fraction is not None and not 0 < fraction < 1:
        raise _fail("gpu_fraction", f"a share of one GPU is more than 0 and less than 1, not {fraction:g} "
                                    "(whole GPUs: `gpus`)")
    if gpus > 1:
        raise _fail(name, f"a share of one GPU goes with `gpus` 0 or 1, not {gpus}")
    if nodes > 1:
        raise _fail(name, "a share of one GPU is for single tasks: not with `nodes` > 1")
    return "cuda", 0


def _signal(value: Any) -> str | None:
    """`signal` as Slurm writes it ([B:]SIG[@SECONDS]), stored upper case: B:USR1@120."""
    if value is None:
        return None
    text = string(value, "signal", limit=32)
    try:
        batch, name, before = parse_signal(text)
    except ValueError as exc:
        raise _fail("signal", str(exc)) from None
    return f"{'B:' if batch else ''}{name}@{before}"


def referenced_digests(spec: JobSpec) -> set[str]:
    """Every artifact a (validated) spec names: source, inputs, service weights, an image's manifest and blobs."""
    found = set(spec.inputs.values())
    if spec.source:
        found.add(spec.source)
    if spec.service is not None and spec.service.weights:
        found.add(spec.service.weights)
    if spec.image is not None:
        found.update(spec.image.blobs)
        if spec.image.manifest:
            found.add(spec.image.manifest)
    return found
