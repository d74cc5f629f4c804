"""Planner (``rlpost plan``): memory and step time of one RL training step, before running it.

Back-of-envelope formulas (docs/planner.md), each phase at an efficiency that ``calibrate`` checks
against a real run. Pure functions over three frozen records (Shape, Workload, Device); only
``run``/``main`` print. Bad input raises ``ConfigError`` naming the argument (the CLI exits 2).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import yaml

from rlpost import algorithms
from rlpost.config import Config, ConfigError, from_dict, to_dict
from rlpost.observe.devices import (  # noqa: F401 - re-exported: planner.GPUS etc.
    CPU_AVX512, EFFICIENCY, GPUS, Device, bf16_on, decode_overhead, efficiency, probed_cpu, resolve_device)

GiB = 2**30


# --- Model shape and parameter count (LLaMA-style decoder: RMSNorm, GQA attention, SwiGLU MLP) ---
@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int  # d
    intermediate: int  # f, SwiGLU width
    heads: int
    kv_heads: int
    vocab: int  # V
    tied: bool  # lm_head shares the input embedding
    head_dim: int = 0  # 0 = hidden // heads

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def kv_dim(self) -> int:  # width of K (and of V) per token per layer
        return self.kv_heads * self.hd

    @property
    def head_params(self) -> int:  # the lm_head, V x d (the input embedding is as large)
        return self.vocab * self.hidden

    @property
    def trunk_params(self) -> int:
        """Weights every token multiplies through in the layers (the 2N of 2N FLOPs/token, minus lm_head)."""
        attn = 2 * self.hidden * self.heads * self.hd + 2 * self.hidden * self.kv_dim  # q, o ; k, v
        return self.layers * (attn + 3 * self.hidden * self.intermediate)  # + gate, up, down

    @property
    def params(self) -> int:
        """embedding (+ lm_head when untied) + layers (matmuls + 2 RMSNorms each) + final norm."""
        return self.head_params * (1 if self.tied else 2) + self.trunk_params + (2 * self.layers + 1) * self.hidden

    @property
    def critic_params(self) -> int:
        """A separate critic = the policy's decoder (no lm_head; a tied embedding stays) + a d -> 1 head."""
        return self.params - (0 if self.tied else self.head_params) + self.hidden + 1


# SmolLM2-135M-Instruct (its config.json on the HF hub), and rlpost.model.load.tiny_model (vocab = 5
# specials + 71 characters = 76; num_key_value_heads=2 there).
EMBEDDED = Shape(layers=30, hidden=576, intermediate=1536, heads=9, kv_heads=3, vocab=49152, tied=True)
TINY = Shape(layers=2, hidden=64, intermediate=128, heads=4, kv_heads=2, vocab=76, tied=True)
EMBEDDED_NAMES = ("embedded", "smollm2-135m", "smollm2-135m-instruct")  # as rlpost.model.load


