"""Continuous batching on a long-tailed batch: the own engine on the embedded model, tokens per second with a
KV budget of S rows. On the CPU the decode loop (roles/rollout_fast.py); with --device cuda its GPU path, the
static arena and captured decode steps (roles/rollout_static.py), in bf16.

    .venv/bin/python benchmarks/long_tail.py                # 3 reps, the arms alternating within each rep
    .venv/bin/python benchmarks/long_tail.py --reps 1 --long 64
    python benchmarks/long_tail.py --device cuda --long 256 --prompts 64 --slots 64   # the GPU row (docs/gpu.md)
    .venv/bin/python benchmarks/long_tail.py --engine static --reps 1 --long 8       # the GPU path's code, eager, here

The batch: --prompts (16) prompts x 4 samples at T = 0.7, <= --long new tokens. Three in four prompts are the demo's
arithmetic ("Reply with only the number": a few tokens), four ask for a long story (these rows run to
the cap), one in each run of four prompts, so a quarter of the rows are long and every wave of S (--slots, 16)
rows holds S / 16 of them per 4 prompts, as a random long tail would.

Arms (completion tokens up to EOS per second, median over reps):
  waves        the engine without refills, as a caller holding S rows of KV had to call it: S rows a
               call (4 groups), each call run to its longest row (slots = 0 on each wave)
  continuous   the whole batch in one call on S slots, a finished row's slot refilled (slots = S)
  all_at_once  the whole batch in one call, one slot per row (slots = 0): S = 64 rows of KV
  before       the engine as it was before continuous batching (git show BASELINE:roles/rollout_fast.py),
               all at once, when this checkout has git history: a check that slots = 0 did not slow down
Writes results/long_tail-<isa>.md and .json (with --engine static or --device cuda,
results/long_tail-<engine>-<device>-<isa>.*).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import machine
import torch

from rlpost.model.load import load_policy
from rlpost.roles.rollout_fast import FastRollout
from rlpost.roles.rollout_static import StaticRollout

HERE = Path(__file__).resolve().parent
BASELINE = "9e7120c"  # the last commit before continuous batching
GROUP, TEMPERATURE = 4, 0.7
STORIES = ("a lighthouse keeper", "a lost robot", "two rival bakers", "a dragon who cannot fly")


def rows(prompts: int = 16) -> list[dict]:
    out = []
    for i in range(prompts):
        if i % 4 == 1:
            text = f"Write a long, detailed story about {STORIES[i // 4 % len(STORIES)]}. Use many paragraphs."
        else:
            a, b = 3 + 7 * i % 17, 2 + 5 * i % 13
            text = f"What is {a} + {b}? Reply with only the number."
        out.append({"messages": [{"role": "user", "content": text}]})
    return out


def before_engine():
    """The pre-continuous-batching FastRollout class from git, or None (no git history here)."""
    try:
        src = subprocess.run(["git", "show", f"{BASELINE}:src/rlpost/roles/rollout_fast.py"], cwd=HERE,
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        print(f"long_tail: no git history with {BASELINE}: the 'before' arm is skipped", file=sys.stderr)
        return None
    path = Path(tempfile.mkdtemp()) / "rollout_fast_before.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("rollout_fast_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FastRollout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--long", type=int, default=128, help="max new tokens (the long rows' length)")
    ap.add_argument("--prompts", type=int, default=16, help="prompts (x 4 samples), a multiple of --slots / 4")
    ap.add_argument("--slots", type=int, default=16, help="S: rows of KV for waves and continuous, a multiple of 4")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--engine", choices=("fast", "static"), help="default: fast on the CPU, static on cuda")
    args = ap.parse_args()
    on_cuda = args.device.startswith("cuda")
    per, engine = args.slots // GROUP, args.engine or ("static" if on_cuda else "fast")
    if args.slots % GROUP or args.prompts % per:
        sys.exit(f"long_tail: --slots must be a multiple of {GROUP} and --prompts of --slots / {GROUP}")
    header = machine.Header()
    loaded = load_policy("embedded")
    batch = rows(args.prompts)
    model = copy.deepcopy(loaded.model).to(args.device)
    dtype = torch.bfloat16 if on_cuda else None  # None: the probe's choice, as a run on this CPU makes it
    fast = (StaticRollout if engine == "static" else FastRollout)(model, loaded.tokenizer, dtype=dtype)
    old_cls = before_engine() if engine == "fast" and not on_cuda else None
    old = old_cls(copy.deepcopy(loaded.model), loaded.tokenizer) if old_cls else None

    def call(engine, prompts, slots):
        engine.slots = slots
        b = engine.generate(prompts, GROUP, TEMPERATURE, 1.0, args.long)
        if on_cuda:
            torch.cuda.synchronize()
        return b.completion_mask.sum(1).tolist(), engine.last_metrics.get("rollout/decode_steps", 0)

    def arm(name):
        if name == "waves":
            parts = [call(fast, batch[i : i + per], 0) for i in range(0, args.prompts, per)]
            return [n for p in parts for n in p[0]], sum(p[1] for p in parts)
        if name == "continuous":
            return call(fast, batch, args.slots)
        if name == "all_at_once":
            return call(fast, batch, 0)
        return call(old, batch, 0)

    names = ["waves", "continuous", "all_at_once"] + (["before"] if old else [])
    results, lengths, steps = {n: [] for n in names}, {}, {}
    for rep in range(args.reps + 1):  # rep 0 warms up (oneDNN packing, first allocations)
        for name in names:
            torch.manual_seed(rep)
            t = time.perf_counter()
            lengths[name], steps[name] = arm(name)
            if rep:
                results[name].append(sum(lengths[name]) / (time.perf_counter() - t))
        print(f"rep {rep} done", flush=True)
    med = {n: statistics.median(v) for n, v in results.items()}
    last = lengths["continuous"]
    lines = [f"{args.reps} reps, {engine} engine on {args.device}, {args.prompts} prompts x {GROUP} samples, "
             f"T = {TEMPERATURE}, <= {args.long} new tokens, S = {args.slots} slots of KV for waves and continuous; "
             "completion tokens (up to EOS) per second, median. "
             f"Last rep's lengths: {sum(n >= args.long for n in last)} of {len(last)} rows at the cap, median "
             f"{statistics.median(last):.0f}, {sum(last)} tokens.", "",
             "| arm | tok/s | vs waves | decode steps (last rep) |", "|---|---|---|---|"]
    lines += [f"| {n} | {med[n]:.0f} | {med[n] / med['waves']:.2f} | {steps[n] or '-'} |" for n in names]
    text = "\n".join(lines) + "\n"
    print(text)
    name = "long_tail" if engine == "fast" and not on_cuda else f"long_tail-{engine}-{args.device}"
    machine.write_results(name, {"tok_s": results, "median": med, "lengths": lengths, "steps": steps,
                                        "reps": args.reps, "long": args.long, "prompts": args.prompts,
                                        "slots": args.slots, "engine": engine, "device": args.device}, header, text)


if __name__ == "__main__":
    main()
