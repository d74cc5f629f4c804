"""On-policy preference data and iterative DPO (`rlpost dpo pref.online_rounds=N`).

Each round samples K completions per prompt from the *current* policy, scores them with the
task's verifier (or a reward model, ``task.reward_model``), and keeps, per prompt whose rewards
differ, the best completion as chosen and the worst as rejected (rejection sampling: Xu et al.
2023; the iterative DPO of Yuan et al. 2024 and Guo et al. 2024's online AI feedback use the same
loop). DPO then trains one round on those pairs with the round's starting policy as the
reference, and the next round samples from the result. Prompts whose K samples all score the
same give no pair (no preference to learn).
"""

from __future__ import annotations

import json
import random
import shutil
import signal
from pathlib import Path

import torch

from rlpost import build, config
from rlpost.console import say
from rlpost.envs import build_task
from rlpost.model import checkpoint
from rlpost.model.checkpoint import write_atomic
from rlpost.model.cores import Cores
from rlpost.observe.loggers import Loggers
from rlpost.observe.runlog import RunLog
from rlpost.recipes.evaluate import model_accuracy
from rlpost.recipes.guard import RunGuard, check_reward_failures
from rlpost.recipes import round_state
from rlpost.recipes.offline import train_offline
from rlpost.types.errors import DataError, Interrupted, writing
from rlpost.types.schema import check


def onpolicy_pairs(roles, rows: list[dict], k: int, cfg: config.Config) -> tuple[list[dict], dict]:
    """(pair rows {prompt, chosen, rejected, ...}, metrics) from K samples of each prompt."""
    rollout = cfg.rollout
    batch = roles.rollout.generate(rows, n=k, temperature=rollout.temperature, top_p=rollout.top_p,
                                   max_new_tokens=rollout.max_new_tokens)
    reward, _, scored = roles.verifier.score(batch)
    check_reward_failures(scored, cfg.task.max_reward_error_frac, "while sampling a round", True,
                          "stopped before training on them")  # text or NaN from every call is no preference
    grouped = reward.view(-1, k)  # (prompts, K)
    pairs = []
    for i, row in enumerate(rows):
        best, worst = int(grouped[i].argmax()), int(grouped[i].argmin())
        if grouped[i, best] > grouped[i, worst]:
            pairs.append({"prompt": row["messages"], "chosen": batch.completions[i * k + best],
                          "rejected": batch.completions[i * k + worst], "answer": row.get("answer")})
    return pairs, {"online/pairs": len(pairs), "online/reward_mean": reward.mean().item(),
                   "online/prompts_without_pair": len(rows) - len(pairs)}


def run_online_dpo(cfg: config.Config, run_dir: Path, resume: bool = False) -> dict:
    """pref.online_rounds rounds of (sample -> pairs -> one DPO pass); returns the summary. ``resume``: go on
    from RUN/rounds.json (sampled_rounds)."""
    return sampled_rounds(cfg, run_dir, cfg.pref.online_rounds, onpolicy_pairs, "dpo", "online_dpo",
                          "pairs.jsonl", "fewer than 2 prompts gave a pair",
                          ("pair_accuracy_after", "rewards/accuracy"), resume)


class RoundSinks:
    """run.loggers for the rounds' lines, every sink opened for its line and closed after it: a round's
    training opens the same sinks for its own folder meanwhile, and MLflow and W&B keep one open run a process."""

    def __init__(self, names: str, run_dir: Path, config: dict):
        self.args = (names, run_dir, config)
        Loggers(*self.args).close()  # a sink whose package is missing: one line now, before round 1

    def log(self, step: int, metrics: dict) -> None:
        sinks = Loggers(*self.args)
        try:
            sinks.log(step, metrics)
        finally:
            sinks.close()

    def close(self) -> None:
        """Nothing stays open between lines."""


