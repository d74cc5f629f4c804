"""The devices the planner plans for: GPUs from their spec sheets, the reference AVX-512 CPU the
efficiencies were measured on, and this machine's CPU from the start-up precision probe.

Split from planner.py (the formulas) so each file stays readable; ``planner`` re-exports these."""

from __future__ import annotations

from dataclasses import dataclass

from rlpost.config import ConfigError
from rlpost.model import precision


@dataclass(frozen=True)
class Device:
    name: str
    memory_gib: float  # per device, spec sheet; 0 = not checked
    bf16_flops: float  # dense, FLOP/s
    fp32_flops: float
    mem_bw: float  # bytes/s (HBM, or what the CPU sustains)
    link_bw: float  # bytes/s per direction between GPUs (NVLink / PCIe)
    overhead_gib: float  # runtime: CUDA context, or the Python process with torch + transformers
    cpu: bool = False  # a CPU: its efficiencies are the CPU column of EFFICIENCY
    cores: int = 0  # a CPU's cores, the threads its efficiencies were fitted at (thread_factor prices fewer)


# Spec sheets (dense bf16 = half the "with sparsity" figure; fp32 = non-tensor-core, what PyTorch
# fp32 matmul uses by default; link = NVLink total / 2 per direction):
#   NVIDIA H100 / H200 Tensor Core GPU datasheets (SXM): 989 TFLOPS bf16, 67 fp32, HBM3 3.35 TB/s /
#     HBM3e 4.8 TB/s, 80 / 141 GB, NVLink 900 GB/s.  NVIDIA A100 datasheet (SXM): 312 bf16, 19.5 fp32,
#     2.039 TB/s (80GB) / 1.555 TB/s (40GB), NVLink 600 GB/s.  NVIDIA L40S datasheet: 362 bf16,
#     91.6 fp32, 864 GB/s GDDR6, 48 GB, no NVLink (PCIe Gen4 x16, 64 GB/s).
GPUS = {
    "h100": Device("H100 SXM 80GB", 80, 989e12, 67e12, 3.35e12, 450e9, 0.5),
    "h200": Device("H200 SXM 141GB", 141, 989e12, 67e12, 4.8e12, 450e9, 0.5),
    "a100-80g": Device("A100 SXM 80GB", 80, 312e12, 19.5e12, 2.039e12, 300e9, 0.5),
    "a100-40g": Device("A100 SXM 40GB", 40, 312e12, 19.5e12, 1.555e12, 300e9, 0.5),
    "l40s": Device("L40S 48GB", 48, 362e12, 91.6e12, 0.864e12, 32e9, 0.5),
}
# The CPU the efficiencies below were measured on (2 cores, AVX-512 bf16): a 2048^3 matmul runs at
# 704 GFLOP/s in bf16, 163 in fp32. 24 GB/s: the weight sync reads 134.5M
# fp32 params and writes bf16 in 0.034 s. Overhead 1 GiB: importing torch + transformers is 0.33
# GiB of RSS; the rest (tokenizer, data, allocator slack) is fitted to the demo's 4.5 GB peak RSS.
# `--device cpu` plans for the CPU it runs on (``probed_cpu``); `--device cpu-avx512` for this one.
CPU_AVX512 = Device("cpu-avx512 (2 cores, AVX-512 bf16, the reference machine)", 0, 704e9, 163e9, 24e9, 0, 1.0,
                    cpu=True, cores=2)


def probed_cpu() -> Device:
    """This machine's CPU from the start-up precision probe (model/precision.py, cached): one
    core's matmul rates times the cores this process may use, and one core's copy bandwidth."""
    p = precision.probe("cpu")
    return Device(f"cpu ({p.cores} cores, {p.isa}, probed)", 0, p.bf16_gflops * 1e9 * p.cores,
                  p.fp32_gflops * 1e9 * p.cores, p.mem_gbs * 1e9, 0, CPU_AVX512.overhead_gib, cpu=True, cores=p.cores)

