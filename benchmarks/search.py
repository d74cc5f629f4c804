"""Test-time search on the embedded model: greedy, majority@N, ORM / PRM best-of-N, PRM-weighted
majority and PRM step-level beam search, at an equal sampling budget, through the commands a user
runs: `rlpost prm` (twice: a PRM on Monte-Carlo step labels, an ORM on the same solutions' outcomes)
and `rlpost search`. This file only writes the task's rows and calls them.

    nice -n 10 .venv/bin/python benchmarks/search.py                      # the defaults below
    nice -n 10 .venv/bin/python benchmarks/search.py --train 8 --eval 8   # a quick smoke run
    .venv/bin/python benchmarks/search.py --save-prm runs/prm             # only train a PRM, for
                                                                          # task.process_reward_model

Why this task: the embedded SmolLM2-135M barely follows "step by step" instructions on their own
(0-15% correct, answers in prose), so the prompt carries two worked examples as earlier chat turns
(3-term +/- problems, operands 2-9). The model then writes "a + b = x", "x - c = y", "Answer: y":
three lines, ~23 tokens, right ~1/3 of the time when sampling at T=0.7 (~0.45 greedy), so a
selector has room to help. The prompt is kept short (~127 tokens): every MC continuation
re-reads it, and its prefill is most of the labelling cost on CPU. The rows go to
OUT.data/{train,heldout}.jsonl (prompt = the chat messages, answer), read as `task.name=dataset`
with the arithmetic verifier (the last integer), so the same run is one command line each
(printed, and written to OUT.md).

`--labels checker` trains both scorers on step-labelled data instead (`rlpost prm STEPS.jsonl`, the
PRM800K route with an arithmetic line checker standing in for the human raters): `rlpost eval
--samples N` draws the training problems' solutions (sampling only: no continuations, so ~10x
cheaper a problem than Monte-Carlo labels, and many more problems fit an hour), `step_labels` below
marks each line, and the ORM reads the same rows' last label (`--outcome`).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from rlpost.envs.arithmetic import build_splits
from rlpost.sections import TaskConfig

ROOT = Path(__file__).resolve().parents[1]
SYSTEM = "Work step by step, one step per line; end with the answer."
PROMPT = "Compute {expr}."
SHOTS = [("5 + 3 + 4", "5 + 3 = 8\n8 + 4 = 12\nAnswer: 12"), ("7 + 6 - 2", "7 + 6 = 13\n13 - 2 = 11\nAnswer: 11")]


def task_rows(n_train: int, n_eval: int) -> tuple[list[dict], list[dict]]:
    """Arithmetic rows (build_splits: 3 terms, +/-, operands 2-9), the two worked examples inserted
    as chat turns between the system message and the question; as data rows (prompt, answer)."""
    tc = replace(TaskConfig(), n_terms=3, ops="+-", min_a=2, max_a=9, min_b=2, max_b=9, prompt=PROMPT,
                 system_prompt=SYSTEM, n_train=n_train, n_heldout=n_eval)
    train, held = build_splits(tc)
    shots = [m for expr, sol in SHOTS for m in ({"role": "user", "content": PROMPT.format(expr=expr)},
                                                 {"role": "assistant", "content": sol})]
    rows = lambda rs: [{"prompt": r["messages"][:1] + shots + r["messages"][1:], "answer": r["answer"],  # noqa: E731
                        "expr": r["expr"]} for r in rs]
    return rows(train), rows(held)


def overrides(args, data: Path) -> list[str]:
    """The task and sampling of every command: the rows above, the arithmetic verifier, T and the length cap."""
    return ["task.name=dataset", f"task.data={data / 'train.jsonl'}", f"task.eval_data={data / 'heldout.jsonl'}",
            "task.verifier=rlpost.envs.arithmetic:score",
            # every prompt holds the same two worked examples, whose 8-grams the contamination check counts;
            # build_splits' problems themselves are disjoint
            "task.max_contamination=1",
            f"rollout.max_new_tokens={args.max_new_tokens}", f"rollout.temperature={args.temperature}",
            f"run.threads={args.threads}", f"run.seed={args.seed}", "run.progress=false"]


EQUATION = re.compile(r"^\s*(-?\d+(?:\s*[-+]\s*\d+)+)\s*=\s*(-?\d+)\s*\.?\s*$")


def prefix_values(expr: str) -> set[int]:
    """The values of the expression's prefixes of two terms or more ('5 + 3 - 2' -> {8, 6}): the
    partial results a solution on the right path writes."""
    terms = re.findall(r"[-+]?\s*\d+", expr.replace(" ", ""))
    vals, acc = set(), int(terms[0])
    for t in terms[1:]:
        acc += int(t)
        vals.add(acc)
    return vals


def step_labels(expr: str, lines: list[str], outcome: float) -> list[float]:
    """Whether a solution is still on a path to the right answer after each line (PRM800K's first-error
    labelling, by rule): an equation line keeps it on the path when it is true and its value is a partial
    result of the problem (so '5 + 3 + 4 = 12' in one line counts); one that is false or off the chain ends
    the path for good; other lines leave it as it was. The last line's label is the solution's own grade."""
    good, partial, labels = True, prefix_values(expr), []
    for line in lines:
        m = EQUATION.match(line)
        if m:
            lhs, rhs = m.group(1).replace(" ", ""), int(m.group(2))
            good = good and sum(int(t) for t in re.findall(r"[-+]?\d+", lhs)) == rhs and rhs in partial
        labels.append(float(good))
    return labels[:-1] + [float(outcome)] if labels else []


def checker_rows(rows: list[dict], samples: Path) -> list[dict]:
    """`rlpost prm` step rows from `rlpost eval`'s sample file: each completion's non-blank lines, labelled."""
    out = []
    for line in samples.read_text().splitlines():
        rec = json.loads(line)
        row = rows[rec["problem"]]
        steps = [x.strip() for x in rec["completion"].splitlines() if x.strip()]
        if steps:
            out.append({"prompt": row["prompt"], "steps": steps,
                        "labels": step_labels(row["expr"], steps, float(rec["correct"]))})
    return out


def rlpost(words: list[str], log: list[str]) -> None:
    log.append("rlpost " + " ".join(map(shlex.quote, words)))
    print(log[-1], flush=True)
    subprocess.run([sys.executable, "-m", "rlpost.cli", *words], check=True, cwd=ROOT)


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
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "search")
    ap.add_argument("--labels", choices=("mc", "checker"), default="mc",
                    help="mc: Monte-Carlo step labels (rlpost prm from rollouts); checker: sampled solutions "
                         "labelled line by line by an arithmetic checker (rlpost prm STEPS.jsonl)")
    ap.add_argument("--save-prm", type=Path, default=None,
                    help="only label, train the PRM and write it to this folder (for task.process_reward_model): no "
                         "ORM, no evaluation")
    args = ap.parse_args()
    data = Path(f"{args.out}.data")
    data.mkdir(parents=True, exist_ok=True)
    train, held = task_rows(args.train, args.eval)
    for name, rows in (("train", train), ("heldout", held)):
        (data / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = overrides(args, data)
    fit = ["--problems", str(args.train), "--n", str(args.n), "--m", str(args.m), "--epochs", str(args.epochs),
           "--lr", str(args.lr), "--head-lr", str(args.head_lr)]
    log, t0, phases = [], time.perf_counter(), {}
    if args.save_prm:
        rlpost(["prm", *common, *fit, "--out", str(args.save_prm)], log)
        return
    prm, orm = Path(f"{args.out}.prm"), Path(f"{args.out}.orm")
    source = []
    if args.labels == "checker":  # sampled solutions, each line labelled by rule: rlpost prm STEPS.jsonl
        t, samples, steps = time.perf_counter(), data / "train_samples.jsonl", data / "train_steps.jsonl"
        rlpost(["eval", "embedded", *common, f"task.eval_data={data / 'train.jsonl'}",
                f"task.n_heldout={args.train}", "--n", str(args.train),
                "--samples", str(args.n), "--k", "1", "--out", str(samples), "--overwrite", "--json"], log)
        steps.write_text("".join(json.dumps(r) + "\n" for r in checker_rows(train, samples)))
        source, fit = [str(steps)], fit[6:]  # --epochs, --lr, --head-lr: the data sets the rest
        phases["sample_train"] = time.perf_counter() - t
    for folder, extra in ((prm, []), (orm, ["--outcome"])):  # one seed: the ORM's solutions are the PRM's
        t = time.perf_counter()
        rlpost(["prm", *source, *common, *fit, *extra, "--out", str(folder)], log)
        phases[f"train_{'orm' if extra else 'prm'}"] = time.perf_counter() - t
    t = time.perf_counter()
    rlpost(["search", *common, "--prm", str(prm), "--orm", str(orm), "--n", str(args.n), "--beam-width",
            str(args.beam_width), "--max-steps", str(args.max_steps), "--max-step-tokens", str(args.max_step_tokens),
            "--out", str(args.out.with_suffix(".json")), "--json"], log)
    phases["search"] = time.perf_counter() - t
    phases["total"] = time.perf_counter() - t0
    write(args, log, phases, prm, orm)


def write(args, log: list[str], phases: dict, prm: Path, orm: Path) -> None:
    """OUT.md: the commands, the phase times, what the scorers trained on, and search's table."""
    result = json.loads(args.out.with_suffix(".json").read_text())
    trained = {k: json.loads((f / "prm.json").read_text()) for k, f in (("prm", prm), ("orm", orm))}
    rows = ["| method | accuracy ± s.e. | Δ vs majority (paired) ± s.e. | tokens / problem | samples / problem |",
            "|---|---|---|---|---|"]
    for name, r in result["methods"].items():
        rows.append(f"| {name} | {r['accuracy']:.3f} ± {r['se']:.3f} | {100 * r['delta_vs_majority']:+.1f} ± "
                    f"{100 * r['delta_se']:.1f} pts | {r['tokens']:.1f} | {r['samples']:.1f} |")
    command = f".venv/bin/python benchmarks/search.py {' '.join(sys.argv[1:])}"
    text = (f"# Search and process rewards\n\n`{command}`\n\n{time.strftime('%Y-%m-%d %H:%M')}; the commands it ran:"
            "\n\n```\n" + "\n".join(log) + "\n```\n\n"
            f"Phase times: {', '.join(f'{k} {v:.0f} s' for k, v in phases.items())}\n\n"
            f"PRM: {json.dumps(trained['prm'])}\n\nORM: {json.dumps(trained['orm'])}\n\n"
            f"{result['problems']} held-out problems, N = {result['n']}\n\n" + "\n".join(rows) + "\n")
    args.out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
