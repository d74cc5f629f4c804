"""Algorithms: one file each, readable top to bottom, each naming the patch it applies to its
predecessor (docs/algorithms.md has the table). Every algorithm class has

  name, traits         its config name and what it needs from the loop (types/roles.py: Traits)
  from_config(cfg)     itself, with its knobs read from the config
  advantages(batch)    -> Advantages: (B, T) token advantages and metrics
  loss(logp, batch)    -> (loss, metrics), normalised by mini-batch totals

``ALGORITHMS`` is the registry; ``build(cfg)`` returns the ``Objective`` the loop calls (the
algorithm with the shared knobs around it, objective.py); ``check(cfg)`` refuses configurations an
algorithm cannot run, reading only traits, so nothing outside this package names an algorithm.
"""

from __future__ import annotations

import math
from dataclasses import replace

from rlpost import config
from rlpost.algorithms import core, turns
from rlpost.algorithms.cispo import CISPO
from rlpost.algorithms.dapo import DAPO
from rlpost.algorithms.distill import Distill
from rlpost.algorithms.dr_grpo import DrGRPO
from rlpost.algorithms.grpo import GRPO
from rlpost.algorithms.gspo import GSPO
from rlpost.algorithms.objective import Objective, old_logp_first
from rlpost.algorithms.ppo import PPO
from rlpost.algorithms.reinforce import Reinforce
from rlpost.algorithms.reinforce_pp import ReinforcePP
from rlpost.algorithms.rloo import RLOO
from rlpost.algorithms.wrappers import with_clip_cov, with_entropy_advantage, with_entropy_bonus, with_kl_cov, with_tis
from rlpost.types.errors import ConfigError
from rlpost.types.roles import Traits
from rlpost.wire import import_object

# In the order of docs/algorithms.md: the root, then each patch.
ALGORITHMS = {cls.name: cls for cls in (Reinforce, PPO, ReinforcePP, GRPO, RLOO, DAPO, DrGRPO, GSPO, CISPO, Distill)}

__all__ = ["ALGORITHMS", "Objective", "build", "check", "resolve", "traits", "needs_old_logp_first", "loss_takes_entropy"]
CONTRACT = ("traits", "from_config", "advantages", "loss")  # what an algorithm of your own must have (docs/algorithms.md)


def resolve(name: str) -> type:
    """The algorithm class algo.name names: a registry name, or your own by import path,
    'package.module:Class' or '/path/to/file.py:Class' (kept in config.yaml, so eval and --resume
    find it again), checked against the contract (CONTRACT, with Traits as its traits)."""
    if name in ALGORITHMS:
        return ALGORITHMS[name]
    if ":" not in name:
        raise ConfigError(f"algo.name: expected one of {', '.join(ALGORITHMS)}, or your own as 'module:Class', got {name!r}")
    try:
        cls = import_object(name, "Class")
    except Exception as e:  # the user's module: any error it raises on import is theirs to see
        raise ConfigError(f"algo.name: cannot import {name} ({type(e).__name__}: {e})") from None
    missing = [m for m in CONTRACT if not hasattr(cls, m)]
    if not isinstance(cls, type) or missing or not isinstance(cls.traits, Traits):
        raise ConfigError(f"algo.name: {name} is not an algorithm: expected a class with {', '.join(CONTRACT)} "
                          f"(traits a rlpost.types.roles.Traits){'; missing ' + ', '.join(missing) if missing else ''} "
                          "(docs/algorithms.md, your own algorithm)")
    return cls


def traits(cfg) -> Traits:
    """The traits of cfg.algo.name (which ``check`` has accepted)."""
    return resolve(cfg.algo.name).traits


def build(cfg) -> Objective:
    """The algorithm named by cfg.algo.name, its knobs from the config, with the shared knobs on."""
    check(cfg)
    a, r = cfg.algo, cfg.rollout
    if a.cov_control == "kl_cov":  # KL-Cov's surrogate is unclipped: its penalty is the trust region (wrappers.with_kl_cov)
        a = replace(a, clip_eps_low=math.inf, clip_eps_high=math.inf, dapo_clip_eps_high=math.inf)
    algo = resolve(a.name).from_config(replace(cfg, algo=a))
    loss = algo.loss
    if a.cov_control == "clip_cov":
        loss = with_clip_cov(loss, a.cov_ratio, a.clip_cov_lb, a.clip_cov_ub)
    elif a.cov_control == "kl_cov":
        loss = with_kl_cov(loss, a.cov_ratio, a.kl_cov_coef, loss_aggregator(cfg))
    if a.entropy_coef > 0:
        loss = with_entropy_bonus(loss, a.entropy_coef, loss_aggregator(cfg))
    if a.entropy_adv_coef > 0:  # outside the bonus: it hands the bonus the entropy
        loss = with_entropy_advantage(loss, a.entropy_adv_coef, a.entropy_adv_kappa, forward_entropy=a.entropy_coef > 0)
    cap = config.derived(cfg).tis_cap  # async runs get one by default: their samples are off-policy
    if cap > 0:
        loss = with_tis(loss, cap, a.tis_level)
    kl_control = core.AdaptiveKLController(a.kl_coef, a.kl_target, a.kl_horizon) if a.kl_target > 0 else None
    return Objective(algo, loss, a.prime_coef, r.group_size, a.overlong_filter, kl_control, cfg.task.turn_credit,
                     cfg.task.turn_discount)


def loss_aggregator(cfg) -> core.Aggregator:
    """How the algorithm aggregates its policy loss, so the terms added to it (the entropy bonus)
    weigh tokens the same way: its fixed aggregator if it has one (GSPO's per-sequence loss -> the
    sequence mean of token means, as its KL term), else algo.loss_agg."""
    fixed = traits(cfg).fixed_aggregator
    name = "seq_mean_token_mean" if fixed == "sequence" else fixed or cfg.algo.loss_agg
    return core.aggregator(name, cfg.rollout.max_new_tokens)


