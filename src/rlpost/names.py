"""Names: other frameworks' names for rlpost's keys (TRL, verl and OpenRLHF, each with its rlpost
counterpart and, where the meaning differs, how), and the recipes shipped in the package by name.

The same table is docs/coming-from.md (a test holds the two equal) and the "did you mean" of the
config errors: ``learning_rate=1e-5``, ``data.train_files=...`` or ``trainer.total_training_steps``
are refused, as every unknown key is, with the rlpost key to use instead (and the value, where
the two frameworks spell it differently). A typo of an rlpost key gets the closest key.

Recipes ship inside the package (``shipped_recipes/``, a link to the repository's ``recipes/`` that
the wheel copies): ``rlpost train ppo_arith`` finds one by name from any folder, and so does
``recipes/ppo_arith.yaml`` when the current folder has no such file.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from rlpost.sections import Config, ConfigError

SHIPPED = Path(__file__).resolve().parent / "shipped_recipes"  # the repository's recipes/, or the wheel's copy


@dataclass(frozen=True)
class Name:
    theirs: str  # the other framework's name: a TrainingArguments field, a dotted Hydra key, a CLI flag without --
    ours: str  # the rlpost key (or key=value); "" = no counterpart (note says why)
    note: str = ""  # how the meaning differs, when it does
    values: dict[str, str] = field(default_factory=dict)  # their value -> our key=value
    same_value: bool = True  # their value means the same here (False: counted in other units, a flag for a number)
    template: str = ""  # where their value goes in ours ("{}:compute_score"): one of two keys that are one here


SAME_BATCH = "both count prompts"
FOREIGN: dict[str, tuple[Name, ...]] = {
    "TRL": (
        Name("learning_rate", "trainer.lr", "TRL's GRPO default is 1e-6, rlpost's 1e-5 (the demo's)"),
        Name("num_generations", "rollout.group_size"),
        Name("max_completion_length", "rollout.max_new_tokens", "256 by default in both for rows of your own"),
        Name("per_device_train_batch_size", "rollout.prompts_per_step", "TRL counts completions (x devices x "
             "gradient_accumulation_steps, num_generations per prompt); rlpost counts prompts: divide by "
             "num_generations", same_value=False),
        Name("gradient_accumulation_steps", "trainer.micro_batch_size", "rlpost sets the sequences per "
             "forward/backward and accumulates up to trainer.mini_batch_size; the gradient is the same",
             same_value=False),
        Name("num_iterations", "trainer.epochs"),
        Name("beta", "algo.kl_coef", "0 by default in both"),
        Name("epsilon", "algo.clip_eps_low"),
        Name("epsilon_high", "algo.clip_eps_high"),
        Name("temperature", "rollout.temperature", "TRL's default is 1.0, rlpost's 0.7"),
        Name("top_p", "rollout.top_p"),
        Name("loss_type", "algo.loss_agg", "or the whole method: algo.name=dr_grpo, algo.name=dapo",
             {"grpo": "algo.loss_agg=seq_mean_token_mean", "bnpo": "algo.loss_agg=token_mean",
              "dapo": "algo.loss_agg=token_mean", "dr_grpo": "algo.loss_agg=const_norm"}),
        Name("scale_rewards", "algo.scale_by_std", "",
             {"group": "algo.scale_by_std=true", "true": "algo.scale_by_std=true", "batch": "algo.std_scope=batch",
              "none": "algo.scale_by_std=false", "false": "algo.scale_by_std=false"}),
        Name("mask_truncated_completions", "algo.overlong_filter"),
        Name("importance_sampling_level", "algo.name", "", {"sequence": "algo.name=gspo"}),
        Name("reward_weights", "task.reward_weights"),
        Name("max_steps", "run.steps"),
        Name("num_train_epochs", "run.steps", "rlpost counts steps: epochs = run.steps x rollout.prompts_per_step / "
             "training rows (the run's first lines say it)", same_value=False),
        Name("seed", "run.seed"),
        Name("output_dir", "run.out_dir", "the run folder is run.out_dir/run.name"),
        Name("save_steps", "run.checkpoint_every"),
        Name("save_total_limit", "run.keep_checkpoints"),
        Name("eval_steps", "run.eval_every"),
        Name("warmup_steps", "trainer.warmup_steps"),
        Name("lr_scheduler_type", "trainer.schedule", "TRL's default is linear, rlpost's constant"),
        Name("max_grad_norm", "trainer.max_grad_norm"),
        Name("weight_decay", "trainer.weight_decay"),
        Name("report_to", "run.loggers"),
        Name("use_vllm", "rollout.engine=vllm"),
        Name("gradient_checkpointing", "model.gradient_checkpointing"),
        Name("bf16", "trainer.precision=bf16", "auto picks bf16 where it is faster"),
    ),
    "verl": (
        Name("data.train_files", "task.data", "one file or `datasets` folder; several families: task.mix"),
        Name("data.val_files", "task.eval_data"),
        Name("data.train_batch_size", "rollout.prompts_per_step", SAME_BATCH),
        Name("data.max_response_length", "rollout.max_new_tokens"),
        Name("data.max_prompt_length", "", "rlpost never cuts a prompt"),
        Name("data.prompt_key", "task.prompt_column"),
        Name("algorithm.adv_estimator", "algo.name", "", {"gae": "algo.name=ppo", "grpo": "algo.name=grpo",
             "rloo": "algo.name=rloo", "reinforce_plus_plus": "algo.name=reinforce_pp"}),
        Name("algorithm.norm_adv_by_std_in_grpo", "algo.scale_by_std"),
        Name("algorithm.gamma", "algo.gamma"),
        Name("algorithm.lam", "algo.lam"),
        Name("algorithm.use_kl_in_reward", "algo.kl_coef", "where the KL acts follows algo.name: in the reward for ppo "
             "and reinforce_pp, in the loss for the group methods", same_value=False),
        Name("algorithm.kl_ctrl.kl_coef", "algo.kl_coef"),
        Name("algorithm.kl_ctrl.target_kl", "algo.kl_target"),
        Name("actor_rollout_ref.model.path", "model.name"),
        Name("actor_rollout_ref.model.lora_rank", "model.lora_r"),
        Name("actor_rollout_ref.model.enable_gradient_checkpointing", "model.gradient_checkpointing"),
        Name("actor_rollout_ref.actor.optim.lr", "trainer.lr"),
        Name("actor_rollout_ref.actor.ppo_mini_batch_size", "trainer.mini_batch_size", "verl counts prompts (each "
             "with rollout.n sequences), rlpost sequences: multiply by rollout.group_size", same_value=False),
        Name("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", "trainer.micro_batch_size"),
        Name("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "trainer.micro_batch_tokens", "with "
             "use_dynamic_bsz=True; verl counts the real tokens a micro-batch packs, rlpost its rows x the longest "
             "row's prompt + completion"),
        Name("actor_rollout_ref.actor.ppo_epochs", "trainer.epochs"),
        Name("actor_rollout_ref.actor.clip_ratio", "algo.clip_eps_low", "verl's sets both sides: also "
             "algo.clip_eps_high"),
        Name("actor_rollout_ref.actor.clip_ratio_high", "algo.clip_eps_high"),
        Name("actor_rollout_ref.actor.clip_ratio_c", "algo.dual_clip_c", "off by default in rlpost (verl: 3)"),
        Name("actor_rollout_ref.actor.use_kl_loss", "algo.kl_coef", "the KL term is on when algo.kl_coef > 0",
             same_value=False),
        Name("actor_rollout_ref.actor.kl_loss_coef", "algo.kl_coef"),
        Name("actor_rollout_ref.actor.kl_loss_type", "algo.kl_estimator", "",
             {"kl": "algo.kl_estimator=k1", "k1": "algo.kl_estimator=k1", "mse": "algo.kl_estimator=k2",
              "k2": "algo.kl_estimator=k2", "low_var_kl": "algo.kl_estimator=k3", "k3": "algo.kl_estimator=k3"}),
        Name("actor_rollout_ref.actor.entropy_coeff", "algo.entropy_coef"),
        Name("actor_rollout_ref.actor.loss_agg_mode", "algo.loss_agg", "",
             {"token-mean": "algo.loss_agg=token_mean", "seq-mean-token-mean": "algo.loss_agg=seq_mean_token_mean",
              "seq-mean-token-sum": "algo.loss_agg=seq_mean_token_sum",
              "seq-mean-token-sum-norm": "algo.loss_agg=const_norm"}),
        Name("actor_rollout_ref.actor.grad_clip", "trainer.max_grad_norm"),
        Name("actor_rollout_ref.rollout.n", "rollout.group_size"),
        Name("actor_rollout_ref.rollout.temperature", "rollout.temperature"),
        Name("actor_rollout_ref.rollout.top_p", "rollout.top_p"),
        Name("actor_rollout_ref.rollout.name", "rollout.engine", "",
             {"vllm": "rollout.engine=vllm", "hf": "rollout.engine=hf"}),
        Name("actor_rollout_ref.rollout.gpu_memory_utilization", "rollout.vllm_gpu_memory_utilization"),
        Name("actor_rollout_ref.ref.fsdp_config.param_offload", "offload.reference"),
        Name("critic.optim.lr", "algo.critic_lr"),
        Name("custom_reward_function.path", "task.verifier",
             "with .name, one setting here: the file, a colon, the function",
             template="{}:compute_score"),
        Name("custom_reward_function.name", "task.verifier",
             "with .path, one setting here: the file, a colon, the function",
             template="my_reward.py:{}"),
        Name("reward_model.model.path", "task.reward_model"),
        Name("trainer.total_training_steps", "run.steps"),
        Name("trainer.total_epochs", "run.steps", "rlpost counts steps: epochs = run.steps x rollout.prompts_per_step "
             "/ rows", same_value=False),
        Name("trainer.save_freq", "run.checkpoint_every"),
        Name("trainer.test_freq", "run.eval_every"),
        Name("trainer.experiment_name", "run.name"),
        Name("trainer.default_local_dir", "run.out_dir"),
        Name("trainer.logger", "run.loggers"),
        Name("trainer.val_before_train", "", "held-out accuracy before training is always measured"),
    ),
    "OpenRLHF": (
        Name("pretrain", "model.name"),
        Name("reward_pretrain", "task.reward_model"),
        Name("remote_rm_url", "task.verifier", "a Python function run in a worker process, not an HTTP server",
             same_value=False),
        Name("prompt_data", "task.data"),
        Name("input_key", "task.prompt_column"),
        Name("label_key", "task.answer_column"),
        Name("apply_chat_template", "task.prompt_format=chat", "without it OpenRLHF feeds the prompt as it is: "
             "task.prompt_format=raw"),
        Name("n_samples_per_prompt", "rollout.group_size"),
        Name("rollout_batch_size", "rollout.prompts_per_step", SAME_BATCH),
        Name("train_batch_size", "trainer.mini_batch_size", "both count sequences"),
        Name("micro_train_batch_size", "trainer.micro_batch_size"),
        Name("generate_max_len", "rollout.max_new_tokens"),
        Name("actor_learning_rate", "trainer.lr"),
        Name("critic_learning_rate", "algo.critic_lr"),
        Name("init_kl_coef", "algo.kl_coef"),
        Name("kl_target", "algo.kl_target"),
        Name("kl_estimator", "algo.kl_estimator"),
        Name("advantage_estimator", "algo.name", "", {"gae": "algo.name=ppo", "reinforce": "algo.name=reinforce",
             "rloo": "algo.name=rloo", "group_norm": "algo.name=grpo", "dr_grpo": "algo.name=dr_grpo"}),
        Name("max_epochs", "trainer.epochs"),
        Name("num_episodes", "run.steps", "rlpost counts steps (one rollout batch each), not passes over the prompts",
             same_value=False),
        Name("eps_clip", "algo.clip_eps_low", "OpenRLHF's sets both sides: also algo.clip_eps_high"),
        Name("entropy_loss_coef", "algo.entropy_coef"),
        Name("max_norm", "trainer.max_grad_norm"),
        Name("l2", "trainer.weight_decay"),
        Name("lora_rank", "model.lora_r"),
        Name("lora_alpha", "model.lora_alpha"),
        Name("save_steps", "run.checkpoint_every"),
        Name("eval_steps", "run.eval_every"),
        Name("save_path", "run.out_dir"),
        Name("use_wandb", "run.loggers=wandb"),
        Name("vllm_num_engines", "dist.rollout_workers"),
        Name("async_train", "dist.topology=async"),
        Name("dynamic_filtering", "rollout.filter_groups"),
    ),
}


# TRL's DPOConfig, SFTConfig and RewardConfig names, where they mean another key under `rlpost sft`, `rsft`, `dpo`
# and `rm` than FOREIGN's TRL table (its GRPOConfig's) gives: those commands look here first (``pref_hint``)
PREFERENCE_TRAINERS = "TRL's DPOTrainer, SFTTrainer and RewardTrainer"
PREFERENCE: tuple[Name, ...] = (
    Name("beta", "pref.beta", "DPO's temperature; ORPOConfig's beta is ORPO's weight, pref.orpo_lambda"),
    Name("loss_type", "pref.loss", "", {"sigmoid": "pref.loss=dpo", "ipo": "pref.loss=ipo",
                                        "kto_pair": "pref.loss=kto"}),
    Name("label_smoothing", "pref.label_smoothing"),
    Name("rpo_alpha", "pref.nll_coef"),
    Name("simpo_gamma", "pref.simpo_gamma"),
    Name("max_length", "pref.max_len", "rlpost's counts the completion alone; a prompt is never cut"),
    Name("max_seq_length", "pref.max_len", "rlpost's counts the completion alone; a prompt is never cut"),
    Name("max_completion_length", "pref.max_len"),
    Name("max_prompt_length", "", "rlpost never cuts a prompt"),
    Name("per_device_train_batch_size", "pref.batch_size", "TRL counts the rows of one device's forward (x devices x "
         "gradient_accumulation_steps a step); rlpost counts the rows (pairs for dpo and rm) of one optimizer step",
         same_value=False),
    Name("gradient_accumulation_steps", "trainer.micro_batch_size", "rlpost sets the sequences per forward/backward "
         "(a pair is two) and accumulates up to pref.batch_size; the gradient is the same", same_value=False),
    Name("num_train_epochs", "pref.epochs"),
    Name("max_steps", "", "pref.epochs sets the length"),
    Name("learning_rate", "trainer.lr", "TRL's DPO default is 1e-6 and SFT's 2e-5, rlpost's 1e-5"),
    Name("completion_only_loss", "", "rlpost's SFT loss is on the completion alone, always"),
    Name("packing", "", "rows are padded per batch, grouped by length with pref.group_by_length"),
    Name("dataset_text_field", "", "rlpost sft takes prompt + completion, or messages, rows"),
)


def pref_hint(key: str, value: object = None) -> str:
    """hint's line for ``key`` under `rlpost sft`, `rsft`, `dpo` or `rm`: PREFERENCE's name first, else ``hint``'s."""
    name = next((n for n in PREFERENCE if n.theirs == key.lstrip("-").replace("-", "_")), None)
    if name is None:
        return hint(key, value)
    return suggestion(name, f"TRL's {name.theirs} (its DPO, SFT and reward trainers)", value)


