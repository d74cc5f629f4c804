"""What a model can take, read from its config and tokenizer without loading its weights: its module
names (``model.lora_targets`` must name some) and its context (every prompt, plus what is sampled
or trained after it, must fit). Checked before a run folder exists (build.py: preflight), so a
10 MB prompt is one line instead of a run out of memory, and a misspelt LoRA target one line
instead of peft's traceback.
"""

from __future__ import annotations

import functools
import os

import jinja2
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rlpost.envs.data import where
from rlpost.model import load
from rlpost.types.errors import ConfigError, clip


@functools.cache
def architecture(spec: str) -> tuple[tuple[str, ...], int]:
    """(the names of every module, the context in tokens; 0 when the config names none) of model ``spec``."""
    source = load.resolve(spec)
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        if source == "tiny":
            model = load.tiny_model(len(load.tiny_tokenizer()))
        else:
            model_config = load._from_pretrained(AutoConfig, source)
            try:
                model = AutoModelForCausalLM.from_config(model_config)
            except ValueError:  # transformers' own line lists every causal model it knows
                kind = "an encoder-decoder, " if getattr(model_config, "is_encoder_decoder", False) else ""
                raise ConfigError(f"model.name: {clip(spec, 80)} is a {model_config.model_type} model "
                                  f"({type(model_config).__name__}), {kind}not a causal language model: rlpost trains "
                                  "decoder-only models (AutoModelForCausalLM), such as Qwen, Llama or SmolLM") from None
    names = tuple(name for name, _ in model.named_modules() if name)
    conf = model.config
    context = getattr(conf, "max_position_embeddings", None) or getattr(conf, "n_positions", None) or 0
    return names, int(context)


def check_lora_targets(spec: str, targets: str) -> None:
    """Every name of ``model.lora_targets`` (peft's matching: a module's full name, or its last
    parts after a dot) names a module of the model; 'all-linear' always does."""
    if targets == "all-linear":
        return
    names, _ = architecture(spec)
    linear = sorted({n.rpartition(".")[2] for n in names if "proj" in n or "fc" in n or "dense" in n} or
                    {n.rpartition(".")[2] for n in names})
    for target in (t.strip() for t in targets.split(",")):
        if not target or not any(n == target or n.endswith("." + target) for n in names):
            raise ConfigError(f"model.lora_targets: {model_spec(spec)} has no module named {clip(repr(target), 60)} "
                              f"(its layers: {', '.join(linear[:12])}; or all-linear)")


@functools.cache
def _tokenizer(spec: str):
    tok = load.load_tokenizer(spec)
    try:  # compiled once here: a template with a syntax error is jinja's traceback at the first prompt
        tok.apply_chat_template([{"role": "user", "content": "x"}], add_generation_prompt=True, tokenize=False)
    except jinja2.TemplateSyntaxError as e:
        raise ConfigError(f"model.name: the chat template of {clip(spec, 80)} ({template_file(spec)}) does not "
                          f"compile: line {e.lineno}: {e.message}") from None
    return tok


def template_file(spec: str) -> str:
    """Where a model folder keeps its chat template: chat_template.jinja, else tokenizer_config.json."""
    source = load.resolve(spec)
    if os.path.isfile(os.path.join(source, "chat_template.jinja")):
        return os.path.join(source, "chat_template.jinja")
    if os.path.isfile(os.path.join(source, "tokenizer_config.json")):
        return os.path.join(source, "tokenizer_config.json") + "'s chat_template"
    return "its tokenizer's chat_template"


def _prompt_tokens(tok, messages: list[dict], cap: int) -> int:
    """Tokens of the chat-templated prompt, counted on at most ~``cap`` tokens' worth of text: the
    count only has to tell whether it exceeds the cap (a 10 MB prompt is not tokenized whole)."""
    limit = 16 * cap + 64  # no tokenizer here covers more than 16 characters per token
    cut = [{**m, "content": str(m.get("content", ""))[:limit]} for m in messages]
    ids = tok.apply_chat_template(cut, add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    return len(ids)


def check_prompts(spec: str, rows: list[dict], after: int, after_key: str, source: str,
                  on_bad_row: tuple[str, str] = ("", "refuse")) -> set[int]:
    """Every row's prompt (``messages``) plus ``after`` tokens (``after_key``: what is sampled or
    trained after it) fits the model's context; ConfigError naming the first that does not.
    ``on_bad_row``: (the rows' on_bad_row key, its value); with skip nothing is raised: the indices
    of the rows that do not fit are returned."""
    skip_key, skip = on_bad_row[0], on_bad_row[1] == "skip"
    _, context = architecture(spec)
    if not context:
        return set()
    budget = context - after
    if budget < 1:
        raise ConfigError(f"{after_key}: expected less than the context of {model_spec(spec)} ({context} tokens), got "
                          f"{after}; set {after_key} lower for this model, leaving room for the prompt")
    tok = _tokenizer(spec)
    per_message = _prompt_tokens(tok, [{"role": "user", "content": ""}], budget) + 8  # the template's own tokens
    too_long = set()
    for i, row in enumerate(rows):
        messages = row.get("messages") or []
        size = sum(len(str(m.get("content", "")).encode()) for m in messages) + per_message * len(messages)
        if size <= budget:  # a token covers at least one byte: this prompt cannot exceed the budget
            continue
        n = _prompt_tokens(tok, messages, budget)
        if n > budget and skip:
            too_long.add(i)
        elif n > budget:
            at = where(row, source) if "_line" in row else f"{source} row {i + 1}"
            raise ConfigError(f"{at}: the prompt is longer than the model's context: "
                              f"{'at least ' if n > 16 * budget else ''}{n} tokens, and {model_spec(spec)} takes "
                              f"{context} tokens, {after} of them for {after_key}; "
                              "shorten it or drop the row" + (f" (or {skip_key}=skip skips such rows)" if skip_key
                                                                else ""))
    return too_long


def without(train: list[dict], heldout: list[dict], long: set[int]) -> tuple[list[dict], list[dict]]:
    """Both splits less the rows check_prompts found too long (``long``: indices into train + heldout)."""
    return ([r for i, r in enumerate(train) if i not in long],
            [r for i, r in enumerate(heldout, len(train)) if i not in long])


def model_spec(spec: str) -> str:
    return f"model {clip(spec, 80)}"