# Efficiency per phase, (bf16, fp32): a fraction of peak FLOP/s, or of bandwidth for decode_bw, sync.
# CPU, measured on the embedded model (benchmarks/README.md):
#   decode  : rlpost's own loop (roles/rollout_fast.py), with DECODE_OVERHEAD below. fp32: the slope of
#             step time against rows on the AVX2 kind, 3.03 ms per row of 0.273 GFLOP at a probed
#             189 GFLOP/s -> 0.48 (benchmarks/decode_cost.py). bf16: solved with its overhead from two
#             Intel AVX-512 runs, the demo's gen 3.3 s and vs_trl.py's 3.44 s (taking the demo's mean
#             completion as 12.2 tokens, the AVX2 demo's median) -> 0.24. An isolated step on AMD Zen 4
#             measured 0.39 (decode_cost.py), which under-prices real rollouts there (3.1 s vs 4.8 s
#             for vs_trl.py's; 0.24 gives 4.2 s): the end-to-end fit is kept
#   forward : reference forward of 64 demo rows, bf16 autocast, 1.56 s -> 0.32
#   update  : forward+backward on the trainer's packed trunk (model/packed.py: the mean completion's
#             tokens, not the padded batch). bf16: the AMD Zen 4 demo (2026-11-26, update 9.45 s, 0.40)
#             and vs_trl.py's rlpost child (4.22 s for 0.82 TFLOP, 0.46) against the probed peak -> 0.42.
#             (0.24 on transformers' padded forward, 2026-11-22.) fp32, the same machine capped to AVX2
#             (ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2): the demo 13.8 s (0.78) and vs_trl.py's
#             6.74 s for 0.82 TFLOP (0.73) -> 0.75 (0.58 on transformers' forward on the AVX2 kind)
#   prefill : each prompt once. fp32: 16 demo prompts in 1.79 s (decode_cost.py) -> 0.48; bf16 0.45,
#             set when the demo ran on `generate` (128 x 16 tokens, 10.5 s), not re-measured
#   decode_bw: the matmuls' fixed cost per decode step, 0.54 GB of fp32 weights in 31.3 ms on the AVX2
#             kind (decode_cost.py), is the probed copy bandwidth (16.5 GB/s) within 5% -> 1.0
# GPU: common planning figures for an inference engine (vLLM/SGLang; HF generate on a GPU is several
# times slower), except the update: measured on an H100 (2026-11-27, benchmarks/gpu.py --profile), the
# 0.5B row's update of 9.3e13 FLOPs kept the GPU busy 0.49 s, 0.19 of the bf16 peak: the matmuls ran at
# ~0.65 of it (0.14 s), the elementwise kernels around them (norms, casts, SiLU, the log-softmax) took
# the rest. A larger model's matmuls weigh more, so this is pessimistic there; calibrate against your
# own run and pass --eff.
EFFICIENCY = {
    "cpu": {"prefill": (0.45, 0.48), "decode": (0.24, 0.48), "decode_bw": (1.0, 1.0),
            "forward": (0.32, 0.6), "update": (0.42, 0.75), "sync": (1.0, 1.0)},
    "gpu": {"prefill": (0.5, 0.5), "decode": (0.5, 0.5), "decode_bw": (0.6, 0.6),
            "forward": (0.45, 0.45), "update": (0.19, 0.19), "sync": (0.7, 0.7)},
}


def table(dev: Device) -> str:
    """The column of the tables below that prices ``dev``: 'cpu' or 'gpu'."""
    return "cpu" if dev.cpu else "gpu"


def efficiency(dev: Device, phase: str, bf16: bool, overrides: dict | None = None) -> float:
    return (overrides or {}).get(phase) or EFFICIENCY[table(dev)][phase][0 if bf16 else 1]


# --- Threads: a CPU phase on fewer threads than the cores its efficiency was fitted on ---
# A Ray actor computes on its own torch threads (machine.py: threads), often fewer than the node's
# cores. Amdahl: a share p of a phase runs on every thread, the rest (Python, the small ops below torch's grain)
# on one, so t(n) = t(1) x ((1 - p) + p / n). p from benchmarks/threads.py (2026-12-06, Intel Xeon AMX, quiet:
# load 0.1), the multinode benchmark's 4 x 4 rows in one process, each phase at 1 and 2 threads in turn, 3 rounds:
# 1 thread / 2 threads 1.48 for generation (0.98 / 0.66 s) and 1.53 for the update (1.75 / 1.16 s); p = 2 (1 -
# 1 / ratio) = 0.65 and 0.69. The forward-only phases (reference, old log-probs) take the update's. Two points
# fit one parameter: beyond 2 threads the law is the assumption, not a measurement.
PARALLEL = {"gen": 0.65, "update": 0.69}
TRAINER_PHASES = ("ref", "old", "update")


def thread_factor(phase: str, threads: float, cores: int) -> float:
    """A CPU phase's seconds on ``threads`` threads over its seconds on ``cores`` (PARALLEL's law)."""
    p = PARALLEL[phase]
    return ((1 - p) + p / threads) / ((1 - p) + p / cores)


def at_threads(t: dict[str, float], dev: Device, trainer: float = 0, rollout: float = 0) -> dict[str, float]:
    """``t`` (step_time's phases, priced on every core of ``dev``) with generation on ``rollout`` threads and the
    trainer's phases on ``trainer`` (0: every core); a GPU's phases, or a device of unknown cores, as they were."""
    if not dev.cpu or not dev.cores:
        return t
    out = dict(t)
    for k in out:
        n, law = (rollout, "gen") if k == "gen" else (trainer, "update") if k in TRAINER_PHASES else (0, "")
        out[k] *= thread_factor(law, n, dev.cores) if n else 1.0
    out["step"] = sum(v for k, v in out.items() if k != "step")
    return out


