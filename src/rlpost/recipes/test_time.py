"""The bodies of ``rlpost prm`` and ``rlpost search`` (their options and checks: recipes/search_args.py).

``train_scorer``: a process reward model from step-labelled rows (envs/step_data.py) or from
Monte-Carlo rollouts of the task's training rows (recipes/prm.py: Math-Shepherd's soft labels), or
with ``--outcome`` an outcome reward model from the same data (its final label only). The trunk is
the model (``--model``), the head zero-initialised, the loss BCE at the labelled positions
(rewards/prm.py, points 1-4). It writes a scorer folder: the transformers folder and value head
that ``ProcessRewardModel.load`` reads, and ``prm.json`` (what it is and how it was trained).

``search``: the methods of recipes/search.py on the task's held-out rows at one budget of N samples
a problem. The N-sample selectors (majority, best-of-N, weighted majority) choose from the very same
N samples, so their differences are paired, not sampling noise; beam search proposes at most N steps
a round. Every choice is graded by the task's own verifier (the held-out grader). A sample's answer,
for the votes, is the verifier's parsed answer, else the stripped completion (recipes/evaluate.py:
answer_key). The oracle row (any of the N samples right: pass@N) is the ceiling of every selector.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from rlpost import build, config
from rlpost.console import say
from rlpost.envs import build_task, is_correct, step_data
from rlpost.model import device
from rlpost.model.encode import unpadded
from rlpost.model.load import load_policy_for, load_tokenizer
from rlpost.recipes import search as methods
from rlpost.recipes.evaluate import TextBatch, answer_key, first_rows
from rlpost.recipes.prm import Example, LabelledSolution, mc_step_labels, outcome_examples, process_examples, train_prm
from rlpost.rewards.prm import ProcessRewardModel, agg_last, agg_min, agg_prod, step_ends, token_texts
from rlpost.types import folders
from rlpost.types.batch import Rollouts
from rlpost.types.errors import DataError, RunError, writing

AGGREGATES = {"min": agg_min, "last": agg_last, "prod": agg_prod}
SCORER_FORMAT = 1  # prm.json's version: what a scorer folder holds


def bf16(cfg: config.Config) -> bool | None:
    """The scorer computes as the sampler does: rollout.dtype's explicit choice, else the probe's (None)."""
    return {"bfloat16": True, "float32": False}.get(cfg.rollout.dtype)


# --- rlpost prm --------------------------------------------------------------------------------


def data_examples(rows: list[step_data.StepRow], tok, outcome: bool) -> list[Example]:
    """Each row as the tokens the PRM reads: the prompt through the chat template (as the sampler
    renders it), the steps joined by newlines and EOS (as a sampled solution ends); the labels at
    each step's last token, or for an outcome model the last label at the final token."""
    out = []
    for r in rows:
        text = tok.apply_chat_template(r.messages, add_generation_prompt=True, tokenize=False)
        prompt = tok(text, add_special_tokens=False).input_ids
        completion = tok("\n".join(r.steps), add_special_tokens=False).input_ids + [tok.eos_token_id]
        ends = step_ends(token_texts(tok, completion))
        if len(ends) != len(r.steps):  # a step the tokenizer does not end at a newline token
            raise DataError(f"{r.where}: the model's tokenizer finds {len(ends)} steps in 'steps', not "
                            f"{len(r.steps)}; a step is one line of text")
        positions, targets = ([len(completion) - 1], r.labels[-1:]) if outcome else (ends, r.labels)
        out.append(Example(prompt, completion, positions, targets))
    return out


def mc_examples(cfg: config.Config, args, outcome: bool) -> tuple[list[Example], dict]:
    """--n solutions of --problems training rows, each step labelled by --m continuations (recipes/prm.py);
    for an outcome model, each solution's verifier score alone."""
    task = build_task(cfg.task)
    rows = first_rows(task.train, args.problems, "--problems", "training")
    roles = build.build_roles(cfg, task, for_eval=True)
    try:
        grade = lambda text, row: graded(roles.grader, [text], [row])[0]  # noqa: E731
        rollout = cfg.rollout
        if outcome:  # an outcome model reads only each solution's own score: no continuation is sampled
            batch = roles.rollout.generate(rows, args.n, rollout.temperature, rollout.top_p, rollout.max_new_tokens)
            sols = [LabelledSolution(p, c, [len(c) - 1], [x], x, row) for p, c, (x, _), row in
                    zip(*unpadded(batch), graded(roles.grader, batch.completions, batch.rows), batch.rows)]
        else:
            sols = mc_step_labels(roles.rollout, rows, grade, args.n, args.m, rollout.max_new_tokens,
                                  rollout.temperature, rollout.top_p)
    finally:
        roles.close()
    inner = [x for s in sols for x in s.labels[:-1]]  # the MC labels (the last step's is the outcome)
    stats = {"problems": len(rows), "solutions": len(sols),
             "solution_accuracy": sum(s.outcome for s in sols) / max(1, len(sols))}
    if not outcome:
        stats.update(labelled_steps=sum(len(s.step_ends) for s in sols), mc_labels_mean=sum(inner) / max(1, len(inner)),
                     mc_labels_strictly_between_0_and_1=sum(0 < x < 1 for x in inner) / max(1, len(inner)),
                     label_tokens=sum(s.label_tokens for s in sols))
    return (outcome_examples if outcome else process_examples)(sols), stats


