"""Controller role: builds the other five roles and runs the loop.

``train`` is the whole algorithm-independent RL loop, visible in one function: rollout ->
verifier -> reference -> algorithm (advantages) -> trainer (update with the algorithm's loss) ->
weight sync. Every role is called through one or two verbs on objects that hold no reference to
each other, so any of them can later live behind a process boundary without touching the loop.
Wall-clock per role goes into ``timing_s/<role>``.
"""

from __future__ import annotations

import copy
import json
import os
import resource
import signal
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from rlpost import algorithms, checkpoint, config
from rlpost.batch import Rollouts
from rlpost.data import PromptStream
from rlpost.envs import Task, build_task
from rlpost.envs.runner import VerifierRunner
from rlpost.models import load_policy
from rlpost.observe.runlog import RunLog, closing_table
from rlpost.roles.reference import Reference
from rlpost.roles.rollout_hf import HFRollout
from rlpost.roles.trainer import Trainer

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


@contextmanager
def timed(name: str, timings: dict):
    t0 = time.perf_counter()
    yield
    timings[f"timing_s/{name}"] = timings.get(f"timing_s/{name}", 0.0) + time.perf_counter() - t0


@dataclass
class Roles:
    rollout: HFRollout
    verifier: VerifierRunner
    reference: Reference | None
    algo: algorithms.Algorithm
    trainer: Trainer


def build_roles(cfg: config.Config, verifier_path: str, weights: dict | None = None) -> Roles:
    """Load the policy once; the sampler and the reference are copies of it."""
    d = config.derived(cfg)
    loaded = load_policy(cfg.model.name, dtype=torch.float32, seed=cfg.run.seed)
    algo = algorithms.build(cfg)
    # The reference is the *starting* policy: copy it before any checkpoint weights are loaded.
    reference = (
        Reference(copy.deepcopy(loaded.model), cfg.rollout.temperature, d.micro_batch_size, cfg.trainer.autocast_bf16,
                  cfg.trainer.share_prompt_prefix)
        if algo.needs_reference else None
    )
    if weights is not None:
        loaded.model.load_state_dict(weights)
    rollout = HFRollout(copy.deepcopy(loaded.model), loaded.tokenizer, dtype=DTYPES[cfg.rollout.dtype])
    trainer = Trainer(
        loaded.model, cfg.trainer, cfg.rollout.temperature, d.mini_batch_size, d.micro_batch_size,
        d.optimizer_steps, cfg.model.gradient_checkpointing,
    )
    return Roles(rollout, VerifierRunner(verifier_path, cfg.task.verifier_timeout_s), reference, algo, trainer)


def evaluate(roles: Roles, rows: list[dict], cfg: config.Config, dump: Path | None = None) -> float:
    """Greedy held-out accuracy: the fraction of rows the verifier marks correct."""
    correct, records = [], []
    bs = cfg.run.eval_batch_size
    for i in range(0, len(rows), bs):
        batch = roles.rollout.generate(rows[i : i + bs], n=1, temperature=0.0, top_p=1.0,
                                       max_new_tokens=cfg.rollout.max_new_tokens)
        rewards, infos, _ = roles.verifier.score(batch)
        for row, completion, r, info in zip(batch.rows, batch.completions, rewards.tolist(), infos):
            ok = bool(info.get("correct", r >= 1.0))
            correct.append(ok)
            records.append({"prompt": row["messages"][-1]["content"], "completion": completion,
                            "answer": row.get("answer"), "correct": ok})
    if dump is not None:
        dump.write_text("".join(json.dumps(r) + "\n" for r in records))
    return sum(correct) / max(1, len(correct))


def batch_metrics(batch: Rollouts) -> dict:
    length = batch.completion_mask.sum(1).float()  # (B,)
    return {
        "reward/mean": batch.reward.mean().item(),
        "reward/std": batch.reward.std().item() if len(batch) > 1 else 0.0,
        "reward/max": batch.reward.max().item(),
        "reward/min": batch.reward.min().item(),
        "response_length/mean": length.mean().item(),
        "response_length/max": length.max().item(),
        "response_length/min": length.min().item(),
        "response_length/clip_ratio": batch.truncated.float().mean().item(),
        "prompt_length/mean": batch.prompt_mask.sum(1).float().mean().item(),
    }


