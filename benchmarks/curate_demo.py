"""Does training on `rlpost curate`'s output reach the uncurated run's final held-out accuracy in fewer steps?

    .venv/bin/python benchmarks/curate_demo.py [--seeds 1,2] [--steps 25] [--eval-every 5] [--k 8] [--rows 0]
        [--eval-n 0] [--ablations] [--jobs 1] [--threads 0] [--out /tmp/curate_demo]

The demo task written out as data (its 4000 generated training rows, repeats included, and its 200
held-out rows, as `prompt` / `answer` JSONL, scored by the demo's verifier `rlpost.envs.arithmetic:score`),
then `rlpost curate` on the training rows (the first --rows of them when set) with the base model (--k samples
a prompt, band 0.1-0.9, the held-out rows kept out), then for each seed one GRPO run of the demo's settings on
each file: the uncurated arm on all 4000 rows, the curated arm on curate's output; held-out accuracy every
--eval-every steps (on the first --eval-n held-out rows when set). Per seed: the uncurated run's final accuracy
(the target), the first evaluated step at which each run reached it, and their ratio. Writes
results/curate_demo.{json,md}.

--ablations adds two arms built from curate's per-row pass rates (OUT/curated/rows.jsonl), to tell its two
filters apart: `band-repeats`, the training rows whose prompt is in the band, repeats kept (the band alone), and
`dedup-only`, each distinct prompt once, every pass rate kept (deduplication alone).

--jobs 2 runs up to two processes at once (the uncurated arms need no curation, so they start beside it);
--threads sets each run's torch threads. Each training run takes the demo's ~7 min on 2 idle cores of the
AVX-512 kind; curate samples every distinct prompt --k times (710 of them in the 4000 rows).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = ["task.name=dataset", "task.verifier=rlpost.envs.arithmetic:score", "rollout.max_new_tokens=16"]


def rlpost(log: Path, *args: str) -> subprocess.Popen:
    """One rlpost command in the background, its output in `log`."""
    with open(log, "w") as f:
        return subprocess.Popen([sys.executable, "-m", "rlpost.cli", *args], stdout=f, stderr=subprocess.STDOUT)


def curve(run: Path) -> list[tuple[int, float]]:
    """Held-out accuracy by step: the run's evaluations (metrics.jsonl), and its last step's, which the run
    measures on RUN/model at its end and keeps in summary.json (heldout_accuracy_after), not in metrics.jsonl."""
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    points = [(x["step"], x["eval/heldout_accuracy"]) for x in lines if "eval/heldout_accuracy" in x]
    summary = json.loads((run / "summary.json").read_text())
    if summary.get("heldout_accuracy_after") is not None and (not points or points[-1][0] < summary["steps"]):
        points.append((summary["steps"], summary["heldout_accuracy_after"]))
    return points


def reached(points: list[tuple[int, float]], target: float) -> int | None:
    """The first evaluated step whose accuracy is at least `target` (None: never)."""
    return next((s for s, acc in points if acc >= target), None)


def verdict(seeds: dict, arm: str = "curated") -> dict:
    """Per seed the uncurated arm's steps to its own final accuracy over `arm`'s (curated >= 1.3: the done-when)."""
    out = {}
    for seed, r in seeds.items():
        u, c = r["steps_to_target"]["uncurated"], r["steps_to_target"][arm]
        out[seed] = None if not c or u is None else round(u / c, 3)
    return out


def ablation_data(out: Path, train: Path) -> dict[str, Path]:
    """The two ablation arms' training files, from curate's per-row pass rates (a repeat's is its first row's)."""
    rows = [json.loads(x) for x in train.read_text().splitlines()]
    rates: dict[str, float] = {}
    for row, info in zip(rows, (json.loads(x) for x in (out / "curated" / "rows.jsonl").read_text().splitlines())):
        if info.get("pass_rate") is not None:
            rates.setdefault(row["prompt"], info["pass_rate"])
    lo, hi = json.loads((out / "curated" / "report.json").read_text())["keep"]
    seen: set[str] = set()
    arms = {"band-repeats": [r for r in rows if lo <= rates[r["prompt"]] <= hi],
            "dedup-only": [r for r in rows if not (r["prompt"] in seen or seen.add(r["prompt"]))]}
    paths = {}
    for arm, kept in arms.items():
        paths[arm] = out / f"{arm}.jsonl"
        paths[arm].write_text("".join(json.dumps(r) + "\n" for r in kept))
    return paths


def write_data(out: Path, rows_cap: int) -> tuple[Path, Path, Path]:
    from rlpost import config
    from rlpost.envs import arithmetic

    train, heldout = arithmetic.build_splits(config.load(None, []).task)
    paths = (out / "arith_train.jsonl", out / "arith_heldout.jsonl", out / "arith_curate_in.jsonl")
    for path, rows in zip(paths, (train, heldout, train[:rows_cap] if rows_cap else train)):
        path.write_text("".join(json.dumps({"prompt": r["messages"][-1]["content"], "answer": r["answer"]}) + "\n"
                                for r in rows))
    return paths


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--eval-n", type=int, default=0, help="held-out rows evaluated (0 = all 200)")
    p.add_argument("--k", type=int, default=8, help="curate's samples a prompt")
    p.add_argument("--rows", type=int, default=0, help="curate the first ROWS training rows (0 = all 4000)")
    p.add_argument("--ablations", action="store_true", help="also the band alone and deduplication alone")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out", default="/tmp/curate_demo")
    args = p.parse_args()
    out = Path(args.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    started = time.time()
    train, heldout, curate_in = write_data(out, args.rows)
    curated = out / "curated"
    common = [*DATA, f"task.eval_data={heldout}", f"run.steps={args.steps}", f"run.eval_every={args.eval_every}",
              f"run.eval_n={args.eval_n}", "run.passk_eval=0", f"run.threads={args.threads}", "run.progress=false",
              "run.checkpoint_every=0", f"run.out_dir={out / 'runs'}"]
    queue = [("curate", None)] if not (curated / "report.json").exists() else []
    seeds = args.seeds.split(",")
    arms = ["uncurated", "curated"] + (["band-repeats", "dedup-only"] if args.ablations else [])
    queue += [(arm, s) for arm in arms for s in seeds]
    ablations: dict[str, Path] = {}
    running: dict[str, subprocess.Popen] = {}
    clock: dict[str, float] = {}
    while queue or running:
        for name, proc in list(running.items()):
            if proc.poll() is not None:
                del running[name]
                clock[name] = time.time() - clock[name]
                if proc.returncode:
                    for other in running.values():  # stop the others before giving up
                        other.terminate()
                        other.wait()
                    sys.exit(f"{name}: exit {proc.returncode} (log: {out / 'logs' / name}.log)")
                print(f"{name}: done in {clock[name] / 60:.1f} min", flush=True)
        ready = [q for q in queue if q[0] == "uncurated" or "curate" not in running and "curate" not in dict(queue)]
        while ready and len(running) < args.jobs:
            kind, seed = ready.pop(0)
            queue.remove((kind, seed))
            name = kind if seed is None else f"{kind}-{seed}"
            if kind == "curate":
                cmd = ["curate", str(curate_in), "--heldout", str(heldout), "--out", str(curated), f"--k={args.k}",
                       *DATA, f"run.threads={args.threads}", "run.progress=false"]
            elif (out / "runs" / name / "summary.json").exists():
                continue
            else:
                if kind in ("band-repeats", "dedup-only") and not ablations:
                    ablations = ablation_data(out, curate_in)
                data = {"uncurated": train, "curated": curated / curate_in.name, **ablations}[kind]
                cmd = ["train", *common, f"task.data={data}", f"run.seed={seed}", f"run.name={name}"]
            print(f"{name}: started", flush=True)
            running[name], clock[name] = rlpost(out / "logs" / f"{name}.log", *cmd), time.time()
        time.sleep(5)
    result = {"command": " ".join(sys.argv[1:]), "date": time.strftime("%Y-%m-%d", time.gmtime()),
              "cpu": platform.processor() or platform.machine(), "minutes": round((time.time() - started) / 60, 1),
              "load_average_at_end": [round(x, 1) for x in os.getloadavg()],
              "process_minutes": {k: round(v / 60, 1) for k, v in clock.items()},
              "curate": json.loads((curated / "report.json").read_text()), "seeds": {}}
    for seed in seeds:
        runs = {kind: curve(out / "runs" / f"{kind}-{seed}") for kind in arms}
        target = runs["uncurated"][-1][1]
        result["seeds"][seed] = {"target": target, "steps_to_target": {k: reached(c, target) for k, c in runs.items()},
                                 "final": {k: c[-1][1] for k, c in runs.items()}, "curves": runs}
    result["speedup"] = verdict(result["seeds"])
    result["speedup_by_arm"] = {arm: verdict(result["seeds"], arm) for arm in arms[1:]}
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "curate_demo.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = ["| seed | arm | final held-out accuracy | first step at the target | speed-up vs uncurated |",
             "|---|---|---|---|---|"]
    for seed, r in result["seeds"].items():
        lines.append(f"| {seed} | uncurated (target {r['target']:.3f}) | {r['target']:.3f} | "
                     f"{r['steps_to_target']['uncurated']} | 1 |")
        lines += [f"| {seed} | {arm} | {r['final'][arm]:.3f} | {r['steps_to_target'][arm] or 'never'} | "
                  f"{result['speedup_by_arm'][arm][seed] or '-'} |" for arm in arms[1:]]
    (HERE / "results" / "curate_demo.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
