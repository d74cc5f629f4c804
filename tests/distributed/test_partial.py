"""Partial rollouts (dist.partial_rollouts): new weights taken between decode steps, each token
stamped with the version that drew it.

The engine's part runs without Ray: the decode loop's hook (FastRollout.between_steps) loads
weights at a chosen step, so the schedule is exact and the samples can be compared. The pool's
part runs real actors on a local Ray: an offer lands while a chunk runs, and a worker that dies
while taking it loses no row."""

import copy
import os
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from helpers import digit_rows, tiny_cfg

from rlpost import config
from rlpost.roles.chunk_stream import ChunkStream
from rlpost.roles.rollout_fast import FastRollout

ROWS = [{"messages": [{"role": "user", "content": f"{i * 37}+{i}="}]} for i in range(3)]
KW = dict(n=2, temperature=1.0, top_p=1.0, max_new_tokens=12)


def perturbed(model) -> dict:
    g = torch.Generator().manual_seed(1)
    return {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()}


def sample(tiny, switch_at: int | None, hooked: bool = True):
    """A batch from a fresh engine whose hook loads new weights (version 1) at its switch_at-th call
    (None: never); hooked False: no hook at all (the engine as every other topology runs it)."""
    engine = FastRollout(copy.deepcopy(tiny.model), tiny.tokenizer, dtype=torch.float32)
    new, calls = perturbed(tiny.model), []

    def hook(e):
        calls.append(e.version)
        if len(calls) == switch_at:
            e.load_weights(new, version=1)

    if hooked:
        engine.between_steps = hook
    torch.manual_seed(0)  # the call's sampling key
    return engine.generate(ROWS, **KW), calls


def test_tokens_after_the_switch_carry_the_new_version_and_the_rest_is_unchanged(tiny):
    plain, _ = sample(tiny, None, hooked=False)
    idle, calls = sample(tiny, None)  # the hook is called and loads nothing: the same samples
    assert len(calls) >= 5 and plain.token_version is None
    assert torch.equal(idle.completion_ids, plain.completion_ids) and torch.equal(idle.sampler_logp, plain.sampler_logp)
    assert not idle.token_version.any()
    # Token 0 comes from the prefill; the hook's c-th call runs before the step that draws token c.
    # Loaded at the 4th call, tokens 0-3 are version 0 and identical, tokens 4.. are version 1.
    switched, _ = sample(tiny, 4)
    mask = switched.completion_mask
    t = torch.arange(mask.shape[1]).expand_as(mask)
    assert torch.equal(switched.token_version, ((t >= 4) & mask).long())
    early = (t < 4) & mask
    assert torch.equal(switched.completion_ids[early], plain.completion_ids[early])
    assert torch.equal(switched.sampler_logp[early], plain.sampler_logp[early])
    late = (t >= 4) & mask & plain.completion_mask  # tokens both runs drew
    assert late.any() and not torch.equal(switched.sampler_logp[late], plain.sampler_logp[late])
    assert switched.policy_version == 0  # the oldest token's: the staleness bound is checked against it


