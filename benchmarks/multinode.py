"""The planner across nodes against a run over a capped link: sync time and step, predicted and measured.

    sudo .venv/bin/python benchmarks/multinode.py                 # 1 and 10 Gbit/s, one host before each, 5 steps
    sudo .venv/bin/python benchmarks/multinode.py --gbps 1 --steps 3 --no-one-host

Two hosts made of one machine (tests/netns_cluster.py: two network namespaces joined by a veth pair,
a Ray node in each), the veth capped by `tc` at each rate. On it a disaggregated run of the embedded
SmolLM2-135M-Instruct: one trainer rank and one rollout worker, one torch thread each (a Ray bundle of one CPU
each; on a machine shared with other jobs, two threads an actor thrashed: steps 10-30x the quiet ones), which
rlpost places on the other host (distributed/placement.py), weights by broadcast from the trainer's rank 0, so
every push crosses the link once: every parameter once in bf16, 269 MB (the tied head goes once; the worker ties
it back). The planner (`rlpost plan --from RUN --nodes 2 --net-gbps B`) predicts the run's own workload. Sync:
the worker's `timing_s/worker_weight_load`, timed from the trainer's cast through the link into its sampler,
against the planner's sync + sync_link + load. Step: `timing_s/step`, whose generation waits for that load. Each
the median over the steps after the first (step 1 carries the warm-up, and loads no weights). Needs root
(CAP_NET_ADMIN). Writes benchmarks/results/multinode.json (the rows it prints, the 1-minute load average before
and after each run).

Before each rate, the same workload on one host (no namespace: a local Ray, the same two actors on the same
cores, the weights by broadcast over loopback): `rlpost plan --from ONE_HOST --fit` fits the efficiencies of its
compute phases (generation, update), and each two-host run is predicted three times: at the planner's table, at
the efficiencies of the first one-host run (`first`: one calibration for every layout) and at those of the
one-host run just before it (`paired`: the machine is shared, and its load drifts between runs minutes apart).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # netns_cluster.py
import netns_cluster  # noqa: E402

from rlpost.observe import planner  # noqa: E402

ARGS = ["rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=16", "run.progress=false",
        "run.checkpoint_every=0", "run.eval_every=0", "run.passk_eval=0", "dist.topology=disaggregated",
        "dist.rollout_workers=1", "dist.trainer_ranks=1", "dist.weight_sync=broadcast", "dist.trainer_threads=1",
        "dist.rollout_threads=1"]
TWO_HOSTS = [f"dist.ray_address={netns_cluster.IPS[0]}:{netns_cluster.PORT}"]
# without Ray's memory monitor: on a machine shared with other jobs it killed the rollout worker (a broadcast
# run cannot replace one), for memory the other jobs held
RAY_ENV = {"RAY_memory_monitor_refresh_ms": "0"}


def one_host(steps: int, out: Path, timeout_s: float, name: str = "one_host") -> dict:
    """The workload on this host alone (a local Ray: no address, none inherited), and the efficiencies fitted on it
    (planner.fit): {'eff', 'phases', 'step_s', 'load_avg_1min', ...}."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | RAY_ENV
    t0, load0 = time.time(), os.getloadavg()[0]
    r = subprocess.run([sys.executable, "-m", "rlpost.cli", "train", *ARGS, f"run.steps={steps}", f"run.out_dir={out}",
                        f"run.name={name}"], env=env, capture_output=True, text=True, timeout=timeout_s)
    if r.returncode != 0:
        raise SystemExit(f"the one-host run failed:\n{r.stderr[-3000:]}")
    run = out / name
    fitted, measured = planner.fit(run, "cpu"), steady(run)
    return {**fitted, "eff_args": planner.eff_args(fitted["eff"]), "wall_s": time.time() - t0,
            "load_avg_1min": [load0, os.getloadavg()[0]], "step_s": measured["step"], "measured_s": measured}


def steady(run: Path) -> dict[str, float]:
    """Each timing_s/ metric of a run folder: its median over the steps after the first (or the only step)."""
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = lines[1:] or lines
    keys = {k for m in steps for k in m if k.startswith("timing_s/")}
    return {k.split("/", 1)[1]: statistics.median(m[k] for m in steps if k in m) for k in sorted(keys)}


