"""Controller role: builds the other five roles and runs the loop.

``train`` is the whole algorithm-independent RL loop: ``collect`` (rollout -> verifier, with
DAPO's group filtering and refill) -> reference -> trainer's old log-probs and values (when the
advantages need them) -> algorithm (advantages) -> trainer (update with the algorithm's loss) ->
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

from rlpost import algorithms, checkpoint, config, lora
from rlpost.algorithms import core, dapo
from rlpost.batch import Rollouts
from rlpost.data import PromptStream
from rlpost.envs import Task, build_task, is_correct, stack, verifier_timeout
from rlpost.envs.runner import VerifierRunner
from rlpost.envs.tools import ToolRollout
from rlpost.models import load_policy
from rlpost.observe.loggers import Loggers
from rlpost.observe.report import write_report
from rlpost.observe.runlog import RunLog, closing_table
from rlpost.roles.critic import Critic
from rlpost.roles.reference import Reference
from rlpost.roles.rollout_fast import build_rollout
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
    verifier: VerifierRunner  # the training reward: the verifier, or a reward stack / reward model / LLM judge (envs/stack.py)
    reference: Reference | None
    algo: algorithms.Algorithm
    trainer: Trainer | None  # None when built for evaluation only
    grader: VerifierRunner | None = None  # held-out accuracy: always the task's verifier

    def close(self) -> None:
        self.verifier.close()
        if self.grader is not None:
            self.grader.close()
        for role in (self.rollout, self.trainer):  # Ray actors (distributed/) end with the run
            if hasattr(role, "close"):
                role.close()


def build_roles(cfg: config.Config, verifier_path: str, weights: dict | None = None, for_eval: bool = False) -> Roles:
    """Load the policy once; the sampler and the reference are copies of it. for_eval builds no
    reference, critic or reward model: held-out evaluation needs only the sampler and the verifier.
    Under dist.topology=disaggregated/async the sampler and the trainer are Ray actors instead
    (distributed/topology.py); the Roles they return have the same verbs."""
    if cfg.dist.topology != "colocated" and not for_eval:
        try:
            from rlpost.distributed.topology import build_remote_roles
        except ImportError as e:  # Ray is an extra: say how to get it, in one line
            raise config.ConfigError(f"dist.topology: {cfg.dist.topology} runs on Ray ({e}); pip install 'rlpost[dist]'") from None
        return build_remote_roles(cfg, verifier_path, weights)
    loaded = load_policy(cfg.model.name, dtype=torch.float32, seed=cfg.run.seed)
    algo = algorithms.build(cfg)
    # The reference is the *starting* policy: copy it before any checkpoint weights are loaded.
    reference = make_reference(cfg, loaded.model) if needs_reference(cfg, algo) and not for_eval else None
    use_lora = cfg.model.lora_r > 0 and not for_eval
    # With LoRA the base stays the pretrained model: a checkpoint's merged weights would count the
    # adapters twice once the trainer loads them back (lora.py).
    if weights is not None and not use_lora:
        loaded.model.load_state_dict(weights)
    rollout = make_rollout(cfg, copy.deepcopy(loaded.model), loaded.tokenizer)
    trainer = make_trainer(cfg, algo, loaded.model, use_lora) if not for_eval else None
    verifier = VerifierRunner(verifier_path, verifier_timeout(cfg))
    # What training optimises: the verifier, or a reward stack; the verifier always judges held-out accuracy.
    reward = verifier if for_eval else stack.build_reward(cfg, verifier, config.derived(cfg).micro_batch_size)
    return Roles(rollout, reward, reference, algo, trainer, grader=verifier)


def needs_reference(cfg: config.Config, algo) -> bool:
    """Whether the algorithm (its KL term) or PRIME's implicit reward reads reference log-probs."""
    return algo.needs_reference or cfg.algo.prime_coef > 0


