"""What a plan prices, read from where a user states it: a run folder's config (``workload_from_run``,
``actor_threads``) or ``rlpost plan``'s command line (``add_arguments``, ``workload_from_args``,
``net_from_args``, ``path_from_args``, ``parse_eff``). observe/planner.py plans from these records and
re-exports these names; bad input raises ``ConfigError`` naming the argument.
"""

from __future__ import annotations

import argparse
import math
import re

from rlpost import algorithms
from rlpost.config import Config, ConfigError, from_dict
from rlpost.machine import threads
from rlpost.observe.devices import CPU_AVX512, EFFICIENCY, GPUS, Device, bf16_on
from rlpost.observe.timeline import NET_GBPS, Net
from rlpost.observe.workload import Workload
from rlpost.sections import DistConfig

EFF_MAX = 1.5  # the largest efficiency --eff takes, and the bound planner.fit searches up to


def algorithm_parts(cfg: Config) -> tuple[bool, str, bool]:
    """(a reference copy, the critic's kind or '', old log-probs before the advantages), from the
    algorithm's traits, as the loop and build.py read them (algorithms/objective.py)."""
    traits = algorithms.traits(cfg.algo.name)
    reference = (cfg.algo.kl_coef > 0 and traits.kl != "none") or cfg.algo.prime_coef > 0
    critic = cfg.algo.critic if traits.needs_values else ""
    return reference, critic, algorithms.needs_old_logp_first(cfg.algo)


def workload_from_run(cfg: Config, med: dict, dev: Device) -> Workload:
    rollout, trainer = cfg.rollout, cfg.trainer
    reference, critic, early_old = algorithm_parts(cfg)
    sampler_dtype = {"bfloat16": "bf16", "float32": "fp32"}.get(rollout.dtype, rollout.dtype)
    return Workload(  # lengths as the run saw them; the trainer pads completions to the batch's longest
        prompts=rollout.prompts_per_step, group=rollout.group_size,
        prompt_len=math.ceil(med.get("prompt_length/mean", 47)), new_tokens=rollout.max_new_tokens,
        response_len=math.ceil(med.get("response_length/max", rollout.max_new_tokens)),
        mean_response_len=med.get("response_length/mean", 0),
        micro_batch=trainer.micro_batch_size, mini_batch=trainer.mini_batch_size, epochs=trainer.epochs,
        micro_tokens=trainer.micro_batch_tokens,
        # 'auto' (the default, saved as such): what the probe's rule picks on the device planned for
        trainer_bf16=bf16_on(trainer.precision, dev), sampler_bf16=bf16_on(sampler_dtype, dev),
        reference=reference, critic=critic, early_old=early_old,
        share_prefix=trainer.share_prompt_prefix, prompts_once=trainer.prompts_once,
        grad_ckpt=cfg.model.gradient_checkpointing,
        packed=trainer.forward != "hf" and not cfg.model.lora_r, engine=engine_of(rollout.engine),
        slots=rollout.slots, min_response_len=med.get("response_length/min", 0),
        stream=streams(cfg.dist.topology, cfg.dist.partial_rollouts, dev, engine_of(rollout.engine)))


def streams(topology: str, partial: bool, dev: Device, engine: str) -> bool:
    """Whether a rollout worker decodes its chunks as one stream: partial rollouts, on the CPU's own engine."""
    return topology == "async" and partial and dev.cpu and engine == "fast"


def engine_of(setting: str) -> str:
    """rollout.engine as the planner prices it: 'auto' is the own engine (vLLM is an optional install)."""
    return "fast" if setting == "auto" else setting


