"""Test-time search on the embedded model: greedy, majority@N, ORM / PRM best-of-N, PRM-weighted
majority and PRM step-level beam search, at an equal sampling budget.

    nice -n 10 .venv/bin/python benchmarks/search.py                      # the defaults below
    nice -n 10 .venv/bin/python benchmarks/search.py --train 8 --eval 8   # a quick smoke run
    .venv/bin/python benchmarks/search.py --save-prm runs/prm             # only train a PRM, for
                                                                          # task.process_reward_model

Why this task: the embedded SmolLM2-135M barely follows "step by step" instructions on their own
(0-15% correct, answers in prose), so the prompt carries two worked examples as earlier chat turns
(3-term +/- problems, operands 2-9). The model then writes "a + b = x", "x - c = y", "Answer: y":
three lines, ~23 tokens, right ~1/3 of the time when sampling at T=0.7 (~0.45 greedy), so a
selector has room to help. The prompt is kept short (~127 tokens): every MC continuation
re-reads it, and its prefill is most of the labelling cost on CPU.

Phases (each timed): 1. sample N solutions of each training problem and label every step by M
Monte-Carlo continuations (recipes/prm.py); 2. train a PRM on the soft step labels and an ORM on the
0/1 outcomes of the same solutions (each from a fresh copy of the model); 3. on held-out problems,
draw N samples once and let every selector pick from the same samples (a paired comparison), then
run beam search with beam_width * expand = N proposals per round. Prints a markdown table and
writes it, with the command, date and phase times, to benchmarks/results/search.md (raw numbers
and sample completions in search.json).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import transformers

from rlpost.envs.arithmetic import INT, build_splits, score
from rlpost.model.load import load_policy
from rlpost.observe.runlog import timed
from rlpost.recipes import search as beam
from rlpost.recipes.prm import auc, mc_step_labels, outcome_examples, process_examples, train_prm
from rlpost.rewards.prm import agg_last, agg_min
from rlpost.roles.rollout_hf import HFRollout
from rlpost.sections import TaskConfig

ROOT = Path(__file__).resolve().parents[1]
SYSTEM = "Work step by step, one step per line; end with the answer."
PROMPT = "Compute {expr}."
SHOTS = [("5 + 3 + 4", "5 + 3 = 8\n8 + 4 = 12\nAnswer: 12"), ("7 + 6 - 2", "7 + 6 = 13\n13 - 2 = 11\nAnswer: 11")]


def task_rows(n_train: int, n_eval: int) -> tuple[list[dict], list[dict]]:
    """Arithmetic rows (build_splits: 3 terms, +/-, operands 2-9), the two worked examples inserted
    as chat turns between the system message and the question."""
    tc = replace(TaskConfig(), n_terms=3, ops="+-", min_a=2, max_a=9, min_b=2, max_b=9, prompt=PROMPT,
                 system_prompt=SYSTEM, n_train=n_train, n_heldout=n_eval)
    train, held = build_splits(tc)
    shots = [m for expr, sol in SHOTS for m in ({"role": "user", "content": PROMPT.format(expr=expr)},
                                                 {"role": "assistant", "content": sol})]
    add = lambda rs: [{**r, "messages": r["messages"][:1] + shots + r["messages"][1:]} for r in rs]
    return add(train), add(held)


def last_int(text: str) -> str | None:
    """The answer majority voting counts: the last integer, as the verifier parses it."""
    found = INT.findall(text.replace(",", ""))
    return str(int(found[-1])) if found else None


def correct(result: beam.SearchResult, rows: list[dict]) -> list[float]:
    return [score(c, r)[0] for c, r in zip(result.completions, rows)]


def label_and_train_prm(args, rollout, train_rows, timings) -> tuple:
    """Phases 1 and 2a: MC-labelled solutions, and a PRM trained on them (from a fresh model).
    Returns (solutions, PRM, its training history)."""
    with timed("1_sample_and_label", timings):
        sols = mc_step_labels(rollout, train_rows, score, args.n, args.m, args.max_new_tokens, args.temperature,
                              chunk=args.chunk)
    with timed("2a_train_prm", timings):
        prm, hist = train_prm(load_policy("embedded").model, rollout.tok, process_examples(sols), **train_kw(args))
    return sols, prm, hist


def train_kw(args) -> dict:
    return dict(epochs=args.epochs, batch_size=16, micro_batch_size=16, lr=args.lr, head_lr=args.head_lr)


def label_and_train(args, rollout, train_rows, timings) -> tuple:
    """Phases 1-2: MC-labelled solutions, then a PRM and an ORM trained on them."""
    sols, prm, prm_hist = label_and_train_prm(args, rollout, train_rows, timings)
    kw = train_kw(args)
    with timed("2b_train_orm", timings):
        orm, orm_hist = train_prm(load_policy("embedded").model, rollout.tok, outcome_examples(sols), **kw)
    steps = [len(s.step_ends) for s in sols]
    inner = [x for s in sols for x in s.labels[:-1]]  # MC labels of the steps before the last
    stats = {"solutions": len(sols), "solution_accuracy": sum(s.outcome for s in sols) / len(sols),
             "steps_per_solution": sum(steps) / len(steps), "labelled_steps": sum(steps),
             "mc_labels_mean": sum(inner) / max(1, len(inner)),
             "mc_labels_strictly_between_0_and_1": sum(0 < x < 1 for x in inner) / max(1, len(inner)),
             "label_tokens": sum(s.label_tokens for s in sols),
             "solution_tokens": sum(len(s.completion_ids) for s in sols),
             "prm_train_bce_first_last": [prm_hist[0]["prm/bce"], prm_hist[-1]["prm/bce"]],
             "orm_train_bce_first_last": [orm_hist[0]["prm/bce"], orm_hist[-1]["prm/bce"]]}
    examples = [{"solution": rollout.tok.decode(s.completion_ids, skip_special_tokens=True), "answer": s.row["answer"],
                 "labels": s.labels, "continuations_of_step_1": s.continuations[0] if s.continuations else []}
                for s in sols[:6]]
    return prm, orm, stats, examples


def save_prm(args, rollout, train_rows, timings) -> None:
    """--save-prm: phases 1 and 2a only, and the PRM written as a folder an RL run reads
    (task.process_reward_model; ProcessRewardModel.save)."""
    _, prm, hist = label_and_train_prm(args, rollout, train_rows, timings)
    print(f"PRM written to {prm.save(args.save_prm)} (bce {hist[0]['prm/bce']:.3f} -> {hist[-1]['prm/bce']:.3f}; "
          + ", ".join(f"{k.removeprefix('timing_s/')} {v:.0f} s" for k, v in timings.items()) + ")")


def evaluate(args, rollout, prm, orm, rows, timings) -> tuple[dict, dict]:
    """Phase 3: every method on the held-out rows; per-problem correctness and token counts."""
    res: dict[str, beam.SearchResult] = {}
    with timed("3a_greedy", timings):
        res["greedy"] = beam.greedy(rollout, rows, args.max_new_tokens)
    with timed("3b_sample_n", timings):
        samples = rollout.generate(rows, args.n, args.temperature, 1.0, args.max_new_tokens)
    with timed("3c_score_samples", timings):
        prm_min = prm.score_rollouts(samples, agg_min)
        prm_last = prm.score_rollouts(samples, agg_last)
        orm_last = orm.score_rollouts(samples, agg_last)
    n = args.n
    res[f"majority@{n}"] = beam.pick_majority(samples, n, last_int)
    res[f"ORM best-of-{n}"] = beam.pick_best(samples, orm_last, n)
    res[f"PRM best-of-{n} (min)"] = beam.pick_best(samples, prm_min, n)
    res[f"PRM best-of-{n} (last)"] = beam.pick_best(samples, prm_last, n)
    res[f"PRM-weighted majority@{n} (min)"] = beam.pick_majority(samples, n, last_int, prm_min)
    sample_ok = [score(c, r)[0] for c, r in zip(samples.completions, samples.rows)]
    oracle = [max(sample_ok[i * n:(i + 1) * n]) for i in range(len(rows))]
    with timed("3d_beam_search", timings):
        res[f"PRM beam {args.beam_width}x{n // args.beam_width} (min)"] = beam.step_beam_search(
            rollout, prm, rows, args.beam_width, n // args.beam_width, args.max_steps, args.max_step_tokens,
            args.temperature, aggregate=agg_min)
    table = {k: {"correct": correct(r, rows), "tokens": r.tokens, "samples": r.samples} for k, r in res.items()}
    table[f"(oracle pass@{n}: any sample correct)"] = {"correct": oracle, "tokens": res[f"majority@{n}"].tokens,
                                                       "samples": res[f"majority@{n}"].samples}
    quality = {"sample_accuracy": sum(sample_ok) / len(sample_ok), "auc_prm_min": auc(prm_min, sample_ok),
               "auc_prm_last": auc(prm_last, sample_ok), "auc_orm": auc(orm_last, sample_ok),
               "beam_examples": [{"problem": r["expr"], "answer": r["answer"], "beam": c}
                                 for r, c in zip(rows[:4], list(res.values())[-1].completions)]}
    return table, quality


def markdown(table: dict, baseline: str) -> str:
    """Accuracy ± standard error, the paired difference to ``baseline`` ± its standard error, budget."""
    mean = lambda xs: sum(xs) / len(xs)
    base = table[baseline]["correct"]
    out = [f"| method | accuracy ± s.e. | Δ vs {baseline} (paired) ± s.e. | tokens / problem | samples / problem |",
           "|---|---|---|---|---|"]
    for name, t in table.items():
        c, n = t["correct"], len(t["correct"])
        p = mean(c)
        d = [a - b for a, b in zip(c, base)]
        sd = math.sqrt(sum((x - mean(d)) ** 2 for x in d) / max(1, n - 1) / n)
        se = math.sqrt(p * (1 - p) / n)
        out.append(f"| {name} | {p:.3f} ± {se:.3f} | {100 * mean(d):+.1f} ± {100 * sd:.1f} pts | "
                   f"{mean(t['tokens']):.1f} | {mean(t['samples']):.1f} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", type=int, default=48, help="training problems (PRM/ORM data)")
    ap.add_argument("--eval", type=int, default=40, help="held-out problems")
    ap.add_argument("--n", type=int, default=4, help="solutions per problem: training data and the eval budget")
    ap.add_argument("--m", type=int, default=4, help="MC continuations per step")
    ap.add_argument("--beam-width", type=int, default=2, help="beam width; each beam expands n / beam_width")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--max-steps", type=int, default=4,
                    help="beam rounds; max_steps * max_step_tokens = max_new_tokens")
    ap.add_argument("--max-step-tokens", type=int, default=12)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-5, help="trunk lr")
    ap.add_argument("--head-lr", type=float, default=1e-3)
    ap.add_argument("--chunk", type=int, default=96, help="continuations per sample_ids call")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "search")
    ap.add_argument("--save-prm", type=Path, default=None,
                    help="only label, train the PRM and write it to this folder (for task.process_reward_model): no "
                         "ORM, no evaluation")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t0, timings = time.perf_counter(), {}
    train_rows, held = task_rows(args.train, args.eval)
    with timed("0_load", timings):
        loaded = load_policy("embedded")
        rollout = HFRollout(loaded.model, loaded.tokenizer, torch.bfloat16)
    if args.save_prm:
        save_prm(args, rollout, train_rows, timings)
        return
    prm, orm, stats, examples = label_and_train(args, rollout, train_rows, timings)
    table, quality = evaluate(args, rollout, prm, orm, held, timings)
    timings["timing_s/total"] = time.perf_counter() - t0
    md = markdown(table, f"majority@{args.n}")
    print(md)
    write(args, md, table, quality, stats, examples, timings)


def write(args, md, table, quality, stats, examples, timings) -> None:
    command = "nice -n 10 .venv/bin/python " + " ".join(["benchmarks/search.py", *sys.argv[1:]])
    env = (f"{time.strftime('%Y-%m-%d %H:%M')}, {platform.machine()} {torch.get_num_threads()} threads, "
           f"torch {torch.__version__}, transformers {transformers.__version__}, "
           "SmolLM2-135M-Instruct (embedded), bf16 sampler")
    phases = " · ".join(f"{k.removeprefix('timing_s/')} {v:.0f} s" for k, v in timings.items())
    rounded = {k: round(v, 3) if isinstance(v, float) else v for k, v in stats.items()}
    text = (f"# Search and process rewards\n\n`{command}`\n\n{env}\n\nPhase times: {phases}\n\n"
            f"Training data: {json.dumps(rounded)}\n\n"
            "Scorer quality on the held-out samples (ROC AUC against correctness): "
            f"PRM min {quality['auc_prm_min']:.3f}, PRM last {quality['auc_prm_last']:.3f}, "
            f"ORM {quality['auc_orm']:.3f}; sampled accuracy {quality['sample_accuracy']:.3f}\n\n{md}\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(text)
    raw = {"command": command, "env": env, "args": {k: str(v) for k, v in vars(args).items()}, "timings": timings,
           "train_stats": stats, "quality": quality, "methods": table, "labelled_examples": examples}
    args.out.with_suffix(".json").write_text(json.dumps(raw, indent=1))


if __name__ == "__main__":
    main()
