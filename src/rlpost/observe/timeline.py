"""Where a step's time goes: the phases laid out on the lanes that run them (a rollout worker, the trainer),
as the topology orders them, and what crosses the link between nodes.

Split from planner.py, which prices the phases (observe/cost.py) and hands them here for the step: the
phases in turn (colocated, disaggregated: the sum), or generation alongside the rest (async: the longer
lane). The same layout draws the step as a text Gantt chart under ``rlpost plan`` and, from a run's own
medians, as a picture in the run report (observe/report.py). Pure functions of dicts of seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlpost.observe.devices import CPU_AVX512
from rlpost.observe.workload import Shape, Workload

NET_GBPS = 100.0  # the default inter-node link: a GPU cluster's 100 Gbit/s Ethernet or InfiniBand port
# What a rollout worker pays to take new weights beyond the link, per pushed byte: the trainer's flat buffer, the
# worker's receive buffer, its split and its copy into the sampler, each a pass over the push in fresh memory, so
# it grows with the bytes (a fixed time fitted on the 135M model would price a 7B model's 14 GB push the same).
# Fitted on the quiet 2026-12-06 05:49 two-namespace run (benchmarks/multinode.py, Intel AMX, 2 cores, one worker,
# 325,653,120-byte pushes, the tied head then sent twice): the worker's load less the link's share and the
# trainer's cast (the `sync` row, 0.029 s) was 0.328 s at 1 Gbit/s and 0.206 s at 10; their mean, 0.267 s, is
# 1.22 GB/s. (The fixed 0.55 s before it, fitted when two workers shared the cores, overshot the whole 0.50 s
# measured at 10 Gbit/s.) A CPU figure; on a GPU unmeasured.
LOAD_GBS = 1.22


@dataclass(frozen=True)
class Net:
    nodes: int = 1  # machines the run spans; the trainer's ranks spread over them, rollout workers on another
    gbps: float = NET_GBPS  # the link between two nodes, Gbit/s per direction
    topology: str = "colocated"  # dist.topology: colocated and disaggregated run phases in turn, async overlaps
    weight_sync: str = "object_store"  # dist.weight_sync: broadcast keeps the trainer sending while the link carries
    trainer_threads: float = 0  # torch threads the trainer's phases run on (0: every core of the device)
    rollout_threads: float = 0  # torch threads each rollout worker samples on (0: every core)

    @property
    def bytes_per_s(self) -> float:
        return self.gbps * 1e9 / 8


def sync_bytes(s: Shape, w: Workload) -> float:
    """Bytes of one weight push: every parameter once, in the sampler's dtype. A tied head is a second name for the
    embedding in the trainer's state dict; a push leaves it out and the worker ties it back (distributed/sync.py:
    untie, retie), so the embedded model sends its 134,515,008 parameters, 269 MB in bf16."""
    return s.params * (2 if w.sampler_bf16 else 4)


def link_terms(s: Shape, w: Workload, gpus: int, net: Net) -> dict[str, float]:
    """Seconds on the inter-node link per step. The weight sync sends ``sync_bytes`` from the trainer to rollout
    workers on another node. FSDP (no mixed-precision policy: fp32 shards) all-gathers 4P bytes for each
    micro-batch's forward and again for its backward, and reduce-scatters 4P bytes of gradients; each forward-only
    pass (reference, old log-probs) gathers once per micro-batch. A ring over G ranks moves (G - 1) / G of those
    bytes through each node's link; only when the ranks span nodes."""
    if net.nodes == 1:
        return {}
    P, w = s.params, w.on(CPU_AVX512)  # only the workload's own fields matter here, not the device
    out = {"sync_link": sync_bytes(s, w) / net.bytes_per_s}
    if min(net.nodes, gpus) > 1:
        per_pass = math.ceil(max(1, w.batch // gpus) / w.micro(gpus))
        n_mini = max(1, w.batch // (w.mini_batch or w.batch))
        forwards = int(w.reference) + int(w.early_old or w.epochs > 1 or n_mini > 1)
        gathers = 3 * w.epochs * per_pass + forwards * per_pass
        out["fsdp_link"] = gathers * 4 * P * (gpus - 1) / gpus / net.bytes_per_s
    return out


def load_terms(s: Shape, w: Workload, net: Net) -> dict[str, float]:
    """The rollout workers' weight load, ``sync_bytes`` at ``LOAD_GBS``, in the topologies that have workers of
    their own: a colocated sampler takes the trainer's weights in place (the ``sync`` row)."""
    return {} if net.topology == "colocated" else {"load": sync_bytes(s, w) / (LOAD_GBS * 1e9)}


# --- The step as lanes ---
ROLLOUT = ("gen", "sync_link", "load")  # what a rollout worker does each step, in order: sample, then take weights
LANES = ("rollout", "trainer")


def timeline(phases: dict[str, float], topology: str, weight_sync: str = "object_store") -> list[tuple]:
    """(lane, phase, start s, end s) of one steady step. The rollout lane samples, then takes the new weights (the
    link, then the load), which is what it waits for before its next chunk; every other phase is the trainer's (or
    the driver's, between them), in ``phases``' order. Colocated and disaggregated take turns: the trainer starts
    when generation ends, and the weights move when it is done. Async runs the lanes side by side, each on a
    batch of its own; under dist.weight_sync=broadcast the trainer sends while the link carries, so its lane waits
    for the link too."""
    rollout = [(k, v) for k, v in phases.items() if k in ROLLOUT]
    trainer = [(k, v) for k, v in phases.items() if k not in ROLLOUT and k != "step"]
    first, after = [x for x in rollout if x[0] == "gen"], [x for x in rollout if x[0] != "gen"]
    bars, t = [], 0.0
    for k, v in first:
        bars, t = [*bars, ("rollout", k, t, t + v)], t + v
    u = 0.0 if topology == "async" else t
    for k, v in trainer:
        bars, u = [*bars, ("trainer", k, u, u + v)], u + v
    t = t if topology == "async" else u
    for k, v in after:
        bars, t = [*bars, ("rollout", k, t, t + v)], t + v
        if k == "sync_link" and weight_sync == "broadcast" and topology == "async":
            bars = [*bars, ("trainer", k, u, u + v)]  # the sender is busy as long as the link
    return bars


def step_of(bars: list[tuple]) -> float:
    return max((end for *_, end in bars), default=0.0)


def across_nodes(s: Shape, w: Workload, t: dict[str, float], gpus: int, net: Net) -> dict[str, float]:
    """``t`` (step_time's phases) with the link's terms and the workers' load as rows of their own, and the step
    as ``timeline`` lays them out: the phases in turn (colocated, disaggregated), or the longer lane (async)."""
    phases = {k: v for k, v in t.items() if k != "step"} | link_terms(s, w, gpus, net) | load_terms(s, w, net)
    return {**phases, "step": step_of(timeline(phases, net.topology, net.weight_sync))}


# --- The text Gantt chart ---
SYMBOL = {"gen": "G", "ref": "R", "old": "O", "update": "U", "sync": "S", "sync_link": "N", "load": "L",
          "fsdp_link": "F", "reward": "V", "adv": "A"}
WIDTH = 60


def gantt(bars: list[tuple], labels: dict[str, str], width: int = WIDTH) -> list[str]:
    """The bars as text: a row of ``width`` columns per lane, one letter per phase ('.' where the lane waits),
    then a legend of every phase with its seconds. A phase shorter than half a column does not show."""
    step = step_of(bars)
    if step <= 0:
        return []
    rows = {lane: ["."] * width for lane in LANES}
    for lane, k, t0, t1 in bars:
        for col in range(round(t0 / step * width), round(t1 / step * width)):
            rows[lane][col] = SYMBOL.get(k, "#")
    out = [f"  {lane:<8}|{''.join(rows[lane])}|" for lane in LANES]
    out.append(f"  {'':<8}0{'':>{width - 1}}{step:.3g} s")
    seconds: dict[str, float] = {}
    for _, k, t0, t1 in bars:
        seconds.setdefault(k, t1 - t0)  # broadcast's link shows on both lanes: once here
    out += [f"  {SYMBOL.get(k, '#')} {labels.get(k, k)}, {v:.3g} s" for k, v in seconds.items()]
    return out
