"""Held-out evaluation: greedy accuracy (``rlpost eval``, the loop's before/after and every
``run.eval_every`` steps, the pipeline's stage table, online DPO's rounds), and evaluation at a
fixed sampling budget: pass@1, unbiased pass@k and maj@k, per-sample records.

``rlpost eval TARGET --samples S`` draws S completions of every held-out problem at the sampling
temperature, scores each with the task's verifier, and reports

  pass@1   the mean correctness of all samples (the sampled, not greedy, accuracy)
  pass@k   Chen et al.'s unbiased estimator from the S samples, for each k <= S asked for
  maj@k    whether the most common answer among k samples is correct (self-consistency), its
           expectation over every k of the S samples (search/metrics.py), so maj@1 = pass@1

next to the greedy accuracy (one sample, temperature 0). Majority voting needs an answer, not a
completion: it is the verifier's parsed answer (``pred``, ``parsed`` or ``extracted`` in its
info), or else the stripped completion. Every sample is written to a JSONL file, so any number
can be recomputed or inspected later. Two evaluations writing one name at once (two ``rlpost eval
RUN`` both choosing ``RUN/eval_samples.jsonl``) never overwrite each other: each writes a file of
its own and links it to the name, which fails when the name was taken meanwhile; the later one
then takes the next free number (``publish``).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from rlpost import build, config
from rlpost.envs import DEFAULT_VERIFIER, Task, build_task, is_correct
from rlpost.envs.mix import source_of
from rlpost.model import precision
from rlpost.observe import jsonl
from rlpost.recipes.guard import check_reward_failures
from rlpost.rewards import judge
from rlpost.console import say
from rlpost.search.metrics import maj_at_k, pass_at_k
from rlpost.types.errors import writing
from rlpost.types.roles import Roles

ACCURACY = "eval/heldout_accuracy"  # the metric; a mix adds one per family, ACCURACY/<family>


def evaluate(roles: Roles, rows: list[dict], cfg: config.Config, dump: Path | None = None) -> float:
    """Greedy held-out accuracy: the fraction of rows the task's verifier marks correct."""
    return heldout_scores(roles, rows, cfg, dump)[ACCURACY]


def heldout_scores(roles: Roles, rows: list[dict], cfg: config.Config, dump: Path | None = None) -> dict:
    """Greedy held-out accuracy as metrics: eval/heldout_accuracy and, for a mix (task.mix), each
    family's as eval/heldout_accuracy/<family> (verl's val-core/<data_source>/...). ``dump``
    receives one record per row: prompt, completion, answer, correct and, in a mix, its task."""
    records, scored = [], {}
    bs = cfg.run.eval_batch_size
    grouped = len({source_of(r) for r in rows} - {None}) > 1  # one data_source is the whole: no group of its own
    for i in progress(range(0, len(rows), bs), len(rows), bs, "held-out", cfg.run.progress):
        batch = roles.rollout.generate(rows[i : i + bs], n=1, temperature=0.0, top_p=1.0,
                                       max_new_tokens=cfg.rollout.max_new_tokens)
        rewards, infos, m = roles.grader.score(batch)
        scored = {k: scored.get(k, 0) + v for k, v in m.items() if k.startswith("verifier/")}
        for row, completion, r, info in zip(batch.rows, batch.completions, rewards.tolist(), infos):
            records.append({"prompt": row["messages"][-1]["content"], "completion": completion,
                            "answer": row.get("answer"), "correct": is_correct(info, r),
                            **({"task": source_of(row)} if grouped and source_of(row) is not None else {}),
                            **({"info": info} if info else {})})
    check_reward_failures(scored, cfg.task.max_reward_error_frac, "on the held-out rows", True,
                          "no accuracy can be measured with it")  # a verifier returning text would read as 0
    if dump is not None:
        with writing(dump):
            dump.write_text("".join(json.dumps(r, default=str) + "\n" for r in records))
    per_task = {f"{ACCURACY}/{t}": acc for t, (acc, _) in by_task(records).items()}
    return {ACCURACY: sum(r["correct"] for r in records) / max(1, len(records)), **per_task}


def progress(starts, total: int, step: int, desc: str, shown: bool):
    """The batch starts of an evaluation pass, with a bar of the ``total`` problems and an ETA on
    stderr (run.progress), as training's bar is drawn (observe/runlog.py); it leaves no line behind,
    so the training bar it may run under stays where it was."""
    with tqdm(total=total, desc=desc, unit="problem", disable=not shown, file=sys.stderr, dynamic_ncols=True,
              leave=False) as bar:
        for start in starts:
            yield start
            bar.update(min(step, total - start))


