"""The Python API: ``rlpost.Trainer``, shaped like TRL's trainers.

    import rlpost
    trainer = rlpost.Trainer(model="embedded", reward_funcs=[my_reward], train_dataset=rows)
    summary = trainer.train()     # the same run folder as `rlpost train` writes

What it does is what the command line does, so the folder it writes works with every command
(``rlpost eval RUN``, ``rlpost train --resume RUN``, ``report``, ``doctor``, ``export``):

* The config is the defaults, or ``config`` (a recipe path, a ``Config``, or a mapping of
  sections or dotted keys), then ``overrides`` (``["trainer.lr=1e-5", ...]`` or a dict).
* Rows (``train_dataset`` / ``eval_dataset``: a list of dicts or a ``datasets.Dataset``) are
  written to ``RUN/data/*.jsonl`` and trained as ``task.name=dataset``: ``{"prompt", "answer"}``
  rows, ``prompt`` as chat messages (TRL's conversational format), ``messages`` ending with the
  user turn, and verl's rows (``reward_model.ground_truth``) all load; other columns reach the
  reward functions. Without rows, the config's task family is used (the arithmetic demo).
* Reward functions and the verifier may be ``"module:function"`` strings or Python callables
  (verifier-style ``fn(completion, row) -> reward | (reward, info)`` or TRL-style
  ``fn(prompts, completions, **columns) -> list[float]``). A callable still runs in the
  verifier worker process (its timeout and crash isolation are the same): it is pickled by value
  with cloudpickle into ``RUN/<module>.pkl``, and a generated module ``RUN/<module>.py`` loads it,
  so the config names it like any other (``rlpost_funcs_<id>:my_reward``). Pickling rather than
  copying source works for lambdas, closures and notebook functions; the price is that the run
  folder needs the same Python and library versions to load them again (as any pickle does).
  The run folder is put on ``sys.path`` (the CLI does the same for a run folder it reads).
* Held-out accuracy uses ``verifier``; by default the dataset task's exact match against
  ``answer`` when the rows have one, else the first reward function (correct = reward >= 1).
* ``environment`` (a class with ``reset(row)`` and ``step(message)``, or its 'module:Class';
  types/roles.py: Environment) trains multi-turn episodes instead (``task.name=env``): it is
  registered as the functions are and runs in environment worker processes; the rows, when given,
  go to its ``reset`` as they are, else it gives its own (its ``rows(split, n, seed)``).
* TRL's shape (recipes/trl_shape.py): ``args=GRPOConfig(...)`` or a dict of its fields (through the
  name table of docs/coming-from.md, under ``overrides``), ``peft_config=LoraConfig(...)``
  (model.lora_*), ``processing_class=`` (the model's own tokenizer), ``train(resume_from_checkpoint=)``
  and ``save_model(dir)`` (a copy of RUN/model). What rlpost does not take is one line with its way.
"""

from __future__ import annotations

import io
import json
import marshal
import shutil
import sys
import time
import types
import uuid
from collections import ChainMap
from pathlib import Path
from typing import Any, Callable, Iterable

import cloudpickle

from rlpost import config_check
from rlpost.config import Config, ConfigError, to_dict
from rlpost.console import say
from rlpost.envs.data import check_rows
from rlpost.envs.dataset import VERL_ANSWER, column, to_row
from rlpost.observe import runfolder
from rlpost.recipes import trl_shape
from rlpost.runconfig import load_run
from rlpost.types import folders
from rlpost.types.errors import ConfigProblems, writing
from rlpost.types.folders import run_path

FuncSpec = str | Callable


