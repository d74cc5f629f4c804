"""What stops a run: signals (finish the step, then stop; abandon it after the grace; a second
signal at once), reward functions that keep failing, and non-finite updates in a row."""

import os
import signal
import time

import pytest
from helpers import tiny_cfg

from rlpost.recipes.guard import RunGuard
from rlpost.types.errors import Interrupted, RunError


def test_a_signal_lets_the_step_finish_then_stops_after_it_is_saved():
    saved = []
    with pytest.raises(Interrupted) as e, RunGuard(tiny_cfg("run.steps=5")) as guard:
        for step in guard.steps(1, 5):
            if step == 2:
                os.kill(os.getpid(), signal.SIGTERM)  # arrives mid-step: the step goes on
            if guard.finish_step():
                saved.append(step)
    assert saved == [2] and e.value.saved == 2 and e.value.signum == signal.SIGTERM
    assert "after step 2" in e.value.message


def test_a_signal_after_the_save_decision_stops_after_the_next_step(capsys):
    steps = []
    with pytest.raises(Interrupted) as e, RunGuard(tiny_cfg("run.steps=5")) as guard:
        for step in guard.steps(1, 5):
            steps.append(step)
            guard.finish_step()
            if step == 1:
                os.kill(os.getpid(), signal.SIGINT)  # like the loop's on_step_end: after the checkpoint
    assert steps == [1, 2] and e.value.saved == 2 and e.value.signum == signal.SIGINT
    # the line says which step it finishes: the next one, not the one done (it said "finishing step 1")
    assert "SIGINT: step 1 is done; finishing step 2 " in capsys.readouterr().err


def test_a_grace_that_runs_out_while_a_trained_step_is_saved_says_so():
    with pytest.raises(Interrupted) as e, RunGuard(tiny_cfg("run.stop_grace_s=0.05")) as guard:
        for step in guard.steps(1, 3):
            guard.finish_step()  # trained, its checkpoint decided: now it is being written
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)  # the alarm interrupts this
    assert e.value.saved is None and "step 1 was trained, but run.stop_grace_s=0.05 s ran out while its checkpoint " \
        "was written" in e.value.message


def test_a_step_that_outlasts_the_grace_is_abandoned_unsaved():
    with pytest.raises(Interrupted) as e, RunGuard(tiny_cfg("run.stop_grace_s=0.05")) as guard:
        for step in guard.steps(1, 3):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)  # the alarm interrupts this
    assert e.value.saved is None and "did not finish within run.stop_grace_s" in e.value.message


def test_a_second_signal_stops_at_once():
    with pytest.raises(Interrupted) as e, RunGuard(tiny_cfg()) as guard:
        for step in guard.steps(1, 3):
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(30)
    assert e.value.saved is None and "second SIGINT" in e.value.message


def test_handlers_are_put_back():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with RunGuard(tiny_cfg()):
        assert signal.getsignal(signal.SIGINT) is not before[0]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def metrics(errors, timeouts, calls, name="f"):
    return {f"verifier/{name}/errors": errors, f"verifier/{name}/timeouts": timeouts, f"verifier/{name}/calls": calls}


def test_reward_function_failures_over_the_fraction_stop_the_run():
    guard = RunGuard(tiny_cfg("task.max_reward_error_frac=0.5"))
    guard.check_rewards(metrics(1, 0, 16), 1)  # 1 of 16 on the first batch: go on
    guard.check_rewards(metrics(4, 4, 16), 2)  # 50%: not more than the fraction
    with pytest.raises(RunError,
                       match=r"reward function f failed on 9 of 16 completions at step 3 \(56% > "
                             r"task.max_reward_error_frac=0.5\)"):
        guard.check_rewards(metrics(5, 4, 16), 3)


