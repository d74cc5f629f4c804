"""Step throughput of the three topologies on a long-tailed length distribution, and their learning.

    .venv/bin/python benchmarks/async_vs_sync.py              # colocated, disaggregated, async (max_staleness 1),
                                                              # 10 steps each
    .venv/bin/python benchmarks/async_vs_sync.py --steps 4
    .venv/bin/python benchmarks/async_vs_sync.py --long-tail  # colocated, async by chunk, + continuous batching,
                                                              # + partial rollouts (issue 52)
    .venv/bin/python benchmarks/async_vs_sync.py --long-tail --sampling-bound --steps 6 --pairs 2 \
        --arms "async by chunk,async + partial rollouts"      # sampling the long phase, the arms alternating

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
# --sampling-bound: the long rows are long_tail.py's stories (they run to the cap), so sampling a batch costs its
# longest row's decode steps while the update costs its total tokens, most of them in a few rows
STORY = "Write a long, detailed story about {topic}, in many paragraphs. Then say what {expr} is."
TOPICS = ("a lighthouse keeper", "a lost robot", "two rival bakers", "a dragon who cannot fly")
# The sampling-bound configuration (issue 52's target): the worker must be mid-chunk when weights are published,
# so sampling, not the update, is the long phase: one prompt in eight a story to a 384-token cap, the trainer on two
# threads and the worker on one (a share of a loaded machine goes by threads), and a small held-out set (throughput,
# not accuracy; its greedy pass runs to the same cap)
SAMPLING_BOUND = ["rollout.max_new_tokens=384", "task.n_heldout=8", "dist.trainer_threads=2", "dist.rollout_threads=1"]


def write_rows(path: Path, n: int, seed: int, story: float = 0.0) -> None:
    """Arithmetic rows; a quarter of them ask for reasoning, the rest for the number alone. story > 0: that share
    asks for a long story first instead, and no row asks for reasoning."""
    rng = random.Random(seed)
    with path.open("w") as f:
        for _ in range(n):
            a, b, op = rng.randint(2, 20), rng.randint(2, 20), rng.choice("+-*")
            a, b = (a, b) if op != "-" or a >= b else (b, a)
            expr = f"{a} {op} {b}"
            if story:
                prompt = (STORY if rng.random() < story else SHORT).format(expr=expr, topic=rng.choice(TOPICS))
            else:
                prompt = (LONG if rng.random() < 0.25 else SHORT).format(expr=expr)
            f.write(json.dumps({"prompt": prompt, "answer": str(eval(expr))}) + "\n")


def run(name: str, extra: list[str], steps: int, data: Path, out: Path, base: list[str] = ()) -> dict:
    """One `rlpost train` process; base: overrides of the shared configuration (a key given again wins)."""
    run_dir = out / "".join(c if c.isalnum() else "_" for c in name)  # one folder a row
    shared = ["task.name=dataset", f"task.data={data}",
              "task.verifier=rlpost.envs.arithmetic:score", "task.n_heldout=50", "rollout.prompts_per_step=8",
              # the held-out rows are the same templates with other numbers, which the n-gram check calls overlap:
              # this measures throughput, and its held-out accuracy is a sanity check, not a claim
              "task.max_contamination=1", "run.passk_eval=0",  # pass@k sampling would cost more than the steps
              "rollout.group_size=4", "rollout.max_new_tokens=128", "rollout.temperature=0.7", "trainer.lr=1e-5",
              "trainer.micro_batch_size=8", f"run.steps={steps}", "run.eval_every=0", "run.checkpoint_every=0",
              "run.progress=false", f"run.out_dir={out}", f"run.name={run_dir.name}", *base, *extra]
    overrides = {kv.split("=", 1)[0]: kv for kv in shared}  # in order, the last of a key kept
    cmd = [sys.executable, "-m", "rlpost.cli", "train", *overrides.values()]
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
        "token_staleness": med("async/token_staleness_mean"),
        "inflight_loads": rows[-1].get("async/inflight_weight_loads"),  # a running count: the run's total
        "mixed_rows": med("async/mixed_version_rows"), "gen_tokens_per_s": med("perf/gen_tokens_per_s"),
        "load": load_average(),
        "length_mean": statistics.mean(r["response_length/mean"] for r in rows),
        "length_max": statistics.mean(r["response_length/max"] for r in rows),
        "clip_ratio": statistics.mean(r["response_length/clip_ratio"] for r in rows),
        "rewards": [round(r["reward/mean"], 4) for r in rows],
        "before": summary["heldout_accuracy_before"], "after": summary["heldout_accuracy_after"],
    }


def load_average() -> float | None:
    """The 1-minute load average now (None where /proc has none): how shared the machine was."""
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def table(results: list[dict]) -> str:
    base = results[0]
    fmt = lambda v, f="{:.2f}": "-" if v is None else f.format(v)
    out = [(f"| topology | median step (s) | tokens/s | vs {base['name']} | gen wait (s) | update (s) | trainer idle | "
            "rollout idle | staleness | per-token staleness | mixed-version rows | weight loads in flight | "
            "reward mean | held-out before -> after | load |"),
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        out.append(f"| {r['name']} | {fmt(r['step_s'])} | {fmt(r['tokens_per_s'], '{:.0f}')} | "
                   f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x | {fmt(r['gen_wait_s'])} | "
                   f"{fmt(r['update_s'])} | {fmt(r['trainer_idle'])} | "
                   f"{fmt(r['rollout_idle'])} | {fmt(r['staleness'])} | {fmt(r.get('token_staleness'))} | "
                   f"{fmt(r.get('mixed_rows'))} | {fmt(r.get('inflight_loads'), '{}')} | "
                   f"{statistics.mean(r['rewards']):.3f} | "
                   f"{r['before']:.2f} -> {r['after']:.2f} | {fmt(r.get('load'), '{:.1f}')} |")
    lengths = ", ".join(f"{r['name']}: mean {r['length_mean']:.0f} tokens, longest per step {r['length_max']:.0f} on "
                        f"average, {r['clip_ratio']:.0%} at the cap" for r in results)
    curves = "\n".join(f"- {r['name']}: {r['rewards']}" for r in results)
    return "\n".join(out) + f"\n\nCompletion lengths: {lengths}.\n\nReward per step:\n{curves}\n" + pairs(results)


def pairs(results: list[dict]) -> str:
    """--pairs: each round's tokens/s against its own first arm's (the arms of a round ran back to back)."""
    rounds: dict[str, list[dict]] = {}
    for r in results:
        rounds.setdefault(r["name"].partition(" #")[2] or "1", []).append(r)
    if len(rounds) < 2:
        return ""
    ratio = lambda r, rs: f"{r['name'].partition(' #')[0]} {r['tokens_per_s'] / rs[0]['tokens_per_s']:.2f}x"
    lines = [f"- round {k}: " + ", ".join(ratio(r, rs) for r in rs[1:]) for k, rs in rounds.items()]
    return "\nTokens/s against the round's first arm:\n" + "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--only", default="",
                    help="run only the topologies whose name contains this; keep the others' last results")
    ap.add_argument("--long-tail", action="store_true",
                    help="the long-tail rows (LONG_TAIL), to results/async_vs_sync_long_tail.{json,md}")
    ap.add_argument("--sampling-bound", action="store_true",
                    help="with --long-tail: the story mix at a 384-token cap (SAMPLING_BOUND), sampling the long phase")
    ap.add_argument("--arms", default="", help="comma-separated row names to run, in this order (default: all)")
    ap.add_argument("--pairs", type=int, default=1, help="run the arms this many rounds, alternating (#2, #3 ...)")
    ap.add_argument("--note", default="", help="a line written above the table (the machine, its load)")
    args = ap.parse_args()
    rows, stem = (LONG_TAIL, "async_vs_sync_long_tail") if args.long_tail else (TOPOLOGIES, "async_vs_sync")
    if args.arms:
        unknown = [a for a in args.arms.split(",") if a not in rows]
        if unknown:
            raise SystemExit(f"--arms: no row named {unknown[0]!r}; the rows are {', '.join(rows)}")
        rows = {a: rows[a] for a in args.arms.split(",")}
    base = SAMPLING_BOUND if args.sampling_bound else []
    out = Path(tempfile.mkdtemp(prefix="rlpost-topology-"))
    data = out / "rows.jsonl"
    write_rows(data, 2000, 0, story=0.125 if args.sampling_bound else 0.0)
    res_dir = HERE / "results"
    last = {r["name"]: r for r in json.loads((res_dir / f"{stem}.json").read_text())} if args.only else {}
    results = []
    for k in range(args.pairs):
        for arm, extra in rows.items():
            name = arm if args.pairs == 1 else f"{arm} #{k + 1}"
            if args.only and args.only not in name:
                results.append(last[name])
                continue
            print(f"{name} ...", flush=True)
            results.append(run(name, extra, args.steps, data, out, base))
            print(f"  median step {results[-1]['step_s']:.2f} s, {results[-1]['tokens_per_s']:.0f} tokens/s, "
                  f"wall {results[-1]['wall_s']:.0f} s", flush=True)
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