class Trainer:
    """GRPO (or ``algo.name``) on your rows and reward functions; ``train()`` returns the summary.

    Nothing is written until ``train()``: the constructor checks the config and the rows; ``train()``
    claims ``output_dir`` as the CLI claims a run folder (new, empty, or a start of its own that got
    nowhere; observe/runfolder.py), checks what the model can take, then writes the rows, the pickled
    functions and config.yaml there. A start that fails leaves nothing it wrote behind but the log
    (RUN/verifier.log, RUN/env.log) holding the traceback its error names; the next start there
    clears that."""

    def __init__(self, model: str | None = None, reward_funcs: FuncSpec | list[FuncSpec] = (),
                 train_dataset: Iterable[dict] | None = None, eval_dataset: Iterable[dict] | None = None, *,
                 verifier: FuncSpec | None = None, reward_weights: list[float] | None = None,
                 environment: str | type | None = None,
                 config: Any = None, overrides: list[str] | dict = (), output_dir: str | Path | None = None,
                 callbacks: list | tuple = (), args: Any = None, peft_config: Any = None, processing_class: Any = None,
                 **trl_only):
        not_taken(trl_only, "rlpost.Trainer")
        # TRL's args and peft_config under the overrides: an rlpost key set in both is the override's. Their
        # reward_weights goes with the task's keys, as reward_weights= does (they count its reward functions)
        trl = [*trl_shape.args_overrides(args), *trl_shape.peft_overrides(peft_config)]
        weights = [o for o in trl if o.startswith("task.reward_weights=")]
        items = [*(o for o in trl if o not in weights), *_as_overrides(overrides)]
        self.processing_class = processing_class
        if model is not None:
            if not isinstance(model, (str, Path)):
                raise ConfigError("model: expected a name or a folder ('embedded', a transformers folder, a hub id, "
                                  "a run folder); save a model object with save_pretrained first")
            items.append(f"model.name={model}")
        # every mistake in the config at once, before torch loads (build.check: below). With an environment or rows
        # of yours the task's family is set below, and task keys only it reads are checked there (the second load)
        ours = environment is not None or train_dataset is not None
        cfg = _load(config, [i for i in items if not (ours and i.startswith("task."))])
        self.rows = _rows(train_dataset) if train_dataset is not None else None
        self.eval_rows = _rows(eval_dataset) if eval_dataset is not None else None
        family = "env" if environment is not None else "dataset" if self.rows is not None else cfg.task.name
        name = cfg.run.name or f"{family}-{cfg.algo.name.rpartition(':')[2]}-{time.strftime('%Y%m%d-%H%M%S')}"
        self.run_dir = Path(output_dir or run_path(cfg.run.out_dir, name))
        self.run_dir = self.run_dir.resolve()
        self.callbacks = list(callbacks)  # on_train_begin / on_step_end / on_train_end (recipes/rl.py: train)
        self.registry = Registry(self.run_dir)
        funcs = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        paths = [self.registry.add(f, f"reward_{i}") for i, f in enumerate(funcs)]
        task = []
        if environment is not None:  # multi-turn episodes: the rows (yours, or the environment's own) go to its reset
            task += ["task.name=env", f"task.env={self.registry.add(environment, 'environment', 'environment')}"]
            task += self._data_overrides()[1:] if self.rows is not None else []
        elif self.rows is not None:
            task += self._data_overrides()
            has_answer = all("answer" in r or column(r, VERL_ANSWER) is not None for r in self.rows)
            if not has_answer:
                if verifier is None and not paths:
                    raise ConfigError("train_dataset: rows without 'answer' need reward_funcs or a verifier to score "
                                      "them")
                task.append("task.answer_column=")
                # which one is a guess: say it (a format reward first scores nothing)
                if verifier is None and len(paths) > 1:
                    say(f"held-out accuracy: scored by the first reward function, {paths[0].rpartition(':')[2]} "
                        "(correct = reward >= 1); verifier= names the one that checks the answer")
                verifier = paths[0] if verifier is None else verifier
        if verifier is not None:
            task.append(f"task.verifier={self.registry.add(verifier, 'verifier', 'verifier')}")
        if paths:
            task.append(f"task.reward_funcs={','.join(paths)}")
        if reward_weights is not None:
            task.append(f"task.reward_weights={','.join(str(float(w)) for w in reward_weights)}")
        else:
            task += weights
        where = [f"run.out_dir={self.run_dir.parent}", f"run.name={self.run_dir.name}"]
        # Loaded again from the same source with the task's keys, not on top of cfg: the defaults that
        # follow the data (rollout.max_new_tokens for rows of your own) are filled in at load. Its
        # task.data names files train() writes: build.check (which reads them) runs there.
        self.config = _load(config, [*items, *task, *where])
        from rlpost import build  # torch, from here on
        build.check(cfg)  # what the algorithm and this machine accept, before any folder exists
        if self.rows is not None and environment is None:
            self.prompts = _task_rows(self.rows, self.config.task, "train_dataset")
            self.prompts += _task_rows(self.eval_rows or [], self.config.task, "eval_dataset")

    def _data_overrides(self) -> list[str]:
        data = self.run_dir / "data"
        out = ["task.name=dataset", f"task.data={data / 'train.jsonl'}"]
        if self.eval_rows is not None:
            out.append(f"task.eval_data={data / 'eval.jsonl'}")
        return out

    def train(self, resume: bool = False, resume_from_checkpoint: bool | str | Path | None = None, **trl_only) -> dict:
        """Train; returns the summary (also RUN/summary.json). resume=True continues the run in
        output_dir from its last checkpoint, like ``rlpost train --resume RUN``: with the config,
        rows and reward functions saved there, and this Trainer's values of what a resume may
        change (run.steps, trainer.lr, ...: config.RESUMABLE) and its callbacks. A value of this
        Trainer that a resume may not change (a key outside RESUMABLE, another reward function) is
        refused in one line, as ``rlpost train --resume`` refuses it, rather than left out.
        TRL's resume_from_checkpoint: True, output_dir or its newest checkpoint is resume=True."""
        not_taken(trl_only, "Trainer.train")
        from rlpost import build
        from rlpost.model import checkpoint
        from rlpost.recipes.resume import resume_run
        from rlpost.recipes.rl import train as train_loop
        if resume_from_checkpoint not in (None, False):
            newest = checkpoint.candidates(self.run_dir, quiet=True)[:1]
            resume = trl_shape.resume_target(resume_from_checkpoint, self.run_dir, newest[0] if newest else None)
        if resume:
            return resume_run(self.run_dir, self._resume_overrides(), callbacks=self.callbacks)
        hint = "pass resume=True to continue it, or another output_dir"
        runfolder.check_new(self.run_dir, hint, "output_dir")
        self._preflight()
        with runfolder.claim(self.run_dir, "new", hint, key="output_dir") as rf:
            _importable(self.run_dir)
            if self.rows is not None:
                (self.run_dir / "data").mkdir(exist_ok=True)
                _write_jsonl(self.run_dir / "data" / "train.jsonl", self.rows)
                if self.eval_rows is not None:
                    _write_jsonl(self.run_dir / "data" / "eval.jsonl", self.eval_rows)
            self.registry.save()
            build.check(self.config)
            rf.write_config(self.config)
            say(f"run folder {self.run_dir}")
            return train_loop(self.config, self.run_dir, callbacks=self.callbacks)

    def _preflight(self) -> None:
        """The model's limits, on the rows in memory: before output_dir is claimed."""
        from rlpost.model import fit
        from rlpost.model.load import load_tokenizer
        cfg = self.config
        if self.processing_class is not None:
            trl_shape.check_processing_class(self.processing_class, load_tokenizer(cfg.model.name), cfg.model.name)
        if cfg.model.lora_r > 0:
            fit.check_lora_targets(cfg.model.name, cfg.model.lora_targets)
        if self.rows is not None and cfg.task.name != "env":
            fit.check_prompts(cfg.model.name, self.prompts, cfg.rollout.max_new_tokens, "rollout.max_new_tokens",
                              "train_dataset", ("task.on_bad_row", cfg.task.on_bad_row))  # train() drops them

    def save_model(self, output_dir: str | Path | None = None) -> Path:
        """TRL's save_model: RUN/model (what train() ends with), or a copy of it in ``output_dir``, a new
        or empty folder outside the run (an rlpost export folder, as ``rlpost export`` writes). For
        another step, adapters alone or another dtype: ``rlpost.export_run`` (docs/python.md)."""
        model = self.run_dir / "model"
        if not (model / "config.json").is_file():
            raise ConfigError(f"save_model: no model in {self.run_dir} yet: train() writes RUN/model at its end "
                              "(docs/python.md)")
        if output_dir is None:
            return model
        out = Path(output_dir).resolve()
        if folders.inside(out, self.run_dir) or folders.inside(self.run_dir, out):
            raise ConfigError(f"save_model: {out} is {'inside' if folders.inside(out, self.run_dir) else 'around'} the "
                              f"run folder ({self.run_dir}), which already holds the model in model/: pick a folder "
                              "outside it")
        folders.check_folder(out, "export", "save_model")
        from rlpost.model.export import publish
        return publish(out, lambda tmp: shutil.copytree(model, tmp))

    def _resume_overrides(self) -> list[str]:
        """Every value of this Trainer that differs from the run's, as overrides (config.resume_changes
        refuses those a resume may not change). Left out: where the run is (output_dir, and the rows
        written there), and a function given as an object, whose registered module is named anew by each
        Trainer: the same function names are the same functions (the run folder keeps them pickled)."""
        if not (self.run_dir / "config.yaml").is_file():
            raise ConfigError(f"output_dir {self.run_dir}: no run to resume there (no config.yaml); train() without "
                              "resume=True starts one")
        saved = to_dict(load_run(self.run_dir)[0])
        ours = to_dict(self.config)
        return [f"{sec}.{key}={_text(value)}" for sec, keys in ours.items() for key, value in keys.items()
                if value != saved[sec][key] and f"{sec}.{key}" not in WHERE_THE_RUN_IS
                and not (f"{sec}.{key}" in FUNCTION_KEYS and _registered(value) == _registered(saved[sec][key]))]


