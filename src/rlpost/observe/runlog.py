"""Everything a run writes besides checkpoints: metrics.jsonl, samples/, summary.json, the
progress bar and the closing table. Every recipe logs through it (the RL loop, sft/rm/dpo and the
rounds built on them), so every line also reaches the ``run.loggers`` sinks as it is written.

metrics.jsonl has one JSON object per training step, with verl's metric names where verl has
one. On resume, lines for steps after the checkpoint are dropped first (and a line torn by a crash
with them), so the file reads as if the run had never stopped. A metrics file deleted since, or
damaged in the middle (a line that is not JSON, a step missing), is rebuilt from the copy the
checkpoint keeps of its lines (model/checkpoint.py), the damaged file kept beside it as
``metrics.jsonl.damaged-N``, and the run says so in one line: no step's line is lost. Appends are whole lines or nothing
(observe/jsonl.py); a write that fails ends the run with one line naming the file and the cause.
"""

from __future__ import annotations

import json
import math
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from tqdm import tqdm

from rlpost.console import say
from rlpost.model import checkpoint
from rlpost.model.checkpoint import write_atomic
from rlpost.observe import jsonl
from rlpost.observe.diagnostics import Health
from rlpost.observe.loggers import Loggers
from rlpost.types.errors import DataError, RunError, write_cause


@contextmanager
def timed(name: str, timings: dict):
    """Add the wall-clock seconds of the block to timings["timing_s/<name>"]: a whole stage, never
    lines inside one, so the stages add up to the step and a timer never splits what a reader follows."""
    t0 = time.perf_counter()
    yield
    timings[f"timing_s/{name}"] = timings.get(f"timing_s/{name}", 0.0) + time.perf_counter() - t0


def rl_postfix(metrics: dict, history: list[dict]) -> dict:
    """The RL loop's progress-bar figures: the step's reward and seconds, the last held-out accuracy."""
    acc = next((h["eval/heldout_accuracy"] for h in reversed(history) if "eval/heldout_accuracy" in h), None)
    post = {"reward": f"{metrics['reward/mean']:.3f}", "s/step": f"{metrics['timing_s/step']:.1f}"}
    if acc is not None:
        post["heldout"] = f"{acc:.3f}"
    return post


# The row's columns that are its prompt, not data a reward function reads for its gold (envs/dataset.py: to_row)
PROMPT_COLUMNS = ("messages", "prompt", "answer")


def sample_extras(row: dict) -> dict:
    """What a sample's line keeps beside its last prompt message: an environment episode's whole
    first turn (``opening``: the messages its reset gave, system prompt included, and ``tools``:
    the tools offered, as roles/rollout_env.py logs them in the row), and, for a row with no
    ``answer`` (task.answer_column=''), its other short columns by name (``columns``), where the
    gold a reward function reads sits under whatever name the data gives it."""
    out: dict = {}
    if "_opening" in row:
        out["opening"] = {"messages": row["_opening"], **({"tools": row["_tools"]} if row.get("_tools") else {})}
    if row.get("answer") is None:
        columns = {k: v for k, v in row.items() if k not in PROMPT_COLUMNS and not k.startswith("_")
                   and isinstance(v, (str, int, float, bool)) and len(str(v)) <= 500}
        if columns:
            out["columns"] = columns
    return out


