"""The one place where roles are assembled from a config.

``build_roles`` loads the policy once and gives each role what it needs: the sampler and the
reference are copies of it, the trainer keeps the float32 master weights. Under
``dist.topology=disaggregated|async`` the sampler and the trainer are Ray actors instead
(``distributed/``), built by the same ``make_rollout`` / ``make_trainer`` inside the actors; the
``Roles`` returned have the same verbs, so the loop does not change.

Which role exists follows from the algorithm's traits (a critic for ``needs_values``, a
reference when something reads reference log-probs), never from its name.

Precision is resolved here, once: ``rollout.dtype=auto`` and ``trainer.precision=auto`` become
what the start-up probe chose (model/precision.py), the run says so in one line, and every role
built below (sampler, trainer and its critic, reference, reward model, judge) follows it.

So is the device, first: ``run.device=auto`` becomes cuda when CUDA is available, else cpu
(model/device.py), and each ``make_*`` below puts its role's model there; the roles read their
device from their model and move each batch in (docs/gpu.md). On CUDA the precision probe asks
the GPU whether it has bf16 instead of timing the CPU.
"""

from __future__ import annotations

import copy
import os
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch

from rlpost import algorithms, config, machine
from rlpost.console import say, say_once
from rlpost.envs import Task, env_pool, on_endpoint, verifier_timeout
from rlpost.model import checkpoint, compiled, device, fit, lora, packed, precision
from rlpost.model.load import load_policy, load_policy_for, load_tokenizer, resolve
from rlpost.model.logprobs import Scoring
from rlpost.rewards.episodes import EpisodeReward
from rlpost.rewards.judge import Judge
from rlpost.rewards.prm import ProcessRewardModel, StepRewards
from rlpost.rewards.reward_model import load_reward_model
from rlpost.rewards.runner import VerifierRunner, default_workers
from rlpost.rewards.stack import RewardStack, part_name
from rlpost.roles.critic import Critic
from rlpost.roles.reference import Placement, Reference
from rlpost.roles import rollout_vllm
from rlpost.roles.engine import auto_picks_vllm, build_rollout
from rlpost.roles.forward_plan import ForwardPlan, Sizes
from rlpost.roles.rollout_agent import agent_rollout
from rlpost.roles.rollout_env import EnvRollout
from rlpost.roles.row_plan import LocalPlan, ShardedPlan
from rlpost.roles.trainer import Trainer
from rlpost.sections import TrainerConfig
from rlpost.types.errors import ConfigError
from rlpost.types.roles import Roles, Verifier


def check(cfg: config.Config) -> config.Config:
    """Everything ``config.load`` cannot check alone: what the chosen algorithm can run, what this
    machine accepts (machine.py). Returns cfg, so ``build.check(config.load(...))`` reads as one step."""
    machine.check(cfg)
    check_algorithm(cfg)
    device.resolve(cfg.run.device)  # run.device=cuda without CUDA: one line, before any model loads
    if cfg.rollout.engine == "vllm":  # not installed, or top-p (no threshold from vLLM): one line
        rollout_vllm.check(cfg.rollout.top_p)
    return cfg


NOTHING_TO_TRAIN = ("task.data: task.eval_data alone is held-out rows to evaluate (rlpost eval), with nothing to train "
                    "on; name the training rows in task.data")


def preflight(cfg: config.Config, task: Task | None = None) -> None:
    """What the model can take, before any run folder exists: LoRA targets that name its modules,
    and every prompt of ``task`` (with rollout.max_new_tokens after it) within its context
    (model/fit.py). Cheap: the model's config and tokenizer, no weights."""
    check(cfg)
    if task is not None and not task.train:
        raise ConfigError(NOTHING_TO_TRAIN)
    if cfg.model.lora_r > 0:
        fit.check_lora_targets(cfg.model.name, cfg.model.lora_targets)
    if task is not None and cfg.task.name != "tools":  # an episode's prompt grows turn by turn: checked as it runs
        long = fit.check_prompts(cfg.model.name, task.train + task.heldout, cfg.rollout.max_new_tokens,
                                 "rollout.max_new_tokens", cfg.task.data or f"task.name={cfg.task.name}",
                                 ("task.on_bad_row", cfg.task.on_bad_row))
        if long:
            drop_long_prompts(task, long)


