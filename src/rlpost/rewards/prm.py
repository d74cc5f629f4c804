"""Process reward models (PRMs) trained on Monte-Carlo step labels, as in Math-Shepherd
(Wang et al. 2023, arXiv:2312.08935), with an outcome reward model (ORM) from the same code.

Why a PRM: an outcome verifier says whether a finished solution is right; a PRM says, after each
step, how likely the solution is to end up right from there. That lets a search drop bad
partial solutions early (step-level beam search, recipes/search.py) and judge a finished one by its
weakest step rather than by its last line.

What this file implements, exactly:
1. Steps. A solution's steps are its lines. A step ends at the token whose text contains a
   newline; a blank line is not a step of its own (it joins the next one), and whatever follows
   the last newline (the final line, EOS) belongs to the last step, so the last step always ends
   at the final token. That is where the ORM reads its score too (like `rlpost rm`), so an ORM and
   the `last` aggregate of a PRM look at the same position.
2. Labels (Math-Shepherd's soft "SE" estimate). For each sampled solution and each step but the
   last, M continuations are sampled from the prefix up to that step's end, with the same policy,
   temperature and total token cap as the solution; the label is the mean verifier score of the
   M completed solutions (the fraction correct for a 0/1 verifier), an MC estimate of
   P(correct | prefix). The last step's label is the solution's own score: it is already complete.
   All continuations of a batch go through `HFRollout.sample_ids` in chunks, not one call per prefix.
3. Model and loss. LM trunk + a zero-initialised scalar head (``Critic(lm, "shared")``, as the
   Bradley-Terry RM and PPO's critic). Loss: BCE-with-logits between the head's output and the
   label, only at labelled positions (step ends for a PRM, the final token for an ORM with the 0/1
   outcome), averaged over those positions. One training function serves both; only the
   (positions, targets) of each example differ.
4. Scores. sigmoid(head) at each step end; a solution's score aggregates them: ``agg_min``
   (Math-Shepherd, the default), ``agg_last`` (the value of the whole solution; the ORM's score)
   or ``agg_prod`` (Lightman et al. 2023's product of step correctness).

This file holds the scorer (steps, aggregates, ``ProcessRewardModel``); the labelling and the
training loop are a recipe (``recipes/prm.py``), and the loss is ``algorithms/preference.py:
bce_at_positions``. Training reuses ``Trainer`` (roles/trainer.py): it already does micro-batches with exact gradient
accumulation, bf16 autocast over float32 weights, fused AdamW with the head in its own lr group,
clipping, and the shared-prompt-prefix forward (the N solutions of a problem share one prompt).
A PRM batch is an ordinary ``Rollouts`` whose ``completion_mask`` is True on the labelled
positions only (the documented meaning: "tokens that get a loss") and whose ``returns`` holds the
targets ("the critic's regression target"), so the trainer's mini-batch token total is exactly
the number of labels and ``core.token_mean`` normalises by it. The cost of reuse: the trainer's
forward also computes the LM's log-probs (the lm_head and a log-softmax over the vocabulary at the
completion positions only, not at the prompt's), which this loss ignores; not measured separately.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import torch
from safetensors.torch import load_file

from rlpost.model import device, precision
from rlpost.model.device import CPU
from rlpost.model.encode import make_batch, unpadded
from rlpost.model.load import load_policy, save_model
from rlpost.model.logprobs import completion_values
from rlpost.roles.critic import Critic
from rlpost.types.batch import Rollouts

# --- steps -------------------------------------------------------------------------------------


def token_texts(tok, ids: Sequence[int]) -> list[str]:
    """Each token's own text (special tokens -> ''), to find the ones that end a line."""
    return tok.batch_decode([[i] for i in ids], skip_special_tokens=True)


def step_ends(texts: Sequence[str]) -> list[int]:
    """Index of the last token of each step (see the module docstring, point 1)."""
    ends: list[int] = []
    has_text = False  # the current step holds something other than whitespace
    for k, t in enumerate(texts):
        if "\n" not in t:
            has_text = has_text or bool(t.strip())
            continue
        before, after = t.split("\n", 1)[0], t.rsplit("\n", 1)[1]
        if has_text or before.strip():  # a blank line ends nothing: it joins the next step
            ends.append(k)
        has_text = bool(after.strip())  # text after the newline (rare in BPE) opens the next step
    last = len(texts) - 1
    if last < 0 or (ends and ends[-1] == last):
        return ends
    if ends and not has_text:  # only whitespace / EOS after the last newline: the last step absorbs it
        ends[-1] = last
    else:
        ends.append(last)
    return ends


# --- scoring -----------------------------------------------------------------------------------


def agg_min(scores: Sequence[float]) -> float:
    return min(scores) if scores else 0.0


def agg_last(scores: Sequence[float]) -> float:
    return scores[-1] if scores else 0.0


def agg_prod(scores: Sequence[float]) -> float:
    return math.prod(scores) if scores else 0.0