def test_failing_on_every_completion_of_the_first_batch_stops_even_at_frac_1():
    guard = RunGuard(tiny_cfg("task.max_reward_error_frac=1"))
    with pytest.raises(RunError, match="every completion of the first batch"):
        guard.check_rewards({**metrics(0, 0, 16, "ok"), **metrics(16, 0, 16)}, 1)
    later = RunGuard(tiny_cfg("task.max_reward_error_frac=1"))
    later.check_rewards(metrics(0, 0, 16), 1)
    later.check_rewards(metrics(16, 0, 16), 2)  # later, only the fraction decides


def test_an_environment_failing_past_the_fraction_stops_the_run_in_one_line():
    guard = RunGuard(tiny_cfg("task.name=env", "task.env=guess", "task.max_reward_error_frac=0.25"))
    guard.check_rewards({"env/episodes": 16, "env/errors": 2, "env/timeouts": 2}, 1)  # 25%: not more than the fraction
    with pytest.raises(RunError, match=r"^environment guess failed on 5 of 16 episodes at step 2 \(31% > "
                                       r"task.max_reward_error_frac=0.25\); .* the run folder's env.log$"):
        guard.check_rewards({"env/episodes": 16, "env/errors": 2, "env/timeouts": 3}, 2)
    first = RunGuard(tiny_cfg("task.name=env", "task.env=guess", "task.max_reward_error_frac=1"))
    with pytest.raises(RunError, match="every episode of the first batch"):
        first.check_rewards({"env/episodes": 16, "env/errors": 16, "env/timeouts": 0}, 1)


def test_nonfinite_updates_in_a_row_stop_the_run():
    guard = RunGuard(tiny_cfg("trainer.max_nonfinite_steps=2"))
    guard.check_update({"actor/nonfinite_steps": 1}, 1)
    guard.check_update({"actor/nonfinite_steps": 0}, 2)  # the streak restarts
    guard.check_update({"actor/nonfinite_steps": 2}, 3)
    with pytest.raises(RunError, match="2 training steps in a row with a non-finite loss or gradient"):
        guard.check_update({"actor/nonfinite_steps": 1}, 4)


def test_early_stopping_tracks_the_best_and_stops_after_patience_evaluations():
    # run.early_stop_patience=2, held-out accuracy at steps 2, 4, 6, 8: 0.3 (best), 0.5 (best),
    # 0.4 (1 without a new best), 0.5 (a tie is no new best: 2) -> stop after step 8.
    # Saved: steps 2 and 4 (new bests) and 8 (the stop); not 6 nor the steps without an evaluation.
    guard = RunGuard(tiny_cfg("run.early_stop_patience=2", "run.eval_every=2"))
    acc = {2: 0.3, 4: 0.5, 6: 0.4, 8: 0.5}
    saved, ran = [], []
    for step in guard.steps(1, 20):
        ran.append(step)
        if guard.finish_step({"eval/heldout_accuracy": acc[step]} if step in acc else {}):
            saved.append(step)
    assert ran == list(range(1, 9)) and saved == [2, 4, 8]
    assert guard.best == (4, 0.5) and guard.early_stop_state() == {"best": (4, 0.5), "evals_since_best": 2}
    # the run's model: the best evaluation, the final one (after step 8) included; a tie goes to the later step
    assert guard.select(0.45) == (4, 0.5)
    assert guard.select(0.5) == (8, 0.5)
    # a resumed run goes on counting from its checkpoint's state: one more evaluation without a best stops it
    again = RunGuard(tiny_cfg("run.early_stop_patience=3", "run.eval_every=2"), guard.early_stop_state())
    assert [s for s in again.steps(9, 20) if again.finish_step({"eval/heldout_accuracy": 0.1}) or True] == [9]


def test_without_early_stopping_every_step_runs_and_nothing_is_selected():
    guard = RunGuard(tiny_cfg())
    ran = [s for s in guard.steps(1, 5) if not guard.finish_step({"eval/heldout_accuracy": 0.0})]
    assert ran == [1, 2, 3, 4, 5] and guard.select(0.9) is None
