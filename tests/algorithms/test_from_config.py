"""Every algorithm's ``from_config`` passes on every knob it documents, and reads no other.

Each knob below is changed alone, from the defaults, and each algorithm of the registry is built
from that config; the knob "is read" when the built algorithm's state differs from the default
build's. The table the test expects is written by hand from docs/algorithms.md and each file's
constructor, not printed from the code: a ``from_config`` that drops an argument (the default is
then used silently, e.g. CISPO's KL estimator) or wires one knob to another fails here. Mutation
testing found such survivors in every ``from_config`` (tests/README.md).
"""

import pytest
from helpers import algorithm

from rlpost import algorithms, config

KNOBS = {"algo.scale_by_std": "false", "algo.std_scope": "batch", "algo.clip_eps_low": "0.1",
         "algo.clip_eps_high": "0.3", "algo.seq_clip_eps_low": "0.001", "algo.seq_clip_eps_high": "0.002",
         "algo.kl_coef": "0.05", "algo.kl_estimator": "k2", "algo.gamma": "0.9", "algo.lam": "0.8",
         "algo.vf_coef": "0.3", "algo.value_clip": "0.5", "algo.whiten_advantages": "false",
         "algo.dapo_clip_eps_high": "0.4", "algo.dual_clip_c": "3.0", "algo.cispo_eps_low": "0.5",
         "algo.baseline": "none", "algo.baseline_decay": "0.5", "algo.loss_agg": "const_norm",
         "rollout.group_size": "4", "rollout.max_new_tokens": "32"}

PPO_CLIP = {"algo.clip_eps_low", "algo.clip_eps_high", "algo.dual_clip_c"}  # the token-clipped ratio and its cap
KL = {"algo.kl_coef", "algo.kl_estimator"}
GROUP = {"rollout.group_size", "algo.scale_by_std", "algo.std_scope"}  # group-normalised advantages
READS = {
    "grpo": GROUP | PPO_CLIP | KL | {"algo.loss_agg"},
    "dapo": GROUP | KL | {"algo.clip_eps_low", "algo.dapo_clip_eps_high", "algo.dual_clip_c"},  # token-mean, fixed
    "dr_grpo": {"rollout.group_size", "rollout.max_new_tokens"} | PPO_CLIP | KL,  # no std; constant normaliser
    "gspo": GROUP | KL | {"algo.seq_clip_eps_low", "algo.seq_clip_eps_high"},  # sequence ratio, sequence-mean loss
    "cispo": GROUP | KL | {"algo.cispo_eps_low", "algo.clip_eps_high", "algo.loss_agg"},  # no dual clip: IS weight
    "rloo": {"rollout.group_size"} | PPO_CLIP | KL | {"algo.loss_agg"},
    "ppo": PPO_CLIP | KL | {"algo.gamma", "algo.lam", "algo.vf_coef", "algo.value_clip", "algo.whiten_advantages",
                           "algo.loss_agg"},
    "reinforce_pp": PPO_CLIP | KL | {"algo.loss_agg"},  # KL in the reward; batch-normalised returns
    "reinforce": {"algo.baseline", "algo.baseline_decay", "algo.loss_agg"},  # no ratio, no KL term
    "distill": PPO_CLIP | {"algo.loss_agg"},  # the teacher's log-probs are the advantage
}
# With the constant-length normaliser, the aggregator reads rollout.max_new_tokens as well.
CONST_NORM_READS_LENGTH = {"grpo", "cispo", "rloo", "ppo", "reinforce_pp", "reinforce", "distill", "dr_grpo"}


def state(name: str, *overrides: str) -> dict:
    extra = ["algo.teacher=embedded"] if name == "distill" else []
    algo = algorithm(config.load(None, [f"algo.name={name}", *extra, *overrides]))
    return {k: repr(v) for k, v in vars(algo).items()}  # functions and partials by name and arguments


def test_the_table_covers_the_registry():
    assert set(READS) == set(algorithms.ALGORITHMS)


@pytest.mark.parametrize("name", sorted(READS))
def test_from_config_reads_exactly_the_documented_knobs(name):
    base = state(name)
    read = {k for k, v in KNOBS.items() if state(name, f"{k}={v}") != base}
    assert read == READS[name], (f"read but not documented: {read - READS[name]}; "
                                 f"documented but dropped: {READS[name] - read}")


@pytest.mark.parametrize("name", sorted(READS))
def test_the_constant_normaliser_takes_the_length_from_rollout_max_new_tokens(name):
    base = state(name, "algo.loss_agg=const_norm")
    changed = state(name, "algo.loss_agg=const_norm", "rollout.max_new_tokens=32") != base
    assert changed == (name in CONST_NORM_READS_LENGTH)
