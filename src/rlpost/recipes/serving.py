"""The body of `rlpost serve` (recipes/serve.py has its arguments): the model loaded on rlpost's own
sampler, the endpoint started, one line with its URL, then this thread decodes what the endpoint
queues until Ctrl-C (or SIGTERM), which stops the server and returns 0."""

from __future__ import annotations

from rlpost.console import say
from rlpost.model import fit, precision
from rlpost.model.load import load_policy
from rlpost.roles.endpoint import Endpoint, Limits
from rlpost.roles.engine import build_rollout


def serve(model: str, port: int, max_tokens: int, name: str) -> int:
    loaded = load_policy(model)
    engine = build_rollout("auto", loaded.model, loaded.tokenizer, precision.sampler_dtype("auto"))
    context = fit.architecture(model)[1]
    endpoint = Endpoint(engine, Limits(max_new_tokens=max_tokens, context=context), name=name)
    try:
        url = endpoint.start(port)
    except OSError as e:
        engine.close()
        raise OSError(e.errno, f"cannot serve on 127.0.0.1:{port} ({e.strerror})") from None
    say(f"serving {model} at {url} (OpenAI API: chat/completions, completions); Ctrl-C stops")
    try:
        while True:
            endpoint.step(wait=0.1)
    except KeyboardInterrupt:
        say("stopped")
        return 0
    finally:
        endpoint.stop()
        engine.close()
