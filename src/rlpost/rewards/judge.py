"""LLM-as-judge (RLAIF): a local language model grades completions against a written rubric.

Why: a task without a programmatic verifier (open questions, style, safety) still needs a
reward. RLAIF (Bai et al. 2022, "Constitutional AI"; Lee et al. 2023, arXiv:2309.00267) asks
an instruction-tuned model to grade against a written rubric or constitution. ``Judge`` does
that with any local model (the embedded SmolLM2-135M by default) and has the verifier's
contract: ``score(batch) -> (rewards (B,) float32, infos, metrics)`` and ``close()``, so the
loop can seat it where the verifier or ``RewardModelScorer`` sits.

As implemented here:
1. The score is read from the judge's next-token distribution, not parsed from generated text
   (G-Eval, Liu et al. 2023, arXiv:2303.16634, weights scores by their token probabilities).
   The judge prompt ends with an assistant prefix ("Score:"), one forward gives the logits at
   the last position, and a softmax over only the label tokens gives a distribution over the
   labels. So there is no sampling noise, no parse failure, and one forward per judgement. The
   reward is a smooth function of the judge's belief rather than an argmax that moves in steps.
2. Pointwise: labels "1".."scale", default 1-9. Digits 1-9 are single tokens in SmolLM2's
   digit-split tokenizer and in most BPE vocabularies, but "10" is two tokens ("1", "0"), so
   the familiar 1-10 scale cannot be read in one position. Use 1-9, not 1-5. With the
   expectation taken over the labels the finer scale costs nothing, and on the embedded model
   the 1-9 prompt puts 0.98 of the next-token mass on the labels, against 0.58 for 1-5.
   Caveat, measured: at 135M the judge hardly tells a good answer from a bad one. Its scores
   are almost constant (about 0.6), so for real use set a larger local judge model.
   reward = (E[score] - 1) / (scale - 1), in [0, 1].
3. Pairwise: within each group (same prompt, K completions), every pair is compared once
   (round robin, K(K-1)/2 forwards). The prompt shows Response A and Response B and reads
   P(A) from the two label logits. Small judges prefer one position, so which completion is
   shown first is drawn from a seeded RNG and recorded in the infos. ``both_orders=True``
   judges each pair both ways and averages, which cancels a constant position bias at twice
   the cost. reward_i = mean over j in the group of P(i beats j); a group of one gets 0.5.
   judge/position_bias = mean P(first shown wins) - 0.5 over the batch's comparisons.
4. Label tokens are resolved in context at init: the label must be exactly one token after
   the prefix, written either "Score: 7" (GPT-2-style " 7") or "Score: " + "7" (SmolLM2 has
   a lone "Ġ" token and then the digit). Whichever spelling works fixes the prefix string. If
   neither works the label is not a single token and init raises, naming the label.
5. Judge prompts are the judge tokenizer's chat template (add_generation_prompt=True) rendered
   to text with the prefix appended. They are left-padded, position ids come from the mask
   (as in logprobs.py), and only the last position's logits are computed. The question and
   response are each capped at ``max_text_tokens`` tokens, so a runaway completion cannot blow
   up memory. The text is re-decoded without special tokens, so a completion cannot close the
   judge's chat turn by writing "<|im_end|>".
The judge reads decoded text, not token ids, so unlike the reward model it need not share the
policy's tokenizer.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import torch
from torch import Tensor

from rlpost.model import precision
from rlpost.model.load import load_policy
from rlpost.model.logprobs import position_ids
from rlpost.sections import TaskConfig
from rlpost.types.batch import Rollouts
from rlpost.types.errors import ConfigError

MODES = ("pointwise", "pairwise")

# Short on purpose: a 135M judge follows a few plain sentences better than a long constitution.
DEFAULT_RUBRIC = (
    "A good response answers the user's question directly and correctly. "
    "It is honest: it does not make up facts. "
    "It is helpful, on topic, clear, and no longer than needed. "
    "It is polite and harmless. "
    "A response that is wrong, off topic, evasive, rude, or padded is bad."
)

POINTWISE_PROMPT = (
    "Grade the response to the question below using the rubric.\n\n"
    "Rubric:\n{rubric}\n\n"
    "Question:\n{question}\n\n"
    "Response:\n{response}\n\n"
    "On a scale of 1 to {top}, where 1 is very bad and {top} is excellent, "
    "how well does the response follow the rubric? Reply with one number."
)
POINTWISE_PREFIX = "Score:"

PAIRWISE_PROMPT = (
    "Compare two responses to the question below using the rubric.\n\n"
    "Rubric:\n{rubric}\n\n"
    "Question:\n{question}\n\n"
    "Response A:\n{a}\n\n"
    "Response B:\n{b}\n\n"
    "Which response follows the rubric better? Reply with one letter, A or B."
)
PAIRWISE_PREFIX = "Better response:"
PAIR_LABELS = ("A", "B")


def load_rubric(rubric: str) -> str:
    """A rubric is literal text, or the path of a .md/.txt file holding it; empty = DEFAULT_RUBRIC."""
    if not rubric.strip():
        return DEFAULT_RUBRIC
    if rubric.endswith((".md", ".txt")) and "\n" not in rubric:
        path = Path(rubric)
        if not path.is_file():
            raise ConfigError(f"task.judge_rubric: rubric file {rubric} not found")
        return path.read_text().strip()
    return rubric.strip()


def resolve_labels(tok, prefix: str, labels: tuple[str, ...]) -> tuple[str, list[int]]:
    """(prefix as it must be appended, label token ids). Each label must be exactly one token
    after the prefix. Try "prefix" + " label", then "prefix " + "label" (see the docstring, 4)."""
    ctx = tok.apply_chat_template([{"role": "user", "content": "Question"}], add_generation_prompt=True, tokenize=False)
    def enc(s):
        return tok.encode(s, add_special_tokens=False)
    for head, sep in ((prefix, " "), (prefix + " ", "")):
        base = enc(ctx + head)
        ids = []
        for label in labels:
            full = enc(ctx + head + sep + label)
            if len(full) != len(base) + 1 or full[: len(base)] != base:
                break
            ids.append(full[-1])
        if len(ids) == len(labels) and len(set(ids)) == len(ids):
            return head, ids
    bad = [lab for lab in labels if len(enc(lab)) != 1] or list(labels)
    raise ConfigError(f"task.judge_model: labels {bad} after {prefix!r} are not single tokens in the judge's tokenizer")


def expected_score(label_logits: Tensor) -> tuple[Tensor, Tensor]:
    """Label logits (N, L) for labels 1..L -> (probs (N, L), reward (N,) in [0, 1]).
    reward = (E[score] - 1) / (L - 1), with E[score] = sum_k k * p_k (docstring, 2)."""
    probs = label_logits.float().softmax(-1)  # (N, L)
    labels = torch.arange(1, probs.shape[1] + 1, dtype=torch.float32)  # (L,)
    mean = probs @ labels  # (N,)
    return probs, (mean - 1) / (probs.shape[1] - 1)


def round_robin(group_ids: Tensor) -> list[tuple[int, int]]:
    """Every pair (i, j), i < j, of rows with the same group id (a group's rows are contiguous)."""
    pairs, start, gids = [], 0, group_ids.tolist()
    for end in range(1, len(gids) + 1):
        if end == len(gids) or gids[end] != gids[start]:
            pairs += [(i, j) for i in range(start, end) for j in range(i + 1, end)]
            start = end
    return pairs


def win_rates(n: int, pairs: list[tuple[int, int]], p_i_wins: Tensor) -> tuple[Tensor, Tensor]:
    """Row i's reward = mean over its comparisons of P(i wins); no comparison -> 0.5.
    p_i_wins (M,) is P(pair's first index wins); the second index wins with 1 - p."""
    wins, games = torch.zeros(n), torch.zeros(n)  # (n,), (n,)
    for (i, j), p in zip(pairs, p_i_wins.tolist()):
        wins[i] += p
        wins[j] += 1 - p
        games[i] += 1
        games[j] += 1
    return torch.where(games > 0, wins / games.clamp(min=1), torch.full_like(wins, 0.5)), games


class Judge:
    def __init__(
        self, model_spec: str, mode: str, rubric: str, seed: int, both_orders: bool,
        micro_batch_size: int = 16, dtype: torch.dtype | None = None, scale: int = 9, max_text_tokens: int = 512,
    ):
        """The first five come from the config (task.judge_model, judge_mode, judge_rubric, run.seed,
        judge_both_orders: ``from_config``), whose defaults are the only ones; rubric '' = DEFAULT_RUBRIC.
        dtype: the judge's weights; None = what the precision probe chose (model/precision.py)."""
        if mode not in MODES:
            raise ConfigError(f"task.judge_mode: expected one of {MODES}, got {mode!r}")
        if not 2 <= scale <= 9:
            raise ConfigError(f"judge scale: expected 2..9 (labels must be single digits), got {scale}")
        self.mode, self.both_orders, self.scale = mode, both_orders, scale
        self.rubric = load_rubric(rubric)
        self.micro, self.max_text_tokens = micro_batch_size, max_text_tokens
        loaded = load_policy(model_spec, dtype=dtype or precision.sampler_dtype("auto"))
        self.model, self.tok = loaded.model.eval(), loaded.tokenizer  # score() runs under no_grad
        if mode == "pointwise":
            labels = tuple(str(k) for k in range(1, scale + 1))
            self.prefix, self.label_ids = resolve_labels(self.tok, POINTWISE_PREFIX, labels)
        else:
            self.prefix, self.label_ids = resolve_labels(self.tok, PAIRWISE_PREFIX, PAIR_LABELS)
        self.rng = random.Random(seed)  # which response is shown first; advances every call

    @classmethod
    def from_config(cls, task: TaskConfig, seed: int, dtype: str) -> "Judge":
        """task.judge_* with run.seed; dtype: rollout.dtype (the judge samples nothing but computes as the sampler
        does)."""
        return cls(task.judge_model, task.judge_mode, task.judge_rubric, seed, task.judge_both_orders,
                   dtype=precision.sampler_dtype(dtype))

    # --- prompts ------------------------------------------------------------------------------

    def clip(self, text: str) -> str:
        """At most max_text_tokens tokens, special tokens dropped (docstring, 5)."""
        ids = self.tok.encode(text, add_special_tokens=False)
        clipped = self.tok.decode(ids[: self.max_text_tokens], skip_special_tokens=True)
        return clipped + (" [truncated]" if len(ids) > self.max_text_tokens else "")

    def render(self, user: str) -> str:
        msgs = [{"role": "user", "content": user}]
        return self.tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False) + self.prefix

    def pointwise_prompt(self, question: str, response: str) -> str:
        return self.render(POINTWISE_PROMPT.format(
            rubric=self.rubric, question=self.clip(question), response=self.clip(response), top=self.scale))

    def pairwise_prompt(self, question: str, a: str, b: str) -> str:
        return self.render(PAIRWISE_PROMPT.format(
            rubric=self.rubric, question=self.clip(question), a=self.clip(a), b=self.clip(b)))

    # --- the forward --------------------------------------------------------------------------

    @torch.no_grad()
    def label_logits(self, texts: list[str]) -> tuple[Tensor, Tensor]:
        """(label logits (N, L) float32, label mass (N,)): the next-token logits of each prompt
        restricted to the label tokens, and the full-vocabulary probability on those labels (a
        check that the prompt works: near 0 means the judge wanted to say something else)."""
        # Sort by length so each micro-batch pads little; scatter back at the end.
        order = sorted(range(len(texts)), key=lambda k: len(texts[k]))
        logits = torch.zeros(len(texts), len(self.label_ids))  # (N, L)
        mass = torch.zeros(len(texts))  # (N,)
        ids = torch.tensor(self.label_ids)
        for s in range(0, len(order), self.micro):
            idx = order[s : s + self.micro]
            enc = self.tok([texts[k] for k in idx], return_tensors="pt", padding=True, add_special_tokens=False)
            out = self.model(input_ids=enc.input_ids, attention_mask=enc.attention_mask,
                             position_ids=position_ids(enc.attention_mask), logits_to_keep=1)
            last = out.logits[:, -1].float()  # (b, V); left padding puts every prompt's end here
            logits[idx] = last[:, ids]  # (b, L)
            mass[idx] = last.softmax(-1)[:, ids].sum(-1)  # (b,)
        return logits, mass

    # --- the verifier's contract --------------------------------------------------------------

    def score(self, batch: Rollouts) -> tuple[Tensor, list[dict], dict]:
        """Rewards (B,) float32, infos, metrics: the same contract as the verifier's."""
        t0 = time.perf_counter()
        questions = [_question(row) for row in batch.rows]
        if self.mode == "pointwise":
            rewards, infos, metrics = self._pointwise(questions, batch.completions)
        else:
            rewards, infos, metrics = self._pairwise(questions, batch.completions, batch.group_ids)
        metrics["timing_s/verifier_per_call"] = (time.perf_counter() - t0) / max(1, len(batch))
        return rewards.float(), infos, metrics

    def _pointwise(self, questions: list[str], completions: list[str]) -> tuple[Tensor, list[dict], dict]:
        texts = [self.pointwise_prompt(q, c) for q, c in zip(questions, completions)]
        logits, mass = self.label_logits(texts)  # (B, L), (B,)
        probs, rewards = expected_score(logits)  # (B, L), (B,)
        means = 1 + rewards * (self.scale - 1)  # (B,) back on the 1..scale scale
        infos = [{"judge_score": m, "judge_probs": p} for m, p in zip(means.tolist(), probs.tolist())]
        metrics = {"judge/comparisons": len(texts), "judge/label_mass": _mean(mass), "judge/score_mean": _mean(means)}
        return rewards, infos, metrics

    def _pairwise(
        self, questions: list[str], completions: list[str], group_ids: Tensor
    ) -> tuple[Tensor, list[dict], dict]:
        pairs = round_robin(group_ids)
        # Who is shown as A: both orders, or one drawn per pair from the seeded RNG.
        shows = [[(i, j), (j, i)] if self.both_orders else [(i, j) if self.rng.random() < 0.5 else (j, i)]
                 for i, j in pairs]
        flat = [ab for s in shows for ab in s]
        texts = [self.pairwise_prompt(questions[a], completions[a], completions[b]) for a, b in flat]
        logits, mass = self.label_logits(texts)  # (M, 2), (M,)
        p_first = logits.softmax(-1)[:, 0]  # (M,) P(A), A = the response shown first
        # P(i beats j) from each showing, averaged over the pair's showings (one or two).
        p_shown = iter(p_first.tolist())
        p_i = []  # (M_pairs,) P(pair's first index i wins)
        for (i, _), show in zip(pairs, shows):
            p_i.append(sum(p if a == i else 1 - p for (a, _), p in zip(show, p_shown)) / len(show))
        rewards, _ = win_rates(len(completions), pairs, torch.tensor(p_i))  # (B,)
        matches = [[] for _ in completions]
        for (i, j), p, show in zip(pairs, p_i, shows):
            first = None if self.both_orders else show[0][0] == i  # None: shown both ways
            matches[i].append({"vs": j, "p_win": p, "shown_first": first})
            matches[j].append({"vs": i, "p_win": 1 - p, "shown_first": None if first is None else not first})
        infos = [{"judge_winrate": r, "judge_matches": m} for r, m in zip(rewards.tolist(), matches)]
        metrics = {"judge/comparisons": len(texts), "judge/label_mass": _mean(mass)}
        if texts:  # no comparison (all groups of one): no bias to measure
            metrics["judge/position_bias"] = float(p_first.mean()) - 0.5
        return rewards, infos, metrics

    def close(self) -> None:
        pass


def _question(row: dict) -> str:
    """The row's last user message: what the completion answers."""
    return next((m["content"] for m in reversed(row.get("messages", [])) if m.get("role") == "user"), "")


def _mean(x: Tensor) -> float:
    return float(x.mean()) if x.numel() else 0.0