def test_the_same_seed_and_schedule_give_the_same_samples(tiny):
    a, _ = sample(tiny, 3)
    b, _ = sample(tiny, 3)
    for name in ("completion_ids", "completion_mask", "sampler_logp", "token_version"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    c, _ = sample(tiny, 6)  # another schedule: other versions, from the 6th call on
    assert not torch.equal(a.token_version, c.token_version)


def test_every_token_of_an_engine_that_never_switches_carries_its_version(tiny):
    engine = FastRollout(copy.deepcopy(tiny.model), tiny.tokenizer, dtype=torch.float32, slots=2)
    engine.load_weights(tiny.model.state_dict(), version=7)
    engine.between_steps = lambda e: None
    out = engine.generate(ROWS, **KW)  # 6 rows through 2 slots: the first tokens come from each row's entry
    assert bool((out.token_version[out.completion_mask] == 7).all()) and out.policy_version == 7


# --- a worker's chunks as one stream (roles/chunk_stream.py) -----------------------------------------

LONGER = [{"messages": [{"role": "user", "content": f"tell {i} a longer thing please"}]} for i in range(2)]
STREAM_KW = dict(temperature=1.0, top_p=1.0, max_new_tokens=24)


def alone(engine, rows, seed: int, **kw):
    """The chunk decoded on its own, as a worker without a stream samples it (its seed, then generate)."""
    torch.manual_seed(seed)
    return engine.generate(rows, 2, **{**STREAM_KW, **kw})


def side_by_side(stream, jobs: list[tuple], engine=None) -> list:
    """Submit each (rows, seed, kw) from its own thread, each queued before the next starts, as the actor's
    calls arrive. engine: its hook's first call (in the first chunk's decode) waits until the others are
    queued, so that they join that decode."""
    out = [None] * len(jobs)

    def go(i, rows, seed, kw):
        out[i] = stream.submit(rows, 2, {**STREAM_KW, **kw}, seed)[0]

    if engine is not None:
        def hook(e):
            hook.calls += 1
            deadline = time.monotonic() + 60
            while hook.calls == 1 and len(stream.queue) < len(jobs) - 1 and time.monotonic() < deadline:
                time.sleep(0.001)

        hook.calls = 0
        engine.between_steps = hook
    threads = [threading.Thread(target=go, args=(i, *job)) for i, job in enumerate(jobs)]
    before = stream.submitted
    for i, t in enumerate(threads):
        t.start()
        deadline = time.monotonic() + 60
        while stream.submitted < before + i + 1 and time.monotonic() < deadline:  # queued in this order
            time.sleep(0.001)
    for t in threads:
        t.join(60)
    return out


@pytest.fixture
def engine(tiny):
    e = FastRollout(copy.deepcopy(tiny.model), tiny.tokenizer, dtype=torch.float32)
    e.between_steps = lambda e: None
    return e


def test_a_chunk_in_the_stream_samples_what_it_samples_alone(engine):
    solo_a, solo_b = alone(engine, ROWS, 11), alone(engine, LONGER, 12)
    stream = ChunkStream(engine)
    first, _ = stream.submit(ROWS, 2, STREAM_KW, 11)  # alone in its decode: the same call, bit for bit
    for name in ("completion_ids", "completion_mask", "sampler_logp", "prompt_ids", "group_ids"):
        assert torch.equal(getattr(first, name), getattr(solo_a, name)), name
    a, b = side_by_side(stream, [(ROWS, 11, {}), (LONGER, 12, {})], engine)
    assert stream.decodes == 2  # the second chunk joined the first's decode
    for got, want in ((a, solo_a), (b, solo_b)):  # each row draws with its own chunk's uniforms
        assert torch.equal(got.completion_ids, want.completion_ids) and got.rows == want.rows
        assert torch.allclose(got.sampler_logp, want.sampler_logp, atol=1e-4)
        assert got.policy_version == 0 and not got.token_version.any()


def test_a_chunk_sampling_otherwise_starts_the_next_decode(engine):
    greedy = alone(engine, LONGER, 12, temperature=0.0)
    stream = ChunkStream(engine)
    a, b = side_by_side(stream, [(ROWS, 11, {}), (LONGER, 12, {"temperature": 0.0})], engine)
    assert stream.decodes == 2  # the first chunk's, then the greedy chunk's own
    assert torch.equal(b.completion_ids, greedy.completion_ids) and len(a) == 6


def test_weights_taken_in_the_stream_stamp_the_tokens_after_and_the_chunks_that_join(tiny, engine):
    """The hook's 3rd call (in the first chunk's decode) loads version 1, then lets the second chunk come:
    it joins at the next step, under version 1."""
    new, out, stream = perturbed(tiny.model), {}, ChunkStream(engine)
    second = threading.Thread(target=lambda: out.setdefault("b", stream.submit(LONGER, 2, STREAM_KW, 12)))

    def hook(e):
        hook.calls += 1
        if hook.calls == 3:
            e.load_weights(new, version=1)
            second.start()
            deadline = time.monotonic() + 60
            while not stream.queue and time.monotonic() < deadline:
                time.sleep(0.001)

    hook.calls = 0
    engine.between_steps = hook
    (a, loads_a), (b, loads_b) = stream.submit(ROWS, 2, STREAM_KW, 11), (second.join(60), out["b"])[1]
    va, vb = a.token_version[a.completion_mask], b.token_version[b.completion_mask]
    assert stream.decodes == 1 and a.policy_version == 0 and va.min() == 0 and va.max() == 1 and loads_a == 1
    assert b.policy_version == 1 and bool((vb == 1).all()) and loads_b == 0
    assert bool(((a.token_version[:, 1:] >= a.token_version[:, :-1]) | ~a.completion_mask[:, 1:]).all())


def test_a_failed_decode_fails_each_of_its_chunks_and_the_next_decode_runs(engine):
    def hook(e):
        if hook.armed:
            hook.armed = False
            raise MemoryError("no room for the next step")

    hook.armed = True
    engine.between_steps = hook
    stream = ChunkStream(engine)
    with pytest.raises(RuntimeError, match="the decode this chunk ran in failed: MemoryError"):
        stream.submit(ROWS, 2, STREAM_KW, 11)
    assert len(stream.submit(ROWS, 2, STREAM_KW, 11)[0]) == 6


@pytest.mark.parametrize("override,expected", [
    ("dist.partial_rollouts=true dist.topology=disaggregated", "dist.partial_rollouts: weights change mid-chunk"),
    ("dist.partial_rollouts=true dist.topology=async dist.weight_sync=broadcast",
     "dist.partial_rollouts: a broadcast is a collective"),
    ("dist.partial_rollouts=true dist.topology=async rollout.engine=hf",
     "dist.partial_rollouts: new weights are taken in the own engine's decode loop"),
    ("dist.max_staleness=3", "dist.max_staleness: samples lag the policy only where workers sample ahead; expected "
                             "dist.topology=async, got colocated"),
    ("dist.max_staleness=3 dist.topology=disaggregated", "dist.max_staleness: samples lag"),
    ("dist.max_staleness=1000000000 dist.topology=async", "dist.max_staleness"),  # a bound: it samples that far ahead
    ("dist.chunk_prompts=2", "dist.chunk_prompts: shapes the Ray actors"),
    ("dist.rollout_threads=1", "dist.rollout_threads: shapes the Ray actors"),
    ("dist.trainer_placement=spread", "dist.trainer_placement: shapes the Ray actors"),
])
def test_partial_rollout_settings_are_checked(override, expected):
    with pytest.raises(config.ConfigError) as e:
        config.load(None, override.split())
    assert str(e.value).startswith(expected) and "\n" not in str(e.value)


def test_what_a_synchronous_topology_reads_is_taken():
    for words in (["dist.max_staleness=0"], ["dist.max_staleness=1", "dist.topology=disaggregated"],
                  ["dist.topology=disaggregated", "dist.chunk_prompts=2", "dist.rollout_threads=1"],
                  ["dist.topology=async", "dist.max_staleness=64"]):
        config.load(None, words)


# --- the pool, on real actors ------------------------------------------------------------------

ray = pytest.importorskip("ray")

from rlpost.build import build_roles  # noqa: E402
from rlpost.distributed.actors import RolloutWorker  # noqa: E402
from rlpost.envs import Task  # noqa: E402
from rlpost.envs.data import PromptStream  # noqa: E402

DIGITS = Task(digit_rows(200, 0), digit_rows(50, 1), "toy_verifiers:first_char_digit")
ASYNC = ["dist.topology=async", "dist.partial_rollouts=true", "dist.rollout_workers=1", "dist.max_staleness=1",
         "rollout.max_new_tokens=16"]


class SlowWorker(RolloutWorker):
    """A worker whose decode steps take 0.1 s each, so a chunk is still running when weights are published;
    its first step writes the file STARTED names."""

    STARTED = ""

    def _load_offer(self, engine):
        Path(self.STARTED).touch()
        time.sleep(0.1)
        return super()._load_offer(engine)  # private: the hook this subclass slows (a stream's, or inside a lone
        # chunk's _between_steps)


class DyingWorker(SlowWorker):
    """Dies (its process exits) the first time it is about to take weights in flight; MARK records that it did."""

    MARK = ""

    def _load_offer(self, engine):
        Path(self.STARTED).touch()
        time.sleep(0.1)
        if self.offered is not None and not Path(self.MARK).exists():
            Path(self.MARK).write_text("died mid-update")
            os._exit(1)
        return RolloutWorker._load_offer(self, engine)  # private: the hook, past SlowWorker's sleep


def test_a_workers_first_two_chunks_arriving_together_share_one_stream(tiny, monkeypatch):
    """The pool hands a fresh worker two chunks at once, on two of its actor's threads: both must go to
    one stream (one decode thread on the engine), however the threads interleave. A stream that takes
    its time to be made widens the window two unguarded threads would both fall into."""
    from rlpost.distributed import actors

    made = []

    class SlowToMake(actors.ChunkStream):
        def __init__(self, *a):
            time.sleep(0.2)
            super().__init__(*a)
            made.append(self)

    monkeypatch.setattr(actors, "ChunkStream", SlowToMake)
    make = lambda w: FastRollout(copy.deepcopy(tiny.model), tiny.tokenizer, dtype=torch.float32)
    worker = RolloutWorker(make, None, 1, 0)
    got = [None, None]
    calls = [threading.Thread(target=lambda i=i: got.__setitem__(i, worker.generate(i, ROWS, 2, STREAM_KW, [])))
             for i in range(2)]
    for t in calls:
        t.start()
    for t in calls:
        t.join(60)
    assert len(made) == 1 and all(len(g[0]) == 6 for g in got)


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}})
    yield
    ray.shutdown()


