"""The OpenAI API's request and response bodies for the endpoint (roles/endpoint.py): each field of a
request checked by hand, so a malformed one is refused in one line naming the field, in OpenAI's error
shape (a ``Refused`` becomes HTTP 400); the stream of chunks a stream=true response is sent as; and
when two message lists say the same. Pure functions of JSON values: no model, no tokenizer, no server.
"""

from __future__ import annotations

import json

from rlpost.envs.data import ROLES, joined_text



class Refused(ValueError):
    """A request the endpoint will not serve: (its message, OpenAI's error code)."""

    def __init__(self, message: str, code: str = "invalid_request"):
        super().__init__(message)
        self.code = code


def chunks(response: dict) -> list[dict]:
    """A response as the stream of chunks the API sends for stream=true: the whole text in one delta
    (decoding is done when the response exists), then the finish reason with the usage. Clients and
    harnesses that only speak streaming so work unchanged; nothing arrives before the decode ends."""
    choice, head = response["choices"][0], {k: response[k] for k in ("id", "created", "model")}
    finish = {"index": 0, "finish_reason": choice["finish_reason"]}
    if response["object"] == "text_completion":
        return [{**head, "object": "text_completion", "choices": [{"index": 0, "text": choice["text"],
                                                                    "finish_reason": None,
                                                                    "logprobs": choice.get("logprobs")}]},
                {**head, "object": "text_completion", "choices": [{**finish, "text": ""}], "usage": response["usage"]}]
    message = choice["message"]
    delta = {"role": "assistant", "content": message["content"]}
    if "tool_calls" in message:
        delta["tool_calls"] = [{"index": k, **c} for k, c in enumerate(message["tool_calls"])]
    head["object"] = "chat.completion.chunk"
    logprobs = choice.get("logprobs")  # a response of another server may have none
    return [{**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None, "logprobs": logprobs}]},
            {**head, "choices": [{**finish, "delta": {}}], "usage": response["usage"]}]


def logprobs_asked(request: dict, kind: str) -> bool:
    """Whether the request asks for its tokens' log-probs: chat's ``logprobs: true``, the completions
    API's ``logprobs: 0``. The top alternatives (chat's top_logprobs, a completions logprobs above 0)
    are not kept by the sampler: refused in one line rather than sent empty."""
    asked = request.get("logprobs")
    if asked is None or asked is False:
        if kind == "chat" and request.get("top_logprobs") not in (None, 0):
            raise Refused("top_logprobs: needs logprobs: true")
        return False
    if kind == "chat":
        if asked is not True:
            raise Refused(f"logprobs: expected true or false, got {str(asked)[:40]!r}")
        top = request.get("top_logprobs")
        if top not in (None, 0):
            raise Refused(f"top_logprobs: the sampler keeps the log-prob of the token it drew, not the top "
                          f"alternatives; expected 0, got {str(top)[:40]!r}")
        return True
    if isinstance(asked, bool) or not isinstance(asked, int) or asked != 0:
        raise Refused(f"logprobs: the sampler keeps the log-prob of the token it drew, not the top alternatives; "
                      f"expected 0 (the drawn tokens' log-probs) or null, got {str(asked)[:40]!r}")
    return True


def logprobs_body(kind: str, pieces: list[str], logps: list[float]) -> dict:
    """A choice's ``logprobs``: each drawn token's text and log-prob, in chat's shape ({content: [{token,
    logprob, bytes, top_logprobs}]}) or the completions API's (tokens, token_logprobs, text_offset)."""
    if kind == "chat":
        return {"content": [{"token": p, "logprob": lp, "bytes": list(p.encode()), "top_logprobs": []}
                            for p, lp in zip(pieces, logps)], "refusal": None}
    offsets = [sum(map(len, pieces[:i])) for i in range(len(pieces))]
    return {"tokens": pieces, "token_logprobs": logps, "top_logprobs": None, "text_offset": offsets}


def error_body(message: str, code: str) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}


def number(request: dict, name: str, default: float, low: float, high: float) -> float:
    value = request.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise Refused(f"{name}: expected a number in [{low:g}, {high:g}], got {str(value)[:40]!r}")
    return float(value)


def chat_messages(messages) -> list[dict]:
    """The request's messages, checked, as chat templates take them (content a string; a list of
    text parts joined)."""
    if not isinstance(messages, list) or not messages:
        raise Refused("messages: expected a non-empty list of {'role', 'content'} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise Refused(f"messages[{i}]: expected an object with a role in {ROLES}, got {str(m)[:60]!r}")
        content = joined_text(m.get("content"))
        if isinstance(content, list):
            raise Refused(f"messages[{i}].content: only text parts are served")
        if content is None and not m.get("tool_calls"):
            content = ""
        if content is not None and not isinstance(content, str):
            raise Refused(f"messages[{i}].content: expected a string, got {type(content).__name__}")
        message = {"role": m["role"], "content": content}
        if m.get("tool_calls"):
            message["tool_calls"] = tool_calls(m["tool_calls"], i)
        for extra in ("tool_call_id", "name"):
            if isinstance(m.get(extra), str):
                message[extra] = m[extra]
        out.append(message)
    return out


def tool_calls(calls, i: int) -> list[dict]:
    if not isinstance(calls, list):
        raise Refused(f"messages[{i}].tool_calls: expected a list")
    out = []
    for c in calls:
        f = c.get("function") if isinstance(c, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not isinstance(f.get("arguments"), str):
            raise Refused(f"messages[{i}].tool_calls: expected {{'function': {{'name', 'arguments' (a JSON string)}}}}"
                          f" objects, got {str(c)[:60]!r}")
        out.append({"id": str(c.get("id", "")), "type": "function",
                    "function": {"name": f["name"], "arguments": f["arguments"]}})
    return out


def tool_schemas(tools) -> list[dict] | None:
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise Refused("tools: expected a list of tool objects")
    return tools


def same(a: list[dict], b: list[dict]) -> bool:
    """Whether two message lists say the same (role, content, tool calls with their arguments parsed):
    how a client sends back the message it was given may differ in empty fields and JSON spacing."""
    return len(a) == len(b) and all(_said(x) == _said(y) for x, y in zip(a, b))


def _said(m: dict) -> tuple:
    calls = []
    for c in m.get("tool_calls") or []:
        try:
            arguments = json.loads(c["function"]["arguments"])
        except (TypeError, ValueError):
            arguments = c["function"]["arguments"]
        calls.append((c["function"]["name"], json.dumps(arguments, sort_keys=True)))
    return m["role"], (m.get("content") or "").strip(), tuple(calls)
