"""The rollout engines on CPU, start-up included, in one invocation: rollout.engine=vllm against
auto (rlpost's own decode loop here) and hf (transformers `generate`).

Two configurations, each row one `rlpost train` process, the engines alternating within each:
- demo: the defaults (16 prompts x 8 samples, at most 16 new tokens, 25 steps, 200 held-out
  problems before and after): the held-out gain per engine;
- vs_trl: vs_trl.py's shape (8 prompts x 4 samples, at most 64 new tokens, T = 0.7, lr 1e-5),
  6 steps, 16 held-out problems.

Per row: wall time of the whole process (Python and torch start-up, model load, vLLM's engine
start, both evaluations), median step, generation and update seconds over steps 2..N, generated
tokens per second, held-out accuracy before and after. The vllm rows run in .venv-vllm (`make
test-vllm` builds it, scripts/setup_vllm.sh), the others in .venv; every run folder is deleted
after it is read. Results: results/engines-<isa>.md and .json.

    .venv/bin/python benchmarks/engines.py                        # both configurations, 3 engines
    .venv/bin/python benchmarks/engines.py --configs vs_trl --engines vllm auto
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import machine  # benchmarks/machine.py: where the figures came from

ROOT = Path(__file__).resolve().parents[1]
PYTHON = {"vllm": ROOT / ".venv-vllm" / "bin" / "python"}  # the others: this interpreter
CONFIGS = {
    "demo": ["run.steps={steps}"],
    "vs_trl": ["rollout.prompts_per_step=8", "rollout.group_size=4", "rollout.max_new_tokens=64",
               "rollout.temperature=0.7", "trainer.lr=1e-5", "task.n_heldout=16", "run.steps={steps}",
               "trainer.micro_batch_size=8"],
}
STEPS = {"demo": 25, "vs_trl": 6}


def run(config: str, engine: str, steps: int) -> dict:
    out = Path(tempfile.mkdtemp(prefix="rlpost-engines-"))
    args = [a.format(steps=steps) for a in CONFIGS[config]]
    cmd = [str(PYTHON.get(engine, sys.executable)), "-m", "rlpost.cli", "train", f"rollout.engine={engine}", *args,
           "run.eval_every=0", "run.checkpoint_every=0", "run.progress=false", f"run.out_dir={out}", "run.name=r"]
    print("+", config, engine, " ".join(cmd[4:]), file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"{config}/{engine} failed:\n{proc.stderr[-3000:]}")
    steps_m = [json.loads(line) for line in (out / "r" / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((out / "r" / "summary.json").read_text())
    shutil.rmtree(out)
    later = steps_m[1:] or steps_m
    med = lambda k: statistics.median(m[k] for m in later)  # noqa: E731
    return {"config": config, "engine": engine, "steps": steps, "wall_s": wall, "step_s": med("timing_s/step"),
            "gen_s": med("timing_s/gen"), "update_s": med("timing_s/update"), "gen_tok_s": med("perf/gen_tokens_per_s"),
            "before": summary["heldout_accuracy_before"], "after": summary["heldout_accuracy_after"],
            "heldout_n": summary["heldout_n"], "logp_diff_sampler_mean": med("actor/logp_diff_sampler_mean")}


def table(rows: list[dict]) -> str:
    out = [("| configuration | engine | wall s (all) | median step s | gen s | update s | gen tok/s | "
            "held-out before → after | Δ points | sampler-trainer mean abs logp diff |"),
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['config']} ({r['steps']} steps) | `{r['engine']}` | {r['wall_s']:.0f} | {r['step_s']:.1f} | "
                   f"{r['gen_s']:.1f} | {r['update_s']:.1f} | {r['gen_tok_s']:.0f} | {r['before']:.3f} → "
                   f"{r['after']:.3f} (n={r['heldout_n']}) | {100 * (r['after'] - r['before']):+.1f} | "
                   f"{r['logp_diff_sampler_mean']:.1e} |")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--engines", nargs="*", default=["vllm", "auto", "hf"], choices=["vllm", "auto", "hf", "fast"])
    ap.add_argument("--demo-steps", type=int, default=STEPS["demo"])
    ap.add_argument("--trl-steps", type=int, default=STEPS["vs_trl"])
    args = ap.parse_args()
    if "vllm" in args.engines and not PYTHON["vllm"].exists():
        ap.error(f"{PYTHON['vllm']} does not exist: build it with `make test-vllm` (or bash scripts/setup_vllm.sh)")
    header = machine.Header()
    rows = []
    for config in args.configs:
        for engine in args.engines:
            rows.append(run(config, engine, args.demo_steps if config == "demo" else args.trl_steps))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    text = table(rows)
    machine.write_results("engines", rows, header, text)
    print(text)


if __name__ == "__main__":
    main()
