"""The RL loop: one visible function that calls every role in order and logs what each cost.

``train`` is the same for every algorithm and every topology: the sampling stage's ``collect``
(recipes/sampling_stage.py: rollout -> verifier, then the curriculum, the reward's shapers and DAPO's
group filtering with refills) -> reference -> the trainer's old log-probs and values
(when the advantages need them) -> algorithm (advantages) -> trainer (update with the algorithm's
loss) -> weight sync. Roles return values and only this loop writes them into the batch, so every
field of ``Rollouts`` is set in view here. Wall-clock per role goes into ``timing_s/<role>``.
"""

from __future__ import annotations

import resource
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Sequence

import torch
from safetensors.torch import load_file

from rlpost import algorithms, build, config
from rlpost.console import say
from rlpost.envs import Task, build_task
from rlpost.envs.data import PromptStream
from rlpost.envs.mix import MixedStream
from rlpost.model import checkpoint, device, export, heap, load
from rlpost.model.cores import Cores
from rlpost.observe import jsonl
from rlpost.observe.loggers import Loggers
from rlpost.observe.report import write_report
from rlpost.observe.runlog import RunLog, closing_table, timed, wall_split
from rlpost.recipes import idle
from rlpost.recipes.evaluate import (PASSK_SAMPLES, by_task_summary, eval_sizes, evaluate, heldout_scores,
                                     paired_delta, passk_curve, saved_model_scores, threads)
from rlpost.recipes.guard import RunGuard
from rlpost.recipes.sampling_stage import SamplingStage
from rlpost.types.batch import Rollouts
from rlpost.types.errors import ConfigError
from rlpost.types.roles import Roles


