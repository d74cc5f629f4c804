"""Learning parity of partial rollouts (issue 52): the demo's held-out accuracy after 25 steps, synchronous
against async + partial rollouts, on the same seeds.

    .venv/bin/python benchmarks/partial_parity.py                  # seeds 0 and 1, both arms, 25 steps
    .venv/bin/python benchmarks/partial_parity.py --seeds 0 --steps 5

Each run is `rlpost train recipes/grpo_arith.yaml run.seed=S` (what `make demo` runs) in its own process,
the arms alternating within a seed: `sync` as it is (colocated), `async + partial` with
`dist.topology=async dist.max_staleness=1 dist.partial_rollouts=true` (one rollout worker, which takes new
weights between two decode steps; every token records its policy version). The target: each async run's
held-out accuracy after within one standard error of the synchronous run of its seed, the standard error
of the synchronous run's accuracy over its 200 held-out problems, sqrt(p (1 - p) / 200); and the two seeds'
means, against the standard error of a mean of two runs.
Writes benchmarks/results/partial_parity.{json,md} after every run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RECIPE = HERE.parent / "recipes" / "grpo_arith.yaml"
ARMS = {
    "sync": [],
    "async + partial": ["dist.topology=async", "dist.max_staleness=1", "dist.partial_rollouts=true"],
}


def run(arm: str, seed: int, steps: int, out: Path) -> dict:
    """One `rlpost train` of the demo recipe; its summary's accuracies and its per-step metrics that tell the arms
    apart (staleness, weight versions per token)."""
    name = f"{arm.replace(' ', '').replace('+', '_')}_s{seed}"
    cmd = [sys.executable, "-m", "rlpost.cli", "train", str(RECIPE), *ARMS[arm], f"run.seed={seed}",
           f"run.steps={steps}", "run.progress=false", "run.passk_eval=0", f"run.out_dir={out}", f"run.name={name}"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{arm}, seed {seed} failed:\n{proc.stderr[-3000:]}")
    summary = json.loads((out / name / "summary.json").read_text())
    rows = [json.loads(x) for x in (out / name / "metrics.jsonl").read_text().splitlines()]
    mean = lambda k: sum(r[k] for r in rows if k in r) / max(1, sum(k in r for r in rows)) if any(
        k in r for r in rows) else None
    shutil.rmtree(out / name, ignore_errors=True)  # checkpoints and RUN/model: GBs the table does not need
    return {"arm": arm, "seed": seed, "steps": steps, "wall_s": round(time.perf_counter() - t0, 1),
            "before": summary["heldout_accuracy_before"], "after": summary["heldout_accuracy_after"],
            "delta_se": summary.get("heldout_delta_se"), "n": summary.get("heldout_n"),
            "reward_first": rows[0]["reward/mean"], "reward_last": rows[-1]["reward/mean"],
            "staleness_mean": mean("async/staleness_mean"), "token_staleness_mean": mean("async/token_staleness_mean"),
            "mixed_version_rows": mean("async/mixed_version_rows"),
            "inflight_loads": rows[-1].get("async/inflight_weight_loads"),
            "load": os.getloadavg()[0]}


def table(results: list[dict]) -> str:
    fmt = lambda v, f="{:.2f}": "-" if v is None else f.format(v)
    out = ["| seed | arm | held-out before -> after | paired s.e. | reward first -> last | staleness | "
           "per-token staleness | mixed-version rows | loads in flight | wall (s) | load |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        out.append(f"| {r['seed']} | {r['arm']} | {r['before']:.3f} -> {r['after']:.3f} | "
                   f"{fmt(r['delta_se'], '{:.3f}')} | {r['reward_first']:.3f} -> {r['reward_last']:.3f} | "
                   f"{fmt(r['staleness_mean'])} | "
                   f"{fmt(r['token_staleness_mean'])} | {fmt(r['mixed_version_rows'])} | "
                   f"{fmt(r['inflight_loads'], '{}')} | {r['wall_s']:.0f} | {r['load']:.1f} |")
    verdicts = []
    for seed in sorted({r["seed"] for r in results}):
        arms = {r["arm"]: r for r in results if r["seed"] == seed}
        if len(arms) == 2:
            s, a = arms["sync"], arms["async + partial"]
            se = math.sqrt(s["after"] * (1 - s["after"]) / (s["n"] or 200))  # the sync run's accuracy's own
            gap = a["after"] - s["after"]
            verdicts.append(f"- seed {seed}: async + partial {a['after']:.3f} against sync {s['after']:.3f}: "
                            f"{gap:+.3f} = {gap / se:+.2f} s.e. ({'within' if abs(gap) <= se else 'outside'} one "
                            f"standard error, {se:.3f})")
    syncs = [r for r in results if r["arm"] == "sync"]
    partial = [r for r in results if r["arm"] != "sync"]
    if len(syncs) > 1 and len(syncs) == len(partial):
        ms, mp = (sum(r["after"] for r in rs) / len(rs) for rs in (syncs, partial))
        se = math.sqrt(sum(r["after"] * (1 - r["after"]) / (r["n"] or 200) for r in syncs)) / len(syncs)
        verdicts.append(f"- mean of {len(syncs)} seeds: async + partial {mp:.3f} against sync {ms:.3f}: "
                        f"{mp - ms:+.3f} = {(mp - ms) / se:+.2f} s.e. of the mean ({se:.3f})")
    return "\n".join(out) + ("\n\n" + "\n".join(verdicts) if verdicts else "") + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1", help="comma-separated run.seed values (default 0,1)")
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--note", default="", help="a line written above the table (the machine, its load)")
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="rlpost-parity-"))
    results = []
    try:
        for seed in map(int, args.seeds.split(",")):
            for arm in ARMS if seed % 2 == 0 else reversed(ARMS):  # the order alternates with the seed
                print(f"{arm}, seed {seed} ...", flush=True)
                results.append(run(arm, seed, args.steps, out))
                print(f"  {results[-1]['before']:.3f} -> {results[-1]['after']:.3f} in {results[-1]['wall_s']:.0f} s",
                      flush=True)
                (HERE / "results" / "partial_parity.json").write_text(json.dumps(results, indent=1))
                text = (f"{args.note}\n\n" if args.note else "") + table(results)
                (HERE / "results" / "partial_parity.md").write_text(text)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    print(text)


if __name__ == "__main__":
    main()
