"""What one prefill and one decode step of rlpost's own rollout loop cost, by batch rows: the figures
behind the planner's `gen` phase (observe/planner.py, docs/planner.md).

    .venv/bin/python benchmarks/decode_cost.py            # rows 8, 32, 128 (groups of 8), 32 new tokens, ~2 min on AVX2

The embedded model, the demo's prompts, the sampler dtype rlpost's probe picks on this machine, and
EOS switched off so every row decodes every step (the planner's live rows are then all rows; how
many leave early is a property of the run, which ``rlpost plan --from`` reads). Per batch size, alternating, `--reps` times:
  prefill  = time to the first token (max_new_tokens=1): each prompt once, its KV copied to its rows;
  step     = (time for `--new` tokens - prefill) / (`--new` - 1).
A line t_step = overhead + rows x per_row is fitted by least squares; per_row against the FLOPs of
one row's step gives the matmul efficiency, the overhead is what a step costs with no rows at all
(about 20 small ops per layer, whatever the batch). Beside each: the planner's prediction.
Writes benchmarks/results/decode_cost-<isa>.{json,md}.
"""

from __future__ import annotations

import argparse
import statistics
import time

import machine  # benchmarks/machine.py: where the figures came from
import torch

from rlpost import config
from rlpost.envs import build_task
from rlpost.model import precision
from rlpost.model.load import load_policy
from rlpost.observe import planner
from rlpost.roles.rollout_fast import FastRollout

GROUP = 8


def timed(fast: FastRollout, enc, n: int, new: int) -> float:
    t = time.perf_counter()
    fast._sample(enc.input_ids, enc.attention_mask, n, 0.7, 1.0, new)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[8, 32, 128], help="batch rows, multiples of 8")
    ap.add_argument("--new", type=int, default=32, help="new tokens per row")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    header = machine.Header()
    choice = precision.choose()
    dtype = torch.bfloat16 if choice.bf16 else torch.float32
    loaded = load_policy("embedded")
    fast = FastRollout(loaded.model, loaded.tokenizer, dtype)
    fast.hf.eos_ids = torch.tensor([-1])  # no token ends a row: every row decodes every step
    prompts = build_task(config.load(None, [])).train
    encs = {b: fast.hf.encode(prompts[: b // GROUP]) for b in a.rows}
    timed(fast, encs[a.rows[0]], GROUP, 4)  # packs the weights, warms the allocator
    pre, full = {b: [] for b in a.rows}, {b: [] for b in a.rows}
    for rep in range(a.reps):
        for b in a.rows if rep % 2 == 0 else reversed(a.rows):
            pre[b].append(timed(fast, encs[b], GROUP, 1))
            full[b].append(timed(fast, encs[b], GROUP, a.new))
        print(f"rep {rep + 1}/{a.reps} done", flush=True)

    dev = planner.probed_cpu()
    shape = planner.resolve_model("embedded")
    prompt_len = statistics.mean(int(m.sum()) for b in a.rows for m in encs[b].attention_mask)
    rows = []
    for b in a.rows:
        p, f = statistics.median(pre[b]), statistics.median(full[b])
        w = planner.Workload(prompts=b // GROUP, group=GROUP, prompt_len=encs[b].input_ids.shape[1], new_tokens=a.new,
                             sampler_bf16=choice.bf16, trainer_bf16=choice.bf16)
        parts = planner.rollout_parts(shape, w, dev)
        rows.append({"rows": b, "prompt_len": encs[b].input_ids.shape[1], "prefill_s": p, "step_s": (f - p) / (a.new - 1),
                     "plan_prefill_s": parts["prefill"], "plan_step_s": parts["step"],
                     "step_gflop": parts["step_flops"] / 1e9, "gen_s": f, "plan_gen_s": parts["total"]})
    xs, ys = [r["rows"] for r in rows], [r["step_s"] for r in rows]
    slope, overhead = statistics.linear_regression(xs, ys)
    row_flops = statistics.mean(r["step_gflop"] / r["rows"] for r in rows) * 1e9
    peak = dev.bf16_flops if choice.bf16 else dev.fp32_flops
    fit = {"overhead_s": overhead, "per_row_s": slope, "row_gflop": row_flops / 1e9,
           "efficiency": row_flops / slope / peak, "overhead_per_layer_s": overhead / shape.layers,
           "peak_gflops": peak / 1e9, "mean_prompt_tokens": prompt_len}

    lines = [f"Embedded model, {'bf16' if choice.bf16 else 'float32'} sampler, groups of {GROUP}, {a.new} new tokens "
             f"(EOS off), median of {a.reps} reps; (planner) beside each figure.", "",
             "| rows | prompt tokens (padded) | prefill s | decode step ms | GFLOP per step | effective GFLOP/s |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['rows']} | {r['prompt_len']} | {r['prefill_s']:.3f} ({r['plan_prefill_s']:.3f}) | "
              f"{1e3 * r['step_s']:.1f} ({1e3 * r['plan_step_s']:.1f}) | {r['step_gflop']:.1f} | "
              f"{r['step_gflop'] / r['step_s']:.0f} |" for r in rows]
    lines += ["", f"Fit, decode step = overhead + rows x per-row: overhead {1e3 * overhead:.1f} ms "
              f"({1e3 * fit['overhead_per_layer_s']:.2f} ms per layer), per row {1e3 * slope:.2f} ms for "
              f"{row_flops / 1e9:.3f} GFLOP: {fit['efficiency']:.2f} of the probed peak {peak / 1e9:.0f} GFLOP/s."]
    text = "\n".join(lines) + "\n"
    print(header.render() + text)
    machine.write_results("decode_cost", {"rows": rows, "fit": fit, "new": a.new, "reps": a.reps,
                                          "pre": pre, "full": full}, header, text)


if __name__ == "__main__":
    main()
