"""PPO's critic: the value head on the policy's trunk costs no change to the log-probs, a separate
critic is a real copy, and a PPO update through the trainer moves both policy and critic."""

import copy

import torch
from helpers import make_batch, tcfg

from rlpost.algorithms.ppo import PPO
from rlpost.model.logprobs import Scoring, completion_logprobs, completion_values, policy_forward
from rlpost.roles.critic import Critic
from rlpost.build import trainer_over
from rlpost.types.batch import Rollouts


def test_trunk_plus_lm_head_equals_the_causal_lm_forward(tiny):
    batch = make_batch(tiny)
    critic = Critic(tiny.model, "shared")
    torch.nn.init.normal_(critic.head.weight)
    for share in (True, False):
        plain, _ = completion_logprobs(tiny.model, batch, 0.9, share_prefix=share)
        out = policy_forward(tiny.model, batch, Scoring(0.9, share_prefix=share, value_head=critic.head))
        m = batch.completion_mask
        assert torch.allclose(plain[m], out.logp[m], atol=1e-5)
        # the shared head reads the same hidden states a separate critic with this trunk would
        v = completion_values(tiny.model.get_decoder(), critic.head, batch, share_prefix=share)
        assert torch.allclose(out.values[m], v[m], atol=1e-5)


def test_critic_kinds(tiny):
    shared, separate = Critic(tiny.model, "shared"), Critic(tiny.model, "separate")
    assert set(shared.state_dict()) == {"head.weight", "head.bias"}  # the trunk is the policy's
    trunk_ids = {id(p) for p in tiny.model.parameters()}
    assert not trunk_ids & {id(p) for p in separate.parameters()}  # a copy, not the same tensors
    batch = make_batch(tiny)
    assert separate.values(batch).abs().max() == 0  # the head starts at zero: V = 0


def _ppo_batch(tiny):
    batch = make_batch(tiny)
    batch.reward = (torch.arange(len(batch)) % 2).float()
    return batch


def test_ppo_update_trains_policy_and_critic(tiny):
    for kind in ("separate", "shared"):
        model = copy.deepcopy(tiny.model)
        critic = Critic(model, kind)
        tr = trainer_over(model, tcfg(epochs=2), 1.0, mini_batch_size=8, micro_batch_size=4, total_optimizer_steps=4,
                     critic=critic, critic_lr=1e-3)
        batch = _ppo_batch(tiny)
        algo = PPO(whiten_advantages=True)
        batch.old_logp, batch.old_values = tr.recompute(batch)
        adv = algo.advantages(batch)
        batch.advantages, batch.returns = adv.tokens, adv.returns
        head_before = critic.head.weight.detach().clone()
        policy_before = [p.detach().clone() for p in tr.params]
        m = tr.update(batch, algo.loss)
        assert not torch.equal(head_before, critic.head.weight), kind
        assert any(not torch.equal(a, b) for a, b in zip(policy_before, tr.params)), kind
        assert m["critic/grad_norm"] > 0 and "critic/vf_loss" in m
        # the value head moves towards the returns: the value loss drops
        _, new_values = tr.recompute(batch)
        mask = batch.completion_mask
        before = ((batch.old_values - batch.returns)[mask] ** 2).mean()
        after = ((new_values - batch.returns)[mask] ** 2).mean()
        assert after < before, kind
        # its weights travel in the trainer's checkpoint state
        state = tr.state_dict()
        fresh = Critic(copy.deepcopy(tiny.model), kind)
        tr2 = trainer_over(copy.deepcopy(tiny.model), tcfg(epochs=2), 1.0, 8, 4, 4, critic=fresh)
        tr2.load_state_dict(state)
        assert torch.equal(fresh.head.weight, critic.head.weight)


def test_cat_repads_and_keeps_groups_apart(tiny):
    a = make_batch(tiny, n_prompts=2, k=2, seed=0)
    b = make_batch(tiny, n_prompts=3, k=2, seed=1)
    b.prompt_ids, b.prompt_mask = b.prompt_ids[:, 1:], b.prompt_mask[:, 1:]  # a narrower prompt block
    b.completion_ids, b.completion_mask = b.completion_ids[:, :5], b.completion_mask[:, :5]
    b.sampler_logp = b.sampler_logp[:, :5]
    both = Rollouts.cat([a, b])
    assert len(both) == 10 and both.prompt_ids.shape[1] == a.prompt_ids.shape[1]
    assert both.group_ids.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    # b's prompts are padded on the left, its completions on the right, and mean the same thing
    lp_both, _ = completion_logprobs(tiny.model, both, 1.0)
    lp_b, _ = completion_logprobs(tiny.model, b, 1.0)
    m = b.completion_mask
    assert torch.allclose(lp_both[4:, :5][m], lp_b[m], atol=1e-5)
    assert not both.completion_mask[4:, 5:].any()
