"""What one RL step costs: its FLOPs, bytes and memory per phase, and the seconds a device takes for
them (observe/planner.py assembles the plan from these; docs/planner.md writes the formulas out).

Two cost models. On a CPU a phase's FLOPs and bytes add, at measured efficiencies, and a decode step
pays a fixed overhead per layer (its small ops). On a GPU FLOPs and bytes overlap, and a floor of
latency (``gpu_latency``) sets the pace of small models: kernels launched one by one from Python by
an eager engine (`generate`, the trainer's forward and backward), or run back to back inside a CUDA
graph (the own engine, vLLM). Pure functions of the frozen records (Shape, Workload, Device).
"""

from __future__ import annotations

import heapq
import math

from rlpost.observe.devices import (CPU_AVX512, DECODE_KERNELS, GPU_LATENCY, MICRO_KERNELS, UPDATE_KERNELS,
                                    Device, decode_overhead, efficiency)
from rlpost.model.budgets import KEEP_FRACTION, gpu_chunk_tokens
from rlpost.observe.workload import Shape, Workload

GiB = 2**30


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
    kv_rows = min(w.slots, w.batch / gpus) if w.slots and w.engine != "hf" else w.batch / gpus  # one a slot
    mem["kv_cache"] = kv_cache_bytes(s, kv_rows, w.prompt_len + w.new_tokens, 2 if w.sampler_bf16 else 4)
    mem["runtime"] = dev.overhead_gib * GiB
    static = sum(v for k, v in mem.items() if k not in ("activations", "logits", "kv_cache"))
    # Generation and the update take turns: the peak holds the larger transient of the two, unless the
    # own engine on a GPU keeps its KV cache (and graphs) through the update (roles/rollout_static.py).
    kept = mem["kv_cache"] if keeps_graphs(dev, w, mem["sampler"] + mem["kv_cache"]) else 0.0
    mem["total"] = static + max(mem["kv_cache"], kept + mem["activations"] + mem["logits"])
    return mem


def keeps_graphs(dev: Device, w: Workload, held: float) -> bool:
    """Whether the own engine on a GPU keeps its weights, KV cache and graphs through the update:
    while they take at most KEEP_FRACTION of its memory (StaticRollout.keeps)."""
    return not dev.cpu and w.engine == "fast" and held <= KEEP_FRACTION * dev.memory_gib * GiB


