"""Which nodes the rollout workers go to, once the trainer's ranks are placed: a pure function of the
cluster's nodes (what ``ray.nodes()`` says each has), so tests can hand it made-up clusters.

Why. A rollout worker beside a trainer rank shares its node's cores, memory bandwidth and (on a GPU
cluster) its GPUs; the weight push then costs the same link either way. Where the cluster has nodes
without a trainer rank that can hold every worker, the workers go there, spread one a node in turn:
GPU trainer ranks on their GPU nodes, GPU rollout workers on the other GPU nodes, and CPU rollout
workers on the nodes without a GPU first (a GPU node's CPUs are the trainer's to feed its GPU). Where
they cannot all fit away from the trainer (one node; or every node holds a rank), Ray spreads them over
every node as before (``None``). topology.place pins each worker's bundle to its node with Ray's own
``node:<address>`` resource.
"""

from __future__ import annotations

# A bundle pinned to a node asks for this much of the node's own resource, ``node:<address>`` (1.0 a node):
# any number of workers under 1 / PIN share a node.
PIN = 0.001


def alive(ray_nodes: list[dict]) -> list[dict]:
    """{"ip", and each resource the node has} of every live node, from ``ray.nodes()``."""
    return [{"ip": n["NodeManagerAddress"], **n["Resources"]} for n in ray_nodes if n.get("Alive")]


def worker_nodes(nodes: list[dict], trainer_ips: list[str], bundle: dict, n: int) -> list[str] | None:
    """The address of the node for each of ``n`` rollout workers asking ``bundle`` each (``{"CPU": 0.5}``,
    with ``"GPU": 1`` under run.device=cuda), away from the nodes in ``trainer_ips``; None when they do not all
    fit there. Round-robin over the candidate nodes, CPU-only nodes first for a bundle with no GPU, so workers
    spread; a node takes a worker while what is left of it holds the bundle."""
    gpu = bundle.get("GPU", 0) > 0
    free = [dict(x) for x in nodes if x["ip"] not in trainer_ips and (x.get("GPU", 0) > 0 or not gpu)]
    free.sort(key=lambda x: x.get("GPU", 0) > 0)  # stable: CPU-only nodes first, each kind in the cluster's order
    out: list[str] = []
    while len(out) < n:
        took = False
        for node in free:
            if len(out) < n and all(node.get(k, 0) >= v for k, v in bundle.items()):
                for k, v in bundle.items():
                    node[k] -= v
                out.append(node["ip"])
                took = True
        if not took:
            return None
    return out


def pinned(bundle: dict, ip: str) -> dict:
    """``bundle`` held to the node at ``ip``."""
    return {**bundle, f"node:{ip}": PIN}
