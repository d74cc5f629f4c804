"""Which engine samples: ``rollout.engine`` resolved against the device, the model and what is installed.

| rollout.engine | CPU | CUDA |
|---|---|---|
| auto | the own decode loop | vLLM when it is installed (and top_p = 1), else the own engine's GPU path |
| fast | the own decode loop | the own engine's GPU path (static KV cache, CUDA graphs) |
| hf | transformers `generate` | transformers `generate` |
| vllm | vLLM (rollout_vllm.py) | vLLM |

The own decode loop is rollout_fast.py; the own engine's GPU path is rollout_static.py.

A model the own engine does not support (``supported``) falls back to `generate` under ``auto``
and is refused under ``fast``. On CUDA, ``auto`` says in one line which engine it picked and why.
"""

from __future__ import annotations

import importlib.util

import torch

from rlpost.console import say_once
from rlpost.model import device
from rlpost.roles.rollout_fast import SUPPORTED, FastRollout, supported
from rlpost.roles.rollout_hf import HFRollout
from rlpost.roles.rollout_static import StaticRollout
from rlpost.types.errors import ConfigError

# Rotary embeddings whose frequencies depend on the length seen (transformers' dynamic_rope_update):
# the static engine turns positions with one table made for the arena's columns.
DYNAMIC_ROPE = ("dynamic", "longrope")


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None  # found, not imported (importing it takes seconds)


def auto_picks_vllm(engine: str, on_gpu: bool, top_p: float, model_name: str) -> bool:
    """Whether rollout.engine=auto means vLLM: on CUDA, when it is installed, for a sampler it can
    run (top_p = 1: vLLM does not return the top-p threshold; not the 2-layer test model, whose
    head size vLLM's kernels do not take)."""
    return engine == "auto" and on_gpu and top_p >= 1.0 and model_name != "tiny" and vllm_installed()


def pick(engine: str, on_gpu: bool, own_engine_runs: bool) -> str:
    """'static', 'fast' or 'hf' for rollout.engine in (auto, fast, hf), vLLM decided before
    (``auto_picks_vllm``); ``own_engine_runs``: the model is one the own engine supports."""
    if engine == "hf" or (engine == "auto" and not own_engine_runs):
        return "hf"
    if not own_engine_runs:
        raise ConfigError(f"rollout.engine=fast supports model types {', '.join(SUPPORTED)} (without sliding window "
                          "or dynamic rotary scaling); use rollout.engine=auto or hf")
    return "static" if on_gpu else "fast"


def build_rollout(engine: str, model: torch.nn.Module, tokenizer, dtype: torch.dtype,
                  slots: int = 0) -> HFRollout | FastRollout:
    """The rollout role for rollout.engine in (auto, fast, hf) over ``model``, on the model's device;
    ``slots``: rollout.slots, the own engine's decode slots (0: every row at once). `generate` has
    none: where auto picks it for a model the own engine does not run, it says the slots go unused."""
    on_gpu = device.is_cuda(device.of(model))
    rope = (getattr(model.config, "rope_scaling", None) or {}).get("rope_type", "default")
    chosen = pick(engine, on_gpu, supported(model) and not (on_gpu and rope in DYNAMIC_ROPE))
    if on_gpu and engine == "auto":
        why = {"static": "the own engine: a static KV cache, its decode step captured as CUDA graphs; "
                         "pip install 'rlpost[vllm]' for vLLM",
               "hf": f"transformers' generate: the own engine does not run model type {model.config.model_type!r}"}
        say_once(f"rollout.engine=auto on cuda: {why[chosen]}")
    if chosen == "hf":
        if slots:
            say_once(f"rollout.slots={slots} unused: transformers' generate batches every row at once (model type "
                     f"{model.config.model_type!r} is not one the own engine runs)")
        return HFRollout(model, tokenizer, dtype=dtype)
    return {"static": StaticRollout, "fast": FastRollout}[chosen](model, tokenizer, dtype=dtype, slots=slots)