def actor_threads(dist: DistConfig, n_threads: int, cores: int) -> tuple[float, float]:
    """(the trainer's, each rollout worker's) torch threads as a run gives them on ``cores`` cores (0: unknown, a
    GPU): colocated, run.threads (0: every core) for both; a Ray topology, each actor's (machine.threads, as
    distributed/topology.py gives them), at most the cores (async splits one node's cores between them already)."""
    if not cores:
        return 0, 0
    if dist.topology == "colocated":
        return (min(n_threads or cores, cores),) * 2
    trainer, rollout = threads(dist, n_threads or cores)
    return min(trainer, cores), min(rollout, cores)


# --- Command line ---

INT_ARGS = (  # (name, default, smallest allowed, help): the workload's integer options
    ("prompts", 16, 1, "prompts per step"), ("group", 8, 1, "completions per prompt"),
    ("prompt_len", 47, 1, "prompt tokens"), ("new_tokens", 16, 1, "max new tokens"),
    ("response_len", 0, 0, "padded completion length in the trainer (0 = --new-tokens)"),
    ("micro_batch", 32, 0, "sequences per forward/backward (0 = mini-batch)"),
    ("micro_batch_tokens", 0, 0,
     "tokens per forward/backward, rows x (prompt + completion): trainer.micro_batch_tokens "
     "(0 = by --micro-batch)"),
    ("mini_batch", 0, 0, "sequences per optimizer step (0 = all)"), ("epochs", 1, 1, "passes over each batch"),
    ("slots", 0, 0, "rollout.slots: the own engine's decode slots, continuous batching (0 = every row at once)"))


