"""Which dtype each role computes in, chosen by measuring this machine once.

bf16 halves weight memory and, on cores with AVX-512 BF16 or AMX (or a GPU), runs matmuls ~4x
faster than float32. On cores without them (AVX2 only) PyTorch's bf16 matmul falls back to a
slow path: 1.1 GFLOP/s against 59 in float32 on one core of a 2-core AMD EPYC (torch 2.13,
2026-11-23), so a bf16 sampler and bf16 autocast make the demo ~50x slower there. So
``rollout.dtype=auto`` and ``trainer.precision=auto`` (the defaults) ask ``choose()``, which
times a small matmul in each dtype (well under a second, on one thread, the best of three timings
after a warm-up, so that neither a cold start nor another busy process decides it) and picks bf16
only where it is measurably faster. The result is cached per machine in the rlpost cache, keyed by
the CPU, the torch build and the instruction-set caps (``ONEDNN_MAX_CPU_ISA``,
``ATEN_CPU_CAPABILITY``), so capping the ISA, another CPU or another torch probes afresh. Explicit
settings (``bfloat16``/``float32``, ``bf16``/``fp32``) always win.

``build.py`` resolves the config once (``resolve``) and every role that computes follows
it: the sampler's weights, the trainer's autocast, the reference, the critic (inside the trainer),
the reward model, the judge and the PRM scorer. The planner reads the probed figures for
``--device cpu`` (observe/planner.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import time
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from rlpost.model.device import CPU, cache_dir

HOST = CPU.type  # the probe times this machine's CPU unless build.py passes run.device (a GPU: read, not timed)

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}  # rollout.dtype, trainer.param_dtype
TRAINER = {"bf16": True, "fp32": False}  # trainer.precision -> bf16 autocast over float32 master weights?

# bf16 must beat float32 by this factor to be chosen: "measurably faster", not a tie inside the
# probe's noise. Measured on 2 cores: 4.3x faster with AVX-512 BF16 (a 2048^3 matmul at 704 vs 163
# GFLOP/s), 54x slower with AVX2 only.
FASTER_BY = 1.25
PROBE_N = 512  # square matmul size of the probe: 268 MFLOP, ~4 ms in float32 on one core
SLOW_N = 256  # bf16 is first tried at this size; where it is already far slower, it stops there
PROBE_VERSION = 3  # bump when the probe's method changes: older cached figures are then ignored
# Seconds of matmuls before any is timed, and timings kept the best of. On an Intel AMX Xeon (2 cores,
# shared) the first bf16 matmuls after one warm-up call ran at 210-345 GFLOP/s against ~570 later, and
# one in ~15 single timings was stalled by another process (2.1 and 6.8 GFLOP/s): one such timing at
# SLOW_N read as "bf16 50x slower" and picked float32. Three timings after WARM_S of calls read ~570.
WARM_S = 0.05
REPS = 3
# Load average per core above which a probe may have shared its core with other work: its figures
# are then too low (measured here: 33 GFLOP/s fp32 under load, 94 quiet, one core), and a later start
# on a quieter machine measures again and keeps the better figures (``probe``).
BUSY = 0.5


@dataclass(frozen=True)
class Probe:
    """What a start-up probe measured (or, on a GPU, read from the device)."""
    device: str  # 'cpu' or 'cuda'
    isa: str  # torch's CPU capability under the caps in force ('AVX2', 'AVX512'), or the GPU's name
    bf16_gflops: float  # one core's (one device's) bf16 matmul rate; 0 where not measured
    fp32_gflops: float
    mem_gbs: float  # one core's copy bandwidth, read + write; 0 where not measured
    cores: int  # CPU cores this process may use (1 for a GPU)
    key: str  # what the cache file is named by
    bf16_supported: bool = True  # a GPU that cannot run bf16 says so here
    load: float = 0.0  # the 1-minute load average per core when a CPU probe measured


@dataclass(frozen=True)
class Choice:
    bf16: bool
    reason: str  # one line: why bf16 or float32
    probe: Probe


def machine_key(device: str = HOST) -> str:
    """Everything that can change the probe's answer: the CPU (model name and flags), the torch
    build, and the instruction-set caps oneDNN and ATen honour. A short hash names the cache file."""
    if device != HOST:
        parts = [device, torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else "none"]
    else:
        parts = [device, platform.machine(), _cpu_identity(), torch.__version__,
                 torch.backends.cpu.get_cpu_capability(), os.environ.get("ONEDNN_MAX_CPU_ISA", ""),
                 os.environ.get("ATEN_CPU_CAPABILITY", "")]
    return hashlib.sha256("|".join(map(str, [PROBE_VERSION, *parts])).encode()).hexdigest()[:16]


def _cpu_identity() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    lines = [line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith(("model name", "flags"))]
    return "|".join(dict.fromkeys(lines))  # one model name and one flag set, not one per core


def cache_path(device: str = HOST) -> Path:
    return cache_dir() / "precision" / f"{machine_key(device)}.json"


def probe(device: str = HOST, refresh: bool = False) -> Probe:
    """This machine's figures: from the cache when it holds them for this key, else measured now
    (< 1 s) and cached. ``refresh`` measures again. Figures cached under load (``BUSY``) are measured
    again once the machine is quieter than it was then, keeping each figure's better value: a probe
    taken while other work shared the cores does not make every later plan pessimistic."""
    path = cache_path(device)
    cached = None
    if not refresh and path.exists():
        try:
            cached = Probe(**json.loads(path.read_text()))
        except (ValueError, TypeError):
            pass  # a file from another version, or torn: measure again
        if cached is not None and not (device == HOST and cached.load > BUSY and _load() < cached.load):
            return cached
    result = _probe_gpu(device) if device != HOST else _probe_cpu()
    if cached is not None:  # measured again because the cached figures were taken under load
        result = dataclasses.replace(result, bf16_gflops=max(result.bf16_gflops, cached.bf16_gflops),
                                     fp32_gflops=max(result.fp32_gflops, cached.fp32_gflops),
                                     mem_gbs=max(result.mem_gbs, cached.mem_gbs), load=min(result.load, cached.load))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(dataclasses.asdict(result)))
        tmp.replace(path)  # atomic: two runs probing at once both leave a whole file
    except OSError:
        pass  # a read-only cache: probe again next time (< 1 s)
    return result


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _load() -> float:
    """The 1-minute load average per core this process may use (0 where the OS has none)."""
    try:
        return os.getloadavg()[0] / _cores()
    except (OSError, AttributeError):  # no load average on this OS
        return 0.0


def _probe_gpu(device: str) -> Probe:
    ok = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return Probe(device, name, 0.0, 0.0, 0.0, 1, machine_key(device), bf16_supported=ok)


def _probe_cpu() -> Probe:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one core: another busy process on the other core cannot skew it
    try:
        fp32 = matmul_gflops(torch.float32, PROBE_N)
        bf16 = matmul_gflops(torch.bfloat16, SLOW_N)
        if bf16 * 2 > fp32:  # not clearly slow at the small size: measure it as float32 was
            bf16 = matmul_gflops(torch.bfloat16, PROBE_N)
        src = torch.ones(8 * 2**20)  # 32 MiB, beyond the caches
        dst = torch.empty_like(src)
        mem = 2 * src.numel() * 4 / timed(lambda: dst.copy_(src)) / 1e9
    finally:
        torch.set_num_threads(threads)
    return Probe(HOST, torch.backends.cpu.get_cpu_capability(), round(bf16, 2), round(fp32, 2), round(mem, 2), _cores(),
                 machine_key(HOST), load=round(_load(), 2))


def matmul_gflops(dtype: torch.dtype, n: int, reps: int = REPS) -> float:
    """Best rate of an n x n by n x n matmul in dtype, timed after WARM_S of warm-up (``timed``)."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    return 2 * n**3 / timed(lambda: a @ b, reps) / 1e9


