"""The one place where roles are assembled from a config.

``build_roles`` loads the policy once and gives each role what it needs: the sampler and the
reference are copies of it, the trainer keeps the float32 master weights. Under
``dist.topology=disaggregated|async`` the sampler and the trainer are Ray actors instead
(``distributed/``), built by the same ``make_rollout`` / ``make_trainer`` inside the actors; the
``Roles`` returned have the same verbs, so the loop does not change.

Which role exists follows from the algorithm's traits (a critic for ``needs_values``, a
reference when something reads reference log-probs), never from its name.
"""

from __future__ import annotations

import copy

import torch

from rlpost import algorithms, config
from rlpost.console import say
from rlpost.envs import Task, verifier_timeout
from rlpost.model import lora
from rlpost.model.load import load_policy
from rlpost.model.precision import DTYPES
from rlpost.rewards.judge import Judge
from rlpost.rewards.reward_model import load_reward_model
from rlpost.rewards.runner import VerifierRunner
from rlpost.rewards.stack import RewardStack, part_name
from rlpost.roles.critic import Critic
from rlpost.roles.reference import Reference
from rlpost.roles.rollout_fast import build_rollout
from rlpost.roles.rollout_tools import ToolRollout
from rlpost.roles.trainer import Trainer
from rlpost.types.errors import ConfigError
from rlpost.types.roles import Roles, Verifier


def check(cfg: config.Config) -> config.Config:
    """Everything ``config.load`` cannot check alone: what the chosen algorithm can run. Returns
    cfg, so ``build.check(config.load(...))`` reads as one step."""
    algorithms.check(cfg)
    return cfg


def build_roles(cfg: config.Config, task: Task, weights: dict | None = None, for_eval: bool = False,
                stream=None, rollout_worker=None) -> Roles:
    """The roles of one run. ``weights``: a checkpoint's policy weights (the reference is still the
    starting policy). ``for_eval`` builds only what held-out evaluation needs: the sampler and the
    task's verifier. ``stream``: the prompt stream an async rollout pool reads ahead from.
    ``rollout_worker``: the Ray actor class of a rollout worker (tests inject faults with it)."""
    algo = algorithms.build(cfg)
    if cfg.dist.topology != "colocated" and not for_eval:
        return _remote_roles(cfg, task, algo, weights, stream, rollout_worker)
    loaded = load_policy(cfg.model.name, dtype=torch.float32, seed=cfg.run.seed)
    # The reference is the *starting* policy: copy it before any checkpoint weights are loaded.
    reference = make_reference(cfg, loaded.model) if algo.needs_reference and not for_eval else None
    use_lora = cfg.model.lora_r > 0 and not for_eval
    # With LoRA the base stays the pretrained model: a checkpoint's merged weights would count the
    # adapters twice once the trainer loads them back (model/lora.py).
    if weights is not None and not use_lora:
        loaded.model.load_state_dict(weights)
    rollout = make_rollout(cfg, copy.deepcopy(loaded.model), loaded.tokenizer)
    trainer = make_trainer(cfg, loaded.model, use_lora) if not for_eval else None
    grader = VerifierRunner(task.verifier, verifier_timeout(cfg))
    reward = grader if for_eval else build_reward(cfg, grader)
    return Roles(rollout, reward, reference, algo, trainer, grader=grader)


def make_reference(cfg: config.Config, model: torch.nn.Module) -> Reference:
    """A frozen copy of `model` that gives reference log-probs."""
    return Reference(copy.deepcopy(model), cfg.rollout.temperature, config.derived(cfg).micro_batch_size,
                     cfg.trainer.autocast_bf16, cfg.trainer.share_prompt_prefix)


def make_rollout(cfg: config.Config, model: torch.nn.Module, tokenizer):
    """The sampler over `model` (which it casts to rollout.dtype): own decode loop or `generate`,
    wrapped in tool episodes for the tools task."""
    rollout = build_rollout(cfg.rollout.engine, model, tokenizer, DTYPES[cfg.rollout.dtype])
    if cfg.task.name == "tools":  # multi-turn episodes: same generate() contract, tool calls inside
        rollout = ToolRollout(rollout, cfg.task)
    return rollout


def make_trainer(cfg: config.Config, model: torch.nn.Module, use_lora: bool, **kwargs) -> Trainer:
    """The trainer over `model` (float32 master weights), with a critic when the algorithm needs
    values and LoRA adapters when model.lora_r > 0; kwargs go to Trainer (e.g. data_parallel)."""
    d = config.derived(cfg)
    critic = Critic(model, cfg.algo.critic) if algorithms.traits(cfg).needs_values else None
    return Trainer(
        lora.wrap(model, cfg.model, cfg.run.seed) if use_lora else model, cfg.trainer, cfg.rollout.temperature,
        d.mini_batch_size, d.micro_batch_size, d.optimizer_steps, cfg.model.gradient_checkpointing, critic=critic,
        critic_lr=cfg.algo.critic_lr, entropy_grad=cfg.algo.entropy_coef > 0, **kwargs,
    )


def build_reward(cfg: config.Config, verifier: Verifier) -> Verifier:
    """What training optimises: the verifier alone, or a stack of the parts the config names.

    Parts: each of task.reward_funcs (weights task.reward_weights), the reward model
    (task.reward_model), the judge (task.judge_model, weight task.judge_weight). With none of
    them the verifier is the reward; name the verifier in task.reward_funcs to stack it too."""
    t = cfg.task
    funcs = [f.strip() for f in t.reward_funcs.split(",") if f.strip()]
    weights = [float(w) for w in t.reward_weights.split(",")] if t.reward_weights else [1.0] * len(funcs)
    parts = [(part_name(f), VerifierRunner(f, verifier_timeout(cfg)), w) for f, w in zip(funcs, weights)]
    if t.reward_model:
        scorer = load_reward_model(t.reward_model, config.derived(cfg).micro_batch_size, cfg.trainer.autocast_bf16)
        parts.append(("reward_model", scorer, 1.0))
    if t.judge_model:
        parts.append(("judge", Judge.from_config(cfg), t.judge_weight))
    if not parts:
        return verifier
    if len(parts) == 1 and parts[0][2] == 1.0 and not funcs:
        return parts[0][1]  # a reward model or judge alone: no stack needed
    return RewardStack(parts)


def _remote_roles(cfg: config.Config, task: Task, algo, weights: dict | None, stream, rollout_worker) -> Roles:
    """Rollout workers and trainer ranks as Ray actors; the verifier, the reference and the
    algorithm stay in the driver (they are light, or a subprocess pool already)."""
    try:
        from rlpost.distributed import topology
    except ImportError as e:  # Ray is an extra: say how to get it, in one line
        raise ConfigError(f"dist.topology: {cfg.dist.topology} runs on Ray ({e}); pip install 'rlpost[dist]'") from None
    rollout, trainer = topology.place(cfg, weights, make_rollout, make_trainer, stream, rollout_worker, say)
    # The reference is the starting policy, so a fresh load is it (checkpoint weights never go in).
    reference = make_reference(cfg, load_policy(cfg.model.name, seed=cfg.run.seed).model) if algo.needs_reference else None
    grader = VerifierRunner(task.verifier, verifier_timeout(cfg))
    return Roles(rollout, build_reward(cfg, grader), reference, algo, trainer, grader=grader)
