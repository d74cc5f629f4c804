"""What a config fills in when it is loaded, once, so that config.yaml holds the values the run used
and ``rlpost eval RUN`` or ``--resume`` read the same ones from any folder:

  rollout.max_new_tokens=0   the cap that follows the task: 16 for the generated tasks, 256 for rows
                             of your own (task.data), at most half a known small context (tiny's)
  task.verifier, task.reward_funcs   a reward function named by file (``my_reward.py:compute_score``,
                             verl's ``custom_reward_function.path`` and ``.name`` in one) gets its
                             absolute path; an entry that names no function is refused here with
                             what it looks like it meant (a reward model folder: task.reward_model)
  task.agent                 an agent named by file, likewise
  algo.name                  an algorithm of your own named by file (``my_algo.py:MyAlgo``) gets its
                             absolute path, as a reward function does
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from rlpost.console import say
from rlpost.sections import Config, ConfigError

# rollout.max_new_tokens=0: the cap follows the task. The generated tasks' answers are a few tokens
# (the demo's 16); rows of the user's own (task.data) get TRL's GRPOConfig default
# max_completion_length, 256: the demo's 16 cut off 87.5% of a verl user's first run's answers.
GENERATED_MAX_NEW_TOKENS = 16
USER_DATA_MAX_NEW_TOKENS = 256


def fill(cfg: Config) -> Config:
    """cfg with the defaults that follow the task and the reward functions' file paths filled in."""
    task = cfg.task
    task = dataclasses.replace(task, verifier=function_path(task.verifier, "task.verifier"),
                               agent=function_path(task.agent, "task.agent"),
                               reward_funcs=",".join(function_path(f.strip(), "task.reward_funcs")
                                                     for f in task.reward_funcs.split(",") if f.strip()))
    tokens = cfg.rollout.max_new_tokens or fitted_max_new_tokens(bool(task.data or task.eval_data), cfg.model.name)
    algo = cfg.algo
    if ":" in algo.name:  # your own algorithm, 'module:Class' or 'file.py:Class' (algorithms.resolve)
        algo = dataclasses.replace(algo, name=function_path(algo.name, "algo.name"))
    return dataclasses.replace(cfg, task=task, algo=algo,
                               rollout=dataclasses.replace(cfg.rollout, max_new_tokens=tokens))


def default_max_new_tokens(user_data: bool) -> int:
    """What rollout.max_new_tokens=0 becomes: rows of your own (task.data) or a generated task."""
    return USER_DATA_MAX_NEW_TOKENS if user_data else GENERATED_MAX_NEW_TOKENS


TINY_CONTEXT = 256  # model.name=tiny's max_position_embeddings (model/load.py's tiny_model)


def fitted_max_new_tokens(user_data: bool, model: str) -> int:
    """default_max_new_tokens, clipped to half the context of a model whose context is known without
    loading anything (the tiny test model's 256 tokens would hold the 256 new tokens and no prompt),
    saying so in one line."""
    tokens, context = default_max_new_tokens(user_data), known_context(model)
    if context and tokens > context // 2:
        say(f"rollout.max_new_tokens: {context // 2}, half of model {model}'s {context}-token context (the default "
            f"{tokens} would leave no room for the prompt); set it to choose another")
        return context // 2
    return tokens


def known_context(model: str) -> int:
    """The context in tokens of model.name where reading it costs no import: the tiny test model's,
    or a local folder's config.json; 0 otherwise (hub ids and the embedded model: thousands)."""
    if model == "tiny":
        return TINY_CONTEXT
    try:
        found = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return 0
    context = found.get("max_position_embeddings") or found.get("n_positions") if isinstance(found, dict) else 0
    return context if isinstance(context, int) and context > 0 else 0


def function_path(spec: str, key: str) -> str:
    """'module:function' as it is; 'file.py:function' with the file's absolute path (the verifier
    worker loads it from there, whatever folder a later eval or resume runs in); anything else a
    ConfigError saying what to write instead."""
    if not spec:
        return spec
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name.isidentifier():
        raise ConfigError(f"{key}: {spec!r} names no function; expected 'module:function' or 'file.py:function'"
                          f"{what_it_looks_like(spec, key)}")
    if not target.endswith(".py"):
        return spec
    file = Path(target).expanduser()
    if not file.is_file():
        raise ConfigError(f"{key}: no file {target} (from {Path.cwd()}); expected 'file.py:function' or "
                          "'module:function'")
    return f"{file.resolve()}:{name}"


def what_it_looks_like(spec: str, key: str) -> str:
    """The hint for a reward spec without a function: a model folder or hub id (TRL takes a reward
    model's name among its reward functions), or a file without its function (verl names it apart)."""
    path = Path(spec)
    if spec.endswith(".py"):
        return f", e.g. {key}={spec}:compute_score (verl's custom_reward_function.name goes after the colon)"
    if path.is_dir() or (not path.suffix and "/" in spec):
        return (f"; {spec} looks like a reward model (a model folder or hub id): that goes in task.reward_model={spec} "
                "(rlpost.Trainer: overrides={'task.reward_model': ...})")
    return ""
