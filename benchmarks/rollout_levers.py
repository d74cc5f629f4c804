"""Each rollout-engine lever switched off in turn, on the speed benchmark's batch (8 prompts x 4, 64 new tokens).

    .venv/bin/python benchmarks/rollout_levers.py            # 3 reps, variants alternating within each rep

Variants (everything else as shipped in roles/rollout_fast.py):
  shipped              the engine as it is
  no_compaction        finished rows stay in the decode batch (COMPACT_FRACTION > 1)
  no_packed_weights    F.linear on plain bf16 weights instead of oneDNN-packed ones
  no_prefix_sharing    every row prefills its own copy of the prompt (group size 1 x 32 rows)
  multinomial          torch.multinomial instead of inverse-CDF sampling
  one_thread           torch.set_num_threads(1)
  generate_static      transformers `generate`, bf16 weights, static cache (the baseline)
Reports completion tokens (up to EOS) per second, median over reps. Writes benchmarks/results/rollout_levers.md.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

import torch
from vs_trl import GROUP, MAX_NEW, PROMPTS, TEMPERATURE, generate_tokens  # the speed benchmark's batch

from rlpost import config
from rlpost.envs import build_task
from rlpost.model.load import load_policy
from rlpost.roles import rollout_fast
from rlpost.roles.rollout_fast import FastRollout

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    threads = torch.get_num_threads()
    loaded = load_policy("embedded")
    rows = build_task(config.load(None, []).task).train[:PROMPTS]
    fast = FastRollout(copy.deepcopy(loaded.model), loaded.tokenizer)
    unpacked = FastRollout(copy.deepcopy(loaded.model), loaded.tokenizer)
    for lin in unpacked.linears():  # never packed: plain F.linear, which reorders the weight on every call
        lin.pack = lambda: None
    hf = copy.deepcopy(loaded.model).to(torch.bfloat16).eval()
    enc = loaded.tokenizer(fast.render(rows), return_tensors="pt", padding=True, add_special_tokens=False)
    real_draw, real_fraction = FastRollout.draw_tokens, rollout_fast.COMPACT_FRACTION

    def multinomial_draw(self, logits, temperature, top_p, u=None):  # u: the per-row uniforms, unused here
        logp = (logits / temperature).log_softmax(-1)
        tok = torch.multinomial(logp.exp(), 1).squeeze(1)
        return tok, logp.gather(-1, tok[:, None]).squeeze(1), None

    def run(engine, rows_, n):
        return engine.generate(rows_, n, TEMPERATURE, 1.0, MAX_NEW).completion_mask.sum().item()

    def variant(name):
        rollout_fast.COMPACT_FRACTION = 2.0 if name == "no_compaction" else real_fraction
        FastRollout.draw_tokens = multinomial_draw if name == "multinomial" else real_draw
        torch.set_num_threads(1 if name == "one_thread" else threads)
        if name == "no_packed_weights":
            return run(unpacked, rows, GROUP)
        if name == "no_prefix_sharing":  # each of the 32 rows is its own 'group' of one
            return run(fast, [r for r in rows for _ in range(GROUP)], 1)
        if name == "generate_static":
            return generate_tokens(hf, loaded.tokenizer, enc, fast, "static")
        return run(fast, rows, GROUP)

    names = ["shipped", "no_compaction", "no_packed_weights", "no_prefix_sharing", "multinomial", "one_thread",
             "generate_static"]
    results = {n: [] for n in names}
    for rep in range(args.reps + 1):  # rep 0 warms up
        for name in names:
            torch.manual_seed(rep)
            t = time.perf_counter()
            tokens = variant(name)
            if rep:
                results[name].append(tokens / (time.perf_counter() - t))
        print(f"rep {rep} done", flush=True)
    med = {n: statistics.median(v) for n, v in results.items()}
    lines = [f"{args.reps} reps, 8 prompts x 4 samples, <= {MAX_NEW} new tokens, T = {TEMPERATURE}; "
             "completion tokens (up to EOS) per second, median.", "",
             "| variant | tok/s | vs shipped |", "|---|---|---|"]
    lines += [f"| {n} | {med[n]:.0f} | {med[n] / med['shipped']:.2f} |" for n in names]
    text = "\n".join(lines) + "\n"
    print(text)
    (HERE / "results" / "rollout_levers.md").write_text(text)


if __name__ == "__main__":
    main()
