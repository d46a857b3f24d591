"""Multi-node jobs end to end: two real workers whose ranks talk through MASTER_ADDR:MASTER_PORT.

The plain variant runs both workers on loopback. As root with `ip`, the same
job runs with each worker in its own network namespace with its own address
(veth pairs on a bridge; the control plane listens on the bridge's address).
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap

import pytest

from integration_cluster import Cluster
from netns import BridgedNamespaces, netns_unavailable

EXCHANGE = textwrap.dedent("""
    import os, socket, time
    rank, addr, port = int(os.environ["RANK"]), os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    print("env", rank, os.environ["WORLD_SIZE"], os.environ["NODE_RANK"], os.environ["LOCAL_RANK"],
          os.environ["GPULAYER_PEERS"], flush=True)
    msg = f"hello from rank {rank}"
    if rank == 0:
        server = socket.create_server(("", port))
        server.settimeout(20)
        conn, peer = server.accept()
    else:
        deadline = time.time() + 20
        while True:
            try:
                conn = socket.create_connection((addr, port), timeout=2)
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.1)
        peer = conn.getsockname()
    conn.sendall(msg.encode())
    other = conn.recv(1024).decode()
    print(f"rank {rank} got: {other} (peer {peer[0]})", flush=True)
""")

ALL_REDUCE = textwrap.dedent("""
    import os, torch, torch.distributed as dist
    dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=30))
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    print(f"rank {dist.get_rank()} of {dist.get_world_size()} all_reduce={t.item():g}", flush=True)
    dist.destroy_process_group()
""")


def run_job(cluster: Cluster, script, *, env=None, timeout=40) -> tuple[dict, str]:
    """Submit a 2-node job running `script` with the CLI, wait for it; (Job, log text).

    The script goes whole in the command (python -c): a sandboxed rank sees no file of the test's host dirs."""
    args = ["submit", "--nodes", "2", "--wait"]
    for key, value in (env or {}).items():
        args += ["--env", f"{key}={value}"]
    r = cluster.cli(*args, "--", sys.executable, "-c", script, timeout=timeout)
    job_id = int(r.stdout.split()[0])
    info = cluster.job(job_id)
    return info, cluster.log_text(job_id) + f"\n[cli rc={r.returncode} stderr={r.stderr[-500:]}]"


def check_exchange(cluster: Cluster, addresses: list[str]) -> None:
    info, logs = run_job(cluster, EXCHANGE)
    assert info["state"] == "succeeded", logs + cluster.logs()
    ranks = sorted((t for t in info["tasks"] if t["attempt"] == info["attempt"]), key=lambda t: t["index"])
    assert len({t["worker_id"] for t in ranks}) == 2
    assert {t["address"] for t in ranks} == set(addresses)
    master = ranks[0]["address"]
    assert "rank 0 got: hello from rank 1" in logs and "rank 1 got: hello from rank 0" in logs, logs
    assert f"env 1 2 1 0 {master}:" in logs, logs
    status = cluster.cli("job", "status", str(info["id"])).stdout
    lines = {line.split()[1]: line for line in status.splitlines() if line.strip().startswith("task ")}
    for t in ranks:  # each rank's worker and address
        line = lines[str(t["task_id"])]
        assert f"address={t['address']}" in line and str(t["worker_id"]) in line.split("worker=")[1].split()[0], status


@pytest.fixture(scope="module")
def loopback(cluster):
    return cluster


def test_two_ranks_exchange_over_master_addr_on_loopback(loopback):
    check_exchange(loopback, ["127.0.0.1"])


def test_torch_all_reduce_over_gloo(loopback):
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed (pip install torch==2.13.0 for the CPU build)")
    info, logs = run_job(loopback, ALL_REDUCE, env={"GLOO_SOCKET_IFNAME": "lo"}, timeout=60)
    assert info["state"] == "succeeded", logs + loopback.logs()
    assert "rank 0 of 2 all_reduce=3" in logs and "rank 1 of 2 all_reduce=3" in logs, logs


# -- network namespaces ------------------------------------------------------------

@pytest.mark.netns
def test_two_ranks_exchange_across_network_namespaces(tmp_path):
    reason = netns_unavailable()
    if reason:
        pytest.skip(reason)
    try:
        ns = BridgedNamespaces(2).create()
    except subprocess.CalledProcessError as exc:
        BridgedNamespaces(2).delete()
        pytest.skip(f"cannot create network namespaces here: {exc.stderr.strip()}")
    cluster = Cluster(tmp_path, host=ns.host)
    try:
        cluster.start_server()
        for i, (name, address) in enumerate(zip(ns.names, ns.addresses)):
            cluster.start_worker(f"ns{i}", advertise=address, netns=name)
        workers = {w["name"]: w["advertise_address"] for w in cluster.api("/workers")["workers"]}
        assert workers == {"ns0": ns.addresses[0], "ns1": ns.addresses[1]}
        check_exchange(cluster, ns.addresses)
    finally:
        codes = cluster.close()
        ns.delete()
    assert set(codes.values()) <= {0}, codes
