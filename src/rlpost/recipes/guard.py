"""What stops a run, and how: the checks a recipe's loop makes at fixed points of every step. Every
recipe runs inside one (the RL loop; sft, rm and dpo, and the rounds and pipeline stages built on
them: recipes/offline.py); what "saved" means is the recipe's (a checkpoint; RUN/model so far).

- **Signals** (``SIGNALS``; the same table outside the loop, ``startup_signals``). The first SIGINT
  (Ctrl-C), SIGTERM or SIGHUP (the terminal closed) lets the current step finish, at most
  ``run.stop_grace_s`` more seconds; the loop then saves a checkpoint and the run stops with
  ``Interrupted`` (exit 130, 143 or 129). A step that does not finish in time is abandoned (nothing
  of it is saved; the last checkpoint is where a resume starts), and so is one hit by a second
  signal. SIGQUIT (Ctrl-\\) stops at once, like a second signal: the current step is not saved (exit
  131), and no core is dumped. SIGUSR1 prints one line saying where the run is (step, minutes) and
  the run goes on. Stopping children (verifier workers and what they started, Ray actors,
  sandboxes) is the loop's ``finally``.
- **Reward functions that fail.** A function that fails (raises, dies, times out, returns NaN/inf)
  on more than ``task.max_reward_error_frac`` of a step's completions, or on every completion of
  the first batch, stops the run before that step's update (``RunError``); so does an environment
  whose calls fail on that share of a step's episodes (env/errors, env/timeouts).
- **Non-finite updates.** The trainer skips an optimizer step whose loss or gradient is not finite
  (roles/trainer.py); ``trainer.max_nonfinite_steps`` training steps in a row with such a skip stop
  the run before anything of them is saved.
- **Early stopping** (``run.early_stop_patience`` > 0). Each held-out evaluation is compared with
  the best so far; a new best is checkpointed (and kept whatever ``run.keep_checkpoints`` says),
  and that many evaluations in a row without one end the run normally, after the step's
  checkpoint. ``select`` then names the step the run's model comes from: the best evaluation,
  the final one included. The before-training accuracy is no candidate (there is no checkpoint of
  it). Chosen on the held-out set, the selected accuracy is an optimistic estimate.

Signal handlers can only be set from the main thread; elsewhere (a library caller's thread) the
guard does the other two checks and leaves signals alone.
"""

from __future__ import annotations

import signal
import threading
import time
from contextlib import contextmanager

from rlpost import config
from rlpost.console import say
from rlpost.envs import on_endpoint
from rlpost.types.errors import Interrupted, RunError

STOP = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # finish the step, save it, stop
SIGNALS = {**{s: "stop" for s in STOP}, signal.SIGQUIT: "quit", signal.SIGUSR1: "status"}


