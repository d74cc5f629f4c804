"""The one object that crosses every role boundary.

The rollout creates a ``Rollouts``; the other roles return values and the loop
(``recipes/rl.py``) writes them in: ``reward`` from the verifier, ``ref_logp`` from the reference,
``old_logp`` (and ``old_values`` with a critic) from the trainer, ``advantages`` (and PPO's
``returns``) from the algorithm; the trainer consumes the rest, on copies. Fields are named and
typed, never positional tuples, so a role can move behind a process boundary by pickling this
object (every field is a tensor, a list or a number).

Shapes: B = sequences (prompts x group_size), P = padded prompt length, T = padded completion
length (<= max_new_tokens). Prompts are LEFT-padded so every prompt ends at column P-1 and every
completion starts at column P; completions are RIGHT-padded.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass
class Rollouts:
    # --- written by the rollout role ------------------------------------------------------------
    prompt_ids: Tensor  # (B, P) int64, chat-templated prompt tokens, left-padded
    prompt_mask: Tensor  # (B, P) bool, True on real prompt tokens
    completion_ids: Tensor  # (B, T) int64, sampled tokens, right-padded with pad_token_id
    completion_mask: Tensor  # (B, T) bool, True on tokens that get a loss: sampled, up to and incl. EOS
    sampler_logp: Tensor  # (B, T) float32, log pi_sampler(token) recorded at sampling time, under the distribution
    # actually sampled (top-p truncated and renormalised when top_p < 1); 0 on pad
    truncated: Tensor  # (B,) bool, True when the completion hit max_new_tokens without an EOS
    group_ids: Tensor  # (B,) int64, index of the prompt each row answers; a group's rows are contiguous
    rows: list[dict]  # B task rows (prompt messages, answer, metadata), repeated across each group
    completions: list[str]  # B decoded completions (special tokens dropped)
    policy_version: int = 0  # trainer step whose weights produced these samples (the oldest token's, below)
    # (B, T) int64 or None. Partial rollouts (dist.partial_rollouts): the weight version that drew
    # each token, 0 on pad; a row may span several when its worker took new weights mid-row.
    # None = every token is policy_version's.
    token_version: Tensor | None = None
    # (B, T) float32 or None. With rollout.top_p < 1: log pi_sampler (full softmax) of the least
    # likely token the sampler kept at each position, i.e. its truncation threshold. Every later
    # log-prob of this batch (trainer, old, reference) keeps the same tokens: those at or above it,
    # plus the sampled one (model/logprobs.py). None = the full softmax was sampled (top_p = 1).
    sampler_floor: Tensor | None = None
    # Environment episodes (roles/rollout_env.py), None elsewhere: each turn's last model token,
    # and the environment's reward for that turn on it (0 elsewhere); the credit rules read them
    # (algorithms/turns.py). ``episodes``: per row, what its episode did (turns, turn rewards, tool
    # calls, why it stopped, an environment error), read by the episode scorer (rewards/episodes.py).
    turn_end: Tensor | None = None  # (B, T) bool
    turn_reward: Tensor | None = None  # (B, T) float32
    episodes: list[dict] = field(default_factory=list)
    # --- written by later roles ----------------------------------------------------------------
    reward: Tensor | None = None  # (B,) float32, sequence-level reward from the verifier
    ref_logp: Tensor | None = None  # (B, T) float32, frozen reference log-probs (KL anchor)
    old_logp: Tensor | None = None  # (B, T) float32, trainer log-probs under the sampling weights
    advantages: Tensor | None = None  # (B, T) float32, token-level advantage (0 where mask is 0)
    old_values: Tensor | None = None  # (B, T) float32, critic's V(prefix) under the sampling weights (PPO)
    returns: Tensor | None = None  # (B, T) float32, the critic's regression target (PPO: GAE advantage + V)
    # With a process reward model (task.process_reward_model): its dense reward on each step's last
    # loss token (algo.process_reward_coef x the step's score, or its change), 0 elsewhere; and
    # where the steps end. The algorithm turns them into advantages (objective.py). None = no PRM.
    step_reward: Tensor | None = None  # (B, T) float32
    step_end: Tensor | None = None  # (B, T) bool, True on each step's last loss token
    # --- loss normalisers, set by the trainer when it slices micro-batches ----------------------
    # Totals over the optimizer mini-batch this slice belongs to. Aggregators divide by these, so
    # summing micro-batch losses reproduces the full mini-batch loss exactly (accumulation
    # invariance). None = this object is the whole mini-batch.
    norm_tokens: float | None = None
    norm_seqs: int | None = None
    infos: list[dict] = field(default_factory=list)  # B verifier info dicts

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    @property
    def device(self) -> torch.device:
        """Where the batch's tensors are: the rollout makes it on the host, each role moves it in."""
        return self.completion_ids.device

    def to(self, device: torch.device | str) -> "Rollouts":
        """The same batch with every tensor on ``device`` (a role moving a batch onto its model's
        device on entry); the batch itself when it is already there, so the CPU path copies nothing."""
        if self.device == torch.device(device):
            return self
        moved = {f.name: getattr(self, f.name).to(device) for f in fields(self)
                 if isinstance(getattr(self, f.name), Tensor)}
        return replace(self, **moved)

    @property
    def loss_tokens(self) -> float:
        return self.norm_tokens if self.norm_tokens is not None else float(self.completion_mask.sum())

    @property
    def loss_seqs(self) -> int:
        return self.norm_seqs if self.norm_seqs is not None else len(self)

    def input_ids(self) -> Tensor:  # (B, P+T) int64
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    def attention_mask(self) -> Tensor:  # (B, P+T) int64
        # Completion columns stay 1 after EOS, as in `generate`: those positions come after every
        # loss token, so under causal attention they cannot influence any loss term.
        ones = torch.ones_like(self.completion_ids)
        return torch.cat([self.prompt_mask.long(), ones], dim=1)

    def select(self, idx: Tensor | slice) -> "Rollouts":
        """Rows `idx` of every per-row field; scalars and normalisers are kept."""
        if isinstance(idx, slice):
            idx = torch.arange(len(self))[idx]
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Tensor):
                out[f.name] = v[idx]
            elif isinstance(v, list) and len(v) == len(self):
                out[f.name] = [v[i] for i in idx.tolist()]
            else:
                out[f.name] = v
        return replace(self, **out)

    def trimmed(self) -> "Rollouts":
        """The same rows without all-padding columns: leading prompt columns no row uses and
        trailing completion columns after every row's last loss token. The forward then costs the
        micro-batch's own lengths, not the whole batch's (length-bucketed micro-batches)."""
        P = int(self.prompt_mask.any(0).long().argmax()) if self.prompt_mask.any() else 0  # first used column
        T = int(self.completion_mask.any(0).nonzero().max()) + 1 if self.completion_mask.any() else 1
        if P == 0 and T == self.completion_ids.shape[1]:
            return self
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Tensor) and v.dim() == 2:
                out[f.name] = v[:, P:] if f.name.startswith("prompt_") else v[:, :T]
        return replace(self, **out)

    def length_order(self) -> Tensor:  # (B,) int64
        """Row order that puts groups of similar length together: groups sorted by their longest
        completion, each group's rows kept contiguous (so the shared prompt prefix still applies)."""
        lengths = self.completion_mask.sum(1)  # (B,)
        _, row_to_group = torch.unique_consecutive(self.group_ids, return_inverse=True)
        longest = torch.zeros(int(row_to_group.max()) + 1 if len(self) else 0, dtype=lengths.dtype,
                              device=lengths.device)
        longest.scatter_reduce_(0, row_to_group, lengths, reduce="amax")
        # A stable sort on the group's length keeps each group's rows contiguous and in order.
        return torch.sort(longest[row_to_group], stable=True).indices

    @staticmethod
    def cat(parts: list["Rollouts"]) -> "Rollouts":
        """Rows of several batches as one (DAPO's refill). Prompts are re-padded on the left and
        completions on the right (pad id 0: padded positions are masked out or come after every
        loss token); group ids are renumbered so groups stay distinct and contiguous."""
        P = max(p.prompt_ids.shape[1] for p in parts)
        T = max(p.completion_ids.shape[1] for p in parts)
        out, offset, gids = {}, 0, []
        for p in parts:
            gids.append(p.group_ids - p.group_ids.min() + offset if len(p) else p.group_ids)
            offset = int(gids[-1].max()) + 1 if len(p) else offset
        for f in fields(Rollouts):
            vals = [getattr(p, f.name) for p in parts]
            if f.name == "group_ids":
                out[f.name] = torch.cat(gids)
            elif isinstance(vals[0], Tensor) and vals[0].dim() == 2:
                left = f.name.startswith("prompt_")
                width = P if left else T
                out[f.name] = torch.cat([F.pad(v, (width - v.shape[1], 0) if left else (0, width - v.shape[1]))
                                         for v in vals])
            elif isinstance(vals[0], Tensor):
                out[f.name] = torch.cat(vals)
            elif isinstance(vals[0], list):
                out[f.name] = [x for v in vals for x in v]
            else:  # scalars: the oldest policy version; normalisers reset
                out[f.name] = min(vals) if f.name == "policy_version" else None
        return Rollouts(**out)