def measure(gbps: float, steps: int, out: Path, timeout_s: float = 900, effs: dict | None = None) -> dict:
    """One run over a link capped at ``gbps``: the planner's prediction of it (at the table's efficiencies, and at
    each of ``effs``, {name: efficiencies fitted on one host}) and its steady figures (``steady``)."""
    run, load0 = out / f"g{gbps:g}", os.getloadavg()[0]
    with netns_cluster.two_hosts(cpus=2, store_mb=600, rate_mbit=gbps * 1000, env=RAY_ENV) as hosts:
        r = hosts.run(0, sys.executable, "-m", "rlpost.cli", "train", *ARGS, *TWO_HOSTS, f"run.steps={steps}",
                      f"run.out_dir={out}", f"run.name={run.name}", timeout=timeout_s)
    if r.returncode != 0:
        raise SystemExit(f"the run at {gbps:g} Gbit/s failed:\n{r.stderr[-3000:]}")
    placement = next((x.split("placement: ", 1)[1] for x in r.stderr.splitlines() if "placement: " in x), "")
    got = steady(run)
    cal = planner.calibrate(run, "cpu", 1, net=planner.Net(2, gbps))
    t, rows = cal["plan"]["time_s"], {x["name"]: x for x in cal["rows"]}
    sync_pred, sync = rows["timing_s/worker_weight_load"]["predicted"], got["worker_weight_load"]
    cals = {name: planner.calibrate(run, "cpu", 1, eff=eff, net=planner.Net(2, gbps))["plan"]["time_s"]
            for name, eff in (effs or {}).items()}
    return {"gbps": gbps, "placement": placement, "load_avg_1min": [load0, os.getloadavg()[0]],
            "sync_pred_s": sync_pred, "sync_s": sync, "step_pred_s": t["step"], "step_s": got["step"],
            "sync_ratio": sync / sync_pred, "step_ratio": got["step"] / t["step"],
            **{f"step_ratio_{name}": got["step"] / c["step"] for name, c in cals.items()},
            "measured_s": got, "predicted_s": t, **{f"predicted_{name}_s": c for name, c in cals.items()}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gbps", type=float, action="append", help="link rates, Gbit/s (default 1 and 10)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--timeout", type=float, default=900, help="seconds a run may take (a loaded machine: more)")
    p.add_argument("--keep", metavar="DIR", help="write the run folders here and keep them (default: a temporary "
                   "folder, removed), to calibrate against them again: rlpost plan --from DIR/g1 --nodes 2 "
                   "--net-gbps 1")
    p.add_argument("--no-one-host", action="store_true", help="skip the one-host runs: the table's efficiencies only")
    p.add_argument("--cpu", default="", help="the machine, in words, written to the results (e.g. 'Intel Xeon "
                   "AVX-512 + AMX, 2 cores')")
    a = p.parse_args()
    if why := netns_cluster.refused():
        print(f"multinode: cannot make network namespaces here: {why}", file=sys.stderr)
        return 2
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    bases, rows = [], []
    with tempfile.TemporaryDirectory(prefix="rlpmn") as tmp:
        out = Path(a.keep or tmp)
        for g in a.gbps or (1.0, 10.0):
            if not a.no_one_host:  # the machine is shared: its load drifts between runs minutes apart
                bases.append(one_host(a.steps, out, a.timeout, f"one_host_g{g:g}"))
                print(f"one host (before {g:g} Gbit/s): step {bases[-1]['step_s']:.3f} s, load avg "
                      f"{bases[-1]['load_avg_1min'][1]:.1f}; fitted {bases[-1]['eff_args']}", flush=True)
            effs = {"first": bases[0]["eff"], "paired": bases[-1]["eff"]} if bases else {}
            rows.append(measure(g, a.steps, out, a.timeout, effs))
    print(f"{'Gbit/s':>7}{'sync pred':>11}{'sync meas':>11}{'ratio':>7}{'step pred':>11}{'step meas':>11}{'ratio':>7}"
          f"{'cal. first':>12}{'paired':>8}{'load avg':>10}")
    for r in rows:
        print(f"{r['gbps']:>7g}{r['sync_pred_s']:>11.3f}{r['sync_s']:>11.3f}{r['sync_ratio']:>7.2f}"
              f"{r['step_pred_s']:>11.3f}{r['step_s']:>11.3f}{r['step_ratio']:>7.2f}"
              f"{r.get('step_ratio_first', math.nan):>12.2f}{r.get('step_ratio_paired', math.nan):>8.2f}"
              f"{r['load_avg_1min'][1]:>10.1f}")
    for r in rows:
        print(f"{r['gbps']:g} Gbit/s: {r['placement']}")
    (HERE / "results").mkdir(exist_ok=True)
    result = {"started": started, "cpu": a.cpu, "steps": a.steps, "one_host": bases, "two_hosts": rows}
    (HERE / "results" / "multinode.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
