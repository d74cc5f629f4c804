"""What one prefill and one decode step of rlpost's own rollout loop cost, by batch rows: the figures
behind the planner's `gen` phase (observe/planner.py, docs/planner.md).

    .venv/bin/python benchmarks/decode_cost.py            # rows 8, 32, 128 (groups of 8), 32 new tokens, ~2 min on AVX2
    .venv/bin/python benchmarks/decode_cost.py --context 190 382 1150   # attention alone by context, 16 rows, ~10 s

The embedded model, the demo's prompts, the sampler dtype rlpost's probe picks on this machine, and
EOS switched off so every row decodes every step (the planner's live rows are then all rows; how
many leave early is a property of the run, which ``rlpost plan --from`` reads). Per batch size, alternating, `--reps`
times:
  prefill  = time to the first token (max_new_tokens=1): each prompt once, its KV copied to its rows;
  step     = (time for `--new` tokens - prefill) / (`--new` - 1).
A line t_step = overhead + rows x per_row is fitted by least squares; per_row against the FLOPs of
one row's step gives the matmul efficiency, the overhead is what a step costs with no rows at all.
Beside each: the planner's prediction.

What the step is made of, timed directly (the profiler inflates small ops several times), each
part on its own with the loop's own weights and code at the same rows:
  matmuls   = every linear of one step in the loop's order (each layer's q/k/v, o, gate/up, down,
              then the lm_head), oneDNN-packed as the loop runs them: the model's weights stream
              from memory once per step, as in the loop;
  attention = `attend_step` in every layer, at the mean context of the run (prompt + new / 2);
  sampling  = `draw_tokens` on (rows, vocab) logits: log-softmax, exp, cumulative sum, search;
  the rest  = step - those three: norms, RoPE, KV cache writes, residual adds, SiLU, embedding,
              Python.
Each part gets its own line against rows, so the overhead splits into its causes.
Writes benchmarks/results/decode_cost-<isa>.{json,md}. With ``--context``, only the attention part,
at ``--attention-rows`` rows over each context length (what scaling.py's long completions pay per
step beyond the weights), against the bytes of K and V it reads; writes decode_attention-<isa>.
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
    fast._sample((enc.input_ids, enc.attention_mask), n, 0.7, 1.0, new)
    return time.perf_counter() - t


@torch.no_grad()
def parts(fast: FastRollout, rows: int, ctx: int) -> dict[str, float]:
    """Seconds per decode step in the matmuls, the attention and the sampling, at ``rows`` rows and
    context ``ctx``: each part run alone on random inputs of the loop's shapes and dtype."""
    hidden, inter = fast.layers[0].o.weight.shape[0], fast.layers[0].down.weight.shape[1]
    x, xi = torch.randn(rows, 1, hidden, dtype=fast.dtype), torch.randn(rows, 1, inter, dtype=fast.dtype)

    def matmuls():
        for L in fast.layers:
            L.qkv(x), L.o(x), L.gate_up(x), L.down(xi)
        fast.lm_head(x)

    logits = torch.randn(rows, fast.lm_head.weight.shape[0])
    return {"matmul_s": machine.median_s(matmuls), "attention_s": attention_s(fast, rows, ctx),
            "sampling_s": machine.median_s(lambda: fast.draw_tokens(logits, 0.7, 1.0))}


def attention_s(fast: FastRollout, rows: int, ctx: int) -> float:
    """Seconds per decode step in `attend_step`, every layer, at ``rows`` rows over ``ctx`` cached tokens."""
    q = torch.randn(rows, fast.nh, fast.hd, dtype=fast.dtype)
    kt = torch.randn(rows, fast.nkv, fast.hd, ctx, dtype=fast.dtype)
    v = torch.randn(rows, fast.nkv, ctx, fast.hd, dtype=fast.dtype)
    kmask = torch.zeros(rows, 1, 1, ctx)  # a decode step's additive mask (FastRollout.attend_step): every slot seen

    def attention():
        for _ in fast.layers:
            fast.attend_step(q, kt, v, kmask)

    return machine.median_s(attention)