def parse_size(text: str, arg: str = "--params") -> float:
    """'135M' -> 1.35e8, '1.5B' -> 1.5e9, '7e9' -> 7e9."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmbt]?)\s*", str(text), re.IGNORECASE)
    if not m or float(m.group(1)) <= 0:
        raise ConfigError(f"{arg}: expected a size like 135M, 1.5B or 7B, got {text!r}")
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}[m.group(2).lower()]


def shape_from_size(n: float, vocab: int = 32000) -> Shape:
    """A LLaMA-2-like shape of about n parameters: d = 128 x layers (LLaMA-2 7B: 4096 = 128 x 32), head_dim 128, MHA,
    f = 8d/3 rounded up to 256, untied; the layer count whose total is nearest n wins (7B -> 32 x 4096, 6.74e9)."""
    def build(layers: int) -> Shape:
        d = 128 * layers
        return Shape(layers, d, 256 * math.ceil(8 * d / 3 / 256), layers, layers, vocab, tied=False)
    return min((build(L) for L in range(1, 161)), key=lambda s: abs(s.params - n))


def shape_from_config_json(folder: Path, arg: str) -> Shape:
    """From LLaMA-style config.json keys (num_hidden_layers or n_layers, hidden_size, ...)."""
    path = Path(folder) / "config.json"
    try:
        c = json.loads(path.read_text())
        heads = int(c["num_attention_heads"])
        return Shape(int(c["num_hidden_layers"] if "num_hidden_layers" in c else c["n_layers"]), int(c["hidden_size"]),
                     int(c["intermediate_size"]), heads, int(c.get("num_key_value_heads") or heads),
                     int(c["vocab_size"]), bool(c.get("tie_word_embeddings", False)), int(c.get("head_dim") or 0))
    except KeyError as e:
        raise ConfigError(f"{arg}: {path} has no {e.args[0]!r} (a LLaMA-style config.json is expected)") from None
    except (OSError, ValueError, TypeError, AttributeError) as e:
        raise ConfigError(f"{arg}: cannot read {path}: {str(e).splitlines()[0]}") from None


def resolve_model(name: str, arg: str = "--model") -> Shape:
    if name in EMBEDDED_NAMES or name == "tiny":
        return TINY if name == "tiny" else EMBEDDED
    folder = Path(name) / "model" if (Path(name) / "config.yaml").is_file() else Path(name)  # a run folder: its model/
    if not folder.is_dir():
        raise ConfigError(f"{arg}: {name!r} is not 'embedded', 'tiny', a run folder or a folder with config.json")
    return shape_from_config_json(folder, arg)


# --- Workload and device ---
@dataclass(frozen=True)
class Workload:
    prompts: int = 16  # prompts per step
    group: int = 8  # completions per prompt; B = prompts x group sequences
    prompt_len: int = 47  # P, prompt tokens (padded)
    new_tokens: int = 16  # max_new_tokens: decode steps (the batch runs until its longest row ends)
    response_len: int = 0  # T, padded completion length the trainer sees; 0 = new_tokens
    micro_batch: int = 32  # sequences per forward/backward (per device); 0 = the mini-batch
    mini_batch: int = 0  # sequences per optimizer step; 0 = the whole batch
    epochs: int = 1
    trainer_bf16: bool = True  # bf16 autocast (fp32 master weights) or plain fp32
    sampler_bf16: bool = True
    reference: bool = False  # kl_coef > 0: a reference copy and its forward
    critic: str = ""  # PPO: 'separate' (own trunk) or 'shared' (a head on the policy); '' = none
    early_old: bool = False  # old log-probs (and values) before the advantages (PPO, KL in the reward)
    share_prefix: bool = True  # trainer/reference run each group's prompt once (rlpost's default)
    grad_ckpt: bool = False  # activation checkpointing: keep layer inputs only, recompute in backward
    mean_response_len: float = 0  # mean completion length; 0 = T (every row runs to the longest)
    prompts_once: bool = True  # the trainer runs a mini-batch's prompts once where they fit (trainer.prompts_once)
    packed: bool = True  # trainer.forward auto/packed: on a CPU, without checkpointing, only real tokens (model/packed.py)

    @property
    def batch(self) -> int:
        return self.prompts * self.group

    @property
    def T(self) -> int:
        return self.response_len or self.new_tokens

    def trainer(self) -> Workload:  # as the trainer runs it: checkpointing turns the shared prefix off
        return replace(self, share_prefix=self.share_prefix and not self.grad_ckpt)

    def on(self, dev: Device) -> Workload:  # the packed trunk runs on a CPU without checkpointing only
        return replace(self, packed=self.packed and dev.cpu and not self.grad_ckpt)

    @property
    def trained_len(self) -> float:  # completion positions per row through the linears: the mean if packed, else T
        return min(max(self.mean_response_len or self.T, 1), self.T) if self.packed else self.T

    def micro(self, gpus: int = 1) -> int:  # sequences per forward/backward on one device
        mini = max(1, (self.mini_batch or self.batch) // gpus)
        return min(self.micro_batch or mini, mini)


# Why a GPU plan is for a set-up rlpost cannot run yet ("fits" is the memory check alone).
GPU_LACKS = ("run.device=cuda places every role on the GPU, checked only on a tiny model on one H100 (docs/gpu.md)",
             "the GPU decode figure assumes the vLLM engine (rollout.engine=vllm), which was tested on CPU only")


# --- Tokens, FLOPs, bytes ---
def prompts_once(w: Workload, gpus: int = 1) -> bool:
    """Whether the trainer runs a mini-batch's prompts once ahead of its micro-batches (Trainer._prefix:
    one process, 2+ micro-batches, the prompts no more tokens than one micro-batch's rows)."""
    mini, micro = max(1, w.mini_batch or w.batch), w.micro()
    return (gpus == 1 and w.prompts_once and w.share_prefix and w.group > 1 and micro < mini
            and mini / w.group * w.prompt_len <= micro * (w.prompt_len + w.T))


