"""The role contracts: what the loop (``recipes/rl.py``) may call on each role, and nothing else.

A role is a small object with one or two verbs. Any object with these verbs can fill the role,
so a role moves behind a process boundary (a Ray actor: ``distributed/``) or swaps its engine
(transformers ``generate``, rlpost's own decode loop, a tool-episode wrapper) without the loop
changing. The loop asks no role what it is (no ``hasattr``, no ``isinstance``): what differs
between algorithms is declared once, in ``Traits``, on each algorithm's class.

Roles return values; the loop alone writes them into the batch. So a reader of the loop sees every
field of ``Rollouts`` being set, and no role changes another role's data behind its back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

from torch import Tensor

from rlpost.types.batch import Rollouts


class LossFn(Protocol):
    """What the trainer calls: ``loss_fn(logp (B, T), batch, values=, entropy=) -> (scalar loss, metrics)``.

    Named keyword inputs, not a bag of extras: ``values`` (B, T) is the critic's, None without one;
    ``entropy`` (B, T), with grad, where the loss reads it (the entropy bonus, the entropy-shaped
    advantage: ``ForwardPlan.loss_entropy``), else None. The trainer always passes both, so a loss says
    in its signature which it reads, a wrapper hands both on, and no input reaches a loss unnamed. An
    algorithm's own ``loss`` has the same signature (``Algorithm``)."""

    def __call__(self, logp: Tensor, batch: Rollouts, *, values: Tensor | None = None,
                 entropy: Tensor | None = None) -> tuple[Tensor, dict]: ...


@dataclass(frozen=True)
class Traits:
    """What an algorithm needs from the rest of the system, declared once on its class and read by
    the config check (``build.check_algorithm``), the loop (``algorithms.objective``) and the planner."""

    group_baseline: bool = False  # the baseline comes from the K samples of a prompt: group_size >= 2
    kl: Literal["loss", "reward", "none"] = "loss"  # where algo.kl_coef acts; 'none' = no KL term
    needs_values: bool = False  # a critic: values before the advantages (GAE), values= in the loss
    filters_groups: bool = False  # always drops groups without signal and refills (DAPO's dynamic sampling)
    fixed_aggregator: str = ""  # the loss aggregation is part of the algorithm (algo.loss_agg is not read)
    on_policy_only: bool = False  # no importance ratio: one optimizer step per rollout batch
    token_clip: bool = False  # PPO's clipped token ratio, which algo.dual_clip_c can cap (clipped_pg_loss)
    teacher: bool = False  # the reference role holds algo.teacher, whose log-probs make the advantages (distill)
    # advantages from per-token rewards (GAE, returns-to-go): a PRM's step rewards go in there
    token_rewards: bool = False
    state: tuple[str, ...] = ()  # fields that change during training and are saved in checkpoints


@dataclass
class Advantages:
    """What ``advantages(batch)`` returns; the loop writes these into the batch."""

    tokens: Tensor  # (B, T) float32, token-level advantage, 0 off the loss mask
    metrics: dict = field(default_factory=dict)
    returns: Tensor | None = None  # (B, T) float32, the critic's regression target (PPO)
    loss_mask: Tensor | None = None  # (B, T) bool, set when the loss drops sampled tokens (overlong filter)


class Rollout(Protocol):
    """Samples completions from the current policy and records the sampler's log-probs."""

    version: int  # trainer step of the weights it holds; stamped on every batch it returns
    last_metrics: dict  # what the last generate measured beyond the batch (tool calls, queue depth)

    def generate(self, rows: list[dict], n: int, temperature: float, top_p: float, max_new_tokens: int) -> Rollouts: ...

    def load_weights(self, state: Any, version: int | None = None) -> None: ...  # weight sync

    def sleep(self, discard_weights: bool = False) -> None: ...  # free sampling memory before the update

    def close(self) -> None: ...


class Verifier(Protocol):
    """Turns completions into rewards; never raises on a bad completion (it scores 0 and counts it)."""

    def score(self, batch: Rollouts) -> tuple[Tensor, list[dict], dict]: ...  # (B,) rewards, infos, metrics

    def close(self) -> None: ...