def train(cfg: config.Config, run_dir: Path, resume: bool = False, task: Task | None = None, *,
          on_step_end: Callable[[int], None] | None = None, make_roles: Callable = build.build_roles,
          on_resumed: Callable[[], None] | None = None, callbacks: Sequence = ()) -> dict:
    """The RL loop. Returns the run summary (also written to run_dir/summary.json).

    ``task`` replaces the config's task family (library use: your own rows and verifier); ``callbacks``
    are TRL's (``_call``). ``on_step_end(step)`` runs after each step's checkpoint; ``make_roles``
    builds the roles (build.build_roles; tests wrap both to inject faults), and with for_eval=True
    those that measure RUN/model's held-out accuracy at the end (after_training). What stops a run early is
    recipes/guard.py; the roles' processes stop however the loop ends. A resume checks the checkpoint
    and puts its state back before it writes; then ``on_resumed()`` runs (config.resume-N.yaml)."""
    task, run_dir = task or build_task(cfg.task), Path(run_dir)
    build.preflight(cfg, task)  # threads, LoRA targets, prompt lengths: the CLI checked them already, before the folder
    cores = Cores(cfg.run.threads)  # torch's threads: every core, fewer while other processes keep some busy
    run_dir.mkdir(parents=True, exist_ok=True)  # library use: the CLI has claimed it already (observe/runfolder.py)
    t_start = time.perf_counter()
    weights, trainer_state, state, ckpt = resume_point(run_dir, cfg) if resume else (None, None, {}, None)
    elapsed = partial(minutes_since, t_start, state.get("minutes", 0.0))  # across resumes
    # between rollout and advantages: the prompt stream, its curriculum, the reward's shapers, DAPO's group filter
    stage = SamplingStage.from_config(cfg, task, algorithms.traits(cfg.algo.name))
    roles = make_roles(cfg, task, weights, stream=stage.stream, run_dir=run_dir)
    log = None
    try:
        heldout, passk_n = held_out(cfg, task, state)
        torch.manual_seed(cfg.run.seed)  # after building: loading a model may draw from the RNG
        start = resume_state(roles, stage.stream, trainer_state, state, on_resumed) if resume else 0
        # copied into the roles: a resumed run would carry a second set of weights to its end
        weights = trainer_state = None
        sinks = Loggers(cfg.run.loggers, run_dir, config.to_dict(cfg))  # a missing package stops us here, before step 1
        log = RunLog(run_dir, cfg.run.steps, start, cfg.run.progress, sinks, ckpt)
        # one thread count for every held-out measurement, a resumed run's from its checkpoint (evaluate.threads)
        eval_threads = state.get("eval_threads") or torch.get_num_threads()
        # a resumed run's: from its checkpoint
        before, before_k = baseline(roles, (heldout, passk_n), cfg, run_dir, task, state, eval_threads, make_roles)
        log.begin()
        _call(callbacks, "on_train_begin", cfg, run_dir)
        with RunGuard(cfg, state.get("early_stop")) as guard:
            for step in guard.steps(start + 1, cfg.run.steps):
                timings: dict = {}
                batch, c_metrics = stage.collect(roles, timings, cores)
                guard.check_rewards(c_metrics, step)  # a reward function that keeps failing stops the run here
                evaluating, syncing = schedule(cfg, step)
                # frees memory for the update, the peak (rollout_hf.py: sleep)
                roles.rollout.sleep(discard_weights=syncing)
                adv_metrics, u_metrics = {}, {}  # stay empty when every group was filtered out (even after refills)
                if len(batch):
                    if roles.reference is not None:
                        with timed("ref", timings):
                            batch.ref_logp = roles.reference.logprobs(batch)
                    if roles.algo.old_logp_first:
                        with timed("old", timings):
                            batch.old_logp, batch.old_values = roles.trainer.recompute(batch)
                    with timed("adv", timings):
                        adv = roles.algo.advantages(batch)
                        batch.advantages, batch.returns = adv.tokens, adv.returns
                        batch.completion_mask = adv.loss_mask if adv.loss_mask is not None else batch.completion_mask
                    with timed("update", timings):
                        cores.adjust()
                        u_metrics = roles.trainer.update(batch, roles.algo.loss)
                    guard.check_update(u_metrics, step)  # non-finite loss or gradient: skipped, and N in a row stop
                    u_metrics.update(roles.algo.end_step(u_metrics, adv.metrics, len(batch)))  # adaptive KL
                    adv_metrics = adv.metrics
                if syncing:
                    with timed("sync", timings):  # remote trainer: the time to publish the weights to the object store
                        roles.rollout.load_weights(roles.trainer.weights(), version=step)
                if evaluating:
                    with timed("eval", timings), threads(eval_threads):
                        u_metrics.update(heldout_scores(roles, heldout, cfg))  # and a mix's per family
                timings["timing_s/step"] = sum(timings.values())
                log.step(step, metrics := {**c_metrics, **adv_metrics, **u_metrics, **timings,
                                           **perf(batch, timings, cores), "training/epoch": stage.stream.epoch}, batch)
                every = cfg.run.checkpoint_every and step % cfg.run.checkpoint_every == 0
                if guard.finish_step(u_metrics) or step == cfg.run.steps or every:  # a stop, a new best, the end
                    save_checkpoint(run_dir, cfg, step, roles, stage.stream, (before, before_k, eval_threads, passk_n),
                                    elapsed(), guard, log.history)
                if on_step_end is not None:
                    on_step_end(step)
                _call(callbacks, "on_step_end", step, metrics, roles)
        log.close()
        last = last_accuracy(roles, heldout, cfg, eval_threads)
    finally:
        roles.close()  # verifier workers, Ray actors and the sandboxes they run: stopped however we leave
        if log is not None:
            log.close()
    roles = batch = None  # their memory goes before the export loads a model and a checkpoint (finish)
    measured = Measured(heldout, (before, before_k), last, eval_threads, make_roles, passk_n, t_start)
    return finish(run_dir, cfg, log, guard, measured, task, elapsed(), callbacks)


def minutes_since(t_start: float, before: float) -> float:
    """The run's minutes: since ``t_start`` (time.perf_counter) in this process, plus ``before`` (earlier starts)."""
    return (time.perf_counter() - t_start) / 60 + before


