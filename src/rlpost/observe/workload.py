"""What the planner plans for: the model's shape (a LLaMA-style decoder) and the step's workload,
from a name, a size, a config.json or a run's config (observe/planner.py reads them; observe/cost.py
prices them; observe/devices.py holds the hardware)."""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from rlpost.config import ConfigError
from rlpost.observe.devices import Device

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

# Well-known hub models, from each one's config.json on the Hugging Face hub (layers, hidden, intermediate, heads,
# KV heads, vocab, tied). Qwen2.5's q/k/v biases are left out, as the planner counts no biases (24 x 1152 of the
# 0.5B's 494,032,768). An -Instruct id (and Meta-Llama-3.1-...) shares its base's shape: ``hub_key``.
HUB_SHAPES = {
    "Qwen/Qwen2.5-0.5B": Shape(24, 896, 4864, 14, 2, 151936, True),
    "Qwen/Qwen2.5-1.5B": Shape(28, 1536, 8960, 12, 2, 151936, True),
    "Qwen/Qwen2.5-3B": Shape(36, 2048, 11008, 16, 2, 151936, True),
    "Qwen/Qwen2.5-7B": Shape(28, 3584, 18944, 28, 4, 152064, False),
    "Qwen/Qwen2.5-14B": Shape(48, 5120, 13824, 40, 8, 152064, False),
    "Qwen/Qwen2.5-32B": Shape(64, 5120, 27648, 40, 8, 152064, False),
    "meta-llama/Llama-3.2-1B": Shape(16, 2048, 8192, 32, 8, 128256, True),
    "meta-llama/Llama-3.2-3B": Shape(28, 3072, 8192, 24, 8, 128256, True),
    "meta-llama/Llama-3.1-8B": Shape(32, 4096, 14336, 32, 8, 128256, False),
    "meta-llama/Llama-3.1-70B": Shape(80, 8192, 28672, 64, 8, 128256, False),
    "HuggingFaceTB/SmolLM2-135M": EMBEDDED,
    "HuggingFaceTB/SmolLM2-360M": Shape(32, 960, 2560, 15, 5, 49152, True),
    "HuggingFaceTB/SmolLM2-1.7B": Shape(24, 2048, 8192, 32, 32, 49152, True),
    "mistralai/Mistral-7B-v0.1": Shape(32, 4096, 14336, 32, 8, 32000, False),
    "mistralai/Mistral-7B-v0.2": Shape(32, 4096, 14336, 32, 8, 32000, False),  # as Mistral-7B-Instruct-v0.2
    "mistralai/Mistral-7B-v0.3": Shape(32, 4096, 14336, 32, 8, 32768, False),
}
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # org/name


def hub_key(hub_id: str) -> str:
    """The table's spelling of a hub id: case aside, without -Instruct, Meta-Llama-3.1-8B as Llama-3.1-8B."""
    org, _, name = hub_id.lower().replace("-instruct", "").partition("/")
    return f"{org}/{name.removeprefix('meta-')}"


def hub_cache() -> Path:
    """The Hugging Face cache folder as huggingface_hub finds it, read from the environment now (its own
    constants are read once, at import)."""
    if os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE"):
        return Path(os.environ.get("HF_HUB_CACHE") or os.environ["HUGGINGFACE_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface"
    return Path(home).expanduser() / "hub"


def cached_config(hub_id: str) -> Path | None:
    """The folder holding ``hub_id``'s config.json in the Hugging Face cache: its main snapshot, else the newest
    one that has it; None when it was never downloaded. Offline: reads folders only."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(hub_id, "config.json", cache_dir=hub_cache())
    if isinstance(found, str):
        return Path(found).parent
    snapshots = hub_cache() / f"models--{hub_id.replace('/', '--')}" / "snapshots"
    configs = sorted(snapshots.glob("*/config.json"), key=lambda f: f.stat().st_mtime) if snapshots.is_dir() else []
    return configs[-1].parent if configs else None


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
    return find_model(name, arg)[0]


def find_model(name: str, arg: str = "--model") -> tuple[Shape, str]:
    """(the shape, where it came from: '' for a name or folder given, else the Hugging Face cache or the table)."""
    if name in EMBEDDED_NAMES or name == "tiny":
        return (TINY if name == "tiny" else EMBEDDED), ""
    folder = Path(name) / "model" if (Path(name) / "config.yaml").is_file() else Path(name)  # a run folder: its model/
    if folder.is_dir():
        return shape_from_config_json(folder, arg), ""
    if not HUB_ID.fullmatch(name):
        raise ConfigError(f"{arg}: {name!r} is not 'embedded', 'tiny', a run folder, a folder with config.json or a "
                          "hub id (org/name)")
    cached = cached_config(name)
    if cached is not None:
        return shape_from_config_json(cached, arg), f"its config.json in the Hugging Face cache, {cached}"
    table = {hub_key(k): v for k, v in HUB_SHAPES.items()}
    if hub_key(name) in table:
        return table[hub_key(name)], "rlpost's table of public config.json values"
    raise ConfigError(f"{arg}: {name!r} is not in the Hugging Face cache ({hub_cache()}) nor in rlpost's table of "
                      f"public shapes (observe/workload.py: HUB_SHAPES), and no folder of that name is here; the one "
                      f"file needed is its config.json: `hf download {name} config.json` (huggingface-cli on older "
                      f"huggingface_hub) puts it in the cache, or pass --model DIR with DIR/config.json, or --params "
                      f"SIZE (e.g. 7B)")


# --- Workload ---
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
    packed: bool = True  # trainer.forward auto/packed: without checkpointing, only real tokens (model/packed.py)
    # rollout.engine: the own engine (CPU loop, or CUDA graphs on a GPU), 'hf' (generate) or 'vllm'
    engine: str = "fast"
    logp_chunk: int = 0  # tokens per ChunkedLogp chunk on a GPU; 0 = rlpost's rule (model/logprobs.py: chunk_tokens)
    # trainer.micro_batch_tokens: rows a micro-batch = as many of P + T tokens as fit; 0 = by rows
    micro_tokens: int = 0
    slots: int = 0  # rollout.slots: the own engine's decode slots (continuous batching); 0 = every row at once
    min_response_len: float = 0  # the shortest completion (with the mean and T, the lengths' spread); 0 = 1 token
    # dist.partial_rollouts on the CPU's own engine: a worker's next chunk joins its decode (roles/chunk_stream.py)
    stream: bool = False

    @property
    def batch(self) -> int:
        return self.prompts * self.group

    @property
    def T(self) -> int:
        return self.response_len or self.new_tokens

    def trainer(self) -> Workload:  # as the trainer runs it: checkpointing turns the shared prefix off
        return replace(self, share_prefix=self.share_prefix and not self.grad_ckpt)

    def on(self, dev: Device) -> Workload:  # the packed trunk runs without checkpointing only (CPU and GPU alike)
        return replace(self, packed=self.packed and not self.grad_ckpt)

    @property
    def trained_len(self) -> float:  # completion positions per row through the linears: the mean if packed, else T
        return min(max(self.mean_response_len or self.T, 1), self.T) if self.packed else self.T

    def micro(self, gpus: int = 1) -> int:  # sequences per forward/backward on one device
        mini = max(1, (self.mini_batch or self.batch) // gpus)
        if self.micro_tokens:  # planned at the padded length: every row as long as the longest (the 0.5B row's case)
            return min(max(1, self.micro_tokens // (self.prompt_len + self.T)), mini)
        return min(self.micro_batch or mini, mini)
