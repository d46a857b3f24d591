"""Why a queued job is not placed, in words: the facts (`facts`, from each online worker's fit,
read once by `job_waiting_fit`; `job_quota_reason`'s row) and their sentences.

SQL reads the fit of each online worker (job_worker_fit, the one definition of
fit); `facts` answers the question from those rows (the first thing no online
worker has, how many fit); the rest writes the sentence: only what the job asked
for is named ("1 GPU", never "0 CPUs, 0 MB"), counts agree with their nouns, and
"with its labels" is said only of a job that has labels.
"""
from __future__ import annotations

import datetime
import json

import apsw

from gpulayer.protocol import plural
from gpulayer.server.store.queries import row, rows


def facts(conn: apsw.Connection, job_id: int) -> dict | None:
    """Why job `job_id` (queued, or running with a task in the queue) is not placed, as facts; None when it is
    neither. `why`: the first thing no online worker has ('no_worker', 'labels', 'gpu_model', 'whole_gpus':
    more than one GPU where only MIG instances make up the count, 'nvlink': enough GPUs but none of them
    joined by NVLink as `gpu_link` asks, 'size', 'secret': `detail` names it,
    `secret_labels` are its labels when it is set), or that only cordoned workers ('cordoned') or workers with
    too few healthy GPUs ('unhealthy') would fit it, `workers` naming them (name, cordon and reason; or name
    and its unhealthy `gpus`, index and reason); or, for a gang (`--nodes`) or a service's replicas (one per
    worker), that fewer online workers than its width fit it ('too_few': `fit` of them, `cordoned` of those
    cordoned, in `workers`), or for a gang with `same` label keys that fewer workers of any one value fit
    ('same': `detail` the fit rows by value). Else `busy` is true when fewer online workers fit it now than it needs at once
    (one, or a gang's width); `why` None and `busy` false when an acquire would place it now. With the job's
    size and labels (job_waiting_fit's columns)."""
    found = rows(conn, "job_waiting_fit", job_id=job_id)
    if not found:
        return None
    job = {k: found[0][k] for k in ("labels", "accelerator", "gpus", "cpus", "memory_mb", "width", "gang",
                                   "array_size", "project_id", "gpu_fraction", "gpu_memory_mb", "gpu_link")}
    job["same"] = json.loads(found[0]["same"] or "[]")
    online = [f for f in found if f["worker_id"] is not None]
    sized = [f for f in online if f["has_labels"] and f["has_accelerator"] and f["big_enough"]]
    usable = [f for f in sized if f["missing_secret"] is None]
    uncordoned = [f for f in usable if f["cordon"] is None]
    why = _why(job, online, sized, usable, uncordoned)
    groups = same_groups(job, uncordoned)
    out = dict(job, why=why, detail=None, workers=None, secret_labels=None, fit=len(usable),
               cordoned=sum(f["cordon"] is not None for f in usable),
               busy=sum(bool(f["fits_now"]) for f in online) < (job["width"] if job["gang"] == 1 else 1))
    if groups is not None:  # `same`: the ranks at once on workers of one value
        out["busy"] = max([sum(bool(f["fits_now"]) for f in g) for g in groups.values()], default=0) < job["width"]
        if why is None and max(map(len, groups.values()), default=0) < job["width"]:
            out["why"], out["detail"] = "same", groups
    if why == "secret":
        out["detail"] = min(f["missing_secret"] for f in sized)
        secret = row(conn, "job_waiting_secret", project_id=job["project_id"], name=out["detail"])
        out["secret_labels"] = secret["labels"] if secret else None
    elif why == "cordoned":
        out["workers"] = [{"name": f["name"], "cordon": f["cordon"], "reason": f["cordon_reason"]} for f in usable]
    elif why == "unhealthy":
        out["workers"] = _unhealthy(conn, [f for f in uncordoned if f["unhealthy_gpus"]])
    elif why == "too_few":
        out["workers"] = [{"name": f["name"], "cordon": f["cordon"], "reason": f["cordon_reason"]}
                          for f in sorted(usable, key=lambda f: f["name"]) if f["cordon"] is not None]
    return out


