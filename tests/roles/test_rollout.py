"""The rollout role on transformers generate, with the tiny model."""

import copy

import torch

from rlpost.model.logprobs import completion_logprobs
from rlpost.roles.rollout_hf import HFRollout


def rows(n):
    return [{"messages": [{"role": "user", "content": f"{i}+{i}="}], "answer": str(2 * i)} for i in range(n)]


def test_groups_masks_and_sampler_logp_match_trainer(tiny):
    ro = HFRollout(copy.deepcopy(tiny.model), tiny.tokenizer, dtype=torch.float32)
    torch.manual_seed(0)
    b = ro.generate(rows(3), n=4, temperature=0.8, top_p=1.0, max_new_tokens=8)
    assert len(b) == 12 and b.group_ids.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert all(b.rows[i] is b.rows[4 * (i // 4)] for i in range(12))  # a group shares its row
    # the trainer's recomputation in float32 equals what the sampler recorded
    with torch.no_grad():
        logp, _ = completion_logprobs(tiny.model, b, temperature=0.8)
    assert torch.allclose(logp[b.completion_mask], b.sampler_logp[b.completion_mask], atol=1e-5)
    assert (b.sampler_logp[~b.completion_mask] == 0).all()


def test_completion_mask_stops_after_first_eos(tiny):
    ro = HFRollout(copy.deepcopy(tiny.model), tiny.tokenizer, dtype=torch.float32)
    eos, pad, x = tiny.tokenizer.eos_token_id, tiny.tokenizer.pad_token_id, 10
    completion = torch.tensor([[x, eos, pad, pad], [x, x, x, x], [eos, x, eos, x]])
    # row 0: tokens up to and including EOS; row 1: no EOS -> all (truncated); row 2: only the first EOS
    assert ro.completion_mask(completion).tolist() == [
        [True, True, False, False], [True, True, True, True], [True, False, False, False]]


def test_truncation_flag_and_greedy_is_deterministic(tiny):
    ro = HFRollout(copy.deepcopy(tiny.model), tiny.tokenizer, dtype=torch.float32)
    b1 = ro.generate(rows(2), n=1, temperature=0.0, top_p=1.0, max_new_tokens=5)
    b2 = ro.generate(rows(2), n=1, temperature=0.0, top_p=1.0, max_new_tokens=5)
    assert torch.equal(b1.completion_ids, b2.completion_ids)
    has_eos = torch.isin(b1.completion_ids, ro.eos_ids).any(1)
    assert torch.equal(b1.truncated, ~has_eos)


def test_prompts_left_padded_with_chat_template(tiny):
    ro = HFRollout(copy.deepcopy(tiny.model), tiny.tokenizer, dtype=torch.float32)
    b = ro.generate([{"messages": [{"role": "user", "content": "1+1="}]},
                     {"messages": [{"role": "user", "content": "12+13="}]}], n=1, temperature=0.0,
                    top_p=1.0, max_new_tokens=2)
    assert b.prompt_mask[:, -1].all()  # every prompt ends at the last column
    assert not b.prompt_mask[0, 0]  # the short one is padded on the left
    text = tiny.tokenizer.decode(b.prompt_ids[1][b.prompt_mask[1]])
    assert text == "<|user|>12+13=<|assistant|>"


def test_load_weights_casts_into_sampler_copy(tiny):
    ro = HFRollout(copy.deepcopy(tiny.model), tiny.tokenizer, dtype=torch.bfloat16)
    state = {k: v + 1.0 for k, v in tiny.model.state_dict().items()}
    ro.load_weights(state)
    name = "model.embed_tokens.weight"
    assert ro.model.state_dict()[name].dtype == torch.bfloat16
    assert torch.equal(ro.model.state_dict()[name], state[name].to(torch.bfloat16))


def test_sampling_draws_from_the_whole_vocabulary(tiny):
    # generate's own default top_k=50 once truncated sampling while the recorded log-probs (and the
    # trainer) used the full softmax. The random tiny model spreads mass over all 76 tokens.
    ro = HFRollout(copy.deepcopy(tiny.model), tiny.tokenizer, dtype=torch.float32)
    torch.manual_seed(0)
    b = ro.generate([{"messages": [{"role": "user", "content": "7"}]}], n=3000, temperature=1.0, top_p=1.0,
                    max_new_tokens=1)
    assert len(set(b.completion_ids[:, 0].tolist())) > 60


def test_string_prompts_go_raw_with_prompt_format_raw(tiny, tmp_path):
    # TRL's standard (non-conversational) format: a string prompt is the model's input as it is
    import json

    from helpers import tiny_cfg

    from rlpost.envs import build_task
    from rlpost.rewards.worker import call_batch, TrainerState

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Once upon a time {i}", "answer": "x", "genre": "tale"}) + "\n"
                            for i in range(20)))
    row_of = lambda fmt: next(r for r in build_task(tiny_cfg("task.name=dataset", f"task.data={data}",
                                                             f"task.prompt_format={fmt}").task).train
                              if r["prompt"].endswith(" 3"))
    ro = HFRollout(copy.deepcopy(tiny.model), tiny.tokenizer, dtype=torch.float32)
    raw = ro.generate([row_of("raw")], n=1, temperature=0.0, top_p=1.0, max_new_tokens=2)
    assert tiny.tokenizer.decode(raw.prompt_ids[0][raw.prompt_mask[0]]) == "Once upon a time 3"
    chat = ro.generate([row_of("chat")], n=1, temperature=0.0, top_p=1.0, max_new_tokens=2)  # the default
    assert tiny.tokenizer.decode(chat.prompt_ids[0][chat.prompt_mask[0]]) == "<|user|>Once upon a time 3<|assistant|>"
    # a TRL-style reward function gets the data's columns, not rlpost's own copy of the prompt text
    seen = {}
    call_batch(lambda prompts, completions, **kw: seen.update(kw) or [0.0],
               {"rows": [row_of("raw")], "completions": ["x"], "completion_ids": None, "trainer_state": TrainerState()})
    assert "genre" in seen and not any(k.startswith("_") for k in seen)