def drop_long_prompts(task: Task, long: set[int]) -> None:
    """task.on_bad_row=skip: the rows whose prompt does not fit the context (``long``: indices into
    task.train + task.heldout) leave the task, counted in task.skipped_rows, said in one line."""
    n = len(task.train)
    train, heldout = fit.without(task.train, task.heldout, long)
    if not train or not heldout:
        raise ConfigError(f"task.on_bad_row=skip: {len(long)} rows have a prompt longer than the model's context, "
                          f"which leaves {len(train)} training and {len(heldout)} held-out rows; both need at least "
                          "one (a shorter prompt, or a lower rollout.max_new_tokens)")
    say(f"skipped {len(long)} rows whose prompt is longer than the model's context ({n - len(train)} training, "
        f"{len(task.heldout) - len(heldout)} held-out; task.on_bad_row=skip)")
    task.train[:], task.heldout[:] = train, heldout
    task.skipped_rows += len(long)


def check_algorithm(cfg: config.Config, refuse_ignored: bool = True) -> None:
    """Refuse, with one line naming the key, what the chosen algorithm cannot run: read from its
    declared traits (algorithms/), so no algorithm is named here."""
    algo, rollout, sizes = cfg.algo, cfg.rollout, cfg.derived
    traits = algorithms.resolve(algo.name).traits  # a registry name, or your own algorithm by import path
    if traits.group_baseline and rollout.group_size < 2:
        raise ConfigError(f"rollout.group_size: expected >= 2 for {algo.name.upper()} (the baseline comes from the "
                          f"group), got {rollout.group_size}")
    if traits.on_policy_only and (cfg.trainer.epochs > 1 or sizes.mini_batch_size < sizes.batch_size):
        raise ConfigError(f"trainer.epochs: {algo.name.upper()} has no importance ratio, so it is on-policy only: "
                          "expected epochs=1 and mini_batch_size=0")
    if (rollout.filter_groups or traits.filters_groups) and rollout.group_size < 2:
        raise ConfigError("rollout.filter_groups: needs group_size >= 2 (a group of one never has reward variance), "
                          f"got {rollout.group_size}")
    if traits.kl == "none" and algo.kl_coef > 0:
        raise ConfigError(f"algo.kl_coef: {algo.name.upper()} has no KL term; use an algorithm with a KL in the reward "
                          "or the loss")
    if traits.teacher != bool(algo.teacher):
        raise ConfigError(f"algo.teacher: {algo.name.upper()} "
                          + ("distils from a teacher: expected a model ('embedded', a model folder, a run folder) "
                             "with the student's tokenizer" if traits.teacher
                             else f"reads no teacher, got {algo.teacher!r}; use algo.name=distill"))
    if algo.cov_control != "none" and not traits.token_clip:
        raise ConfigError("algo.cov_control: Clip-Cov and KL-Cov act on PPO's token-level loss, which "
                          f"{algo.name.upper()} does not have; expected none, or one of "
                          f"{', '.join(n for n, c in algorithms.ALGORITHMS.items() if c.traits.token_clip)}")
    if algo.cov_control == "kl_cov" and cfg.trainer.epochs == 1 and sizes.mini_batch_size >= sizes.batch_size:
        raise ConfigError("algo.cov_control=kl_cov: with one optimizer step per rollout batch (trainer.epochs=1, "
                          "trainer.mini_batch_size=0) every forward has log pi = log pi_old, so KL-Cov's penalty and "
                          "its gradient are 0 and it would do nothing; set trainer.mini_batch_size below "
                          f"{sizes.batch_size} or trainer.epochs >= 2, or use algo.cov_control=clip_cov")
    if algo.dual_clip_c is not None and not traits.token_clip:
        raise ConfigError(f"algo.dual_clip_c: {algo.name.upper()} has no PPO token clip to cap; expected none, or one "
                          f"of {', '.join(n for n, c in algorithms.ALGORITHMS.items() if c.traits.token_clip)}")
    why = algorithms.turns.check(traits, cfg.task.turn_credit)
    if why:
        raise ConfigError(f"task.turn_credit: turn with {algo.name.upper()}: {why}")
    if refuse_ignored and (ignored := algorithms.ignored_knobs(algo)):
        key, readers = ignored[0]
        raise ConfigError(f"algo.{key}: algo.name={algo.name} does not read it (read by {', '.join(readers)}); "
                          "remove it"
                          + (f", or set algo.name={readers[0]}" if len(readers) == 1 else ""))
    if cfg.dist.trainer_ranks > 1 and traits.needs_values:
        raise ConfigError("dist.trainer_ranks: the FSDP2 trainer shards the policy alone; expected 1 with a critic "
                          f"({algo.name})")


