"""trainer.param_dtype=bfloat16 (bf16 weights, float32 masters and moments) and offload.* (a role's
weights on the host between uses).

The GPU is where both matter; here they run on the CPU, where the maths is the same: the
masters are checked against a float32 trainer, the moves of ``device.Offloaded`` against the
calls a module receives, and a whole run with every switch on must train, resume and say what
it did. The one check that needs a second device (memory handed back between uses) runs only
where CUDA is."""

import copy

import pytest
import torch
from helpers import TINY, cli, make_batch, tcfg

from rlpost import config
from rlpost.algorithms.grpo import GRPO
from rlpost.model import device
from rlpost.model.load import load_policy
from rlpost.roles.critic import Critic
from rlpost.build import trainer_over
from rlpost.types.errors import ConfigError


def grpo_batch(tiny):
    batch = make_batch(tiny)
    algo = GRPO(group_size=4)
    batch.advantages = algo.advantages(batch).tokens
    return batch, algo


def trainer(model, lr=1e-3, critic=None, **kw):
    return trainer_over(model, tcfg(param_dtype="bfloat16", lr=lr, **kw), 1.0, mini_batch_size=16, micro_batch_size=4,
                   total_optimizer_steps=10, critic=critic)


def test_bf16_weights_start_from_float32_masters_and_buffers_stay_float32(tiny):
    start = {n: v.clone() for n, v in tiny.model.state_dict().items()}  # tied weights under both names
    tr = trainer(tiny.model)
    assert {p.dtype for p in tiny.model.parameters()} == {torch.bfloat16}
    assert all(b.dtype == torch.float32 for b in tiny.model.buffers() if b.is_floating_point())  # rotary inv_freq
    named = {id(p): n for n, p in tiny.model.named_parameters()}
    assert len(tr.master.pairs) == len(tr.params) > 0
    for p, m in tr.master.pairs:
        assert m.dtype == torch.float32 and torch.equal(m, start[named[id(p)]])  # the unrounded weight
        assert torch.equal(p, m.to(torch.bfloat16))
    # AdamW holds the masters, not the bf16 weights
    assert [id(q) for q in tr.opt.param_groups[0]["params"]] == [id(m) for _, m in tr.master.pairs]


def test_a_step_moves_the_masters_where_bf16_alone_would_round_the_update_away(tiny):
    batch, algo = grpo_batch(tiny)
    lr = 1e-6  # Adam's first step is ~lr per weight: far below half of bf16's spacing at |w| ~ 0.02 (~6e-5)
    ref = trainer_over(copy.deepcopy(tiny.model), tcfg(lr=lr), 1.0, 16, 4, 10)  # float32 weights, same batch
    start = {n: v.clone() for n, v in tiny.model.state_dict().items()}  # tied weights under both names
    tr = trainer(tiny.model, lr=lr)
    m = tr.update(copy.deepcopy(batch), algo.loss)
    ref.update(copy.deepcopy(batch), algo.loss)
    assert m["actor/nonfinite_steps"] == 0 and m["actor/grad_norm"] > 0
    named, fp32 = {id(p): n for n, p in tiny.model.named_parameters()}, dict(ref.model.named_parameters())
    moved = agree = total = rounded_away = 0
    for p, master in tr.master.pairs:
        n = named[id(p)]
        assert p.grad is None  # the hook moved each gradient into its master as float32
        assert tr.opt.state[master]["exp_avg"].dtype == torch.float32
        assert torch.equal(p, master.detach().to(torch.bfloat16))  # the weights are the rounded masters
        step, want = master.detach() - start[n], fp32[n].detach() - start[n]
        live = want != 0
        total += int(live.sum())
        moved += int((step[live] != 0).sum())
        agree += int((step.sign() == want.sign())[live].sum())
        rounded_away += int((p.detach() == start[n].to(torch.bfloat16))[live].sum())
    assert moved / total > 0.99  # every weight the float32 trainer moved, the master moved
    assert agree / total > 0.95  # the same direction (the bf16 forward's gradients are a little off)
    assert rounded_away / total > 0.9  # while the bf16 weights mostly did not change: bf16 alone loses it


def test_resume_from_state_and_checkpoint_weights_is_exact(tiny):
    batch, algo = grpo_batch(tiny)
    fresh = copy.deepcopy(tiny.model)
    a = trainer(tiny.model)
    a.update(copy.deepcopy(batch), algo.loss)
    weights, state = a.checkpoint_weights(), copy.deepcopy(a.state_dict())
    head = a.model.get_output_embeddings().weight
    assert weights["lm_head.weight"].dtype == torch.float32
    assert torch.equal(weights["lm_head.weight"], a.master.of(head))  # the master, not its rounding
    fresh.load_state_dict(weights)  # as the loop resumes: a float32 model from the checkpoint
    b = trainer(fresh)
    b.load_state_dict(state)
    a.update(copy.deepcopy(batch), algo.loss)
    b.update(copy.deepcopy(batch), algo.loss)
    for (pa, ma), (pb, mb) in zip(a.master.pairs, b.master.pairs):
        assert torch.equal(ma, mb) and torch.equal(pa, pb)