def second_batch(worker: type, tmp_path: Path):
    """The pool's second batch when weights (version 1) are published while it is being sampled, with its
    metrics. The worker holds the first two batches' chunks at once (partial rollouts), decoded as one
    stream; the weights go out 0.3 s into that decode."""
    started = tmp_path / "started"
    worker = type("Marked", (worker,), {"STARTED": str(started)})
    stream = PromptStream(DIGITS.train, 2, 0)
    roles = build_roles(tiny_cfg(*ASYNC), DIGITS, stream=stream, rollout_worker=worker)
    weights = roles.trainer.weights()

    def publish():
        deadline = time.monotonic() + 120
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # a few of the decode's steps
        roles.rollout.load_weights(weights, version=1)

    try:
        pool, kw = roles.rollout, dict(n=2, temperature=1.0, top_p=1.0, max_new_tokens=16)
        loader = threading.Thread(target=publish)
        loader.start()
        pool.generate(stream.next(), **kw)  # returns the first batch; the second was sampled beside it
        loader.join()
        return pool.generate(stream.next(), **kw), pool.last_metrics
    finally:
        roles.close()


@pytest.mark.slow
def test_a_running_chunk_takes_new_weights_between_decode_steps(local_ray, tmp_path):
    batch, m = second_batch(SlowWorker, tmp_path)
    v = batch.token_version
    assert m["async/inflight_weight_loads"] == 1 and batch.policy_version == 0
    assert v[batch.completion_mask].min() == 0 and v[batch.completion_mask].max() == 1
    assert m["async/mixed_version_rows"] > 0 and m["async/token_staleness_max"] == 1
    assert 0 < m["async/token_staleness_mean"] < 1
    # versions never go back along a row: each row's tokens are 0s, then 1s
    assert bool(((v[:, 1:] >= v[:, :-1]) | ~batch.completion_mask[:, 1:]).all())