def build_roles(cfg: config.Config, task: Task, weights: dict | None = None, for_eval: bool = False,
                stream=None, rollout_worker=None, run_dir: Path | None = None) -> Roles:
    """The roles of one run. ``weights``: a checkpoint's policy weights (the reference is still the
    starting policy). ``for_eval`` builds only what held-out evaluation needs: the sampler and the
    task's verifier. ``stream``: the prompt stream an async rollout pool reads ahead from.
    ``rollout_worker``: the Ray actor class of a rollout worker (tests inject faults with it).
    ``run_dir``: the run folder (verifier workers log there and may import modules from it)."""
    cfg = resolve_precision(cfg)
    check_algorithm(cfg)
    # dist.topology=async: the samples may come from weights a few updates old (the algorithm then corrects them by TIS)
    algo = algorithms.build(cfg.algo, cfg.rollout.group_size, cfg.rollout.max_new_tokens,
                            stale_samples=cfg.dist.topology == "async",
                            turn_credit=cfg.task.turn_credit, turn_discount=cfg.task.turn_discount)
    # The verifier first: its dry start finds a bad task.verifier before the model loads. An
    # environment's episodes carry their rewards (rewards/episodes.py).
    grader = (EpisodeReward(cfg.task.turn_discount) if is_env(cfg)
              else make_runner(cfg, task.verifier, "task.verifier", run_dir))
    reward = None
    try:
        # The reward functions next (their dry start), before any model loads.
        reward = grader if for_eval else build_reward(cfg, grader, run_dir)
        # before the policy loads
        prm = make_process_reward(cfg) if cfg.task.process_reward_model and not for_eval else None
        if cfg.dist.topology != "colocated" and not for_eval:
            roles = _remote_roles(cfg, algo, weights, stream, rollout_worker, grader, reward)
        else:
            roles = _local_roles(cfg, algo, weights, for_eval, grader, reward, run_dir)
        roles.process_reward = prm
        return roles
    except BaseException:  # a model that does not load, a reward function that does not import
        if reward is not None and reward is not grader:
            reward.close()
        grader.close()
        raise


def _local_roles(cfg: config.Config, algo, weights: dict | None, for_eval: bool, grader: Verifier,
                 reward: Verifier, run_dir: Path | None = None) -> Roles:
    """Every role in this process (dist.topology=colocated, and evaluation)."""
    loaded = load_policy_for(cfg.model, cfg.run.seed)
    on_device(cfg, loaded.model)  # once, so the copies below are made there
    # The reference is the *starting* policy: copy it before any checkpoint weights are loaded.
    reference = make_reference(cfg, loaded.model) if algo.needs_reference and not for_eval else None
    use_lora = cfg.model.lora_r > 0 and not for_eval
    # With LoRA the base stays the pretrained model: a checkpoint's merged weights would count the
    # adapters twice once the trainer loads them back (model/lora.py).
    if weights is not None and not use_lora:
        checkpoint.load_into(loaded.model, weights, "the checkpoint's model.safetensors")
    # vLLM reads the weights once and keeps its own copy; the other engines keep the one they are given
    sampler_model = loaded.model if cfg.rollout.engine == "vllm" else copy.deepcopy(loaded.model)
    rollout = make_rollout(cfg, sampler_model, loaded.tokenizer, run_dir)
    trainer = make_trainer(cfg, loaded.model, use_lora) if not for_eval else None
    return Roles(rollout, reward, reference, algo, trainer, grader=grader)


def make_runner(cfg: config.Config, path: str, key: str, run_dir: Path | None = None) -> VerifierRunner:
    """Worker processes for the reward function at ``path`` (named by config ``key``). The run
    folder and the current directory come first on their sys.path, so a module of yours next to
    the recipe or in the run folder imports without PYTHONPATH; either is left out (and the
    console says so) where a sandboxed program could write it (runner.safe_import_paths)."""
    task = cfg.task
    return VerifierRunner(path, verifier_timeout(task), workers=default_workers(task.verifier_workers), key=key,
                          memory_mb=task.verifier_memory_mb,
                          log_path=Path(run_dir) / "verifier.log" if run_dir else None,
                          import_paths=(*([run_dir] if run_dir else []), os.getcwd()), max_steps=cfg.run.steps)