def test_critic_is_bf16_with_masters_and_trains(tiny):
    batch, _ = grpo_batch(tiny)
    critic = Critic(tiny.model, "separate")
    tr = trainer(tiny.model, critic=critic)
    assert {p.dtype for p in critic.parameters()} == {torch.bfloat16}
    assert len(tr.opt.param_groups[1]["params"]) == len(tr.critic_params)
    returns = torch.randn(batch.completion_mask.shape) * batch.completion_mask

    def value_loss(logp, mb, *, values, entropy=None):  # values are float32 even from a bf16 head
        assert values.dtype == torch.float32
        return ((values - returns[: len(mb), : values.shape[1]]) ** 2 * mb.completion_mask).sum() / mb.norm_tokens, {}

    head = tr.master.of(critic.head.weight).detach().clone()
    m = tr.update(copy.deepcopy(batch), value_loss)
    assert m["critic/grad_norm"] > 0
    assert not torch.equal(tr.master.of(critic.head.weight), head)  # the zero-initialised head moved


def test_data_parallel_with_bf16_params_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"^trainer\.param_dtype=bfloat16 .*dist\.trainer_ranks"):
        config.load(None, ["dist.topology=disaggregated", "dist.trainer_ranks=2", "trainer.param_dtype=bfloat16"])


class Moves(torch.nn.Linear):
    """A real module that records where it is asked to go (a second device is not needed to check
    when the moves happen; the move itself is torch's)."""

    def __init__(self):
        super().__init__(2, 2)
        self.moves: list[str] = []

    def to(self, dev):
        self.moves.append(torch.device(dev).type)
        return super().to(dev) if torch.device(dev).type == "cpu" else self  # no CUDA here: record only


def test_offloaded_moves_onto_the_device_for_each_outermost_use_and_home_after():
    m = Moves()
    home = device.Offloaded(m, "cuda", enabled=True)
    assert m.moves == ["cpu"]  # waits on the host from the start
    with home:
        assert m.moves == ["cpu", "cuda"]
        with home:  # a nested use (update -> recompute) moves nothing
            pass
        assert m.moves == ["cpu", "cuda"]
    assert m.moves == ["cpu", "cuda", "cpu"]
    with pytest.raises(RuntimeError):
        with home:
            raise RuntimeError("a failed forward")
    assert m.moves[-1] == "cpu" and home.depth == 0  # home again after an error too


def test_not_offloaded_stays_on_the_device_and_uses_move_nothing():
    m = Moves()
    home = device.Offloaded(m, "cuda", enabled=False)
    with home:
        pass
    assert m.moves == ["cuda"]


def test_offloaded_optimizer_state_follows_its_parameters():
    m = torch.nn.Linear(3, 3)
    opt = torch.optim.AdamW(m.parameters(), lr=0.1)
    m(torch.ones(1, 3)).sum().backward()
    opt.step()
    home = device.Offloaded(m, device.CPU, enabled=True, optimizer=opt, params=list(m.parameters()))
    with home:
        opt.step()  # the state is where its parameters are, so the step runs
    state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    assert state and all(v.device == device.CPU for v in state)


def test_run_with_bf16_params_and_every_offload_trains_and_resumes(tmp_path):
    # PPO: a critic to offload; KL: a reference to offload (and to hold in bf16)
    args = [*TINY, "algo.name=ppo", "algo.kl_coef=0.01", "trainer.param_dtype=bfloat16", "offload.reference=true",
            "offload.critic=true", "offload.reward_model=true", "run.checkpoint_every=1", "run.eval_every=0",
            f"run.out_dir={tmp_path}", "run.name=r"]
    r = cli("train", *args)
    assert r.returncode == 0, r.stderr[-3000:]
    run = tmp_path / "r"
    lines = [l for l in (run / "metrics.jsonl").read_text().splitlines() if l.strip()]
    assert len([l for l in lines if '"step"' in l]) >= 2
    r = cli("train", *[a for a in args if not a.startswith("run.steps")], "run.steps=3", "--resume", str(run))
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (a second place to offload from)")
def test_offloaded_reference_holds_no_device_memory_between_uses():
    from rlpost.model.logprobs import Scoring
    from rlpost.roles.reference import Placement, Reference

    tiny = load_policy("tiny")
    batch = make_batch(tiny)
    near = Reference(copy.deepcopy(tiny.model), Scoring(1.0), 8, False, placement=Placement(on="cuda"))
    before = torch.cuda.memory_allocated()
    far = Reference(copy.deepcopy(tiny.model), Scoring(1.0), 8, False, placement=Placement(offload=True, on="cuda"))
    assert torch.cuda.memory_allocated() == before  # constructed on the host
    assert torch.equal(far.logprobs(batch), near.logprobs(batch))
    assert torch.cuda.memory_allocated() == before and device.of(far.model) == device.CPU
