"""Two hosts made of one machine: two Linux network namespaces joined by a veth pair, each with its
own address (10.78.0.1, 10.78.0.2) and its own Ray node, for the multi-node tests
(tests/distributed/test_multinode.py), and for a benchmark of the link between them.

Each namespace sees only its loopback and its end of the pair, so what crosses from one node to the
other crosses the veth, as between two machines; ``rate_mbit`` caps it with ``tc``. Names carry this
process's id and a counter, so a run killed before its clean-up never blocks the next one. Every
process the cluster starts lives in one of its namespaces, and ``stop`` kills exactly those (``ip
netns pids``): ``ray stop`` is not used, as it kills every Ray process of the machine, namespaces or
not. Needs root (CAP_NET_ADMIN): ``refused`` says why not.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).with_name("ray"))
IPS = ("10.78.0.1", "10.78.0.2")
PORT = 6390
_count = itertools.count()

WAIT_NODES = """
import sys, time, ray
ray.init(address=sys.argv[1], configure_logging=False, log_to_driver=False)
t0 = time.time()
while sum(n["Alive"] for n in ray.nodes()) < int(sys.argv[2]):
    if time.time() - t0 > float(sys.argv[3]):
        sys.exit(f"{sum(n['Alive'] for n in ray.nodes())} of {sys.argv[2]} Ray nodes joined")
    time.sleep(0.5)
"""


def refused() -> str | None:
    """Why namespaces cannot be made here (ip netns add refused: not root, no CAP_NET_ADMIN), else None."""
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    probe = f"rlprobe{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"`ip netns add` refused: {r.stderr.strip() or r.returncode}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def sh(*argv: str) -> None:
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")


@dataclass
class Hosts:
    ns: list[str]  # the namespaces, node 0 (the head, where the driver runs) first
    veth: list[str]  # each namespace's end of the pair
    tmp: Path  # Ray's temp dirs and the nodes' logs
    env: dict  # what every process of the cluster is started with
    address: str = f"{IPS[0]}:{PORT}"
    procs: list = field(default_factory=list)

    def argv(self, node: int, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns[node], *argv]

    def run(self, node: int, *argv: str, timeout: float, **kw) -> subprocess.CompletedProcess:
        """argv on ``node`` (a Python script: ``sys.executable``), to the end; its output captured."""
        return subprocess.run(self.argv(node, *argv), env=self.env, capture_output=True, text=True, timeout=timeout,
                              **kw)

    def popen(self, node: int, *argv: str, **kw) -> subprocess.Popen:
        p = subprocess.Popen(self.argv(node, *argv), env=self.env, start_new_session=True, **kw)
        self.procs.append(p)
        return p

    def start_node(self, node: int, cpus: int, store_mb: int) -> None:
        join = ["--head", f"--port={PORT}", "--include-dashboard=false"] if node == 0 else [f"--address={self.address}"]
        log = open(self.tmp / f"node{node}.log", "w")
        self.popen(node, RAY, "start", "--block", *join, f"--node-ip-address={IPS[node]}", f"--num-cpus={cpus}",
                   f"--object-store-memory={store_mb * 10**6}", f"--temp-dir={self.tmp / f'r{node}'}",
                   "--disable-usage-stats", stdout=log, stderr=subprocess.STDOUT)

    def wait_nodes(self, n: int, timeout: float = 90) -> None:
        r = self.run(0, sys.executable, "-c", WAIT_NODES, self.address, str(n), str(timeout), timeout=timeout + 30)
        if r.returncode != 0:
            logs = "\n".join(p.read_text()[-2000:] for p in sorted(self.tmp.glob("node*.log")))
            raise RuntimeError(f"the Ray cluster did not come up: {r.stderr[-2000:]}\n{logs}")

    def kill_node(self, node: int) -> None:
        """Every process of ``node`` killed at once, as a machine that loses power (no clean exit)."""
        kill_all(self.ns[node])


def pids(ns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def kill_all(ns: str, wait_s: float = 20) -> None:
    t0 = time.time()
    while (left := pids(ns)) and time.time() - t0 < wait_s:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)


@contextmanager
def two_hosts(cpus: int = 2, store_mb: int = 300, rate_mbit: float | None = None, env: dict | None = None):
    """A running two-node Ray cluster (``Hosts``), torn down whatever happens inside: every process
    in the namespaces killed and reaped, the namespaces (and with them the veth pair) deleted, the
    temp dir removed. ``env``: added to every process's environment."""
    tag = f"rl{os.getpid() % 100000}n{next(_count)}"
    ns, veth = [f"{tag}a", f"{tag}b"], [f"{tag}x", f"{tag}y"]
    tmp = Path(tempfile.mkdtemp(prefix="rlp", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    hosts = Hosts(ns, veth, tmp, {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
                                  **(env or {})})
    try:
        for n in ns:
            sh("ip", "netns", "add", n)
        sh("ip", "link", "add", veth[0], "type", "veth", "peer", "name", veth[1])
        for i in (0, 1):
            sh("ip", "link", "set", veth[i], "netns", ns[i])
            sh("ip", "-n", ns[i], "addr", "add", f"{IPS[i]}/24", "dev", veth[i])
            sh("ip", "-n", ns[i], "link", "set", veth[i], "up")
            sh("ip", "-n", ns[i], "link", "set", "lo", "up")
            # Ray finds a process's own address by routing towards the internet (no packet is sent):
            # the route goes out through the pair, to the other namespace, which forwards nothing.
            sh("ip", "-n", ns[i], "route", "add", "default", "dev", veth[i])
            if rate_mbit:
                sh("ip", "netns", "exec", ns[i], "tc", "qdisc", "add", "dev", veth[i], "root", "tbf", "rate",
                   f"{rate_mbit}mbit", "burst", "1mb", "latency", "100ms")
        hosts.start_node(0, cpus, store_mb)
        hosts.wait_nodes(1)
        hosts.start_node(1, cpus, store_mb)
        hosts.wait_nodes(2)
        yield hosts
    finally:
        for n in ns:
            kill_all(n)
        for p in hosts.procs:
            p.wait(timeout=30)
        for n in ns:
            subprocess.run(["ip", "netns", "del", n], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
