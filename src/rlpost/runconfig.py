"""A run folder's config files read back: ``config.yaml`` and each ``config.resume-N.yaml`` a
resume that changed something added (config.py: RESUMABLE). Every command that continues or reads
a run (``--resume``, ``eval RUN``, ``export``, ``rlpost.Trainer(...).train(resume=True)``) loads
them through ``load_run``, which checks each one: a damaged, emptied or invalid file is refused
naming it, and none is ever rewritten.
"""

from __future__ import annotations

from pathlib import Path

from rlpost.config import Config, from_dict, load, read_yaml
from rlpost.types.errors import ConfigError

RUN_SECTIONS = ("model", "task", "rollout", "algo", "trainer", "run")  # every run's config.yaml names them


def load_run(run_dir: str | Path, overrides: list[str] = ()) -> tuple[Config, Config]:
    """(the config a run folder runs under now, the same with ``overrides``), after checking every
    config file of the run: a damaged one is a ConfigError naming it."""
    files = [Path(run_dir) / "config.yaml", *resume_config_paths(run_dir)]
    for path in files:
        tree = read_yaml(path)
        missing = [s for s in RUN_SECTIONS if not isinstance(tree.get(s), dict)]
        if missing:
            raise ConfigError(f"{path}: section {missing[0]} is missing; a run's config names every section "
                              "(was it emptied or edited?)")
        try:
            from_dict(tree)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None
    return load(files[-1]), load(files[-1], overrides)


def resume_config_paths(run_dir: str | Path) -> list[Path]:
    """config.resume-N.yaml of a run folder, in order of N."""
    return sorted((p for p in Path(run_dir).glob("config.resume-*.yaml") if p.stem.rpartition("-")[2].isdigit()),
                  key=lambda p: int(p.stem.rpartition("-")[2]))