def prompt_runs(w: Workload, rows: float, gpus: int = 1) -> float:
    """Prompt forwards for `rows` sequences with the shared prefix: one per group (per micro-batch
    when one holds part of a group and prompts_once does not hold); else one per row."""
    if not (w.share_prefix and w.group > 1):
        return rows
    return rows / (w.group if prompts_once(w, gpus) else min(w.group, w.micro(gpus)))


def attn_flops(s: Shape, tokens: float, ctx: float) -> float:
    """QK^T and AV: 2 x ctx x heads x hd each, per token per layer."""
    return 4 * s.layers * s.heads * s.hd * ctx * tokens


def forward_flops(s: Shape, w: Workload, rows: float, head: bool = True, gpus: int = 1) -> float:
    """One forward over `rows` sequences as the trainer runs it: 2 FLOPs per weight per token,
    the lm_head only at the T scored positions (logits_to_keep), causal attention."""
    p_tok, c_tok = prompt_runs(w, rows, gpus) * w.prompt_len, rows * w.trained_len
    flops = 2 * s.trunk_params * (p_tok + c_tok)
    flops += attn_flops(s, p_tok, w.prompt_len / 2) + attn_flops(s, c_tok, w.prompt_len + w.T / 2)
    return flops + (2 * s.head_params * c_tok if head else 0)


def update_flops(s: Shape, w: Workload, gpus: int = 1) -> float:
    """epochs x (forward + backward = 3 forwards) of the policy, and of a separate critic's trunk."""
    critic = forward_flops(s, w, w.batch, False, gpus) if w.critic == "separate" else 0.0
    return w.epochs * 3 * (forward_flops(s, w, w.batch, gpus=gpus) + critic)


def kv_cache_bytes(s: Shape, rows: float, ctx: float, bytes_per: int) -> float:
    """K and V for every layer: 2 x layers x kv_heads x head_dim x ctx x rows x bytes."""
    return 2 * s.layers * s.kv_dim * ctx * rows * bytes_per


def activation_bytes(s: Shape, tokens: float, bf16: bool) -> float:
    """Saved for backward per token per layer under bf16 autocast (HF Llama, SDPA attention): two
    RMSNorms x (fp32 input + fp32 normalised) = 16d; bf16 casts of the q/k/v/gate/up inputs, q/k/v
    and their RoPE outputs, attention output, o_proj input ~ 20d + 12 kv_dim; SwiGLU gate, up,
    silu(gate), product = 8f. fp32 training stores the same tensors at twice the size."""
    per = 36 * s.hidden + 12 * s.kv_dim + 8 * s.intermediate
    return s.layers * tokens * per * (1 if bf16 else 2)


def logits_bytes(s: Shape, rows: float, T: float) -> float:
    """(rows, T, V) at 16 bytes per entry: bf16 logits 2 + fp32 upcast 4 + fp32 log-softmax kept for
    backward 4 + its gradient 4 + the logits' gradient 2. Vocab 49152: 0.75 MiB per scored token."""
    return rows * T * s.vocab * 16


# --- The plan ---
LABELS = {"weights": "policy weights (fp32 master)", "sampler": "sampler copy", "grads": "gradients (fp32)",
          "adamw": "AdamW states (2 x fp32)", "reference": "reference copy (fp32)", "critic": "critic (weights+grads+AdamW)",
          "activations": "activations (1 micro-batch fwd+bwd)", "logits": "logits (B, T, V) for log-softmax", "step": "step",
          "kv_cache": "sampler KV cache", "runtime": "runtime overhead", "total": "total (peak)", "sync": "weight sync",
          "gen": "rollout (prefill + decode)", "ref": "reference forward", "old": "old log-probs (+values)", "update": "update (fwd+bwd+AdamW)"}