def attention_by_context(fast: FastRollout, rows: int, contexts: list[int], header) -> None:
    """A decode step's attention in every layer at each context length, and the K/V bytes it reads."""
    lines = [(f"`attend_step` in all {len(fast.layers)} layers at {rows} rows, {fast.dtype}, median of 5 after "
              "a warm-up:"), "",
             "| context | ms per step | K and V read, MB | GB/s |", "|---|---|---|---|"]
    out = []
    for ctx in contexts:
        ms = 1e3 * attention_s(fast, rows, ctx)
        mb = 2 * len(fast.layers) * rows * fast.nkv * fast.hd * ctx * fast.dtype.itemsize / 1e6
        out.append({"context": ctx, "rows": rows, "attention_ms": ms, "kv_mb": mb})
        lines.append(f"| {ctx} | {ms:.1f} | {mb:.0f} | {mb / ms:.1f} |")
    print("\n".join(lines))
    machine.write_results("decode_attention", out, header, "\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[8, 32, 128], help="batch rows, multiples of 8")
    ap.add_argument("--new", type=int, default=32, help="new tokens per row")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--context", type=int, nargs="+", help="only the attention, at these context lengths")
    ap.add_argument("--attention-rows", type=int, default=16, help="--context: rows (scaling.py's 2 x 8)")
    a = ap.parse_args()
    header = machine.Header()
    choice = precision.choose()
    dtype = torch.bfloat16 if choice.bf16 else torch.float32
    loaded = load_policy("embedded")
    fast = FastRollout(loaded.model, loaded.tokenizer, dtype)
    if a.context:
        return attention_by_context(fast, a.attention_rows, a.context, header)
    fast.hf.eos_ids = torch.tensor([-1])  # no token ends a row: every row decodes every step
    prompts = build_task(config.load(None, []).task).train
    encs = {b: fast.hf.encode(prompts[: b // GROUP]) for b in a.rows}
    timed(fast, encs[a.rows[0]], GROUP, 4)  # packs the weights, warms the allocator
    pre, full = {b: [] for b in a.rows}, {b: [] for b in a.rows}
    split = {b: [] for b in a.rows}
    for rep in range(a.reps):
        for b in a.rows if rep % 2 == 0 else reversed(a.rows):
            pre[b].append(timed(fast, encs[b], GROUP, 1))
            full[b].append(timed(fast, encs[b], GROUP, a.new))
            split[b].append(parts(fast, b, encs[b].input_ids.shape[1] + a.new // 2))
        print(f"rep {rep + 1}/{a.reps} done", flush=True)

    dev = planner.probed_cpu()
    shape = planner.resolve_model("embedded")
    prompt_len = statistics.mean(int(m.sum()) for b in a.rows for m in encs[b].attention_mask)
    rows = []
    for b in a.rows:
        p, f = statistics.median(pre[b]), statistics.median(full[b])
        w = planner.Workload(prompts=b // GROUP, group=GROUP, prompt_len=encs[b].input_ids.shape[1], new_tokens=a.new,
                             sampler_bf16=choice.bf16, trainer_bf16=choice.bf16)
        plan = planner.rollout_parts(shape, w, dev)
        rows.append({"rows": b, "prompt_len": encs[b].input_ids.shape[1], "prefill_s": p,
                     "step_s": (f - p) / (a.new - 1), "plan_prefill_s": plan["prefill"], "plan_step_s": plan["step"],
                     "step_gflop": plan["step_flops"] / 1e9, "gen_s": f, "plan_gen_s": plan["total"],
                     **{k: statistics.median(d[k] for d in split[b]) for k in split[b][0]}})
        rows[-1]["rest_s"] = (rows[-1]["step_s"] - rows[-1]["matmul_s"] - rows[-1]["attention_s"]
                              - rows[-1]["sampling_s"])
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
    weight_gb = sum(lin.weight.numel() * lin.weight.element_size() for lin in fast.linears()) / 1e9
    names = {"matmul_s": "matmuls", "attention_s": "attention", "sampling_s": "sampling", "rest_s": "the rest"}
    split_fit = {k: dict(zip(("per_row_s", "intercept_s"), statistics.linear_regression(xs, [r[k] for r in rows])))
                 for k in names}
    fit["parts"] = split_fit
    lines += ["", "What a decode step is made of, ms (each part timed alone at the same rows; the rest = step - the "
              "three), and each part's line against rows:", "",
              "| rows | step | matmuls | of which GFLOP/s; weights GB/s | attention | sampling | the rest |",
              "|---|---|---|---|---|---|---|"]
    for r in rows:
        mm_flops = r["rows"] * 2 * sum(lin.weight.numel() for lin in fast.linears())
        lines.append(f"| {r['rows']} | {1e3 * r['step_s']:.1f} | {1e3 * r['matmul_s']:.1f} | "
                     f"{mm_flops / r['matmul_s'] / 1e9:.0f}; {weight_gb / r['matmul_s']:.1f} | "
                     f"{1e3 * r['attention_s']:.1f} | {1e3 * r['sampling_s']:.1f} | {1e3 * r['rest_s']:.1f} |")
    lines.append("| line: intercept + per row | " + f"{1e3 * overhead:.1f} + {1e3 * slope:.2f} | " + " | ".join(
        f"{1e3 * split_fit[k]['intercept_s']:.1f} + {1e3 * split_fit[k]['per_row_s']:.2f}"
        + (" |" if k == "matmul_s" else "") for k in names) + " |")
    lines += ["", f"The matmuls read {weight_gb:.2f} GB of weights per step; this machine copies memory at "
              f"{dev.mem_bw / 1e9:.1f} GB/s (read + write, the planner's figure)."]
    text = "\n".join(lines) + "\n"
    print(header.render() + text)
    machine.write_results("decode_cost", {"rows": rows, "fit": fit, "new": a.new, "reps": a.reps,
                                          "pre": pre, "full": full,
                                          "weight_gb": weight_gb}, header, text)


if __name__ == "__main__":
    main()
