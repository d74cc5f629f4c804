"""``rlpost eval SUITE.yaml``: several held-out sets in one command, per set and per source, and
which problems flipped against an earlier model or result (a regression table).

A suite is a YAML file:

    model: embedded                      # what is evaluated (--model wins); a model folder, hub id or run/model
    overrides: [run.threads=2]           # optional, joined to every set's
    sets:
      arithmetic: [task.name=arithmetic]
      gsm8k: [task.name=math, task.eval_data=gsm8k_test.jsonl, task.prompt_column=question]

Each set is the held-out split its overrides make (``rlpost eval``'s config, ``key=value`` words
after the suite join every set), checked all before torch loads, then evaluated greedily as ``rlpost
eval`` does (recipes/evaluate.py: heldout_accuracy). Per set: accuracy, problems, and per source (a
mix's family or a row's ``data_source``). ``--against`` names the baseline: an earlier suite's
results JSON, or a model (folder, hub id, ``RUN/model``) the same suite is evaluated on first. Then
per set the problems (by prompt) that went from wrong to right (fixed) and right to wrong (broken).
Everything goes to ``--out`` (default ``SUITE.results.json``, next to the suite), as a page beside it
(the same name, ``.html``: tables and a bar plot, observe/suite_report.py), into the run's report when
the model evaluated is a run's (``RUN`` or ``RUN/model``: ``RUN/suites/SUITE.json``, ``RUN/report.html``)
and, on a terminal, as tables (JSON through a pipe or with ``--json``). ``--samples S`` adds pass@k and
maj@k per set and per source (evaluate's ``summarise`` over each source's samples); ``--judge MODEL``
a local judge's 1-9 grade of every greedy answer, with the judge prompt's version and text in the results (evaluate's
``judge_identity``). This module loads no torch: ``evaluation(name)`` hands it evaluate's functions
once every set's config has passed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from rlpost import config, machine
from rlpost.config_check import refuse_ignored
from rlpost.console import Parser, say
from rlpost.observe import suite_report
from rlpost.recipes.eval_args import eval_ks
from rlpost.recipes.search_args import holds_results, next_free
from rlpost.types.errors import ConfigError, writing

SUFFIXES = (".yaml", ".yml")


def is_suite(argv: list[str]) -> bool:
    """`rlpost eval X ...` where X is a suite file (a YAML file, not a run or model folder)."""
    values = taking_a_word(parser())  # --n 1: its 1 is no positional word; eval's own options are the suite's too
    words = [a for i, a in enumerate(argv) if not a.startswith("-") and "=" not in a
             and not (i and argv[i - 1] in values)]  # the positional words: after --n 1 too
    return bool(words) and words[0].lower().endswith(SUFFIXES) and not Path(words[0]).is_dir()  # .YAML as .yaml


def taking_a_word(p: argparse.ArgumentParser) -> set[str]:
    """The option strings of ``p`` that take a value (``--out X``), read from the parser itself."""
    return {o for a in p._actions if a.option_strings and a.nargs != 0 for o in a.option_strings}


def eval_table(result: dict) -> str:
    """`rlpost eval` on a terminal: one row per number, 3 decimals (--json, or a pipe, gets the JSON)."""
    width = max(map(len, result))
    return "\n".join(f"{k:<{width}}  {v:.3f}" if isinstance(v, float) else f"{k:<{width}}  {v}"
                     for k, v in result.items())


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="rlpost eval", description="Evaluate a suite of held-out sets (a YAML file).")
    p.add_argument("suite", metavar="SUITE.yaml")
    p.add_argument("args", nargs="*", metavar="key=value", help="dotted overrides joined to every set's")
    p.add_argument("--model", default="", help="the model evaluated (default: the suite's model, else embedded)")
    p.add_argument("--n", type=int, default=0, help="held-out problems per set (0 = all)")
    p.add_argument("--against", default="", help="baseline: an earlier suite results JSON, or a model evaluated first")
    p.add_argument("--out", default="", help="results JSON (default SUITE.results.json)")
    p.add_argument("--samples", type=int, default=0,
                   help="also S samples a problem: pass@k and maj@k per set and source")
    p.add_argument("--k", default="", help="comma-separated k for pass@k and maj@k (default: 1 and S)")
    p.add_argument("--judge", default="",
                   help="a local judge model (folder, embedded, tiny) grading each greedy answer 1-9 (open-ended sets)")
    p.add_argument("--json", action="store_true", help="print the results as JSON (the default through a pipe)")
    return p


def parse(argv: list[str]) -> argparse.Namespace:
    p = parser()
    args, extra = p.parse_known_args(argv)
    if any("=" not in a or a.startswith("-") for a in extra):
        p.error(f"unrecognized arguments: {' '.join(extra)}")
    args.args += extra
    if args.n < 0:
        raise ConfigError(f"--n: expected a whole number >= 0, got {args.n}")
    args.ks = eval_ks(args)
    if args.judge and not (args.judge in ("embedded", "tiny") or Path(args.judge).is_dir()):
        raise ConfigError(f"--judge {args.judge}: expected a local model folder (or embedded, tiny); a judge is never "
                          "fetched from the hub, so its version is the folder's")
    return args


def read_suite(path: str) -> tuple[str, list[str], dict[str, list[str]]]:
    """(model, overrides for every set, set -> its overrides); one ConfigError naming the file and key."""
    tree = config.read_yaml(path, what="suite")
    if set(tree) - {"model", "overrides", "sets"}:
        raise ConfigError(f"{path}: a suite has 'model', 'overrides' and 'sets', got {sorted(tree)}")
    sets = tree.get("sets")
    if not isinstance(sets, dict) or not sets:
        raise ConfigError(f"{path}: sets: expected a mapping of set names to lists of key=value overrides")
    for name, words in {"overrides": tree.get("overrides", []), **{f"sets.{k}": v for k, v in sets.items()}}.items():
        if not isinstance(words, list) or not all(isinstance(w, str) and "=" in w for w in words):
            raise ConfigError(f"{path}: {name}: expected a list of key=value overrides, got {words!r}")
    model = tree.get("model", "")
    if not isinstance(model, str):
        raise ConfigError(f"{path}: model: expected a model name, folder or hub id, got {model!r}")
    names = [str(k) for k in sets]
    if dup := next((n for n in names if names.count(n) > 1), None):  # YAML's 1 and "1" are two keys, one name
        raise ConfigError(f"{path}: sets: two sets named {dup!r} (a number and a string); rename one")
    return model, tree.get("overrides", []), {str(k): v for k, v in sets.items()}


def evaluate_suite(configs: dict, tasks: dict, model: str, args, evaluation) -> dict:
    """Per set: accuracy, n, per-source accuracies and each problem's greedy verdict (by prompt); with
    --samples, pass@k and maj@k per set and source; with --judge, the judge's mean score per set and source.
    tasks: each set's task, built (its rows read and checked) before any set was evaluated."""
    out = {}
    for name, cfg in configs.items():
        cfg = config.with_overrides(cfg, [f"model.name={model}"])
        dumps = [temp_file(), temp_file()]  # the greedy records, the sampled ones
        try:
            acc, used, summary = evaluation("heldout_accuracy")(cfg, n=args.n, samples=args.samples, ks=args.ks,
                                                                dump=dumps[0], sample_dump=dumps[1], task=tasks[name])
            records, sampled = ([json.loads(line) for line in d.read_text().splitlines()] for d in dumps)
        finally:
            for d in dumps:
                d.unlink(missing_ok=True)
        sources = {k.split("/", 1)[1]: v for k, v in summary.items() if k.startswith("heldout_accuracy/")}
        out[name] = {"heldout_accuracy": acc, "n": used, "by_source": sources,
                     "problems": {r["prompt"]: bool(r["correct"]) for r in records}}
        if args.samples:
            out[name]["sampled"] = per_source(records, sampled, lambda rs: evaluation("summarise")(rs, args.ks))
        if args.judge:
            scores = evaluation("judge_records")(records, args.judge, cfg.run.seed, cfg.rollout.dtype)
            mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
            out[name]["judge"] = {"mean_score": mean(scores), **{f"mean_score/{src}": mean(
                [x for x, r in zip(scores, records) if r.get("task") == src]) for src in sources},
                "scores": {r["prompt"]: x for r, x in zip(records, scores)}}
    return out


