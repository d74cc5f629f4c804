"""Step throughput of the three topologies on a long-tailed length distribution, and their learning.

    .venv/bin/python benchmarks/async_vs_sync.py              # colocated, disaggregated, async (max_staleness 1),
                                                              # 10 steps each
    .venv/bin/python benchmarks/async_vs_sync.py --steps 4
    .venv/bin/python benchmarks/async_vs_sync.py --long-tail  # colocated, async by chunk, + continuous batching,
                                                              # + partial rollouts (issue 52)

The embedded SmolLM2-135M-Instruct on arithmetic prompts of two kinds: three in four ask for the
number only (a few tokens), one in four asks it to think step by step first (often to the
128-token cap), so a synchronous step waits for its longest completions while the trainer idles,
and an async one trains on the previous batch meanwhile. 8 prompts x 4 completions per step,
T = 0.7, GRPO, lr 1e-5, bf16 autocast, micro-batch 8: the vs_trl configuration with a longer cap.
Every run is its own `rlpost train` process, one after the other, same seed.

Step time is the driver's wall time per step (``timing_s/step``: every phase the loop waits on),
median over steps 2.. (step 1 of an async run has nothing to overlap with). Writes
benchmarks/results/async_vs_sync.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOPOLOGIES = {
    "colocated": [],
    "disaggregated": ["dist.topology=disaggregated"],
    "async (max_staleness 1)": ["dist.topology=async", "dist.max_staleness=1"],
    # The trainer is the bottleneck here: give it both cores and the worker one (3 threads on 2 cores).
    "async, trainer 2 + rollout 1 threads": ["dist.topology=async", "dist.max_staleness=1", "dist.trainer_threads=2",
                                             "dist.rollout_threads=1"],
}
# --long-tail: where the straggler tax goes. One worker, one chunk a batch (dist.chunk_prompts=0), max_staleness 1:
# by chunk the worker holds the chunk's weights to its longest row; continuous batching refills freed decode slots
# (rollout.slots, 8 of the 32 rows); partial rollouts take new weights between decode steps.
ASYNC1 = ["dist.topology=async", "dist.max_staleness=1"]
LONG_TAIL = {  # the two the partial-rollout target compares first; results are written after every row
    "async by chunk": ASYNC1,
    "async + partial rollouts": [*ASYNC1, "dist.partial_rollouts=true"],
    "async + continuous batching": [*ASYNC1, "rollout.slots=8"],
    "colocated": [],
}
SHORT = "What is {expr}? Reply with only the number."
LONG = "What is {expr}? Think it through step by step in a few sentences, then give the number."


def write_rows(path: Path, n: int, seed: int) -> None:
    """Arithmetic rows; a quarter of them ask for reasoning, the rest for the number alone."""
    rng = random.Random(seed)
    with path.open("w") as f:
        for _ in range(n):
            a, b, op = rng.randint(2, 20), rng.randint(2, 20), rng.choice("+-*")
            a, b = (a, b) if op != "-" or a >= b else (b, a)
            expr = f"{a} {op} {b}"
            prompt = (LONG if rng.random() < 0.25 else SHORT).format(expr=expr)
            f.write(json.dumps({"prompt": prompt, "answer": str(eval(expr))}) + "\n")


def run(name: str, extra: list[str], steps: int, data: Path, out: Path) -> dict:
    run_dir = out / "".join(c if c.isalnum() else "_" for c in name)  # one folder a row
    cmd = [sys.executable, "-m", "rlpost.cli", "train", "task.name=dataset", f"task.data={data}",
           "task.verifier=rlpost.envs.arithmetic:score", "task.n_heldout=50", "rollout.prompts_per_step=8",
           # the held-out rows are the same templates with other numbers, which the n-gram check calls overlap:
           # this measures throughput, and its held-out accuracy is a sanity check, not a claim
           "task.max_contamination=1", "run.passk_eval=0",  # pass@k sampling would cost more than the steps
           "rollout.group_size=4", "rollout.max_new_tokens=128", "rollout.temperature=0.7", "trainer.lr=1e-5",
           "trainer.micro_batch_size=8", f"run.steps={steps}", "run.eval_every=0", "run.checkpoint_every=0",
           "run.progress=false", f"run.out_dir={out}", f"run.name={run_dir.name}", *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    tail = rows[1:] or rows
    med = lambda k: statistics.median(r[k] for r in tail if k in r) if any(k in r for r in tail) else None
    return {
        "name": name, "wall_s": time.perf_counter() - t0,
        "step_s": med("timing_s/step"), "gen_wait_s": med("timing_s/gen"), "update_s": med("timing_s/update"),
        "tokens_per_s": med("perf/throughput"), "trainer_idle": med("async/trainer_idle_frac"),
        "rollout_idle": med("async/rollout_idle_frac"), "staleness": med("async/staleness_mean"),
        "token_staleness": med("async/token_staleness_mean"), "inflight_loads": med("async/inflight_weight_loads"),
        "length_mean": statistics.mean(r["response_length/mean"] for r in rows),
        "length_max": statistics.mean(r["response_length/max"] for r in rows),
        "clip_ratio": statistics.mean(r["response_length/clip_ratio"] for r in rows),
        "rewards": [round(r["reward/mean"], 4) for r in rows],
        "before": summary["heldout_accuracy_before"], "after": summary["heldout_accuracy_after"],
    }


def table(results: list[dict]) -> str:
    base = results[0]["step_s"]
    fmt = lambda v, f="{:.2f}": "-" if v is None else f.format(v)
    out = [(f"| topology | median step (s) | vs {results[0]['name']} | gen wait (s) | update (s) | tokens/s | "
            "trainer idle | "
            "rollout idle | staleness | per-token staleness | reward mean | held-out before -> after |"),
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        out.append(f"| {r['name']} | {fmt(r['step_s'])} | {r['step_s'] / base:.2f}x | {fmt(r['gen_wait_s'])} | "
                   f"{fmt(r['update_s'])} | {fmt(r['tokens_per_s'], '{:.0f}')} | {fmt(r['trainer_idle'])} | "
                   f"{fmt(r['rollout_idle'])} | {fmt(r['staleness'])} | {fmt(r.get('token_staleness'))} | "
                   f"{statistics.mean(r['rewards']):.3f} | "
                   f"{r['before']:.2f} -> {r['after']:.2f} |")
    lengths = ", ".join(f"{r['name']}: mean {r['length_mean']:.0f} tokens, longest per step {r['length_max']:.0f} on "
                        f"average, {r['clip_ratio']:.0%} at the cap" for r in results)
    curves = "\n".join(f"- {r['name']}: {r['rewards']}" for r in results)
    return "\n".join(out) + f"\n\nCompletion lengths: {lengths}.\n\nReward per step:\n{curves}\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--only", default="",
                    help="run only the topologies whose name contains this; keep the others' last results")
    ap.add_argument("--long-tail", action="store_true",
                    help="the long-tail rows (LONG_TAIL), to results/async_vs_sync_long_tail.{json,md}")
    ap.add_argument("--note", default="", help="a line written above the table (the machine, its load)")
    args = ap.parse_args()
    rows, stem = (LONG_TAIL, "async_vs_sync_long_tail") if args.long_tail else (TOPOLOGIES, "async_vs_sync")
    out = Path(tempfile.mkdtemp(prefix="rlpost-topology-"))
    data = out / "rows.jsonl"
    write_rows(data, 2000, 0)
    res_dir = HERE / "results"
    last = {r["name"]: r for r in json.loads((res_dir / f"{stem}.json").read_text())} if args.only else {}
    results = []
    for name, extra in rows.items():
        if args.only and args.only not in name:
            results.append(last[name])
            continue
        print(f"{name} ...", flush=True)
        results.append(run(name, extra, args.steps, data, out))
        print(f"  median step {results[-1]['step_s']:.2f} s, wall {results[-1]['wall_s']:.0f} s", flush=True)
        # its RUN/model and checkpoints: GBs the tables do not need
        shutil.rmtree(out / "".join(c if c.isalnum() else "_" for c in name), ignore_errors=True)
        # after every row: a long run cut short keeps what it measured
        (res_dir / f"{stem}.json").write_text(json.dumps(results, indent=1))
        text = (f"{args.note}\n\n" if args.note else "") + table(results)
        (res_dir / f"{stem}.md").write_text(text)
    shutil.rmtree(out)
    print(text)


if __name__ == "__main__":
    main()
