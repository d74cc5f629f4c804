"""rlpost: reinforcement-learning post-training of language models (GRPO and family).

The library API, loaded on first use (PEP 562), so that ``import rlpost`` imports no torch and a
config mistake is reported before torch loads:

  rlpost.Trainer        TRL-shaped trainer: model, reward_funcs, train_dataset -> .train() (docs/python.md)
  rlpost.train          the RL loop itself: train(cfg, run_dir, resume=False, task=None) (recipes/rl.py)
  rlpost.load_config    defaults <- recipe YAML <- dotted overrides, validated (config.py)
  rlpost.Task           your own rows and verifier for ``train`` (envs/__init__.py)
  rlpost.export_run     a run's checkpoint as a transformers folder (recipes/export.py)

OpenMP's wait policy is left as the user has it (GNU OpenMP's default: threads spin a few ms at
every barrier before they sleep). On a quiet machine that spin is what keeps a decode step's ~180
parallel matmuls fast (waking a sleeping thread for each cost the loop's generation 4.0 s against
2.9 s spinning); beside a busy process it is what made a step 3.3-4.0x as slow. The run answers
that with its thread count instead: one thread fewer for each core other processes keep busy
(model/cores.py, ``run.threads=0``), so no spinning thread competes with a neighbour.
benchmarks/contention.py measures both. Until 2026-11-26 this module set a ~10 us spin
(``OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=1000``) for every process that imported rlpost.
"""

__all__ = ["Trainer", "train", "load_config", "Task", "export_run"]


def __getattr__(name: str):
    # Imports here, not at the top: each pulls in torch (tests/test_style.py: LAZY_OK names why).
    if name == "Trainer":
        from rlpost.recipes.api import Trainer as value
    elif name == "train":
        from rlpost.recipes.rl import train as value
    elif name == "load_config":
        from rlpost.config import load as value
    elif name == "Task":
        from rlpost.envs import Task as value
    elif name == "export_run":
        from rlpost.recipes.export import export_run as value
    else:
        raise AttributeError(f"module 'rlpost' has no attribute {name!r}")
    globals()[name] = value  # later look-ups do not come here again
    return value


def __dir__():
    return sorted({*globals(), *__all__})
