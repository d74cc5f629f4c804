"""The tools environment (task.name=tools): the calculator, token-exact inline episodes and the mask, token by token."""

import torch

from rlpost.envs import tools
from rlpost.envs.pool import EnvPool
from rlpost.model.load import load_policy, load_tokenizer
from rlpost.roles.rollout_env import EnvRollout
from rlpost.roles.rollout_hf import HFRollout


def test_calculator():
    assert tools.calculator("347*29") == "10063"
    assert tools.calculator(" (2 + 3) ^ 2 ") == "25"
    assert tools.calculator("7/2") == "3.5"
    assert tools.calculator("8/2") == "4"
    assert tools.calculator("__import__('os')").startswith("error")
    assert tools.calculator("2**100000").startswith("error")
    assert tools.calculator("1/0").startswith("error")


def test_observe_and_score():
    assert tools.observe("let me see <calculator>3*4</calculator>", {"calculator"}) == "\n<result>12</result>\n"
    assert tools.observe("no call here", {"calculator"}) is None
    assert "not available" in tools.observe("<python>print(1)</python>", {"calculator"})
    row = {"answer": "12"}
    assert tools.score("<calculator>3*4</calculator>\n<result>12</result>\nThe answer is 12.", row)[0] == 1.0
    # the tool's output alone is not an answer: nothing after the last result
    assert tools.score("<calculator>3*4</calculator>\n<result>12</result>\n", row)[0] == 0.0


class Scripted:
    """A sampler that replays fixed token ids, recording what it was asked to continue."""

    version = 0

    def __init__(self, tok, turns):
        self.tok, self.turns, self.seen, self.stops = tok, list(turns), [], []
        self.eos_set = {tok.eos_token_id}

    def sample_ids(self, seqs, temperature, top_p, max_new_tokens, stops):
        self.seen.append([list(s) for s in seqs])
        self.stops.append(stops)
        ids, how = self.turns.pop(0)
        return [(ids[:max_new_tokens], [-0.25] * len(ids[:max_new_tokens]), how)] * len(seqs)

    def close(self):
        pass


def episodes(sampler, rows, n, max_turns=4, max_tokens=200):
    """The tools environment's episodes on the scripted sampler (the rollout of task.name=tools)."""
    ro = EnvRollout(sampler, EnvPool("rlpost.envs.tools:Tools", {"tools": "calculator"}, 30.0, workers=1), max_turns,
                    max_tokens)
    try:
        return ro.generate(rows, n=n, temperature=1.0, top_p=1.0, max_new_tokens=64)
    finally:
        ro.close()


def test_episode_is_token_exact_and_masks_tool_tokens():
    tok = load_tokenizer("embedded")
    # Turn 1 is drawn in a NON-canonical tokenisation (character by character): re-encoding the
    # text would give different ids, so only a token-exact assembly keeps these.
    call = ([tok.convert_tokens_to_ids(c) for c in "<calculator>"]
            + tok("347*29</calculator>", add_special_tokens=False).input_ids)
    final = tok("The answer is 10063.", add_special_tokens=False).input_ids + [tok.eos_token_id]
    assert call != tok(tok.decode(call), add_special_tokens=False).input_ids  # the drift we must avoid
    sampler = Scripted(tok, [(call, "stop"), (final, "eos")])
    rows = [{"messages": [{"role": "user", "content": "What is 347 * 29?"}], "answer": "10063"}]
    batch = episodes(sampler, rows, n=2)

    obs = tok("\n<result>10063</result>\n", add_special_tokens=False).input_ids
    prompt = tok(tok.apply_chat_template(rows[0]["messages"], add_generation_prompt=True, tokenize=False),
                 add_special_tokens=False).input_ids
    expected = call + obs + final
    for b in range(2):
        n = len(expected)
        assert batch.completion_ids[b, :n].tolist() == expected
        mask = batch.completion_mask[b].tolist()
        assert mask[:n] == [True] * len(call) + [False] * len(obs) + [True] * len(final)  # token by token
        assert not any(mask[n:])
        logp = batch.sampler_logp[b, :n].tolist()
        assert logp == [-0.25] * len(call) + [0.0] * len(obs) + [-0.25] * len(final)
    # the second turn continued from exactly prompt + drawn ids + observation ids, stopping at the tools' closing tags
    assert sampler.seen[1][0] == prompt + call + obs and sampler.stops[0] == sorted(tools.STOPS)
    assert batch.prompt_ids[0][batch.prompt_mask[0]].tolist() == prompt
    assert tools.score(batch.completions[0], rows[0])[0] == 1.0
    assert batch.episodes[0]["turn_rewards"] == [0.0, 1.0] and batch.episodes[0]["tool_calls"] == 1
    assert not batch.truncated.any()
    assert sampler.turns == []


def test_episode_limits_end_unfinished():
    tok = load_tokenizer("embedded")
    call = tok("<calculator>2*3</calculator>", add_special_tokens=False).input_ids
    rows = [{"messages": [{"role": "user", "content": "q"}], "answer": "6"}]
    # turn limit: every turn calls the tool, so the episode never answers
    batch = episodes(Scripted(tok, [(call, "stop")] * 2), rows, 1, max_turns=2)
    assert batch.truncated.all() and int(batch.completion_mask.sum()) == 2 * len(call)
    assert batch.episodes[0]["turn_rewards"] == [0.0, 0.0] and batch.episodes[0]["stop"] == "max_turns"
    # token limit: the episode is cut at max_episode_tokens, model and tool tokens together
    batch = episodes(Scripted(tok, [(call, "stop")] * 4), rows, 1, max_tokens=len(call) + 3)
    assert batch.completion_ids.shape[1] == len(call) + 3 and batch.truncated.all()
    assert batch.completion_mask[0].tolist() == [True] * len(call) + [False] * 3


def test_sample_ids_stops_on_stop_strings_with_matching_logprobs():
    """The real generate path: continuations end at EOS or at the token completing a stop string,
    and the recorded log-probs are the ones the trainer recomputes."""
    torch.manual_seed(0)
    loaded = load_policy("tiny")
    rollout = HFRollout(loaded.model, loaded.tokenizer, torch.float32)
    seqs = [loaded.tokenizer("abc", add_special_tokens=False).input_ids,
            loaded.tokenizer("hello", add_special_tokens=False).input_ids]
    outs = rollout.sample_ids(seqs * 4, 1.0, 1.0, 12, ["e", "a"])
    hows = {how for _, _, how in outs}
    assert "stop" in hows
    for seq, (ids, logps, how) in zip(seqs * 4, outs):
        with torch.no_grad():
            logits = loaded.model(torch.tensor([seq + ids])).logits[0, len(seq) - 1 : -1]
        recomputed = logits.log_softmax(-1).gather(-1, torch.tensor(ids)[:, None]).squeeze(1)
        assert torch.allclose(recomputed, torch.tensor(logps), atol=1e-4)
        text = loaded.tokenizer.decode(ids)
        if how == "stop":
            before = loaded.tokenizer.decode(ids[:-1])
            assert any(s in text for s in ("e", "a")) and not any(s in before for s in ("e", "a"))
        assert len(ids) == len(logps) <= 12
