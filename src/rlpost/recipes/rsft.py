"""Rejection-sampling SFT (`rlpost rsft`, and a pipeline stage ``kind: rsft``).

Each round samples K completions (``rollout.group_size``) of ``pref.online_prompts`` training
prompts from the *current* policy, keeps those the task's verifier accepts (reward >=
``pref.rsft_min_reward``), and trains one SFT pass on them; the next round samples from the
result. This is DeepSeek-R1's stage between RL rounds ("rejection sampling and supervised
fine-tuning", arXiv:2501.12948, Sec. 2.3.3) and, run for several rounds, expert iteration
(Anthony et al. 2017; STaR, Zelikman et al. 2022). Which accepted samples become rows is
``pref.rsft_keep``:

  all        every accepted sample (a prompt the policy solves often weighs more)
  unique     accepted samples with distinct text (R1 filters repeats), the default
  shortest   the shortest accepted sample of each prompt (one row per solved prompt)

A prompt with no accepted sample gives no row. ``pref.online_rounds`` sets the rounds (0 = 1).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from rlpost import build, config
from rlpost.envs import build_task
from rlpost.model.checkpoint import write_atomic
from rlpost.recipes.evaluate import model_accuracy
from rlpost.recipes.offline import train_offline


def accepted_rows(roles, rows: list[dict], k: int, cfg: config.Config) -> tuple[list[dict], dict]:
    """(SFT rows {prompt, completion, answer}, metrics) from K samples of each prompt."""
    r, p = cfg.rollout, cfg.pref
    batch = roles.rollout.generate(rows, n=k, temperature=r.temperature, top_p=r.top_p, max_new_tokens=r.max_new_tokens)
    reward, _, _ = roles.verifier.score(batch)
    lengths = batch.completion_mask.sum(1)  # (B,) tokens per completion
    out, solved = [], 0
    for i, row in enumerate(rows):
        ok = [i * k + j for j in range(k) if reward[i * k + j] >= p.rsft_min_reward]  # accepted rows of this prompt
        solved += bool(ok)
        if p.rsft_keep == "shortest" and ok:
            ok = [min(ok, key=lambda b: int(lengths[b]))]
        elif p.rsft_keep == "unique":  # the first sample of each distinct text
            seen: set[str] = set()
            ok = [b for b in ok if not (batch.completions[b].strip() in seen or seen.add(batch.completions[b].strip()))]
        out += [{"prompt": row["messages"], "completion": batch.completions[b], "answer": row.get("answer")} for b in ok]
    accepted = int((reward >= p.rsft_min_reward).sum())
    return out, {"rsft/accepted_frac": accepted / len(batch), "rsft/prompts_solved_frac": solved / len(rows),
                 "rsft/rows": len(out), "rsft/reward_mean": reward.mean().item()}


def run_rsft(cfg: config.Config, run_dir: Path) -> dict:
    """max(1, pref.online_rounds) rounds of (sample -> accepted rows -> one SFT pass); returns the summary."""
    p = cfg.pref
    task = build_task(cfg)
    rng = random.Random(cfg.run.seed)
    model = cfg.model.name
    rounds = [{"round": 0, "heldout_accuracy": model_accuracy(cfg, model)}]
    for i in range(1, max(1, p.online_rounds) + 1):
        sample_cfg = config.with_overrides(cfg, [f"model.name={model}", "algo.kl_coef=0", "algo.name=grpo"])
        roles = build.build_roles(sample_cfg, task)
        torch.manual_seed(cfg.run.seed + i)
        try:
            rows, metrics = accepted_rows(roles, rng.sample(task.train, min(p.online_prompts, len(task.train))),
                                          cfg.rollout.group_size, cfg)
        finally:
            roles.close()
        if len(rows) < 2:  # SFT needs a training row and a held-out one
            rounds.append({"round": i, "skipped": "fewer than 2 accepted samples", **metrics})
            continue
        rdir = run_dir / f"round_{i}"
        rdir.mkdir(parents=True, exist_ok=True)
        data = rdir / "accepted.jsonl"
        write_atomic(data, "".join(json.dumps(x) + "\n" for x in rows))
        round_cfg = config.with_overrides(cfg, [f"model.name={model}", f"pref.data={data}", "pref.online_rounds=0"])
        summary = train_offline(round_cfg, rdir, "sft")
        model = summary["model"]
        rounds.append({"round": i, **metrics, "heldout_accuracy": model_accuracy(cfg, model),
                       "sft_nll_after": summary["heldout_after"].get("sft/nll")})
    out = {"kind": "rsft", "rounds": rounds, "model": model,
           "heldout_before": rounds[0]["heldout_accuracy"], "heldout_after": rounds[-1].get("heldout_accuracy")}
    write_atomic(run_dir / "summary.json", json.dumps(out, indent=2) + "\n")
    return out