# Keys the Trainer sets from output_dir (the run folder, and the rows it writes there), and keys that
# name functions, which a Trainer registers under a module name of its own (Registry)
WHERE_THE_RUN_IS = ("run.out_dir", "run.name", "task.data", "task.eval_data")
FUNCTION_KEYS = ("task.reward_funcs", "task.verifier", "task.env")


# TRL's GRPOTrainer arguments that rlpost.Trainer does not take, each with the rlpost way
TRL_ONLY = {
    "reward_processing_classes": "a reward model is scored with its own folder's tokenizer: "
                                 "overrides={'task.reward_model': folder} (docs/python.md)",
    "optimizers": "rlpost builds the optimizer and its schedule: trainer.lr, trainer.weight_decay, trainer.schedule "
                  "in overrides= (docs/options.md)",
    "quantization_config": "rlpost loads the model in rollout.dtype and trains float32 weights or LoRA adapters: "
                           "peft_config= or model.lora_r (docs/options.md)",
    "tools": "tools reach the model through an environment: environment= (docs/environments.md)",
    "rollout_func": "a multi-turn rollout is an environment: environment= (docs/environments.md)",
    "environment_factory": "environment= takes the class itself, with reset(row) and step(message) "
                           "(docs/environments.md)",
}


def not_taken(given: dict, where: str) -> None:
    """One line per keyword argument ``where`` does not take (TRL's, or a misspelling), never a TypeError."""
    if given:
        raise ConfigProblems([f"{where}: {name}= is not taken here; " + TRL_ONLY.get(
            name, "its arguments and TRL's names it takes are in docs/python.md") for name in given])