def make_reference(cfg: config.Config, model: torch.nn.Module) -> Reference:
    """A frozen copy of `model` that gives reference log-probs."""
    return Reference(copy.deepcopy(model), cfg.rollout.temperature, config.derived(cfg).micro_batch_size,
                     cfg.trainer.autocast_bf16, cfg.trainer.share_prompt_prefix)


def make_rollout(cfg: config.Config, model: torch.nn.Module, tokenizer):
    """The sampler over `model` (which it casts to rollout.dtype): own decode loop or `generate`,
    wrapped in tool episodes for the tools task."""
    rollout = build_rollout(cfg.rollout.engine, model, tokenizer, DTYPES[cfg.rollout.dtype])
    if cfg.task.name == "tools":  # multi-turn episodes: same generate() contract, tool calls inside
        rollout = ToolRollout(rollout, cfg.task)
    return rollout


def make_trainer(cfg: config.Config, algo, model: torch.nn.Module, use_lora: bool, **kwargs) -> Trainer:
    """The trainer over `model` (float32 master weights), with a critic when the algorithm needs
    values and LoRA adapters when model.lora_r > 0; kwargs go to Trainer (e.g. data_parallel)."""
    d = config.derived(cfg)
    critic = Critic(model, cfg.algo.critic) if algorithms.flag(algo, "needs_values") else None
    return Trainer(
        lora.wrap(model, cfg.model, cfg.run.seed) if use_lora else model, cfg.trainer, cfg.rollout.temperature,
        d.mini_batch_size, d.micro_batch_size, d.optimizer_steps, cfg.model.gradient_checkpointing, critic=critic,
        critic_lr=cfg.algo.critic_lr, entropy_grad=cfg.algo.entropy_coef > 0, **kwargs,
    )


def evaluate(roles: Roles, rows: list[dict], cfg: config.Config, dump: Path | None = None) -> float:
    """Greedy held-out accuracy: the fraction of rows the verifier marks correct."""
    correct, records = [], []
    bs = cfg.run.eval_batch_size
    for i in range(0, len(rows), bs):
        batch = roles.rollout.generate(rows[i : i + bs], n=1, temperature=0.0, top_p=1.0,
                                       max_new_tokens=cfg.rollout.max_new_tokens)
        rewards, infos, _ = (roles.grader or roles.verifier).score(batch)
        for row, completion, r, info in zip(batch.rows, batch.completions, rewards.tolist(), infos):
            ok = is_correct(info, r)
            correct.append(ok)
            records.append({"prompt": row["messages"][-1]["content"], "completion": completion,
                            "answer": row.get("answer"), "correct": ok})
    if dump is not None:
        dump.write_text("".join(json.dumps(r) + "\n" for r in records))
    return sum(correct) / max(1, len(correct))


def heldout_accuracy(cfg: config.Config, weights: dict | None = None, n: int = 0, samples: int = 0,
                     ks: list[int] = (), dump: Path | None = None) -> tuple[float, int, dict]:
    """(greedy held-out accuracy, problems used, sampled summary) of cfg.model, with checkpoint
    `weights` if given; n = 0 uses every held-out problem. With samples > 0 it also draws that many
    completions per problem at rollout.temperature and reports pass@1, pass@k and maj@k for each
    k in ks (search/evaluate.py); `dump` receives every record. `rlpost eval`, the pipeline and
    online DPO all use this."""
    from rlpost.search import evaluate as sampled

    task = build_task(cfg)
    roles = build_roles(cfg, task.verifier, weights, for_eval=True)
    rows = task.heldout[: n or None]
    try:
        acc = evaluate(roles, rows, cfg, dump if not samples else None)
        if not samples:
            return acc, len(rows), {}
        r = cfg.rollout
        records = sampled.sample_records(roles, rows, samples, r.temperature, r.top_p, r.max_new_tokens, cfg.run.eval_batch_size)
        if dump is not None:
            sampled.write_records(records, dump)
        return acc, len(rows), {"samples": samples, "temperature": r.temperature, **sampled.summarise(records, list(ks))}
    finally:
        roles.close()