def resolve_device(cfg: config.Config) -> config.Config:
    """cfg with run.device concrete ('cpu' or 'cuda'; 'auto' from torch.cuda.is_available()), after
    saying which in one line; run.device=cuda without CUDA is a ConfigError naming the key."""
    dev = device.resolve(cfg.run.device)
    if device.is_cuda(dev):  # on the host nothing changes from before run.device, so nothing is said
        say_once(f"device: cuda, {torch.cuda.get_device_name()} (run.device={cfg.run.device})")
    return replace(cfg, run=replace(cfg.run, device=dev))


def resolve_engine(cfg: config.Config) -> config.Config:
    """cfg with rollout.engine=auto made vllm where it means vLLM (on CUDA, installed: roles/engine.py),
    said in one line; every other choice waits for the model (``build_rollout``)."""
    rollout = cfg.rollout
    if not auto_picks_vllm(rollout.engine, device.is_cuda(cfg.run.device), rollout.top_p, cfg.model.name):
        return cfg
    say_once("rollout.engine=auto on cuda: vLLM (installed), in this process beside the trainer")
    return replace(cfg, rollout=replace(rollout, engine="vllm"))


def resolve_precision(cfg: config.Config) -> config.Config:
    """cfg with run.device (``resolve_device``), rollout.engine=auto where it means vLLM
    (``resolve_engine``), rollout.dtype and trainer.precision concrete
    (explicit settings kept, 'auto' from the probe of that device), after saying in one line what
    was chosen and why (once per process and choice)."""
    cfg = resolve_engine(resolve_device(cfg))
    dtype, prec, line = precision.resolve(cfg.rollout.dtype, cfg.trainer.precision, cfg.run.device)
    cfg = replace(cfg, rollout=replace(cfg.rollout, dtype=dtype), trainer=replace(cfg.trainer, precision=prec))
    say_once(line, key=f"precision: {dtype} sampler, {prec} trainer")  # the choice, not its figures
    if cfg.trainer.param_dtype == "bfloat16":  # explicit, so said only where the probe finds bf16 slow
        choice = precision.choose(cfg.run.device)
        if not choice.bf16:
            say_once(f"trainer.param_dtype=bfloat16 as set, though {choice.reason}: float32 is faster on this machine")
    return cfg


def on_device(cfg: config.Config, model: torch.nn.Module) -> torch.nn.Module:
    """``model`` moved (in place) to run.device; a no-op when it is there already."""
    return model.to(device.resolve(cfg.run.device))


def make_reference(cfg: config.Config, model: torch.nn.Module) -> Reference:
    """A frozen copy of `model` that gives reference log-probs, in the trainer's precision; with
    algo.teacher (on-policy distillation) the teacher model in its place."""
    if cfg.offload.reference:  # loaded on the host, so no second copy is ever made on the device
        frozen = load_teacher(cfg) if cfg.algo.teacher else load_policy_for(cfg.model, cfg.run.seed).model
    else:
        frozen = on_device(cfg, load_teacher(cfg)) if cfg.algo.teacher else copy.deepcopy(on_device(cfg, model))
    placement = Placement(precision.DTYPES[cfg.trainer.param_dtype], cfg.offload.reference,
                          device.resolve(cfg.run.device))
    return Reference(frozen, Scoring(cfg.rollout.temperature, cfg.trainer.share_prompt_prefix),
                     cfg.derived.micro_batch_size, precision.trainer_bf16(cfg.trainer.precision), cfg.trainer.forward,
                     placement)


def make_process_reward(cfg: config.Config) -> StepRewards:
    """task.process_reward_model as the run's process-reward role, on run.device in the trainer's
    precision; refused, naming the key, unless it is a PRM folder with the policy's tokenizer (it
    reads the policy's token ids)."""
    task, folder = cfg.task, Path(cfg.task.process_reward_model)
    if not (folder / "value_head.safetensors").is_file():
        raise ConfigError(f"task.process_reward_model: {folder} is not a process reward model folder (no "
                          "value_head.safetensors); write one with ProcessRewardModel.save (benchmarks/search.py "
                          "--save-prm)")
    prm = ProcessRewardModel.load(folder, cfg.run.device, micro_batch_size=cfg.derived.micro_batch_size,
                                  autocast_bf16=precision.trainer_bf16(cfg.trainer.precision))
    same_tokenizer(cfg, prm.tok, f"task.process_reward_model: {folder}",
                   "a PRM scores the policy's own token ids, so it must share its tokenizer")
    return StepRewards(prm, task.process_reward_coef, task.process_reward_form)