def final_model(run_dir: Path, model: str, start: str) -> str:
    """RUN/model, as every other run ends with: a link to the last trained round's model (round_N/model), which
    export, serve and the next pipeline stage read. When no round trained, no link: one line says the model is
    still the one it started from, and that is what the summary names."""
    if model == start:
        say(f"no round trained (each gave too few rows; the summary's rounds say why): {run_dir} holds no model, "
            f"the policy is still {start}")
        return model
    link = run_dir / "model"
    with writing(link):
        if link.is_symlink() or link.exists():
            link.unlink()
        target = Path(model).resolve()
        try:
            target = target.relative_to(run_dir.resolve())  # relative: the run folder moves whole
        except ValueError:
            pass
        link.symlink_to(target, target_is_directory=True)
    return str(link)


def sampled_rounds(cfg: config.Config, run_dir: Path, n_rounds: int, collect, kind: str, summary_kind: str,
                   data_name: str, skip_reason: str, after: tuple[str, str], resume: bool = False) -> dict:
    """``n_rounds`` rounds of: K samples of ``pref.online_prompts`` training prompts from the current
    policy -> rows (``collect(roles, prompts, K, cfg) -> (rows, metrics)``) -> one ``kind`` pass of
    train_offline on them; the next round samples from the result (online DPO here, rejection-
    sampling SFT in rsft.py). ``after`` = (round key, held-out metric of the pass) to report.
    The rounds run in the scaffold every recipe runs in: each round's line goes to every run.loggers
    sink, and the rounds run inside the run guard, its unit a round: a stop signal while a round samples
    stops the run once the sampling ends, its samples saved; one during the round's training is that
    training's (train_offline's own guard: its folder's checkpoint); one while the round is measured
    stops the run after it. ``RUN/rounds.json`` records where the run stands (recipes/round_state.py);
    ``resume`` goes on from it: a round whose rows are on disk trains them without sampling again, from
    its folder's newest intact checkpoint where it has one, and a round that trained but was not yet
    measured is measured. Returns the summary, also RUN/summary.json."""
    cores = Cores(cfg.run.threads)  # torch's threads while sampling, as the RL loop's (model/cores.py)
    task = build_task(cfg.task)
    rng = random.Random(cfg.run.seed)
    model, rounds, pending, fresh = begin(cfg, run_dir, summary_kind, resume, rng)

    def record(done: int, sampled: dict | None = None, rng_state: tuple | None = None) -> None:
        write_atomic(run_dir / round_state.STATE, round_state.text(
            summary_kind, done, model, rounds, rng_state or rng.getstate(), run_dir, sampled))

    done = rounds[-1]["round"]
    if fresh:
        record(0)  # round 0, the base measured: a resume starts here
    sinks = RoundSinks(cfg.run.loggers, run_dir, config.to_dict(cfg))  # a missing package stops us before round 1
    log = RunLog(run_dir, n_rounds, done, False, sinks, desc=summary_kind, rollouts=False,
                 postfix=lambda m, history: {})
    log.begin()
    try:
        with RunGuard(cfg, saved="model", unit="round") as guard:
            for i in guard.steps(done + 1, n_rounds):
                rdir = run_dir / f"round_{i}"
                data = rdir / data_name
                if pending is not None and pending["round"] == i and data.is_file():  # sampled before the stop
                    draw(rng, task, cfg)  # the prompts it drew: the RNG as the uninterrupted run left it
                    metrics = pending["metrics"]
                else:
                    if pending is not None and pending["round"] == i:
                        say(f"{data}: missing, though {round_state.STATE} says round {i} sampled; it samples again")
                    before = rng.getstate()
                    guard.phase = (f"round {i}'s sampling", "its samples")
                    rows, metrics = sample_round(cfg, task, model, rng, collect, cores, i)
                    guard.phase = None
                    if len(rows) < 2:  # a training row and a held-out one at least
                        rounds.append({"round": i, "skipped": skip_reason, **metrics})
                        log.step(i, metrics)
                        record(i)
                        guard.finish_step()  # (a stop signal: the run stops here, the round recorded)
                        continue
                    if rdir.exists():  # what a start of this round that rounds.json does not record left
                        shutil.rmtree(rdir)
                    rdir.mkdir(parents=True)
                    write_atomic(data, "".join(json.dumps(x) + "\n" for x in rows))
                    record(i - 1, {"round": i, "metrics": metrics}, before)
                    if guard.stop_asked():  # a stop signal while sampling: stop here, the samples saved
                        raise Interrupted(guard.signum, f"stopped by {signal.Signals(guard.signum).name} after round "
                                          f"{i} sampled; its samples are saved, and a resume trains them", saved=i - 1)
                summary = train_round(config.with_overrides(cfg, [f"model.name={model}", f"pref.data={data}",
                                                                  "pref.online_rounds=0"]), rdir, kind, i)
                model = summary["model"]
                rounds.append({"round": i, **metrics, "heldout_accuracy": model_accuracy(cfg, model),
                               after[0]: summary["heldout_after"].get(after[1])})
                log.step(i, {k: v for k, v in rounds[-1].items() if isinstance(v, (int, float)) and k != "round"})
                record(i)
                guard.finish_step()  # a stop signal while it was measured: the run stops after it (steps())
    finally:
        log.close()
    model = final_model(run_dir, model, cfg.model.name)
    return log.write_summary({"kind": summary_kind, "rounds": rounds, "model": model,
                              "heldout_before": rounds[0]["heldout_accuracy"],
                              "heldout_after": rounds[-1].get("heldout_accuracy")})