def memory(s: Shape, w: Workload, dev: Device = CPU_AVX512, gpus: int = 1) -> dict[str, float]:
    """Bytes per device. FSDP shards master weights, grads, AdamW, reference and critic over `gpus`;
    the sampler holds a full copy and generates B / gpus rows."""
    P, w = s.params, w.on(dev)
    mem = {"weights": 4 * P / gpus, "sampler": P * (2 if w.sampler_bf16 else 4), "grads": 4 * P / gpus,
           "adamw": 8 * P / gpus}
    if w.reference:
        mem["reference"] = 4 * P / gpus  # rlpost deep-copies the fp32 policy
    if w.critic == "separate":
        mem["critic"] = 16 * s.critic_params / gpus  # 4 weights + 4 grads + 8 AdamW
    rows, wt = w.micro(gpus), w.trainer()
    # one micro-batch; with the prompts run once per mini-batch, all of its prompts stay live too
    prompts = max(1, w.mini_batch or w.batch) / w.group if prompts_once(wt, gpus) else prompt_runs(wt, rows, gpus)
    tokens = prompts * w.prompt_len + rows * w.trained_len
    act = activation_bytes(s, tokens, w.trainer_bf16)
    if w.grad_ckpt:  # each layer's fp32 input is kept; one layer's tensors are rebuilt at a time
        act = s.layers * tokens * 4 * s.hidden + act / s.layers
    act *= 2 if w.critic == "separate" else 1  # the critic's trunk runs the same tokens
    if wt.share_prefix and w.group > 1:  # the prompt's cache, repeated for each row of the group
        act += kv_cache_bytes(s, rows, w.prompt_len, 2 if w.trainer_bf16 else 4)
    mem["activations"], mem["logits"] = act, logits_bytes(s, rows, w.T)
    mem["kv_cache"] = kv_cache_bytes(s, w.batch / gpus, w.prompt_len + w.new_tokens, 2 if w.sampler_bf16 else 4)
    mem["runtime"] = dev.overhead_gib * GiB
    static = sum(v for k, v in mem.items() if k not in ("activations", "logits", "kv_cache"))
    # Generation and the update take turns: the peak holds the larger transient of the two.
    mem["total"] = static + max(mem["kv_cache"], mem["activations"] + mem["logits"])
    return mem


def rollout_parts(s: Shape, w: Workload, dev: Device = CPU_AVX512, gpus: int = 1, eff: dict | None = None) -> dict[str, float]:
    """The rollout engine's prefill and its mean decode step, in seconds, and that step's FLOPs.

    Prefill is FLOP bound and runs each distinct prompt once (rlpost's loop copies its KV to the
    group's rows; vLLM shares it by prefix caching). A decode step costs a fixed overhead per layer
    (its small ops: norms, RoPE, cache writes, SiLU, whatever the batch) plus its FLOPs and its
    bytes: every sampler weight read once for the whole batch, and the KV cache at mean context.
    On a GPU the reads and the FLOPs overlap (the larger counts); on a CPU they add. The batch
    decodes until its longest row ends, T - 1 steps after the prefill's token, but a finished row
    leaves it: the FLOPs are those of the mean live rows, rows x (mean length - 1) / (T - 1)."""
    bf16, rows = w.sampler_bf16, w.batch / gpus
    mean = min(max(w.mean_response_len or w.T, 1), w.T)
    live = rows * (mean - 1) / (w.T - 1) if w.T > 1 else rows
    peak, nbytes = (dev.bf16_flops, 2) if bf16 else (dev.fp32_flops, 4)
    flops_tok, runs = 2 * s.trunk_params, rows / w.group
    prefill = runs * w.prompt_len * flops_tok + attn_flops(s, runs * w.prompt_len, w.prompt_len / 2)
    prefill += runs * 2 * s.head_params  # logits of the last prompt position only
    ctx = w.prompt_len + w.T / 2  # mean context while decoding
    step_flops = live * (flops_tok + 2 * s.head_params) + attn_flops(s, live, ctx)
    step_bytes = s.params * nbytes + kv_cache_bytes(s, live, ctx, nbytes)
    compute = step_flops / (peak * efficiency(dev, "decode", bf16, eff))
    memory = step_bytes / (dev.mem_bw * efficiency(dev, "decode_bw", bf16, eff))
    # A GPU engine overlaps the weight reads with the matmuls. On these CPUs the small-batch matmuls
    # do not: their fixed cost is the weights' bytes at the machine's bandwidth and each row's FLOPs
    # come on top (benchmarks/decode_cost.py times the matmuls alone), so the two add.
    step = s.layers * decode_overhead(dev, bf16) + (compute + memory if dev.cpu else max(compute, memory))
    prefill_s = prefill / (peak * efficiency(dev, "prefill", bf16, eff))
    return {"prefill": prefill_s, "step": step, "step_flops": step_flops, "total": prefill_s + (w.T - 1) * step}


