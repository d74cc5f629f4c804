"""Where a role computes: ``run.device`` resolved once, and the device-neutral helpers roles use.

``run.device=auto`` is CUDA when ``torch.cuda.is_available()``, else the CPU; ``build.py`` resolves
it once (``resolve``), says so in one line, and moves each role's model there. From then on no
role names a device: each reads it from its own model (``of``) and moves a batch in on entry
(``Rollouts.to``). The batch crosses role boundaries on the device it was made on (the rollout's
tokenizer makes it on the CPU, so it can be pickled to a Ray actor and read by the verifier), and
each role hands back what it computed on the caller's device.

``Offloaded`` keeps a role's weights on the host between its uses (``offload.reference``,
``offload.critic``, ``offload.reward_model``, as verl's ``param_offload``).

CPU-only levers stay CPU-only: the fast engine's oneDNN-packed weights (roles/rollout_fast.py; on
CUDA the own engine is roles/rollout_static.py, its decode step a CUDA graph, and ``auto`` prefers
vLLM where it is installed: roles/engine.py), the packed trunk's written-out attention (model/packed.py:
SDPA on CUDA), glibc's ``malloc_trim`` (model/heap.py) and torch's CPU thread counts.
``tests/test_style.py`` fails on a ``"cpu"`` string literal anywhere under ``src/`` outside its
allow-list of those levers.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import torch

from rlpost.types.errors import ConfigError

CPU = torch.device(type="cpu")  # the host; the one place a device is named (allow-listed in tests/test_style.py)


def resolve(name: str) -> str:
    """``run.device`` as a torch device type: 'auto' -> 'cuda' when CUDA is available, else the
    host's; 'cuda' without CUDA is a config error naming the key (the CLI exits 2)."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else CPU.type
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("run.device=cuda: torch.cuda.is_available() is False here (no GPU, or a CPU-only torch "
                          "build); use run.device=auto or run.device=cpu")
    return name


def of(module: torch.nn.Module) -> torch.device:
    """The device of a module's first parameter (or buffer); the host for one with neither."""
    for t in (*module.parameters(), *module.buffers()):
        return t.device
    return CPU


def is_cuda(dev: torch.device | str) -> bool:
    return torch.device(dev).type == "cuda"


def max_memory_allocated_gb() -> dict[str, float]:
    """``perf/max_memory_allocated_gb``: the CUDA caching allocator's peak since the process started
    (torch.cuda.max_memory_allocated), beside peak RSS; empty when this process never used CUDA."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return {}
    return {"perf/max_memory_allocated_gb": round(torch.cuda.max_memory_allocated() / 2**30, 3)}


class Offloaded:
    """A role's weights kept on the host between uses and moved onto ``dev`` for each one (verl's
    ``param_offload``): wrap every use in ``with offloaded:``. Nested uses move once. Besides the
    module, ``params`` are an optimizer's own tensors for it (float32 master copies, or the module's
    parameters themselves) whose ``.grad`` and ``optimizer.state`` move with them (verl's
    ``optimizer_offload``). ``enabled=False`` leaves everything on ``dev`` and each ``with`` costs
    nothing; on the CPU, ``dev`` is the host and the moves are no-ops."""

    def __init__(self, module: torch.nn.Module, dev: torch.device | str, enabled: bool,
                 optimizer: torch.optim.Optimizer | None = None, params: Iterable[torch.Tensor] = ()):
        self.module, self.dev, self.enabled = module, torch.device(dev), enabled
        self.optimizer, self.params = optimizer, list(params)
        self.depth = 0  # open uses; the weights go home when the outermost one ends
        self._move(CPU if enabled else self.dev)

    def __enter__(self) -> "Offloaded":
        if self.enabled and self.depth == 0:
            self._move(self.dev)
        self.depth += 1
        return self

    def __exit__(self, *exc) -> None:
        self.depth -= 1
        if self.enabled and self.depth == 0:
            self._move(CPU)
            if is_cuda(self.dev):
                torch.cuda.empty_cache()  # hand the freed blocks back, so the next role can have them

    @torch.no_grad()
    def _move(self, dev: torch.device) -> None:
        self.module.to(dev)  # parameters keep their identity (the optimizer's keys); .data and .grad move
        for p in self.params:
            if p.device != dev:
                p.data = p.data.to(dev)
                if p.grad is not None:
                    p.grad = p.grad.to(dev)
            state = self.optimizer.state.get(p, {}) if self.optimizer is not None else {}
            for k, v in state.items():  # AdamW's moments and (fused) step counter live beside the parameter
                if torch.is_tensor(v) and v.device != dev:
                    state[k] = v.to(dev)


def cache_dir() -> Path:
    """Where rlpost keeps files on this machine ($RLPOST_CACHE, else ~/.cache/rlpost): the converted
    embedded model, the precision probe's results. Here, not in load.py, so the probe's readers (the
    planner) need not import transformers: `rlpost plan` started 7 s sooner."""
    return Path(os.environ.get("RLPOST_CACHE", Path.home() / ".cache" / "rlpost"))