def _why(job: dict, online: list[dict], sized: list[dict], usable: list[dict], uncordoned: list[dict]) -> str | None:
    """`facts`' `why`: the first check the job's online workers fail, in this order; None when none."""
    if not online:
        return "no_worker"
    if not any(f["has_labels"] for f in online):
        return "labels"
    if not sized:
        if job["gpus"] > 0 and json.loads(job["labels"] or "{}").get("gpu_model") is not None:
            return "gpu_model"
        if job["gpu_link"] and any(  # shape_worker_fit.big_enough, but for one NVLink set
                f["has_labels"] and f["has_accelerator"] and job["gpus"] <= f["worker_gpus"]
                and job["cpus"] <= f["worker_cpus"] and job["memory_mb"] <= f["worker_memory_mb"] for f in online):
            return "nvlink"
        if job["gpus"] > 1 and any(  # shape_worker_fit.big_enough, counting MIG instances as GPUs
                f["has_labels"] and f["has_accelerator"] and job["gpus"] <= f["worker_gpus"]
                and job["cpus"] <= f["worker_cpus"] and job["memory_mb"] <= f["worker_memory_mb"] for f in online):
            return "whole_gpus"
        return "size"
    if not usable:
        return "secret"
    if not uncordoned:  # shape_worker_fit.schedulable
        return "cordoned"
    if not any(f["worker_gpus"] - f["unhealthy_gpus"] >= job["gpus"] for f in uncordoned):
        return "unhealthy"
    # even idle, too few: a gang's ranks, or a service's replicas (job_worker_fit.holds_task)
    if (job["gang"] == 1 or job["array_size"] is None) and len(uncordoned) < job["width"]:
        return "too_few"
    return None


def same_groups(job: dict, workers: list[dict]) -> dict[tuple, list[dict]] | None:
    """For a gang with `same` label keys: `workers` (fit rows) by their values of those keys (those without
    one left out); None for another job."""
    if not job["same"] or job["gang"] != 1:
        return None
    groups: dict[tuple, list[dict]] = {}
    for f in workers:
        labels = json.loads(f["worker_labels"] or "{}")
        if all(k in labels for k in job["same"]):
            groups.setdefault(tuple(labels[k] for k in job["same"]), []).append(f)
    return groups


def _unhealthy(conn: apsw.Connection, workers: list[dict]) -> list[dict]:
    """[{name, gpus: [{index, reason}]}] of `workers` (fit rows), their GPUs out of service by index."""
    gpus: dict[int, list[dict]] = {f["worker_id"]: [] for f in workers}
    for g in rows(conn, "job_waiting_unhealthy", workers=json.dumps(list(gpus))):
        gpus[g["worker_id"]].append({"index": g["index"], "reason": g["reason"]})
    return [{"name": f["name"], "gpus": gpus[f["worker_id"]]} for f in workers]


def size_asked(job: dict) -> str:
    """What one task of `job` asks for, naming only what it asks: "1 GPU and 512 MB", "2 CPUs"; "" for nothing."""
    labels = json.loads(job["labels"] or "{}")
    parts = []
    if job["gpus"]:
        parts.append(plural(job["gpus"], "GPU") + (f" of model {labels['gpu_model']}" if labels.get("gpu_model") else "")
                     + (" joined by NVLink" if job.get("gpu_link") else ""))
    if job.get("gpu_fraction") or job.get("gpu_memory_mb"):  # a share of one GPU, on a worker that shares them
        share = [f"{job['gpu_fraction']:g}" if job.get("gpu_fraction") else "",
                 f"{job['gpu_memory_mb']} MB" if job.get("gpu_memory_mb") else ""]
        parts.append(f"a share of one GPU ({' and '.join(p for p in share if p)}; `worker start --gpu-sharing`)")
    if job["cpus"]:
        parts.append(plural(job["cpus"], "CPU"))
    if job["memory_mb"]:
        parts.append(f"{job['memory_mb']} MB")
    return ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else "".join(parts)


