"""Metric sinks beyond metrics.jsonl (always written by RunLog) and the progress bar (always on).

``run.loggers`` names any of: ``console`` (one line of key metrics per step, for logs that are
not a terminal), ``tensorboard`` (event files in RUN_DIR/tensorboard), ``wandb`` (Weights &
Biases; offline unless WANDB_MODE says otherwise, files in RUN_DIR/wandb), ``mlflow`` (a file
store in RUN_DIR/mlruns unless MLFLOW_TRACKING_URI is set). Every sink receives the same metric
names as metrics.jsonl; histograms (lists of bin counts) go where the sink has histograms, or
are skipped. A sink whose library is missing stops the run before training, naming the
package to install.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from rlpost.types.errors import ConfigError

KNOWN = {"console": None, "tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
CONSOLE_KEYS = ("reward/mean", "eval/heldout_accuracy", "actor/loss", "actor/entropy", "actor/kl",
                "response_length/mean", "timing_s/step")


def parse(names: str) -> list[str]:
    """The logger names of run.loggers ('a,b'), checked: known and importable."""
    out = [n.strip() for n in names.split(",") if n.strip()]
    for n in out:
        if n not in KNOWN:
            raise ConfigError(f"run.loggers: unknown logger {n!r} (expected some of {', '.join(KNOWN)})")
        if KNOWN[n] and importlib.util.find_spec(KNOWN[n]) is None:
            raise ConfigError(f"run.loggers: {n} needs the {KNOWN[n]!r} package (pip install {KNOWN[n]})")
    return out


def scalars(metrics: dict) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


class Console:
    def __init__(self, run_dir: Path, config: dict):
        pass

    def log(self, step: int, metrics: dict) -> None:
        parts = [f"{k}={metrics[k]:.4g}" for k in CONSOLE_KEYS if isinstance(metrics.get(k), (int, float))]
        print(f"rlpost: step {step} " + " ".join(parts), file=sys.stderr, flush=True)

    def close(self) -> None:
        pass


class TensorBoard:
    def __init__(self, run_dir: Path, config: dict):
        from torch.utils.tensorboard import SummaryWriter

        self.w = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        self.w.add_text("config", "```\n" + _yaml(config) + "\n```")

    def log(self, step: int, metrics: dict) -> None:
        import numpy as np

        for k, v in scalars(metrics).items():
            self.w.add_scalar(k, v, step)
        for k, v in metrics.items():
            if isinstance(v, list) and v and sum(v) > 0:  # bin counts -> a histogram over bin indices
                counts = np.asarray(v, dtype=np.float64)
                self.w.add_histogram_raw(k, min=0, max=len(v) - 1, num=counts.sum(),
                                         sum=float((counts * np.arange(len(v))).sum()),
                                         sum_squares=float((counts * np.arange(len(v)) ** 2).sum()),
                                         bucket_limits=list(range(1, len(v) + 1)), bucket_counts=v, global_step=step)
        self.w.flush()

    def close(self) -> None:
        self.w.close()


class WandB:
    def __init__(self, run_dir: Path, config: dict):
        import wandb

        os.environ.setdefault("WANDB_MODE", "offline")  # no network needed; `wandb sync` uploads later
        os.environ.setdefault("WANDB_SILENT", "true")
        self.run = wandb.init(project="rlpost", name=run_dir.name, dir=str(run_dir), config=config,
                              resume="allow", id=_run_id(run_dir))

    def log(self, step: int, metrics: dict) -> None:
        self.run.log(scalars(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


_OUR_URIS: set[str] = set()  # the file stores MLflow sinks of this process pointed MLflow at


class MLflow:
    def __init__(self, run_dir: Path, config: dict):
        import mlflow

        # A local file store (no server, no database package) unless the user named a tracking URI. MLflow's
        # set_tracking_uri exports MLFLOW_TRACKING_URI for subprocesses, so one set by an earlier run of this
        # process is ours, not the user's: the next run gets its own folder.
        if os.environ.get("MLFLOW_TRACKING_URI") in (None, *_OUR_URIS):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps it, in maintenance mode
            uri = (run_dir / "mlruns").resolve().as_uri()
            _OUR_URIS.add(uri)
            mlflow.set_tracking_uri(uri)
        mlflow.set_experiment("rlpost")
        self.mlflow = mlflow
        self.run = mlflow.start_run(run_name=run_dir.name)
        mlflow.log_params({f"{s}.{k}": v for s, sec in config.items() for k, v in sec.items()})

    def log(self, step: int, metrics: dict) -> None:
        self.mlflow.log_metrics({k.replace("/", "."): v for k, v in scalars(metrics).items()}, step=step)

    def close(self) -> None:
        self.mlflow.end_run()


SINKS = {"console": Console, "tensorboard": TensorBoard, "wandb": WandB, "mlflow": MLflow}


class Loggers:
    """All configured sinks behind one log/close."""

    def __init__(self, names: str, run_dir: Path, config: dict):
        self.sinks = [SINKS[n](Path(run_dir), config) for n in parse(names)]

    def log(self, step: int, metrics: dict) -> None:
        for s in self.sinks:
            s.log(step, metrics)

    def close(self) -> None:
        """Close every sink once (again is a no-op)."""
        sinks, self.sinks = self.sinks, []
        for s in sinks:
            s.close()


def _run_id(run_dir: Path) -> str:
    """A stable W&B run id per run folder, so a resumed run continues the same W&B run."""
    import hashlib

    return hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:12]


def _yaml(config: dict) -> str:
    import yaml

    return yaml.safe_dump(config, sort_keys=False)