def batch_metrics(batch: Rollouts, group_size: int) -> dict:
    length = batch.completion_mask.sum(1).float()  # (B,)
    p = core.pass_rate(batch.reward, group_size)  # (n_prompts,) share of each group with reward >= 1
    return {
        "reward/all_pass_frac": (p == 1).float().mean().item(),
        "reward/all_fail_frac": (p == 0).float().mean().item(),
        "reward/outside_band_frac": ((p == 0) | (p == 1)).float().mean().item(),  # p(1 - p) = 0
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


def collect(roles: Roles, stream: PromptStream, cfg: config.Config, step: int, timings: dict) -> tuple[Rollouts, dict]:
    """Generate and score one rollout batch, with the reward shaping and group filtering asked for.

    With group filtering (DAPO's dynamic sampling) groups that carry no signal are dropped and more
    prompts are generated, at most ``max_refill_rounds`` extra times, until ``prompts_per_step``
    groups are kept; the surplus of the last round is cut. If still short, the step trains on the
    groups it has (an empty batch skips the update)."""
    r, K = cfg.rollout, cfg.rollout.group_size
    filtering = r.filter_groups or algorithms.flag(roles.algo, "filters_groups")
    kept, n_kept, rounds, metrics, first = [], 0, 0, {}, None
    while True:
        with timed("gen", timings):
            kw = dict(n=K, temperature=r.temperature, top_p=r.top_p, max_new_tokens=r.max_new_tokens)
            if hasattr(roles.rollout, "generate_ahead"):  # async topology: workers are already sampling the
                b = roles.rollout.generate_ahead(stream, **kw)  # next batches; take the oldest (distributed/pool.py)
            else:
                b = roles.rollout.generate(stream.next(), **kw)
            metrics.update(getattr(roles.rollout, "last_metrics", {}))
        with timed("reward", timings):
            b.reward, b.infos, v_metrics = roles.verifier.score(b)
        for k, v in v_metrics.items():  # counts add up over refill rounds
            metrics[k] = metrics.get(k, 0) + v if not k.startswith("timing_s") else v
        score = b.reward  # the verifier's own score: groups are filtered on it, as DAPO/verl filter on accuracy
        stack.shape(b, cfg, metrics)  # overlong penalty and length shaping, part of the reward from here on
        first = first or batch_metrics(b, K)  # what the policy produced, before any filtering
        if not filtering:
            return b, {**metrics, **first}
        keep = dapo.keep_groups(score, K, r.filter_min_pass_rate, r.filter_max_pass_rate)  # (n_prompts,)
        kept.append(b.select(keep.repeat_interleave(K).nonzero().squeeze(1)))
        n_kept += int(keep.sum())
        if rounds == 0:
            metrics["rollout/kept_groups_frac"] = keep.float().mean().item()
        if n_kept >= r.prompts_per_step or rounds >= r.max_refill_rounds:
            break
        rounds += 1
    batch = Rollouts.cat(kept)
    batch = batch.select(slice(0, r.prompts_per_step * K))  # whole groups: every part holds whole groups
    metrics.update({"rollout/refill_rounds": rounds, "rollout/groups_trained": len(batch) // K,
                    "reward/mean_before_filter": first["reward/mean"]})
    return batch, {**metrics, **(batch_metrics(batch, K) if len(batch) else first)}


def loss_setup(cfg: config.Config, roles: Roles, state: dict):
    """(the loss the trainer minimises, the adaptive KL controller or None, whether the trainer's
    old log-probs are needed before the advantages)."""
    a = cfg.algo
    loss_fn = roles.algo.loss
    if a.entropy_coef > 0:
        loss_fn = algorithms.with_entropy_bonus(loss_fn, a.entropy_coef, algorithms.aggregator(a.loss_agg, cfg.rollout.max_new_tokens))
    cap = config.derived(cfg).tis_cap  # async runs get one by default: their samples are off-policy
    if cap > 0:  # inside the loss, where the trainer's old log-probs are at hand (algorithms.with_tis)
        loss_fn = algorithms.with_tis(loss_fn, cap, a.tis_level)
    kl_ctl = core.AdaptiveKLController(a.kl_coef, a.kl_target, a.kl_horizon) if a.kl_target > 0 else None
    if kl_ctl and state.get("kl_coef") is not None:  # resume: continue from the adapted coefficient
        kl_ctl.coef = roles.algo.kl_coef = state["kl_coef"]
    # Old log-probs (and values) are needed before the advantages when the KL is in the reward,
    # for a critic, and to measure the KL that adaptive control tracks.
    early_old = any(algorithms.flag(roles.algo, f) for f in ("needs_old_logp", "needs_values")) or kl_ctl is not None
    return loss_fn, kl_ctl, early_old


def adjust_advantages(batch: Rollouts, cfg: config.Config) -> dict:
    """What the shared knobs add to any algorithm's advantages: PRIME's implicit process reward,
    DAPO's overlong filter. (Truncated IS scales them later, inside the loss: algorithms.with_tis.)"""
    a, metrics = cfg.algo, {}
    if a.prime_coef > 0:  # dense reward beta * log(pi / pi_ref) per token, RLOO-centred (core.prime_advantages)
        policy_logp = batch.old_logp if batch.old_logp is not None else batch.sampler_logp
        implicit = a.prime_coef * (policy_logp - batch.ref_logp) * batch.completion_mask
        dense = core.prime_advantages(implicit, batch.completion_mask, cfg.rollout.group_size)
        batch.advantages = batch.advantages + dense
        metrics["reward/implicit_prm_mean"] = (implicit.sum(1)).mean().item()
    if a.overlong_filter:  # after the advantages: truncated rows still count in their group
        batch.completion_mask = batch.completion_mask & ~batch.truncated[:, None]
        batch.advantages = batch.advantages * batch.completion_mask
    return metrics


def train(cfg: config.Config, run_dir: Path, resume: bool = False, task: Task | None = None) -> dict:
    """The RL loop. Returns the run summary (also written to run_dir/summary.json).

    ``task`` replaces the config's task family (library use: your own rows and verifier)."""
    torch.set_num_threads(cfg.run.threads or os.cpu_count())
    sinks = Loggers(cfg.run.loggers, run_dir, config.to_dict(cfg))  # a missing package stops us here
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
    if ckpt:  # the sampler holds the checkpoint's weights (with LoRA: only the base): give it the trainer's, versioned
        roles.rollout.load_weights(roles.trainer.weights(), version=start)
    log = RunLog(run_dir, cfg.run.steps, start, cfg.run.progress, sinks)
    before = state.get("heldout_before")
    if before is None:
        say(f"held-out accuracy before training ({len(heldout)} problems, greedy) ...")
        before = evaluate(roles, heldout, cfg, run_dir / "samples" / "eval_before.jsonl")
        say(f"held-out accuracy before training: {before:.3f}")
    loss_fn, kl_ctl, early_old = loss_setup(cfg, roles, state)
    log.begin()
    for step in range(start + 1, cfg.run.steps + 1):
        timings: dict = {}
        batch, c_metrics = collect(roles, stream, cfg, step, timings)
        if len(batch) == 0:  # every group was filtered out, even after refills: nothing to learn from
            log.step(step, {**c_metrics, **timings, "timing_s/step": sum(timings.values())}, None)
            continue
        evaluating, syncing = schedule(cfg, step)
        roles.rollout.sleep(discard_weights=syncing)  # frees memory for the update, the peak (HFRollout.sleep)
        if roles.reference is not None:
            with timed("ref", timings):
                batch.ref_logp = roles.reference.logprobs(batch)
        if early_old:
            with timed("old", timings):
                batch.old_logp, batch.old_values = roles.trainer.recompute(batch)
        with timed("adv", timings):
            batch.advantages, a_metrics = roles.algo.advantages(batch)
            a_metrics.update(adjust_advantages(batch, cfg))
        with timed("update", timings):
            u_metrics = roles.trainer.update(batch, loss_fn)
        if kl_ctl:
            measured = u_metrics.get("actor/kl", a_metrics.get("critic/kl"))
            roles.algo.kl_coef = kl_ctl.update(measured, len(batch))
            u_metrics["actor/kl_coef"] = roles.algo.kl_coef
        if syncing:
            with timed("sync", timings):  # remote trainer: the time to publish the weights to the object store
                roles.rollout.load_weights(roles.trainer.weights(), version=step)
        if evaluating:
            with timed("eval", timings):
                u_metrics["eval/heldout_accuracy"] = evaluate(roles, heldout, cfg)
        timings["timing_s/step"] = sum(timings.values())
        tokens = float(batch.completion_mask.sum() + batch.prompt_mask.sum())
        perf = {"perf/throughput": tokens / timings["timing_s/step"],
                "perf/gen_tokens_per_s": float(batch.completion_mask.sum()) / timings["timing_s/gen"]}
        log.step(step, {**c_metrics, **a_metrics, **u_metrics, **timings, **perf, "training/epoch": stream.epoch}, batch)
        if step == cfg.run.steps or (cfg.run.checkpoint_every and step % cfg.run.checkpoint_every == 0):
            save_checkpoint(run_dir, cfg, step, roles, stream, before, elapsed(), kl_ctl)
        _test_fault_hook(step)
    log.close()
    say(f"held-out accuracy after training ({len(heldout)} problems, greedy) ...")
    after = evaluate(roles, heldout, cfg, run_dir / "samples" / "eval_after.jsonl")
    roles.close()
    minutes = elapsed()
    peak_rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB
    summary = log.summary(before, after, minutes, {"run_dir": str(run_dir), "heldout_n": len(heldout),
                                                   "peak_rss_gb": round(peak_rss_gb, 2)})
    print(closing_table(summary))
    say(f"report with plots: {write_report(run_dir)}  (health check: rlpost doctor {run_dir})")
    return summary


def schedule(cfg: config.Config, step: int) -> tuple[bool, bool]:
    """(whether this step evaluates, whether it syncs the sampler's weights): every
    dist.sync_every updates, at the end, and before every evaluation (which samples the newest)."""
    evaluating = bool(cfg.run.eval_every) and step % cfg.run.eval_every == 0 and step != cfg.run.steps
    return evaluating, step % cfg.dist.sync_every == 0 or step == cfg.run.steps or evaluating


def say(message: str) -> None:
    print(f"rlpost: {message}", file=sys.stderr, flush=True)


def save_checkpoint(run_dir: Path, cfg, step: int, roles: Roles, stream: PromptStream, before: float,
                    minutes: float, kl_ctl=None) -> None:
    state = {"step": step, "stream": stream.state_dict(), "torch_rng": torch.get_rng_state(),
             "heldout_before": before, "minutes": minutes, "kl_coef": kl_ctl.coef if kl_ctl else None,
             "algo": roles.algo.state_dict() if hasattr(roles.algo, "state_dict") else None}
    checkpoint.save(run_dir, step, roles.trainer.checkpoint_weights(), roles.trainer.state_dict(), state,
                    cfg.run.keep_checkpoints)


def _test_fault_hook(step: int) -> None:
    """Tests of crash-resume set RLPOST_KILL_AFTER_STEP=k to SIGKILL this process after step k."""
    if os.environ.get("RLPOST_KILL_AFTER_STEP") == str(step):
        os.kill(os.getpid(), signal.SIGKILL)
