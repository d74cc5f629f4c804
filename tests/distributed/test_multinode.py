"""Ray runs over two hosts: two network namespaces joined by a veth pair, a Ray node in each
(tests/netns_cluster.py), the driver (the real `rlpost train`) on the first. Each run puts its two
FSDP trainer ranks on different hosts on purpose (dist.trainer_placement=spread) and a rollout worker
on each, and must give the one-host run's samples and updates at every step, bit for bit: nothing
of the arithmetic depends on where an actor runs. A lost host under async packs the ranks on one host
instead, so the workers sit on the other. Skipped, with the reason, where namespaces cannot
be made (not root, no CAP_NET_ADMIN); CI runs as root."""

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import TINY, cli
from safetensors.torch import load_file

ray = pytest.importorskip("ray")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # netns_cluster.py, beside helpers.py
import netns_cluster  # noqa: E402

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bool(netns_cluster.refused()), reason=f"{netns_cluster.refused()}")]

# 3 steps of 8 prompts x 4 samples in chunks of 2 prompts, two workers, two FSDP trainer ranks, a
# checkpoint each step (the node-loss run resumes from one).
ARGS = [*TINY, "run.steps=3", "rollout.prompts_per_step=8", "rollout.group_size=4", "rollout.max_new_tokens=4",
        "task.verifier=toy_verifiers:odd_length", "run.checkpoint_every=1", "run.keep_checkpoints=3",
        "algo.tis_cap=2", "dist.topology=disaggregated", "dist.rollout_workers=2", "dist.chunk_prompts=2",
        "dist.trainer_ranks=2"]
# Ray's memory monitor off: on a busy machine it kills workers for other programs' memory, a loss no test means.
NO_MEMORY_MONITOR = {"RAY_memory_monitor_refresh_ms": "0"}
TWO_HOSTS = ["dist.trainer_placement=spread", f"dist.ray_address={netns_cluster.IPS[0]}:{netns_cluster.PORT}"]


def learning(run: Path) -> list[dict]:
    """Each step's metrics that are a function of the samples and the weights alone (no clocks, no queue)."""
    keep = ("reward/", "actor/", "response_length/")
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k.startswith(keep)} for r in rows]


def samples(run: Path) -> list[list[tuple]]:
    """Each step's trained samples: (prompt, completion, reward) of every row."""
    out = []
    for f in sorted((run / "samples").glob("step_*.jsonl")):
        rows = [json.loads(x) for x in f.read_text().splitlines()]
        out.append([(r.get("prompt"), r.get("completion"), r.get("reward")) for r in rows])
    return out


def weights(run: Path, step: int) -> dict:
    return load_file(run / "checkpoints" / f"step_{step:06d}" / "model.safetensors")


def assert_same_run(run: Path, ref: Path) -> None:
    assert learning(run) == learning(ref)
    assert samples(run) == samples(ref) and samples(ref)
    a, b = weights(run, 3), weights(ref, 3)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def placement(stderr: str) -> tuple[list[str], list[str]]:
    """(the trainer ranks' node addresses, the rollout workers') from the start-up line."""
    m = re.search(r"placement: trainer rank\(s\) on ([\d., ]+) \(.*\); rollout worker\(s\) on ([\d., ]+) \(", stderr)
    assert m, stderr[-3000:]
    return m[1].split(", "), m[2].split(", ")


@pytest.fixture(scope="module")
def one_host(tmp_path_factory):
    """The run on this machine's own Ray (both ranks on one node): what the two-host runs must equal."""
    out = tmp_path_factory.mktemp("one")
    try:
        r = cli("train", *ARGS, f"run.out_dir={out}", "run.name=run")
    finally:
        ray.shutdown()
    assert r.returncode == 0, r.stderr[-3000:]
    return out / "run"


@pytest.fixture(scope="module")
def hosts(one_host):  # the one-host run first: its Ray is shut down before the cluster starts
    with netns_cluster.two_hosts(cpus=2, store_mb=300, env=NO_MEMORY_MONITOR) as h:
        yield h


def train_on(hosts, run: Path, *more: str, timeout: float = 300):
    """`rlpost train` on the first host (the driver), its run folder at ``run``."""
    return hosts.run(0, sys.executable, "-m", "rlpost.cli", "train", *ARGS, *TWO_HOSTS, *more,
                     f"run.out_dir={run.parent}", f"run.name={run.name}", timeout=timeout)


def test_fsdp_ranks_on_two_hosts_train_as_on_one(tmp_path, hosts, one_host):
    r = train_on(hosts, tmp_path / "run")
    assert r.returncode == 0, r.stderr[-3000:]
    ranks, workers = placement(r.stderr)
    assert sorted(ranks) == sorted(workers) == list(netns_cluster.IPS)  # one rank and one worker a host
    assert_same_run(tmp_path / "run", one_host)


