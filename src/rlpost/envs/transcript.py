"""Turning an episode's messages into the token ids that follow the model's own, token-exactly.

The sampler's ids are never re-encoded: each model turn's ids are kept as drawn, and what the
environment says is encoded on its own and appended (roles/rollout_env.py). So the trainer scores
exactly the tokens the sampler drew, where re-tokenising the decoded text can merge or split tokens
at the seams ("</search>" + "\\n" may encode differently from the two apart).

Chat style: the environment's messages are rendered by the model's chat template, with the
environment's tools (``apply_chat_template(..., tools=...)``), as the text the template puts after
the assistant's message: render(history + env messages + generation prompt) minus
render(history), where history ends with the assistant's message. The template must be
prefix-stable (an earlier turn renders the same whatever follows; refused in one line where it is
not) and close an assistant message with one of the end-of-sequence tokens the sampler stops at;
what the template writes after that token (ChatML's newline) opens the environment's text. A turn
cut at rollout.max_new_tokens drew no end token: the environment's text then starts with it.

Inline style: the environment's text is appended inside the assistant's turn as it is (the
observations of Search-R1 and ReTool; task.name=tools).
"""

from __future__ import annotations

import json
import re

TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)


class TemplateError(ValueError):
    """A chat template that cannot carry an episode token-exactly (not prefix-stable)."""


def render(tok, messages: list[dict], tools: list[dict] | None, generation_prompt: bool) -> str:
    return tok.apply_chat_template(messages, tools=tools or None, add_generation_prompt=generation_prompt,
                                   tokenize=False)


def encode(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False).input_ids


def opening_ids(tok, messages: list[dict], tools: list[dict] | None) -> list[int]:
    """The prompt: the opening messages and the generation prompt (as rollout_hf.render does)."""
    return encode(tok, render(tok, messages, tools, True))


def chat_delta(tok, history: list[dict], new: list[dict], tools: list[dict] | None, eos_texts: list[str],
               closed: bool) -> str:
    """The text after the assistant's last sampled token: the rest of its closing, the environment's
    messages as chat turns, and the next generation prompt. history ends with the assistant's
    message; closed: the turn ended with an end-of-sequence token (else the text starts with one)."""
    before = render(tok, history, tools, False)
    after = render(tok, history + new, tools, True)
    if not after.startswith(before):
        raise TemplateError("the chat template renders earlier turns differently once the environment's messages "
                            "follow (not prefix-stable), so the sampled tokens would not be the context; use an "
                            "environment with style='inline', or a model whose template keeps earlier turns")
    end = max(((before.rfind(e), e) for e in eos_texts), default=(-1, ""))
    tail = before[end[0] + len(end[1]):] if end[0] >= 0 else None
    if tail is None or tail.strip():
        raise TemplateError(f"the chat template does not end an assistant message with an end-of-sequence token "
                            f"({', '.join(map(repr, eos_texts))}), so a turn's end cannot be found; use style='inline'")
    return ("" if closed else end[1]) + tail + after[len(before):]


def inline_delta(new: list[dict]) -> str:
    """The environment's text, appended inside the assistant's turn."""
    return "".join(m["content"] for m in new)


def assistant_message(text: str) -> dict:
    """The message the environment's step receives; tool calls written as Hermes/Qwen
    ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` are parsed into OpenAI's form
    (arguments as a JSON string, as the OpenAI API gives them)."""
    calls = []
    for k, found in enumerate(TOOL_CALL.findall(text)):
        try:
            call = json.loads(found)
        except json.JSONDecodeError:
            continue
        if isinstance(call, dict) and isinstance(call.get("name"), str):
            arguments = call.get("arguments", {})
            calls.append({"id": f"call_{k}", "type": "function",
                          "function": {"name": call["name"], "arguments": json.dumps(arguments)}})
    return {"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})}


def for_template(message: dict) -> dict:
    """An assistant message as chat templates expect it in the history: tool-call arguments as a
    mapping (transformers' convention), where the environment received the JSON string."""
    if "tool_calls" not in message:
        return message
    calls = []
    for c in message["tool_calls"]:
        try:
            arguments = json.loads(c["function"]["arguments"])
        except (TypeError, json.JSONDecodeError):
            arguments = {}
        calls.append({**c, "function": {**c["function"], "arguments": arguments}})
    return {**message, "tool_calls": calls}
