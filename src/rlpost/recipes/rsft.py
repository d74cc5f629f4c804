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

from pathlib import Path

from rlpost import config
from rlpost.recipes.guard import check_reward_failures
from rlpost.recipes.online import sampled_rounds


def accepted_rows(roles, rows: list[dict], k: int, cfg: config.Config) -> tuple[list[dict], dict]:
    """(SFT rows {prompt, completion, answer}, metrics) from K samples of each prompt."""
    rollout, pref = cfg.rollout, cfg.pref
    batch = roles.rollout.generate(rows, n=k, temperature=rollout.temperature, top_p=rollout.top_p,
                                   max_new_tokens=rollout.max_new_tokens)
    reward, _, scored = roles.verifier.score(batch)
    check_reward_failures(scored, cfg.task.max_reward_error_frac, "while sampling a round", True,
                          "stopped before training on them")
    lengths = batch.completion_mask.sum(1)  # (B,) tokens per completion
    out, solved = [], 0
    for i, row in enumerate(rows):
        ok = [i * k + j for j in range(k) if reward[i * k + j] >= pref.rsft_min_reward]  # accepted rows of this prompt
        solved += bool(ok)
        if pref.rsft_keep == "shortest" and ok:
            ok = [min(ok, key=lambda b: int(lengths[b]))]
        elif pref.rsft_keep == "unique":  # the first sample of each distinct text
            seen: set[str] = set()
            ok = [b for b in ok if not (batch.completions[b].strip() in seen or seen.add(batch.completions[b].strip()))]
        out += [{"prompt": row["messages"], "completion": batch.completions[b], "answer": row.get("answer")}
                for b in ok]
    accepted = int((reward >= pref.rsft_min_reward).sum())
    return out, {"rsft/accepted_frac": accepted / len(batch), "rsft/prompts_solved_frac": solved / len(rows),
                 "rsft/rows": len(out), "rsft/reward_mean": reward.mean().item()}


def run_rsft(cfg: config.Config, run_dir: Path, resume: bool = False) -> dict:
    """max(1, pref.online_rounds) rounds of (sample -> accepted rows -> one SFT pass); returns the summary.
    ``resume``: go on from RUN/rounds.json (online.sampled_rounds)."""
    return sampled_rounds(cfg, run_dir, max(1, cfg.pref.online_rounds), accepted_rows, "sft", "rsft",
                          "accepted.jsonl", "fewer than 2 accepted samples", ("sft_nll_after", "sft/nll"), resume)
