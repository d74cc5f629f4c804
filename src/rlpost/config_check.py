"""The whole configuration checked at once, before torch loads: ``load`` reports every problem it
finds, one line each, where ``config.load`` stops at the first.

What it finds without torch (a fraction of a second, where torch alone takes seconds to import):

- each override that is not ``section.key=value``;
- each unknown section or key (another framework's name gets the rlpost one: names.py), and each
  value of the wrong type or out of its range;
- then, on the keys that were right, each cross-field rule broken (config.check_consistency; the
  task's own rules, which read its files, after those pass) and what this machine refuses (machine.py);
- each algo key that algo.name does not read and another algorithm does (``algo_knobs``: each
  algorithm's own declaration, ``reads`` beside its traits, read from its file);
- each function, environment or algorithm named by import path ('module:name') whose module is
  nowhere to be found: a file path that does not exist, a module on neither Python's path nor the
  working directory (looked up, never imported: the verifier and environment workers import them).

``refuse_ignored`` refuses a key the command it was typed for does not read (``rlpost eval
trainer.lr=...``), so nothing asked for is dropped silently.

What needs the model or the algorithm's code (build.check, build.preflight) is checked after, as
before, one line at a time.
"""

from __future__ import annotations

import ast
import functools
import importlib.machinery
import importlib.util
import os
from dataclasses import fields
from pathlib import Path

from rlpost import config, machine
from rlpost.observe.runfolder import FUNCS_PREFIX  # rlpost.Trainer's functions: their module is written by train()
from rlpost.types.errors import ConfigError, ConfigProblems

ALGORITHMS_DIR = Path(__file__).resolve().parent / "algorithms"


@functools.cache
def algo_knobs() -> dict[str, frozenset[str]]:
    """{algo.name: the algo keys it reads} for the shipped algorithms, from each class's declaration beside
    its traits (``name = "..."`` and ``reads = (...)``, literals), read from algorithms/*.py without
    importing them: importing an algorithm imports torch, which this check runs before."""
    found = {}
    for f in sorted(ALGORITHMS_DIR.glob("*.py")):
        for cls in (n for n in ast.parse(f.read_text()).body if isinstance(n, ast.ClassDef)):
            values = {s.target.id: s.value for s in cls.body if isinstance(s, ast.AnnAssign)
                      and isinstance(s.target, ast.Name) and s.value is not None}
            if "name" in values and "reads" in values:
                found[ast.literal_eval(values["name"])] = frozenset(ast.literal_eval(values["reads"]))
    return found


def load(recipe: str | Path | None = None, overrides: list[str] = (), tree: dict | None = None,
         on_this_machine: bool = True) -> config.Config:
    """``config.load`` (defaults <- recipe <- overrides, or ``tree`` <- overrides), with every problem
    found raised at once: ConfigProblems, one line each; one problem is a plain ConfigError's line.
    ``on_this_machine``: with machine.check (rlpost.Trainer leaves it to build.check: its task.data
    names the files its train() writes)."""
    problems: list[str] = []
    tree = {**(tree or {})} if recipe is None else config.read_yaml(recipe)  # a broken file: its one line
    for item in overrides:
        try:
            key, value = config.parse_override(item)
            config.set_dotted(tree, key, value)
        except ConfigError as e:
            problems.append(str(e))
    good = keys_that_load(tree, problems)
    cfg = None
    try:
        cfg = config.from_dict(good)
        if on_this_machine:
            machine.check(cfg)
    except ConfigProblems as e:  # the cross-field rules, each broken one
        problems += e.problems
    except ConfigError as e:
        problems.append(str(e))
    if cfg is not None:
        problems += ignored_algo_keys(cfg) + missing_modules(cfg)
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigProblems(problems)
    return cfg


