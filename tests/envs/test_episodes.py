"""Environment episodes (roles/rollout_env.py, envs/pool.py): chat turns token-exact with the mask
turn by turn, and environments that hang, raise, die or return garbage ending only their episode."""

import copy
import sys

import pytest
import torch

from rlpost.envs.pool import EnvPool
from rlpost.envs.transcript import TemplateError, chat_delta, encode, render
from rlpost.model.load import load_tokenizer
from rlpost.rewards.episodes import EpisodeReward
from rlpost.roles.rollout_env import EnvRollout
from rlpost.types.errors import ConfigError


class Scripted:
    """A sampler that replays fixed turns (token ids, how each ended), recording what it continued."""

    version = 0

    def __init__(self, tok, turns):
        self.tok, self.turns, self.seen = tok, list(turns), []
        self.eos_set = {tok.eos_token_id}

    def sample_ids(self, seqs, temperature, top_p, max_new_tokens, stops):
        self.seen.append([list(s) for s in seqs])
        ids, how = self.turns.pop(0)
        return [(ids[:max_new_tokens], [-0.25] * len(ids[:max_new_tokens]), how)] * len(seqs)

    def close(self):
        pass


def rollout(sampler, env="toy_envs:Counter", turns=4, tokens=400, timeout=30.0, **kwargs):
    return EnvRollout(sampler, EnvPool(env, kwargs, timeout, workers=2), turns, tokens)


def test_chat_turns_are_token_exact_with_environment_tokens_masked_turn_by_turn():
    tok = load_tokenizer("embedded")
    eos = tok.eos_token_id  # <|im_end|>, what ChatML ends an assistant message with
    # Turn 1 drawn in a NON-canonical tokenisation (character by character), so re-encoding the
    # text would change the ids; turn 2 is cut by max_new_tokens (no end token drawn); turn 3 ends.
    t1 = [tok.convert_tokens_to_ids(c) for c in "hello"] + [eos]
    t2 = encode(tok, "again and")
    t3 = encode(tok, "done") + [eos]
    assert t1[:-1] != encode(tok, "hello")
    sampler = Scripted(tok, [(t1, "eos"), (t2, "length"), (t3, "eos")])
    ro = rollout(sampler, turns=3)
    try:
        batch = ro.generate([{"q": 1}], n=2, temperature=1.0, top_p=1.0, max_new_tokens=64)
    finally:
        ro.close()
    prompt = encode(tok, render(tok, [{"role": "user", "content": "count"}], None, True))
    # what the template writes after each assistant message: ChatML's newline, the user's turn,
    # the next generation prompt; after the cut turn, first the end token it never drew
    d1 = encode(tok, "\n<|im_start|>user\nturn 1<|im_end|>\n<|im_start|>assistant\n")
    d2 = encode(tok, "<|im_end|>\n<|im_start|>user\nturn 2<|im_end|>\n<|im_start|>assistant\n")
    expected = t1 + d1 + t2 + d2 + t3
    model = [True] * len(t1) + [False] * len(d1) + [True] * len(t2) + [False] * len(d2) + [True] * len(t3)
    ends = [len(t1) - 1, len(t1 + d1 + t2) - 1, len(expected) - 1]
    for b in range(2):
        n = len(expected)
        assert batch.completion_ids[b, :n].tolist() == expected
        assert batch.completion_mask[b].tolist() == model  # token by token
        assert batch.sampler_logp[b].tolist() == [-0.25 if m else 0.0 for m in model]
        assert batch.turn_end[b].nonzero().squeeze(1).tolist() == ends
        assert batch.turn_reward[b, ends].tolist() == [1.0, 2.0, 3.0]
        assert batch.turn_reward[b].sum() == 6.0
    # each turn continued from exactly the prompt and every id before it, model and environment
    assert sampler.seen == [[prompt] * 2, [prompt + t1 + d1] * 2, [prompt + t1 + d1 + t2 + d2] * 2]
    assert batch.prompt_ids[0][batch.prompt_mask[0]].tolist() == prompt
    # the whole episode is what the chat template renders for the conversation
    history = [{"role": "user", "content": "count"}]
    for turn, said in (("hello", "turn 1"), ("again and", "turn 2"), ("done", None)):
        history += [{"role": "assistant", "content": turn}] + ([{"role": "user", "content": said}] if said else [])
    assert tok.decode(prompt + expected) + "\n" == render(tok, history, None, False)
    assert not batch.truncated.any() and batch.episodes[0]["stop"] == "done" and batch.episodes[0]["tool_calls"] == 3
    reward, infos, metrics = EpisodeReward(gamma=0.5).score(batch)
    assert reward.tolist() == [1 + 0.5 * 2 + 0.25 * 3] * 2  # the discounted return, by hand
    assert infos[0]["correct"] and metrics["env/turns_mean"] == 3 and metrics["env/turn_reward/mean"] == 2.0


