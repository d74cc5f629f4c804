"""Every algorithm on the embedded demo, one after another, same task, seed and step budget.

    .venv/bin/python benchmarks/algorithms.py                      # 12 steps each, all recipes
    .venv/bin/python benchmarks/algorithms.py --steps 25 --only grpo ppo

Each run is the real CLI (`rlpost train recipes/<name>_arith.yaml run.steps=N`) in its own
process, so peak RSS is per algorithm. Prints a markdown table (held-out greedy accuracy before
and after, reward first/last, median step time, wall time, peak RSS) and writes it, with the raw
summaries, to benchmarks/results/algorithms.{md,json}. Runs are sequential: two at once on two
cores would halve every step time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ORDER = ["ppo", "dapo", "grpo", "rloo", "reinforce", "reinforce_pp", "dr_grpo", "gspo", "cispo"]


def recipe_args(name: str) -> list[str]:
    recipe = ROOT / "recipes" / f"{name}_arith.yaml"
    return [str(recipe)] if recipe.exists() else [f"algo.name={name}"]  # grpo is the default config


def run_one(name: str, steps: int, out_dir: Path, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "rlpost.cli", "train", *recipe_args(name), f"run.steps={steps}",
           "run.eval_every=0", "run.progress=false", f"run.out_dir={out_dir}", f"run.name={name}", *extra]
    print("+", " ".join(cmd[2:]), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)
    run = out_dir / name
    summary = json.loads((run / "summary.json").read_text())
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    summary["median_step_s"] = statistics.median(m["timing_s/step"] for m in lines)
    summary["median_update_s"] = statistics.median(m["timing_s/update"] for m in lines if "timing_s/update" in m)
    return summary


def table(results: dict[str, dict]) -> str:
    rows = ["| algorithm | held-out before | after | Δ points | reward first → last | median s/step | "
            "median update s | wall min | peak RSS GB |", "|---|---|---|---|---|---|---|---|---|"]
    for name, s in results.items():
        delta = 100 * (s["heldout_accuracy_after"] - s["heldout_accuracy_before"])
        rows.append(f"| `{name}` | {s['heldout_accuracy_before']:.3f} | {s['heldout_accuracy_after']:.3f} | "
                    f"{delta:+.1f} | {s['reward_mean_first']:.3f} → {s['reward_mean_last']:.3f} | "
                    f"{s['median_step_s']:.1f} | {s['median_update_s']:.1f} | {s['wall_minutes']:.1f} | "
                    f"{s['peak_rss_gb']:.1f} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--only", nargs="*", default=ORDER)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / f"bench-algorithms-{time.strftime('%Y%m%d-%H%M%S')}")
    ap.add_argument("extra", nargs="*", help="overrides passed to every run, e.g. run.eval_n=100")
    args = ap.parse_args()
    results = {}
    out = ROOT / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    for name in args.only:
        results[name] = run_one(name, args.steps, args.out, args.extra)
        (out / "algorithms.json").write_text(json.dumps(results, indent=1))  # partial results survive a crash
        (out / "algorithms.md").write_text(table(results) + "\n")
    print(table(results))


if __name__ == "__main__":
    main()
