"""Environments: each task family gives training rows, held-out rows and a verifier path.

A row is a dict with ``messages`` (chat messages ending with the user turn) and whatever the
verifier needs (``answer``, metadata). The verifier is named by import path so that it can run
in a separate worker process (rewards/runner.py).

Families (``task.name``):
  arithmetic  generated ``a op b`` problems, last-integer verifier (the demo)
  dataset     rows from ``task.data``; ``task.verifier`` or exact match on ``task.answer_column``
  math        math-verify answer equivalence; ``task.data`` or generated fraction problems
  gym         any reasoning-gym dataset (``task.gym_name`` / ``task.gym_config``), its own scorer
  code        Python run against hidden tests in the sandbox (envs/sandbox.py)
  tools       multi-turn episodes with calculator / Python tools (envs/tools.py)
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from rlpost.envs import arithmetic, code, dataset, decontam, gym, mathgen, tools
from rlpost.types.errors import ConfigError

DEFAULT_VERIFIER = {
    "arithmetic": "rlpost.envs.arithmetic:score",
    "dataset": "rlpost.envs.dataset:exact_match",
    "math": "rlpost.envs.math:score",
    "gym": "rlpost.envs.gym:score",
    "code": "rlpost.envs.code:score",
    "tools": "rlpost.envs.tools:score",
}


def is_correct(info: dict, reward: float) -> bool:
    """Whether a scored completion counts as correct: the verifier's own ``correct`` when its info
    has one, else reward >= 1. Held-out accuracy, pass@k / maj@k and length shaping all use this."""
    return bool(info.get("correct", reward >= 1.0))


DEFAULT_TIMEOUT_S = {"math": 10.0, "gym": 10.0, "code": 60.0}


def verifier_timeout(cfg) -> float:
    return cfg.task.verifier_timeout_s or DEFAULT_TIMEOUT_S.get(cfg.task.name, 2.0)


@dataclass
class Task:
    train: list[dict]
    heldout: list[dict]
    verifier: str  # "module:function" with signature (completion: str, row: dict) -> (float, dict)
    skipped_rows: int = 0  # malformed data rows skipped (task.on_bad_row=skip)
    contamination: dict | None = None  # decontam.contamination of the held-out rows (None: task.max_contamination=1, unchecked)


def build_task(cfg, refuse_contaminated: bool = True) -> Task:
    """The task's rows and verifier. Unless task.max_contamination is 1, the held-out prompts are
    checked against the training prompts (envs/decontam.py) and, above that share, refused (a
    ConfigError naming the key); ``rlpost eval`` only reports it (refuse_contaminated=False)."""
    t = cfg.task
    skipped = 0
    if t.data and t.name in ("dataset", "math", "code"):
        train, heldout, skipped = dataset.build_splits(t)
    elif t.name == "dataset":
        raise ValueError("task.data is required for task.name=dataset")  # config.check_task says so first
    else:
        train, heldout = _generated_splits(cfg)
    if t.name == "code":  # refuses to start without bubblewrap (unless task.sandbox=rlimits) or with ungradable tests
        train, heldout, dropped = code.prepare(train, heldout, t)
        skipped += dropped
    found = decontam.contamination(train, heldout, t.contamination_overlap) if t.max_contamination < 1 else None
    if found and refuse_contaminated and found["contamination_contaminated_frac"] > t.max_contamination:
        raise ConfigError(f"task.max_contamination: {found['contamination_contaminated']} of {found['contamination_checked']} held-out "
                          f"prompts ({found['contamination_contaminated_frac']:.1%}) are in the training prompts (n-gram overlap, "
                          f"envs/decontam.py), above {t.max_contamination:g}; e.g. {found['contamination_examples'][0][:80]!r}. "
                          "Separate the splits (task.eval_data), or raise task.max_contamination to accept it")
    # The verifier is imported only in its worker processes (rewards/runner.py), whose first start
    # is the dry call that turns a bad path into one line before training.
    return Task(train, heldout, t.verifier or DEFAULT_VERIFIER[t.name], skipped, found)


def _generated_splits(cfg) -> tuple[list[dict], list[dict]]:
    t = cfg.task
    if t.name == "arithmetic":
        return arithmetic.build_splits(t)
    if t.name == "math":
        return mathgen.build_splits(t)
    if t.name == "gym":
        # reasoning-gym's own system prompt asks for <answer> tags, which its scorers expect
        try:
            return gym.build_splits(t.gym_name, yaml.safe_load(t.gym_config) or {}, t.n_train, t.n_heldout, t.seed,
                                    t.system_prompt or "default")
        except ImportError as e:
            raise ConfigError(f"task.name=gym needs reasoning-gym ({e}); install it with: pip install 'rlpost[envs]'") from None
        except ValueError as e:
            raise ConfigError(f"task.{'gym_config' if 'config' in str(e) else 'gym_name'}: {e}") from None
    if t.name == "code":
        return code.build_splits(t.n_train, t.n_heldout, t.seed)
    return tools.build_splits(t)