def _registered(paths) -> str:
    """A function-key value with each registered module's name dropped: 'rlpost_funcs_<id>:f' -> ':f'."""
    return ",".join(":" + p.rpartition(":")[2] if p.startswith(Registry.PREFIX) else p
                    for p in (q.strip() for q in str(paths).split(",")))


def _task_rows(rows: list[dict], tcfg, source: str) -> list[dict]:
    """The rows as the dataset task reads them (checked as it checks them): their prompt messages."""
    good, _ = check_rows(rows, lambda r, src: to_row(r, tcfg, src), source, tcfg.on_bad_row)
    return [to_row(r, tcfg, source) for r in good]


def _load(base: Any, items: list[str]) -> Config:
    """The defaults, or a recipe path / Config / mapping, with dotted overrides on top; every
    mistake at once, one line each (config_check.py); what this machine accepts is build.check's."""
    if base is None or isinstance(base, (str, Path)):
        return config_check.load(base, items, on_this_machine=False)
    if isinstance(base, Config):
        return config_check.load(None, items, tree=to_dict(base), on_this_machine=False)
    if isinstance(base, dict):
        return config_check.load(None, [*_as_overrides(base), *items], on_this_machine=False)
    raise ConfigError(f"config: expected a recipe path, an rlpost Config or a dict, got {type(base).__name__}")