def find(key: str) -> tuple[str, Name] | None:
    """(framework, entry) for another framework's name: the whole dotted key first, then (a flat
    name, or the field of an rlpost section: `trainer.learning_rate`) its last part."""
    key = key.lstrip("-").replace("-", "_") if "." not in key else key
    for wanted in (key, key.rpartition(".")[2]):
        for framework, table in FOREIGN.items():
            for name in table:
                if name.theirs == wanted and (wanted == key or "." not in name.theirs):
                    return framework, name
    return None


def rlpost_keys() -> list[str]:
    return [f"{s.name}.{f.name}" for s in fields(Config) for f in fields(s.default_factory)]


def hint(key: str, value: object = None) -> str:
    """'; did you mean X? (...)' for an unknown key, or '' when nothing is close."""
    found = find(key)
    if found is not None:
        framework, name = found
        return suggestion(name, f"{framework}'s {name.theirs}", value)
    close = difflib.get_close_matches(key, rlpost_keys(), n=1, cutoff=0.75)
    return f"; did you mean {close[0]}?" if close else ""


def suggestion(name: Name, theirs: str, value: object = None) -> str:
    """'; did you mean X? (THEIRS: note; ...)' for another framework's ``name`` (``theirs``: how the line calls
    it), with the value where it means the same here; '; THEIRS has no rlpost counterpart ...' where none."""
    if not name.ours:
        return f"; {theirs} has no rlpost counterpart ({name.note}): drop it"
    ours = name.values.get(str(value).lower(), name.ours) if value is not None else name.ours
    if value is not None and "=" not in ours and str(value) and name.same_value:
        ours = f"{ours}={name.template.format(value) if name.template else value}"
    note = f": {name.note}" if name.note else ""
    return f"; did you mean {ours}? ({theirs}{note}; docs/coming-from.md)"


def first_leaf(value: Any, key: str) -> tuple[str, Any]:
    """(dotted key, value) of the first leaf under ``key``: a recipe written in another framework's
    nested layout (verl's ``actor_rollout_ref: {rollout: {n: 8}}``) is named by its whole key."""
    while isinstance(value, dict) and value:
        sub, value = next(iter(value.items()))
        key = f"{key}.{sub}"
    return key, (None if isinstance(value, dict) else value)


def shipped_recipes() -> list[str]:
    return sorted(p.stem for p in SHIPPED.glob("*.yaml"))


def recipe_path(path: str | Path) -> Path:
    """The recipe file: ``path`` when it exists, else the shipped recipe it names (``ppo_arith``,
    ``ppo_arith.yaml`` or ``recipes/ppo_arith.yaml``); ConfigError listing the shipped ones otherwise."""
    path = Path(path)
    if path.exists():
        return path
    shipped = SHIPPED / (path.name if path.suffix in (".yaml", ".yml") else f"{path.name}.yaml")
    if path.parent.name in ("", "recipes") and shipped.is_file():
        return shipped
    raise ConfigError(f"recipe: file not found: {path} (shipped recipes, by name: {', '.join(shipped_recipes())})")