def timed(fn, reps: int = REPS, warm_s: float = WARM_S, clock=time.perf_counter) -> float:
    """The shortest of ``reps`` timings of ``fn()``, after calling it for ``warm_s`` seconds (at least
    once): oneDNN builds its kernel on the first call and an AMX unit comes up to speed over the
    first ones; the shortest timing is the one no other process interrupted."""
    until = clock() + warm_s
    fn()
    while clock() < until:
        fn()
    times = []
    for _ in range(reps):
        t = clock()
        fn()
        times.append(clock() - t)
    return min(times)


def decide(p: Probe) -> Choice:
    """bf16 or float32 from the probe's figures: the pure rule, tested with figures made up both ways."""
    if p.device != HOST:
        why = f"{p.isa} supports bf16" if p.bf16_supported else f"{p.isa} has no bf16"
        return Choice(p.bf16_supported, why, p)
    ratio = p.bf16_gflops / p.fp32_gflops if p.fp32_gflops > 0 else 0.0
    figures = f"bf16 matmul {p.bf16_gflops:.1f} GFLOP/s vs float32 {p.fp32_gflops:.1f} per core ({p.isa})"
    if ratio >= FASTER_BY:
        return Choice(True, f"{figures}: bf16 is {ratio:.1f}x faster here", p)
    speed = f"{1 / ratio:.0f}x slower" if 0 < ratio < 1 / FASTER_BY else "not measurably faster"
    return Choice(False, f"{figures}: bf16 is {speed} here", p)