def _as_overrides(overrides: list[str] | dict) -> list[str]:
    """['section.key=value', ...] from a list of strings or a dict, nested ({'trainer': {'lr': 1e-5}}) or
    dotted ({'trainer.lr': 1e-5})."""
    if not isinstance(overrides, dict):
        return list(overrides)
    out = []
    for key, value in overrides.items():
        if isinstance(value, dict):
            out += [f"{key}.{k}={_text(v)}" for k, v in value.items()]
        else:
            out.append(f"{key}={_text(value)}")
    return out


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _rows(dataset: Iterable[dict]) -> list[dict]:
    """Rows as plain dicts; ``messages`` (chat ending with the user turn) becomes the prompt."""
    columns = isinstance(dataset, dict) and bool(dataset) and all(isinstance(v, list) for v in dataset.values())
    if columns and len({len(v) for v in dataset.values()}) == 1:  # {"prompt": [...], "answer": [...]}: columns
        raise ConfigError(f"dataset: a dict of columns ({', '.join(map(str, dataset))}); pass rows: "
                          "datasets.Dataset.from_dict(d), or [dict(zip(d, row)) for row in zip(*d.values())]")
    if isinstance(dataset, dict) or isinstance(dataset, (str, Path)):  # a DatasetDict is a dict of splits
        splits = list(dataset) if isinstance(dataset, dict) else []
        raise ConfigError(f"dataset: a {type(dataset).__name__}" + (
            f" of splits ({', '.join(map(str, splits))}); pass one split, e.g. train_dataset=ds[{splits[0]!r}]"
            + (f", eval_dataset=ds[{splits[1]!r}]" if len(splits) > 1 else "") if splits else
            "; pass rows (a list of dicts or a datasets.Dataset), or a file as overrides={'task.data': path}"))
    if hasattr(dataset, "learning_rate") and not hasattr(dataset, "__iter__"):  # TRL's third argument is args
        raise ConfigError(f"dataset: a {type(dataset).__name__}; a TRL config goes in args=")
    rows = []
    for r in dataset:
        r = dict(r)
        if "prompt" not in r and "messages" in r:
            r["prompt"] = r.pop("messages")
        rows.append(r)
    if not rows:
        raise ConfigError("dataset: no rows")
    return rows


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    with writing(path):
        path.write_text("".join(json.dumps(r, default=str) + "\n" for r in rows))
    return path


def _importable(folder: Path) -> None:
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))


class Registry:
    """Callables given as Python objects, made importable for the verifier worker: pickled by value
    into RUN/<module>.pkl, exposed by a generated RUN/<module>.py. The module name is unique per run,
    so two runs in one process (or on one PYTHONPATH) never see each other's functions."""

    PREFIX = runfolder.FUNCS_PREFIX  # a new start in a failed one's folder removes the old ones (runfolder.leftover)

    def __init__(self, run_dir: Path):
        self.run_dir, self.funcs = run_dir, {}
        self.module = f"{self.PREFIX}{uuid.uuid4().hex[:12]}"

    def add(self, fn: FuncSpec, fallback: str, key: str = "reward_funcs") -> str:
        """``key``: the argument ``fn`` came in (its lines name it)."""
        if isinstance(fn, str):
            return fn
        if key == "environment" and not isinstance(fn, type):
            raise ConfigError(f"environment: expected an environment class or a 'module:Class' string, got "
                              f"{type(fn).__name__}{' (an instance: pass the class)' if hasattr(fn, 'reset') else ''}")
        if not callable(fn):
            raise ConfigError(f"{key}: expected 'module:function' strings or callables, got {type(fn).__name__}")
        if hasattr(fn, "config") and hasattr(fn, "forward"):  # TRL takes a reward model among its reward functions
            raise ConfigError(f"reward_funcs: a model object ({type(fn).__name__}); a reward model goes in "
                              "task.reward_model: save it with save_pretrained and pass "
                              "overrides={'task.reward_model': folder}")
        name = getattr(fn, "__name__", "")
        if not name.isidentifier() or name in self.funcs or name.startswith("_"):
            name = fallback  # lambdas, duplicates: the logs name it reward_<i>
        self.funcs[name] = fn
        return f"{self.module}:{name}"

    def save(self) -> None:
        if not self.funcs:
            return
        pkl = self.run_dir / f"{self.module}.pkl"
        with writing(pkl):
            pkl.write_bytes(dumps_by_value(self.funcs))
        with writing(self.run_dir / f"{self.module}.py"):
            (self.run_dir / f"{self.module}.py").write_text(
                '"""Functions passed to rlpost.Trainer as Python objects, pickled by value next to this file."""\n'
                "import pickle\nfrom pathlib import Path\n\n"
                f"globals().update(pickle.loads(Path(__file__).with_name({pkl.name!r}).read_bytes()))\n")


def _code_by_marshal(code: types.CodeType):
    return marshal.loads, (marshal.dumps(code),)


class _NamedCodePickler(cloudpickle.Pickler):
    # read when the pickler is made: code objects by marshal, the rest as cloudpickle does
    dispatch_table = ChainMap({types.CodeType: _code_by_marshal}, cloudpickle.Pickler.dispatch_table)


def dumps_by_value(obj: Any) -> bytes:
    """cloudpickle.dumps, keeping each function's file name: cloudpickle writes every code object's
    as '<dynamic-code>', so a reward function's traceback named no file of the user's. marshal keeps
    the whole code object (the run folder needs the same Python to load it in any case)."""
    buffer = io.BytesIO()
    _NamedCodePickler(buffer).dump(obj)
    return buffer.getvalue()
