"""Agents for tests/roles/test_rollout_agent.py: fn(client, row) against the run's endpoint, good and hostile."""

import time


def two_calls(client, row):
    """Two chat calls, the second continuing the first; rewards one per call."""
    messages = [{"role": "user", "content": row["prompt"]}]
    first = client.chat.completions.create(model="policy", messages=messages, max_tokens=4)
    messages += [first.choices[0].message, {"role": "user", "content": "again"}]
    client.chat.completions.create(model="policy", messages=messages, max_tokens=4)
    return [0.25, 1.0]


def one_call(client, row):
    reply = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}])
    return float("a" in reply.choices[0].message.content)


def transcript(client, row):
    messages = [{"role": "user", "content": row["prompt"]}]
    reply = client.chat.completions.create(model="policy", messages=messages)
    return messages + [{"role": "assistant", "content": reply.choices[0].message.content}]


def never_calls(client, row):
    return 1.0


def calls_forever(client, row):
    while True:
        try:
            client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "again"}])
        except Exception:  # the endpoint refuses past task.max_turns; this agent keeps on
            pass


def malformed(client, row):
    client.chat.completions.create(model="policy", messages=[{"role": "wizard", "content": 3}])
    return 1.0


def too_long(client, row):
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "a" * 400}])
    return 1.0


def sleeps(client, row):
    time.sleep(60)
    return 1.0


def raises(client, row):
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}])
    raise RuntimeError("the agent broke")


def by_row(client, row):
    """The agent row['agent'] names: one batch holds good and hostile episodes."""
    return globals()[row["agent"]](client, row)


def wrong_count(client, row):
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": row["prompt"]}])
    return [1.0, 1.0, 1.0]


def rewrites_history(client, row):
    """Each call a fresh conversation: served, but no call continues the one before."""
    for text in ("one", "two"):
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": text}])
    return 1.0


def last_word(text, row):
    """A verifier for transcript agents: 1 when the reply holds the row's answer."""
    return float(row["answer"] in text), {"correct": row["answer"] in text}
