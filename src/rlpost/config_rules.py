"""The cross-field rules of the sizes, filters, shaping, schedule and topology (config.check_consistency
runs them, every broken one said at once, before the task's rules, which stay in config.py as they read
the task's files)."""

from __future__ import annotations

from rlpost.sections import Config
from rlpost.types.errors import ConfigError


def consistency_problems(cfg: Config) -> list[str]:
    """A line for each cross-field rule of the sizes, filters, shaping and schedule the config breaks."""
    sizes, rollout, algo = cfg.derived, cfg.rollout, cfg.algo
    rules = [
        (sizes.batch_size % sizes.mini_batch_size,
         f"trainer.mini_batch_size: expected a divisor of the rollout batch ({sizes.batch_size}), got "
         f"{sizes.mini_batch_size}"),
        (rollout.filter_min_pass_rate > rollout.filter_max_pass_rate,
         f"rollout.filter_min_pass_rate: expected <= rollout.filter_max_pass_rate ({rollout.filter_max_pass_rate}), "
         f"got {rollout.filter_min_pass_rate}"),
        (algo.overlong_buffer > rollout.max_new_tokens,
         f"algo.overlong_buffer: expected <= rollout.max_new_tokens ({rollout.max_new_tokens}), got "
         f"{algo.overlong_buffer}"),
        (rollout.curriculum_window > 0 and cfg.dist.topology == "async",
         "rollout.curriculum_window: async workers draw prompts steps ahead of their scores; expected 0 with "
         "dist.topology=async"),
        (cfg.run.early_stop_patience > 0 and cfg.run.eval_every == 0,
         "run.early_stop_patience: needs held-out evaluations during the run; expected run.eval_every > 0"),
        (cfg.pref.prompt_format == "raw" and not cfg.pref.data,
         "pref.prompt_format: raw feeds pref.data's string prompts as they are; expected pref.data (rows built from "
         "the task are chat messages)"),
        (cfg.pref.nll_coef > 0 and cfg.pref.loss == "orpo",
         "pref.nll_coef: ORPO already has its NLL term on the chosen completion; expected 0 with pref.loss=orpo"),
        (algo.kl_target > 0 and algo.kl_coef == 0,
         "algo.kl_target: adaptive KL starts from kl_coef, so expected algo.kl_coef > 0"),
        (algo.icepop_c is not None and algo.tis_cap > 0,
         f"algo.icepop_c: ICEPOP weights by pi_old / pi_sampler inside [1/c, c] in TIS's place; expected "
         f"algo.tis_cap=0 with it, got {algo.tis_cap}"),
        (algo.kl_importance_ratio and algo.kl_coef == 0,
         "algo.kl_importance_ratio: corrects the KL term in the loss, which algo.kl_coef=0 turns off; expected "
         "algo.kl_coef > 0"),
        (algo.kl_importance_ratio and algo.kl_estimator == "k2",
         "algo.kl_importance_ratio: the ratio makes k3's and k1's gradient unbiased, not k2's; expected "
         "algo.kl_estimator=auto, k3 or k1"),
        (rollout.slots > 0 and rollout.engine in ("hf", "vllm"),
         f"rollout.slots: decode slots are the own engine's (rollout.engine=fast or auto); rollout.engine="
         f"{rollout.engine} batches on its own, so expected 0, got {rollout.slots}"),
    ]
    return [message for broken, message in rules if broken]


def check_dist(cfg: Config) -> None:
    dist = cfg.dist
    if dist.topology == "colocated" and (dist.rollout_workers > 1 or dist.trainer_ranks > 1):
        raise ConfigError("dist.topology: rollout_workers/trainer_ranks > 1 need dist.topology=disaggregated or "
                          f"async, got {dist.topology}")
    if dist.trainer_ranks > 1 and cfg.model.lora_r > 0:
        raise ConfigError("dist.trainer_ranks: the FSDP2 trainer shards the policy alone; expected 1 with LoRA")
    if dist.trainer_ranks > 1 and cfg.trainer.param_dtype != "float32":
        raise ConfigError("trainer.param_dtype=bfloat16 keeps its float32 master copy beside one unsharded model; "
                          "expected float32 with dist.trainer_ranks > 1 (FSDP2 shards float32 weights, bf16 compute by "
                          "trainer.precision)")
    if dist.trainer_ranks > 1 and cfg.trainer.micro_batch_tokens:
        raise ConfigError("trainer.micro_batch_tokens: each FSDP rank must run as many micro-batches as the others; "
                          "expected 0 (micro-batches by rows) with dist.trainer_ranks > 1")
    if dist.max_staleness > 1 and dist.topology != "async":  # 0 and 1 are what a synchronous loop is anyway
        raise ConfigError("dist.max_staleness: samples lag the policy only where workers sample ahead; expected "
                          f"dist.topology=async, got {dist.topology}")
    if dist.topology == "colocated":  # one process: no Ray actors for these to shape
        default = type(dist)()
        for key in ("chunk_prompts", "rollout_threads", "trainer_threads", "ray_address", "trainer_placement"):
            if getattr(dist, key) != getattr(default, key):
                raise ConfigError(f"dist.{key}: shapes the Ray actors of dist.topology=disaggregated or async; a "
                                  f"colocated run has none and would ignore it (got {getattr(dist, key)!r})")
    if dist.partial_rollouts and dist.topology != "async":
        raise ConfigError("dist.partial_rollouts: weights change mid-chunk only where workers sample ahead; expected "
                          f"dist.topology=async, got {dist.topology}")
    if dist.partial_rollouts and dist.weight_sync == "broadcast":
        raise ConfigError("dist.partial_rollouts: a broadcast is a collective every worker joins between chunks; "
                          "expected dist.weight_sync=object_store with it")
    if dist.partial_rollouts and cfg.rollout.engine in ("hf", "vllm"):
        raise ConfigError("dist.partial_rollouts: new weights are taken in the own engine's decode loop; expected "
                          f"rollout.engine=fast or auto, got {cfg.rollout.engine}")
    if dist.weight_sync == "broadcast" and dist.topology == "colocated":
        raise ConfigError("dist.weight_sync=broadcast moves weights from the trainer's actor to the rollout workers' "
                          "actors: it needs dist.topology=disaggregated or async (colocated syncs in process)")