def keys_that_load(tree: dict, problems: list[str]) -> dict:
    """``tree`` less each section and key that config.from_dict refuses on its own (unknown, wrong
    type, out of range), whose lines are added to ``problems``."""
    sections = {f.name for f in fields(config.Config)}
    good: dict = {}
    for section, values in tree.items():
        if section not in sections or not isinstance(values, dict):
            try:
                config.from_dict({section: values})
            except ConfigError as e:
                problems.append(str(e))
            continue
        cls = config.section_class(section)
        for key, value in values.items():
            try:
                config._build_section(cls, {key: value}, section)
            except ConfigError as e:
                problems.append(str(e))
            else:
                good.setdefault(section, {})[key] = value
    return good


def ignored_algo_keys(cfg: config.Config) -> list[str]:
    """A line for each algo key set away from its default that algo.name does not read and another
    algorithm does (build.check_algorithm says the same, once torch is loaded); none for your own algorithm."""
    algo = cfg.algo
    table = algo_knobs()
    mine = table.get(algo.name)
    if mine is None:
        return []
    default, out = type(algo)(), []
    for key in sorted(set().union(*table.values()) - mine):
        if getattr(algo, key) != getattr(default, key):
            readers = [name for name, keys in table.items() if key in keys]
            out.append(f"algo.{key}: algo.name={algo.name} does not read it (read by {', '.join(readers)}); remove it"
                       + (f", or set algo.name={readers[0]}" if len(readers) == 1 else ""))
    return out


SHIPPED_ENV_LIBRARIES = ("verifiers", "textarena")  # task.env=verifiers:ID, textarena:ID: checked by env_config.py


def missing_modules(cfg: config.Config) -> list[str]:
    """A line for each 'module:name' of the config whose module cannot be found (found, not imported)."""
    task = cfg.task
    named = [("task.verifier", task.verifier), ("algo.name", cfg.algo.name if ":" in cfg.algo.name else "")]
    named += [("task.reward_funcs", f.strip()) for f in task.reward_funcs.split(",")]
    if task.env.partition(":")[0] not in SHIPPED_ENV_LIBRARIES:
        named.append(("task.env", task.env if ":" in task.env else ""))
    out = []
    for key, path in named:
        module = path.rpartition(":")[0]
        if not module or module.startswith(FUNCS_PREFIX):
            continue  # empty, a shipped name, no colon (the loader's own line names it), or rlpost.Trainer's own
        if module.endswith(".py"):
            if not Path(module).is_file():
                out.append(f"{key}: {path}: no file {module}")
        elif not findable(module.split(".")[0]):
            out.append(f"{key}: {path}: no module {module.split('.')[0]!r} in the working directory or on Python's "
                       "path (is it installed, or run from the folder that holds it?)")
    return out


def findable(top: str) -> bool:
    """Whether a top-level module can be imported, where the workers look: Python's path and the
    working directory. Looked up only: nothing of it runs."""
    try:
        if importlib.util.find_spec(top) is not None:
            return True
    except (ImportError, ValueError):
        return False
    return importlib.machinery.PathFinder.find_spec(top, [os.getcwd()]) is not None


# Sections (or keys) a command reads; a key typed for a command that does not read it is refused,
# so nothing the user asked for is silently dropped. Shared override sets (a pipeline's `base`)
# are not checked here: each stage reads its own part of them.
# What the runs on fixed rows and in rounds (sft, rsft, dpo, rm) do not read: pref.epochs or pref.online_rounds set
# their length, pref.batch_size rows make each optimizer step (one pass over them: no trainer.epochs or
# trainer.mini_batch_size), and they take their held-out measure once before training and once after.
NO_STEPS = ("run.steps", "run.eval_every", "run.eval_n", "run.eval_batch_size", "run.passk_eval", "run.full_eval",
            "run.early_stop_patience", "trainer.epochs", "trainer.mini_batch_size")