def test_limits_end_an_episode_and_the_last_turn_is_still_scored():
    tok = load_tokenizer("embedded")
    t = encode(tok, "guess") + [tok.eos_token_id]
    sampler = Scripted(tok, [(t, "eos")] * 2)
    ro = rollout(sampler, turns=2)  # the environment would go on for 3
    try:
        batch = ro.generate([{"q": 1}], n=1, temperature=1.0, top_p=1.0, max_new_tokens=64)
    finally:
        ro.close()
    assert batch.episodes[0]["turns"] == 2 and batch.episodes[0]["stop"] == "max_turns" and batch.truncated.all()
    assert batch.episodes[0]["turn_rewards"] == [1.0, 2.0]  # the second turn went to step; its answer was not appended
    assert (batch.completion_ids.shape[1]
            == len(t) + len(encode(tok, "\n<|im_start|>user\nturn 1<|im_end|>\n<|im_start|>assistant\n")) + len(t))


@pytest.mark.parametrize("fault,kind", [("hang", "timeouts"), ("raise", "errors"), ("exit", "errors"),
                                        ("garbage", "errors"), ("nan", "errors"), ("unpicklable", "errors")])
def test_a_failing_environment_ends_only_its_episode_with_reward_zero(fault, kind):
    tok = load_tokenizer("embedded")
    t = encode(tok, "x") + [tok.eos_token_id]
    sampler = Scripted(tok, [(t, "eos")] * 3)
    ro = rollout(sampler, env="toy_envs:Faulty", turns=3, timeout=1.0)
    try:
        batch = ro.generate([{"fault": fault}, {"fault": ""}], n=2, temperature=1.0, top_p=1.0, max_new_tokens=8)
    finally:
        ro.close()
    reward, infos, metrics = EpisodeReward().score(batch)
    assert reward.tolist() == [0.0, 0.0, 6.0, 6.0]  # the faulty row's episodes scored 0, the others untouched
    assert [i["stop"] for i in infos] == ["error", "error", "done", "done"] and not infos[0]["correct"]
    assert metrics[f"env/{kind}"] == 2 and metrics["env/errors"] + metrics["env/timeouts"] == 2
    assert batch.completion_mask[:2].sum(1).tolist() == [len(t)] * 2  # the one turn drawn stays, with no more after it


def test_a_missing_environment_is_one_line_before_any_model_loads():
    with pytest.raises(ConfigError, match=r"^task.env: cannot import 'toy_envs:Nope' \(AttributeError"):
        EnvPool("toy_envs:Nope", {}, 5.0)
    with pytest.raises(ConfigError, match=r"'module:Class'"):
        EnvPool("no_colon", {}, 5.0)


def test_an_object_of_the_environment_module_never_imports_it_here(capsys):
    # the trainer unpickles replies with no class allowed: an info object arrives as its repr; a message
    # whose content is a str of the module's own class ends its episode, in one line naming that class
    tok = load_tokenizer("embedded")
    t = encode(tok, "x") + [tok.eos_token_id]
    ro = rollout(Scripted(tok, [(t, "eos")]), env="toy_info_object:Env", turns=1)
    try:
        batch = ro.generate([{"leak": False}, {"leak": True}], n=1, temperature=1.0, top_p=1.0, max_new_tokens=8)
    finally:
        ro.close()
    assert "toy_info_object" not in sys.modules
    reward, infos, metrics = EpisodeReward().score(batch)
    assert reward.tolist() == [1.0, 0.0] and [i["stop"] for i in infos] == ["done", "error"] and infos[0]["correct"]
    assert metrics["env/errors"] == 1
    said = [line for line in capsys.readouterr().err.splitlines() if "environment toy_info_object:Env" in line]
    assert len(said) == 1 and "the reply holds a toy_info_object.Text object" in said[0], said


