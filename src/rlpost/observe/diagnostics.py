"""Training-health checks: the failure modes of RL post-training, read off the metric history.

Each check is a pure function of the list of per-step metric dicts (metrics.jsonl, oldest first)
that returns a Finding or None. The same functions run during training (``Health``: the
findings become ``health/<name>`` metrics and one warning line each, the first time they fire)
and afterwards (``rlpost doctor RUN_DIR``), so what the run warned about and what the doctor
says never disagree. Thresholds are module constants, named and documented here.

What can be seen in one step is judged from step 1 (most answers cut off, no reward at all, no
group with signal, no update); what needs a trend (entropy collapse, length inflation, proxy
overfitting) says so when the run is too short to judge it (``unjudged``), rather than passing.

``rlpost doctor`` also says what is wrong with the run folder's own files (``folder_problems``), one
line each: a config.yaml missing or not loadable, a summary.json that is not a JSON object, a
metrics.jsonl whose last line was cut short (the steps before it are judged).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import median
from typing import Callable

from rlpost.observe import jsonl
from rlpost.runconfig import load_run
from rlpost.types.errors import ConfigError

# --- thresholds ------------------------------------------------------------------------------
MISMATCH_MEAN = 0.05  # nats: mean |log pi_sampler - log pi_trainer| per token above this is a bug smell
MISMATCH_MAX = 2.0  # nats: one token this far off means a different distribution, not rounding
ENTROPY_COLLAPSE = 0.2  # mean entropy below this fraction of its early value
KL_EXPLOSION = 1.0  # nats per token: far beyond any useful trust region
KL_SPIKE = 10.0  # x the median KL of the steps before
LENGTH_INFLATION = 2.0  # x the early mean response length ...
TRUNCATION = 0.2  # ... together with this share of completions hitting the length cap
TRUNCATED_MOST = 0.5  # more than this share of a step's completions cut off at the cap: the cap is too short
PROXY_REWARD_GAIN = 0.05  # reward mean up by this much between two held-out evaluations ...
PROXY_HELDOUT_FLAT = 0.01  # ... while held-out accuracy rose by less than this (flat or down): likely reward hacking
OUTSIDE_BAND = 0.8  # share of groups whose completions all got one reward (no gradient from a group baseline)
EARLY = 3  # steps averaged as the "early" reference value
GRADING_ERROR_RISE = 0.1  # share of a step's completions the sandbox failed to grade, above the lowest share before ...
GRADING_ERROR_MOST = 0.5  # ... or over this share in any step, from step 1


@dataclass
class Finding:
    name: str  # short id, also the health/<name> metric
    step: int  # first step where it was seen
    what: str  # what was measured
    knob: str  # which setting addresses it


def _series(history: list[dict], key: str) -> list[tuple[int, float]]:
    return [(h["step"], h[key]) for h in history if h.get(key) is not None]


def _early(points: list[tuple[int, float]]) -> float:
    first = [v for _, v in points[:EARLY]]
    return sum(first) / len(first)


def sampler_mismatch(history: list[dict]) -> Finding | None:
    for h in history:
        if h.get("async/staleness_max"):  # stale samples (async): the gap is the policy's lag, and TIS is on
            continue
        mean, mx = h.get("actor/logp_diff_sampler_mean"), h.get("actor/logp_diff_sampler_max")
        if (mean is not None and mean > MISMATCH_MEAN) or (mx is not None and mx > MISMATCH_MAX):
            return Finding("sampler_mismatch", h["step"],
                           f"sampler vs trainer log-prob gap: mean {mean:.3f}, max {mx:.3f} nats per token",
                           "rollout.dtype=float32 (same precision as the trainer), or algo.tis_cap=2 to correct for it")
    return None


def entropy_collapse(history: list[dict]) -> Finding | None:
    pts = _series(history, "actor/entropy")
    if len(pts) <= EARLY:
        return None
    ref = _early(pts)
    for step, v in pts[EARLY:]:
        if ref > 0 and v < ENTROPY_COLLAPSE * ref:
            return Finding("entropy_collapse", step, f"entropy {v:.3f} vs {ref:.3f} early (< {ENTROPY_COLLAPSE:.0%})",
                           "algo.cov_control=clip_cov or kl_cov (Cui et al. 2025), algo.entropy_adv_coef > 0, "
                           "algo.entropy_coef > 0, a higher rollout.temperature, or clip-higher (algo.clip_eps_high / "
                           "dapo)")
    return None


def kl_explosion(history: list[dict]) -> Finding | None:
    for key in ("actor/kl", "critic/kl", "actor/ppo_kl"):
        pts = _series(history, key)
        for i, (step, v) in enumerate(pts):
            before = [abs(x) for _, x in pts[max(0, i - 10):i]]
            spike = len(before) >= EARLY and median(before) > 0 and abs(v) > KL_SPIKE * median(before)
            if abs(v) > KL_EXPLOSION or spike:
                return Finding("kl_explosion", step, f"{key} = {v:.3f} (median of the steps before: "
                               f"{median(before) if before else 0:.3f})",
                               "a lower trainer.lr, a higher algo.kl_coef (or algo.kl_target), fewer trainer.epochs")
    return None


def length_inflation(history: list[dict]) -> Finding | None:
    pts = _series(history, "response_length/mean")
    if len(pts) <= EARLY:
        return None
    ref = _early(pts)
    trunc = dict(_series(history, "response_length/clip_ratio"))
    for step, v in pts[EARLY:]:
        if v > LENGTH_INFLATION * ref and trunc.get(step, 0.0) > TRUNCATION:
            return Finding("length_inflation", step, f"mean length {v:.1f} vs {ref:.1f} early, "
                           f"{trunc[step]:.0%} truncated", "algo.overlong_buffer (soft penalty), algo.overlong_filter, "
                           "or algo.name=dr_grpo (no length bias)")
    return None


def truncation(history: list[dict]) -> Finding | None:
    """Most completions of a step hit rollout.max_new_tokens: their answers are cut off, so a
    verifier that reads the end of the answer scores them 0 (a user's data under the demo's
    16-token cap). Seen from step 1."""
    for h in history:
        share = h.get("response_length/clip_ratio")
        if share is not None and share > TRUNCATED_MOST:
            if "env/episodes" in h:  # an environment's episode is cut by its turn and token limits, not one cap
                return Finding("truncation", h["step"], f"{share:.0%} of the episodes ended at task.max_turns or "
                               "task.max_episode_tokens before the environment ended them", "a higher task.max_turns "
                               "or task.max_episode_tokens when the task needs more room (in a game that ends when it "
                               "is won, these are games lost in their turns: nothing to change)")
            cap = h.get("response_length/max")
            at = f" at the cap of {cap:g} tokens" if cap is not None else ""
            return Finding("truncation", h["step"], f"{share:.0%} of the completions were cut off{at} "
                           "before they ended", "a higher rollout.max_new_tokens (TRL and verl's examples use "
                           "256-1024), or a prompt that asks for a shorter answer")
    return None


def proxy_overfit(history: list[dict]) -> Finding | None:
    evals = [(h["step"], h["eval/heldout_accuracy"]) for h in history if "eval/heldout_accuracy" in h]
    reward = dict(_series(history, "reward/mean"))
    for (s0, a0), (s1, a1) in zip(evals, evals[1:]):
        r0 = sum(reward.get(s, 0.0) for s in range(max(1, s0 - 2), s0 + 1)) / 3
        r1 = sum(reward.get(s, 0.0) for s in range(max(1, s1 - 2), s1 + 1)) / 3
        if r1 - r0 > PROXY_REWARD_GAIN and a1 - a0 < PROXY_HELDOUT_FLAT:
            return Finding("proxy_overfit", s1, f"reward {r0:.3f} -> {r1:.3f} while held-out {a0:.3f} -> {a1:.3f}",
                           "look at the samples for reward hacking; harden the verifier; a higher algo.kl_coef")
    return None


def environment_run(history: list[dict]) -> bool:
    """Whether the rewards came from an environment's episodes (rewards/episodes.py logs env/episodes):
    its advice names the environment's knobs, not a dataset's verifier and answer column."""
    return any("env/episodes" in h for h in history)


def group_baseline(history: list[dict]) -> bool:
    """Whether the algorithm's advantage comes from its group (GRPO's family; recipes/rl.py logs
    algo/group_baseline each step): a critic (PPO) or a running baseline learns from a group of equal
    rewards. A run logged before the key existed is taken as a group method, as most runs are."""
    return all(h.get("algo/group_baseline", 1.0) != 0 for h in history)


def constant_reward(history: list[dict]) -> Finding | None:
    """Every completion of every step so far got the same reward (all 0, typically): nothing to
    learn from, and usually a verifier that never reads the model's answer. Seen from step 1; a
    run that ever scored two rewards apart is past it."""
    pts = [(h["step"], h["reward/min"], h["reward/max"]) for h in history
           if h.get("reward/min") is not None and h.get("reward/max") is not None]
    if not pts or any(lo != hi for _, lo, hi in pts) or len({lo for _, lo, _ in pts}) > 1:
        return None
    steps = f"step {pts[0][0]}" if len(pts) == 1 else f"steps {pts[0][0]}-{pts[-1][0]}"
    if environment_run(history):
        return Finding("constant_reward", pts[0][0],
                       f"every episode of {steps} got reward {pts[0][1]:g}: no signal at all",
                       "a look at RUN_DIR/samples/step_*.jsonl (does the model answer in the form the environment's "
                       "step() reads? do its tools reach the model?), a higher task.max_turns or "
                       "task.max_episode_tokens if episodes are cut off, or an environment this model wins sometimes")
    return Finding("constant_reward", pts[0][0],
                   f"every completion of {steps} got reward {pts[0][1]:g}: no signal at all",
                   "a look at RUN_DIR/samples/step_*.jsonl (does the verifier find the answer in the model's format? "
                   "task.verifier, task.answer_column), a higher rollout.max_new_tokens if answers are cut off, or a "
                   "task this model solves sometimes")


def outside_learnable_band(history: list[dict]) -> Finding | None:
    """Most groups gave all their completions one reward, so a group baseline (GRPO, RLOO, DAPO's
    family) learns nothing from them. reward/zero_std_frac counts it for any reward (a reward
    model's too: its scores are never exactly 1); runs logged before it have the pass-rate share."""
    key = "reward/zero_std_frac" if any("reward/zero_std_frac" in h for h in history) else "reward/outside_band_frac"
    pts = _series(history, key) if group_baseline(history) else []  # a critic learns from equal rewards
    for i, (step, v) in enumerate(pts):
        recent = [x for _, x in pts[max(0, i + 1 - EARLY):i + 1]]  # this step and up to EARLY - 1 before
        if sum(recent) / len(recent) > OUTSIDE_BAND and constant_reward(history) is None:
            return Finding("outside_learnable_band", step, f"{v:.0%} of groups gave every completion the same "
                           "reward: a group baseline gets no signal from them",
                           "algo.name=dapo or rollout.filter_groups=true; "
                           + ("an environment the model wins sometimes, not always" if environment_run(history)
                              else "an easier or harder task mix"))
    return None


def no_update(history: list[dict]) -> Finding | None:
    """No step so far moved the policy: no update ran (every group filtered out), or its gradient
    was 0 at every step (every advantage 0)."""
    idle = [h.get("actor/grad_norm") == 0 or h.get("rollout/groups_trained") == 0 for h in history]
    if not history or not all(idle):
        return None
    steps = "step 1" if len(history) == 1 else f"any of the {len(history)} steps"
    task = ("an environment this model wins sometimes" if environment_run(history)
            else "a task this model solves sometimes")
    return Finding("no_update", history[0]["step"], f"the policy did not change in {steps}: gradient norm 0 (every "
                   "advantage 0) or no update (every group filtered out)",
                   (f"rollout.filter_groups=true (train only on groups with signal), {task}" if group_baseline(history)
                    else f"{task}, a higher trainer.lr") + ", or the findings above")


def reward_errors(history: list[dict]) -> Finding | None:
    """A reward function that raises, dies, times out or returns NaN/inf scores 0 and the step goes
    on (rewards/runner.py); here every such failure is added up, per function."""
    totals: dict[str, list] = {}  # name -> [errors, timeouts, calls, first step with a failure]
    for h in history:
        names = [k[9:-6] for k in h if k.startswith("verifier/") and k.endswith("/calls")] or ["verifier"]
        for name in names:
            key = f"verifier/{name}/" if name != "verifier" else "verifier/"
            e, t = h.get(f"{key}errors") or 0, h.get(f"{key}timeouts") or 0
            tot = totals.setdefault(name, [0, 0, 0, None])
            tot[0], tot[1], tot[2] = tot[0] + e, tot[1] + t, tot[2] + (h.get(f"{key}calls") or 0)
            if (e or t) and tot[3] is None:
                tot[3] = h["step"]
    failing = {n: t for n, t in totals.items() if t[0] or t[1]}
    if not failing:
        return None
    what = "; ".join(f"reward function {n} failed on {e + t}{f' of {c}' if c else ''} completions "
                     f"({e} errors, {t} timeouts)"
                     for n, (e, t, c, _) in failing.items())
    return Finding("reward_errors", min(t[3] for t in failing.values()), what + ", each scored 0",
                   "fix the function: its first traceback was printed when it failed, and every one is in "
                   "RUN_DIR/verifier.log; task.verifier_timeout_s if the calls are slow rather than stuck")


def grading_errors(history: list[dict]) -> Finding | None:
    """The sandbox failed to run the programs (bwrap could not fork once the machine's process limit
    was reached, say), not the programs failing: each such completion scored 0 whatever it wrote,
    silently. Read off the code task's share per step (reward_extra/grading_error, envs/grading.py);
    said when it rises mid-run, GRADING_ERROR_RISE over the lowest share of the steps before, or
    passes GRADING_ERROR_MOST in any step."""
    pts = _series(history, "reward_extra/grading_error")
    for i, (step, v) in enumerate(pts):
        low = min((x for _, x in pts[:i]), default=None)
        if v > GRADING_ERROR_MOST or (low is not None and v - low > GRADING_ERROR_RISE):
            was = f", up from {low:.0%}" if low is not None and v > low else ""
            return Finding("grading_errors", step, f"the sandbox could not run the programs of {v:.0%} of the "
                           f"completions{was} (grading errors, not wrong answers): each scored 0",
                           "the info's sandbox_error in RUN_DIR/samples/step_*.jsonl says why; the machine's process "
                           "limits (ulimit -u, the pids cgroup, kernel.pid_max), fewer task.sandboxes")
    return None


def nonfinite_updates(history: list[dict]) -> Finding | None:
    pts = [(h["step"], h["actor/nonfinite_steps"]) for h in history if h.get("actor/nonfinite_steps")]
    if not pts:
        return None
    return Finding("nonfinite_updates", pts[0][0], f"{sum(v for _, v in pts):g} optimizer steps skipped for a NaN/inf "
                   f"loss or gradient, over {len(pts)} training steps", "a lower trainer.lr or trainer.max_grad_norm; "
                   "check the rewards (verifier errors) and rollout.dtype=float32")


CHECKS: list[Callable[[list[dict]], Finding | None]] = [
    sampler_mismatch, entropy_collapse, kl_explosion, length_inflation, truncation, proxy_overfit, constant_reward,
    outside_learnable_band, no_update, reward_errors, grading_errors, nonfinite_updates,
]


def unjudged(history: list[dict]) -> dict[str, str]:
    """{check: what it needs} for the checks this history is too short for: a trend needs steps
    after the first EARLY, proxy overfitting two held-out evaluations during the run."""
    out = {}
    if len(history) <= EARLY:
        for check in (entropy_collapse, length_inflation):
            out[check.__name__] = f"more than {EARLY} steps (has {len(history)})"
    evals = sum("eval/heldout_accuracy" in h for h in history)
    if evals < 2:
        out[proxy_overfit.__name__] = f"two held-out evaluations during the run, run.eval_every (has {evals})"
    return out


def diagnose(history: list[dict]) -> list[Finding]:
    return [f for f in (check(history) for check in CHECKS) if f is not None]


class Health:
    """During training: health/<name> metrics every step, one warning line per new finding."""

    def __init__(self, warn: Callable[[str], None]):
        self.warn, self.seen = warn, set()

    def metrics(self, history: list[dict]) -> dict:
        found = {f.name: f for f in diagnose(history)}
        for name, f in found.items():
            if name not in self.seen:
                self.seen.add(name)
                self.warn(f"health: {f.what} (step {f.step}); try {f.knob}")
        return {f"health/{check.__name__}": float(check.__name__ in found) for check in CHECKS}


def doctor(run_dir: Path) -> tuple[list[Finding], int]:
    """(findings, steps read) for a run folder's metrics.jsonl."""
    history = jsonl.read_lines(Path(run_dir) / "metrics.jsonl")
    return diagnose(history), len(history)


def folder_problems(run_dir: Path) -> list[str]:
    """What is wrong with the run folder's own files, one line each (none: nothing)."""
    run_dir, out = Path(run_dir), []
    if not (run_dir / "config.yaml").is_file():
        out.append(f"{run_dir / 'config.yaml'} is missing: the run's settings are gone, so `rlpost train --resume`, "
                   "`rlpost eval` and `rlpost export` of this folder refuse it")
    else:
        try:
            load_run(run_dir)
        except ConfigError as e:
            out.append(f"the run's config does not load ({e}): `rlpost train --resume`, `rlpost eval` and "
                       "`rlpost export` of this folder refuse it")
    summary = run_dir / "summary.json"
    if summary.is_file():
        try:
            if not isinstance(json.loads(summary.read_bytes()), dict):
                raise ValueError("not an object")
        except ValueError as e:
            out.append(f"{summary} is not a JSON object ({str(e).splitlines()[0][:80]}): the run's closing numbers "
                       "are unreadable, and `rlpost report` refuses the folder until it is removed")
    torn = torn_line(run_dir / "metrics.jsonl")
    if torn:
        out.append(f"{run_dir / 'metrics.jsonl'}:{torn}: the last line is cut short (a write that never finished); "
                   "the steps before it are judged, and `rlpost train --resume` drops it")
    return out


def torn_line(path: Path) -> int | None:
    """The number of the last line of a JSONL file when it is not JSON (a write cut short), else None."""
    lines = path.read_bytes().decode("utf-8", errors="replace").split("\n") if path.is_file() else []
    last = max((i for i, line in enumerate(lines, 1) if line.strip()), default=None)
    if last is None:
        return None
    try:
        json.loads(lines[last - 1])
    except ValueError:
        return last
    return None


def doctor_text(run_dir: Path) -> str:
    history = jsonl.read_lines(Path(run_dir) / "metrics.jsonl")
    findings, n, short = diagnose(history), len(history), unjudged(history)
    problems = [f"run folder: {p}" for p in folder_problems(run_dir)]
    if not n:
        return "\n".join([f"{run_dir}: no steps logged yet: nothing to judge", *problems])
    judged = f"{len(CHECKS) - len(short)} of {len(CHECKS)} checks could judge" if short else f"{len(CHECKS)} checks"
    lines = [f"{run_dir}: {n} steps, "
             + (f"{len(findings)} finding(s)" if findings else f"no health problems found ({judged})"), *problems]
    for f in findings:
        lines += [f"- {f.name} (from step {f.step}): {f.what}", f"    knob: {f.knob}"]
    lines += [f"too few steps to judge {name}: it needs {what}" for name, what in short.items()]
    return "\n".join(lines)


def as_dicts(findings: list[Finding]) -> list[dict]:
    return [asdict(f) for f in findings]