@pytest.mark.slow
def test_a_worker_that_dies_mid_update_loses_no_row(local_ray, tmp_path):
    worker = type("Dying", (DyingWorker,), {"MARK": str(tmp_path / "died")})
    batch, m = second_batch(worker, tmp_path)
    assert (tmp_path / "died").exists() and m["async/worker_restarts"] == 1
    assert len(batch) == 4 and sorted(batch.group_ids.tolist()) == [0, 0, 1, 1]  # 2 prompts x 2, none lost
    # the chunk was sampled again from its start, on a new worker holding the newest weights
    assert batch.policy_version == 1 and bool((batch.token_version[batch.completion_mask] == 1).all())


@pytest.mark.slow
def test_an_async_run_with_partial_rollouts_keeps_the_bound_per_token(local_ray, tmp_path):
    import json

    from rlpost.recipes.rl import train

    cfg = tiny_cfg("rollout.prompts_per_step=8", "rollout.group_size=4", "rollout.max_new_tokens=8", "run.steps=4",
                   "run.eval_every=0", "dist.topology=async", "dist.partial_rollouts=true", "dist.rollout_workers=2",
                   "dist.chunk_prompts=4", "dist.max_staleness=1")
    train(cfg, tmp_path / "run", task=DIGITS)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    assert all(r["async/token_staleness_max"] <= 1 and r["async/staleness_max"] <= 1 for r in rows)
    assert all(0 <= r["async/mixed_version_rows"] <= 1 and "async/inflight_weight_loads" in r for r in rows)
    assert all(r["actor/tis_weight_mean"] > 0 for r in rows)  # per-token TIS against each token's sampler log-prob
