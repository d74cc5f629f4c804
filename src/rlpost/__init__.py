"""rlpost: reinforcement-learning post-training of language models (GRPO and family).

The library API, loaded on first use (PEP 562), so that ``import rlpost`` imports no torch and a
config mistake is reported before torch loads:

  rlpost.Trainer        TRL-shaped trainer: model, reward_funcs, train_dataset -> .train() (docs/python.md)
  rlpost.train          the RL loop itself: train(cfg, run_dir, resume=False, task=None) (recipes/rl.py)
  rlpost.load_config    defaults <- recipe YAML <- dotted overrides, validated (config.py)
  rlpost.Task           your own rows and verifier for ``train`` (envs/__init__.py)
  rlpost.export_run     a run's checkpoint as a transformers folder (model/export.py)

One process-wide setting is made here, before anything imports torch: OpenMP threads that wait
spin briefly, then sleep (``OMP_WAIT_POLICY=PASSIVE`` with ``GOMP_SPINCOUNT=1000``, ~10 us; read by
libgomp once, when torch loads). With GNU OpenMP's default (spin ~300k iterations at every
barrier), a torch op split over both cores waits for whichever thread the kernel has descheduled,
while the other spins on the core that thread needs: 3.3-4.0x the step beside one busy process,
where sleeping at once costs 1.1-1.6x. Sleeping at once costs a quiet machine the wake-ups between
small ops instead (1.1-1.5x the step alone on AVX-512 AMD EPYC); the short spin keeps most of both
(alone 0.67-0.90x of sleeping at once, busy 1.6-2.0x its own alone). benchmarks/contention.py.
An explicit ``OMP_WAIT_POLICY`` in the environment wins (and then no spin count is set), as does an
explicit ``GOMP_SPINCOUNT``; so does importing torch before rlpost.
"""

import os

if "OMP_WAIT_POLICY" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    os.environ.setdefault("GOMP_SPINCOUNT", "1000")

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
        from rlpost.model.export import export_run as value
    else:
        raise AttributeError(f"module 'rlpost' has no attribute {name!r}")
    globals()[name] = value  # later look-ups do not come here again
    return value


def __dir__():
    return sorted({*globals(), *__all__})