def held_out(cfg: config.Config, task: Task, state: dict) -> tuple[list[dict], int]:
    """(the held-out rows, the pass@k curve's problems) of a run, sized to it (evaluate.eval_sizes),
    which a new run says in one line; a resumed run keeps its first curve's problems (``state``)."""
    n_heldout, passk_n, sized = eval_sizes(cfg, len(task.heldout), build.is_env(cfg))
    if "step" in state:
        return task.heldout[:n_heldout], state.get("passk_problems", passk_n)
    if sized:
        say(sized)  # a trial run's evaluation, cut to its size: what was cut and how to have it all
    return task.heldout[:n_heldout], passk_n


def last_accuracy(roles: Roles, heldout: list[dict], cfg: config.Config, eval_threads: int) -> float | None:
    """The last step's held-out accuracy on the training sampler, which early stopping weighs against
    its best evaluation to pick RUN/model's step (RunGuard.select); None without early stopping."""
    if not cfg.run.early_stop_patience:
        return None
    with threads(eval_threads):
        return evaluate(roles, heldout, cfg)


@dataclass
class Measured:
    """What finish needs of the held-out measurements: the rows, (accuracy, pass@k curve) before
    training, the last step's accuracy on the training sampler (early stopping only, else None), the
    thread count every measurement runs on, the run's builder of roles (train's make_roles), and the
    pass@k curve's problems (evaluate.eval_sizes; 0 = off), and when this process started (perf_counter;
    the summary's ``wall_s``)."""

    heldout: list[dict]
    before: tuple[float, dict]
    last: float | None
    threads: int
    make_roles: Callable = build.build_roles
    passk: int = 0
    started: float | None = None


def after_training(run_dir: Path, cfg: config.Config, model_dir: Path, task: Task, measured: Measured,
                   weights: dict | None = None) -> tuple[float, float, dict, dict]:
    """(accuracy before, after, how they compare, pass@k curves) with "after" the saved model's:
    RUN/model on a fresh sampler, as "before" was measured on the run's (evaluate.saved_model_scores),
    on the same thread count and rows, so a run that changed no weight gives every answer again.
    ``weights``: the tensors RUN/model is being written from (finish), the sampler's then; else the
    folder is read.

    Whether the weights changed is read, not inferred: RUN/model against the starting model. When
    they did not, "after" is "before" (it is the same model); a measurement that still differs is
    this machine's evaluation not reproducing itself, said in one line and kept as
    heldout_accuracy_after_measured."""
    (before, before_k), samples = measured.before, run_dir / "samples"
    changed = not matches_start(cfg, folder_weights(model_dir) if weights is None else weights)
    say(f"held-out accuracy after training, of {model_dir} ({len(measured.heldout)} problems, greedy) ...")
    with threads(measured.threads):
        after, after_k = saved_model_scores(cfg, model_dir, task, measured.heldout, samples / "eval_after.jsonl",
                                            measured.passk, run_dir, measured.make_roles, weights)
    records = [jsonl.read_lines(samples / f"eval_{when}.jsonl", {"correct": bool, "completion": str})
               for when in ("before", "after")]
    compared = {"weights_changed": changed, **paired_delta(*records)}
    if not compared["weights_changed"] and (after, after_k) != (before, before_k):
        say(f"RUN/model holds the starting weights, yet its held-out accuracy measured {after:.3f} against "
            f"{before:.3f} before ({compared.get('heldout_answers_changed', '?')} answers differ): this machine's "
            "evaluation did not reproduce itself; the table reports no change")
        compared.update(heldout_accuracy_after_measured=after, heldout_delta=0.0, heldout_delta_se=0.0)
        after, after_k = before, before_k
    return before, after, compared, {"passk_before": before_k, "passk_after": after_k}


def matches_start(cfg: config.Config, weights: dict) -> bool:
    """Whether ``weights`` (a model's tensors by name) are exactly the run's starting weights (model.name,
    run.seed): every tensor equal, bit for bit, to the starting model's of that name."""
    start = load.load_policy(cfg.model.name, dtype=torch.float32, seed=cfg.run.seed).model.state_dict()
    return all(name in start and torch.equal(start[name], saved) for name, saved in weights.items())


def folder_weights(model_dir: Path) -> dict:
    """Every tensor of a model folder's safetensors files, by name."""
    return {name: t for file in sorted(Path(model_dir).glob("*.safetensors")) for name, t in load_file(file).items()}


