"""Environments: each task family gives training rows, held-out rows and a verifier path.

A row is a dict with ``messages`` (chat messages ending with the user turn) and whatever the
verifier needs (``answer``, metadata). The verifier is named by import path so that it can run
in a separate worker process (rewards/runner.py).

Families (``task.name``):
  arithmetic  generated ``a op b`` problems, last-integer verifier (the demo)
  dataset     rows from ``task.data``; ``task.verifier`` or exact match on ``task.answer_column``
  math        math-verify answer equivalence; ``task.data`` or generated fraction problems
  gym         any reasoning-gym dataset (``task.gym_name`` / ``task.gym_config``), its own scorer
  code        Python run against hidden tests in the sandbox (rlpost/sandbox/)
  tools       multi-turn episodes with calculator / Python tools (envs/tools.py: an environment)
  env         multi-turn episodes of the environment task.env (types/roles.py: Environment), its rows
              from task.data or its own rows(split, n, seed), asked of a worker process (envs/pool.py)
  agent       episodes of the agent task.agent against the run's OpenAI endpoint (envs/agents.py), its
              rows from task.data or task.env's rows

``task.mix`` builds several families (not tools) from the one config, each as it is built alone,
and stamps every row with its family (``row["task_family"]``, verl's ``data_source``); the
training prompts are drawn from them by weight and each row is scored by its own family's
verifier (envs/mix.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import os
import threading

import yaml

from rlpost import config
from rlpost.config import TaskConfig
from rlpost.envs import arithmetic, code, code_formats, dataset, decontam, gym, mathgen, tools
from rlpost.envs import math as math_answers
from rlpost.envs.pool import EnvPool
from rlpost.console import say
from rlpost.types.errors import ConfigError

DEFAULT_VERIFIER = {
    "arithmetic": "rlpost.envs.arithmetic:score",
    "dataset": "rlpost.envs.dataset:exact_match",
    "math": "rlpost.envs.math:score",
    "gym": "rlpost.envs.gym:score",
    "code": "rlpost.envs.code:score",
    "tools": "rlpost.envs.tools:score",
}

# task.env by name: the environments rlpost ships, and the libraries it adapts ('verifiers:ENV_ID').
SHIPPED_ENVS = {
    "guess": "rlpost.envs.guess:GuessNumber",
    "search": "rlpost.envs.search:Search",
    "code_repair": "rlpost.envs.code_repair:CodeRepair",
    "tools": "rlpost.envs.tools:Tools",
}
ENV_LIBRARIES = {"verifiers": "rlpost.envs.verifiers_env:VerifiersEnv",
                 "textarena": "rlpost.envs.textarena_env:TextArenaEnv"}


def is_correct(info: dict, reward: float) -> bool:
    """Whether a scored completion counts as correct: the verifier's own ``correct`` when its info
    has one, else reward >= 1. Held-out accuracy, pass@k / maj@k and length shaping all use this."""
    return bool(info.get("correct", reward >= 1.0))


DEFAULT_TIMEOUT_S = {"math": 10.0, "gym": 10.0, "code": 60.0}


TASK_KEY = "task_family"  # the row key naming a mixed row's family: its verifier, its metrics (verl's data_source)
MIX_VERIFIER = "rlpost.envs.mix:score"  # scores each row of a mix with its family's DEFAULT_VERIFIER


def verifier_timeout(task: TaskConfig) -> float:
    """task.verifier_timeout_s, else the family's default; a mix's calls get the longest of its families'."""
    return task.verifier_timeout_s or max(DEFAULT_TIMEOUT_S.get(f, 2.0) for f in config.task_families(task))


@dataclass
class Task:
    train: list[dict]
    heldout: list[dict]
    verifier: str  # "module:function" with signature (completion: str, row: dict) -> (float, dict)
    skipped_rows: int = 0  # malformed data rows skipped (task.on_bad_row=skip)
    # decontam.contamination of the held-out rows (None: task.max_contamination=1, unchecked)
    contamination: dict | None = None
    # task.mix: family -> weight ({}: one family, no task_family key)
    mix: dict[str, float] = field(default_factory=dict)


