"""The planner across nodes against a run over a capped link: sync time and step, predicted and measured.

    sudo .venv/bin/python benchmarks/multinode.py                 # 1 and 10 Gbit/s, 3 steps each
    sudo .venv/bin/python benchmarks/multinode.py --gbps 1 --steps 3

Two hosts made of one machine (tests/netns_cluster.py: two network namespaces joined by a veth pair,
a Ray node in each), the veth capped by `tc` at each rate. On it a disaggregated run of the embedded
SmolLM2-135M-Instruct: one trainer rank and one rollout worker, which rlpost places on the other host
(distributed/placement.py), weights by broadcast from the trainer's rank 0, so every push crosses the
link once: every parameter once in bf16, 269 MB (the tied head goes once; the worker ties it back). The planner (`rlpost
plan --from RUN --nodes 2 --net-gbps B`) predicts the run's own workload. Sync: the worker's
`timing_s/worker_weight_load`, timed from the trainer's cast through the link into its sampler, against
the planner's sync + sync_link + load. Step: the last step's `timing_s/step` (step 1 carries the warm-up,
and loads no weights), whose generation waits for that load. Needs root (CAP_NET_ADMIN). Writes
benchmarks/results/multinode.json (the rows it prints, the load average beside each).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # netns_cluster.py
import netns_cluster  # noqa: E402

from rlpost.observe import planner  # noqa: E402

ARGS = ["rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=16", "run.progress=false",
        "run.checkpoint_every=0", "run.eval_every=0", "run.passk_eval=0", "dist.topology=disaggregated",
        "dist.rollout_workers=1", "dist.trainer_ranks=1", "dist.weight_sync=broadcast",
        f"dist.ray_address={netns_cluster.IPS[0]}:{netns_cluster.PORT}"]


def measure(gbps: float, steps: int, out: Path, timeout_s: float = 900) -> dict:
    """One run over a link capped at ``gbps``: the planner's prediction of it and its last step's figures."""
    run = out / f"g{gbps:g}"
    # without Ray's memory monitor: on a machine shared with other jobs it killed the rollout worker (a broadcast
    # run cannot replace one), for memory the other jobs held
    with netns_cluster.two_hosts(cpus=2, store_mb=600, rate_mbit=gbps * 1000,
                                 env={"RAY_memory_monitor_refresh_ms": "0"}) as hosts:
        r = hosts.run(0, sys.executable, "-m", "rlpost.cli", "train", *ARGS, f"run.steps={steps}",
                      f"run.out_dir={out}", f"run.name={run.name}", timeout=timeout_s)
    if r.returncode != 0:
        raise SystemExit(f"the run at {gbps:g} Gbit/s failed:\n{r.stderr[-3000:]}")
    placement = next((x.split("placement: ", 1)[1] for x in r.stderr.splitlines() if "placement: " in x), "")
    last = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    cal = planner.calibrate(run, "cpu", 1, net=planner.Net(2, gbps))
    t, rows = cal["plan"]["time_s"], {x["name"]: x for x in cal["rows"]}
    sync_pred, sync = rows["timing_s/worker_weight_load"]["predicted"], last["timing_s/worker_weight_load"]
    return {"gbps": gbps, "placement": placement, "load_avg_1min": os.getloadavg()[0],
            "sync_pred_s": sync_pred, "sync_s": sync, "step_pred_s": t["step"], "step_s": last["timing_s/step"],
            "sync_ratio": sync / sync_pred, "step_ratio": last["timing_s/step"] / t["step"],
            "measured_s": {k.split("/", 1)[1]: v for k, v in last.items() if k.startswith("timing_s/")},
            "predicted_s": t}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gbps", type=float, action="append", help="link rates, Gbit/s (default 1 and 10)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--timeout", type=float, default=900, help="seconds a run may take (a loaded machine: more)")
    p.add_argument("--keep", metavar="DIR", help="write the run folders here and keep them (default: a temporary "
                   "folder, removed), to calibrate against them again: rlpost plan --from DIR/g1 --nodes 2 "
                   "--net-gbps 1")
    a = p.parse_args()
    if why := netns_cluster.refused():
        print(f"multinode: cannot make network namespaces here: {why}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="rlpmn") as tmp:
        out = Path(a.keep or tmp)
        rows = [measure(g, a.steps, out, a.timeout) for g in a.gbps or (1.0, 10.0)]
    print(f"{'Gbit/s':>7}{'sync pred':>11}{'sync meas':>11}{'ratio':>7}{'step pred':>11}{'step meas':>11}{'ratio':>7}"
          f"{'load avg':>10}")
    for r in rows:
        print(f"{r['gbps']:>7g}{r['sync_pred_s']:>11.3f}{r['sync_s']:>11.3f}{r['sync_ratio']:>7.2f}"
              f"{r['step_pred_s']:>11.3f}{r['step_s']:>11.3f}{r['step_ratio']:>7.2f}{r['load_avg_1min']:>10.1f}")
    for r in rows:
        print(f"{r['gbps']:g} Gbit/s: {r['placement']}")
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "multinode.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