def choose(device: str = HOST) -> Choice:
    return decide(probe(device))


def resolve(sampler: str, trainer: str, device: str = HOST) -> tuple[str, str, str]:
    """(rollout.dtype, trainer.precision made concrete, the one line saying what was chosen and
    why) from their settings. Explicit settings are kept; 'auto' follows the probe."""
    if sampler != "auto" and trainer != "auto":
        return sampler, trainer, f"precision: {sampler} sampler, {trainer} trainer (set in the config)"
    c = choose(device)
    dtype = sampler if sampler != "auto" else ("bfloat16" if c.bf16 else "float32")
    prec = trainer if trainer != "auto" else ("bf16" if c.bf16 else "fp32")
    return dtype, prec, f"precision: {dtype} sampler, {prec} trainer (auto: {c.reason}; cached in {cache_path(device)})"


def sampler_dtype(name: str, device: str = HOST) -> torch.dtype:
    """rollout.dtype (or a judge's) as a torch dtype; 'auto' asks the probe."""
    return DTYPES[name] if name != "auto" else (torch.bfloat16 if choose(device).bf16 else torch.float32)


def trainer_bf16(name: str, device: str = HOST) -> bool:
    """trainer.precision as 'bf16 autocast or not'; 'auto' asks the probe."""
    return TRAINER[name] if name != "auto" else choose(device).bf16


def autocast(bf16: bool, device: torch.device | str, cache: bool = True):
    """The forward's context on ``device`` (the model's: ``model.device.of``): bf16 autocast over
    float32 weights, or nothing (plain float32)."""
    dev_type = torch.device(device).type
    return torch.autocast(dev_type, dtype=torch.bfloat16, cache_enabled=cache) if bf16 else nullcontext()


def cast_params(module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """``module``'s parameters (not its buffers) cast to ``dtype`` in place, each keeping its
    identity. Buffers such as the rotary ``inv_freq`` stay float32: ``module.to(bfloat16)`` would
    round the positions' frequencies too."""
    with torch.no_grad():
        for p in module.parameters():
            if p.dtype != dtype:
                p.data = p.data.to(dtype)
    return module


def cast_keeping_float32(modules: list[torch.nn.Module]) -> dict[int, torch.Tensor]:
    """trainer.param_dtype=bfloat16: the modules' parameters cast to bf16 in place; returns the
    trainable ones' float32 values by id, the starting points of their ``MasterWeights``."""
    keep = {id(p): p.detach().clone() for m in modules for p in m.parameters() if p.requires_grad}
    for m in modules:
        cast_params(m, torch.bfloat16)
    return keep


class MasterWeights:
    """bf16 trainable parameters stepped through float32 master copies (``trainer.param_dtype=bfloat16``,
    DeepSpeed's bf16 mode).

    The optimizer holds the masters, so AdamW's moments are float32 too. Each parameter's gradient
    moves into its master's ``.grad`` as float32 the moment the backward has accumulated it (a
    post-accumulate-grad hook), so micro-batches add up in float32 and no bf16 gradient outlives its
    backward. After ``optimizer.step()``, ``weights_out`` rounds the masters into the parameters the
    forward reads. The point of the master: bf16 keeps 8 significant bits, so a 1e-5 step on a
    weight of 0.05 (below half of bf16's spacing there, 2e-4) rounds away in bf16 alone; in the
    master it adds up until it shows."""

    def __init__(self, params: list[torch.nn.Parameter], keep: dict[int, torch.Tensor]):
        """params: the trainable parameters, already bf16; keep: their float32 values from before the
        cast, by ``id`` (so a master starts from the unrounded weight)."""
        self.pairs = [(p, torch.nn.Parameter(keep[id(p)], requires_grad=True)) for p in params]
        self._of = {id(p): m for p, m in self.pairs}
        for p, m in self.pairs:
            p.register_post_accumulate_grad_hook(partial(_grad_to_master, m))

    def of(self, p: torch.nn.Parameter) -> torch.nn.Parameter:
        return self._of[id(p)]

    @torch.no_grad()
    def weights_out(self) -> None:
        for p, m in self.pairs:
            p.copy_(m)

    def state(self) -> list[torch.Tensor]:
        return [m.detach() for _, m in self.pairs]

    @torch.no_grad()
    def load(self, values: list[torch.Tensor]) -> None:
        assert len(values) == len(self.pairs), (len(values), len(self.pairs))
        for (_, m), v in zip(self.pairs, values):
            m.copy_(v)
        self.weights_out()


@torch.no_grad()
def _grad_to_master(master: torch.nn.Parameter, p: torch.nn.Parameter) -> None:
    g = p.grad.float()
    master.grad = g if master.grad is None else master.grad.add_(g)
    p.grad = None