class Environment(Protocol):
    """A multi-turn task: one episode per row (``task.name=env task.env=module:Class``; docs/environments.md).

    The class is imported and instantiated (``Class(**task.env_args)``) only in environment worker
    processes (envs/worker.py), one object per episode; between calls the object is pickled and
    handed back, so any worker serves any episode and a worker killed for a hang loses only the
    call it was running. Keep what is heavy (a corpus index, a loaded library) at module level.

    reset(row)     the opening messages, chat messages ending with the user's turn (a string is one
                   user message). Sampling starts from them through the model's chat template.
    step(message)  the assistant's message ({"role": "assistant", "content": text, "tool_calls":
                   [...] when the text held them}) -> (messages, reward, done), or with a fourth
                   item, an info dict (``correct``: what held-out accuracy counts; ``tool_calls``:
                   how many tools this turn ran). ``messages`` is what the environment says next
                   (tool results, a game's reply, a user's turn; a string is one user message);
                   ``reward`` this turn's (may be 0); ``done`` ends the episode.

    Optional attributes, read after reset: ``tools`` (JSON schemas or Python functions, passed as
    ``apply_chat_template(..., tools=tools)``), ``style`` ('chat', the default: the environment's
    messages are chat turns; 'inline': their text is appended inside the assistant's turn, as
    Search-R1 and ReTool do) and ``stop`` (inline: strings that end a model turn, e.g.
    '</search>'). A method ``rows(split, n, seed)`` gives the task's rows ('train' or
    'heldout') when task.data gives none.

    An episode also ends at task.max_turns model turns or task.max_episode_tokens tokens. A call
    that raises, runs past task.env_timeout_s, kills its worker or returns something else than the
    above ends the episode with reward 0 and is counted (env/errors, env/timeouts)."""

    def reset(self, row: dict) -> list[dict] | str: ...

    def step(self, message: dict) -> tuple: ...  # (messages, reward, done) or (messages, reward, done, info)


class ProcessReward(Protocol):
    """A process reward model scoring each step of each completion (rewards/prm.py: StepRewards)."""

    def dense(self, batch: Rollouts) -> tuple[Tensor, Tensor]: ...  # step_reward (B, T) float32, step_end (B, T) bool

    def close(self) -> None: ...


class Reference(Protocol):
    """The frozen starting policy: per-token log-probs for the KL anchor."""

    def logprobs(self, batch: Rollouts) -> Tensor: ...  # (B, T)


class Algorithm(Protocol):
    """One file of ``algorithms/``: advantages from rewards, and a per-token loss."""

    traits: ClassVar[Traits]
    kl_coef: float  # weight of its KL term (0 = off); adaptive KL moves it
    needs_reference: bool  # reads batch.ref_logp (its KL term is on)

    def advantages(self, batch: Rollouts) -> Advantages: ...

    # a LossFn: (B, T) per-token log-probs -> (loss, metrics), values= and entropy= named (an algorithm of
    # yours may leave out what it does not read: algorithms.wrappers.with_named_inputs)
    def loss(self, logp: Tensor, batch: Rollouts, *, values: Tensor | None = None,
             entropy: Tensor | None = None) -> tuple[Tensor, dict]: ...


class Objective(Protocol):
    """What the loop calls for the algorithm role: an ``Algorithm`` with the shared knobs around
    it (``algorithms/objective.py``: PRIME, the overlong filter, entropy bonus, TIS, adaptive KL)."""

    algo: Algorithm
    traits: Traits  # the algorithm's (the loop reads filters_groups: DAPO's refill)
    loss: LossFn  # the algorithm's loss with the loss-side knobs wrapped around it
    needs_reference: bool
    old_logp_first: bool  # the trainer's old log-probs (and values) are needed before the advantages

    def advantages(self, batch: Rollouts) -> Advantages: ...

    def end_step(self, update_metrics: dict, adv_metrics: dict, n_samples: int) -> dict: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class Trainer(Protocol):
    """Forward, backward, optimizer step; knows nothing about which algorithm runs."""

    def update(self, batch: Rollouts, loss_fn: LossFn) -> dict: ...  # epochs x mini-batches; metrics

    def recompute(self, batch: Rollouts) -> tuple[Tensor, Tensor | None]: ...  # old_logp (B, T), old values or None

    def weights(self) -> Any: ...  # what weight sync sends (a state dict, or an object-store ref)

    def checkpoint_weights(self) -> dict[str, Tensor]: ...  # float32 master weights, for a checkpoint

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

    def close(self) -> None: ...


@dataclass
class Roles:
    """Every role of one run, built by ``build.build_roles`` and driven by the loop."""

    rollout: Rollout
    verifier: Verifier  # the training reward: the task's verifier, or a reward stack / model / judge
    reference: Reference | None  # None when nothing reads reference log-probs
    algo: Objective
    trainer: Trainer | None  # None when built for evaluation only
    grader: Verifier  # held-out accuracy: always the task's own verifier
    process_reward: ProcessReward | None = None  # dense step rewards (task.process_reward_model), else None

    def sampling_state(self) -> dict:
        """What a checkpoint keeps of the sampler besides its weights: a Ray pool's chunk count, as each
        chunk is seeded by its number (distributed/pool.py); nothing for a sampler in the process."""
        return {"rollout_chunks": self.rollout.next_id} if hasattr(self.rollout, "next_id") else {}

    def load_sampling_state(self, state: dict) -> None:
        """A resume: the pool numbers its chunks on from the checkpoint's count."""
        if "rollout_chunks" in state and hasattr(self.rollout, "next_id"):
            self.rollout.next_id = state["rollout_chunks"]

    def close(self) -> None:
        for role in (self.verifier, self.grader, self.rollout, self.trainer, self.process_reward):
            if role is not None:
                role.close()