@contextmanager
def startup_signals():
    """Outside a recipe's loop (start-up, evaluation, sampling a round): every stop signal, and SIGQUIT,
    stop at once with ``Interrupted`` (one line; the run folder's failed-start clean-up runs);
    SIGUSR1 says the command is not training yet. Only from the main thread (a library caller's
    thread leaves signals alone)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.signal(sig, _startup_handler) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _startup_handler(signum: int, frame) -> None:
    if SIGNALS[signum] == "status":
        say("SIGUSR1: not training yet (starting up, evaluating, or a recipe outside the RL loop)")
        return
    raise Interrupted(signum)


class RunGuard:
    def __init__(self, cfg: config.Config, early_stop: dict | None = None, *, saved: str = "checkpoint",
                 after_nonfinite: str = "the last checkpoint holds the last finite weights. Try a lower trainer.lr, "
                                        "and check the rewards (rlpost doctor)", unit: str = "step"):
        """saved: what a stop saves, for its line; after_nonfinite: what the non-finite stop's line says next;
        unit: what the loop's steps are, for the lines ('round' for a run in rounds, "round 2's step" for a
        round's training). ``phase`` (set by the loop while it lasts: (what, what a stop then saves)) names
        a part of a step that a stop ends early, for the signal's line."""
        self.cfg = cfg
        self.saved, self.after_nonfinite, self.unit = saved, after_nonfinite, unit
        self.phase: tuple[str, str] | None = None
        self.step, self.step_done = 0, False  # step_done: its checkpoint decided (finish_step)
        self.last = cfg.run.steps  # the run's last step (steps() sets it: sft, rm and dpo count pref.epochs)
        # early stopping: the best evaluation (step, accuracy) and evaluations since; a resumed run's from its
        # checkpoint
        self.best: tuple[int, float] | None = (early_stop or {}).get("best")
        self.evals_since_best: int = (early_stop or {}).get("evals_since_best", 0)
        self.new_best = self.early_stopped = False
        self.signum: int | None = None  # the first stop signal received
        self.stopping = False  # the loop was told to save and stop (finish_step)
        self.nonfinite_streak = 0
        self.first_batch = True
        self.saved_handlers: dict = {}

    # --- signals -------------------------------------------------------------------------------

    def __enter__(self) -> RunGuard:
        self.started = time.monotonic()
        if threading.current_thread() is threading.main_thread():
            handlers = {"stop": self._on_signal, "quit": self._on_quit, "status": self._on_status}
            for sig, what in [*SIGNALS.items(), (signal.SIGALRM, None)]:
                self.saved_handlers[sig] = signal.signal(sig, handlers[what] if what else self._on_alarm)
        return self

    def __exit__(self, *exc) -> None:
        if self.saved_handlers:
            signal.setitimer(signal.ITIMER_REAL, 0)
            for sig, handler in self.saved_handlers.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        unit = self.unit
        if self.signum is not None:
            raise Interrupted(signum, f"stopped by a second {name} during {unit} {self.step}; that {unit} was not "
                              "saved")
        self.signum = signum
        # a signal after the step's checkpoint was decided (while it is written, say) lets the next step run
        doing = (f"finishing {self.phase[0]}" if self.phase else f"finishing {unit} {self.step}" if not self.step_done
                 else f"{unit} {self.step} is done; finishing {unit} {self.step + 1}" if self.step < self.last else
                 f"{unit} {self.step}, the last, is done; finishing the run")
        saving = self.phase[1] if self.phase else f"{'a ' if self.saved == 'checkpoint' else 'the '}{self.saved}"
        say(f"{name}: {doing} (at most run.stop_grace_s={self.cfg.run.stop_grace_s:g} s), then saving {saving} and "
            f"stopping; {name} again stops at once")
        signal.setitimer(signal.ITIMER_REAL, max(self.cfg.run.stop_grace_s, 1e-3))

    def _on_quit(self, signum: int, frame) -> None:
        where = (f"after {self.unit} {self.step}" if self.step_done else
                 f"during {self.unit} {self.step}, which was not saved")
        raise Interrupted(signum, f"stopped at once by SIGQUIT {where}; the newest checkpoint is where a resume starts")

    def _on_status(self, signum: int, frame) -> None:
        stopping = f"; stopping after it ({signal.Signals(self.signum).name})" if self.signum is not None else ""
        say(f"SIGUSR1: {self.unit} {self.step} of {self.last} running, {(time.monotonic() - self.started) / 60:.1f} "
            f"min into this start{stopping}. SIGINT, SIGTERM or SIGHUP stop after the {self.unit} (saved), SIGQUIT "
            "at once")

    def _on_alarm(self, signum: int, frame) -> None:
        grace = f"run.stop_grace_s={self.cfg.run.stop_grace_s:g} s"
        if self.step_done:  # trained, and its checkpoint being written when the grace ran out
            raise Interrupted(self.signum or signal.SIGTERM, f"{self.unit} {self.step} was trained, but {grace} ran "
                              "out while its checkpoint was written; that checkpoint was abandoned, and the newest "
                              "whole one is where a resume starts")
        raise Interrupted(self.signum or signal.SIGTERM, f"{self.unit} {self.step} did not finish within {grace} and "
                          "was abandoned; it was not saved")

    def steps(self, first: int, last: int):
        """range(first, last + 1), stopping with ``Interrupted`` after the step during which a
        signal came in, once the loop has saved it (``finish_step`` told it to). A signal that
        comes after that point (the step's checkpoint already decided) lets the next step run."""
        self.last = last
        for step in range(first, last + 1):
            self.step, self.step_done = step, False
            yield step
            if self.early_stopped:
                return
            if self.stopping:
                raise Interrupted(self.signum, f"stopped by {signal.Signals(self.signum).name} after {self.unit} "
                                  f"{step}, whose {self.saved} is saved", saved=step)

    def stop_asked(self) -> bool:
        """Whether a stop signal came in (the grace timer then cancelled): for a loop that ends a step early
        at a point of its own (a round stops after its sampling, its samples saved: recipes/online.py)."""
        if self.signum is not None and self.saved_handlers:
            signal.setitimer(signal.ITIMER_REAL, 0)
        return self.signum is not None

    def finish_step(self, metrics: dict | None = None) -> bool:
        """The step's work is done: cancel the grace timer, read its held-out evaluation (if any) for
        early stopping; True when the step must be saved (a stop was asked for, a new best, an early stop)."""
        if metrics is not None and "eval/heldout_accuracy" in metrics:
            self.check_eval(metrics["eval/heldout_accuracy"], self.step)
        self.stopping, self.step_done = self.stop_asked(), True
        save, self.new_best = self.stopping or self.new_best or self.early_stopped, False
        return save

    # --- early stopping and the selected step ---------------------------------------------------

    def check_eval(self, accuracy: float, step: int) -> None:
        """After a held-out evaluation: track the best; stop after run.early_stop_patience evaluations without one."""
        patience = self.cfg.run.early_stop_patience
        if patience == 0:
            return
        self.new_best = self.best is None or accuracy > self.best[1]
        self.best, self.evals_since_best = (((step, accuracy), 0) if self.new_best
                                            else (self.best, self.evals_since_best + 1))
        if self.evals_since_best >= patience:
            self.early_stopped = True
            say(f"early stop after step {step}: {patience} held-out evaluations without beating "
                f"{self.best[1]:.3f} (step {self.best[0]}); run.early_stop_patience={patience}")

    def select(self, final_accuracy: float) -> tuple[int, float] | None:
        """(step, held-out accuracy) whose weights the run's model holds: the best evaluation, the final
        one (after the last step) included; None without early stopping (the last step, as always)."""
        if self.cfg.run.early_stop_patience == 0:
            return None
        if self.best is None or final_accuracy >= self.best[1]:  # a tie goes to the later, longer-trained step
            return self.step, final_accuracy
        return self.best

    def early_stop_state(self) -> dict:
        """What a checkpoint keeps, so a resumed run goes on counting."""
        return {"best": self.best, "evals_since_best": self.evals_since_best}

    # --- failing rewards, non-finite updates ----------------------------------------------------

    def check_rewards(self, metrics: dict, step: int) -> None:
        """After scoring: RunError if a reward function failed too often (see the module docstring)."""
        counts = failure_counts(metrics)
        if metrics.get("env/episodes"):  # an environment's calls that raised, hung, died or returned garbage
            task = self.cfg.task
            what = f"agent {task.agent}" if task.agent else f"environment {task.env or task.name}"
            log = "agent.log" if task.agent or on_endpoint(task) else "env.log"  # verifiers' episodes are agents
            counts.append((what, "episodes", metrics["env/episodes"],
                           metrics.get("env/errors", 0) + metrics.get("env/timeouts", 0), log))
        stop_on_failures(counts, self.cfg.task.max_reward_error_frac, f"at step {step}", self.first_batch,
                         "stopped before that step's update")
        self.first_batch = False

    def check_update(self, metrics: dict, step: int) -> None:
        """After the update: count steps with skipped (non-finite) optimizer steps; RunError after
        trainer.max_nonfinite_steps of them in a row."""
        skipped = metrics.get("actor/nonfinite_steps", 0)
        if not skipped:
            self.nonfinite_streak = 0
            return
        self.nonfinite_streak += 1
        limit = self.cfg.trainer.max_nonfinite_steps
        say(f"step {step}: a non-finite loss or gradient; {skipped:g} optimizer step(s) skipped, "
            f"{self.nonfinite_streak} training step(s) in a row (trainer.max_nonfinite_steps={limit} stops the run)")
        if self.nonfinite_streak >= limit:
            raise RunError(f"{limit} training steps in a row with a non-finite loss or gradient (the last at step "
                           f"{step}); stopped without saving them: {self.after_nonfinite}")


