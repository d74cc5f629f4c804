"""The verifier worker process: imports the user's reward function, then scores what it is sent.

Kept free of torch and of the rest of rlpost so that starting (or restarting) a worker takes tens
of milliseconds. The one worker pool (workers.py) starts, times, kills and restarts it, as it
does the environment workers (envs/worker.py). It talks over two private pipes, never over fd 0/1/2:
fd 0 is /dev/null and fd 1 and fd 2 go to a log file, so a verifier that prints, or runs
``os.system("echo x")``, writes into the log and cannot corrupt a reply.

Frames, limits, dying with the parent (and with it, whatever the reward function started, a
double-forked ``setsid()`` daemon included: the worker is their subreaper), the import by path and
the request loop are wire.py's, shared with the environment workers.

Replies hold plain values only: an info dict is made of numbers, strings, lists and dicts here
(``plain``: anything else becomes its repr), and the pool unpickles replies with no class allowed
(workers.py), so an object of the reward function's module never makes the trainer import that
module.

Start-up: the worker sets its limits (address space, RLIMIT_AS; the CPU limit is set per call),
arranges to die with its parent (PR_SET_PDEATHSIG when started from the parent's main thread, and
always a watchdog pipe whose EOF ends it), imports the function and replies ``("ready", style)``
or ``("import_error", message, traceback)``. That first reply is the dry call the runner makes
before any training: an import error is one line in the main process.

Three calling conventions, told apart by the function's parameter names:

  verifier  fn(completion: str, row: dict) -> reward | (reward, info)        one call per completion
  verl      compute_score(data_source, solution_str, ground_truth, extra_info) -> float | {"score": ...}
            (ground_truth: the row's ``reward_model.ground_truth``, verl's layout, else ``answer``)
  trl       fn(prompts, completions, completion_ids, **columns, trainer_state) -> list[float | None]
            once per batch, exactly as TRL's GRPOTrainer calls it (trl/trainer/grpo_trainer.py,
            ``_calculate_rewards``): every dataset column but the prompt as a keyword list, and
            the whole batch, so a group-aware reward sees every group whole.

A reward must be a real number finite in float32, the type the loop holds rewards in: NaN, inf,
1e39, a string or None (outside TRL's "does not apply") is a verifier error, scored 0 and counted,
like an exception; so is an info whose ``correct`` is not a boolean (types/values.py). These
checks are rlpost's, so their failure is one line (what was returned), without a traceback.
"""

from __future__ import annotations

import inspect
import sys
import traceback
from dataclasses import dataclass

from rlpost import wire
from rlpost.types.values import NotAFlag, NotAReward, checked_flags, reward_value
from rlpost.wire import import_object, plain

NOT_APPLICABLE = "n/a"  # a TRL function's None: this function does not score this row

# --- calling conventions ---------------------------------------------------------------------


@dataclass
class TrainerState:
    """What rlpost fills in of transformers' TrainerState, passed to TRL-style functions as
    ``trainer_state`` (TRL passes its own): progress, for rewards shaped over training."""

    global_step: int = 0  # training steps done when these completions were sampled (the policy version)
    max_steps: int = 0  # run.steps


def import_function(path: str):
    """The function named by 'package.module:function', or by '/path/to/file.py:function' (verl names
    its reward function by file; config loading made the path absolute, defaults.py)."""
    fn = import_object(path)
    if not callable(fn):
        raise TypeError(f"{path!r} is a {type(fn).__name__}, not a function")
    return fn


def style_of(fn) -> str:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return "verifier"
    if "completions" in params:
        return "trl"
    if "solution_str" in params:
        return "verl"
    return "verifier"


class BadReward(Exception):
    """A reward that is not a finite real number."""


class MissingColumn(Exception):
    """A reward function that reads a column the rows do not have."""


def to_reward(value) -> float:
    try:
        return reward_value(value)
    except NotAReward as e:
        raise BadReward(f"returned {e}") from None


def info_of(info: dict) -> dict:
    """A reply's info: plain data, its flags (``correct``) booleans (types/values.py)."""
    try:
        return checked_flags(plain(info))
    except NotAFlag as e:
        raise BadReward(f"returned {e}") from None


