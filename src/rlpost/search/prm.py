"""Process reward models (PRMs) trained on Monte-Carlo step labels, as in Math-Shepherd
(Wang et al. 2023, arXiv:2312.08935), with an outcome reward model (ORM) from the same code.

Why a PRM: an outcome verifier says whether a finished solution is right; a PRM says, after each
step, how likely the solution is to end up right from there. That lets a search drop bad
partial solutions early (step-level beam search, search/beam.py) and judge a finished one by its
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

Training reuses ``Trainer`` (roles/trainer.py): it already does micro-batches with exact gradient
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
import random
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import Tensor

from rlpost.algorithms import core
from rlpost.batch import Rollouts
from rlpost.logprobs import completion_values
from rlpost.models import load_policy
from rlpost.roles.critic import Critic
from rlpost.roles.trainer import Trainer
from rlpost.sections import TrainerConfig

Verifier = Callable[[str, dict], tuple[float, dict]]  # (completion, row) -> (score, info), as envs/*.score


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


# --- Monte-Carlo labels ------------------------------------------------------------------------


@dataclass
class LabelledSolution:
    prompt_ids: list[int]  # chat-templated prompt tokens, unpadded
    completion_ids: list[int]  # the sampled solution, up to and including EOS
    step_ends: list[int]  # index into completion_ids of each step's last token
    labels: list[float]  # per step: mean verifier score of its M continuations (last step: the outcome)
    outcome: float  # verifier score of the solution itself
    row: dict  # the task row it answers
    continuations: list[list[str]] = field(default_factory=list)  # per step but the last: M completed texts
    label_tokens: int = 0  # tokens sampled to label this solution (its continuations)


def mc_step_labels(rollout, rows: list[dict], verifier_fn: Verifier, n_solutions: int, m_rollouts: int,
                   max_new_tokens: int, temperature: float, top_p: float = 1.0,
                   chunk: int = 64) -> list[LabelledSolution]:
    """Sample ``n_solutions`` per row and label every step by ``m_rollouts`` continuations."""
    batch = rollout.generate(rows, n_solutions, temperature, top_p, max_new_tokens)
    return label_solutions(rollout, batch, verifier_fn, m_rollouts, max_new_tokens, temperature, top_p, chunk)


def label_solutions(rollout, batch: Rollouts, verifier_fn: Verifier, m_rollouts: int, max_new_tokens: int,
                    temperature: float, top_p: float = 1.0, chunk: int = 64) -> list[LabelledSolution]:
    """Math-Shepherd labels for the solutions of ``batch`` (module docstring, point 2)."""
    tok = rollout.tok
    prompts, completions = unpadded(batch)
    sols = []
    for p, c, text, row in zip(prompts, completions, batch.completions, batch.rows):
        ends = step_ends(token_texts(tok, c))
        outcome = float(verifier_fn(text, row)[0])
        sols.append(LabelledSolution(p, c, ends, [0.0] * (len(ends) - 1) + [outcome] if ends else [], outcome, row,
                                     [[] for _ in ends[:-1]]))
    # One job per (solution, step but the last, continuation); sorted by prefix length so a chunk
    # shares a similar token budget and little left padding.
    jobs = [(i, k) for i, s in enumerate(sols) for k in range(len(s.step_ends) - 1) for _ in range(m_rollouts)]
    jobs.sort(key=lambda j: sols[j[0]].step_ends[j[1]])
    for start in range(0, len(jobs), chunk):
        part = jobs[start:start + chunk]
        prefix = [sols[i].completion_ids[: sols[i].step_ends[k] + 1] for i, k in part]
        budget = [max_new_tokens - len(x) for x in prefix]  # the solution's own cap, minus the prefix
        outs = rollout.sample_ids([sols[i].prompt_ids + x for (i, _), x in zip(part, prefix)],
                                  temperature, top_p, max(budget), [])
        for (i, k), x, b, (new, _, _) in zip(part, prefix, budget, outs):
            text = tok.decode(x + new[:b], skip_special_tokens=True)
            sols[i].continuations[k].append(text)
            sols[i].labels[k] += float(verifier_fn(text, sols[i].row)[0])  # a sum here, a mean below
            sols[i].label_tokens += len(new)
    for s in sols:
        s.labels[:-1] = [x / m_rollouts for x in s.labels[:-1]]
    return sols


# --- batches and the loss ----------------------------------------------------------------------


@dataclass
class Example:
    """One sequence and the targets of the head at some of its completion positions."""

    prompt_ids: list[int]
    completion_ids: list[int]
    positions: list[int]  # completion indices that get a loss
    targets: list[float]  # target probability at each position


def process_examples(sols: list[LabelledSolution]) -> list[Example]:
    """PRM data: the soft MC label at every step end."""
    return [Example(s.prompt_ids, s.completion_ids, s.step_ends, s.labels) for s in sols if s.step_ends]


def outcome_examples(sols: list[LabelledSolution]) -> list[Example]:
    """ORM data: the 0/1 outcome at the final token only."""
    return [Example(s.prompt_ids, s.completion_ids, [len(s.completion_ids) - 1], [s.outcome]) for s in sols
            if s.completion_ids]


def unpadded(batch: Rollouts) -> tuple[list[list[int]], list[list[int]]]:
    """(prompt ids, completion ids up to and incl. EOS) of each row, without padding."""
    prompts = [p[m].tolist() for p, m in zip(batch.prompt_ids, batch.prompt_mask)]
    return prompts, [c[m].tolist() for c, m in zip(batch.completion_ids, batch.completion_mask)]


def make_batch(prompts: list[list[int]], completions: list[list[int]], pad_id: int,
               positions: list[list[int]] | None = None, targets: list[list[float]] | None = None) -> Rollouts:
    """A ``Rollouts`` for the head: prompts left-padded, completions right-padded. completion_mask is
    True on ``positions`` when given (the labelled tokens), else on every completion token; returns
    holds the targets (0 elsewhere). Consecutive rows with the same prompt share a group id, so the
    forward runs that prompt once (logprobs.py, shared prefix)."""
    B, P, T = len(prompts), max(map(len, prompts)), max(1, max(map(len, completions)))
    prompt_ids = torch.full((B, P), pad_id)  # (B, P)
    prompt_mask = torch.zeros(B, P, dtype=torch.bool)  # (B, P)
    completion_ids = torch.full((B, T), pad_id)  # (B, T)
    mask = torch.zeros(B, T, dtype=torch.bool)  # (B, T)
    returns = torch.zeros(B, T)  # (B, T) float32
    group, groups = -1, []
    for i, (p, c) in enumerate(zip(prompts, completions)):
        prompt_ids[i, P - len(p):], prompt_mask[i, P - len(p):] = torch.tensor(p), True
        completion_ids[i, :len(c)] = torch.tensor(c, dtype=torch.long)
        where = positions[i] if positions is not None else list(range(len(c)))
        mask[i, where] = True
        if targets is not None:
            returns[i, positions[i]] = torch.tensor(targets[i], dtype=torch.float32)
        group += int(i == 0 or p != prompts[i - 1])
        groups.append(group)
    return Rollouts(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=completion_ids,
                    completion_mask=mask, sampler_logp=torch.zeros(B, T), truncated=torch.zeros(B, dtype=torch.bool),
                    group_ids=torch.tensor(groups), rows=[{} for _ in range(B)], completions=["" for _ in range(B)],
                    returns=returns if targets is not None else None)


def bce_at_positions(values: Tensor, batch: Rollouts, aggregate=core.token_mean) -> tuple[Tensor, dict]:
    """BCE-with-logits of the head's logits ``values`` (B, T) against ``batch.returns`` (B, T), on
    ``batch.completion_mask`` only; ``aggregate`` divides by the mini-batch's label count by default."""
    mask = batch.completion_mask  # (B, T) bool, the labelled positions
    per_pos = F.binary_cross_entropy_with_logits(values, batch.returns, reduction="none")  # (B, T)
    loss = aggregate(per_pos, mask, batch.loss_tokens, batch.loss_seqs)  # ()
    with torch.no_grad():
        prob = values.sigmoid()  # (B, T)
        agree = ((prob > 0.5) == (batch.returns > 0.5)).float()  # (B, T) thresholded agreement
        metrics = {"prm/bce": core.masked_mean(per_pos, mask).item(),
                   "prm/acc@0.5": core.masked_mean(agree, mask).item(),
                   "prm/prob_mean": core.masked_mean(prob, mask).item()}
    return loss, metrics