# Seconds per layer per decode step that no FLOP or byte explains, (bf16, fp32): on a CPU a layer's
# small ops (norms, RoPE, cache writes, residual adds, SiLU) cost about this whatever the batch.
# fp32: benchmarks/decode_cost.py on the AVX2 kind fits step time against rows (rows 8/32/128) and
# times the matmuls alone: intercepts 54.2 ms for the step, 31.3 ms for the matmuls (their fixed
# cost: 0.54 GB of weights at 17 GB/s, which rollout_parts prices as bytes), so 22.9 ms for 30
# layers: 0.76 ms per layer. bf16: the 1.0 ms per layer solved with its decode efficiency from the
# AVX-512 runs (above), less the 0.27 GB of bf16 weights at CPU_AVX512's 24 GB/s over 30 layers
# (0.37 ms), which the formula now adds as bytes: 0.63 ms. A GPU engine captures its decode step in a
# CUDA graph, which leaves no per-op launch cost to speak of: 0.
DECODE_OVERHEAD = {"cpu": (0.63e-3, 0.76e-3), "gpu": (0.0, 0.0)}


def decode_overhead(dev: Device, bf16: bool) -> float:
    return DECODE_OVERHEAD[table(dev)][0 if bf16 else 1]


# --- GPU latency: what a small model's step costs on a GPU beyond its FLOPs and bytes ---
# On an H100 (issue 37) `generate` took 27.7 ms a decode step of a 0.5B model at 128 rows, whose
# weights it reads in 0.25 ms: the step is its kernel launches, each issued from Python. The kernels
# were counted on the CPU (benchmarks/kernel_count.py: aten ops reaching a backend kernel, views left
# out; the count depends on the layers, the code path and ChunkedLogp's chunks, not on the width).
# Decode step, (per layer, fixed): `generate` 36 + 49; the own engine's step (roles/rollout_static.py),
# which a CUDA graph replays, 31 + 49 (Llama and Qwen2 alike).
DECODE_KERNELS = {"hf": (36, 49), "graph": (31, 49)}
# A trainer micro-batch's forward and backward, (per layer, fixed, per ChunkedLogp chunk): on
# transformers' forward 192 (Llama) to 203 (Qwen2's q/k/v biases) per layer, counted on the CPU. On the
# packed trunk's CUDA path torch.profiler counted 186 launches a layer on an H100 (2026-11-27,
# benchmarks/gpu.py --profile: 19,623 in the 0.5B row's update of 4 micro-batches) where the CPU counted
# 160 for the same code (cuBLAS and cuDNN's attention launch more than one kernel for some ops): 1.16x.
# Today's CUDA branch (q/k/v split, fused norms, SiluMul) counts 112.5 on the CPU (benchmarks/
# kernel_count.py, the fused norm as CUDA's 3 kernels), so 131 at that ratio, and 134 fixed (the
# micro-batch's sums kept on the device); not yet measured on a GPU (docs/planner.md, "GPU latency").
# Once per update (clipping, AdamW, the metrics): UPDATE_KERNELS.
MICRO_KERNELS = {"hf": (198, 88, 29), "packed": (131, 134, 29)}
UPDATE_KERNELS = 360
# Seconds per kernel, fitted on the H100 runs of benchmarks/README.md ("Issue 37") (torch 2.11,
# transformers 5.17): issue 37's on `generate` and transformers' forward with 128-token chunks, and
# 2026-11-27's on the CUDA-graph engine and the packed trunk (benchmarks/gpu.py).
# 'launch': one kernel launched from Python, in the eager forward, backward, prefill and `generate`. The
# four updates by rows (the demo's 24.2k and 23.4k kernels in 0.77 and 0.78 s; the 0.5B row's 27.8k and
# 19.6k in 0.98 and 0.75 s) give 32-39 us each; 35 us puts them within 0.91-1.06x (cost.gpu_step).
# 'graph': a kernel inside a CUDA graph, back to back with the next: the 0.5B row's 255 decode steps of
# 793 kernels took 0.79 s with 128 rows (weights and FLOPs 0.4 ms a step) and the demo's 15 steps of
# 979 kernels 0.098 s; with 'host' below, 3.25 us fits both.
# 'host': what a generate call costs the host once whatever its length (chat template, tokenising, the
# completions' text, the EOS checks' synchronisations): 18 ms, from the same two runs.
GPU_LATENCY = {"launch": 35e-6, "graph": 3.25e-6, "host": 18e-3}


def resolve_device(name: str, arg: str) -> Device:
    name = name.lower()
    if name not in ("cpu", "cpu-avx512") and name not in GPUS:
        raise ConfigError(f"{arg}: unknown GPU {name!r} (expected cpu, cpu-avx512 or one of {', '.join(GPUS)})")
    return probed_cpu() if name == "cpu" else CPU_AVX512 if name == "cpu-avx512" else GPUS[name]


def bf16_on(name: str, dev: Device) -> bool:
    """A precision knob ('auto', 'bf16', 'fp32') on ``dev``: 'auto' is the rule of model/precision.py
    (a CPU's bf16 must be measurably faster than its fp32; the GPUs listed all run bf16)."""
    if name != "auto":
        return name == "bf16"
    return not dev.cpu or dev.bf16_flops >= precision.FASTER_BY * dev.fp32_flops