def check_reward_failures(metrics: dict, frac: float, where: str, first: bool, what: str) -> None:
    """RunError when a reward function failed (raised, timed out, returned text or NaN) on more than
    ``frac`` of its calls in ``metrics`` (a scorer's verifier/<name>/calls|errors|timeouts), or on
    every call of the ``first`` batch. The RL loop, online DPO, rejection-sampling SFT and held-out
    evaluation all stop by this one rule."""
    stop_on_failures(failure_counts(metrics), frac, where, first, what)


def failure_counts(metrics: dict) -> list[tuple]:
    """(what, unit, calls, failed, log) of each reward function in a scorer's metrics."""
    return [(f"reward function {key[len('verifier/'):-len('/calls')]}", "completions", calls,
             metrics.get(f"{key[:-len('/calls')]}/errors", 0) + metrics.get(f"{key[:-len('/calls')]}/timeouts", 0),
             "verifier.log")
            for key, calls in metrics.items() if key.startswith("verifier/") and key.endswith("/calls")]


def stop_on_failures(counts: list[tuple], frac: float, where: str, first: bool, what: str) -> None:
    for name, unit, calls, failed, log in counts:
        if calls and (failed / calls > frac or (first and failed == calls)):
            why = (f"{failed / calls:.0%} > task.max_reward_error_frac={frac:g}" if failed / calls > frac
                   else f"every {unit[:-1]} of the first batch")
            raise RunError(f"{name} failed on {failed} of {calls} {unit} {where} ({why}); {what}. Its first failure is "
                           f"printed above, and the tracebacks, where it raised, are in the run folder's {log}")