# --- training ----------------------------------------------------------------------------------


def train_value_head(lm: torch.nn.Module, examples: list[Example], pad_id: int, *, epochs: int = 2,
                     batch_size: int = 16, lr: float = 1e-5, head_lr: float = 1e-3, micro_batch_size: int = 16,
                     autocast_bf16: bool = True, seed: int = 0, aggregate=core.token_mean) -> tuple[Critic, list[dict]]:
    """Fit trunk + head to the examples' targets with ``bce_at_positions`` (a PRM or an ORM,
    depending on the examples); returns the head (the trunk is ``lm``, trained in place) and
    one metrics dict per optimizer step."""
    head = Critic(lm, "shared")
    steps = epochs * math.ceil(len(examples) / batch_size)
    tcfg = TrainerConfig(lr=lr, autocast_bf16=autocast_bf16, micro_batch_size=micro_batch_size,
                         share_prompt_prefix=True)
    trainer = Trainer(lm, tcfg, 1.0, batch_size, micro_batch_size, steps, critic=head, critic_lr=head_lr)

    def loss_fn(logp: Tensor, batch: Rollouts, values: Tensor) -> tuple[Tensor, dict]:
        return bce_at_positions(values, batch, aggregate)  # the LM's log-probs play no part

    # Shuffle problems, not solutions: a problem's solutions stay together in a mini-batch, so the
    # shared-prefix forward reads its prompt once for all of them (with N=4 solutions of ~23 tokens
    # after a ~127-token prompt, ~2.5x fewer tokens than a batch of 16 different problems).
    by_prompt: dict[tuple, list[int]] = {}
    for i, e in enumerate(examples):
        by_prompt.setdefault(tuple(e.prompt_ids), []).append(i)
    problems = list(by_prompt.values())
    rng, history = random.Random(seed), []
    for epoch in range(epochs):
        rng.shuffle(problems)
        for p in problems:
            rng.shuffle(p)
        order = [i for p in problems for i in p]
        for s in range(0, len(order), batch_size):
            part = [examples[i] for i in order[s:s + batch_size]]
            mb = make_batch([e.prompt_ids for e in part], [e.completion_ids for e in part], pad_id,
                            [e.positions for e in part], [e.targets for e in part])
            m = trainer.accumulate(mb, loss_fn, first_epoch=False)
            m["head/grad_norm"] = trainer.step()[-1]
            history.append({"step": len(history) + 1, "epoch": epoch, **m})
    lm.eval()
    return head.eval(), history


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
                 autocast_bf16: bool = True):
        self.lm, self.head, self.tok = lm.eval(), head.eval(), tokenizer
        self.micro, self.autocast_bf16 = micro_batch_size, autocast_bf16

    @torch.no_grad()
    def step_scores(self, prompts: list[list[int]], completions: list[list[int]]) -> list[list[float]]:
        """P(correct) at each step end of each (prompt, completion)."""
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if self.autocast_bf16 else nullcontext()
        out = []
        for i in range(0, len(prompts), self.micro):
            p, c = prompts[i:i + self.micro], completions[i:i + self.micro]
            batch = make_batch(p, c, self.tok.pad_token_id)
            with ctx:
                values = completion_values(self.lm.get_decoder(), self.head.head, batch)  # (b, T)
            prob = values.float().sigmoid()  # (b, T)
            out += [prob[j, step_ends(token_texts(self.tok, cj))].tolist() for j, cj in enumerate(c)]
        return out

    def score(self, prompts: list[list[int]], completions: list[list[int]], aggregate=agg_min) -> list[float]:
        """One number per solution: ``aggregate`` of its step scores (``prm_score``)."""
        return [aggregate(s) for s in self.step_scores(prompts, completions)]

    def score_rollouts(self, batch: Rollouts, aggregate=agg_min) -> list[float]:
        return self.score(*unpadded(batch), aggregate=aggregate)

    def save(self, folder: str | Path) -> Path:
        """A transformers folder + value_head.safetensors, as `rlpost rm` writes (offline.save_model)."""
        from rlpost.preference.offline import save_model

        return save_model(self.lm, self.tok, Path(folder), self.head)

    @classmethod
    def load(cls, folder: str | Path, **kw) -> "ProcessRewardModel":
        loaded = load_policy(str(folder))
        head = Critic(loaded.model, "shared")
        head.head.load_state_dict(load_file(Path(folder) / "value_head.safetensors"))
        return cls(loaded.model.float(), head, loaded.tokenizer, **kw)


def train_prm(lm: torch.nn.Module, tokenizer, examples: list[Example], **kw) -> tuple[ProcessRewardModel, list[dict]]:
    """``train_value_head`` wrapped into a scorer; PRM or ORM depending on ``examples``."""
    head, history = train_value_head(lm, examples, tokenizer.pad_token_id, **kw)
    return ProcessRewardModel(lm, head, tokenizer, autocast_bf16=kw.get("autocast_bf16", True)), history


def auc(scores: Sequence[float], labels: Sequence[float]) -> float:
    """ROC AUC of scores against 0/1 labels (ties count half); 0.5 when one class is missing."""
    pos = [s for s, y in zip(scores, labels) if y >= 0.5]
    neg = [s for s, y in zip(scores, labels) if y < 0.5]
    if not pos or not neg:
        return 0.5
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))
