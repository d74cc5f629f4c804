"""Steps that trained nothing, counted by cause, and the line a run ends with when it had some.

A step leaves the policy as it was when
  filtered       no update ran: the group filter (DAPO's dynamic sampling, rollout.filter_groups) kept
                 no group, even after rollout.max_refill_rounds more rounds of prompts;
  nonfinite      every optimizer step of the update was skipped for a non-finite loss or gradient
                 (fewer than trainer.max_nonfinite_steps in a row, or the run would have stopped);
  reward_failed  the gradient was 0 because every reward call failed and scored 0, which
                 task.max_reward_error_frac let through;
  no_signal      the gradient was 0 because every group's rewards were equal (every advantage 0).
A step with a gradient anywhere (a KL or entropy term, PPO's critic) trained something. A run whose
every step trained nothing still writes RUN/model (the starting policy, unchanged) and summary.json
(``steps_trained`` 0, ``steps_idle`` by cause), says so in its last line, and ``rlpost train``
exits with 0: the run did what it was asked, and a smoke run on a random model (recipes/tiny_smoke.yaml)
is one of these.
"""

from __future__ import annotations

from rlpost import algorithms, config


def cause(metrics: dict) -> str | None:
    """Why a step (its metrics.jsonl line) trained nothing, or None when it trained."""
    if metrics.get("rollout/groups_trained") == 0:
        return "filtered"
    if metrics.get("actor/optimizer_steps") == 0:
        return "nonfinite"
    if metrics.get("actor/grad_norm") != 0 or metrics.get("critic/grad_norm", 0) != 0:
        return None
    calls = sum(v for k, v in metrics.items() if k.startswith("verifier/") and k.endswith("/calls"))
    failed = sum(v for k, v in metrics.items() if k.startswith("verifier/") and k.endswith(("/errors", "/timeouts"))
                 and k.count("/") == 2)
    return "reward_failed" if calls and failed >= calls else "no_signal"


def counts(history: list[dict]) -> dict[str, int]:
    """{cause: steps} over a run's metrics lines; {} when every step trained."""
    out: dict[str, int] = {}
    for line in history:
        why = cause(line)
        if why is not None:
            out[why] = out.get(why, 0) + 1
    return out


def explain(why: str, n: int, cfg: config.Config) -> str:
    """'n step(s) <what happened> (<the knob>)'."""
    rollout = cfg.rollout
    text = {
        "filtered": "kept no group after the group filter (no reward variance in any, after "
                    f"rollout.max_refill_rounds={rollout.max_refill_rounds} refills); widen "
                    f"rollout.filter_min_pass_rate={rollout.filter_min_pass_rate:g} / "
                    f"filter_max_pass_rate={rollout.filter_max_pass_rate:g}, raise rollout.group_size "
                    f"(now {rollout.group_size}) or rollout.max_refill_rounds, or pick a task this model solves "
                    "sometimes",
        "nonfinite": "skipped every optimizer step for a non-finite loss or gradient; lower trainer.lr "
                     f"(trainer.max_nonfinite_steps={cfg.trainer.max_nonfinite_steps} in a row stop a run)",
        "reward_failed": "scored every completion 0 because every reward call failed, which task.max_reward_error_frac="
                         f"{cfg.task.max_reward_error_frac:g} let through; fix the function (RUN/verifier.log)",
        "no_signal": no_signal(cfg),
    }[why]
    return f"{n} step{'s' if n != 1 else ''} {text}"


def no_signal(cfg: config.Config) -> str:
    """A zero gradient's advice: a group of one reward is no signal for a group baseline, whose knob is the
    group's size; a critic or running baseline (PPO, REINFORCE) gets none from rewards all equal to what it
    expected. An environment is played, not solved."""
    rollout = cfg.rollout
    task = ("pick an environment this model wins sometimes" if cfg.task.name == "env"
            else "pick a task this model solves sometimes (rlpost eval --samples 8)")
    if algorithms.traits(cfg.algo.name).group_baseline:
        return (f"had every group's rewards equal (every advantage 0); {task}, or raise rollout.group_size (now "
                f"{rollout.group_size}) or rollout.temperature (now {rollout.temperature:g})")
    return (f"had every advantage 0 (the rewards equal to the baseline's value); {task}, or raise rollout.temperature "
            f"(now {rollout.temperature:g})")


def closing_line(history: list[dict], cfg: config.Config) -> str | None:
    """The run's last word on steps that trained nothing; None when every step trained."""
    found = counts(history)
    if not found:
        return None
    idle = sum(found.values())
    why = "; ".join(explain(w, n, cfg) for w, n in found.items())
    if idle == len(history):
        return (f"trained nothing: none of the {idle} steps changed the policy: {why}. RUN/model is the starting "
                "policy, unchanged")
    return f"{idle} of {len(history)} steps trained nothing: {why}"
