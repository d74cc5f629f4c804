"""The sampling stage (recipes/sampling_stage.py): what lies between rollout and advantages.

Its refactoring out of the loop changed no behaviour: ``old_collect`` below is the loop's ``collect`` as
it was before the stage (group filtering and refills in the loop, the overlong penalty and length shaping
in the reward stack's ``shape``), written out once, and the stage must give the same batches and metrics
bit for bit over steps with refills, a cut surplus, both shapers and the curriculum. Fake roles draw
lengths and scores from torch's RNG, so the comparison rests on no model's rounding.
"""

from __future__ import annotations

import pytest
import torch

from rlpost import config
from rlpost.algorithms import core, dapo
from rlpost.envs import Task, is_correct
from rlpost.recipes.sampling_stage import SamplingStage, batch_metrics
from rlpost.rewards import stack
from rlpost.types.batch import Rollouts
from rlpost.types.roles import Traits

DAPO_TRAITS = Traits(group_baseline=True, kl="loss", filters_groups=True, fixed_aggregator="token_mean",
                     token_clip=True)


class FakeRollout:
    """Completions of random lengths (some truncated at the cap), from torch's RNG."""

    last_metrics: dict = {}

    def generate(self, rows, n, temperature, top_p, max_new_tokens):
        B = len(rows) * n
        lengths = torch.randint(1, max_new_tokens + 1, (B,))
        mask = torch.arange(max_new_tokens)[None, :] < lengths[:, None]  # (B, T)
        return Rollouts(prompt_ids=torch.ones(B, 2, dtype=torch.long), prompt_mask=torch.ones(B, 2, dtype=torch.bool),
                        completion_ids=torch.randint(1, 50, (B, max_new_tokens)) * mask, completion_mask=mask,
                        sampler_logp=-torch.rand(B, max_new_tokens) * mask, truncated=lengths == max_new_tokens,
                        group_ids=torch.arange(len(rows)).repeat_interleave(n),
                        rows=[r for r in rows for _ in range(n)], completions=[""] * B)


class FakeVerifier:
    """A right answer (1.0) with probability 0.3, else 0: many groups all wrong, some varied."""

    def score(self, batch):
        reward = (torch.rand(len(batch)) < 0.3).float()
        return reward, [{"correct": bool(r)} for r in reward.tolist()], {"verifier/calls": len(batch)}


class FakeRoles:
    rollout, verifier, process_reward = FakeRollout(), FakeVerifier(), None

    class algo:
        traits = DAPO_TRAITS


def old_shape(batch, task, algo, rollout):
    reward, metrics = batch.reward, {}
    lengths = batch.completion_mask.sum(1)
    if task.length_penalty != "none":
        correct = torch.tensor([is_correct(i, s) for i, s in zip(batch.infos, batch.reward.tolist())])
    if algo.overlong_buffer > 0:
        penalty = dapo.overlong_penalty(lengths, rollout.max_new_tokens, algo.overlong_buffer, algo.overlong_penalty)
        reward = reward + penalty
        metrics["reward/overlong_penalty_mean"] = penalty.mean().item()
    if task.length_penalty != "none":
        shaping = stack.length_shaping(lengths, correct, rollout.group_size, task, rollout.max_new_tokens)
        reward = reward + shaping
        metrics["reward/length_shaping_mean"] = shaping.mean().item()
    return reward, metrics


def old_collect(roles, stream, cfg):
    rollout, K = cfg.rollout, cfg.rollout.group_size
    filtering = rollout.filter_groups or roles.algo.traits.filters_groups
    metrics = {"algo/group_baseline": float(roles.algo.traits.group_baseline)}
    kept, n_kept, rounds, first = [], 0, 0, None
    while True:
        b = roles.rollout.generate(stream.next(), n=K, temperature=rollout.temperature, top_p=rollout.top_p,
                                   max_new_tokens=rollout.max_new_tokens)
        metrics.update(roles.rollout.last_metrics)
        b.reward, b.infos, v_metrics = roles.verifier.score(b)
        b.reward, v_metrics["reward/nan_or_inf"] = stack.finite(b.reward)
        for k, v in v_metrics.items():
            metrics[k] = metrics.get(k, 0) + v if k.startswith(("verifier/", "reward/nan_or_inf")) else v
        score = b.reward
        metrics.update(stream.observe(b.rows[::K], core.pass_rate(score, K).tolist()))
        b.reward, shaping = old_shape(b, cfg.task, cfg.algo, cfg.rollout)
        metrics.update(shaping)
        first = first or batch_metrics(b, K)
        if not filtering:
            return b, {**metrics, **first}
        keep = dapo.keep_groups(score, K, rollout.filter_min_pass_rate, rollout.filter_max_pass_rate)
        kept.append(b.select(keep.repeat_interleave(K).nonzero().squeeze(1)))
        n_kept += int(keep.sum())
        if rounds == 0:
            metrics["rollout/kept_groups_frac"] = keep.float().mean().item()
        if n_kept >= rollout.prompts_per_step or rounds >= rollout.max_refill_rounds:
            break
        rounds += 1
    batch = Rollouts.cat(kept)
    batch = batch.select(slice(0, rollout.prompts_per_step * K))
    metrics.update({"rollout/refill_rounds": rounds, "rollout/groups_trained": len(batch) // K,
                    "reward/mean_before_filter": first["reward/mean"]})
    return batch, {**metrics, **(batch_metrics(batch, K) if len(batch) else first)}


