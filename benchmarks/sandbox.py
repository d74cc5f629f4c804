"""Sandbox and code-grading cost per call, before (an older rlpost checkout) and after (this one).

    .venv/bin/python benchmarks/sandbox.py --before /path/to/old/checkout [--rounds 3] [--backend bwrap]

Each side runs in its own child process, with PYTHONPATH at that checkout's src/ (so the old
code is imported, not ours), and the sides alternate every round, so drift on a shared machine
hits both. In each child, after two warm-up calls (the first one probes bubblewrap):

  run        sandbox.run_python("pass"), one at a time: wall ms per call
  score-call code.score on the built-in function templates (4-6 asserts each: one sandbox run)
  score-io   code.score on the built-in stdin/stdout templates (3-4 tests: one run each)
  x1, x2     code.score calls per second over all 33 templates, with 1 and 2 callers at once
             (threads; the after side's rows say parallel = callers, its slot count)

Medians over rounds. Writes results/sandbox.json and .md (results/sandbox_rlimits.* for --backend rlimits).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHILD = r'''
import json, os, statistics, sys, threading, time, warnings
warnings.simplefilter("ignore")
backend, n = sys.argv[1], int(sys.argv[2])
os.environ["RLPOST_SANDBOX"] = {"rlimits": "rlimit"}.get(backend, backend)  # the old code reads only this
os.environ["RLPOST_SANDBOX_ALLOW_ROOT"] = "1"  # measured on purpose, as root too (issue 41's refusal)
from rlpost.envs import code
try:
    from rlpost import sandbox  # rlpost/sandbox/ since issue 41
except ImportError:
    from rlpost.envs import sandbox
new = hasattr(sandbox, "resolve_backend")
rows = [code.make_row(t, t.space[len(t.space) // 2]) for t in code.TEMPLATES]
def stamp(row, k):
    return {**row, "sandbox": {"backend": backend, "parallel": k, "allow_root": True}} if new else row
def answer(row):
    return "```python\n" + row["answer"] + "```"
def ms(f, k):
    out = []
    for i in range(k):
        t = time.perf_counter(); f(i); out.append(1000 * (time.perf_counter() - t))
    return statistics.median(out)
def rate(callers):
    todo, lock, done = list(range(n)), threading.Lock(), []
    def work():
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop()
            r, _ = code.score(answer(rows[i % len(rows)]), stamp(rows[i % len(rows)], callers))
            done.append(r)
    t = time.perf_counter()
    threads = [threading.Thread(target=work) for _ in range(callers)]
    [th.start() for th in threads]; [th.join() for th in threads]
    assert done == [1.0] * n, done
    return n / (time.perf_counter() - t)
funcs = [r for r in rows if isinstance(r["tests"][0], str)]
ios = [r for r in rows if not isinstance(r["tests"][0], str)]
for _ in range(2):
    sandbox.run_python("pass"); code.score(answer(funcs[0]), stamp(funcs[0], 1))
print(json.dumps({
    "run": ms(lambda i: sandbox.run_python("pass"), n),
    "score-call": ms(lambda i: code.score(answer(funcs[i % len(funcs)]), stamp(funcs[i % len(funcs)], 1)), n),
    "score-io": ms(lambda i: code.score(answer(ios[i % len(ios)]), stamp(ios[i % len(ios)], 1)), max(6, n // 3)),
    "x1": rate(1), "x2": rate(2),
}))
'''
METRICS = [("run", "run_python('pass'), ms per call"), ("score-call", "score(), function task (1 run), ms"),
           ("score-io", "score(), stdin/stdout task (3-4 runs), ms"), ("x1", "score() calls/s, 1 at a time"),
           ("x2", "score() calls/s, 2 at a time")]


def measure(src: Path, backend: str, calls: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run([sys.executable, "-c", CHILD, backend, str(calls)], env=env, capture_output=True, text=True,
                         timeout=1800, cwd="/")
    if out.returncode:
        raise RuntimeError(f"{src}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="a checkout of the code to compare against (its src/ is used)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=40, help="calls per measurement")
    ap.add_argument("--backend", choices=["bwrap", "rlimits"], default="bwrap")
    args = ap.parse_args()
    sides = {"before": Path(args.before).resolve() / "src", "after": HERE.parent / "src"}
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for r in range(args.rounds):
        for side in (["before", "after"] if r % 2 == 0 else ["after", "before"]):
            runs[side].append(measure(sides[side], args.backend, args.calls))
            print(f"round {r + 1} {side}: {json.dumps({k: round(v, 1) for k, v in runs[side][-1].items()})}",
                  flush=True)
    med = {side: {k: statistics.median(x[k] for x in runs[side]) for k, _ in METRICS} for side in runs}
    before_rev = subprocess.run(["git", "-C", args.before, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
    meta = {"date": time.strftime("%Y-%m-%d"), "cpu": cpu_name(), "cores": os.cpu_count(), "backend": args.backend,
            "rounds": args.rounds, "calls": args.calls, "before": before_rev}
    (HERE / "results").mkdir(exist_ok=True)
    stem = "sandbox" if args.backend == "bwrap" else f"sandbox_{args.backend}"
    (HERE / "results" / f"{stem}.json").write_text(json.dumps({"meta": meta, "runs": runs, "median": med}, indent=1))
    lines = [f"{meta['date']}, {meta['cpu']}, {meta['cores']} cores, backend {args.backend}, "
             f"medians of {args.rounds} alternating rounds x {args.calls} calls; before = {before_rev}", "",
             "| | before | after | after / before |", "|---|---|---|---|"]
    lines += [f"| {label} | {med['before'][k]:.1f} | {med['after'][k]:.1f} | {med['after'][k] / med['before'][k]:.2f} |"
              for k, label in METRICS]
    (HERE / "results" / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