# ... and what the runs on fixed rows (sft, rm, dpo without pref.online_rounds) do not read either: they grade
# nothing, and keep no reference, critic or reward model to offload
NO_GRADING = ("rollout.", "task.verifier_", "task.max_reward_error_frac", "task.sandbox", "offload.")
IGNORED = {
    "train": ("pref.",),
    "eval": ("pref.", "trainer.", "algo.", "dist.", "model.lora_", "model.gradient_checkpointing"),
    "sft": ("dist.", "algo.", *NO_GRADING, *NO_STEPS, "pref.online_", "pref.loss", "pref.beta", "pref.label_smoothing",
            "pref.simpo_gamma", "pref.orpo_lambda", "pref.rm_margin", "pref.nll_coef", "pref.rsft_"),
    "rsft": ("dist.", "algo.", *NO_STEPS, "pref.data", "pref.eval_data", "pref.prompt_format", "pref.loss",
             "pref.beta", "pref.label_smoothing", "pref.simpo_gamma", "pref.orpo_lambda", "pref.rm_margin",
             "pref.nll_coef"),
    "rm": ("dist.", "algo.", *NO_GRADING, *NO_STEPS, "pref.online_", "pref.loss", "pref.beta", "pref.label_smoothing",
           "pref.simpo_gamma", "pref.orpo_lambda", "pref.nll_coef", "pref.rsft_"),
    # online DPO samples as GRPO would, algo.* unread; on fixed rows (pref.online_rounds=0) rollout.* too: dpo_rows
    "dpo": ("dist.", "algo.", *NO_STEPS, "pref.rm_margin", "pref.rsft_"),
    "dpo_rows": ("dist.", "algo.", *NO_GRADING, *NO_STEPS, "pref.rm_margin", "pref.rsft_", "pref.online_prompts"),
    "prm": ("pref.", "trainer.", "algo.", "dist.", "model.lora_", "model.gradient_checkpointing"),
    "search": ("pref.", "trainer.", "algo.", "dist.", "model.lora_", "model.gradient_checkpointing"),
}
READ = {"rm": ("algo.critic_lr",)}  # keys a command reads inside a section it otherwise ignores: the scalar head's lr
STEPS = ("it samples, grades and offloads nothing; pref.epochs sets its length, pref.batch_size rows make one "
         "optimizer step, and its held-out loss is taken before and after training")
ROUNDS = ("pref.online_rounds sets its length, pref.batch_size rows make one optimizer step, and its held-out loss is "
          "taken before and after each round")
WHY = {"train": "RL reads no pref.* (sft, rm and dpo do)", "eval": "evaluation trains nothing",
       "sft": f"supervised fine-tuning runs in one process, on fixed rows, with the NLL loss; {STEPS}",
       "rsft": f"rejection-sampling SFT samples its own rows and trains them with the NLL loss; {ROUNDS}",
       "rm": "the reward model trains in one process with the Bradley-Terry loss; of algo.* it reads algo.critic_lr, "
             f"its head's lr; {STEPS}",
       "dpo": "preference optimisation runs in one process with its own loss, pref.loss and pref.beta; pref.epochs "
              "sets its length (pref.online_rounds online), pref.batch_size rows make one optimizer step, and its "
              "held-out loss is taken before and after training (each round online)",
       "dpo_rows": "preference optimisation on fixed rows (pref.online_rounds=0) runs in one process with its own "
                   f"loss, pref.loss and pref.beta; {STEPS}",
       "prm": "the scorer trains in one process with its own options: --lr, --head-lr, --epochs, --batch-size",
       "search": "search trains nothing"}


def refuse_ignored(command: str, keys: list[str]) -> None:
    """One ConfigError for the first key `rlpost command` would not read (the CLI's check, before torch loads)."""
    for key in keys:
        if key in READ.get(command, ()):
            continue
        if any(key == p or key.startswith(p) for p in IGNORED.get(command, ())):
            raise config.ConfigError(f"{key}: rlpost {command.partition('_')[0]} would ignore it ({WHY[command]}); "
                                     "drop it")