def _call(callbacks: Sequence, hook: str, *args) -> None:
    """Each callback's `hook`, where it has one (it may define only those it needs): TRL's callbacks=,
    ``on_train_begin(cfg, run_dir)``, ``on_step_end(step, metrics, roles)`` (after the step's
    checkpoint; the metrics as logged) and ``on_train_end(summary)``; one that raises stops the run."""
    for callback in callbacks:
        method = getattr(callback, hook, None)
        if method is not None:
            method(*args)


def finish(run_dir: Path, cfg: config.Config, log: RunLog, guard: RunGuard, measured: Measured, task: Task,
           minutes: float, callbacks: Sequence = ()) -> dict:
    """RUN/model, its held-out accuracy (``after_training``), summary.json, the closing table and
    the report, after the training roles are gone:
    with their weights, gradients and optimizer moments still held, the export (a model and a
    checkpoint loaded) made the run's memory peak (tests/recipes/test_run_memory.py). Their memory
    is freed into glibc's heap, where it stays resident while the export's large tensors come from
    fresh mappings: the heap is trimmed first (5.16 GiB peak at the end of vs_trl.py's rlpost child
    without it, Zen 4, 2026-11-26; a no-op off glibc and on a GPU's memory).

    RUN/model is written on a second thread while the held-out pass runs on a sampler built from the
    very tensors it is written from (write_selected_model), and the summary waits for both. The pass
    is what it was, a fresh sampler of RUN/model's weights; the checkpoint they come from was written
    whole before (the last step's, or the one early stopping selected), and the folder is written
    under a temporary name and renamed, so a crash in the closing leaves the checkpoint to resume
    from and RUN/model whole or absent (tests/recipes/test_closing.py). The overlap pays where the
    pass runs on a GPU; on a 2-core CPU the write (0.3-0.5 s for the embedded model) shares the
    pass's cores and no gain was measured (export_write_s in the summary)."""
    t_end = time.perf_counter()
    heap.trim()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlpost-export") as pool:
        # a checkpoint as a transformers folder: RUN/model
        model_dir, selected, weights, written = write_selected_model(run_dir, cfg, guard.select(measured.last or 0.0),
                                                                     pool)
        t_export = time.perf_counter()
        before, after, compared, passk = after_training(run_dir, cfg, model_dir, task, measured, weights)
        t_after = time.perf_counter()
        weights = None
        write_s = written.result()  # the export's error, where it failed, is raised here
    # wall_s: the export's part the pass did not hide (loading, then waiting for the write to end)
    end = {"export": t_export - t_end + time.perf_counter() - t_after, "held-out after": t_after - t_export}
    wall = wall_split(log, measured.started, end) if measured.started is not None else {}
    peak_rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux reports KiB
    summary = log.summary(before, after, minutes, {"run_dir": str(run_dir), "heldout_n": len(measured.heldout),
                                                   **compared,
                                                   "model": str(model_dir), "peak_rss_gb": round(peak_rss_gb, 2),
                                                   **device.max_memory_allocated_gb(),
                                                   "skipped_rows": task.skipped_rows, **selected,
                                                   **by_task_summary(run_dir / "samples"),
                                                   **passk_summary(passk, cfg, measured.passk),
                                                   **idle_summary(log.history),
                                                   "wall_s": {k: round(v, 1) for k, v in wall.items()},
                                                   "export_write_s": round(write_s, 1)})
    print(closing_table(summary))
    say(f"report with plots: {write_report(run_dir)}  (health check: rlpost doctor {run_dir})")
    nothing = idle.closing_line(log.history, cfg)  # steps that trained nothing: how many, why, the knob; the last word
    if nothing is not None:
        say(nothing)
    _call(callbacks, "on_train_end", summary)
    return summary


