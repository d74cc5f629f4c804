"""The process-reward role of an RL run (rewards/prm.py: StepRewards, task.process_reward_model) with the
tiny model's PRM: step rewards land on each step's last loss token with the PRM's own scores, times
the coefficient, in either form; a step that ends inside a tool's observation moves to the model's
last token before it; and a short run trains with them (the loop writes them in, recipes/rl.py)."""

import json

import pytest
import torch
from helpers import cli, rl_batch

from rlpost.rewards.prm import ProcessRewardModel, StepRewards
from rlpost.roles.critic import Critic


def ids(tok, text, eos=True):
    return tok(text, add_special_tokens=False).input_ids + ([tok.eos_token_id] if eos else [])


@pytest.fixture
def prm(tiny):
    head = Critic(tiny.model, "shared")
    torch.nn.init.normal_(head.head.weight)  # a zero head scores 0.5 everywhere: make the steps differ
    return ProcessRewardModel(tiny.model, head, tiny.tokenizer, autocast_bf16=False)


def batch_of(tok, texts, mask_holes=()):
    """Right-padded completions after a one-token prompt; (row, column) pairs in mask_holes are not loss tokens."""
    rows = [ids(tok, t) for t in texts]
    T = max(map(len, rows))
    comp = torch.full((len(rows), T), tok.pad_token_id)
    mask = torch.zeros(len(rows), T, dtype=torch.bool)
    for j, r in enumerate(rows):
        comp[j, :len(r)], mask[j, :len(r)] = torch.tensor(r), True
    for j, c in mask_holes:
        mask[j, c] = False
    prompt = torch.tensor([ids(tok, "q", eos=False)] * len(rows))
    return rl_batch(mask, completion_ids=comp, prompt_ids=prompt, prompt_mask=torch.ones_like(prompt, dtype=torch.bool))


def test_step_rewards_sit_on_the_step_ends_with_the_prms_scores(prm, tiny):
    tok = tiny.tokenizer
    # a b \n c d \n e f </s>: steps end at columns 2, 5, 8 (EOS); x \n y </s>: 1, 3
    b = batch_of(tok, ["ab\ncd\nef", "x\ny"])
    scores = prm.step_scores([[int(i) for i in b.prompt_ids[j]] for j in range(2)],
                             [ids(tok, "ab\ncd\nef"), ids(tok, "x\ny")])
    reward, ends = StepRewards(prm, coef=2.0).dense(b)
    assert ends[0].nonzero().squeeze(1).tolist() == [2, 5, 8] and ends[1].nonzero().squeeze(1).tolist() == [1, 3]
    torch.testing.assert_close(reward[0, [2, 5, 8]], 2.0 * torch.tensor(scores[0]))
    torch.testing.assert_close(reward[1, [1, 3]], 2.0 * torch.tensor(scores[1]))
    assert reward[~ends].abs().max() == 0  # nothing off the step ends, padding included
    assert len(set(scores[0])) == 3  # the random head scores each step differently: the columns are not interchangeable

    delta, _ = StepRewards(prm, form="delta").dense(b)  # each step's change from the one before
    torch.testing.assert_close(delta[0, [2, 5, 8]],
                               torch.tensor([scores[0][0], scores[0][1] - scores[0][0], scores[0][2] - scores[0][1]]))
    assert delta[0].sum().item() == pytest.approx(scores[0][-1], abs=1e-6)


def test_a_step_ending_inside_an_observation_moves_to_the_last_model_token(prm, tiny):
    tok = tiny.tokenizer
    # "ab\ncd\nef</s>" (columns 0-8): columns 3-5 ("cd\n") are a tool's observation, so the second
    # step's end (5) is not a model token: its reward goes on column 2, the model's last token before
    # it (which also ends step one), and both rewards add up there; the last step ends at EOS (8).
    b = batch_of(tok, ["ab\ncd\nef"], mask_holes=[(0, 3), (0, 4), (0, 5)])
    scores = prm.step_scores([b.prompt_ids[0].tolist()], [ids(tok, "ab\ncd\nef")])[0]
    reward, ends = StepRewards(prm).dense(b)
    assert ends[0].nonzero().squeeze(1).tolist() == [2, 8]
    assert reward[0, 2].item() == pytest.approx(scores[0] + scores[1], abs=1e-6)
    assert reward[0, 8].item() == pytest.approx(scores[2], abs=1e-6)
    assert not (ends & ~b.completion_mask).any()


def test_a_run_trains_on_step_rewards_and_refuses_a_folder_that_is_no_prm(prm, tmp_path):
    prm.save(tmp_path / "prm")
    out = tmp_path / "runs"
    r = cli("train", "model.name=tiny", "run.steps=2", "rollout.prompts_per_step=2", "rollout.group_size=2",
            "rollout.max_new_tokens=6", "task.n_heldout=4", "run.eval_every=0", f"run.out_dir={out}", "run.name=p",
            f"task.process_reward_model={tmp_path / 'prm'}", "task.process_reward_form=delta")
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [json.loads(x) for x in (out / "p" / "metrics.jsonl").read_text().splitlines()]
    assert all(m["reward/steps_per_seq"] >= 1 for m in lines)  # every completion has a last step at least
    assert all(m["timing_s/prm"] > 0 and "critic/process_advantages/mean" in m for m in lines)
    bad = cli("train", "model.name=tiny", "run.steps=1", f"run.out_dir={out}", "run.name=q",
              f"task.process_reward_model={tmp_path}")
    assert bad.returncode != 0 and "task.process_reward_model" in bad.stderr and "value_head.safetensors" in bad.stderr
