"""The sampler's sleep before the update (the run's memory peak): what it frees, that a
discarded sampler refuses to sample until the next sync, and that the loop only discards on
steps that sync."""

import copy
import json

import pytest
import torch
from helpers import tiny_cfg

from rlpost.recipes.rl import train
from rlpost.roles.rollout_fast import FastRollout
from rlpost.roles.rollout_hf import HFRollout


def rows(n):
    return [{"messages": [{"role": "user", "content": f"{i * 37}+{i}="}]} for i in range(n)]


def greedy(ro):
    return ro.generate(rows(3), n=1, temperature=0.0, top_p=1.0, max_new_tokens=10)


@pytest.mark.parametrize("engine", [HFRollout, FastRollout])
def test_discarded_weights_come_back_with_the_next_sync(tiny, engine):
    ro = engine(copy.deepcopy(tiny.model), tiny.tokenizer, dtype=torch.float32)
    before = greedy(ro)
    ro.sleep(discard_weights=True)
    assert all(p.untyped_storage().nbytes() == 0 for p in ro.model.parameters())  # the memory is gone
    with pytest.raises(RuntimeError, match="without load_weights"):
        greedy(ro)
    state = tiny.model.state_dict()
    with pytest.raises(ValueError, match="lacks"):  # a partial sync would leave garbage weights
        ro.load_weights({k: v for k, v in state.items() if "layers.0." not in k})
    ro.load_weights(state, version=3)
    after = greedy(ro)
    assert after.completions == before.completions
    assert after.policy_version == 3


def test_fast_engine_packs_while_sampling_and_frees_in_sleep(tiny):
    if not torch.backends.mkldnn.is_available():
        pytest.skip("no oneDNN in this torch build: nothing is packed")
    ro = FastRollout(copy.deepcopy(tiny.model), tiny.tokenizer, dtype=torch.float32)
    assert all(lin.packed is None for lin in ro.linears())
    first = greedy(ro)
    assert all(lin.packed is not None for lin in ro.linears())
    ro.sleep()  # weights kept: only the packed copies go
    assert all(lin.packed is None for lin in ro.linears())
    assert greedy(ro).completions == first.completions
    state = {k: v + 0.05 * torch.randn_like(v) for k, v in tiny.model.state_dict().items()}
    ro.load_weights(state)  # the packed copies are stale after a sync: they must be rebuilt
    assert all(lin.packed is None for lin in ro.linears())
    plain = HFRollout(copy.deepcopy(tiny.model), tiny.tokenizer, dtype=torch.float32)
    plain.load_weights(state)
    assert greedy(ro).completions == greedy(plain).completions


def test_loop_discards_only_on_steps_that_sync(tmp_path):
    # sync_every=2: step 1 samples with step 0's weights (no sync, nothing discarded), step 2
    # syncs, step 3 is the last and syncs; a sampler discarded without a sync would raise.
    train(tiny_cfg("run.steps=3", "dist.sync_every=2", "run.eval_every=0"), tmp_path)
    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps if "timing_s/sync" in s] == [2, 3]
