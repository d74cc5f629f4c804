"""Reward stacks: the training reward as a weighted sum of named parts, plus length shaping.

    reward = sum_i w_i * part_i(completion, row)  [+ judge, reward model]  + length shaping

Each part is a scorer with the verifier's contract, ``score(batch) -> (rewards, infos, metrics)``:
a reward function in its own worker process (VerifierRunner: verifier-style or TRL-style, with a
deadline), the LLM judge (rewards/judge.py) or a learned reward model (rewards/reward_model.py).
``build.build_reward`` assembles a stack from the config. Every part is logged on its
own as ``reward/<name>``, so a rising total can be traced to the part that moved. A part that
returns NaN (a TRL function's None, 'does not apply') is left out of that row's sum, as TRL does.

Length shaping needs token counts, so the sampling stage adds it after scoring, next to DAPO's
overlong penalty (recipes/sampling_stage.py), and it never enters group filtering, which judges correctness.

  linear  -coef * max(0, L - target) / (max_new_tokens - target): 0 up to the target, -coef at the cap
  ratio   Kimi k1.5's group-relative length reward: lam = 0.5 - (L - L_min) / (L_max - L_min) within
          the group; a correct response gets coef * lam, a wrong one coef * min(0, lam), so short
          wrong answers are not rewarded for being short.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlpost.sections import TaskConfig


class RewardStack:
    def __init__(self, parts: list[tuple[str, object, float]]):
        self.parts = parts  # (name, scorer, weight)

    def score(self, batch) -> tuple[Tensor, list[dict], dict]:
        total = torch.zeros(len(batch))
        infos = [{} for _ in range(len(batch))]
        metrics: dict = {}
        for name, scorer, weight in self.parts:
            values, part_infos, part_metrics = scorer.score(batch)
            total += weight * torch.nan_to_num(values, nan=0.0)
            for info, part_info, v in zip(infos, part_infos, values.tolist()):
                info.setdefault("parts", {})[name] = v
                for k, x in part_info.items():
                    info.setdefault(k, x)  # the first part's 'correct' is the one evaluation reads
            metrics[f"reward/{name}"] = torch.nanmean(values).item() if not values.isnan().all() else float("nan")
            for k, v in part_metrics.items():
                metrics[k] = metrics.get(k, 0) + v if k.startswith("verifier/") else v
        return total, infos, metrics

    def close(self) -> None:
        for _, scorer, _ in self.parts:
            scorer.close()


def finite(reward: Tensor) -> tuple[Tensor, int]:
    """(reward (B,) with every NaN/inf set to 0, how many there were). A lone TRL-style function's
    None arrives as NaN and scores 0, as TRL's nansum over functions gives; a NaN from a judge or a
    reward model must not reach the advantages either."""
    bad = ~torch.isfinite(reward)  # (B,) bool
    return torch.where(bad, torch.zeros_like(reward), reward), int(bad.sum())


def part_name(path: str) -> str:
    return path.rpartition(":")[2] or path


def length_shaping(lengths: Tensor, correct: Tensor, group_size: int, task: TaskConfig, max_len: int) -> Tensor:
    """(B,) reward added for length (task.length_*; max_len: rollout.max_new_tokens); see the module docstring."""
    L = lengths.float()
    if task.length_penalty == "linear":
        return -task.length_coef * (L - task.length_target).clamp(min=0) / max(1, max_len - task.length_target)
    if task.length_penalty == "ratio":
        g = L.view(-1, group_size)
        lo, hi = g.min(1, keepdim=True).values, g.max(1, keepdim=True).values
        lam = torch.where(hi > lo, 0.5 - (g - lo) / (hi - lo).clamp(min=1e-9), torch.zeros_like(g)).view(-1)
        return task.length_coef * torch.where(correct, lam, lam.clamp(max=0))
    return torch.zeros_like(L)