def temp_file() -> Path:
    handle, path = tempfile.mkstemp(suffix=".jsonl", prefix="rlpost-suite-")
    os.close(handle)
    return Path(path)


def per_source(greedy: list[dict], sampled: list[dict], summarise) -> dict:
    """The set's sampled summary (pass@1, pass@k, maj@k) and each source's: a sample's source is its
    problem's, as the greedy record of that problem (same order) names it."""
    out = summarise(sampled)
    for src in sorted({r["task"] for r in greedy if "task" in r}):
        mine = [s for s in sampled if greedy[s["problem"]].get("task") == src]
        out.update({f"{k}/{src}": v for k, v in summarise(mine).items()})
    return out


def flips(now: dict, before: dict) -> dict:
    """Per set in both: the prompts fixed (wrong before, right now) and broken (right before, wrong now)."""
    table = {}
    for name in now.keys() & before.keys():
        a, b = before[name]["problems"], now[name]["problems"]
        common = a.keys() & b.keys()
        table[name] = {"compared": len(common), "before": before[name]["heldout_accuracy"],
                       "now": now[name]["heldout_accuracy"],
                       "fixed": sorted(p for p in common if b[p] and not a[p]),
                       "broken": sorted(p for p in common if a[p] and not b[p])}
    return table


def tables(result: dict) -> str:
    """The terminal's view: one row per set (and source), then the regression table when there is one."""
    lines = [f"{'set':<24} {'accuracy':>8} {'n':>5}"]
    for name, r in result["sets"].items():
        lines.append(f"{name:<24} {r['heldout_accuracy']:>8.3f} {r['n']:>5}")
        lines += [f"  {src:<22} {acc:>8.3f}" for src, acc in r["by_source"].items()]
        sampled = {k: v for k, v in r.get("sampled", {}).items() if k.startswith(("pass@", "maj@")) and "/" not in k}
        if sampled:
            lines.append("  " + "  ".join(f"{k} {v:.3f}" for k, v in sampled.items()))
        if r.get("judge", {}).get("mean_score") is not None:
            lines.append(f"  judge score (1-9)      {r['judge']['mean_score']:>8.2f}")
    if "against" in result:
        lines += ["", f"against {result['against']}",
                  f"{'set':<24} {'before':>7} {'now':>7} {'fixed':>6} {'broken':>7}"]
        for name, f in result["flips"].items():
            lines.append(f"{name:<24} {f['before']:>7.3f} {f['now']:>7.3f} {len(f['fixed']):>6} {len(f['broken']):>7}")
            lines += [f"  broken: {p[:90]!r}" for p in f["broken"][:5]]  # the first few of each, by prompt
            lines += [f"  fixed:  {p[:90]!r}" for p in f["fixed"][:5]]
    return "\n".join(lines)


