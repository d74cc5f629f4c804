"""`make mutate`: mutation testing of rlpost's maths with mutmut 3 (issue 22).

Which code: everything in ``algorithms/`` (the algorithms, core.py, wrappers.py, objective.py, the
preference losses), ``search/metrics.py``, ``model/logprobs.py`` and ``model/chunked.py``, and the batch aggregation of
``roles/trainer.py`` (``update``/``_update``, ``_mini_batch``, ``_update_metrics``, ``train_step``/``_train_step``,
``sampler_diff_metrics``) with ``roles/forward_plan.py``'s ``DeviceSums``.
Which tests: the fast files listed in pyproject.toml's ``[tool.mutmut]``; mutmut runs, for each
mutant, only those of their tests that reach the mutated function. Lines that raise an error are
not mutated (``do_not_mutate_patterns``): their messages are not maths.

Usage (from the repository root, as ``make mutate`` runs it):
    python scripts/mutate.py            # run (results are cached in mutants/; changed code is re-run)
    python scripts/mutate.py --report   # only count what mutants/ holds
    python scripts/mutate.py NAME ...   # re-run these mutants (fnmatch patterns), e.g. after a new test

Prints the score and every survivor, and writes benchmarks/results/mutation.json. The survivors and
why each one is harmless are listed in tests/README.md.
"""

from __future__ import annotations

import datetime
import fnmatch
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAINER = "rlpost.roles.trainer."
SCOPE = [
    "rlpost.algorithms.*", "rlpost.search.metrics.*", "rlpost.model.logprobs.*", "rlpost.model.chunked.*",
    "rlpost.roles.forward_plan.xǁDeviceSumsǁ*",
    TRAINER + "x_sampler_diff_metrics__mutmut_*", TRAINER + "xǁTrainerǁupdate__mutmut_*",
    TRAINER + "xǁTrainerǁ_update__mutmut_*", TRAINER + "xǁTrainerǁ_mini_batch__mutmut_*",
    TRAINER + "xǁTrainerǁ_update_metrics__mutmut_*", TRAINER + "xǁTrainerǁtrain_step__mutmut_*",
    TRAINER + "xǁTrainerǁ_train_step__mutmut_*",
]
# mutmut's exit codes (mutmut/stats.py): 1 and 3 killed, 0 survived, 33 and 5 no tests reached it,
# 36/24/-24/152/255 timeout (a mutant that loops forever is caught), None not run yet.
KILLED, SURVIVED, NO_TESTS = {1, 3}, {0}, {5, 33}
TIMEOUT = {36, 24, -24, 152, 255}


def in_scope(name: str) -> bool:
    return any(fnmatch.fnmatch(name, p) for p in SCOPE)


def results() -> dict[str, int | None]:
    out = {}
    for meta in (ROOT / "mutants" / "src").rglob("*.py.meta"):
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            if in_scope(name):
                out[name] = code
    return out


def report(res: dict[str, int | None], seconds: float | None) -> dict:
    counts = {"total": len(res), "killed": sum(c in KILLED for c in res.values()),
              "timeout": sum(c in TIMEOUT for c in res.values()), "survived": sum(c in SURVIVED for c in res.values()),
              "no_tests": sum(c in NO_TESTS for c in res.values()), "not_run": sum(c is None for c in res.values())}
    counts["other"] = counts["total"] - sum(v for k, v in counts.items() if k != "total")
    caught = counts["killed"] + counts["timeout"]
    score = caught / max(1, counts["total"] - counts["not_run"])
    survivors = sorted(n for n, c in res.items() if c not in KILLED | TIMEOUT and c is not None)
    by_file: dict[str, list[int]] = {}
    for name, code in res.items():
        f = name.split(".x")[0]
        k = by_file.setdefault(f, [0, 0])
        k[0] += code in KILLED | TIMEOUT
        k[1] += code is not None
    record = {"date": datetime.date.today().isoformat(), "command": "make mutate  (python scripts/mutate.py)",
              "mutmut": _mutmut_version(), "score": round(score, 4), **counts,
              "per_module": {f: f"{k}/{n}" for f, (k, n) in sorted(by_file.items())},
              "wall_s": round(seconds, 1) if seconds else None, "load_avg": os.getloadavg()[0], "survivors": survivors}
    print(f"\nmutation score: {caught}/{counts['total'] - counts['not_run']} = {score:.1%} "
          f"(killed {counts['killed']}, timeout {counts['timeout']}, survived {counts['survived']}, "
          f"no tests {counts['no_tests']}, other {counts['other']}, not run {counts['not_run']})")
    for f, (k, n) in sorted(by_file.items()):
        print(f"  {f:40s} {k:5d}/{n}")
    for name in survivors:
        print(f"  survivor: {name} (exit {res[name]})")
    return record


def _mutmut_version() -> str:
    from importlib.metadata import version

    return version("mutmut")


# The maths first, then the modules whose tests run the tiny model (seconds per mutant, not ms):
# a run cut short has finished the first phase.
PHASES = [SCOPE[:2], SCOPE[2:]]


def pending(patterns: list[str]) -> list[str]:
    """Mutants matching ``patterns`` that are not caught yet: not run, survived, or reached by no
    test when they last ran (the tests may have grown since). mutmut re-runs every mutant it is
    named, so the caught ones are left out; changed code has its mutants reset to not run."""
    res = {}
    for meta in (ROOT / "mutants" / "src").rglob("*.py.meta"):
        res.update(json.loads(meta.read_text())["exit_code_by_key"])
    return sorted(n for n, c in res.items()
                  if any(fnmatch.fnmatch(n, p) for p in patterns) and c not in KILLED | TIMEOUT)


def mutmut(names: list[str]) -> int:
    return subprocess.run([sys.executable, "-m", "mutmut", "run", *names]).returncode


def main(argv: list[str]) -> int:
    os.chdir(ROOT)
    seconds = None
    if "--report" not in argv:
        start = datetime.datetime.now()
        if not (ROOT / "mutants" / "src").exists():  # first run: generate every mutant (runs phase 1 too)
            code = mutmut(SCOPE[:2])
            if code not in (0, 1):
                return code
        for phase in [argv] if argv else PHASES:
            names = pending(phase)
            print(f"mutate: {len(names)} mutants to run for {' '.join(phase)}", flush=True)
            code = mutmut(names) if names else 0
            if code not in (0, 1):
                return code
        seconds = (datetime.datetime.now() - start).total_seconds()
    record = report(results(), seconds)
    out = ROOT / "benchmarks" / "results" / "mutation.json"
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"written: {out.relative_to(ROOT)}")
    return 0 if record["score"] >= 0.95 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