def baseline(roles: Roles, rows: tuple[list[dict], int], cfg: config.Config, run_dir: Path, task: Task,
             state: dict, eval_threads: int, make_roles: Callable = build.build_roles) -> tuple[float, dict]:
    """Held-out accuracy before training, and the pass@k curve, on ``eval_threads`` threads; a
    resumed run has both in its checkpoint's ``state``. ``rows``: the held-out rows and how many of
    them the curve draws from (evaluate.eval_sizes). ``make_roles``: the run's builder of roles."""
    heldout, passk_n = rows
    if state.get("heldout_before") is not None:
        return state["heldout_before"], state.get("passk_before", {})
    if task.skipped_rows:
        say(f"skipped {task.skipped_rows} data rows, malformed or too long for the context (task.on_bad_row=skip); "
            "counted in summary.json")
    say(f"held-out accuracy before training ({len(heldout)} problems, greedy) ...")
    dump = run_dir / "samples" / "eval_before.jsonl"
    with threads(eval_threads):
        if cfg.dist.topology == "colocated":  # the run's sampler, fresh: built as the one "after" is measured on
            before, curve = evaluate(roles, heldout, cfg, dump), passk_curve(roles, heldout[:passk_n], cfg)
        else:  # the run's sampler is another process's: a local one, as "after" will be
            before, curve = saved_model_scores(cfg, cfg.model.name, task, heldout, dump, passk_n, run_dir, make_roles)
    say(f"held-out accuracy before training: {before:.3f}")
    if curve:
        say(f"pass@k before training ({passk_n} problems x {PASSK_SAMPLES} samples): "
            + ", ".join(f"@{k} {v:.3f}" for k, v in curve.items()))
    return before, curve


def passk_summary(passk: dict, cfg: config.Config, problems: int) -> dict:
    """summary.json's pass@k curves, of ``problems`` held-out problems (evaluate.eval_sizes; {} when off)."""
    if not passk.get("passk_before") or not passk.get("passk_after"):
        return {}
    return {**passk, "passk_problems": problems, "passk_samples": PASSK_SAMPLES,
            "passk_temperature": cfg.rollout.temperature}


def idle_summary(history: list[dict]) -> dict:
    """summary.json's count of steps that changed the policy, and of the others by cause (recipes/idle.py)."""
    found = idle.counts(history)
    return {"steps_trained": len(history) - sum(found.values()), **({"steps_idle": found} if found else {})}


def perf(batch: Rollouts, timings: dict, cores: Cores) -> dict:
    tokens = float(batch.completion_mask.sum() + batch.prompt_mask.sum())
    # On CUDA also the allocator's peak (perf/max_memory_allocated_gb), the GPU's counterpart of peak RSS.
    # perf/threads: torch's threads for the update; perf/other_cores: other processes' work before it (model/cores.py)
    return {"perf/throughput": tokens / timings["timing_s/step"],
            "perf/gen_tokens_per_s": float(batch.completion_mask.sum()) / timings["timing_s/gen"],
            "perf/threads": cores.threads, "perf/other_cores": round(cores.others, 2),
            **device.max_memory_allocated_gb()}


def schedule(cfg: config.Config, step: int) -> tuple[bool, bool]:
    """(whether this step evaluates, whether it syncs the sampler's weights): every
    dist.sync_every updates, at the end, and before every evaluation (which samples the newest)."""
    evaluating = bool(cfg.run.eval_every) and step % cfg.run.eval_every == 0 and step != cfg.run.steps
    return evaluating, step % cfg.dist.sync_every == 0 or step == cfg.run.steps or evaluating


def resume_point(run_dir: Path, cfg: config.Config) -> tuple[dict, dict, dict, Path]:
    """(weights, trainer state, run state, folder) of the newest intact checkpoint (checkpoint.py
    verifies it, and falls back past corrupt ones with a line each); one of another kind of run
    (another algorithm, a critic this run lacks) is refused by name."""
    found = checkpoint.load_latest(run_dir)
    if found is None:
        raise ConfigError(f"--resume {run_dir}: no intact checkpoint to resume from")
    check_checkpoint(found[0], cfg)
    return (*found[1], found[0])