def test_async_with_weights_by_broadcast_on_two_hosts_is_the_one_host_run(tmp_path, hosts, one_host):
    # async with max_staleness 0 is the synchronous loop (test_ray.py): the same numbers, with the
    # weights broadcast from rank 0 on one host to a worker on each, over the veth.
    r = train_on(hosts, tmp_path / "run", "dist.topology=async", "dist.max_staleness=0",
                 "dist.weight_sync=broadcast")
    assert r.returncode == 0, r.stderr[-3000:]
    ranks, workers = placement(r.stderr)
    assert sorted(ranks) == sorted(workers) == list(netns_cluster.IPS)
    assert "weights by broadcast" in r.stderr
    assert_same_run(tmp_path / "run", one_host)


def test_a_lost_node_stops_the_run_in_one_line_and_it_resumes_on_one_host(tmp_path, hosts, one_host):
    run = tmp_path / "run"
    driver = hosts.popen(0, sys.executable, "-m", "rlpost.cli", "train", *ARGS, *TWO_HOSTS, f"run.out_dir={tmp_path}",
                         "run.name=run", stdout=open(tmp_path / "out", "w"), stderr=open(tmp_path / "err", "w"))
    t0 = time.time()
    while not (run / "checkpoints" / "step_000001").exists():  # a node lost after step 1
        assert driver.poll() is None and time.time() - t0 < 240, (tmp_path / "err").read_text()[-3000:]
        time.sleep(0.2)
    hosts.kill_node(1)
    code = driver.wait(timeout=180)  # a hang fails here
    err = (tmp_path / "err").read_text()
    assert code == 1, err[-4000:]
    # The line that stops it (Ray may print its actors' last log lines after it).
    last = [x for x in err.splitlines() if x.startswith("rlpost: ")][-1]
    assert "trainer rank died" in last and "--resume" in last and "Traceback" not in err, err[-4000:]
    # On one host (this machine's own Ray) from the last whole checkpoint: the one-host run's numbers.
    try:
        resumed = cli("train", "--resume", str(run), "dist.ray_address=", "dist.trainer_placement=pack")
    finally:
        ray.shutdown()
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_run(run, one_host)


def test_a_lost_node_under_async_brings_its_workers_back_or_stops_and_resumes(tmp_path, one_host):
    # A cluster of its own: the module's lost its second host to the test above.
    with netns_cluster.two_hosts(cpus=2, store_mb=300, env=NO_MEMORY_MONITOR) as hosts:
        lose_a_host_under_async(tmp_path, hosts, one_host)


def lose_a_host_under_async(tmp_path, hosts, one_host):
    # async with max_staleness 0 (the synchronous loop: the one-host run's numbers), weights through the object
    # store (a worker can be started again), both trainer ranks packed on one host, so the rollout workers go to
    # the other (distributed/placement.py). Host 1 is lost after step 1: where it held only workers they start
    # again on host 0 and the run goes on; where it held the trainer the run stops in one line and resumes.
    run = tmp_path / "run"
    more = ["dist.topology=async", "dist.max_staleness=0", "dist.trainer_placement=pack",
            f"dist.ray_address={netns_cluster.IPS[0]}:{netns_cluster.PORT}"]
    driver = hosts.popen(0, sys.executable, "-m", "rlpost.cli", "train", *ARGS, *more, f"run.out_dir={tmp_path}",
                         "run.name=run", stdout=open(tmp_path / "out", "w"), stderr=open(tmp_path / "err", "w"))
    t0 = time.time()
    while not (run / "checkpoints" / "step_000001").exists():
        assert driver.poll() is None and time.time() - t0 < 600, (tmp_path / "err").read_text()[-3000:]
        time.sleep(0.2)
    ranks, workers = placement((tmp_path / "err").read_text())
    assert len(set(ranks)) == 1 and not set(ranks) & set(workers)  # packed, and the workers kept apart
    hosts.kill_node(1)
    code = driver.wait(timeout=600)  # a hang fails here
    err = (tmp_path / "err").read_text()
    assert "Traceback" not in err, err[-4000:]
    if set(ranks) == {netns_cluster.IPS[0]}:  # host 1 held only workers: they came back on host 0
        assert code == 0 and "restarting it and re-issuing its chunk" in err, err[-4000:]
    else:  # host 1 held the trainer: one line, then the rest of the run on one host from the last checkpoint
        last = [x for x in err.splitlines() if x.startswith("rlpost: ")][-1]
        assert code == 1 and "trainer rank died" in last and "--resume" in last, err[-4000:]
        try:
            resumed = cli("train", "--resume", str(run), "dist.ray_address=")
        finally:
            ray.shutdown()
        assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_run(run, one_host)