class RunLog:
    def __init__(self, run_dir: Path, steps: int, start_step: int, progress: bool, sinks: Loggers | None = None,
                 ckpt: Path | None = None, *, desc: str = "train",
                 postfix: Callable[[dict, list[dict]], dict] = rl_postfix, rollouts: bool = True):
        """``ckpt``: the checkpoint a resume starts from (its copy of the metric lines). desc, postfix:
        the progress bar's name and figures; rollouts: the RL loop's run, whose steps write their
        samples (samples/step_N.jsonl) and whose lines get the health checks."""
        self.dir = Path(run_dir)
        self.sinks = sinks
        self.health = Health(warn=lambda msg: tqdm.write(f"rlpost: {msg}", file=sys.stderr)) if rollouts else None
        if rollouts:
            (self.dir / "samples").mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.dir / "metrics.jsonl"
        self.truncate_after(start_step, ckpt)
        self.history = jsonl.read_lines(self.metrics_path)
        self.steps, self.start_step, self.progress = steps, start_step, progress
        self.desc, self.postfix, self.rollouts = desc, postfix, rollouts
        self.bar = None
        self.began = self.ended = None  # time.perf_counter() at begin and at the first close: the loop's span

    def begin(self) -> None:
        """Show the progress bar (after any messages printed before training starts)."""
        self.began = time.perf_counter()
        self.bar = tqdm(total=self.steps, initial=self.start_step, desc=self.desc, unit="step",
                        disable=not self.progress, file=sys.stderr, dynamic_ncols=True)

    def truncate_after(self, step: int, ckpt: Path | None = None) -> None:
        """Keep the lines of steps 1..step (a resume; none for a new run), rebuilt from ``ckpt``'s
        copy when the file lost some of them."""
        path, rows, problem = self.metrics_path, [], None
        if path.exists():
            try:
                rows = [r for r in jsonl.read_lines(path) if r["step"] <= step]
            except DataError as e:
                problem = str(e)
            else:
                gaps = sorted(set(range(1, step + 1)) - {r["step"] for r in rows})
                problem = f"{path}: the lines of steps {_spans(gaps)} are missing" if gaps else None
        elif step > 0:
            problem = f"{path}: missing"
        if problem is not None:
            rows = self._rebuilt(step, ckpt, problem)
        if path.exists() or rows:
            jsonl.rewrite(path, rows)
        for f in (self.dir / "samples").glob("step_*.jsonl"):
            if f.stem.split("_")[1].isdigit() and int(f.stem.split("_")[1]) > step:
                f.unlink()

    def _rebuilt(self, step: int, ckpt: Path | None, problem: str) -> list[dict]:
        """Steps 1..step from the checkpoint's copy; the damaged file kept aside."""
        saved = checkpoint.saved_metrics(ckpt) if ckpt is not None else None
        if saved is None:
            if self.metrics_path.exists():  # nothing to rebuild it from: refused, the file left as it is
                raise DataError(f"{problem}; checkpoint {ckpt.name if ckpt else ''} (an older rlpost) keeps no copy to "
                                "rebuild it from: repair the file, or resume with --start-over")
            say(f"{problem}; checkpoint {ckpt.name if ckpt else ''} (an older rlpost) keeps no copy of it: "
                f"steps 1-{step} will have no metric lines")
            return []
        kept = ""
        if self.metrics_path.exists():
            aside = next(self.dir / f"metrics.jsonl.damaged-{i}" for i in range(1, 10**6)
                         if not (self.dir / f"metrics.jsonl.damaged-{i}").exists())
            self.metrics_path.rename(aside)
            kept = f"; the damaged file is kept as {aside.name}"
        rows = [r for r in saved if r["step"] <= step]
        say(f"{problem}; rebuilt steps {_spans([r['step'] for r in rows])} from {ckpt.name}'s copy{kept}")
        return rows

    def step(self, step: int, metrics: dict, batch=None) -> None:
        """One step's line: to the sinks, then metrics.jsonl (whole or absent), as it happens."""
        line = {"step": step, **{k: _clean(v) for k, v in sorted(metrics.items())}}
        if self.health is not None:
            line.update(self.health.metrics(self.history + [line]))  # health/<check>: 1.0 once it fires
        if self.sinks is not None:
            self.sinks.log(step, line)
        if self.rollouts:
            self.write_samples(step, batch)  # first: a step's metrics line means its samples are there too
        jsonl.append(self.metrics_path, line)
        self.history.append(line)
        self.bar.update(1)
        self.bar.set_postfix(self.postfix(metrics, self.history))

    def write_samples(self, step: int, batch) -> None:
        path = self.dir / "samples" / f"step_{step:06d}.jsonl"
        try:
            with open(path, "w") as f:
                rewards = batch.reward.tolist() if batch else []
                for i, (row, completion) in enumerate(zip(batch.rows, batch.completions) if batch else ()):
                    info = batch.infos[i] if batch.infos else {}  # the verifier's own: verl's extras, a parsed answer
                    f.write(json.dumps({"prompt": row["messages"][-1]["content"], "completion": completion,
                                        "reward": rewards[i], "answer": row.get("answer"), **sample_extras(row),
                                        **({"info": info} if info else {})}, default=str) + "\n")
        except OSError as e:
            path.unlink(missing_ok=True)
            raise RunError(f"cannot write {path}: {write_cause(path, e)}") from None

    def close(self) -> None:
        """Close the progress bar and the sinks (again is a no-op)."""
        if self.began is not None and self.ended is None:
            self.ended = time.perf_counter()
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.sinks is not None:
            self.sinks.close()
            self.sinks = None

    def summary(self, before: float, after: float, minutes: float, extra: dict) -> dict:
        steps = [h.get("reward/mean") for h in self.history]
        # a step's mean that is not a finite number (a metric the JSON log holds as null) is left out of the averages
        rewards = [r for r in steps if isinstance(r, (int, float)) and math.isfinite(r)]
        k = max(1, min(5, len(rewards) // 4))
        out = {
            "heldout_accuracy_before": before,
            "heldout_accuracy_after": after,
            "reward_mean_first": sum(rewards[:k]) / k if rewards else None,
            "reward_mean_last": sum(rewards[-k:]) / k if rewards else None,
            "steps": len(steps),
            "wall_minutes": minutes,
            **extra,
        }
        return self.write_summary(out)

    def write_summary(self, out: dict) -> dict:
        """summary.json (atomic: whole or absent); returns ``out``."""
        write_atomic(self.dir / "summary.json", json.dumps(out, indent=2) + "\n")
        return out


def closing_table(summary: dict) -> str:
    """The table printed when a run ends: held-out accuracy before/after (a mix's also per family),
    the reward's first/last mean, steps and wall time."""
    b, a = summary["heldout_accuracy_before"], summary["heldout_accuracy_after"]
    lines = [f"{'':24s}{'before':>10s}{'after':>10s}",
             f"{'held-out accuracy':24s}{b:>10.3f}{a:>10.3f}   ({delta(summary)})"]
    for task in [k.partition("/")[2] for k in summary if k.startswith("heldout_accuracy_before/")]:  # a mix's families
        tb, ta = summary[f"heldout_accuracy_before/{task}"], summary.get(f"heldout_accuracy_after/{task}", float("nan"))
        lines.append(f"{'  ' + task:24s}{tb:>10.3f}{ta:>10.3f}   ({100 * (ta - tb):+.1f} points, "
                     f"{summary.get(f'heldout_n/{task}')} problems)")
    kb, ka = summary.get("passk_before") or {}, summary.get("passk_after") or {}
    for k in sorted({"1", max(kb, key=int)} & set(ka), key=int) if kb else ():  # the curve's ends: pass@1, pass@64
        lines.append(f"{f'pass@{k} (sampled)':24s}{kb[k]:>10.3f}{ka[k]:>10.3f}   "
                     f"({summary.get('passk_problems')} problems)")
    if summary.get("reward_mean_first") is not None:
        first, last = summary["reward_mean_first"], summary["reward_mean_last"]
        spec = ">10.3f" if max(abs(first), abs(last)) < 1e5 else ">10.3g"  # a huge reward scale keeps the columns
        lines.append(f"{'reward/mean (first/last)':24s}{first:{spec}}{last:{spec}}")
    lines.append(f"{'steps / wall time':24s}{summary['steps']:>10d}{summary['wall_minutes']:>9.1f}m")
    if summary.get("wall_s"):
        lines.append("wall time (s): " + ", ".join(f"{k} {v:.1f}" for k, v in summary["wall_s"].items()))
    return "\n".join(lines)


def wall_split(log: RunLog, started: float, end: dict[str, float]) -> dict[str, float]:
    """Where this process's wall time went, in seconds: from ``started`` (time.perf_counter()) to the
    loop (start-up: the roles built, held-out accuracy before), the steps (their ``timing_s/step``),
    between them (checkpoints, the metric and sample files, the progress bar), closing the roles, then
    ``end``'s phases (the export, held-out accuracy after). Empty where the loop never began."""
    if log.began is None or log.ended is None:
        return {}
    steps = sum(h.get("timing_s/step", 0.0) for h in log.history if h.get("step", 0) > log.start_step)
    loop = log.ended - log.began
    closing = time.perf_counter() - log.ended - sum(end.values())
    return {"start-up": log.began - started, "steps": steps, "between steps": max(loop - steps, 0.0),
            "closing": max(closing, 0.0), **end}


def delta(summary: dict) -> str:
    """The held-out accuracy's change in points, with its paired standard error and how many greedy
    answers changed (recipes/evaluate.paired_delta), or that RUN/model holds the starting weights."""
    b, a = summary["heldout_accuracy_before"], summary["heldout_accuracy_after"]
    if summary.get("weights_changed") is False:  # the same model: no gain, whatever a measurement said
        return "+0.0 points: RUN/model holds the starting weights, unchanged"
    se, n = summary.get("heldout_delta_se"), summary.get("heldout_n")
    if se is None:
        return f"{100 * (a - b):+.1f} points"
    moved = summary.get("heldout_answers_changed")
    return f"{100 * (a - b):+.1f} ± {100 * se:.1f} points, paired s.e.; {moved} of {n} answers changed"


def _spans(steps: list[int]) -> str:
    """'1-3, 7' for [1, 2, 3, 7]."""
    out, start = [], None
    for i, s in enumerate(steps):
        start = s if start is None else start
        if i + 1 == len(steps) or steps[i + 1] != s + 1:
            out.append(f"{start}-{s}" if s > start else str(s))
            start = None
    return ", ".join(out) or "none"


def _clean(v):
    if isinstance(v, list):  # histograms: counts per bin
        return [_clean(x) for x in v]
    v = float(v) if not isinstance(v, (int, float)) else v
    return None if isinstance(v, float) and not math.isfinite(v) else v