def same_tokenizer(cfg: config.Config, tokenizer, what: str, why: str) -> None:
    """Refuse (ConfigError naming ``what``) a model that reads the policy's token ids with another vocabulary."""
    if tokenizer.get_vocab() != load_tokenizer(cfg.model.name).get_vocab():
        raise ConfigError(f"{what} has another tokenizer than model.name={cfg.model.name}; {why}")


def load_teacher(cfg: config.Config) -> torch.nn.Module:
    """algo.teacher, refused unless it shares the student's tokenizer (its log-probs are of the same token ids)."""
    teacher = load_policy(cfg.algo.teacher, dtype=torch.float32, seed=cfg.run.seed)
    same_tokenizer(cfg, teacher.tokenizer, f"algo.teacher: {cfg.algo.teacher}",
                   "on-policy distillation scores the student's token ids, so they must mean the same")
    return teacher.model


def is_env(cfg: config.Config) -> bool:
    """Whether the run's task is environment episodes (task.name=env or tools)."""
    return config.task_families(cfg.task)[0] in config.ENV_FAMILIES


def make_rollout(cfg: config.Config, model: torch.nn.Module, tokenizer, run_dir: Path | None = None):
    """The sampler over `model` (which it casts to rollout.dtype): own decode loop or `generate`,
    wrapped in environment episodes for task.name=env or tools (their workers log to RUN/env.log)."""
    dtype = precision.sampler_dtype(cfg.rollout.dtype, cfg.run.device)
    if cfg.rollout.engine == "vllm":
        settings = rollout_vllm.VLLMSettings(cfg.run.seed, cfg.rollout.vllm_kv_cache_gb,
                                             cfg.rollout.vllm_gpu_memory_utilization)
        rollout = rollout_vllm.VLLMRollout(on_device(cfg, model), tokenizer, resolve(cfg.model.name), dtype, settings)
    else:
        rollout = build_rollout(cfg.rollout.engine, on_device(cfg, model), tokenizer, dtype, cfg.rollout.slots)
    if cfg.task.name == "agent" or on_endpoint(cfg.task):
        # the agent's own loop (a verifiers environment's harness), its calls served over this sampler
        # (roles/rollout_agent.py)
        return agent_rollout(rollout, cfg.task, fit.architecture(cfg.model.name)[1], run_dir)
    if is_env(cfg):  # multi-turn episodes: the same generate() contract, the environment's turns inside
        task = cfg.task
        log = Path(run_dir) / "env.log" if run_dir else None
        pool = env_pool(task, task.env_workers, log, (run_dir,) if run_dir else ())
        rollout = EnvRollout(rollout, pool, task.max_turns, task.max_episode_tokens,
                             context=fit.architecture(cfg.model.name)[1])
    return rollout


def make_trainer(cfg: config.Config, model: torch.nn.Module, use_lora: bool, data_parallel: bool = False) -> Trainer:
    """The trainer over `model` (float32 master weights), with a critic when the algorithm needs
    values and LoRA adapters when model.lora_r > 0; data_parallel: this process is one rank of
    dist.trainer_ranks (distributed/actors.py), so its row plan is this rank's share (roles/row_plan.py)."""
    sizes = cfg.derived
    model = on_device(cfg, model)  # before the critic: its head is made beside the trunk
    critic = (Critic(model, cfg.algo.critic, cfg.algo.critic_lr, cfg.offload.critic)
              if algorithms.traits(cfg.algo.name).needs_values else None)
    return trainer_over(lora.wrap(model, cfg.model, cfg.run.seed) if use_lora else model, cfg.trainer,
                        cfg.rollout.temperature, sizes.mini_batch_size, sizes.micro_batch_size, sizes.optimizer_steps,
                        cfg.model.gradient_checkpointing, critic=critic,
                        entropy_grad=algorithms.loss_takes_entropy(cfg.algo),
                        plan=ShardedPlan() if data_parallel else LocalPlan())


