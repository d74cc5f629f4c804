"""verifiers 0.4 environments (envs/verifiers_env.py): an installed taskset, loaded by id, runs its own
episodes (verifiers' harness, its MCP tools) against the run's OpenAI endpoint; its reward reaches the
trainer as the taskset computed it, and a reward that raises is a counted error with reward 0."""

import json
import os
import threading
import time

import pytest
from helpers import TINY, cli

pytest.importorskip("verifiers.v1", reason="pip install 'rlpost[verifiers]'")


def no_downloads(tmp_path, monkeypatch, home: bool = False):
    """uv, pip, curl and wget stand-ins first on PATH that log their call and fail: verifiers gives a harness's
    program an environment of its own with uv, installing uv itself (pip install --user, else curl or wget) where
    it finds none, and the program's packages; rlpost runs its chat program on its own interpreter, so none of
    them may run. ``home``: $HOME a bare folder too (where verifiers looks for uv), for a test in this process."""
    fake = tmp_path / "fake-bin"
    fake.mkdir()
    for name in ("uv", "pip", "curl", "wget"):
        (fake / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {tmp_path}/downloads.log\nexit 1\n')
        (fake / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    if home:
        monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path / "downloads.log"


def by_hand(reply: str, prompt: str) -> float:
    """tests/vf_toy.py's reward, worked out again: 1 for the sum in the reply, else len(reply) % 4 quartered."""
    a, b = int(prompt.split()[2]), int(prompt.split()[4].rstrip("?"))
    return 1.0 if str(a + b) in reply else (len(reply) % 4) / 4


@pytest.mark.slow  # ~40 s (2 cores): two workers import verifiers; its harness program is a process an episode
def test_a_verifiers_taskset_trains_end_to_end_and_its_reward_reaches_the_trainer(tmp_path, monkeypatch):
    downloads = no_downloads(tmp_path, monkeypatch)
    log = tmp_path / "scored.jsonl"
    args = f"{{taskset: {{kind: tool, task: {{log: {log}, fail_odd: true}}}}, heldout: {{split: test}}}}"
    r = cli("train", *TINY, "task.name=env", "task.env=verifiers:vf_toy", f"task.env_args={args}",
            "rollout.prompts_per_step=2", "rollout.group_size=2", "task.n_train=8", "task.n_heldout=2",
            "task.env_workers=2", "task.max_reward_error_frac=1", f"run.out_dir={tmp_path}", "run.name=r")
    assert r.returncode == 0, r.stderr
    scored = [json.loads(line) for line in log.read_text().splitlines()]
    heldout = [s for s in scored if int(s["prompt"].split()[2]) >= 10]  # heldout: {split: test}: sums from 10
    train = [s for s in scored if s not in heldout]
    assert len(heldout) == 4 and len(train) == 8  # 2 problems before and after; 2 steps of 2 x 2 episodes
    for s in train + heldout:  # what the taskset computed is its reward, by hand; null where it raised
        assert s["reward"] is None or s["reward"] == by_hand(s["reply"] or "", s["prompt"]), s
    metrics = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    for step, m in enumerate(metrics[:2]):
        mine = train[4 * step: 4 * step + 4]  # a step's episodes all end before the next step's start
        failed = sum(s["reward"] is None for s in mine)
        assert m["env/episodes"] == 4 and m["env/errors"] == failed and m["env/timeouts"] == 0
        # the failed ones count 0 and the rest trains
        assert m["reward/mean"] == pytest.approx(sum(s["reward"] or 0 for s in mine) / 4)
        assert m["agent/prefix_breaks"] == 0 and m["actor/optimizer_steps"] == 1
    assert sum(m["env/errors"] for m in metrics[:2]) > 0  # the seed's rows have odd addends: the raise was met
    assert "environment verifiers:vf_toy failed (the first error" in r.stderr
    assert "the reward broke on an odd addend" in r.stderr
    assert not downloads.exists()


@pytest.mark.parametrize("env, args, expected", [
    ("no_such_taskset", "", "taskset 'no_such_taskset' not found"),
    # verifiers' own config errors (pydantic's several-line block): one line naming task.env_args and the field
    ("vf_toy", "{taskset: {nonsense: 1}}", "task.env_args: taskset.nonsense: Extra inputs are not permitted (got 1)"),
    ("vf_toy", "{agent: {max_turns: lots}}", "task.env_args: agent.max_turns: Input should be a valid integer"),
    ("vf_toy", "{heldout: {split: 3}}", "task.env_args (with heldout's fields): taskset.split: Input should be"),
    ("vf_toy", "{heldout: test}", "task.env_args: heldout is taskset fields, a mapping like '{split: test}'"),
    ("vf_toy", "{agent: {harness: {id: no_such_harness}}}",
     "task.env_args: harness 'no_such_harness' not found (tried to import 'no_such_harness'); verifiers has bash"),
])
def test_an_unknown_taskset_or_bad_env_args_is_one_line_at_start(tmp_path, env, args, expected):
    r = cli("train", *TINY, "task.name=env", f"task.env=verifiers:{env}", f"task.env_args={args}",
            f"run.out_dir={tmp_path}")
    assert r.returncode == 2 and expected in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlpost: error: task.env: ") and "Traceback" not in r.stderr, lines
    assert not any(tmp_path.iterdir())


class Scripted:
    """An OpenAI-compatible server that answers with a call of the first tool offered (add(2, 3)),
    then, once the tool's result is in, with '5'; it keeps the requests."""

    def __init__(self):
        import uvicorn
        from starlette.applications import Starlette
        from starlette.responses import StreamingResponse
        from starlette.routing import Route

        from rlpost.roles.openai_body import chunks

        self.requests = []

        async def chat(request):
            body = await request.json()
            self.requests.append(body)
            message = {"role": "assistant", "content": "5"}
            if body.get("tools") and body["messages"][-1]["role"] != "tool":
                call = {"name": body["tools"][0]["function"]["name"], "arguments": json.dumps({"a": 2, "b": 3})}
                message = {"role": "assistant", "content": "", "tool_calls": [{"id": "c0", "type": "function",
                                                                                "function": call}]}
            reply = {"id": "x", "object": "chat.completion", "created": int(time.time()), "model": "m",
                     "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                     "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
            events = [f"data: {json.dumps(c)}\n\n" for c in chunks(reply)] + ["data: [DONE]\n\n"]
            return StreamingResponse(iter(events), media_type="text/event-stream")

        app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.server.servers[0].sockets[0].getsockname()[1]}/v1"

    def stop(self):
        self.server.should_exit = True
        self.thread.join()


@pytest.mark.slow  # ~10 s: verifiers' import, its tool server, its harness program
def test_a_tool_call_goes_through_verifiers_harness_and_its_result_comes_back(tmp_path, monkeypatch):
    import openai

    from rlpost.envs.verifiers_env import VerifiersEnv, agent

    rows = VerifiersEnv("vf_toy", taskset={"kind": "tool"}).rows("train", 2, 0)
    train, held = VerifiersEnv("vf_toy").rows("train", 100, 0), VerifiersEnv("vf_toy").rows("heldout", 100, 0)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held}  # no heldout: halves of one shuffle
    downloads = no_downloads(tmp_path, monkeypatch, home=True)
    server, episodes = Scripted(), None
    try:
        episodes = agent("vf_toy", max_turns=3, taskset={"kind": "tool"})
        client = openai.OpenAI(base_url=server.url, api_key="x")
        rewards = [episodes(client, row) for row in rows]
    finally:
        if episodes is not None:
            episodes.close()
        server.stop()
    assert rewards == [by_hand("5", row["prompt"]) for row in rows]  # the reply after the tool's result
    first, second = server.requests[:2]
    assert [t["function"]["name"] for t in first["tools"]] == ["calc_add"]  # the taskset's tool, as OpenAI's
    assert first["messages"] == [{"role": "user", "content": rows[0]["prompt"]}]
    assert second["messages"][-1]["role"] == "tool" and second["messages"][-1]["content"] == "5"  # add(2, 3) ran
    assert len(server.requests) == 4  # two model turns an episode
    assert not downloads.exists()  # the chat program ran on this interpreter