def build_task(task: TaskConfig, refuse_contaminated: bool = True) -> Task:
    """The task's rows and verifier. Unless task.max_contamination is 1, the held-out prompts are
    checked against the training prompts (envs/decontam.py) and, above that share, refused (a
    ConfigError naming the key); ``rlpost eval`` only reports it (refuse_contaminated=False).

    A mix (task.mix) is its families' splits together, each row stamped with its family; the
    held-out rows interleaved, so that run.eval_n takes the same number of each family."""
    mix = config.task_mix(task)
    splits = {f: family_splits(task, f) for f in mix or [task.name]}  # family -> (train, held-out, skipped)
    if mix:
        splits = {f: ([{**r, TASK_KEY: f} for r in tr], [{**r, TASK_KEY: f} for r in h], n)
                  for f, (tr, h, n) in splits.items()}
    train = [r for tr, _, _ in splits.values() for r in tr]
    heldouts = [h for _, h, _ in splits.values()]
    found = contamination(train, heldouts, task.contamination_overlap) if task.max_contamination < 1 else None
    if found and refuse_contaminated and found["contamination_contaminated_frac"] > task.max_contamination:
        raise ConfigError(f"task.max_contamination: {found['contamination_contaminated']} of "
                          f"{found['contamination_checked']} held-out prompts "
                          f"({found['contamination_contaminated_frac']:.1%}) are in the training prompts (n-gram "
                          f"overlap, envs/decontam.py), above {task.max_contamination:g}; e.g. "
                          f"{found['contamination_examples'][0][:80]!r}. "
                          + ("Remove those prompts from task.data or task.eval_data" if task.eval_data else
                             "Separate the splits (task.eval_data names a held-out file of your own)")
                          + ", or raise task.max_contamination to accept it"
                          + (" (with fewer than 10 prompts on each side, text every prompt shares, such as a system "
                             "prompt, cannot be told from the problems: 10 or more a side lets it)"
                             if len(train) < 10 and sum(map(len, heldouts)) < 10 else ""))
    # The verifier is imported only in its worker processes (rewards/runner.py), whose first start
    # is the dry call that turns a bad path into one line before training.
    # env: its episodes carry their rewards
    verifier = MIX_VERIFIER if mix else task.verifier or DEFAULT_VERIFIER.get(task.name, "")
    return Task(train, interleave(heldouts), verifier, sum(n for _, _, n in splits.values()), found, mix)


def family_splits(t, family: str) -> tuple[list[dict], list[dict], int]:
    """(train rows, held-out rows, malformed rows skipped) of one family, built from the task section."""
    skipped = 0
    if (t.data or t.eval_data) and family in config.DATA_FAMILIES:  # eval_data alone: held-out rows only
        # an environment's reset reads its rows as they are; code rows may come in HumanEval's or APPS's format
        train, heldout, skipped = dataset.build_splits(t, raw=family in ("env", "agent"),
                                                       convert=code_formats.convert if family == "code" else None)
    elif family == "dataset":
        raise ValueError("task.data is required for task.name=dataset")  # config.check_task says so first
    elif family in ("env", "agent"):  # an agent without task.data plays task.env's rows (config: check_agent)
        train, heldout = env_splits(t)
    else:
        train, heldout = _generated_splits(t, family)
        if not train:  # every problem the family can make went to the held-out split (arithmetic.disjoint_splits)
            raise ConfigError(f"task.n_heldout: {len(heldout)} held-out {family} problems leave none to train on: the "
                              "task makes no more distinct problems than that (task.min_a..max_a, min_b..max_b, "
                              "ops, n_terms); lower task.n_heldout or widen the problems")
    if family == "code":  # refuses to start without bubblewrap (unless task.sandbox=rlimits) or with ungradable tests
        train, heldout, dropped = code.prepare(train, heldout, t)
        skipped += dropped
    if family in ("math", "dataset") and (t.data or t.eval_data) and not t.verifier:
        warn_ungradable(family, train + heldout, t)
    return train, heldout, skipped


GOLD_SAMPLE = 200  # distinct answers looked at when a task is built: a few seconds of math-verify at most


def warn_ungradable(family: str, rows: list[dict], t) -> None:
    """One line when answers in task.data can never score 1 under the family's own verifier: math, a
    gold math-verify cannot parse; dataset (exact match on the last line), a gold of several lines (GSM8K's
    worked solution, MATH's). Looked at on the first GOLD_SAMPLE distinct answers."""
    golds = list(dict.fromkeys(a for r in rows if "answer" in r for a in dataset.answers(r)))[:GOLD_SAMPLE]
    if family == "math":
        if threading.current_thread() is not threading.main_thread():
            return  # math-verify's parse times out by signal.alarm, which only the main thread may set
        bad = [g for g in golds if not math_answers.parse_gold(g)]
        why = "math-verify reads no answer in them"
    else:
        bad = [g for g in golds if "\n" in g.strip() and not dataset.NUMBER.fullmatch(g.strip().replace(",", ""))]
        why = ("they span several lines, and exact match compares one line (GSM8K's or MATH's worked solutions: "
               "task.name=math reads their final answer)")
    if bad:
        say(f"task.data: {len(bad)} of the first {len(golds)} answers ({t.answer_column}) can never score 1: {why}; "
            f"e.g. {bad[0][:60]!r}. Check task.answer_column, or name a verifier of your own (task.verifier)")