def parse_eff(items: list[str] | None) -> dict[str, float]:
    """['update=0.3', ...] -> {'update': 0.3}: efficiencies (e.g. from calibrate) replacing the table's."""
    pairs = [item.partition("=")[::2] for item in items or ()]
    if any(k not in EFFICIENCY["cpu"] or not re.fullmatch(r"[0-9]*\.?[0-9]+", v) or not 0 < float(v) <= EFF_MAX
           for k, v in pairs):
        raise ConfigError(f"--eff: expected PHASE=X, PHASE one of {', '.join(EFFICIENCY['cpu'])}, "
                          f"0 < X <= {EFF_MAX:g}; got {items}")
    return {k: float(v) for k, v in pairs}


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model (one of; default --model embedded)")
    g.add_argument("--model", metavar="NAME_OR_DIR",
                   help="'embedded', 'tiny', a folder with a LLaMA-style config.json, or a hub id (Qwen/Qwen2.5-7B): "
                   "its config.json from the Hugging Face cache, else rlpost's table of public shapes")
    g.add_argument("--params", metavar="SIZE", help="a size like 135M, 1.5B, 7B: a LLaMA-2-like shape is derived")
    g.add_argument("--from", dest="run_dir", metavar="RUN_DIR",
                   help="calibrate: predict RUN_DIR's workload, print it against its metrics")
    w = p.add_argument_group("workload (the config keys of the same meaning)")
    for name, default, _, help_ in INT_ARGS:
        w.add_argument(f"--{name.replace('_', '-')}", type=int, default=default, help=f"{help_} (default {default})")
    w.add_argument("--mean-len", type=float, default=0, metavar="TOKENS", help="mean completion length (default 0: "
                   "every row runs to the cap); with --min-len the lengths' spread, the straggler term")
    w.add_argument("--min-len", type=float, default=0, metavar="TOKENS", help="shortest completion (default 0: 1)")
    w.add_argument("--algo", default="grpo", choices=list(algorithms.ALGORITHMS),
                   help="algo.name; one with a critic (ppo) adds it (default grpo)")
    w.add_argument("--critic", default="separate", choices=("separate", "shared"),
                   help="PPO: own trunk or a head on the policy")
    w.add_argument("--kl-coef", type=float, default=0.0, help="> 0 adds a reference copy and its forward")
    w.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp32"),
                   help="trainer: bf16 autocast (fp32 master) or fp32; auto = as trainer.precision=auto picks on "
                        "--device")
    w.add_argument("--sampler-dtype", default="auto", choices=("auto", "bf16", "fp32"),
                   help="sampler weights; auto = as rollout.dtype=auto picks on --device")
    w.add_argument("--no-share-prefix", action="store_true", help="the trainer runs every row's prompt")
    w.add_argument("--grad-ckpt", action="store_true", help="activation checkpointing (model.gradient_checkpointing)")
    w.add_argument("--forward", choices=("auto", "hf"), help="trainer.forward: auto (the default) counts real tokens "
                   "(the run's mean with --from), hf pads rows; with --from, the run's config unless given")
    w.add_argument("--engine", choices=("auto", "fast", "hf", "vllm"), help="rollout.engine: auto (the default) = "
                   "fast, the own engine (CUDA graphs on a GPU), hf = generate; with --from, the run's config unless "
                   "given")
    w.add_argument("--logp-chunk", type=int, default=0, metavar="TOKENS",
                   help="tokens per ChunkedLogp chunk on a GPU (default 0: rlpost's rule, model/logprobs.py; "
                   "128 for runs before 2026-11-27)")
    c = p.add_argument_group("cluster")
    c.add_argument("--device", default="cpu", help=f"cpu (this machine, probed; default), cpu-avx512 (the reference "
                   f"2-core AVX-512 bf16 machine) or a GPU: {', '.join(GPUS)}")
    c.add_argument("--gpu", metavar="NAME", help="same as --device NAME")
    c.add_argument("--gpus", type=int, default=1, help="GPUs; FSDP shards weights, grads, AdamW over them")
    c.add_argument("--nodes", type=int, default=1, help="machines the run spans (default 1): the weight sync to "
                   "rollout workers, and FSDP's traffic where the --gpus ranks span nodes, go over --net-gbps")
    c.add_argument("--net-gbps", type=float, default=NET_GBPS, metavar="B",
                   help=f"the link between nodes, Gbit/s (default {NET_GBPS:g}: a GPU cluster's Ethernet or "
                   "InfiniBand port)")
    c.add_argument("--topology", choices=("colocated", "disaggregated", "async"),
                   help="dist.topology: the phases in turn, or (async) generation alongside the rest; "
                   "default colocated on one node, disaggregated on several")
    c.add_argument("--partial-rollouts", action="store_true",
                   help="dist.partial_rollouts (with --topology async): on a CPU a worker's chunks decode as one "
                   "stream, a batch costing its total tokens, not its longest row; with --from, the run's config")
    c.add_argument("--weight-sync", choices=("object_store", "broadcast"), default="object_store",
                   help="dist.weight_sync: broadcast keeps the trainer sending while the link carries the weights "
                   "(async: its lane waits for the link too); with --from, the run's config")
    c.add_argument("--eff", action="append", metavar="PHASE=X",
                   help=f"override an efficiency ({', '.join(EFFICIENCY['cpu'])})")
    c.add_argument("--fit", action="store_true",
                   help="with --from: print the --eff arguments that make RUN_DIR's compute phases (generation, "
                   "update, forwards) match it, for a plan of the same machine in another layout (--nodes, "
                   "--net-gbps); what each phase measured on stderr")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")