def rollout_time(s: Shape, w: Workload, dev: Device = CPU_AVX512, gpus: int = 1, eff: dict | None = None) -> float:
    return rollout_parts(s, w, dev, gpus, eff)["total"]


def step_time(s: Shape, w: Workload, dev: Device = CPU_AVX512, gpus: int = 1, eff: dict | None = None) -> dict[str, float]:
    """Seconds per phase, named as the loop's timing_s/<phase>. Data parallel over `gpus`."""
    bf16, w = w.trainer_bf16, w.on(dev)
    rate = (dev.bf16_flops if bf16 else dev.fp32_flops) * gpus
    fwd = lambda wl, head=True: forward_flops(s, wl, w.batch, head, gpus) / (rate * efficiency(dev, "forward", bf16, eff))
    t, wt = {"gen": rollout_time(s, w, dev, gpus, eff)}, w.trainer()
    if w.reference:  # the reference is copied before checkpointing is switched on: it shares the prefix
        t["ref"] = fwd(w)
    if w.early_old:  # the policy's log-probs, and a separate critic's values, before the advantages
        t["old"] = fwd(wt) + (fwd(wt, head=False) if w.critic == "separate" else 0.0)
    n_mini = max(1, w.batch // (w.mini_batch or w.batch))
    # Checkpointing runs each forward twice: 4 forwards' worth of FLOPs per fwd+bwd instead of 3.
    update = update_flops(s, wt, gpus) * (4 / 3 if w.grad_ckpt else 1) / (rate * efficiency(dev, "update", bf16, eff))
    if not w.early_old and (w.epochs > 1 or n_mini > 1):  # the trainer recomputes old log-probs itself
        update += fwd(wt)
    # AdamW is memory bound: read param, grad, m, v and write param, m, v = 28 bytes per parameter.
    n_opt = s.params + (s.critic_params if w.critic == "separate" else 0)
    t["update"] = update + w.epochs * n_mini * 28 * n_opt / gpus / dev.mem_bw
    # Sync: read the fp32 master, write the sampler's dtype; across GPUs also gather the shards.
    P, b = s.params, (2 if w.sampler_bf16 else 4)
    sync = P * (4 + b) / dev.mem_bw + (P * b / dev.link_bw if gpus > 1 else 0.0)
    t["sync"] = sync / efficiency(dev, "sync", True, eff)
    t["step"] = sum(t.values())
    return t


def plan(s: Shape, w: Workload, dev: Device = CPU_AVX512, gpus: int = 1, eff: dict | None = None) -> dict:
    mem = memory(s, w, dev, gpus)
    fits = mem["total"] <= dev.memory_gib * GiB if dev.memory_gib else None
    return {"params": s.params, "shape": asdict(s), "workload": asdict(w), "device": dev.name,
            "gpus": gpus, "memory_bytes": mem, "time_s": step_time(s, w, dev, gpus, eff), "fits": fits,
            "lacks": [] if dev.cpu else list(GPU_LACKS)}  # what rlpost needs before it can run this plan


# --- Calibration against a finished run ---
def algorithm_parts(cfg: Config) -> tuple[bool, str, bool]:
    """(a reference copy, the critic's kind or '', old log-probs before the advantages), from the
    algorithm's traits, as the loop and build.py read them (algorithms/objective.py)."""
    traits = algorithms.traits(cfg)
    reference = (cfg.algo.kl_coef > 0 and traits.kl != "none") or cfg.algo.prime_coef > 0
    critic = cfg.algo.critic if traits.needs_values else ""
    return reference, critic, algorithms.needs_old_logp_first(cfg)


def read_run(run_dir: str | Path) -> tuple[Config, dict, int, dict]:
    """(validated config, median of each metric over steps, steps, summary) of a run folder."""
    d = Path(run_dir)
    if not (d / "config.yaml").is_file():
        raise ConfigError(f"--from: no config.yaml in {d}; is it a run folder?")
    try:
        tree = yaml.safe_load((d / "config.yaml").read_text()) or {}
        lines = [json.loads(l) for l in (d / "metrics.jsonl").read_text().splitlines() if l.strip()]
        summary = json.loads((d / "summary.json").read_text()) if (d / "summary.json").exists() else {}
        # Keys a newer or older rlpost does not know are dropped; missing ones take today's defaults.
        known = to_dict(Config())
        cfg = from_dict({sec: {k: v for k, v in (tree.get(sec) or {}).items() if k in known[sec]} for sec in known})
    except (OSError, ValueError, AttributeError, yaml.YAMLError) as e:  # ConfigError is a ValueError
        raise ConfigError(f"--from: cannot read {d}: {str(e).splitlines()[0]}") from None
    if not lines:
        raise ConfigError(f"--from: {d}/metrics.jsonl has no steps")
    keys = {k for l in lines for k, v in l.items() if isinstance(v, (int, float))}
    med = {k: statistics.median(l[k] for l in lines if isinstance(l.get(k), (int, float))) for k in keys}
    return cfg, med, len(lines), summary


def workload_from_run(cfg: Config, med: dict, dev: Device) -> Workload:
    r, t = cfg.rollout, cfg.trainer
    reference, critic, early_old = algorithm_parts(cfg)
    return Workload(  # lengths as the run saw them; the trainer pads completions to the batch's longest
        prompts=r.prompts_per_step, group=r.group_size, prompt_len=math.ceil(med.get("prompt_length/mean", 47)),
        new_tokens=r.max_new_tokens, response_len=math.ceil(med.get("response_length/max", r.max_new_tokens)),
        mean_response_len=med.get("response_length/mean", 0),
        micro_batch=t.micro_batch_size, mini_batch=t.mini_batch_size, epochs=t.epochs,
        # 'auto' (the default, saved as such): what the probe's rule picks on the device planned for
        trainer_bf16=bf16_on(t.precision, dev), sampler_bf16=bf16_on({"bfloat16": "bf16", "float32": "fp32"}.get(r.dtype, r.dtype), dev),
        reference=reference, critic=critic, early_old=early_old,
        share_prefix=t.share_prompt_prefix, prompts_once=t.prompts_once, grad_ckpt=cfg.model.gradient_checkpointing,
        packed=t.forward != "hf" and not cfg.model.lora_r)


def calibrate(run_dir: str | Path, device: str = "cpu", gpus: int = 1, eff: dict | None = None) -> dict:
    """Predict a finished run's step against its medians over steps. Rows: name, unit, predicted, measured (None if
    not logged), ratio = measured / predicted (divide that phase's efficiency by it, via --eff, to match the run)."""
    cfg, med, steps, summary = read_run(run_dir)
    shape = resolve_model(cfg.model.name, "model.name (in the run's config.yaml)")
    dev = resolve_device(device, "--device")
    p = plan(shape, workload_from_run(cfg, med, dev), dev, gpus, eff)
    rows = [(f"timing_s/{k}", "s", v, med.get(f"timing_s/{k}")) for k, v in p["time_s"].items()]
    # peak_rss_gb is ru_maxrss KiB / 2**20, so GiB; it includes everything the process held.
    rows.append(("peak memory", "GiB", p["memory_bytes"]["total"] / GiB, summary.get("peak_rss_gb")))
    out = [{"name": n, "unit": u, "predicted": pr, "measured": m, "ratio": m / pr if m is not None and pr else None}
           for n, u, pr, m in rows]
    return {"run_dir": str(run_dir), "model": cfg.model.name, "steps": steps, "rows": out, "plan": p}


# --- Command line ---

INT_ARGS = (  # (name, default, smallest allowed, help): the workload's integer options
    ("prompts", 16, 1, "prompts per step"), ("group", 8, 1, "completions per prompt"), ("prompt_len", 47, 1, "prompt tokens"),
    ("new_tokens", 16, 1, "max new tokens"), ("response_len", 0, 0, "padded completion length in the trainer (0 = --new-tokens)"),
    ("micro_batch", 32, 0, "sequences per forward/backward (0 = mini-batch)"),
    ("mini_batch", 0, 0, "sequences per optimizer step (0 = all)"), ("epochs", 1, 1, "passes over each batch"))


def parse_eff(items: list[str] | None) -> dict[str, float]:
    """['update=0.3', ...] -> {'update': 0.3}: efficiencies (e.g. from calibrate) replacing the table's."""
    pairs = [item.partition("=")[::2] for item in items or ()]
    if any(k not in EFFICIENCY["cpu"] or not re.fullmatch(r"[0-9]*\.?[0-9]+", v) or not 0 < float(v) <= 1.5 for k, v in pairs):
        raise ConfigError(f"--eff: expected PHASE=X, PHASE one of {', '.join(EFFICIENCY['cpu'])}, 0 < X <= 1.5; got {items}")
    return {k: float(v) for k, v in pairs}


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model (one of; default --model embedded)")
    g.add_argument("--model", metavar="NAME_OR_DIR", help="'embedded', 'tiny', or a folder with a LLaMA-style config.json")
    g.add_argument("--params", metavar="SIZE", help="a size like 135M, 1.5B, 7B: a LLaMA-2-like shape is derived")
    g.add_argument("--from", dest="run_dir", metavar="RUN_DIR", help="calibrate: predict RUN_DIR's workload, print it against its metrics")
    w = p.add_argument_group("workload (the config keys of the same meaning)")
    for name, default, _, help_ in INT_ARGS:
        w.add_argument(f"--{name.replace('_', '-')}", type=int, default=default, help=f"{help_} (default {default})")
    w.add_argument("--algo", default="grpo", choices=list(algorithms.ALGORITHMS),
                   help="algo.name; one with a critic (ppo) adds it (default grpo)")
    w.add_argument("--critic", default="separate", choices=("separate", "shared"), help="PPO: own trunk or a head on the policy")
    w.add_argument("--kl-coef", type=float, default=0.0, help="> 0 adds a reference copy and its forward")
    w.add_argument("--precision", default="auto", choices=("auto", "bf16", "fp32"),
                   help="trainer: bf16 autocast (fp32 master) or fp32; auto = as trainer.precision=auto picks on --device")
    w.add_argument("--sampler-dtype", default="auto", choices=("auto", "bf16", "fp32"),
                   help="sampler weights; auto = as rollout.dtype=auto picks on --device")
    w.add_argument("--no-share-prefix", action="store_true", help="the trainer runs every row's prompt")
    w.add_argument("--grad-ckpt", action="store_true", help="activation checkpointing (model.gradient_checkpointing)")
    w.add_argument("--forward", default="auto", choices=("auto", "hf"),
                   help="trainer.forward: auto counts real tokens on a CPU (the run's mean with --from), hf pads rows")
    c = p.add_argument_group("cluster")
    c.add_argument("--device", default="cpu", help=f"cpu (this machine, probed; default), cpu-avx512 (the reference "
                   f"2-core AVX-512 bf16 machine) or a GPU: {', '.join(GPUS)}")
    c.add_argument("--gpu", metavar="NAME", help="same as --device NAME")
    c.add_argument("--gpus", type=int, default=1, help="GPUs; FSDP shards weights, grads, AdamW over them")
    c.add_argument("--eff", action="append", metavar="PHASE=X", help=f"override an efficiency ({', '.join(EFFICIENCY['cpu'])})")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")




def workload_from_args(a: argparse.Namespace, dev: Device = CPU_AVX512) -> Workload:
    for name, _, low, _ in INT_ARGS:
        if getattr(a, name) < low:
            raise ConfigError(f"--{name.replace('_', '-')}: expected an integer >= {low}, got {getattr(a, name)}")
    if a.kl_coef < 0:
        raise ConfigError(f"--kl-coef: expected a number >= 0, got {a.kl_coef}")
    cfg = from_dict({"algo": {"name": a.algo, "kl_coef": a.kl_coef, "critic": a.critic}})
    reference, critic, early_old = algorithm_parts(cfg)
    return Workload(a.prompts, a.group, a.prompt_len, a.new_tokens, a.response_len, a.micro_batch, a.mini_batch,
                    a.epochs, bf16_on(a.precision, dev), bf16_on(a.sampler_dtype, dev), reference, critic, early_old,
                    not a.no_share_prefix, a.grad_ckpt, packed=a.forward != "hf")


def format_plan(p: dict, label: str) -> str:
    w, m, t = p["workload"], p["memory_bytes"], p["time_s"]
    lines = [f"rlpost plan: {label} ({p['params'] / 1e6:.1f}M params) on {p['gpus']} x {p['device']}; "
             f"{w['prompts']} prompts x {w['group']} = {w['prompts'] * w['group']} sequences, "
             f"prompt {w['prompt_len']} + {w['new_tokens']} new tokens", "", f"{'memory per device':<44}{'GiB':>9}"]
    lines += [f"  {LABELS[k]:<42}{v / GiB:>9.3f}" for k, v in m.items()]
    if p["fits"] is not None:
        lines.append(f"  {'within device memory' + (' (estimate only)' if p['lacks'] else ''):<42}{'yes' if p['fits'] else 'NO':>9}")
    lines += ["", f"{'time per step':<44}{'s':>9}"] + [f"  {LABELS[k]:<42}{v:>9.3f}" for k, v in t.items()]
    lines += ["", "rlpost cannot run this set-up yet; these figures plan for when it can:", *(f"  - {x}" for x in p["lacks"])] if p["lacks"] else []
    return "\n".join(lines)


def format_calibration(c: dict) -> str:
    fmt = lambda x: f"{x:>10.3f}" if x is not None else f"{'-':>10}"
    lines = [f"rlpost plan --from {c['run_dir']}: {c['model']}, {c['steps']} steps (medians over steps)", "",
             f"{'':<22}{'unit':>5}{'predicted':>10}{'measured':>10}{'meas/pred':>10}"]
    lines += [f"{r['name']:<22}{r['unit']:>5}{fmt(r['predicted'])}{fmt(r['measured'])}{fmt(r['ratio'])}" for r in c["rows"]]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Print a plan (or a calibration with --from). Raises ConfigError on bad input."""
    dev = resolve_device(args.gpu, "--gpu") if args.gpu else resolve_device(args.device, "--device")
    if args.gpus < 1 or (dev.cpu and args.gpus != 1):
        raise ConfigError(f"--gpus: expected an integer >= 1 (exactly 1 on cpu), got {args.gpus}")
    eff = parse_eff(args.eff)
    if args.run_dir:
        out = calibrate(args.run_dir, args.gpu or args.device, args.gpus, eff)
        text = format_calibration(out)
    else:
        if args.model and args.params:
            raise ConfigError("--params: give either --model or --params, not both")
        label = f"LLaMA-like ~{args.params}" if args.params else args.model or "embedded"
        shape = shape_from_size(parse_size(args.params)) if args.params else resolve_model(args.model or "embedded")
        out = plan(shape, workload_from_args(args, dev), dev, args.gpus, eff)
        text = format_plan(out, label)
    print(json.dumps(out, indent=2) if args.json else text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlpost plan", description="Estimate memory and step time of an RL step.")
    add_arguments(parser)
    try:
        return run(parser.parse_args(argv))
    except ConfigError as e:
        print(f"rlpost: error: {e}", file=sys.stderr)
        return 2