def ground_truth(row: dict):
    """verl keeps the reference answer at row['reward_model']['ground_truth']."""
    rm = row.get("reward_model")
    return rm["ground_truth"] if isinstance(rm, dict) and "ground_truth" in rm else row.get("answer")


def call_one(fn, style: str, completion: str, row: dict) -> tuple[float, dict]:
    if style == "verl":
        out = fn(data_source=row.get("data_source"), solution_str=completion, ground_truth=ground_truth(row),
                 extra_info=row.get("extra_info"))
        if isinstance(out, dict):  # verl: {"score": ..., other fields logged}
            if "score" not in out:
                raise BadReward(f"returned a dict without 'score' (keys: {', '.join(map(str, out))})")
            return to_reward(out["score"]), info_of({k: v for k, v in out.items() if k != "score"})
        return to_reward(out), {}
    out = fn(completion, row)
    reward, info = out if isinstance(out, tuple) and len(out) == 2 else (out, {})
    if not isinstance(info, dict):
        raise BadReward(f"returned info of type {type(info).__name__}, expected a dict")
    return to_reward(reward), info_of(info)


def missing_columns(fn, given: set[str]) -> list[str]:
    """The parameters of a TRL-style function that have no default and that nothing passes."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            and p.name not in given]


def call_batch(fn, request: dict) -> list:
    """TRL's call; per completion a float, NOT_APPLICABLE (None) or ('error', message)."""
    rows, n = request["rows"], len(request["rows"])
    hidden = {"prompt", "messages", "_line", "_prompt_text", "completion", "completion_ids"}
    columns = {k: [r.get(k) for r in rows] for k in dict.fromkeys(k for r in rows for k in r) if k not in hidden}
    prompts = [r.get("prompt", r.get("messages")) for r in rows]
    completions = [[{"role": "assistant", "content": c}] if isinstance(p, list) else c
                   for p, c in zip(prompts, request["completions"])]
    missing = missing_columns(fn, {"prompts", "completions", "completion_ids", "trainer_state", *columns})
    if missing:  # TRL passes dataset columns as keywords: a column the rows lack is a TypeError deep in the call
        raise MissingColumn(f"needs the column {missing[0]!r}, which the rows do not have (their columns: "
                            f"{', '.join(sorted(columns)) or 'none but the prompt'}); add it to the data, or give the "
                            "parameter a default")
    out = fn(prompts=prompts, completions=completions, completion_ids=request["completion_ids"], **columns,
             trainer_state=request["trainer_state"])
    out = list(out)
    if len(out) != n:
        raise BadReward(f"returned {len(out)} rewards for {n} completions")
    results = []
    for value in out:
        try:
            results.append(NOT_APPLICABLE if value is None else to_reward(value))
        except BadReward as e:
            results.append(("error", str(e)))
    return results


# --- the worker process ----------------------------------------------------------------------


def _handle(fn, style: str, request: dict):
    try:
        if request["kind"] == "batch":
            return ("ok", call_batch(fn, request))
        return ("ok", *call_one(fn, style, request["completion"], request["row"]))
    except (BadReward, MissingColumn) as e:  # rlpost's check of the function's result: a line, not our traceback
        return ("error", str(e), "")
    except BaseException as e:  # noqa: BLE001 - any failure of user code is a scored 0, SystemExit too
        text = traceback.format_exc()
        print(text, file=sys.stderr, flush=True)  # every failure's traceback in the log
        row = request.get("row") or {}
        if isinstance(e, KeyError) and e.args and isinstance(e.args[0], str) and row and e.args[0] not in row:
            return ("error", f"KeyError: {e.args[0]!r}: the row has no such column (its keys: "
                    f"{', '.join(k for k in row if not k.startswith('_'))})", text)
        return ("error", f"{type(e).__name__}: {e}", text)


def load(path: str, args: list[str]) -> tuple[tuple, str]:
    """The reward function and its calling convention, which the pool hears as the worker's hello."""
    fn = import_function(path)
    style = style_of(fn)
    return (fn, style), style


def serve() -> None:
    """Entry point (workers.py starts it): the function loaded, then completions scored."""
    wire.serve(load, lambda loaded, request: _handle(*loaded, request))
