"""Where one GRPO step's time goes on this machine, and which settings pay.

    .venv/bin/python benchmarks/step_profile.py [--prompts 8] [--group 8] [--max-new 16]

Measures, on the embedded SmolLM2-135M-Instruct and a real rollout batch of the demo task:
  * generation with the bf16 sampler copy, with parameters requires_grad=True vs False;
  * the trainer's forward+backward over the batch for several micro-batch sizes, with and
    without bf16 autocast (float32 master weights either way);
  * the reference's no-grad forward.
Each figure is the median of --reps runs after one warm-up. Run it on an idle machine: timings
here move by up to ~25% run to run, so compare the ratios within one invocation.
"""

from __future__ import annotations

import argparse
import copy
from dataclasses import replace

import machine  # benchmarks/machine.py: median_s
import torch

from rlpost import config
from rlpost.algorithms.grpo import GRPO
from rlpost.envs.arithmetic import build_splits
from rlpost.model.load import load_policy
from rlpost.model.logprobs import completion_logprobs
from rlpost.roles.rollout_hf import HFRollout
from rlpost.build import trainer_over


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=16)
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    loaded = load_policy("embedded")
    rows = build_splits(config.load().task)[0][: args.prompts]
    B = args.prompts * args.group
    print(f"batch: {args.prompts} prompts x {args.group} samples = {B} sequences, max {args.max_new} new tokens")

    ro = HFRollout(copy.deepcopy(loaded.model), loaded.tokenizer, dtype=torch.bfloat16)
    torch.manual_seed(0)
    gen = lambda: ro.generate(rows, args.group, 0.7, 1.0, args.max_new)
    t_on = machine.median_s(gen, args.reps)
    ro.model.requires_grad_(False)
    t_off = machine.median_s(gen, args.reps)
    ro.model.requires_grad_(True)
    batch = gen()
    tokens = int(batch.completion_mask.sum())
    print(f"generate, bf16 sampler, params requires_grad=True : {t_on:6.2f} s")
    print(f"generate, bf16 sampler, params requires_grad=False: {t_off:6.2f} s   ({t_off / t_on:.2f}x)")

    batch.reward = torch.rand(B)
    algo = GRPO(group_size=args.group)
    batch.advantages = algo.advantages(batch).tokens
    P, T = batch.prompt_ids.shape[1], batch.completion_ids.shape[1]
    print(f"update input: {B} x (prompt {P} + completion {T}) tokens, {tokens} loss tokens")
    settings = [(True, True, m) for m in (B, 32, 16)] + [(True, False, 32), (False, True, 32), (False, False, 32)]
    for share, autocast, micro in settings:
        if micro > B or B % micro:
            continue
        tcfg = replace(config.TrainerConfig(), precision="bf16" if autocast else "fp32", share_prompt_prefix=share)
        tr = trainer_over(loaded.model, tcfg, 0.7, B, micro, 10)

        def fwd_bwd():
            tr._accumulate(copy.deepcopy(batch), algo.loss)
            tr.opt.zero_grad(set_to_none=True)

        print(f"forward+backward, shared prefix={share!s:5}, autocast={autocast!s:5}, micro-batch {micro:3d}: "
              f"{machine.median_s(fwd_bwd, args.reps):6.2f} s")

    for share in (True, False):
        def ref_forward():
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                for i in range(0, B, 32):
                    completion_logprobs(loaded.model, batch.select(slice(i, i + 32)), 0.7, share_prefix=share)

        print(f"reference forward (no grad, autocast, micro 32), shared prefix={share!s:5}: "
              f"{machine.median_s(ref_forward, args.reps):6.2f} s")


if __name__ == "__main__":
    main()
