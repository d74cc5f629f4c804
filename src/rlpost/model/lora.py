"""LoRA through ``peft`` (``model.lora_r > 0``): the trainer trains low-rank adapters on a frozen
base; everything outside the trainer still sees a plain transformers model.

* The trainer's model is the ``peft`` wrapper. Only the adapters require grad, so AdamW holds
  state for them alone (the memory saving: no float32 gradients or moments for the base).
* ``merged_state`` gives the weights in the plain model's key names with each adapter folded in
  (W + scale * B A, computed without touching W). That is what weight sync sends to the sampler
  and what checkpoints store, so ``rlpost eval RUN`` and the sampler never need ``peft``.
* The adapters themselves travel in the trainer's state (``adapter_state``); on resume the base
  is the original pretrained model and the adapters are loaded back, so nothing is counted twice.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import Tensor

from rlpost.model.load import EMBEDDED_NAMES, HUB_ID
from rlpost.types.errors import writing


def wrap(model: torch.nn.Module, mcfg, seed: int) -> torch.nn.Module:
    """The peft model; the adapters' random init (A; B starts at 0) is drawn from ``seed``, so two
    runs of one config start from the same adapters."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as e:
        raise ImportError("model.lora_r > 0 needs peft: pip install 'rlpost[lora]' (or pip install peft)") from e
    targets = (mcfg.lora_targets if mcfg.lora_targets == "all-linear"
               else [t.strip() for t in mcfg.lora_targets.split(",")])
    cfg = LoraConfig(r=mcfg.lora_r, lora_alpha=mcfg.lora_alpha, lora_dropout=mcfg.lora_dropout,
                     target_modules=targets, bias="none", task_type="CAUSAL_LM")
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        peft_model = get_peft_model(model, cfg)
    named = hub_id(mcfg.name)
    if named:  # adapter_config.json names what others can load, not this machine's cache folder
        for adapter in peft_model.peft_config.values():
            adapter.base_model_name_or_path = named
    return peft_model


EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"  # what the embedded GGUF (model/load.py) was made from
SNAPSHOT = re.compile(r"models--([^/]+)--([^/]+)/snapshots/")  # a folder in the Hugging Face cache


def hub_id(spec: str) -> str | None:
    """The hub id behind model.name where one is known: the embedded model's (a Q4_1 copy of it), a
    folder in the Hugging Face cache (its models--org--name), a hub id itself; None for a local
    folder of the user's, whose path is the base."""
    if spec in EMBEDDED_NAMES:
        return EMBEDDED_HUB_ID
    found = SNAPSHOT.search(str(Path(spec).expanduser().resolve()) + "/") if Path(spec).exists() else None
    if found:
        return f"{found[1]}/{found[2]}"
    return spec if spec != "tiny" and not Path(spec).exists() and HUB_ID.fullmatch(spec) else None


def is_lora(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


@torch.no_grad()
def merged_state(model: torch.nn.Module) -> dict[str, Tensor]:
    """Plain-model state dict with every adapter folded into its base weight."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    out: dict[str, Tensor] = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            weight = module.get_base_layer().weight
            delta = sum(module.get_delta_weight(a) for a in module.active_adapters)
            out[f"{name}.weight"] = weight + delta.to(weight.dtype)
    for key, value in base.state_dict().items():
        if "lora_" in key:
            continue
        out.setdefault(key.replace(".base_layer.", "."), value)
    return out


def adapter_state(model: torch.nn.Module) -> dict[str, Tensor]:
    return {k: v for k, v in model.state_dict().items() if "lora_" in k}


def save_adapter(model: torch.nn.Module, tokenizer, folder: Path) -> Path:
    """peft's adapter folder (adapter_config.json naming the base, adapter_model.safetensors) plus
    the tokenizer: what ``peft.AutoPeftModelForCausalLM.from_pretrained`` and vLLM's LoRA load."""
    with writing(folder):  # a full disk: one line naming the folder
        # the base's embeddings are never trained here (no vocabulary is added): peft's "auto" would ask the hub
        # for the base's config.json to compare vocabularies, a network call at the end of every LoRA run
        model.save_pretrained(folder, save_embedding_layers=False)
        tokenizer.save_pretrained(folder)
    return Path(folder)
