"""Every algorithm on the embedded demo, one after another, same task, seed and step budget.

    .venv/bin/python benchmarks/algorithms.py                      # 12 steps each, all recipes
    .venv/bin/python benchmarks/algorithms.py --steps 25 --only grpo ppo

    .venv/bin/python benchmarks/algorithms.py --catalogue          # the method catalogue (issue 23)
    .venv/bin/python benchmarks/algorithms.py --catalogue --only grpo clip_cov

Each run is the real CLI (`rlpost train recipes/<name>_arith.yaml run.steps=N`) in its own
process, so peak RSS is per algorithm. ``--catalogue`` runs the CATALOGUE rows instead: GRPO on
the demo task with one method of the catalogue switched on per row (and rsft / dpo+RPO / distill
through their own commands), at a smaller budget (CATALOGUE_BASE) so the table fits in an hour;
rows are merged into benchmarks/results/catalogue.{md,json}, so they can be run a few at a time. Prints a markdown table
(held-out greedy accuracy before and after, reward first/last, median step time, wall time, peak RSS) and writes it,
with the raw summaries, to benchmarks/results/algorithms.{md,json}. Runs are sequential: two at once on two
cores would halve every step time.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ORDER = ["ppo", "dapo", "grpo", "rloo", "reinforce", "reinforce_pp", "dr_grpo", "gspo", "cispo"]


# The method catalogue (docs/algorithms.md): name -> (command, arguments). Every row starts from
# the embedded model on the demo task with CATALOGUE_BASE; "{out}" is this run's folder (distill's
# teacher is the table's own GRPO row, run first) and "{prm}" a PRM trained by benchmarks/search.py.
CATALOGUE_BASE = ["rollout.prompts_per_step=8", "run.eval_n=100"]
CATALOGUE = {
    "grpo": ("train", []),
    "clip_cov": ("train", ["algo.cov_control=clip_cov"]),
    "kl_cov": ("train", ["algo.cov_control=kl_cov"]),
    "entropy_adv": ("train", ["algo.entropy_adv_coef=0.4"]),
    "dual_clip": ("train", ["algo.dual_clip_c=3", "trainer.mini_batch_size=32"]),
    "cispo": ("train", ["algo.name=cispo"]),
    "kl_k3": ("train", ["algo.kl_coef=0.04"]),
    "top_p_mask": ("train", ["rollout.top_p=0.9"]),
    "batch_std": ("train", ["algo.std_scope=batch"]),
    "curriculum": ("train", ["rollout.curriculum_window=1", "task.n_train=24"]),
    "curriculum_off": ("train", ["task.n_train=24"]),  # the curriculum row's control: the same 24 prompts
    "early_stop": ("train", ["run.early_stop_patience=1", "run.eval_every=2"]),
    "prm": ("train", ["task.process_reward_model={prm}"]),
    "prm_ppo": ("train", ["algo.name=ppo", "task.process_reward_model={prm}"]),
    "mix": ("train", ["task.mix=arithmetic:0.5,math:0.5"]),
    "distill": ("train", ["algo.name=distill", "algo.teacher={out}/grpo"]),
    "rsft": ("rsft", ["pref.online_rounds=2", "pref.online_prompts=32"]),
    "dpo_rpo": ("dpo", ["pref.nll_coef=1.0", "pref.online_rounds=2", "pref.online_prompts=32"]),
}
PRM_ARGS = ["--train", "16", "--n", "4", "--m", "2", "--epochs", "2"]


def run_catalogue(name: str, steps: int, out_dir: Path, extra: list[str]) -> dict:
    """One CATALOGUE row through the real CLI; the RL rows report like ``run_one``, rsft and dpo
    their held-out accuracy before and after and their wall time."""
    command, args = CATALOGUE[name]
    prm = out_dir / "prm"
    if "{prm}" in " ".join(args) and not (prm / "value_head.safetensors").exists():
        subprocess.run([sys.executable, "benchmarks/search.py", *PRM_ARGS, "--save-prm", str(prm)], check=True,
                       cwd=ROOT)
    args = [a.format(out=out_dir, prm=prm) for a in args]
    if command == "train":
        return run_one(name, steps, out_dir, [*CATALOGUE_BASE, *args, *extra], recipe=False)
    cmd = [sys.executable, "-m", "rlpost.cli", command, *CATALOGUE_BASE, *args, f"run.out_dir={out_dir}",
           f"run.name={name}", "run.progress=false", *extra]
    print("+", " ".join(cmd[2:]), file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT)
    s = json.loads((out_dir / name / "summary.json").read_text())
    return {"heldout_accuracy_before": s["heldout_before"], "heldout_accuracy_after": s["heldout_after"],
            "wall_minutes": (time.perf_counter() - t0) / 60, "command": command}


def recipe_args(name: str) -> list[str]:
    recipe = ROOT / "recipes" / f"{name}_arith.yaml"
    return [str(recipe)] if recipe.exists() else [f"algo.name={name}"]  # grpo is the default config


def run_one(name: str, steps: int, out_dir: Path, extra: list[str], recipe: bool = True) -> dict:
    cmd = [sys.executable, "-m", "rlpost.cli", "train", *(recipe_args(name) if recipe else []), f"run.steps={steps}",
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
        if "command" in s:  # rsft / dpo: rounds of sampling and SFT or DPO, no RL steps
            rows.append(f"| `{name}` (rlpost {s['command']}) | {s['heldout_accuracy_before']:.3f} | "
                        f"{s['heldout_accuracy_after']:.3f} | {delta:+.1f} | – | – | – | "
                        f"{s['wall_minutes']:.1f} | – |")
            continue
        rows.append(f"| `{name}` | {s['heldout_accuracy_before']:.3f} | {s['heldout_accuracy_after']:.3f} | "
                    f"{delta:+.1f} | {s['reward_mean_first']:.3f} → {s['reward_mean_last']:.3f} | "
                    f"{s['median_step_s']:.1f} | {s['median_update_s']:.1f} | {s['wall_minutes']:.1f} | "
                    f"{s['peak_rss_gb']:.1f} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=None, help="RL steps per row (default: 12; 6 with --catalogue)")
    ap.add_argument("--only", nargs="*", default=None, help="rows to run (default: all of the table)")
    ap.add_argument("--catalogue", action="store_true",
                    help="the method catalogue's rows (CATALOGUE) instead of the algorithms")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / f"bench-algorithms-{time.strftime('%Y%m%d-%H%M%S')}")
    ap.add_argument("--keep-runs", action="store_true", help="keep each row's checkpoints and RUN/model "
                    "(about 2.2 GB a row; by default only the metrics, summary and report stay)")
    ap.add_argument("extra", nargs="*", help="overrides passed to every run, e.g. run.eval_n=100")
    args = ap.parse_args()
    out = ROOT / "benchmarks" / "results"
    out.mkdir(exist_ok=True)
    stem, rows, run = ("catalogue", CATALOGUE, run_catalogue) if args.catalogue else ("algorithms", ORDER, run_one)
    unknown = set(args.only or []) - set(rows)
    if unknown:
        ap.error(f"--only: not rows of this table: {', '.join(sorted(unknown))}")
    # the catalogue's rows merge into what earlier runs measured; the algorithms table is rewritten
    results = (json.loads((out / f"{stem}.json").read_text()) if args.catalogue and (out / f"{stem}.json").exists()
               else {})
    args.steps = args.steps or (6 if args.catalogue else 12)
    for name in args.only or rows:
        results[name] = run(name, args.steps, args.out, args.extra)
        if not args.keep_runs:  # the grpo row's model is distill's teacher ("{out}/grpo")
            shutil.rmtree(args.out / name / "checkpoints", ignore_errors=True)
            if name != "grpo":
                shutil.rmtree(args.out / name / "model", ignore_errors=True)
        results[name]["date"] = time.strftime("%Y-%m-%d")
        (out / f"{stem}.json").write_text(json.dumps(results, indent=1))  # partial results survive a crash
        (out / f"{stem}.md").write_text(table({k: results[k] for k in rows if k in results}) + "\n")
    print(table({k: results[k] for k in rows if k in results}))


if __name__ == "__main__":
    main()
