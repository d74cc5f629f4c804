"""Between sampling and advantages: the stage that turns prompts into the batch the algorithm trains on.

The loop calls one verb, ``SamplingStage.collect``: generate K completions a prompt (``rollout.generate``),
score them (``verifier.score``), then every sampling-side method, in this order:

1. the curriculum: the prompt stream (``stream``, owned here) records each prompt's pass rate and passes
   over the prompts outside the learnable band when it draws the next ones (rollout.curriculum_window);
2. the shapers, each an addition to the reward computed from the verifier's unshaped score and the
   lengths: DAPO's overlong penalty (algo.overlong_*, ``dapo.overlong_penalty``) and the length shaping
   (task.length_*, ``stack.length_shaping``), added in that order;
3. the group filter, DAPO's dynamic sampling (rollout.filter_groups, always on for DAPO): groups whose
   verifier scores carry no signal are dropped, judged on the score and never on the shaped reward, and
   more prompts are generated, at most ``max_refill_rounds`` extra times, until ``prompts_per_step``
   groups are kept; the surplus of the last round is cut, and a step still short trains on what it has
   (an empty batch skips the update);
4. the process reward model's step rewards, for the groups kept only.

A new filter, shaper or curriculum is an entry here, built in ``from_config``; the loop does not change.
The group size enters here once (``group_size``), for the generation, the filter, the shapers and the
batch's metrics alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable

import torch
from torch import Tensor

from rlpost import config
from rlpost.algorithms import core, dapo
from rlpost.envs import Task, is_correct, mix
from rlpost.envs.data import PromptStream
from rlpost.envs.mix import MixedStream, make_stream
from rlpost.model.cores import Cores
from rlpost.observe.runlog import timed
from rlpost.rewards import stack
from rlpost.sections import TaskConfig
from rlpost.types.batch import Rollouts
from rlpost.types.roles import Roles, Traits

# A shaper: (the batch as scored, unshaped) -> (what it adds to each completion's reward (B,), its metrics)
Shaper = Callable[[Rollouts], tuple[Tensor, dict]]


@dataclass(frozen=True)
class OverlongPenalty:
    """DAPO's soft overlong penalty (algo.overlong_buffer, algo.overlong_penalty; ``dapo.overlong_penalty``)."""

    max_len: int
    buffer: int
    factor: float

    def __call__(self, batch: Rollouts) -> tuple[Tensor, dict]:
        penalty = dapo.overlong_penalty(batch.completion_mask.sum(1), self.max_len, self.buffer, self.factor)
        return penalty, {"reward/overlong_penalty_mean": penalty.mean().item()}


@dataclass(frozen=True)
class LengthShaping:
    """task.length_* (``stack.length_shaping``): judged on the verifier's verdicts, which a right answer
    earns whatever the shaping adds."""

    task: TaskConfig
    group_size: int
    max_len: int

    def __call__(self, batch: Rollouts) -> tuple[Tensor, dict]:
        correct = torch.tensor([is_correct(i, s) for i, s in zip(batch.infos, batch.reward.tolist())])
        shaping = stack.length_shaping(batch.completion_mask.sum(1), correct, self.group_size, self.task, self.max_len)
        return shaping, {"reward/length_shaping_mean": shaping.mean().item()}


@dataclass(frozen=True)
class GroupFilter:
    """DAPO's dynamic sampling (``dapo.keep_groups``): a group is kept when its scores vary and its pass
    rate lies in [min_pass, max_pass]; ``refills``: how many extra rounds may make up what was dropped."""

    min_pass: float
    max_pass: float
    refills: int


