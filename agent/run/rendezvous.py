"""Multi-node rendezvous: wait until every rank has arrived, then give torch its variables."""

import socket
import time
from typing import Callable

from ..errors import TaskSetupError
from ..events import log_event
from ..link.transport import Transport

RENDEZVOUS_TIMEOUT_S = 300.0
RENDEZVOUS_INTERVAL_S = 0.5


def free_port() -> int:
    """A TCP port that is free right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def rendezvous(
    transport: Transport,
    task_id: int,
    address: str,
    port: int,
    wait_cancel: Callable[[float], bool],
    timeout_s: float = RENDEZVOUS_TIMEOUT_S,
    interval_s: float = RENDEZVOUS_INTERVAL_S,
    clock: Callable[[], float] = time.monotonic,
) -> dict | None:
    """POST rendezvous every ``interval_s`` until ready; None if cancelled meanwhile.

    Raises TaskSetupError when it does not complete within ``timeout_s``.
    """
    deadline = clock() + timeout_s
    body = {"address": address, "port": port}
    while True:
        answer = transport.call("POST", f"/worker/tasks/{task_id}/rendezvous", body)
        if answer.get("ready"):
            log_event("rendezvous_ready", task_id=task_id, rank=answer.get("rank"), world_size=answer.get("world_size"))
            return answer
        if clock() >= deadline:
            raise TaskSetupError(f"rendezvous did not complete within {timeout_s:g} s: not every rank arrived")
        if wait_cancel(interval_s):
            return None


def distributed_env(answer: dict) -> dict[str, str]:
    """The variables torch.distributed and torchrun read, from a ready rendezvous answer."""
    rank = str(answer["rank"])
    return {
        "MASTER_ADDR": str(answer["master_addr"]),
        "MASTER_PORT": str(answer["master_port"]),
        "WORLD_SIZE": str(answer["world_size"]),
        "RANK": rank,
        "NODE_RANK": rank,
        "LOCAL_RANK": "0",
        "GPULAYER_PEERS": ",".join(str(peer) for peer in answer.get("peers") or []),
    }
