"""Why a queued job is not placed, in words, from the facts `job_waiting_reason` and `job_quota_reason` return.

SQL answers the question (the first thing no online worker has, how many fit);
this module writes the sentence: only what the job asked for is named ("1 GPU",
never "0 CPUs, 0 MB"), counts agree with their nouns, and "with its labels" is
said only of a job that has labels.
"""
from __future__ import annotations

import json

from gpulayer.protocol import plural


def size_asked(job: dict) -> str:
    """What one task of `job` asks for, naming only what it asks: "1 GPU and 512 MB", "2 CPUs"; "" for nothing."""
    labels = json.loads(job["labels"] or "{}")
    parts = []
    if job["gpus"]:
        parts.append(plural(job["gpus"], "GPU") + (f" of model {labels['gpu_model']}" if labels.get("gpu_model") else ""))
    if job["cpus"]:
        parts.append(plural(job["cpus"], "CPU"))
    if job["memory_mb"]:
        parts.append(f"{job['memory_mb']} MB")
    return ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else "".join(parts)


def unplaced(facts: dict) -> str | None:
    """The sentence for `facts` (a job_waiting_reason row with a `why`), None when nothing is missing."""
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
                         for w in json.loads(facts["workers"]))
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


def cordoned(workers: str) -> str:
    """"a (cordoned: maintenance), b (draining: ...)" of a JSON list of {name, cordon, reason}."""
    return ", ".join(f"{w['name']} ({w['cordon']}: {w['reason']})" for w in json.loads(workers))


def busy(job: dict) -> str:
    """The reason of a job (a job_waiting_reason row) that fits workers that are all busy now."""
    size = size_asked(job)
    workers = f"{job['width']} workers" if job["gang"] else "one worker"
    room = f"a free slot and {size} free" if size else "a free slot"
    return f"waiting for capacity: the online workers that fit are busy (it needs {workers} with {room} at once)"


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