def main(argv: list[str], evaluation) -> int:
    """`rlpost eval SUITE.yaml ...`; evaluation(name): recipes/evaluate.py's function of that name (loads torch)."""
    args = parse(argv)
    model, common, sets = read_suite(args.suite)
    model = args.model or model or "embedded"
    configs = {}
    for name, words in sets.items():
        try:
            refuse_ignored("eval", [w.split("=", 1)[0] for w in [*common, *words, *args.args]])  # as rlpost eval
            configs[name] = machine.check(config.load(None, [f"model.name={model}", *common, *words, *args.args]))
        except ConfigError as e:
            raise ConfigError(f"{args.suite}: sets.{name}: {e}") from None
    against = args.against
    if against.lower().endswith(".json"):
        before = read_against(against, list(configs))
    out = results_path(args)
    if against and Path(against).resolve() == out.resolve():
        raise ConfigError(f"--out {out}: it is the --against file, which these results would replace; pick another "
                          "--out")
    tasks = {}
    for name, cfg in configs.items():  # every set's rows read and checked before any model loads
        try:
            tasks[name] = evaluation("build_task")(cfg.task, refuse_contaminated=False)
        except ConfigError as e:  # a DataError too: the file and line, under the set's name
            raise type(e)(f"{args.suite}: sets.{name}: {e}") from None
    if against and not against.lower().endswith(".json"):
        before = evaluate_suite(configs, tasks, against, args, evaluation)
    result = {"suite": args.suite, "model": model, "sets": evaluate_suite(configs, tasks, model, args, evaluation)}
    if args.samples:
        result.update(samples=args.samples, ks=args.ks)
    if args.judge:
        result["judge"] = evaluation("judge_identity")(args.judge)
    if against:
        result.update(against=against, flips=flips(result["sets"], before))
    with writing(out):
        out.write_text(json.dumps(result, indent=1) + "\n")
    report(result, out, Path(args.suite).stem, evaluation)
    print(json.dumps(result) if args.json or not sys.stdout.isatty() else tables(result))
    return 0