def workload_from_args(a: argparse.Namespace, dev: Device = CPU_AVX512) -> Workload:
    for name, _, low, _ in INT_ARGS:
        if getattr(a, name) < low:
            raise ConfigError(f"--{name.replace('_', '-')}: expected an integer >= {low}, got {getattr(a, name)}")
    if a.kl_coef < 0:
        raise ConfigError(f"--kl-coef: expected a number >= 0, got {a.kl_coef}")
    for name in ("mean_len", "min_len"):
        value = getattr(a, name)
        if not (0 <= value <= max(a.response_len or a.new_tokens, 1) and math.isfinite(value)):
            raise ConfigError(f"--{name.replace('_', '-')}: expected 0 (unset) or a number of tokens up to the cap, "
                              f"{a.response_len or a.new_tokens}, got {value}")
    if a.min_len and a.mean_len and a.min_len > a.mean_len:
        raise ConfigError(f"--min-len: the shortest completion cannot be longer than the mean (--mean-len "
                          f"{a.mean_len:g}), got {a.min_len:g}")
    if a.partial_rollouts and a.topology != "async":
        raise ConfigError(f"--partial-rollouts: weights change mid-chunk only where workers sample ahead; expected "
                          f"--topology async, got {a.topology or 'colocated'}")
    # what rlpost train refuses (config_rules.py), refused here too rather than priced
    if a.slots and a.engine in ("hf", "vllm"):
        raise ConfigError(f"--slots: decode slots are the own engine's (--engine fast or auto); --engine {a.engine} "
                          f"batches on its own, so expected 0, got {a.slots}")
    if a.partial_rollouts and a.weight_sync == "broadcast":
        raise ConfigError("--partial-rollouts: a broadcast is a collective every worker joins between chunks; expected "
                          "--weight-sync object_store with it")
    if a.partial_rollouts and a.engine in ("hf", "vllm"):
        raise ConfigError(f"--partial-rollouts: new weights are taken in the own engine's decode loop; expected "
                          f"--engine fast or auto, got {a.engine}")
    cfg = from_dict({"algo": {"name": a.algo, "kl_coef": a.kl_coef, "critic": a.critic}})
    reference, critic, early_old = algorithm_parts(cfg)
    return Workload(a.prompts, a.group, a.prompt_len, a.new_tokens, a.response_len, a.micro_batch, a.mini_batch,
                    a.epochs, bf16_on(a.precision, dev), bf16_on(a.sampler_dtype, dev), reference, critic, early_old,
                    not a.no_share_prefix, a.grad_ckpt, packed=a.forward != "hf", engine=engine_of(a.engine or "auto"),
                    logp_chunk=a.logp_chunk, micro_tokens=a.micro_batch_tokens, slots=a.slots,
                    mean_response_len=a.mean_len, min_response_len=a.min_len,
                    stream=streams(a.topology, a.partial_rollouts, dev, engine_of(a.engine or "auto")))


def net_from_args(a: argparse.Namespace, dev: Device = CPU_AVX512) -> Net:
    """--nodes, --net-gbps, --topology as a Net; each node holds a trainer rank, or the rollout workers."""
    if a.nodes < 1 or a.nodes > a.gpus + 1:
        raise ConfigError(f"--nodes: expected an integer from 1 to --gpus + 1 = {a.gpus + 1} (a node for each "
                          f"trainer rank at most, and one for rollout workers), got {a.nodes}")
    if not (a.net_gbps > 0 and math.isfinite(a.net_gbps)):
        raise ConfigError(f"--net-gbps: expected a number > 0 (Gbit/s), got {a.net_gbps}")
    if a.nodes > 1 and a.topology == "colocated":
        raise ConfigError(f"--topology: colocated runs on one node; --nodes {a.nodes} needs disaggregated or async")
    topology = a.topology or ("disaggregated" if a.nodes > 1 else "colocated")
    trainer, rollout = actor_threads(DistConfig(topology=topology), 0, dev.cores)
    return Net(a.nodes, a.net_gbps, topology, a.weight_sync, trainer, rollout)


def path_from_args(a: argparse.Namespace) -> dict:
    """The code path given on the command line for --from (a run before 2026-11-27 on a GPU took
    `generate` and transformers' forward where its config says auto: --engine hf --forward hf)."""
    if a.logp_chunk < 0:
        raise ConfigError(f"--logp-chunk: expected an integer >= 0, got {a.logp_chunk}")
    path = {"logp_chunk": a.logp_chunk} if a.logp_chunk else {}
    if a.engine is not None:
        path["engine"] = engine_of(a.engine)
    if a.forward is not None:
        path["packed"] = a.forward != "hf"
    return path