def row_lengths(w: Workload, rows: int) -> list[float]:
    """Completion lengths of ``rows`` rows as the plan draws them from the run's length distribution: min, mean and
    max (T) known, the rest unknown, so the most long-tailed one: a share (mean - min) / (T - min) of the rows at T,
    the others short, at the length that keeps the mean, the long rows spread evenly through the batch (a long
    prompt's group in every run of prompts). Without a mean every row runs to T."""
    T, mean = w.T, min(max(w.mean_response_len or w.T, 1), w.T)
    low = min(max(w.min_response_len, 1), mean)
    if mean <= low:  # no spread: every row as long as the mean
        return [mean] * rows
    n_long = min(rows, max(1, round(rows * (mean - low) / (T - low))))
    short = max(1.0, (rows * mean - n_long * T) / (rows - n_long)) if n_long < rows else T
    return [T if (i + 1) * n_long // rows > i * n_long // rows else short for i in range(rows)]


def decode_schedule(lengths: list[float], slots: int) -> tuple[float, float]:
    """(decode steps, row-steps) of rows of these completion lengths on ``slots`` decode slots (0: one a row). A
    row's first token comes from its prompt's prefill; it then holds a slot for length - 1 steps, and a slot a
    row frees goes to the next waiting row (continuous batching, roles/slots.py): list scheduling in the rows'
    order. Without slots to spare the batch runs to its longest row; with S slots about total tokens / S."""
    free = [0.0] * (min(slots, len(lengths)) if slots else len(lengths))
    heapq.heapify(free)
    for n in lengths:
        heapq.heappush(free, heapq.heappop(free) + n - 1)
    return max(free, default=0.0), sum(n - 1 for n in lengths)


def rollout_parts(s: Shape, w: Workload, dev: Device = CPU_AVX512, gpus: int = 1,
                  eff: dict | None = None) -> dict[str, float]:
    """The rollout engine's prefill and its mean decode step, in seconds, and that step's FLOPs.

    Prefill is FLOP bound and runs each distinct prompt once (rlpost's loop copies its KV to the
    group's rows; vLLM shares it by prefix caching). A decode step costs a fixed overhead per layer
    (its small ops: norms, RoPE, cache writes, SiLU, whatever the batch) plus its FLOPs and its
    bytes: every sampler weight read once for the whole batch, and the KV cache at mean context.
    On a GPU the reads and the FLOPs overlap (the larger counts); on a CPU they add. The straggler
    term: the steps and the live rows come from the batch's lengths (``row_lengths``) on its slots
    (``decode_schedule``): all rows at once decode until the longest row ends, T - 1 steps after the
    prefill's token, a finished row leaving the batch (the FLOPs are those of the mean live rows);
    on rollout.slots = S about total tokens / S steps of S rows. A worker streaming its chunks (partial
    rollouts on the CPU engine) keeps its slots full with the next chunk's rows: total tokens / n steps."""
    bf16, rows = w.sampler_bf16, w.batch / gpus
    own = w.engine != "hf"  # `generate` runs every row to the end and prefills every row's prompt
    n = max(1, round(rows))
    steps, row_steps = decode_schedule(row_lengths(w, n) if own else [w.T] * n, w.slots if own else 0)
    if own and w.stream:  # the next chunk's rows take the freed slots: steps of n rows, no tail of its own
        steps = row_steps / n
    steps = max(steps, 1.0) if w.T > 1 else 0.0
    live = rows * row_steps / (n * steps) if steps and own else rows
    peak, nbytes = (dev.bf16_flops, 2) if bf16 else (dev.fp32_flops, 4)
    flops_tok, runs = 2 * s.trunk_params, rows / w.group if own else rows
    prefill = runs * w.prompt_len * flops_tok + attn_flops(s, runs * w.prompt_len, w.prompt_len / 2)
    prefill += runs * 2 * s.head_params  # logits of the last prompt position only
    ctx = w.prompt_len + w.T / 2  # mean context while decoding
    step_flops = live * (flops_tok + 2 * s.head_params) + attn_flops(s, live, ctx)
    step_bytes = s.params * nbytes + kv_cache_bytes(s, live, ctx, nbytes)
    compute = step_flops / (peak * efficiency(dev, "decode", bf16, eff))
    memory = step_bytes / (dev.mem_bw * efficiency(dev, "decode_bw", bf16, eff))
    if dev.cpu:
        # On these CPUs the small-batch matmuls do not overlap their weight reads: their fixed cost
        # is the weights' bytes at the machine's bandwidth and each row's FLOPs come on top
        # (benchmarks/decode_cost.py times the matmuls alone), so the two add.
        step = s.layers * decode_overhead(dev, bf16) + compute + memory
    else:
        step = gpu_step(max(compute, memory), decode_latency(s, w), w.engine != "hf")
    prefill_s = prefill / (peak * efficiency(dev, "prefill", bf16, eff))
    if not dev.cpu:  # the prefill's kernels are launched one by one; the host's own work once per call
        prefill_s = gpu_step(prefill_s, prefill_latency(s), graph=False) + GPU_LATENCY["host"]
    return {"prefill": prefill_s, "step": step, "step_flops": step_flops, "steps": steps,
            "total": prefill_s + steps * step}


def gpu_step(work: float, latency: float, graph: bool) -> float:
    """A GPU phase of ``work`` seconds of FLOPs or bytes with ``latency`` seconds of launches: inside a
    CUDA graph the kernels run back to back, each paying its gap (they add). Launched one by one from
    Python the host runs ahead of the device where kernels are big and behind it where they are small,
    so the two overlap only in part: the root of the sum of their squares. On the H100 the 0.5B row's
    update in 4 micro-batches and in 2 took 0.75 and 0.62 s; this plans 0.81 and 0.57, the slower of
    the two alone 0.68 and 0.44 (devices.py: GPU_LATENCY)."""
    return work + latency if graph else math.hypot(work, latency)


def prefill_latency(s: Shape) -> float:
    """Seconds of a prefill's launches: one eager forward of the decode step's kernels (DECODE_KERNELS)."""
    per_layer, fixed = DECODE_KERNELS["hf"]
    return (per_layer * s.layers + fixed) * GPU_LATENCY["launch"]


def decode_latency(s: Shape, w: Workload) -> float:
    """Seconds of one decode step on a GPU that no FLOP or byte explains: `generate` launches each
    of its kernels from Python (GPU_LATENCY's 'launch');
    the own engine and vLLM replay a CUDA graph, whose kernels cost GPU_LATENCY's 'graph' each."""
    per_layer, fixed = DECODE_KERNELS["hf" if w.engine == "hf" else "graph"]
    kernels = per_layer * s.layers + fixed
    return kernels * GPU_LATENCY["launch" if w.engine == "hf" else "graph"]


def update_latency(s: Shape, w: Workload, gpus: int = 1) -> float:
    """Seconds of the trainer's update on a GPU spent launching kernels, one by one from Python: per
    micro-batch the forward and backward's (per layer, and per ChunkedLogp chunk of its scored
    tokens), per update clipping, AdamW and the metrics (MICRO_KERNELS, UPDATE_KERNELS)."""
    micro = w.micro(gpus)
    n_micro = w.epochs * math.ceil(max(1, w.batch // gpus) / micro)
    per_layer, fixed, per_chunk = MICRO_KERNELS["packed" if w.packed else "hf"]
    chunks = math.ceil(micro * w.trained_len / (w.logp_chunk or gpu_chunk_tokens(s.vocab)))
    kernels = n_micro * (per_layer * s.layers + fixed + per_chunk * chunks) + UPDATE_KERNELS
    return kernels * GPU_LATENCY["launch"]


def rollout_time(s: Shape, w: Workload, dev: Device = CPU_AVX512, gpus: int = 1, eff: dict | None = None) -> float:
    return rollout_parts(s, w, dev, gpus, eff)["total"]


def step_time(s: Shape, w: Workload, dev: Device = CPU_AVX512, gpus: int = 1,
              eff: dict | None = None) -> dict[str, float]:
    """Seconds per phase, named as the loop's timing_s/<phase>. Data parallel over `gpus`."""
    bf16, w = w.trainer_bf16, w.on(dev)
    rate = (dev.bf16_flops if bf16 else dev.fp32_flops) * gpus
    def fwd(wl, head=True):
        return forward_flops(s, wl, w.batch, head, gpus) / (rate * efficiency(dev, "forward", bf16, eff))
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
    update += w.epochs * n_mini * 28 * n_opt / gpus / dev.mem_bw
    t["update"] = update if dev.cpu else gpu_step(update, update_latency(s, wt, gpus), graph=False)
    # Sync: read the fp32 master, write the sampler's dtype; across GPUs also gather the shards.
    P, b = s.params, (2 if w.sampler_bf16 else 4)
    sync = P * (4 + b) / dev.mem_bw + (P * b / dev.link_bw if gpus > 1 else 0.0)
    t["sync"] = sync / efficiency(dev, "sync", True, eff)
    t["step"] = sum(t.values())
    return t
