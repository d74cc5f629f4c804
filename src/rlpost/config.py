"""Typed run configuration: frozen dataclasses, YAML recipes, dotted ``key=value`` overrides.

A config is one ``Config`` made of sections (``model``, ``task``, ``rollout``, ``algo``,
``trainer``, ``pref``, ``run``, ``dist``, ``offload``), defined in sections.py (``task`` in
task_section.py). Each field's docstring (the string literal under it) is its ``--help`` text, so
nothing is documented twice. Ranges and choices live next to the field, in ``metadata``; cross-field
rules live here in ``check_consistency``; the numbers that follow from several sections (batch
sizes, optimizer steps) in ``Config.derived`` (sections.py).

Any mistake — an unknown key, a wrong type, an out-of-range value — raises ``ConfigError`` whose
message is one line naming the dotted key and what was expected. The CLI prints that line and
exits with status 2, without a traceback.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import math
import textwrap
import types
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any, Literal

import yaml

from rlpost import defaults, names
from rlpost.defaults import default_max_new_tokens  # noqa: F401 - re-exported (the report reads it)
from rlpost.config_rules import check_dist, consistency_problems
from rlpost.env_config import ENV_FAMILIES, check_env
from rlpost.task_section import ignored_task_keys
from rlpost.types.errors import ConfigProblems, writing
from rlpost.sections import (  # noqa: F401 - re-exported: config.TaskConfig etc.
    AlgoConfig,
    Config,
    ConfigError,
    DistConfig,
    ModelConfig,
    OffloadConfig,
    PrefConfig,
    RolloutConfig,
    RunConfig,
    TaskConfig,
    TrainerConfig,
    knob,
)

# ---------------------------------------------------------------------------------------------
# Cross-field rules (each defined exactly once)
# ---------------------------------------------------------------------------------------------


def check_consistency(cfg: Config) -> None:
    """Cross-field rules that hold for every algorithm: every rule broken at once (ConfigProblems, one
    line each), then the task's. What one algorithm cannot run is refused by ``build.check`` (its
    traits), when the roles are built or by the CLI right after loading."""
    problems = consistency_problems(cfg)
    try:
        check_dist(cfg)
    except ConfigError as e:
        problems.append(str(e))
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigProblems(problems)
    check_task(cfg)


FAMILIES = typing.get_args(typing.get_type_hints(TaskConfig)["name"])  # task.name's choices
DATA_FAMILIES = ("dataset", "math", "code", "env", "agent")  # the families that read task.data when it is set
# the families whose held-out rows may come from task.eval_data alone: `rlpost eval` of a whole file (no training)
EVAL_ONLY_FAMILIES = ("dataset", "math", "code")


def task_mix(task: TaskConfig) -> dict[str, float]:
    """task.mix as {family: weight}, in the order given ({} when empty). Each mistake is one
    ConfigError naming task.mix."""
    mix: dict[str, float] = {}
    for entry in filter(None, (e.strip() for e in task.mix.split(","))):
        family, sep, weight = (s.strip() for s in entry.partition(":"))
        if not sep or not family:
            raise ConfigError("task.mix: expected comma-separated 'family:weight' entries, e.g. "
                              f"'arithmetic:0.7,gym:0.3', got {entry!r}")
        if family not in FAMILIES:
            raise ConfigError(f"task.mix: unknown family {family!r}; expected some of "
                              f"{', '.join(f for f in FAMILIES if f not in ENV_FAMILIES)}")
        if family in ENV_FAMILIES:  # EnvRollout samples every prompt of a batch as an episode (build.make_rollout)
            raise ConfigError(f"task.mix: {family} runs multi-turn episodes with its own sampler and cannot share a "
                              f"batch with single-turn families; train it alone (task.name={family})")
        if family in mix:
            raise ConfigError(f"task.mix: {family} is named twice in {task.mix!r}")
        try:
            w = float(weight)
        except ValueError:
            raise ConfigError(f"task.mix: the weight of {family} must be a number, got {weight!r}") from None
        if not (math.isfinite(w) and w > 0):
            raise ConfigError(f"task.mix: the weight of {family} must be a positive number, got {weight!r}")
        mix[family] = w
    return mix


def task_families(task: TaskConfig) -> list[str]:
    """The families of a run: those of task.mix, else task.name alone."""
    return list(task_mix(task)) or [task.name]


def check_mix(task: TaskConfig, mix: dict[str, float]) -> None:
    """What a mix needs of task.data and task.verifier (build_task reads task.data for the one data family)."""
    readers = [f for f in mix if f in DATA_FAMILIES]
    if "dataset" in mix and not task.data:
        raise ConfigError("task.mix: dataset needs task.data (a .jsonl or .parquet file or a `datasets` folder)")
    if task.data and len(readers) > 1:
        raise ConfigError(f"task.mix: task.data would feed both {readers[0]} and {readers[1]}; mix at most one of "
                          f"{', '.join(DATA_FAMILIES)} with task.data")
    if (task.data or task.eval_data) and not readers:
        key = "task.data" if task.data else "task.eval_data"
        raise ConfigError(f"{key}: no family of task.mix={task.mix!r} reads it (only {', '.join(DATA_FAMILIES)} do); "
                          "it would be ignored")
    if task.verifier:
        raise ConfigError("task.verifier: with task.mix each row is scored by its own family's verifier (envs/mix.py); "
                          "expected it empty (task.reward_funcs can add a reward that reads row['task_family'])")


def check_task_data(task: TaskConfig, mix: dict[str, float]) -> None:
    """What task.data and task.eval_data must be for the run's families (a mix's: check_mix)."""
    if mix:
        check_mix(task, mix)
    elif task.name == "dataset" and not task.data and not task.eval_data:
        raise ConfigError(f"task.data: task.name={task.name} needs a data file (.jsonl, .parquet or a `datasets` "
                          "folder)")
    elif (task.data or task.eval_data) and task.name not in DATA_FAMILIES:
        key = "task.data" if task.data else "task.eval_data"
        raise ConfigError(f"{key}: task.name={task.name} generates its own problems and would ignore it; use "
                          "task.name=dataset (or math, code)")
    if task.eval_data and not task.data and (mix or task.name not in EVAL_ONLY_FAMILIES):
        what = f"task.mix={task.mix!r}" if mix else f"task.name={task.name}"
        raise ConfigError("task.eval_data: alone it is the held-out rows of task.name=dataset, math or code (what "
                          f"`rlpost eval` of a file reads); {what} needs task.data beside it")
    if task.prompt_format == "raw" and (not (task.data or task.eval_data) or task.system_prompt):
        raise ConfigError("task.prompt_format: raw feeds task.data's string prompts as they are: " + (
            "expected task.system_prompt empty (no chat template to put it in)" if task.data or task.eval_data
            else "it needs task.data"))


def check_task(cfg: Config) -> None:
    task = cfg.task
    mix = task_mix(task)
    families = list(mix) or [task.name]
    if ignored := ignored_task_keys(task, families, f"task.mix={task.mix!r}" if mix else f"task.name={task.name}"):
        raise ConfigError(ignored[0]) if len(ignored) == 1 else ConfigProblems(ignored)
    check_task_data(task, mix)
    try:
        gym_config = yaml.safe_load(task.gym_config) if task.gym_config else {}
    except yaml.YAMLError as e:
        raise ConfigError(f"task.gym_config: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(gym_config, dict):
        raise ConfigError(f"task.gym_config: expected a YAML mapping like '{{min_terms: 2}}', got {task.gym_config!r}")
    funcs = [f.strip() for f in task.reward_funcs.split(",") if f.strip()]
    names = [f.rpartition(":")[2] or f for f in funcs]  # what metrics and failure counts go by (rewards/stack.py)
    if dup := next((n for n in names if names.count(n) > 1), None):
        twins = [f for f, n in zip(funcs, names) if n == dup]
        raise ConfigError(f"task.reward_funcs: {' and '.join(twins)} share the name {dup!r}, under which each "
                          "function's reward, calls and failures are counted; rename one")
    if task.reward_weights and not funcs:
        raise ConfigError(f"task.reward_weights: weighs task.reward_funcs, which is empty; got {task.reward_weights!r}")
    if task.reward_weights and len(task.reward_weights.split(",")) != len(funcs):
        raise ConfigError(f"task.reward_weights: expected {len(funcs)} comma-separated numbers (one per "
                          f"task.reward_funcs), got {task.reward_weights!r}")
    try:
        [float(w) for w in task.reward_weights.split(",") if task.reward_weights]
    except ValueError:
        raise ConfigError("task.reward_weights: expected comma-separated numbers, got "
                          f"{task.reward_weights!r}") from None
    check_env(cfg, families)
    if set(filter(None, task.tools.split(","))) - {"calculator", "python"}:
        raise ConfigError(f"task.tools: expected a comma-separated subset of calculator, python, got {task.tools!r}")
    if "arithmetic" not in families:
        return
    if cfg.task.min_a > cfg.task.max_a:
        raise ConfigError(f"task.min_a: expected <= task.max_a ({cfg.task.max_a}), got {cfg.task.min_a}")
    if cfg.task.min_b > cfg.task.max_b:
        raise ConfigError(f"task.min_b: expected <= task.max_b ({cfg.task.max_b}), got {cfg.task.min_b}")
    if cfg.task.min_terms and not 2 <= cfg.task.min_terms <= cfg.task.n_terms:
        raise ConfigError(f"task.min_terms: expected 0 (off) or 2 to task.n_terms ({cfg.task.n_terms}), "
                          f"got {cfg.task.min_terms}")
    if not cfg.task.ops or set(cfg.task.ops) - set("+-*"):
        raise ConfigError(f"task.ops: expected a non-empty string of '+', '-', '*', got {cfg.task.ops!r}")
    if "{expr}" not in cfg.task.prompt and "{steps}" not in cfg.task.prompt:
        raise ConfigError("task.prompt: expected a template containing {expr} or {steps}")
    if "{steps}" in cfg.task.prompt and "*" in cfg.task.ops:
        raise ConfigError("task.prompt: {steps} lists the operations left to right, which '*' in task.ops (done "
                          "first) would make wrong; use {expr}, or task.ops without '*'")


# ---------------------------------------------------------------------------------------------
# Loading: YAML + overrides -> validated Config
# ---------------------------------------------------------------------------------------------


def load(recipe: str | Path | None = None, overrides: list[str] = ()) -> Config:
    """Defaults <- recipe YAML <- dotted overrides, validated. Raises ConfigError."""
    tree: dict = {}
    if recipe is not None:
        tree = read_yaml(recipe)
    for item in overrides:
        key, value = parse_override(item)
        set_dotted(tree, key, value)
    return from_dict(tree)


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error: a duplicated
    section would otherwise silently replace the first one."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None,
                                                        f"duplicate key {key!r} (the second would replace the first)",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def read_yaml(path: str | Path, what: str = "recipe") -> dict:
    """A YAML mapping from a file; `what` (a recipe, a suite) names it in the one-line errors. A recipe may also be
    one shipped in the package, by name (`ppo_arith`)."""
    if what == "recipe":
        path = names.recipe_path(path)
    elif not Path(path).exists():
        raise ConfigError(f"{what} {path}: file not found")
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{what} {path}: is a folder, expected a YAML file")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        line = path.read_bytes()[: e.start].count(b"\n") + 1
        raise ConfigError(f"{what} {path} line {line}: not UTF-8 text (byte "
                          f"{path.read_bytes()[e.start]:#04x})") from None
    except OSError as e:
        raise ConfigError(f"{what} {path}: cannot read it ({e.strerror})") from None
    try:
        tree = yaml.load(text, Loader=_StrictLoader) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{what} {path}{where}: not valid YAML ({getattr(e, 'problem', None) or e})") from None
    if not isinstance(tree, dict):
        kind = " of sections" if what == "recipe" else ""
        raise ConfigError(f"{what} {path}: expected a mapping{kind} at the top level")
    return tree


class CliValue(str):
    """An override's raw text; parsed once the target field's type is known ('-' stays a string)."""


def parse_override(item: str) -> tuple[str, Any]:
    if "=" not in item:
        raise ConfigError(f"override {item!r}: expected key=value, e.g. rollout.group_size=4")
    key, raw = item.split("=", 1)
    if not all(part.strip() for part in key.split(".")):  # '=5', '.lr=1': the argument itself is named
        raise ConfigError(f"override {item!r}: {'no key' if not key.strip() else 'an empty name'} before '='; expected "
                          "section.key=value")
    return key.strip(), CliValue(raw)


def set_dotted(tree: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    if len(parts) != 2:
        raise ConfigError(f"{key}: expected section.field, e.g. trainer.lr{names.hint(key, value)}")
    section = tree.setdefault(parts[0], {})
    if not isinstance(section, dict):
        raise ConfigError(f"{parts[0]}: expected a mapping of fields")
    section[parts[1]] = value


def from_dict(tree: dict) -> Config:
    unknown = set(tree) - {f.name for f in fields(Config)}
    if unknown:
        section = sorted(unknown)[0]
        key, value = names.first_leaf(tree[section], section)
        hint = names.hint(key, value)  # another framework's key: the rlpost one, and no list of sections after it
        ours = ", ".join(f.name for f in fields(Config))
        raise ConfigError(f"{key}: unknown section {section}{hint}" if hint else
                          f"{key}: unknown section {section} (rlpost's are {ours})")
    sections = {}
    for f in fields(Config):
        sections[f.name] = _build_section(section_class(f.name), tree.get(f.name) or {}, f.name)
    cfg = defaults.fill(Config(**sections))  # what follows the task, file paths made absolute
    check_consistency(cfg)
    return cfg


def section_class(name: str) -> type:
    return {f.name: f.default_factory for f in fields(Config)}[name]


def _build_section(cls: type, values: dict, section: str):
    if not isinstance(values, dict):
        raise ConfigError(f"{section}: expected a mapping of fields, got {type(values).__name__}")
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in fields(cls)}
    for key in values:
        if key not in known:
            leaf, value = names.first_leaf(values[key], f"{section}.{key}")
            raise ConfigError(f"{leaf}: unknown key{names.hint(leaf, value)} (expected one of {', '.join(known)})")
    kwargs = {k: _coerce(f"{section}.{k}", v, hints[k], known[k].metadata) for k, v in values.items()}
    return cls(**kwargs)


def _coerce(key: str, value: Any, typ: Any, meta: dict) -> Any:
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):  # `float | None`: 'none' (or YAML null) turns the knob off
        if value is None or (isinstance(value, str) and value.lower() == "none"):
            return None
        inner = next(a for a in typing.get_args(typ) if a is not type(None))
        try:
            return _coerce(key, value, inner, meta)
        except ConfigError as e:
            raise ConfigError(f"{e} (or none)") from None
    if isinstance(value, CliValue):
        value = str(value) if typ is str or origin is Literal else _yaml_scalar(value)
    if origin is Literal:
        choices = typing.get_args(typ)
        if value not in choices:
            raise ConfigError(f"{key}: expected one of {', '.join(map(str, choices))}, got {value!r}")
        return value
    if typ is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if typ is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer{_range_text(meta)}, got {value!r}")
    elif typ is float:
        try:  # YAML 1.1 reads '1e-5' as a string; accept any number spelling
            value = float(value) if not isinstance(value, bool) else None
        except (TypeError, ValueError):
            value = None
        if value is None or not math.isfinite(value):
            raise ConfigError(f"{key}: expected a finite number{_range_text(meta)}")
    elif typ is str:
        if not isinstance(value, str):
            value = str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        if value is None:
            raise ConfigError(f"{key}: expected a string")
        return value
    _check_range(key, value, meta)
    return value


def _yaml_scalar(raw: str) -> Any:
    try:
        return yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError:
        return raw  # keep odd text as text; the type check then names the key


def _range_text(meta: dict) -> str:
    parts = [f"{op} {meta[k]}" for k, op in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))
             if meta.get(k) is not None]
    return (" " + " and ".join(parts)) if parts else ""


def _check_range(key: str, value, meta: dict) -> None:
    ok = ((meta.get("ge") is None or value >= meta["ge"]) and (meta.get("gt") is None or value > meta["gt"])
          and (meta.get("le") is None or value <= meta["le"]) and (meta.get("lt") is None or value < meta["lt"]))
    if not ok:
        kind = "an integer" if isinstance(value, int) else "a number"
        raise ConfigError(f"{key}: expected {kind}{_range_text(meta)}, got {value!r}")


# --- saving, help text ------------------------------------------------------------------------


def to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def save(cfg: Config, path: str | Path) -> None:
    text = yaml.safe_dump(to_dict(cfg), sort_keys=False)
    with writing(path):  # a full disk: one line naming the file
        Path(path).write_text(text)


def with_overrides(cfg: Config, overrides: list[str]) -> Config:
    """Apply dotted overrides on top of an existing config (used by --resume)."""
    tree = to_dict(cfg)
    for item in overrides:
        key, value = parse_override(item)
        set_dotted(tree, key, value)
    return from_dict(tree)


# --- resuming a run: what may change, and the config history ---------------------------------

# What a resumed run may change. Everything else is refused with the key named: the checkpoint's
# weights, optimizer state and prompt stream were made under the old values (algo.name,
# model.lora_r, rollout.group_size, ...), so a change would silently continue a different run.
# An lr change is applied to the restored optimizer (Trainer.load_state_dict); a run.steps change
# stretches or shortens a decaying lr schedule from the step the run resumes at.
RESUMABLE = {
    "run": ("steps", "eval_every", "early_stop_patience", "eval_n", "eval_batch_size", "checkpoint_every",
            "keep_checkpoints", "threads", "device", "progress", "loggers", "stop_grace_s"),
    "trainer": ("lr", "max_grad_norm", "micro_batch_size", "max_nonfinite_steps"),
    "algo": ("critic_lr",),
    "task": ("verifier_timeout_s", "verifier_workers", "verifier_memory_mb", "max_reward_error_frac", "sandboxes",
             "sandbox_allow_root"),
    "dist": ("rollout_threads", "trainer_threads", "ray_address", "trainer_placement", "rendezvous_timeout_s"),
    "offload": ("reference", "critic", "reward_model"),  # where weights wait between uses, not what they are
}


def resume_changes(old: Config, new: Config, unread: tuple[str, ...] = ()) -> list[str]:
    """'key: old -> new' for each value a resume changes; one ConfigError naming every key that may not (the
    first with its values). ``unread``: key prefixes the resuming command does not read, left out of the
    list of what a resume may change (`rlpost sft --resume` refuses run.steps)."""
    a, b = to_dict(old), to_dict(new)
    changed, refused = [], []
    for section in a:
        for key in a[section]:
            if a[section][key] == b[section][key]:
                continue
            (changed if key in RESUMABLE.get(section, ()) else refused).append(
                (f"{section}.{key}", a[section][key], b[section][key]))
    if refused:
        (name, was, asked), others = refused[0], [r[0] for r in refused[1:]]
        allowed = ", ".join(f"{s}.{k}" for s, ks in RESUMABLE.items() for k in ks
                            if not f"{s}.{k}".startswith(unread))
        also = f" (and {', '.join(others)} cannot either)" if others else ""
        raise ConfigError(f"{name}: cannot change on --resume (the run has {was!r}, asked {asked!r}){also}; start a "
                          f"new run for that. A resume may change: {allowed}")
    return [f"{name}: {was!r} -> {asked!r}" for name, was, asked in changed]


def run_config_path(run_dir: str | Path) -> Path:
    """The config a run folder runs under now: config.yaml, or its newest config.resume-N.yaml
    (each resume that changed something wrote one; config.yaml itself is never rewritten)."""
    run_dir = Path(run_dir)
    resumes = sorted((p for p in run_dir.glob("config.resume-*.yaml") if p.stem.rpartition("-")[2].isdigit()),
                     key=lambda p: int(p.stem.rpartition("-")[2]))
    return resumes[-1] if resumes else run_dir / "config.yaml"


def next_resume_config_path(run_dir: str | Path) -> Path:
    latest = run_config_path(run_dir)
    n = int(latest.stem.rpartition("-")[2]) + 1 if latest.stem.startswith("config.resume-") else 1
    return Path(run_dir) / f"config.resume-{n}.yaml"


def field_docs(cls: type) -> dict[str, str]:
    """The string literal under each field of a dataclass: its help text."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[node.target.id] = " ".join(str(nxt.value.value).split())  # a docstring wrapped over lines reads as one
    return docs


def type_name(typ) -> str:
    """'int', 'a|b' for a Literal, 'float|none' for an optional number."""
    args = typing.get_args(typ)
    if typing.get_origin(typ) is Literal:
        return "|".join(map(str, args))
    if args:
        return "|".join("none" if a is type(None) else a.__name__ for a in args)
    return typ.__name__


def help_text() -> str:
    """Every option, its default and its meaning, grouped by section (for --help)."""
    lines = []
    for sec in fields(Config):
        cls = section_class(sec.name)
        docs = field_docs(cls)
        hints = typing.get_type_hints(cls)
        lines.append(f"{sec.name}:")
        for f in fields(cls):
            typ = hints[f.name]
            tname = type_name(typ)
            lines.append(f"  {sec.name}.{f.name}={f.default!r}  ({tname}{_range_text(f.metadata)})")
            lines.append(f"      {docs.get(f.name, '')}")
    return "\n".join(lines)