def forward_plan(tcfg: TrainerConfig, model: torch.nn.Module, temperature: float, checkpointing: bool,
                 rows: LocalPlan | ShardedPlan, critic: Critic | None, loss_entropy: bool) -> ForwardPlan:
    """The trainer's forward, chosen once beside its row plan (roles/forward_plan.py): the packed trunk
    where trainer.forward allows it (not under activation checkpointing or data parallelism), the
    chunked body, each prompt once per micro-batch (trainer.share_prompt_prefix) and once per
    mini-batch (trainer.prompts_once: not where each rank's rows are its own, nor for a critic with
    its own trunk, which runs its own prompts), a shared critic's head on the policy's trunk, the
    entropy with grad where the loss reads it, and trainer.compile's compiled step (model/compiled.py)."""
    shared_head = critic.head if critic is not None and critic.shared else None
    separate_critic = critic is not None and not critic.shared
    route = packed.resolve(tcfg.forward, model, checkpointing=checkpointing, data_parallel=rows.sharded)
    once = tcfg.prompts_once and tcfg.share_prompt_prefix and not rows.sharded and not separate_critic
    cuda = device.is_cuda(device.of(model))
    step = compiled.Step(cuda) if compiled.resolve(tcfg.compile, cuda) else None
    return ForwardPlan(Scoring(temperature, tcfg.share_prompt_prefix, True, shared_head, step), packed=route,
                       prompts_once=once, loss_entropy=loss_entropy, checkpointing=checkpointing)


def trainer_over(model: torch.nn.Module, tcfg: TrainerConfig, temperature: float, mini_batch_size: int,
                 micro_batch_size: int, total_optimizer_steps: int, gradient_checkpointing: bool = False,
                 critic: Critic | None = None, critic_lr: float | None = None, entropy_grad: bool = False,
                 plan: LocalPlan | ShardedPlan | None = None, offload_critic: bool | None = None) -> Trainer:
    """A trainer over ``model`` from plain arguments, its forward plan chosen here (``forward_plan``):
    what every trainer of a run is made with, and the tests' and benchmarks' way to make one.
    critic_lr, offload_critic: the critic's own (roles/critic.py), where given."""
    rows = plan or LocalPlan()
    if critic is not None and critic_lr is not None:
        critic.lr = critic_lr
    if critic is not None and offload_critic is not None:
        critic.offload = offload_critic
    forward = forward_plan(tcfg, model, temperature, gradient_checkpointing, rows, critic, entropy_grad)
    return Trainer(model, tcfg, Sizes(mini_batch_size, micro_batch_size, total_optimizer_steps), forward, rows, critic)


def make_pref_reference(cfg: config.Config, model: torch.nn.Module, micro_batch_size: int) -> Reference:
    """The offline recipes' reference (DPO and its family): ``model`` itself, not a copy, scored once
    over the whole data before training starts (the reference is frozen), at temperature 1, in
    micro-batches of the trainer's size, in the trainer's precision."""
    return Reference(model, Scoring(1.0, cfg.trainer.share_prompt_prefix), micro_batch_size,
                     precision.trainer_bf16(cfg.trainer.precision), cfg.trainer.forward)


def make_pref_trainer(cfg: config.Config, model: torch.nn.Module, mini_batch_size: int, micro_batch_size: int,
                      optimizer_steps: int, value_head: bool = False, pairs: bool = False) -> Trainer:
    """The offline recipes' trainer (sft, rm, dpo) over ``model`` at temperature 1: LoRA adapters on it
    when model.lora_r > 0, and for a reward model (value_head) a scalar head on its trunk, trained
    as the critic is (algo.critic_lr). ``pairs``: its loss reads rows 2i, 2i + 1 together (rm, dpo), so
    no micro-batch parts a pair (row_plan.LocalPlan's whole_groups)."""
    policy = lora.wrap(model, cfg.model, cfg.run.seed) if cfg.model.lora_r > 0 else model
    head = Critic(model, "shared", cfg.algo.critic_lr) if value_head else None
    return trainer_over(policy, cfg.trainer, 1.0, mini_batch_size, micro_batch_size, optimizer_steps,
                        cfg.model.gradient_checkpointing, critic=head, plan=LocalPlan(whole_groups=pairs))