def unplaced(facts: dict) -> str | None:
    """The sentence for `facts` (of `facts`, with a `why`), None when nothing is missing."""
    why, job = facts["why"], facts
    labels = job["labels"] or "{}"
    none = "no online worker with its labels" if json.loads(labels) else "no online worker"
    size = size_asked(job)
    if why == "no_worker":
        return "no online worker"
    if why == "labels":
        return f"no online worker has the labels {labels}"
    if why == "gpu_model":
        whole = " (whole GPUs: a task of more than one GPU is given no MIG instances)" if job["gpus"] > 1 else ""
        return f"{none} has {size}{whole}"
    if why == "nvlink":
        return (f"{none} has {job['gpus']} GPUs joined by NVLink (`gpu_link` nvlink: of one NVLink set; "
                "docs/workers.md, \"Topology\")")
    if why == "same":
        return _not_same(facts)
    if why == "whole_gpus":
        return f"{none} has {job['gpus']} whole GPUs: a task of more than one GPU is given no MIG instances (a CUDA process uses only one)"
    if why == "size":
        if not size:  # it asks for an accelerator alone
            return f"{none} has the accelerator it asks for ({job['accelerator']})"
        return f"{none} has the accelerator and size it asks for ({size})"
    if why == "secret":
        if facts["secret_labels"] is None:
            return f"secret {facts['detail']} is not set"
        return f"no online worker that fits joined with a token carrying the labels {facts['secret_labels']} of secret {facts['detail']}"
    if why == "cordoned":
        return f"only cordoned workers fit it: {cordoned(facts['workers'])}"
    if why == "unhealthy":
        gpus = ", ".join(f"{w['name']} (" + ", ".join(f"GPU {g['index']}: {g['reason']}" for g in w["gpus"]) + ")"
                         for w in facts["workers"])
        return f"only workers with unhealthy GPUs would fit: {gpus}"
    if why == "too_few":
        return _too_few(facts)
    return None


def _too_few(facts: dict) -> str:
    """A gang or a service's replicas that fewer online workers fit than it has ranks or replicas."""
    needs = f"needs {facts['width']} workers" + ("" if facts["gang"] else ", one per replica")
    if not facts["cordoned"]:
        return f"{needs}, but only {facts['fit']} online fit it"
    verb = "is" if facts["cordoned"] == 1 else "are"
    return f"{needs}, but of the {facts['fit']} online that fit it, {facts['cordoned']} {verb} cordoned: {cordoned(facts['workers'])}"


def _not_same(facts: dict) -> str:
    """A gang whose ranks must share label values (`same`) that too few online workers of one value fit."""
    keys, groups = facts["same"], facts["detail"]
    counts = sorted(((len(g), ",".join(f"{k}={v}" for k, v in zip(keys, value))) for value, g in groups.items()),
                    key=lambda c: (-c[0], c[1]))
    shown = "; ".join(f"{name}: {n}" for n, name in counts[:5]) + ("; ..." if len(counts) > 5 else "")
    return (f"needs {facts['width']} workers that share the value of {', '.join(keys)} (`same`), but at most "
            f"{counts[0][0] if counts else 0} online that fit it do" + (f" ({shown})" if counts else
                                                                         f" (none carries {', '.join(keys)})"))


def cordoned(workers: list[dict]) -> str:
    """"a (cordoned: maintenance), b (draining: ...)" of a list of {name, cordon, reason}."""
    return ", ".join(f"{w['name']} ({w['cordon']}: {w['reason']})" for w in workers)


def busy(job: dict, reserved: dict | None = None) -> str:
    """The reason of a job (its `facts`) that fits workers that are all busy now; `reserved`, its reservation
    (views.reservation), says where and from when its room is held."""
    size = size_asked(job)
    workers = f"{job['width']} workers" if job["gang"] else "one worker"
    room = f"a free slot and {size} free" if size else "a free slot"
    said = f"waiting for capacity: the online workers that fit are busy (it needs {workers} with {room} at once)"
    if reserved:
        when = datetime.datetime.fromtimestamp(reserved["start_at"], datetime.timezone.utc)
        said += (f"; reserved: {', '.join(reserved['workers'])} from "
                 f"{when.isoformat(timespec='seconds').replace('+00:00', 'Z')}, when the tasks there are expected to end")
    return said


def held_back(facts: dict | None) -> str | None:
    """The sentence for a job_quota_reason row (its project's quota, borrowing, its user's limit); None for none."""
    if facts is None:
        return None
    why = facts["why"]
    if why == "quota":
        borrowed = f", {facts['borrowed']} borrowed" if facts["borrowed"] else ""
        return f"project {facts['project']} at its quota ({plural(facts['in_use'] + facts['borrowed'], 'GPU')} in use{borrowed})"
    if why == "borrowing":
        return (f"project {facts['project']} may borrow beyond its quota ({plural(facts['nominal'], 'GPU')}) "
                "only what no other project waits for within its own")
    if why == "user_limit":
        return f"user {facts['user']} at {plural(facts['max_running_jobs'], 'running job')}"
    return None