def check_checkpoint(ckpt: Path, cfg: config.Config) -> None:
    """That checkpoint ``ckpt`` is of this kind of run (checkpoint.check_fits, by name)."""
    traits = algorithms.resolve(cfg.algo.name).traits
    checkpoint.check_fits(ckpt, cfg.algo.name, traits.needs_values, cfg.model.lora_r > 0,
                          cfg.trainer.param_dtype == "bfloat16")


def resume_state(roles: Roles, stream: PromptStream | MixedStream, trainer_state: dict, state: dict,
                 on_resumed: Callable[[], None] | None = None) -> int:
    """Put a checkpoint's run state back (optimizer, stream position, RNG, algorithm state), give
    the sampler the trainer's weights, then call ``on_resumed``; returns the step it was taken after.
    State that fits its schema but not this run (an optimizer of other parameters, another task
    mix) is one line (checkpoint.fitting; a field its schema refused, the stream's position, is named already)."""
    with checkpoint.fitting(state["step"]):
        roles.trainer.load_state_dict(trainer_state)
        stream.load_state_dict(state["stream"])
        torch.set_rng_state(state["torch_rng"])
        roles.algo.load_state_dict(state)
        roles.load_sampling_state(state)  # a Ray pool's chunk seeds go on from there
    # The sampler holds the checkpoint's weights (with LoRA: only the base): give it the trainer's, versioned.
    roles.rollout.load_weights(roles.trainer.weights(), version=state["step"])
    if on_resumed is not None:
        on_resumed()
    return state["step"]


def save_checkpoint(run_dir: Path, cfg: config.Config, step: int, roles: Roles, stream: PromptStream | MixedStream,
                    before: tuple, minutes: float, guard: RunGuard, metrics: list[dict]) -> None:
    """``before``: (held-out accuracy, pass@k curve, the thread count held-out measurements run on,
    the curve's problems) before training, which a resumed run reports and keeps as its own."""
    state = {"step": step, "stream": stream.state_dict(), "torch_rng": torch.get_rng_state(),
             "algo_name": cfg.algo.name, "heldout_before": before[0], "passk_before": before[1],
             "eval_threads": before[2], "passk_problems": before[3], "minutes": minutes,
             "early_stop": guard.early_stop_state(),
             **roles.sampling_state(),
             **roles.algo.state_dict()}
    saved = checkpoint.Saved(roles.trainer.checkpoint_weights(), roles.trainer.state_dict(), state)
    checkpoint.save(run_dir, step, saved, cfg.run.keep_checkpoints, protect=guard.best[0] if guard.best else None,
                    metrics=metrics)


def write_selected_model(run_dir: Path, cfg: config.Config, selected: tuple[int, float] | None,
                         pool: ThreadPoolExecutor) -> tuple[Path, dict, dict | None, Future]:
    """RUN/model from the last checkpoint, or with early stopping from the selected step's (RunGuard.select):
    (the folder, what summary.json records of the choice (the report marks it), the tensors it is written
    from, the write's seconds). The model is loaded here (export.staged) and written on ``pool``'s thread,
    whose future gives the seconds, or the write's error. A run folder without checkpoints (none to merge:
    export.staged's copy) is written before this returns, and the tensors are None."""
    step = None if selected is None else selected[0]
    if cfg.model.lora_r > 0:  # the adapters alone too, peft's folder: what a LoRA user serves (vLLM --enable-lora)
        export.write_model(run_dir, cfg.model, cfg.run.seed, step, run_dir / "adapter", merge_lora=False)
    chosen = {} if selected is None else {"selected_step": selected[0], "heldout_accuracy_selected": selected[1]}
    if selected is not None:
        say(f"RUN/model holds step {selected[0]}: the best held-out accuracy, {selected[1]:.3f} "
            "(run.early_stop_patience)")
    out, loaded, write = export.staged(run_dir, cfg.model, cfg.run.seed, step, run_dir / "model")
    if loaded is None:  # a run without checkpoints: its own final folder
        t0 = time.perf_counter()
        return write(), chosen, None, pool.submit(lambda: time.perf_counter() - t0)

    def timed_write() -> float:
        t0 = time.perf_counter()
        write()
        return time.perf_counter() - t0

    return out, chosen, loaded.model.state_dict(), pool.submit(timed_write)