def make(out: Path) -> None:
    """The scorer's folder, made before the sampling and the training: a folder that cannot be written is said
    first, not after them."""
    with writing(out):
        out.mkdir(parents=True, exist_ok=True)


def train_scorer(cfg: config.Config, data: str, out: Path, args) -> dict:
    """`rlpost prm`: the examples (from DATA or MC rollouts), the head and trunk trained, the folder written."""
    build.check(cfg)
    torch.manual_seed(cfg.run.seed)
    torch.set_num_threads(cfg.run.threads or torch.get_num_threads())
    if data:
        tok = load_tokenizer(cfg.model.name)
        examples, stats = data_examples(step_data.read(data), tok, args.outcome), {}
        make(out)
    else:
        make(out)
        examples, stats = mc_examples(cfg, args, args.outcome)
        tok = load_tokenizer(cfg.model.name)
    if not examples:
        raise DataError(f"{data or 'the sampled solutions'}: no solution with a step to train on")
    say(f"prm: training {'an outcome' if args.outcome else 'a process'} reward model on {len(examples)} solutions, "
        f"{sum(len(e.positions) for e in examples)} labels")
    lm = load_policy_for(cfg.model, cfg.run.seed).model
    scorer, history = train_prm(lm, tok, examples, epochs=args.epochs, batch_size=args.batch_size,
                                micro_batch_size=min(16, args.batch_size), lr=args.lr, head_lr=args.head_lr,
                                autocast_bf16=bf16(cfg), seed=cfg.run.seed)
    bad = next((i for i, h in enumerate(history) if not math.isfinite(h["prm/bce"])), None)
    if bad is not None or not all(torch.isfinite(p).all() for m in (scorer.lm, scorer.head) for p in m.parameters()):
        at = f"its loss was {history[bad]['prm/bce']} at optimizer step {bad + 1}" if bad is not None else \
            "its weights are not finite"
        raise RunError(f"prm: training diverged ({at}; --lr {args.lr}, --head-lr {args.head_lr}): nothing written "
                       f"to {out}; lower the learning rates")
    summary = {"format": SCORER_FORMAT, "kind": "outcome" if args.outcome else "process", "model": cfg.model.name,
               "data": data or "monte-carlo", "task": cfg.task.name, "solutions": len(examples),
               "labels": sum(len(e.positions) for e in examples), "epochs": args.epochs,
               "optimizer_steps": len(history),
               "bce_first_last": [history[0]["prm/bce"], history[-1]["prm/bce"]], **stats}
    scorer.save(out)
    with writing(out / "prm.json"):
        (out / "prm.json").write_text(json.dumps(summary, indent=1) + "\n")
    folders.mark(out, "prm")
    return {"out": str(out), **summary}


# --- rlpost search -----------------------------------------------------------------------------


def graded(grader, completions: list[str], rows: list[dict]) -> list[tuple[float, dict]]:
    rewards, infos, _ = grader.score(TextBatch(completions, rows))
    return list(zip(rewards.tolist(), infos))


def load_scorer(path: str, cfg: config.Config, near) -> ProcessRewardModel | None:
    return ProcessRewardModel.load(path, device.of(near), autocast_bf16=bf16(cfg)) if path else None