def eval_sizes(cfg: config.Config, n_heldout: int, env: bool) -> tuple[int, int, str | None]:
    """(held-out problems, pass@k problems, the line that says what was sized down or None) of a
    run, sized to it unless run.full_eval: the pass@k curve (PASSK_SAMPLES samples a problem, at
    the start and again at the end) draws at most the completions the run samples to train on,
    run.steps x rollout.prompts_per_step x rollout.group_size (fewer problems; off when that is
    under PASSK_SAMPLES); an environment run holds out at most one episode per prompt it trains on, run.steps x
    rollout.prompts_per_step (its episodes are many turns each). ``n_heldout``: the task's held-out
    rows."""
    run, rollout = cfg.run, cfg.rollout
    heldout = min(run.eval_n or n_heldout, n_heldout)
    passk = min(run.passk_eval, heldout)
    if run.full_eval:
        return heldout, passk, None
    budget = run.steps * rollout.prompts_per_step * rollout.group_size
    sized_heldout = min(heldout, run.steps * rollout.prompts_per_step) if env else heldout
    sized_passk = min(passk, budget // PASSK_SAMPLES, sized_heldout)
    said = []
    if sized_passk < passk:
        said.append(f"the pass@k curve {'off' if not sized_passk else f'on {sized_passk} problems'} "
                    f"({passk} x {PASSK_SAMPLES} samples = {passk * PASSK_SAMPLES:,}, at the start and the end, "
                    f"against the {budget:,} the run trains on)")
    if sized_heldout < heldout:
        said.append(f"{sized_heldout} held-out episodes of {heldout} (one per training prompt)")
    line = (f"evaluation sized to this {run.steps}-step run: {'; '.join(said)}; run.full_eval=true evaluates in "
            "full") if said else None
    return sized_heldout, sized_passk, line


@contextlib.contextmanager
def threads(n: int):
    """torch computes on ``n`` threads inside, as before outside. A held-out measurement's count:
    a bf16 matmul's rounding depends on how the work is split between threads (the demo's 135M
    model gave 3 of 40 other greedy answers on 1 thread than on 2, the same weights, AMX Xeon), and
    model/cores.py moves the count during a run, so the loop measures before and after on one."""
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def saved_model_scores(cfg: config.Config, folder: Path, task, rows: list[dict], dump: Path, passk_rows: int,
                       run_dir: Path | None = None, make_roles=build.build_roles,
                       weights: dict | None = None) -> tuple[float, dict]:
    """(greedy held-out accuracy, pass@k curve) of the model folder a run saved (RUN/model), on a
    sampler built as the run's first one was (build_roles for evaluation: the folder loaded, moved
    to run.device, copied, cast to rollout.dtype), never used before, over the same rows in the same
    batches: the way the loop measured "before" on its fresh sampler. ``dump`` receives the greedy
    records (eval_after.jsonl); ``make_roles``: the run's builder of roles (train's). ``weights``:
    the tensors ``folder`` holds or is being written from (recipes/rl.py's closing, which writes RUN/model
    meanwhile): the sampler is then cfg's model.name with them loaded, as a resumed run's is built from
    its checkpoint, rather than the folder read back."""
    if weights is None:
        cfg = config.with_overrides(cfg, [f"model.name={folder}"])
    roles = make_roles(cfg, task, weights, for_eval=True, run_dir=run_dir)
    try:
        return evaluate(roles, rows, cfg, dump), passk_curve(roles, rows[:passk_rows], cfg)
    finally:
        roles.close()


def paired_delta(before: list[dict], after: list[dict]) -> dict:
    """How greedy held-out answers moved between two dumps of the same problems in the same order
    (eval_before.jsonl, eval_after.jsonl): the accuracy's change, its standard error, and how many
    answers (completions) changed; {} when the dumps are not of the same prompts.

    The standard error is the paired one, of the per-problem differences d_i = after_i - before_i
    (each -1, 0 or 1): sqrt(sum (d_i - mean d)^2 / (n (n - 1))). Both accuracies are measured on
    the same problems, so they are correlated (a problem the model solved before it mostly solves
    after); the unpaired sqrt(p_b (1 - p_b) / n + p_a (1 - p_a) / n) ignores that and overstates
    the error, most where few answers moved (no answer moved: paired 0, unpaired up to 0.07 at
    n = 100). None below 2 problems."""
    if len(before) != len(after) or any(b.get("prompt") != a.get("prompt") for b, a in zip(before, after)):
        return {}
    n = len(before)
    d = [int(bool(a["correct"])) - int(bool(b["correct"])) for b, a in zip(before, after)]
    mean = sum(d) / n if n else 0.0
    se = math.sqrt(sum((x - mean) ** 2 for x in d) / (n * (n - 1))) if n >= 2 else None
    changed = sum(b.get("completion") != a.get("completion") for b, a in zip(before, after))
    return {"heldout_delta": mean, "heldout_delta_se": se, "heldout_answers_changed": changed}


def by_task(records: list[dict]) -> dict[str, tuple[float, int]]:
    """Per task (a mix's family, or a dataset's data_source) of the records that name one: (accuracy,
    number of records); {} when none does."""
    counts: dict[str, list[int]] = {}
    for rec in records:
        if "task" in rec:
            c = counts.setdefault(rec["task"], [0, 0])
            c[0], c[1] = c[0] + bool(rec["correct"]), c[1] + 1
    return {t: (right / n, n) for t, (right, n) in counts.items()}


EVAL_RECORD = {"correct": bool, "task?": str}  # what by_task reads of a held-out dump's line


def by_task_summary(samples: Path) -> dict:
    """summary.json's per-task held-out results of a mix, from the run's eval_before/eval_after.jsonl
    dumps (so a resumed run has its first run's 'before'): heldout_accuracy_before/<task>,
    heldout_accuracy_after/<task>, heldout_n/<task>; {} outside a mix."""
    out = {}
    for when in ("before", "after"):
        path = samples / f"eval_{when}.jsonl"
        records = jsonl.read_lines(path, EVAL_RECORD)  # [] when absent; a damaged line is named
        for t, (acc, n) in by_task(records).items():
            out[f"heldout_accuracy_{when}/{t}"], out[f"heldout_n/{t}"] = acc, n
    return out


def first_rows(rows: list[dict], n: int, flag: str, split: str) -> list[dict]:
    """The first ``n`` rows (0 = all), and one line when there are fewer than asked: a set capped by
    task.n_heldout / task.n_train (or a short file) must not pass for the size asked."""
    if n > len(rows):
        key = "task.n_heldout" if split == "held-out" else "task.n_train"
        say(f"{flag} {n}: the task has {len(rows)} {split} rows (the file's, capped by {key}); using those")
    return rows[: n or None]


def heldout_accuracy(cfg: config.Config, weights: dict | None = None, n: int = 0, samples: int = 0,
                     ks: list[int] = (), dump: Path | None = None,
                     sample_dump: Path | None = None, n_key: str = "--n", task=None) -> tuple[float, int, dict]:
    """(greedy held-out accuracy, problems used, sampled summary) of cfg.model, with checkpoint
    `weights` if given; n = 0 uses every held-out problem (``n_key``: where n was set, for the line
    that says the set is smaller). With samples > 0 it also draws that many
    completions per problem at rollout.temperature, drawn from run.seed, and reports pass@1, pass@k and maj@k for each
    k in ks; `dump` receives every record (the sampled ones when there are: `rlpost eval`'s file),
    or with `sample_dump` the greedy ones, the sampled going there (eval SUITE keeps both). A mix's
    summary has each family's greedy accuracy (heldout_accuracy/<family>). ``task``: cfg.task built already."""
    if task is None:
        task = build_task(cfg.task, refuse_contaminated=False)  # evaluation reports contamination, training refuses it
    roles = build.build_roles(cfg, task, weights, for_eval=True)
    rows = first_rows(task.heldout, n, n_key, "held-out")
    found = {k: v for k, v in (task.contamination or {}).items() if k != "contamination_examples"}
    if task.skipped_rows:  # never silently: a held-out set that lost rows is another set
        found["skipped_rows"] = task.skipped_rows
        say(f"skipped {task.skipped_rows} data rows it could not read or grade (task.on_bad_row=skip; training and "
            "held-out files together); counted in the result as skipped_rows")
    try:
        scores = heldout_scores(roles, rows, cfg, dump if not samples or sample_dump else None)
        # a mix's, per family
        # only the prefix goes: a per-source name keeps its own text (lighteval/MATH, not lightMATH)
        acc, per_task = scores.pop(ACCURACY), {k.removeprefix("eval/"): v for k, v in scores.items()}
        if not samples:
            return acc, len(rows), {**per_task, **found}
        rollout = cfg.rollout
        torch.manual_seed(cfg.run.seed)  # as curate's pass rates and the pass@k curve: the same samples each time
        records = sample_records(roles, rows, samples, rollout.temperature, rollout.top_p, rollout.max_new_tokens,
                                 cfg.run.eval_batch_size, f"{samples} samples", cfg.run.progress)
        if (sample_dump or dump) is not None:
            write_records(records, sample_dump or dump)
        return acc, len(rows), {"samples": samples, "temperature": rollout.temperature, **summarise(records, list(ks)),
                                **per_task, **found}
    finally:
        roles.close()


@dataclass
class TextBatch:
    """Completions and their rows: all of a batch a verifier or a pointwise judge reads, for text that was not
    sampled as one batch (a search's choices, a dump's records)."""

    completions: list[str]
    rows: list[dict]

    def __len__(self) -> int:
        return len(self.completions)


# The judge prompt's version, recorded with every judged result: bump it with any change to rewards/judge.py's
# POINTWISE_PROMPT, POINTWISE_PREFIX or DEFAULT_RUBRIC (tests/recipes/test_suite.py pins their hash to this number),
# so two results judged by different prompts never read as comparable.
JUDGE_PROMPT_VERSION = 1


def judge_identity(judge_model: str) -> dict:
    """What a judged result records of its judge: the model, the prompt's version and text, the rubric, a hash."""
    text = json.dumps([judge.POINTWISE_PROMPT, judge.POINTWISE_PREFIX, judge.DEFAULT_RUBRIC])
    return {"model": judge_model, "prompt_version": JUDGE_PROMPT_VERSION, "prompt": judge.POINTWISE_PROMPT,
            "prefix": judge.POINTWISE_PREFIX, "rubric": judge.DEFAULT_RUBRIC, "scale": 9,
            "sha256": hashlib.sha256(text.encode()).hexdigest()}


def judge_records(records: list[dict], judge_model: str, seed: int, dtype: str) -> list[float]:
    """Each greedy record's completion graded 1-9 by a local judge (rewards/judge.py: pointwise, the default
    rubric, the expected score over the label tokens), asked the record's prompt."""
    grader = judge.Judge(judge_model, "pointwise", "", seed, False, dtype=precision.sampler_dtype(dtype))
    rows = [{"messages": [{"role": "user", "content": r["prompt"]}]} for r in records]
    _, infos, _ = grader.score(TextBatch([r["completion"] for r in records], rows))
    return [info["judge_score"] for info in infos]


def answer_key(info: dict, completion: str) -> str | None:
    for key in ("pred", "parsed", "extracted"):
        if isinstance(info.get(key), str):
            return info[key]
    return completion.strip() or None


def model_accuracy(cfg: config.Config, model: str) -> float:
    """Greedy held-out accuracy of the model folder (or spec) `model` on cfg's task, over run.eval_n
    problems (0 = all): the number each pipeline stage and online-DPO round reports."""
    return heldout_accuracy(config.with_overrides(cfg, [f"model.name={model}"]), n=cfg.run.eval_n,
                            n_key="run.eval_n")[0]


def sample_records(roles, rows: list[dict], samples: int, temperature: float, top_p: float, max_new_tokens: int,
                   batch_size: int, desc: str = "sampled", shown: bool = False) -> list[dict]:
    """One record per (problem, sample): problem index, sample index, completion, answer, correct;
    ``shown``: with a progress bar named ``desc``."""
    records = []
    per_call = max(1, batch_size // samples)
    for i in progress(range(0, len(rows), per_call), len(rows), per_call, desc, shown):
        batch = roles.rollout.generate(rows[i : i + per_call], n=samples, temperature=temperature, top_p=top_p,
                                       max_new_tokens=max_new_tokens)
        rewards, infos, _ = roles.grader.score(batch)
        for j, (row, completion, r, info) in enumerate(zip(batch.rows, batch.completions, rewards.tolist(), infos)):
            records.append({"problem": i + j // samples, "sample": j % samples,
                            "prompt": row["messages"][-1]["content"], "completion": completion,
                            "gold": row.get("answer"), "answer": answer_key(info, completion), "reward": r,
                            "correct": is_correct(info, r)})
    return records


def pass_rates(cfg: config.Config, rows: list[dict], k: int) -> list[float]:
    """Each row's share of k samples (rollout.temperature, run.seed) its verifier marks correct: rlpost curate's band
    (recipes/curate.py)."""
    build.check(cfg)
    task = Task(rows, rows, cfg.task.verifier or DEFAULT_VERIFIER.get(cfg.task.name, ""))
    torch.manual_seed(cfg.run.seed)
    roles = build.build_roles(cfg, task, for_eval=True)
    try:
        records = sample_records(roles, rows, k, cfg.rollout.temperature, cfg.rollout.top_p,
                                 cfg.rollout.max_new_tokens, max(cfg.run.eval_batch_size, k), f"{k} samples",
                                 cfg.run.progress)
    finally:
        roles.close()
    right = [0] * len(rows)
    for rec in records:
        right[rec["problem"]] += bool(rec["correct"])
    return [c / k for c in right]


def summarise(records: list[dict], ks: list[int]) -> dict:
    """pass@1, pass@k and maj@k (averaged over problems) from per-sample records."""
    by_problem: dict[int, list[dict]] = {}
    for rec in records:
        by_problem.setdefault(rec["problem"], []).append(rec)
    out = {"problems": len(by_problem)}
    for k in ks:
        pk, mk = [], []
        for recs in by_problem.values():
            recs = sorted(recs, key=lambda r: r["sample"])
            n, c = len(recs), sum(r["correct"] for r in recs)
            if k > n:
                raise ValueError(f"k={k} is more than the {n} samples drawn per problem (--samples)")
            right = {r["answer"] for r in recs if r["correct"]}
            pk.append(pass_at_k(n, c, k))
            mk.append(maj_at_k([r["answer"] for r in recs], lambda a, right=right: a in right, k))
        out[f"pass@{k}"] = sum(pk) / len(pk)
        out[f"maj@{k}"] = sum(mk) / len(mk)
    return out


PASSK_SAMPLES = 64  # samples per problem of a run's pass@k curve: k = 1, 2, 4, ..., 64
PASSK_KS = [2**i for i in range(PASSK_SAMPLES.bit_length()) if 2**i <= PASSK_SAMPLES]


def passk_curve(roles: Roles, rows: list[dict], cfg: config.Config, dump: Path | None = None) -> dict[str, float]:
    """A run's pass@k at its start or end (run.passk_eval problems): PASSK_SAMPLES samples of each row
    at rollout.temperature, and for each k in PASSK_KS the unbiased estimator (search/metrics.py)
    averaged over the rows, keyed by str(k). pass@1 rising while pass@64 stays is RL sharpening the
    policy on what it could already solve; pass@64 rising is it solving problems it could not.

    It draws from the RNG seeded with run.seed, so the curves before and after training sample the
    same way, and puts the RNG back afterwards, so a run samples the same training batches with the
    curve on or off (run.passk_eval=0). ``dump`` receives every sample."""
    if not rows:
        return {}
    rollout = cfg.rollout
    with torch.random.fork_rng():
        # the same draws before and after training: the loop's RNG has moved by then (the rollouts)
        torch.manual_seed(cfg.run.seed)
        records = sample_records(roles, rows, PASSK_SAMPLES, rollout.temperature, rollout.top_p, rollout.max_new_tokens,
                                 max(cfg.run.eval_batch_size, 2 * PASSK_SAMPLES), "pass@k", cfg.run.progress)
    if dump is not None:
        write_records(records, dump)
    right = [0] * len(rows)
    for rec in records:
        right[rec["problem"]] += bool(rec["correct"])
    return {str(k): sum(pass_at_k(PASSK_SAMPLES, c, k) for c in right) / len(rows) for k in PASSK_KS}


def write_records(records: list[dict], path: Path) -> None:
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in records))


def numbered(path: Path, i: int) -> Path:
    """``path`` itself for i = 1, else its name with '.i' before the suffix (the samples file numbered i)."""
    return path if i == 1 else path.with_name(f"{path.stem}.{i}{path.suffix}")


def publish(tmp: Path, out: Path, replace: bool = False, first: int = 1) -> Path:
    """The finished file ``tmp`` (written beside ``out``) under the name ``out``, or, when another
    command took that name while this one ran, the next free ``numbered`` one (from ``first``):
    a hard link is made only where no file is, so no evaluation's file replaces another's.
    ``replace`` (--overwrite): renamed over ``out``. Returns the path it went to."""
    with writing(out):
        if replace:
            os.replace(tmp, out)
            return out
        i = first
        while True:
            path = numbered(out, i)
            try:
                os.link(tmp, path)
                break
            except FileExistsError:
                i += 1
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                    raise
                if _claim(tmp, path):  # a file system without hard links: created exclusively, then filled
                    break
                i += 1
        tmp.unlink()
    if path != numbered(out, first):
        say(f"{numbered(out, first)} was written by another command while this one ran; the samples went to {path}")
    return path


def _claim(tmp: Path, path: Path) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as f:
        f.write(tmp.read_bytes())
    return True