def interleave(groups: list[list[dict]]) -> list[dict]:
    """Round-robin over the groups (one group: itself), so any prefix holds them equally."""
    return [g[i] for i in range(max(map(len, groups))) for g in groups if i < len(g)]


def contamination(train: list[dict], heldouts: list[list[dict]], overlap: float) -> dict:
    """decontam.contamination of each family's held-out rows against every training row, added up:
    a family's template text is told among its own prompts, whatever its share of the mix."""
    parts = [decontam.contamination(train, h, overlap) for h in heldouts]
    if len(parts) == 1:
        return parts[0]
    checked, hit = (sum(p[k] for p in parts) for k in ("contamination_checked", "contamination_contaminated"))
    return {"contamination_checked": checked, "contamination_contaminated": hit,
            "contamination_contaminated_frac": hit / checked if checked else 0.0,
            "contamination_examples": [e for p in parts for e in p["contamination_examples"]][:3]}


def _generated_splits(t, family: str) -> tuple[list[dict], list[dict]]:
    if family == "arithmetic":
        return arithmetic.build_splits(t)
    if family == "math":
        return mathgen.build_splits(t)
    if family == "gym":
        # reasoning-gym's own system prompt asks for <answer> tags, which its scorers expect
        try:
            return gym.build_splits(t.gym_name, yaml.safe_load(t.gym_config) or {}, t.n_train, t.n_heldout, t.seed,
                                    t.system_prompt or "default")
        except ImportError as e:
            raise ConfigError(f"task.name=gym needs reasoning-gym ({e}); install it with: pip install "
                              "'rlpost[envs]'") from None
        except ValueError as e:
            raise ConfigError(f"task.{'gym_config' if 'config' in str(e) else 'gym_name'}: {e}") from None
    if family == "code":
        return code.build_splits(t.n_train, t.n_heldout, t.seed)
    return tools.build_splits(t)


def on_endpoint(t) -> bool:
    """Whether the run's environment plays its episodes as agents on the endpoint (task.env=verifiers:ENV_ID:
    verifiers' own harness calls the model; roles/rollout_agent.py)."""
    return t.name == "env" and t.env.strip().partition(":")[0] == "verifiers"


def env_spec(t) -> tuple[str, dict]:
    """(import path, constructor keyword arguments) of the run's environment (task.env, task.env_args;
    task.name=tools is the tools environment with task.tools)."""
    args = (yaml.safe_load(t.env_args) if t.env_args else None) or {}
    if t.name == "tools":
        return SHIPPED_ENVS["tools"], {"tools": t.tools, **args}
    name = t.env.strip()
    library, _, env_id = name.partition(":")
    if library in ENV_LIBRARIES and env_id:
        return ENV_LIBRARIES[library], {"env_id": env_id, **args}
    return SHIPPED_ENVS.get(name, name), args


def env_pool(t, workers: int, log_path=None, import_paths: tuple = ()) -> EnvPool:
    """Worker processes for the run's environment; the first one's import is the dry start (one line if it fails)."""
    path, kwargs = env_spec(t)
    workers = workers or min(8, os.cpu_count() or 1)
    try:
        return EnvPool(path, kwargs, t.env_timeout_s, workers=workers, log_path=log_path,
                       import_paths=(*import_paths, os.getcwd()))
    except ConfigError as e:
        library = next((name for name, adapter in ENV_LIBRARIES.items() if adapter == path), None)
        if library and "No module named" in str(e):
            raise ConfigError(f"{e}; install it with: pip install 'rlpost[{library}]'") from None
        raise


def env_splits(t) -> tuple[list[dict], list[dict]]:
    """The environment's own rows (its method rows(split, n, seed)), asked of one worker."""
    pool = env_pool(t, 1)
    try:
        outcomes = pool.run([{"op": "rows", "split": split, "n": n, "seed": t.seed}
                             for split, n in (("train", t.n_train), ("heldout", t.n_heldout))])
    finally:
        pool.close()
    for outcome in outcomes:
        if outcome[0] != "ok":
            raise ConfigError(f"task.env: {pool.path}.rows() failed ({outcome[1] if len(outcome) > 1 else outcome[0]})")
        if outcome[1] is None:
            raise ConfigError(f"task.env: {pool.path} has no rows(split, n, seed) method; give its rows in task.data")
    for (split, n), outcome in zip((("train", t.n_train), ("heldout", t.n_heldout)), outcomes):
        if not outcome[1]:  # an empty split: nothing to train on, or nothing to evaluate
            raise ConfigError(f"task.env: {pool.path}.rows({split!r}, {n}, {t.seed}) returned no rows; it must give at "
                              "least one, or give the rows in task.data")
    return outcomes[0][1], outcomes[1][1]
