"""The OpenAI-compatible endpoint (roles/endpoint.py) driven by the real `openai` client: token-exact
recording under the trainer's log-probs, concurrent episodes batched into few decodes, tool calls
round-tripping through the chat template, and refusals in OpenAI's error shape."""

import copy
import json
import threading
import time

import openai
import pytest
import torch

from rlpost.envs.transcript import encode, render
from rlpost.model.load import load_tokenizer
from rlpost.model.logprobs import completion_logprobs
from rlpost.roles.endpoint import Endpoint, Limits
from rlpost.roles.rollout_env import assemble
from rlpost.roles.rollout_fast import FastRollout


@pytest.fixture
def served(tiny):
    engine = FastRollout(tiny.model, tiny.tokenizer, torch.float32)
    ep = Endpoint(engine, Limits(max_new_tokens=8, context=256, max_calls=4, max_episode_tokens=120))
    ep.start()
    yield ep
    ep.stop()


def drive(ep: Endpoint, agents: list, running: bool = True) -> list:
    """Run each agent (a function of nothing) in a thread while this thread decodes; their results."""
    out: list = [None] * len(agents)

    def run(i, agent):
        try:
            out[i] = agent()
        except Exception as e:  # noqa: BLE001 - the test reads it
            out[i] = e

    threads = [threading.Thread(target=run, args=(i, a)) for i, a in enumerate(agents)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        ep.step(running=sum(t.is_alive() for t in threads) if running else 0, wait=0.01)
    return out


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=60)


def test_two_calls_are_recorded_token_exactly_and_the_trainer_scores_them_as_the_sampler_did(served, tiny):
    ep, tok = served, tiny.tokenizer
    ep.forced = (0.9, 1.0)
    key, url = ep.open({"prompt": "hi"})

    def agent():
        c = client(url)
        messages = [{"role": "user", "content": "hi"}]
        first = c.chat.completions.create(model="m", messages=messages, max_tokens=5, temperature=0.0)
        messages += [first.choices[0].message, {"role": "user", "content": "more"}]
        second = c.chat.completions.create(model="m", messages=messages)
        return first, second

    first, second = drive(ep, [agent])[0]
    record = ep.close(key)
    e = record.episode
    assert record.calls == 2 and record.breaks == 0 and not record.error
    prompt = encode(tok, render(tok, [{"role": "user", "content": "hi"}], None, True))
    assert e.prompt == prompt
    n1 = first.usage.completion_tokens
    assert n1 <= 5 and first.choices[0].finish_reason in ("stop", "length")  # max_tokens=5 lowered the cap of 8
    # the first call's drawn ids, then what the agent's messages add (masked), then the second call's
    t1 = e.ids[:n1]
    assert tok.decode(t1, skip_special_tokens=True) == first.choices[0].message.content
    inserted = encode(tok, ("" if t1[-1] == tok.eos_token_id else "</s>") + "<|user|>more<|assistant|>")
    assert e.ids[n1:n1 + len(inserted)] == inserted
    assert e.mask == [True] * n1 + [False] * len(inserted) + [True] * second.usage.completion_tokens
    assert e.ends == [n1 - 1, len(e.ids) - 1]
    assert second.usage.prompt_tokens == len(prompt) + n1 + len(inserted)  # the prompt it was given is the sequence
    # the temperature asked for (0) was not used: the run's 0.9 was, so the log-probs are of softmax(logits / 0.9)
    batch = assemble([e], [{"prompt": "hi"}], 1, tok, 0)
    m = batch.completion_mask
    with torch.no_grad():
        logp, _ = completion_logprobs(tiny.model, batch, temperature=0.9)
    assert (batch.sampler_logp[m] < 0).all()
    assert (logp[m] - batch.sampler_logp[m]).abs().max() < 1e-5