def test_a_template_that_rewrites_earlier_turns_is_refused():
    tok = copy.deepcopy(load_tokenizer("embedded"))
    history = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "ab"}]
    assert (chat_delta(tok, history, [{"role": "user", "content": "b"}], None, ["<|im_end|>"], closed=True)
            .startswith("\n<|im_start|>user"))
    # earlier messages shortened to their first character: "q|ab|" becomes "q|a|bb|" once a turn follows
    tok.chat_template = "{% for m in messages %}{{ m['content'] if loop.last else m['content'][:1] }}|{% endfor %}"
    with pytest.raises(TemplateError, match="prefix-stable"):
        chat_delta(tok, history, [{"role": "user", "content": "bb"}], None, ["|"], closed=True)


def test_episode_scoring_counts_and_credits_by_hand():
    batch = type("B", (), {})()
    batch.episodes = [{"turns": 2, "turn_rewards": [0.5, 1.0], "tool_calls": 1, "stop": "done"},
                      {"turns": 1, "turn_rewards": [0.0], "tool_calls": 0, "stop": "error", "error": "boom",
                       "timeout": False},
                      {"turns": 0, "turn_rewards": [], "tool_calls": 0, "stop": "error", "error": "t", "timeout": True}]
    reward, infos, m = EpisodeReward(gamma=0.9).score(batch)
    assert torch.allclose(reward, torch.tensor([0.5 + 0.9, 0.0, 0.0]))
    assert [i["correct"] for i in infos] == [True, False, False]
    assert (m["env/errors"], m["env/timeouts"], m["env/episodes"]) == (1, 1, 3)
    assert m["env/turn_reward/mean"] == pytest.approx(1.5 / 3) and m["env/turns_mean"] == 1.0
    assert m["env/turn_reward/first"] == pytest.approx(0.25) and m["env/turn_reward/last"] == pytest.approx(0.5)


@pytest.mark.parametrize("renders_tools", [False, True])
def test_a_chat_template_that_ignores_the_tools_is_said_once(capsys, renders_tools, monkeypatch):
    from rlpost import console

    monkeypatch.setattr(console, "_said", set())  # said once a process: as if this were the first run
    # the tiny model's template, like SmolLM2's, renders nothing for tools=: the model never sees them
    tok = copy.deepcopy(load_tokenizer("tiny"))
    if renders_tools:
        tok.chat_template = "{% if tools %}{{ tools | tojson }}{% endif %}" + tok.chat_template
    env = rollout(Scripted(tok, [(encode(tok, "ab") + [tok.eos_token_id], "eos")] * 3), env="toy_envs:WithTools",
                  turns=1)
    try:
        env.generate([{"i": 0}, {"i": 1}], n=2, temperature=1.0, top_p=1.0, max_new_tokens=8)
        env.generate([{"i": 2}], n=1, temperature=1.0, top_p=1.0, max_new_tokens=8)
    finally:
        env.close()
    said = [line for line in capsys.readouterr().err.splitlines() if "renders nothing of the environment" in line]
    assert said == ([] if renders_tools else [
        "rlpost: task.env: the chat template of this model renders nothing of the environment's 1 tool, so the model "
        "is never shown it and will make no tool calls; use a model whose template renders tools (Qwen2.5-Instruct, "
        "Llama-3.1-Instruct, ...), or an environment in the inline style (style='inline' with its stop strings: "
        "docs/environments.md)"])


def test_each_row_logs_its_episodes_whole_opening_and_tools():
    tok = load_tokenizer("tiny")
    env = rollout(Scripted(tok, [(encode(tok, "ab") + [tok.eos_token_id], "eos")]), env="toy_envs:WithTools", turns=1)
    try:
        batch = env.generate([{"i": 0, "messages": [{"role": "user", "content": "from the data"}]}], n=1,
                             temperature=1.0, top_p=1.0, max_new_tokens=8)
    finally:
        env.close()
    row = batch.rows[0]
    assert row["messages"] == [{"role": "user", "content": "from the data"}]  # the row's own, as it was
    assert row["_opening"] == [{"role": "user", "content": "count"}]  # what reset gave the model
    assert [t["function"]["name"] for t in row["_tools"]] == ["add"]