@dataclass
class SamplingStage:
    """Prompts in, the step's scored and filtered batch out (the module docstring has the order)."""

    group_size: int
    prompts_per_step: int
    sampling: dict  # rollout.generate's temperature, top_p and max_new_tokens
    stream: PromptStream | MixedStream  # the prompts (task.mix: by weight), with the curriculum's pass rates
    shapers: tuple[Shaper, ...] = ()
    group_filter: GroupFilter | None = None

    @classmethod
    def from_config(cls, cfg: config.Config, task: Task, traits: Traits) -> SamplingStage:
        """The stage cfg asks for, over ``task``'s rows; ``traits``: the algorithm's (DAPO filters groups always)."""
        rollout, algo, K = cfg.rollout, cfg.algo, cfg.rollout.group_size
        window = (rollout.curriculum_window, rollout.filter_min_pass_rate, rollout.filter_max_pass_rate)
        shapers: list[Shaper] = []
        if algo.overlong_buffer > 0:
            shapers.append(OverlongPenalty(rollout.max_new_tokens, algo.overlong_buffer, algo.overlong_penalty))
        if cfg.task.length_penalty != "none":
            shapers.append(LengthShaping(cfg.task, K, rollout.max_new_tokens))
        filtering = rollout.filter_groups or traits.filters_groups
        return cls(K, rollout.prompts_per_step,
                   {"temperature": rollout.temperature, "top_p": rollout.top_p,
                    "max_new_tokens": rollout.max_new_tokens},
                   make_stream(task, rollout.prompts_per_step, cfg.run.seed, window), tuple(shapers),
                   GroupFilter(rollout.filter_min_pass_rate, rollout.filter_max_pass_rate, rollout.max_refill_rounds)
                   if filtering else None)

    def collect(self, roles: Roles, timings: dict, cores: Cores | None = None) -> tuple[Rollouts, dict]:
        """One step's batch and its metrics: generated, scored, shaped, filtered (with refills) and
        given the process reward model's step rewards."""
        K, keep = self.group_size, self.group_filter
        # whether a group of equal rewards gives this algorithm nothing: the health checks' advice follows it
        metrics = {"algo/group_baseline": float(roles.algo.traits.group_baseline)}
        kept, n_kept, rounds, first = [], 0, 0, None
        while True:
            b, score = self.scored(roles, timings, cores, metrics)
            first = first or batch_metrics(b, K)  # what the policy produced, before any filtering
            if keep is None:
                return score_steps(roles, b, timings), {**metrics, **first}
            groups = dapo.keep_groups(score, K, keep.min_pass, keep.max_pass)  # (n_prompts,)
            kept.append(b.select(groups.repeat_interleave(K).nonzero().squeeze(1)))
            n_kept += int(groups.sum())
            if rounds == 0:
                metrics["rollout/kept_groups_frac"] = groups.float().mean().item()
            if n_kept >= self.prompts_per_step or rounds >= keep.refills:
                break
            rounds += 1
        batch = Rollouts.cat(kept)
        batch = batch.select(slice(0, self.prompts_per_step * K))  # whole groups: every part holds whole groups
        metrics.update({"rollout/refill_rounds": rounds, "rollout/groups_trained": len(batch) // K,
                        "reward/mean_before_filter": first["reward/mean"]})
        return score_steps(roles, batch, timings), {**metrics, **(batch_metrics(batch, K) if len(batch) else first)}

    def scored(self, roles: Roles, timings: dict, cores: Cores | None, metrics: dict) -> tuple[Rollouts, Tensor]:
        """(one round of prompts generated and scored, with the shapers' additions in its reward; the
        verifier's own score (B,), which the filter judges), the round's metrics added to ``metrics``."""
        K = self.group_size
        with timed("gen", timings):
            if cores is not None:
                cores.adjust()
            b = roles.rollout.generate(self.stream.next(), n=K, **self.sampling)
            metrics.update(roles.rollout.last_metrics)
        with timed("reward", timings):
            b.reward, b.infos, v_metrics = roles.verifier.score(b)
        b.reward, v_metrics["reward/nan_or_inf"] = stack.finite(b.reward)  # scored 0: never into the advantages
        for k, v in v_metrics.items():  # counts add up over refill rounds; means (reward_extra/, stack parts) do not
            metrics[k] = metrics.get(k, 0) + v if k.startswith(("verifier/", "reward/nan_or_inf")) else v
        score = b.reward  # the verifier's own score: groups are filtered on it, as DAPO/verl filter on accuracy
        metrics.update(self.stream.observe(b.rows[::K], core.pass_rate(score, K).tolist()))  # the online curriculum
        parts = [shaper(b) for shaper in self.shapers]  # each from the unshaped batch, added in order
        for add, shaper_metrics in parts:
            b.reward = b.reward + add
            metrics.update(shaper_metrics)
        return b, score


def score_steps(roles: Roles, batch: Rollouts, timings: dict) -> Rollouts:
    """The process reward model's step rewards written in (task.process_reward_model), once the
    groups are chosen: filtered-out groups cost no PRM forward."""
    if roles.process_reward is not None and len(batch):
        with timed("prm", timings):
            batch.step_reward, batch.step_end = roles.process_reward.dense(batch)
    return batch


def batch_metrics(batch: Rollouts, group_size: int) -> dict:
    """The batch's reward and length statistics, and how many of its groups carry no signal."""
    length = batch.completion_mask.sum(1).float()  # (B,)
    p = core.pass_rate(batch.reward, group_size)  # (n_prompts,) share of each group with reward >= 1
    grouped = batch.reward.view(-1, group_size)  # (n_prompts, K)
    return {
        "reward/all_pass_frac": (p == 1).float().mean().item(),
        "reward/all_fail_frac": (p == 0).float().mean().item(),
        "reward/outside_band_frac": ((p == 0) | (p == 1)).float().mean().item(),  # p(1 - p) = 0
        # groups whose completions all got one reward: no signal for a group baseline, whatever the reward's scale
        "reward/zero_std_frac": (grouped.max(1).values == grouped.min(1).values).float().mean().item(),
        # float64: rewards each finite in float32 (up to 3.4e38) can sum, or square, past it
        "reward/mean": batch.reward.double().mean().item(),
        "reward/std": batch.reward.double().std().item() if len(batch) > 1 else 0.0,
        "reward/max": batch.reward.max().item(),
        "reward/min": batch.reward.min().item(),
        "response_length/mean": length.mean().item(),
        "response_length/max": length.max().item(),
        "response_length/min": length.min().item(),
        "response_length/clip_ratio": batch.truncated.float().mean().item(),
        "prompt_length/mean": batch.prompt_mask.sum(1).float().mean().item(),
        **mix.batch_metrics(batch.rows, batch.reward.tolist()),  # task.mix: reward, pass rate, share per family
    }
