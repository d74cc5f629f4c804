"""`rlpost train --resume RUN` and ``rlpost.Trainer(...).train(resume=True)``: everything is
checked before anything is written.

In order, each failure one line and nothing written: the folder is a run folder (and not in use:
observe/runfolder.py), every config file of the run loads (a damaged ``config.yaml`` is refused,
never rewritten), the overrides change only what a resume may change, this machine can honour the
config, the newest intact checkpoint is one of this kind of run, the model can take the task's
prompts. Then the loop puts the checkpoint's state back (recipes/rl.py) and only after that is the
changed config recorded, as ``config.resume-N.yaml``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from rlpost import build, config, runconfig
from rlpost.console import say
from rlpost.envs import build_task
from rlpost.model import checkpoint
from rlpost.observe import runfolder
from rlpost.recipes.evaluate import by_task_summary
from rlpost.recipes.rl import check_checkpoint, train


def resume_run(run_dir: str | Path, overrides: list[str] = (), start_over: bool = False,
               callbacks: Sequence = ()) -> dict:
    """Continue ``run_dir`` from its newest intact checkpoint (or, with ``start_over``, train it
    again from step 0 when it has none); returns the summary. ``callbacks``: the loop's (rl.train)."""
    run_dir = Path(run_dir)
    with runfolder.claim(run_dir, "resume") as rf:
        importable(run_dir)
        old, cfg = runconfig.load_run(run_dir, overrides)
        changes = config.resume_changes(old, cfg)
        build.check(cfg)
        ckpt = checkpoint.newest_intact(run_dir)
        if ckpt is None and not start_over:
            raise config.ConfigError(f"--resume {run_dir}: no intact checkpoint to resume from{_why(run_dir)}; add "
                                     "--start-over to train it again from step 0 (its metrics and samples are "
                                     "replaced)")
        if ckpt is not None:
            done = checkpoint.step_of(ckpt)
            if cfg.run.steps < done:  # the config would say fewer steps than the run has taken
                raise config.ConfigError(f"run.steps={cfg.run.steps}: {run_dir} is at step {done} already (its "
                                         f"newest checkpoint); to end the run there, resume with run.steps={done}")
            check_checkpoint(ckpt, cfg)
            # the first start's held-out dump, read at the end: damaged is said now
            by_task_summary(run_dir / "samples")
        task = build_task(cfg.task)
        build.preflight(cfg, task)

        def record() -> None:
            if changes:
                say(f"resuming with {'; '.join(changes)} (recorded in {rf.write_config(cfg).name})")

        say(f"run folder {run_dir}: resuming from {ckpt.name if ckpt else 'step 0 (--start-over)'}")
        if ckpt is None:
            record()
            return train(cfg, run_dir, task=task, callbacks=callbacks)
        return train(cfg, run_dir, resume=True, task=task, on_resumed=record, callbacks=callbacks)


def _why(run_dir: Path) -> str:
    """What was wrong with the newest checkpoint, when there is one."""
    found = checkpoint.candidates(run_dir, quiet=True)
    problem = checkpoint.verify(found[0]) if found else None
    return f" ({found[0].name}: {problem})" if problem else ""


def importable(run_dir: Path) -> None:
    """Put a run folder on the import path (and so on its verifier workers' PYTHONPATH): the
    Python API registers reward functions given as objects in a module there (recipes/api.py)."""
    folder = str(Path(run_dir).resolve())
    if folder not in sys.path:
        sys.path.insert(0, folder)