def test_64_concurrent_episodes_share_few_decodes_and_each_records_its_own_tokens(served, tiny):
    ep, tok = served, tiny.tokenizer
    ep.forced = (1.0, 1.0)
    opened = [ep.open({"i": i}) for i in range(64)]

    def agent(url, i):
        def run():
            c = client(url)
            messages = [{"role": "user", "content": f"n {i}"}]
            a = c.chat.completions.create(model="m", messages=messages)
            messages += [a.choices[0].message, {"role": "user", "content": "go"}]
            b = c.chat.completions.create(model="m", messages=messages)
            return [a.choices[0].message.content, b.choices[0].message.content]
        return run

    decodes = ep.decodes
    said = drive(ep, [agent(url, i) for i, (_, url) in enumerate(opened)])
    assert all(isinstance(s, list) for s in said), [s for s in said if not isinstance(s, list)][:1]
    assert ep.decodes - decodes <= 32  # 128 calls; one at a time would be 128 decodes
    for i, ((key, _), texts) in enumerate(zip(opened, said)):
        e = ep.close(key).episode
        assert tok.decode(e.prompt) == f"<|user|>n {i}<|assistant|>"  # each episode holds its own calls
        assert len(e.ends) == 2
        cuts = [(0, e.ends[0] + 1), (e.ends[0] + 1, e.ends[1] + 1)]
        drawn = [[t for t, keep in zip(e.ids[a:b], e.mask[a:b]) if keep] for a, b in cuts]
        assert [tok.decode(d, skip_special_tokens=True) for d in drawn] == texts


