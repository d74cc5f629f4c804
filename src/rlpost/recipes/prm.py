"""Training a process (or outcome) reward model: Monte-Carlo step labels (Math-Shepherd, Wang et
al. 2023, arXiv:2312.08935, the soft "SE" estimate) and the training loop. The scorer it produces,
the step definition and the aggregates are in ``rewards/prm.py``, whose docstring says what is
implemented, point by point; the loss is ``algorithms/preference.py: bce_at_positions``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch import Tensor

from rlpost import build
from rlpost.algorithms import core
from rlpost.algorithms.preference import bce_at_positions
from rlpost.model.encode import make_batch, unpadded
from rlpost.rewards.prm import ProcessRewardModel, step_ends, token_texts
from rlpost.roles.critic import Critic
from rlpost.sections import TrainerConfig
from rlpost.types.batch import Rollouts

Verifier = Callable[[str, dict], tuple[float, dict]]  # (completion, row) -> (score, info), as envs/*.score


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


# --- training examples -------------------------------------------------------------------------


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


# --- training ----------------------------------------------------------------------------------


def train_value_head(lm: torch.nn.Module, examples: list[Example], pad_id: int, *, epochs: int = 2,
                     batch_size: int = 16, lr: float = 1e-5, head_lr: float = 1e-3, micro_batch_size: int = 16,
                     autocast_bf16: bool | None = None, seed: int = 0,
                     aggregate=core.token_mean) -> tuple[Critic, list[dict]]:
    """Fit trunk + head to the examples' targets with ``bce_at_positions`` (a PRM or an ORM,
    depending on the examples); returns the head (the trunk is ``lm``, trained in place) and
    one metrics dict per optimizer step. autocast_bf16: None = what the precision probe chose."""
    head = Critic(lm, "shared")
    steps = epochs * math.ceil(len(examples) / batch_size)
    prec = "auto" if autocast_bf16 is None else "bf16" if autocast_bf16 else "fp32"
    tcfg = TrainerConfig(lr=lr, precision=prec, micro_batch_size=micro_batch_size,
                         share_prompt_prefix=True)
    trainer = build.make_head_trainer(lm, head, tcfg, batch_size, micro_batch_size, steps, head_lr)

    def loss_fn(logp: Tensor, batch: Rollouts, *, values: Tensor, entropy: None = None) -> tuple[Tensor, dict]:
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
            m = trainer.train_step(mb, loss_fn)
            m["head/grad_norm"] = m.pop("critic/grad_norm")
            history.append({"step": len(history) + 1, "epoch": epoch, **m})
    lm.eval()
    return head.eval(), history


def train_prm(lm: torch.nn.Module, tokenizer, examples: list[Example], **kw) -> tuple[ProcessRewardModel, list[dict]]:
    """``train_value_head`` wrapped into a scorer; PRM or ORM depending on ``examples``."""
    head, history = train_value_head(lm, examples, tokenizer.pad_token_id, **kw)
    return ProcessRewardModel(lm, head, tokenizer, autocast_bf16=kw.get("autocast_bf16")), history


def auc(scores: Sequence[float], labels: Sequence[float]) -> float:
    """ROC AUC of scores against 0/1 labels (ties count half); 0.5 when one class is missing."""
    pos = [s for s, y in zip(scores, labels) if y >= 0.5]
    neg = [s for s, y in zip(scores, labels) if y < 0.5]
    if not pos or not neg:
        return 0.5
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))