class ProcessRewardModel:
    """Scores solutions step by step: sigmoid of the head at each step end. The same class holds an
    ORM (a head trained on outcomes); score it with ``agg_last``."""

    def __init__(self, lm: torch.nn.Module, head: Critic, tokenizer, micro_batch_size: int = 32,
                 autocast_bf16: bool | None = None):
        """autocast_bf16: score under bf16 autocast; None = what the probe chose (model/precision.py)."""
        self.lm, self.head, self.tok = lm.eval(), head.eval(), tokenizer
        self.device = device.of(lm)  # where the caller put it (run.device); the head sits beside the trunk
        self.micro = micro_batch_size
        self.autocast_bf16 = precision.trainer_bf16("auto") if autocast_bf16 is None else autocast_bf16

    @torch.no_grad()
    def scored_steps(self, prompts: list[list[int]],
                     completions: list[list[int]]) -> list[tuple[list[int], list[float]]]:
        """(index of each step's last token, P(correct) there) of each (prompt, completion)."""
        ctx = precision.autocast(self.autocast_bf16, self.device)
        out = []
        for i in range(0, len(prompts), self.micro):
            p, c = prompts[i:i + self.micro], completions[i:i + self.micro]
            batch = make_batch(p, c, self.tok.pad_token_id).to(self.device)
            with ctx:
                values = completion_values(self.lm.get_decoder(), self.head.head, batch)  # (b, T)
            prob = values.float().sigmoid()  # (b, T)
            for j, cj in enumerate(c):
                ends = step_ends(token_texts(self.tok, cj))
                out.append((ends, prob[j, ends].tolist()))
        return out

    def step_scores(self, prompts: list[list[int]], completions: list[list[int]]) -> list[list[float]]:
        """P(correct) at each step end of each (prompt, completion)."""
        return [scores for _, scores in self.scored_steps(prompts, completions)]

    def score(self, prompts: list[list[int]], completions: list[list[int]], aggregate=agg_min) -> list[float]:
        """One number per solution: ``aggregate`` of its step scores (``prm_score``)."""
        return [aggregate(s) for s in self.step_scores(prompts, completions)]

    def score_rollouts(self, batch: Rollouts, aggregate=agg_min) -> list[float]:
        return self.score(*unpadded(batch), aggregate=aggregate)

    def save(self, folder: str | Path) -> Path:
        """A transformers folder + value_head.safetensors, as `rlpost rm` writes (offline.save_model)."""
        return save_model(self.lm, self.tok, Path(folder), self.head.head)

    @classmethod
    def load(cls, folder: str | Path, device: torch.device | str = CPU, **kw) -> "ProcessRewardModel":
        loaded = load_policy(str(folder))
        loaded.model.to(device)
        head = Critic(loaded.model, "shared")
        head.head.load_state_dict(load_file(Path(folder) / "value_head.safetensors"))
        return cls(loaded.model.float(), head, loaded.tokenizer, **kw)


# --- dense rewards for RL (task.process_reward_model) ------------------------------------------


def step_rewards(scores: Sequence[float], form: str) -> list[float]:
    """The reward of each step from the PRM's scores s_1..s_n of one completion.

    score  r_k = s_k: Math-Shepherd's step-by-step PPO (Wang et al. 2023) and DeepSeekMath's process
           supervision (Shao et al. 2024) reward each step with its score.
    delta  r_k = s_k - s_(k-1), s_0 = 0: the step's progress (Setlur et al. 2024, arXiv:2410.08146),
           potential-based shaping (Ng et al. 1999). The rewards of a completion sum to its last
           score however many steps it takes, so splitting an answer into more lines earns nothing."""
    if form == "score":
        return list(scores)
    return [s - p for s, p in zip(scores, [0.0, *scores[:-1]])]


class StepRewards:
    """The process-reward role of an RL run: a PRM's step rewards, times ``coef``, on each step's
    last loss token (``Rollouts.step_reward`` / ``step_end``; the algorithm's side is
    ``wrappers.with_process_reward``). The PRM reads each completion whole, a tool's observations
    included; a step that ends inside an observation gets its reward on the model's last token before it."""

    def __init__(self, prm: ProcessRewardModel, coef: float = 1.0, form: str = "score"):
        self.prm, self.coef, self.form = prm, coef, form

    def dense(self, batch: Rollouts) -> tuple[torch.Tensor, torch.Tensor]:
        mask = batch.completion_mask  # (B, T)
        B, T = mask.shape
        # (B,) up to the last loss token
        length = torch.where(mask.any(1), (mask.long().cumsum(1) * mask).argmax(1) + 1, 0)
        prompts = unpadded(batch)[0]
        completions = [batch.completion_ids[j, :n].tolist() for j, n in enumerate(length.tolist())]
        reward, ends = torch.zeros(B, T), torch.zeros(B, T, dtype=torch.bool)
        for j, (at, scores) in enumerate(self.prm.scored_steps(prompts, completions)):
            loss_cols = mask[j].nonzero().squeeze(1)  # (n_loss,)
            if not at or not len(loss_cols):
                continue
            k = torch.searchsorted(loss_cols, torch.tensor(at), right=True) - 1  # last loss token at or before each end
            cols, r = loss_cols[k.clamp(min=0)], torch.tensor(step_rewards(scores, self.form)) * self.coef
            keep = k >= 0  # a step ending before the first loss token (none today) has nowhere to go
            reward[j].index_put_((cols[keep],), r[keep], accumulate=True)
            ends[j, cols[keep]] = True
        return reward, ends

    def close(self) -> None:
        pass