def train(cfg: config.Config, run_dir: Path, resume: bool = False, task: Task | None = None) -> dict:
    """The RL loop. Returns the run summary (also written to run_dir/summary.json).

    ``task`` replaces the config's task family (library use: your own rows and verifier)."""
    torch.set_num_threads(cfg.run.threads or os.cpu_count())
    task = task or build_task(cfg)
    t_start = time.perf_counter()
    elapsed = lambda: (time.perf_counter() - t_start) / 60 + state.get("minutes", 0.0)  # across resumes
    ckpt = checkpoint.latest(run_dir) if resume else None
    weights, trainer_state, state = checkpoint.load(ckpt) if ckpt else (None, None, {})
    roles = build_roles(cfg, task.verifier, weights)
    stream = PromptStream(task.train, cfg.rollout.prompts_per_step, cfg.run.seed)
    heldout = task.heldout[: cfg.run.eval_n or None]
    torch.manual_seed(cfg.run.seed)
    if ckpt:
        roles.trainer.load_state_dict(trainer_state)
        stream.load_state_dict(state["stream"])
        torch.set_rng_state(state["torch_rng"])
        if state.get("algo") is not None:
            roles.algo.load_state_dict(state["algo"])
    start = state.get("step", 0)
    log = RunLog(run_dir, cfg.run.steps, start, cfg.run.progress)
    before = state.get("heldout_before")
    if before is None:
        say(f"held-out accuracy before training ({len(heldout)} problems, greedy) ...")
        before = evaluate(roles, heldout, cfg, run_dir / "samples" / "eval_before.jsonl")
        say(f"held-out accuracy before training: {before:.3f}")
    log.begin()
    for step in range(start + 1, cfg.run.steps + 1):
        timings: dict = {}
        with timed("gen", timings):
            batch = roles.rollout.generate(stream.next(), n=cfg.rollout.group_size, temperature=cfg.rollout.temperature,
                                           top_p=cfg.rollout.top_p, max_new_tokens=cfg.rollout.max_new_tokens)
            batch.policy_version = step - 1
        with timed("reward", timings):
            batch.reward, batch.infos, v_metrics = roles.verifier.score(batch)
        if roles.reference is not None:
            with timed("ref", timings):
                batch.ref_logp = roles.reference.logprobs(batch)
        with timed("adv", timings):
            batch.advantages, a_metrics = roles.algo.advantages(batch)
        with timed("update", timings):
            u_metrics = roles.trainer.update(batch, roles.algo.loss)
        with timed("sync", timings):
            roles.rollout.load_weights(roles.trainer.weights())
        if cfg.run.eval_every and step % cfg.run.eval_every == 0 and step != cfg.run.steps:
            with timed("eval", timings):
                u_metrics["eval/heldout_accuracy"] = evaluate(roles, heldout, cfg)
        timings["timing_s/step"] = sum(timings.values())
        tokens = float(batch.completion_mask.sum() + batch.prompt_mask.sum())
        perf = {"perf/throughput": tokens / timings["timing_s/step"],
                "perf/gen_tokens_per_s": float(batch.completion_mask.sum()) / timings["timing_s/gen"]}
        log.step(step, {**batch_metrics(batch), **v_metrics, **a_metrics, **u_metrics, **timings, **perf,
                        "training/epoch": stream.epoch}, batch)
        if step == cfg.run.steps or (cfg.run.checkpoint_every and step % cfg.run.checkpoint_every == 0):
            save_checkpoint(run_dir, cfg, step, roles, stream, before, elapsed())
        _test_fault_hook(step)
    log.close()
    say(f"held-out accuracy after training ({len(heldout)} problems, greedy) ...")
    after = evaluate(roles, heldout, cfg, run_dir / "samples" / "eval_after.jsonl")
    roles.verifier.close()
    minutes = elapsed()
    peak_rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB
    summary = log.summary(before, after, minutes, {"run_dir": str(run_dir), "heldout_n": len(heldout),
                                                   "peak_rss_gb": round(peak_rss_gb, 2)})
    print(closing_table(summary))
    return summary


def say(message: str) -> None:
    print(f"rlpost: {message}", file=sys.stderr, flush=True)


def save_checkpoint(run_dir: Path, cfg, step: int, roles: Roles, stream: PromptStream, before: float,
                    minutes: float) -> None:
    state = {"step": step, "stream": stream.state_dict(), "torch_rng": torch.get_rng_state(),
             "heldout_before": before, "minutes": minutes,
             "algo": roles.algo.state_dict() if hasattr(roles.algo, "state_dict") else None}
    checkpoint.save(run_dir, step, roles.trainer.weights(), roles.trainer.state_dict(), state, cfg.run.keep_checkpoints)


def _test_fault_hook(step: int) -> None:
    """Tests of crash-resume set RLPOST_KILL_AFTER_STEP=k to SIGKILL this process after step k."""
    if os.environ.get("RLPOST_KILL_AFTER_STEP") == str(step):
        os.kill(os.getpid(), signal.SIGKILL)