def rows(n):
    return [{"messages": [{"role": "user", "content": str(i)}], "answer": str(i % 10)} for i in range(n)]


CASES = [  # (overrides, traits): DAPO with both shapers and the curriculum; GRPO unfiltered; GRPO filtered
    (["algo.overlong_buffer=3", "algo.overlong_penalty=0.5", "task.length_penalty=ratio", "task.length_coef=0.1",
      "rollout.curriculum_window=2", "rollout.filter_max_pass_rate=0.9", "rollout.max_refill_rounds=2"], DAPO_TRAITS),
    (["task.length_penalty=linear", "task.length_target=2"], Traits(group_baseline=True)),
    (["rollout.filter_groups=true", "algo.overlong_buffer=2"], Traits(group_baseline=True)),
]


@pytest.mark.parametrize("overrides, traits", CASES)
def test_the_stage_gives_the_batches_and_metrics_the_loop_gave_before_it(overrides, traits):
    cfg = config.load(None, ["rollout.group_size=4", "rollout.prompts_per_step=3", "rollout.max_new_tokens=6",
                             *overrides])
    task = Task(rows(40), rows(4), "toy_verifiers:first_char_digit")
    roles = FakeRoles()
    roles.algo = type("algo", (), {"traits": traits})
    stage = SamplingStage.from_config(cfg, task, traits)
    old_stream = SamplingStage.from_config(cfg, task, traits).stream  # a second stream, from the same seed
    refills = 0
    for step in range(4):
        torch.manual_seed(step)
        want, want_m = old_collect(roles, old_stream, cfg)
        torch.manual_seed(step)
        got, got_m = stage.collect(roles, {})
        assert got_m == want_m and list(got_m) == list(want_m)
        for f in ("completion_ids", "completion_mask", "group_ids", "truncated", "reward"):
            assert torch.equal(getattr(got, f), getattr(want, f)), f
        assert got.rows == want.rows and got.infos == want.infos
        refills += got_m.get("rollout/refill_rounds", 0)
    assert refills > 0 or not (traits.filters_groups or cfg.rollout.filter_groups)  # the refill path was walked


def test_the_shapers_add_the_overlong_penalty_then_the_length_shaping_and_log_them():
    cfg = config.load(None, ["task.length_penalty=linear", "task.length_coef=1", "rollout.max_new_tokens=10",
                             "algo.overlong_buffer=4", "algo.overlong_penalty=1", "rollout.group_size=2"])
    stage = SamplingStage.from_config(cfg, Task(rows(4), rows(2), "toy_verifiers:first_char_digit"), Traits())
    batch = Rollouts(prompt_ids=torch.ones(2, 1, dtype=torch.long), prompt_mask=torch.ones(2, 1, dtype=torch.bool),
                     completion_ids=torch.ones(2, 10, dtype=torch.long),
                     completion_mask=torch.tensor([[1] * 3 + [0] * 7, [1] * 10]).bool(),
                     sampler_logp=torch.zeros(2, 10), truncated=torch.tensor([False, True]),
                     group_ids=torch.tensor([0, 0]), rows=[{}, {}], completions=["", ""],
                     reward=torch.tensor([1.0, 1.0]), infos=[{"correct": True}, {"correct": True}])
    parts = [shaper(batch) for shaper in stage.shapers]
    assert [sorted(m) for _, m in parts] == [["reward/overlong_penalty_mean"], ["reward/length_shaping_mean"]]
    # length 3: no penalty; length 10: overlong -1 (the whole buffer) and linear -1
    assert torch.allclose(batch.reward + parts[0][0] + parts[1][0], torch.tensor([1.0 - 0.3, -1.0]))
    assert parts[0][1]["reward/overlong_penalty_mean"] == pytest.approx(-0.5)
    assert parts[1][1]["reward/length_shaping_mean"] == pytest.approx(-0.65)