def make_head_trainer(lm: torch.nn.Module, head: Critic, trainer: TrainerConfig, mini_batch_size: int,
                      micro_batch_size: int, optimizer_steps: int, head_lr: float) -> Trainer:
    """A trainer over a trunk with a value head trained on fixed targets, the head at its own rate: the
    process reward model's trainer (recipes/prm.py), from plain arguments (it trains outside a run's config)."""
    return trainer_over(lm, trainer, 1.0, mini_batch_size, micro_batch_size, optimizer_steps, critic=head,
                        critic_lr=head_lr)


def build_reward(cfg: config.Config, verifier: Verifier, run_dir: Path | None = None) -> Verifier:
    """What training optimises: the verifier alone, or a stack of the parts the config names.

    Parts: each of task.reward_funcs (weights task.reward_weights), the reward model
    (task.reward_model), the judge (task.judge_model, weight task.judge_weight). With none of
    them the verifier is the reward; name the verifier in task.reward_funcs to stack it too."""
    task = cfg.task
    funcs = [f.strip() for f in task.reward_funcs.split(",") if f.strip()]
    weights = [float(w) for w in task.reward_weights.split(",")] if task.reward_weights else [1.0] * len(funcs)
    parts: list = []
    try:
        for f, w in zip(funcs, weights):
            parts.append((part_name(f), make_runner(cfg, f, "task.reward_funcs", run_dir), w))
        if task.reward_model:
            scorer = load_reward_model(task.reward_model, cfg.derived.micro_batch_size,
                                        precision.trainer_bf16(cfg.trainer.precision), device.resolve(cfg.run.device),
                                        offload=cfg.offload.reward_model)
            parts.append(("reward_model", scorer, 1.0))
        if task.judge_model:
            parts.append(("judge", Judge.from_config(task, cfg.run.seed, cfg.rollout.dtype), task.judge_weight))
    except BaseException:
        for _, scorer, _ in parts:
            scorer.close()
        raise
    if not parts:
        return verifier
    if len(parts) == 1 and parts[0][2] == 1.0 and not funcs:
        return parts[0][1]  # a reward model or judge alone: no stack needed
    return RewardStack(parts)


def sampler_from(cfg: config.Config, weights: dict | None):
    """What a rollout worker holds (distributed/actors.py): the sampler over the starting policy,
    with ``weights`` (a checkpoint's, or the trainer's latest) loaded when given."""
    loaded = load_policy_for(cfg.model, cfg.run.seed)
    if weights is not None:
        loaded.model.load_state_dict(weights)
    return make_rollout(cfg, loaded.model, loaded.tokenizer)


def trainer_from(cfg: config.Config, weights: dict | None, data_parallel: bool = False) -> Trainer:
    """What a trainer rank holds (distributed/actors.py): the trainer over the starting policy, with a
    checkpoint's ``weights`` loaded unless it trains LoRA adapters (their base stays the pretrained
    model, as in ``_local_roles``)."""
    use_lora = cfg.model.lora_r > 0
    loaded = load_policy_for(cfg.model, cfg.run.seed)
    if weights is not None and not use_lora:
        loaded.model.load_state_dict(weights)
    return make_trainer(cfg, loaded.model, use_lora, data_parallel)


def _remote_roles(cfg: config.Config, algo, weights: dict | None, stream, rollout_worker, grader: VerifierRunner,
                  reward: Verifier) -> Roles:
    """Rollout workers and trainer ranks as Ray actors; the verifier, the reference and the
    algorithm stay in the driver (they are light, or a subprocess pool already)."""
    try:
        from rlpost.distributed import topology
    except ImportError as e:  # Ray is an extra: say how to get it, in one line
        raise ConfigError(f"dist.topology: {cfg.dist.topology} runs on Ray ({e}); pip install 'rlpost[dist]'") from None
    rollout, trainer = topology.place(cfg.dist, cfg.run.threads or os.cpu_count(), device.is_cuda(cfg.run.device),
                                      cfg.run.seed, cfg.rollout.dtype, weights, partial(sampler_from, cfg),
                                      partial(trainer_from, cfg), stream, rollout_worker, say)
    # The reference is the starting policy, so a fresh load is it (checkpoint weights never go in).
    reference = make_reference(cfg, load_policy_for(cfg.model, cfg.run.seed).model) if algo.needs_reference else None
    return Roles(rollout, reward, reference, algo, trainer, grader=grader)