def search(cfg: config.Config, chosen: list[str], args) -> dict:
    """`rlpost search`: every chosen method on the held-out rows; per method accuracy, tokens, samples."""
    build.check(cfg)
    torch.manual_seed(cfg.run.seed)
    torch.set_num_threads(cfg.run.threads or torch.get_num_threads())
    task = build_task(cfg.task, refuse_contaminated=False)
    rows = first_rows(task.heldout, args.problems, "--problems", "held-out")
    if not rows:
        raise config.ConfigError(f"task {cfg.task.name}: no held-out rows to search on")
    roles = build.build_roles(cfg, task, for_eval=True)
    try:
        table = methods_table(roles, rows, cfg, chosen, args)
    finally:
        roles.close()
    return {"model": cfg.model.name, "task": cfg.task.name, "problems": len(rows), "n": args.n,
            "temperature": cfg.rollout.temperature, "prm": args.prm, "orm": args.orm, "aggregate": args.aggregate,
            "methods": table}


def methods_table(roles, rows: list[dict], cfg: config.Config, chosen: list[str], args) -> dict:
    """Every chosen method run (``run_methods``), its choices graded by the task's verifier, summarised."""
    found = run_methods(roles, rows, cfg, chosen, args)
    scored = {name: [is_correct(info, r) for r, info in graded(roles.grader, res.completions, rows)]
              for name, res in found.items() if name != "oracle"}
    if "oracle" in found:
        scored["oracle"] = found["oracle"].scores
    return summarise(found, scored)


def run_methods(roles, rows: list[dict], cfg: config.Config, chosen: list[str], args) -> dict:
    """name -> SearchResult; with any N-sample method also 'oracle' (its scores: each problem's pass@N, 0/1)."""
    sampling, n = cfg.rollout, args.n
    rollout = roles.rollout
    prm = load_scorer(args.prm, cfg, rollout.model)
    orm = load_scorer(args.orm, cfg, rollout.model)
    agg = AGGREGATES[args.aggregate]
    out = {}
    if "greedy" in chosen:
        out["greedy"] = methods.greedy(rollout, rows, sampling.max_new_tokens)
    if {"majority", "orm-best", "prm-best", "prm-last", "prm-weighted"} & set(chosen):
        per_call = max(1, cfg.run.eval_batch_size // n)
        batch = Rollouts.cat([rollout.generate(rows[i:i + per_call], n, sampling.temperature, sampling.top_p,
                                               sampling.max_new_tokens) for i in range(0, len(rows), per_call)])
        verdicts = graded(roles.grader, batch.completions, batch.rows)
        answers = {c: answer_key(info, c) for c, (_, info) in zip(batch.completions, verdicts)}
        right = [float(is_correct(info, x)) for x, info in verdicts]
        answer = answers.get
        picks = {"majority": lambda: methods.pick_majority(batch, n, answer),
                 "orm-best": lambda: methods.pick_best(batch, orm.score_rollouts(batch, agg_last), n),
                 "prm-best": lambda: methods.pick_best(batch, prm.score_rollouts(batch, agg), n),
                 "prm-last": lambda: methods.pick_best(batch, prm.score_rollouts(batch, agg_last), n),
                 "prm-weighted": lambda: methods.pick_majority(batch, n, answer, prm.score_rollouts(batch, agg))}
        out.update({m: picks[m]() for m in chosen if m in picks})
        oracle = methods.SearchResult([], methods.tokens_per_problem(batch, n), [n] * len(rows),
                                      [max(right[g * n:(g + 1) * n]) for g in range(len(rows))])
    if "beam" in chosen:
        width = args.beam_width
        out["beam"] = methods.step_beam_search(rollout, prm, rows, width, n // width, args.max_steps,
                                               args.max_step_tokens, sampling.temperature, sampling.top_p, agg)
    if {"majority", "orm-best", "prm-best", "prm-last", "prm-weighted"} & set(chosen):
        out["oracle"] = oracle
    return out


def summarise(found: dict, scored: dict) -> dict:
    """Per method: accuracy and its standard error, tokens and samples a problem, the paired difference
    to majority and its standard error (when majority ran), and each problem's verdict."""
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    base = scored.get("majority")
    table = {}
    for name, res in found.items():
        c = [float(x) for x in scored[name]]
        p, k = mean(c), len(c)
        row = {"accuracy": p, "se": math.sqrt(p * (1 - p) / k), "tokens": mean(res.tokens),
               "samples": mean(res.samples)}
        if base is not None:
            d = [a - float(b) for a, b in zip(c, base)]
            row["delta_vs_majority"] = mean(d)
            row["delta_se"] = math.sqrt(sum((x - mean(d)) ** 2 for x in d) / (k * (k - 1))) if k > 1 else 0.0
        table[name] = {**row, "correct": c}
    return table