# ChatML with Hermes tool calls, as Qwen2.5's template writes them (the embedded model's template renders no tools)
HERMES = ("{% if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
          "{% for m in messages %}{% if m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content or '' }}"
          "{% for c in m.tool_calls or [] %}<tool_call>\n"
          "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}\n</tool_call>{% endfor %}"
          "<|im_end|>\n"
          "{% elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
          "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_tool_calls_are_parsed_and_the_tool_result_is_rendered_by_the_template():
    tok = copy.deepcopy(load_tokenizer("embedded"))
    tok.chat_template = HERMES
    said = encode(tok, '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>') + [
        tok.eos_token_id]
    answer = encode(tok, "5") + [tok.eos_token_id]

    class Scripted:  # an engine that draws what it is told: the parse, not the model, is under test
        eos_set = {tok.eos_token_id}

        def __init__(self):
            self.tok, self.turns, self.seen = tok, [said, answer], []

        def sample_ids(self, seqs, temperature, top_p, max_new_tokens, stops):
            self.seen += seqs
            return [(self.turns.pop(0), [-0.5] * 40, "eos") for _ in seqs]

    engine = Scripted()
    ep = Endpoint(engine, Limits(max_new_tokens=64, context=4096, max_calls=4, max_episode_tokens=2000))
    ep.start()
    tools = [{"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]
    key, url = ep.open({})

    def agent():
        c = client(url)
        messages = [{"role": "user", "content": "2 + 3?"}]
        first = c.chat.completions.create(model="m", messages=messages, tools=tools)
        call = first.choices[0].message.tool_calls[0]
        result = sum(json.loads(call.function.arguments).values())
        messages += [first.choices[0].message, {"role": "tool", "tool_call_id": call.id, "content": str(result)}]
        return first, c.chat.completions.create(model="m", messages=messages, tools=tools)

    try:
        first, second = drive(ep, [agent])[0]
    finally:
        ep.stop()
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls" and message.content is None
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
        ("add", {"a": 2, "b": 3})]
    assert second.choices[0].message.content == "5" and second.choices[0].finish_reason == "stop"
    e = ep.close(key).episode
    prompt = engine.seen[0]
    history = [{"role": "user", "content": "2 + 3?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]}]
    opened = render(tok, history, tools, False)
    tool_turn = render(tok, history + [{"role": "tool", "content": "5"}], tools, True)[len(opened):]
    # the second prompt: the first prompt, the drawn ids as drawn, the template's text for the tool result
    assert engine.seen[1] == prompt + said + encode(tok, opened[opened.rindex("<|im_end|>") + 10:] + tool_turn)
    assert e.ids == engine.seen[1][len(prompt):] + answer
    assert "<tool_response>\n5\n</tool_response>" in tok.decode(e.ids)
    assert e.tool_calls == 1 and e.ends == [len(said) - 1, len(e.ids) - 1]


def test_bad_requests_are_refused_in_one_line_naming_the_field_and_end_their_episode(served):
    ep = served
    key, url = ep.open({})
    cases = [
        (dict(messages=[{"role": "wizard", "content": "x"}]), "messages[0]: expected an object with a role"),
        (dict(messages=[{"role": "user", "content": "x"}], temperature=7), "temperature: expected a number in"),
        (dict(messages="hello"), "messages: expected a non-empty list"),
        (dict(messages=[{"role": "user", "content": "x"}], n=3), "n: only 1 completion"),
        (dict(messages=[{"role": "user", "content": "a" * 300}]), "the prompt is 302 tokens, and the model's context"),
    ]

    def call(kwargs, base=None):
        def run():
            return client(base or ep.url + "/v1").chat.completions.create(model="m", **kwargs)
        return run

    got = drive(ep, [call(kw) for kw, _ in cases], running=False)
    for (_, expected), result in zip(cases, got):
        assert isinstance(result, openai.BadRequestError), result
        assert expected in result.body["message"]
    # in an episode the first refusal ends it: a good call after it is refused too, saying why
    bad = drive(ep, [call(cases[0][0], url)], running=False)[0]
    good = drive(ep, [call(dict(messages=[{"role": "user", "content": "x"}]), url)], running=False)[0]
    assert isinstance(bad, openai.BadRequestError) and isinstance(good, openai.BadRequestError)
    assert "this episode has ended: messages[0]" in good.body["message"]
    assert ep.close(key).error.startswith("messages[0]")


def test_completions_take_text_or_token_ids_and_a_call_past_the_episode_limit_is_refused(served, tiny):
    ep, tok = served, tiny.tokenizer
    ep.limits.max_calls = 2
    key, url = ep.open({})
    ids = encode(tok, "<|user|>1+1<|assistant|>")

    def agent():
        c = client(url)
        first = c.completions.create(model="m", prompt=ids, max_tokens=3)
        second = c.completions.create(model="m", prompt=tok.decode(ids) + "2")  # not a continuation: not recorded
        try:
            c.completions.create(model="m", prompt="x")
        except openai.BadRequestError as e:
            return first, second, e

    first, second, third = drive(ep, [agent])[0]
    record = ep.close(key)
    assert first.choices[0].text == tok.decode(record.episode.ids, skip_special_tokens=True)
    assert record.episode.prompt == ids and record.breaks == 1 and second.usage.prompt_tokens == len(ids) + 1
    assert "more than 2 calls in one episode" in third.body["message"] and third.body["code"] == "too_many_calls"


def test_stream_true_gets_the_same_answer_as_server_sent_events(served, tiny):
    ep = served

    def agent():
        c = client(ep.url + "/v1")
        ask = dict(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=6, temperature=0.0)
        whole = c.chat.completions.create(**ask)
        parts = list(c.chat.completions.create(**ask, stream=True))
        ask = dict(model="m", prompt="1+1", max_tokens=4, temperature=0.0)
        return whole, parts, c.completions.create(**ask), list(c.completions.create(**ask, stream=True))

    whole, parts, one, text = drive(ep, [agent], running=False)[0]
    streamed = "".join(p.choices[0].delta.content or "" for p in parts)
    assert streamed == whole.choices[0].message.content  # greedy: the same answer, whole or streamed
    assert parts[0].choices[0].delta.role == "assistant"
    assert parts[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert parts[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert "".join(t.choices[0].text for t in text) == one.choices[0].text
    assert text[-1].choices[0].finish_reason == one.choices[0].finish_reason


def test_an_agent_that_ignores_refusals_is_slowed_to_a_call_a_second(served):
    ep = served
    key, url = ep.open({})

    def agent():
        c, refused = client(url), 0
        for _ in range(3):  # the first call is malformed and ends the episode; the next two are refused slowly
            try:
                c.chat.completions.create(model="m", messages=[{"role": "wizard", "content": "x"}])
            except openai.BadRequestError:
                refused += 1
        return refused

    ended = time.monotonic()
    assert drive(ep, [agent], running=False)[0] == 3
    assert time.monotonic() - ended >= 2 * ep.ENDED_DELAY_S  # a lower bound the server's sleep guarantees
    assert ep.close(key).error.startswith("messages[0]")


def hold_first_decode(ep: Endpoint, release: threading.Event, requests: int = 1, answered=None) -> None:
    """Make the tiny model's decode wait for the test, so what joins it does not depend on timing:
    before its first step the decode sets ``release`` (the agents that were holding back send now) and
    waits until ``requests`` requests are queued; once ``ep`` has answered one, it waits (between its
    steps) for ``answered`` (the client holding that answer) before it goes on."""
    state = {"first": True}

    def hook(engine) -> None:
        until = time.monotonic() + 30
        if state["first"]:
            state["first"] = False
            release.set()
            while ep.inbox.qsize() < requests and time.monotonic() < until:
                time.sleep(0.005)
        elif answered is not None and ep.answered >= 1:
            answered.wait(30)

    ep.engine.between_steps = hook


def test_a_request_sent_during_a_long_decode_joins_it_and_is_answered_before_it_ends(served):
    ep = served
    ep.limits.max_new_tokens, ep.JOIN_S = 64, 0.0  # joins at the first step after it arrives
    release, short_back, order = threading.Event(), threading.Event(), []
    hold_first_decode(ep, release, answered=short_back)
    ask = dict(model="m", messages=[{"role": "user", "content": "long"}], temperature=0.0)

    def long():  # greedy on the tiny model: no EOS in 48 tokens, so it runs to its max_tokens
        reply = client(ep.url + "/v1").chat.completions.create(**ask, max_tokens=48)
        order.append("long")
        return reply

    def short():
        release.wait(30)
        reply = client(ep.url + "/v1").chat.completions.create(**{**ask, "max_tokens": 2})
        order.append("short")
        short_back.set()
        return reply

    def other():  # other sampling settings: held for the next decode (or in it), never joined
        short_back.wait(30)
        return client(ep.url + "/v1").chat.completions.create(**{**ask, "max_tokens": 2, "temperature": 1.0})

    decodes = ep.decodes
    got = drive(ep, [long, short, other], running=False)
    assert not any(isinstance(g, Exception) for g in got), got
    assert order == ["short", "long"]  # the long decode could not end before the short answer was back
    assert got[0].usage.completion_tokens == 48 and got[0].choices[0].finish_reason == "length"
    assert got[1].usage.completion_tokens == 2 and got[2].usage.completion_tokens <= 2
    assert ep.decodes - decodes == 2  # long + short in one decode, the other settings in the next


def test_calls_that_join_a_running_decode_are_recorded_token_exactly(served, tiny):
    ep, tok = served, tiny.tokenizer
    ep.forced, ep.limits.max_new_tokens, ep.JOIN_S = (0.9, 1.0), 64, 0.0
    release = threading.Event()
    hold_first_decode(ep, release)
    (ka, ua), (kb, ub) = ep.open({"prompt": "a"}), ep.open({"prompt": "b"})

    def a():
        return client(ua).chat.completions.create(model="m", messages=[{"role": "user", "content": "long"}])

    def b():  # its first call joins a's decode (which waits for it); its second may join too
        release.wait(30)
        c, messages = client(ub), [{"role": "user", "content": "hi"}]
        first = c.chat.completions.create(model="m", messages=messages, max_tokens=4)
        messages += [first.choices[0].message, {"role": "user", "content": "more"}]
        return first, c.chat.completions.create(model="m", messages=messages, max_tokens=4)

    decodes = ep.decodes
    got = drive(ep, [a, b])
    assert not any(isinstance(g, Exception) for g in got), got
    assert ep.decodes - decodes <= 2  # 3 calls: b's first shared a's decode
    ra, rb = ep.close(ka), ep.close(kb)
    assert ra.calls == 1 and rb.calls == 2 and ra.breaks == rb.breaks == 0
    assert len(rb.episode.ends) == 2
    batch = assemble([ra.episode, rb.episode], [{"prompt": "a"}, {"prompt": "b"}], 1, tok, 0)
    m = batch.completion_mask
    with torch.no_grad():
        logp, _ = completion_logprobs(tiny.model, batch, temperature=0.9)
    assert (batch.sampler_logp[m] < 0).all()
    assert (logp[m] - batch.sampler_logp[m]).abs().max() < 1e-5


def test_rows_fed_into_a_running_decode_draw_what_they_draw_alone_and_come_back_as_they_end(tiny):
    """The engine's side (FastRollout.sample_feed): rows fed between decode steps, one whose prompt is
    longer than the columns decoded so far (it wraps the ring) and one that needs a wider ring, draw
    greedily what ``sample_ids`` draws for each alone, and each is handed back the moment it ends."""
    engine, tok = FastRollout(tiny.model, tiny.tokenizer, torch.float32), tiny.tokenizer
    rows = [(encode(tok, "hello there"), 40), (encode(tok, "a"), 3), (encode(tok, "x" * 50), 4),
            (encode(tok, "some longer prompt"), 90)]
    polls, ended = [], {}

    def feed(room):
        polls.append(room)
        return {1: rows[:1], 5: rows[1:3], 7: rows[3:]}.get(len(polls), [])

    def done(i, ids, logps, how):
        ended[i] = (ids, how, len(polls))

    assert engine.sample_feed(feed, done, 0.0, 1.0) == 4 and polls[0] is None
    for i, (ids, n) in enumerate(rows):
        alone = engine.sample_ids([ids], 0.0, 1.0, n, [])[0]
        assert ended[i][:2] == (alone[0], alone[2]) and len(alone[0]) == n  # greedy, no EOS: to its length
    assert ended[1][2] < ended[0][2] < ended[3][2]  # the 3-token row back while the first still decodes


def test_the_text_returned_ends_before_its_stop_string_and_the_episode_keeps_every_token():
    # OpenAI and vLLM return the text up to the stop string, not with it; training keeps the tokens as drawn
    tok = load_tokenizer("tiny")
    drawn = encode(tok, "cccj")

    class Scripted:
        eos_set = {tok.eos_token_id}

        def __init__(self):
            self.tok = tok

        def sample_ids(self, seqs, temperature, top_p, max_new_tokens, stops):
            assert stops == ["j"]
            return [(list(drawn), [-0.5] * len(drawn), "stop") for _ in seqs]

    ep = Endpoint(Scripted(), Limits(max_new_tokens=16, context=256, max_calls=4, max_episode_tokens=200))
    ep.start()
    key, url = ep.open({})
    agent = lambda: client(url).completions.create(model="m", prompt="abc", max_tokens=8, stop=["j"])  # noqa: E731
    try:
        done = drive(ep, [agent])[0]
    finally:
        ep.stop()
    assert done.choices[0].text == "ccc" and done.choices[0].finish_reason == "stop"
    assert ep.close(key).episode.ids[-len(drawn):] == drawn


def test_logprobs_are_the_drawn_tokens_and_end_with_the_text_returned():
    """logprobs: true (chat) and logprobs: 0 (completions) give each returned token's text and the log-prob the
    sampler drew it with; the tokens stop where the text does (before the stop string), whole or streamed."""
    tok = load_tokenizer("tiny")
    drawn = encode(tok, "cccj")
    logps = [-0.25 * (i + 1) for i in range(len(drawn))]

    class Scripted:
        eos_set = {tok.eos_token_id}

        def __init__(self):
            self.tok = tok

        def sample_ids(self, seqs, temperature, top_p, max_new_tokens, stops):
            return [(list(drawn), list(logps), "stop") for _ in seqs]

    ep = Endpoint(Scripted(), Limits(max_new_tokens=16, context=256))
    ep.start()

    def agent():
        c = client(ep.url + "/v1")
        one = c.completions.create(model="m", prompt="abc", max_tokens=8, stop=["j"], logprobs=0)
        chat = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], logprobs=True,
                                         stop=["j"])
        parts = list(c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], logprobs=True,
                                               stop=["j"], stream=True))
        plain = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        return one, chat, parts, plain

    try:
        one, chat, parts, plain = drive(ep, [agent], running=False)[0]
    finally:
        ep.stop()
    kept = len(encode(tok, "ccc"))
    lp = one.choices[0].logprobs
    assert "".join(lp.tokens) == one.choices[0].text == "ccc" and lp.token_logprobs == logps[:kept]
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(kept)]
    content = chat.choices[0].logprobs.content
    assert "".join(t.token for t in content) == chat.choices[0].message.content == "ccc"
    assert [t.logprob for t in content] == logps[:kept] and content[0].bytes == list(content[0].token.encode())
    assert [t.logprob for t in parts[0].choices[0].logprobs.content] == logps[:kept]
    assert plain.choices[0].logprobs is None


def test_what_the_sampler_does_not_keep_or_cannot_fit_is_refused_when_served_alone(served):
    ep = served
    hi = [{"role": "user", "content": "hi"}]
    cases = [
        (dict(messages=hi, logprobs=True, top_logprobs=3), "top_logprobs: the sampler keeps the log-prob of the token"),
        (dict(messages=hi, top_logprobs=3), "top_logprobs: needs logprobs: true"),
        (dict(messages=hi, logprobs="yes"), "logprobs: expected true or false"),
        (dict(prompt="1+1", logprobs=2), "logprobs: the sampler keeps the log-prob of the token it drew"),
        (dict(prompt="a" * 250, max_tokens=8), "max_tokens: the prompt's 250 tokens and 8 more pass the model's "
                                               "context of 256; ask for at most 6"),
    ]

    def call(kwargs):
        def run():
            c = client(ep.url + "/v1")
            return (c.chat.completions.create if "messages" in kwargs else c.completions.create)(model="m", **kwargs)
        return run

    for (_, expected), result in zip(cases, drive(ep, [call(kw) for kw, _ in cases], running=False)):
        assert isinstance(result, openai.BadRequestError) and expected in result.body["message"], result
    # more than the cap: drawn up to it, said once on the server's console; in an episode the run's cap lowers it
    # silently, as agents written for bigger models ask for more
    key, url = ep.open({})
    ok = drive(ep, [lambda: client(url).chat.completions.create(model="m", messages=hi, max_tokens=1000)])[0]
    assert ok.usage.completion_tokens <= 8
    ep.close(key)