def loss_takes_entropy(cfg) -> bool:
    """Whether the loss reads the trainer's per-token entropy (the entropy bonus, the entropy-shaped advantage)."""
    return cfg.algo.entropy_coef > 0 or cfg.algo.entropy_adv_coef > 0


def needs_old_logp_first(cfg) -> bool:
    """Objective.old_logp_first from a config alone (the planner's view of the same rule)."""
    return old_logp_first(traits(cfg), cfg.algo.kl_coef, cfg.algo.kl_target > 0)


def check(cfg) -> None:
    """Refuse, with one line naming the key, what the chosen algorithm cannot run."""
    a, r, d = cfg.algo, cfg.rollout, config.derived(cfg)
    t = resolve(a.name).traits
    if t.group_baseline and r.group_size < 2:
        raise ConfigError(f"rollout.group_size: expected >= 2 for {a.name.upper()} (the baseline comes from the group), got {r.group_size}")
    if t.on_policy_only and (cfg.trainer.epochs > 1 or d.mini_batch_size < d.batch_size):
        raise ConfigError(f"trainer.epochs: {a.name.upper()} has no importance ratio, so it is on-policy only: "
                          "expected epochs=1 and mini_batch_size=0")
    if (r.filter_groups or t.filters_groups) and r.group_size < 2:
        raise ConfigError(f"rollout.filter_groups: needs group_size >= 2 (a group of one never has reward variance), got {r.group_size}")
    if t.kl == "none" and a.kl_coef > 0:
        raise ConfigError(f"algo.kl_coef: {a.name.upper()} has no KL term; use an algorithm with a KL in the reward or the loss")
    if t.teacher != bool(a.teacher):
        raise ConfigError(f"algo.teacher: {a.name.upper()} " + ("distils from a teacher: expected a model ('embedded', a model folder, "
                          "a run folder) with the student's tokenizer" if t.teacher else f"reads no teacher, got {a.teacher!r}; "
                          "use algo.name=distill"))
    if a.cov_control != "none" and not t.token_clip:
        raise ConfigError(f"algo.cov_control: Clip-Cov and KL-Cov act on PPO's token-level loss, which {a.name.upper()} does "
                          f"not have; expected none, or one of {', '.join(n for n, c in ALGORITHMS.items() if c.traits.token_clip)}")
    if a.cov_control == "kl_cov" and cfg.trainer.epochs == 1 and d.mini_batch_size >= d.batch_size:
        raise ConfigError("algo.cov_control=kl_cov: with one optimizer step per rollout batch (trainer.epochs=1, "
                          "trainer.mini_batch_size=0) every forward has log pi = log pi_old, so KL-Cov's penalty and its "
                          f"gradient are 0 and it would do nothing; set trainer.mini_batch_size below {d.batch_size} or "
                          "trainer.epochs >= 2, or use algo.cov_control=clip_cov")
    if a.dual_clip_c is not None and not t.token_clip:
        raise ConfigError(f"algo.dual_clip_c: {a.name.upper()} has no PPO token clip to cap; expected none, or one of "
                          f"{', '.join(n for n, c in ALGORITHMS.items() if c.traits.token_clip)}")
    why = turns.check(t, cfg.task.turn_credit)
    if why:
        raise ConfigError(f"task.turn_credit: turn with {a.name.upper()}: {why}")
    if ignored := ignored_knobs(cfg):
        key, readers = ignored[0]
        raise ConfigError(f"algo.{key}: algo.name={a.name} does not read it (read by {', '.join(readers)}); remove it"
                          + (f", or set algo.name={readers[0]}" if len(readers) == 1 else ""))
    if cfg.dist.trainer_ranks > 1 and t.needs_values:
        raise ConfigError(f"dist.trainer_ranks: the FSDP2 trainer shards the policy alone; expected 1 with a critic ({a.name})")


class _Reads:
    """Stands for a config while an algorithm's from_config runs: records the algo keys it reads."""

    def __init__(self, cfg):
        self._cfg, self.keys = cfg, set()
        outer = self

        class Algo:
            def __getattr__(self, key):
                outer.keys.add(key)
                return getattr(cfg.algo, key)
        self.algo = Algo()

    def __getattr__(self, name):
        return getattr(self._cfg, name)


def knobs_read(cls, cfg) -> set[str]:
    """The algo keys algorithm `cls` reads: what its from_config asks for (found by running it),
    less algo.loss_agg where its aggregation is fixed, plus the critic's keys where it has one."""
    reads = _Reads(cfg)
    cls.from_config(reads)
    keys = reads.keys - ({"loss_agg"} if cls.traits.fixed_aggregator else set())
    return keys | ({"critic", "critic_lr"} if cls.traits.needs_values else set())


def ignored_knobs(cfg) -> list[tuple[str, list[str]]]:
    """(key, the algorithms that read it) for every algo key set away from its default that another
    algorithm reads and cfg.algo.name does not: `rlpost train` refuses those, as sft, rm and dpo
    refuse keys they do not read, instead of running without them."""
    default = type(cfg.algo)()
    reads = {name: knobs_read(cls, cfg) for name, cls in ALGORITHMS.items()}
    mine = reads.get(cfg.algo.name)
    if mine is None:  # your own algorithm: what it reads is its business
        return []
    out = []
    for key in sorted(set().union(*reads.values()) - mine):
        if getattr(cfg.algo, key) != getattr(default, key):
            out.append((key, [name for name, keys in reads.items() if key in keys]))
    return out