def read_against(path: str, names: list[str]) -> dict:
    """An earlier suite's results (``--against FILE.json``): set -> its results, checked for what the regression
    table reads before anything is evaluated; a file sharing no set with this suite is refused, missing sets said."""
    try:
        sets = json.loads(Path(path).read_text())["sets"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"--against: {path} is not a suite's results JSON ({type(e).__name__}: {e})") from None
    if not isinstance(sets, dict):
        raise ConfigError(f"--against: {path}: 'sets' is not a mapping of set names to results")
    for name, r in sets.items():
        if not (isinstance(r, dict) and isinstance(r.get("problems"), dict)
                and isinstance(r.get("heldout_accuracy"), (int, float))):
            raise ConfigError(f"--against: {path}: sets.{name} holds no 'heldout_accuracy' and 'problems' as a "
                              "suite's results do")
    shared = [n for n in names if n in sets]
    if not shared:
        raise ConfigError(f"--against: {path} shares no set with this suite (its sets: {', '.join(sets) or 'none'}; "
                          f"this suite's: {', '.join(names)})")
    if missing := [n for n in names if n not in sets]:
        say(f"--against {path} has no results for {', '.join(missing)}: no regression rows for them")
    return sets


def results_path(args) -> Path:
    """--out, else SUITE.results.json, numbered (SUITE.results.2.json, ...) where an earlier run's results are: a
    baseline is never replaced unasked. An --out that exists is replaced only when it holds a suite's results."""
    if not args.out:
        return next_free(Path(args.suite).with_suffix(".results.json"))
    out = Path(args.out)
    if out.exists() and not holds_results(out, {"sets", "suite"}):
        raise ConfigError(f"--out {out}: exists and is not a suite's results; pick another path")
    return out


def report(result: dict, out: Path, name: str, evaluation) -> None:
    """The results as HTML: OUT with .html beside the JSON, and, when the model is a run's (RUN or RUN/model), kept in
    RUN/suites/NAME.json and shown in RUN/report.html, rebuilt as `rlpost report RUN` does (observe/report.py's
    write_report, handed over by ``evaluation`` as evaluate's functions are: it loads torch, which this module never
    imports). A report that cannot be rebuilt is one line; the results are written all the same."""
    page = out.with_suffix(".html") if out.suffix != ".html" else out.with_name(out.name + ".html")
    with writing(page):
        page.write_text(suite_report.page(result))
    run = suite_report.run_of(result["model"])
    if run is not None:
        kept = suite_report.record(run, result, name)
        try:
            evaluation("write_report")(run)
            say(f"suite results kept in {kept}; shown in {run / 'report.html'}")
        except (OSError, ValueError, RuntimeError) as e:  # the run's own files damaged (ConfigError is a ValueError)
            why = (str(e).strip().splitlines() or [type(e).__name__])[-1]
            say(f"suite results kept in {kept}; {run / 'report.html'} not rebuilt: rlpost: error: {why}")