def begin(cfg: config.Config, run_dir: Path, summary_kind: str, resume: bool,
          rng: random.Random) -> tuple[str, list[dict], dict | None, bool]:
    """(the policy to sample from, the rounds' records, the pending round or None, whether the run is new): a
    new run measures its base model (round 0); a resume reads RUN/rounds.json and puts ``rng`` as it was before
    the next round's prompts were drawn."""
    state = round_state.read(run_dir, summary_kind) if resume else None
    if state is None:
        return cfg.model.name, [{"round": 0, "heldout_accuracy": model_accuracy(cfg, cfg.model.name)}], None, True
    rng.setstate(state["rng"])
    return state["model"], state["rounds"], state.get("pending"), False


def train_round(round_cfg: config.Config, rdir: Path, kind: str, i: int) -> dict:
    """One pass of train_offline on round ``i``'s rows in ``rdir``; its summary. A pending round (its rows on
    disk before a stop) goes on from its newest intact checkpoint, or, trained but not yet measured, is not
    trained again: its summary.json is read."""
    if (rdir / "summary.json").is_file():
        return round_summary(rdir / "summary.json")
    return train_offline(round_cfg, rdir, kind, resume=checkpoint.newest_intact(rdir) is not None,
                         unit=f"round {i}'s step")


def round_summary(path: Path) -> dict:
    """A round's summary.json (train_offline's), checked: one line naming the file and the field."""
    try:
        summary = json.loads(path.read_text())
    except (ValueError, OSError) as e:
        raise DataError(f"{path}: not readable JSON ({type(e).__name__}); remove {path.parent} to train the round "
                        "again") from None
    return check(summary, {"model": str, "heldout_after": dict}, str(path))


def sample_round(cfg: config.Config, task, model: str, rng: random.Random, collect, cores: Cores,
                 i: int) -> tuple[list[dict], dict]:
    """Round ``i``'s rows and metrics: ``pref.online_prompts`` training prompts drawn by ``rng``, K samples
    each from ``model`` under torch seed run.seed + i (so a resumed run samples as the uninterrupted one)."""
    sample_cfg = config.with_overrides(cfg, [f"model.name={model}", "algo.kl_coef=0", "algo.name=grpo"])
    roles = build.build_roles(sample_cfg, task)
    torch.manual_seed(cfg.run.seed + i)
    try:
        cores.adjust()
        return collect(roles, draw(rng, task, cfg), cfg.rollout.group_size, cfg)
    finally:
        roles.close()


def draw(rng: random.Random, task, cfg: config.Config) -> list[dict]:
    """A round's prompts: ``pref.online_prompts`` training rows (all of them where there are fewer)."""
    return rng.sample(task.train, min(cfg.pref.online_prompts, len(task.train)))
