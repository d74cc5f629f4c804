"""Shared knobs and task families through the real loop (recipes/rl.py) on the tiny model."""

import json

import pytest
import torch
from helpers import rl_batch, tiny_cfg

from rlpost import build
from rlpost.envs import TASK_KEY, build_task
from rlpost.recipes.rl import train
from rlpost.recipes.sampling_stage import batch_metrics


def test_prime_runs_in_the_loop_and_logs_the_implicit_reward(tmp_path):
    cfg = tiny_cfg("algo.prime_coef=0.5", "algo.kl_coef=0")
    train(cfg, tmp_path / "run")
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    implicit = [r["reward/implicit_prm_mean"] for r in rows]
    # beta * sum_t log(pi / pi_ref), mean over rows: 0 at step 1 (the policy is the reference), not
    # once a step has moved the policy (measured -0.016 at step 2)
    assert len(implicit) == 2 and abs(implicit[0]) < 1e-5 and abs(implicit[1]) > 1e-3


def test_tool_task_trains_through_the_loop(tmp_path):
    # a random model's episodes all score 0 (no advantage): the entropy bonus keeps a gradient
    cfg = tiny_cfg("task.name=tools", "task.max_episode_tokens=12", "algo.entropy_coef=0.01")
    summary = train(cfg, tmp_path / "run")
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # a random model rarely calls the tool: every episode has one turn at least, calls are counted
    assert [r["env/turns_mean"] >= 1 and r["env/tool_calls_per_episode"] >= 0 and r["env/episodes"] == 16
            for r in rows] == [True, True]
    assert all(r["actor/grad_norm"] > 0 for r in rows) and 0 <= summary["heldout_accuracy_after"] <= 1


def test_early_stopping_ends_the_run_and_the_model_is_the_selected_step(tmp_path):
    # The tiny random model scores 0 on every held-out problem: step 1's evaluation is the best (0.0),
    # step 2's ties it (no new best) -> with patience 1 the run stops after step 2 of 6. The final
    # evaluation ties too, and a tie goes to the later step: step 2 is selected. Step 1's checkpoint
    # (a best) is kept although run.keep_checkpoints=1; RUN/model exists; the report names the step.
    cfg = tiny_cfg("run.steps=6", "run.eval_every=1", "run.early_stop_patience=1", "run.keep_checkpoints=1",
                   "run.checkpoint_every=0")
    run = tmp_path / "run"
    summary = train(cfg, run)
    assert summary["steps"] == 2 and summary["selected_step"] == 2 and summary["heldout_accuracy_selected"] == 0.0
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_000001", "step_000002"]
    assert (run / "model" / "config.json").exists()
    assert "Selected step 2" in (run / "report.html").read_text()


def test_entropy_shaped_advantage_gets_the_trainers_entropy_in_the_loop(tmp_path):
    # build.make_trainer must hand the loss the per-token entropy when only algo.entropy_adv_coef is on
    # (it used to do so only for the entropy bonus; the wrapper would raise a TypeError). A reward that
    # varies within every group whatever the model gives non-zero advantages, so the shaping is > 0.
    train(tiny_cfg("algo.entropy_adv_coef=0.5", "algo.kl_coef=0", "task.verifier=toy_verifiers:odd_length"),
          tmp_path / "run")
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["actor/entropy_adv_mean"] > 0 for r in rows)


def test_distill_pulls_the_student_towards_a_teacher_through_the_loop(tiny, tmp_path):
    # A teacher folder that differs from the student (the tiny model with perturbed weights): the
    # reference role holds it, its log-probs make non-zero advantages, and the student is updated.
    # A teacher with another tokenizer is refused in one line.
    import pytest
    import torch

    from rlpost.model.load import save_model
    from rlpost.types.errors import ConfigError
    with torch.no_grad():
        for p in tiny.model.parameters():
            p.add_(0.5 * torch.randn_like(p))
    teacher = save_model(tiny.model, tiny.tokenizer, tmp_path / "teacher")
    summary = train(tiny_cfg("algo.name=distill", f"algo.teacher={teacher}"), tmp_path / "run")
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(abs(r["distill/reverse_kl"]) > 1e-3 and r["actor/grad_norm"] > 0 for r in rows) and summary["steps"] == 2
    with pytest.raises(ConfigError, match="algo.teacher: .* has another tokenizer"):
        train(tiny_cfg("algo.name=distill", "algo.teacher=embedded"), tmp_path / "run2")


def test_the_online_curriculum_hears_every_prompts_pass_rate_in_the_loop(tmp_path):
    # the sampling stage reports each generated prompt's pass rate to the stream: 4 prompts a step, 2 steps
    train(tiny_cfg("rollout.curriculum_window=2", "algo.kl_coef=0"), tmp_path / "run")
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["curriculum/tracked_prompts"] for r in rows] == [4, 8] and rows[-1]["curriculum/skipped"] == 0


@pytest.mark.plots  # reads the per-family plot's title in report.html
def test_a_mix_reports_each_familys_reward_and_heldout_accuracy_consistent_with_the_whole(tmp_path):
    # task.mix=arithmetic:0.5,math:0.5 on the tiny model, whose own completions are all wrong: the
    # sampler is wrapped to answer some rows with the gold answer, written as each family's verifier
    # reads it (the integer; \boxed{} for math): arithmetic rows with an even answer, math rows whose
    # answer is a fraction. The real mix verifier (worker processes) scores them, so each family's
    # held-out accuracy is known here by counting, and the whole is their mean weighted by rows.
    cfg = tiny_cfg("task.mix=arithmetic:0.5,math:0.5", "run.eval_every=1", "run.steps=2", "algo.kl_coef=0")
    solved = lambda r: int(r["answer"]) % 2 == 0 if r[TASK_KEY] == "arithmetic" else "\\frac" in r["answer"]
    gold = lambda r: r["answer"] if r[TASK_KEY] == "arithmetic" else f"\\boxed{{{r['answer']}}}"

    def make_roles(*args, **kwargs):
        roles = build.build_roles(*args, **kwargs)
        generate = roles.rollout.generate

        def answering(rows, **kw):
            b = generate(rows, **kw)
            b.completions = [gold(r) if solved(r) else c for r, c in zip(b.rows, b.completions)]
            return b

        roles.rollout.generate = answering
        return roles

    heldout = build_task(cfg.task).heldout
    expected = {f: sum(map(solved, rs)) / len(rs) for f in ("arithmetic", "math")
                for rs in [[r for r in heldout if r[TASK_KEY] == f]]}
    assert 0 < expected["arithmetic"] < 1 and 0 < expected["math"] < 1  # both families partly right: not a 0 = 0 check
    s = train(cfg, tmp_path / "run", make_roles=make_roles)
    whole = (expected["arithmetic"] * s["heldout_n/arithmetic"]
             + expected["math"] * s["heldout_n/math"]) / s["heldout_n"]
    assert s["heldout_n/arithmetic"] == s["heldout_n/math"] == 8 and s["heldout_n"] == 16
    for when in ("before", "after"):
        assert {f: s[f"heldout_accuracy_{when}/{f}"] for f in expected} == pytest.approx(expected)
        assert s[f"heldout_accuracy_{when}"] == pytest.approx(whole)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["eval/heldout_accuracy/math"] == pytest.approx(expected["math"])
    assert rows[0]["eval/heldout_accuracy"] == pytest.approx(whole)
    for r in rows:  # each step's batch: the shares add up to 1 and weight the families' rewards into the mean
        share = {f: r.get(f"mix/share/{f}", 0.0) for f in expected}
        assert sum(share.values()) == pytest.approx(1.0)
        assert r["reward/mean"] == pytest.approx(sum(share[f] * r.get(f"reward/mean/{f}", 0.0) for f in expected))
    assert any(0 < r.get("reward/mean/math", 0) for r in rows)  # the wrapped answers were scored by math-verify
    text = (tmp_path / "run" / "report.html").read_text()
    assert "Per task (task.mix" in text and "heldout_accuracy_after/math" in text


def test_batch_metrics_count_groups_without_signal_for_any_reward_scale():
    # Three groups of two: a reward model's (0.3, 0.7) differ (signal, though both "fail" by >= 1),
    # (0.5, 0.5) and (1, 1) are one reward each: zero_std_frac 2/3; by pass rate all three are out of band.
    batch = rl_batch(torch.ones(6, 2, dtype=torch.bool), reward=torch.tensor([0.3, 0.7, 0.5, 0.5, 1.0, 1.0]))
    m = batch_metrics(batch, 2)
    assert m["reward/zero_std_frac"] == pytest.approx(2 / 3) and m["reward/outside_band_frac"] == 1.0


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_run_that_changes_no_weight_gives_every_held_out_answer_again(tmp_path, monkeypatch, dtype):
    # Issue 51: "after" was measured on the training sampler, whose copy of the weights need not be the
    # saved model's, on whatever thread count model/cores.py had moved to by then (a bf16 matmul rounds
    # by how the threads split it: 3 of 40 of the demo's answers moved with no update). Here the
    # sampler's synced copy is pushed off the trainer's weights, and a busy neighbour takes a core
    # once the loop runs: "after" must still be RUN/model's, on the thread count of "before", answer
    # by answer. The tiny model earns no reward on this task, so no step updates the weights.
    import rlpost.recipes.evaluate as ev
    import rlpost.recipes.rl as rl
    from rlpost.observe.runlog import closing_table

    threads, scores = [], ev.heldout_scores
    monkeypatch.setattr(ev, "heldout_scores",
                        lambda *a, **k: threads.append(torch.get_num_threads()) or scores(*a, **k))

    class Busy(rl.Cores):
        def adjust(self) -> int:
            self.threads = 1
            torch.set_num_threads(1)
            return 1

    monkeypatch.setattr(rl, "Cores", Busy)

    def drifting(*args, **kw):  # the training sampler's copy, off by noise after every sync
        roles = build.build_roles(*args, **kw)
        load, noise = roles.rollout.load_weights, torch.Generator().manual_seed(0)
        roles.rollout.load_weights = lambda state, version=None: load(
            {k: v + 0.1 * torch.randn(v.shape, generator=noise) for k, v in state.items()}, version)
        return roles

    run = tmp_path / "run"
    summary = train(tiny_cfg("run.steps=1", "run.threads=2", f"rollout.dtype={dtype}", "task.n_heldout=16"), run,
                    make_roles=drifting)
    answers = [[json.loads(x)["completion"] for x in (run / "samples" / f"eval_{when}.jsonl").read_text().splitlines()]
               for when in ("before", "after")]
    assert len(answers[0]) == 16 and answers[0] == answers[1]
    assert threads == [2, 2]  # before, after
    assert summary["weights_changed"] is False and summary["heldout_answers_changed"] == 0
    assert summary["heldout_accuracy_after"] == summary["heldout_accuracy_before"]
    assert "+0.0 points: RUN/model holds the starting weights, unchanged" in closing_table(summary)


def test_a_model_with_the_starting_weights_never_reports_a_gain(tmp_path, tiny, monkeypatch):
    # A measurement of RUN/model that differs from "before" although RUN/model is the starting model
    # (an evaluation that does not reproduce itself on this machine) reports no change; once one weight
    # differs, what was measured is reported, with its paired standard error.
    import rlpost.recipes.rl as rl
    from safetensors.torch import load_file, save_file

    from rlpost.model.load import save_model
    from rlpost.observe.runlog import closing_table

    run, rows = tmp_path / "run", [{"messages": [{"role": "user", "content": q}]} for q in ("a", "b")]
    model = save_model(tiny.model, tiny.tokenizer, run / "model")
    (run / "samples").mkdir()
    (run / "samples" / "eval_before.jsonl").write_text(
        "".join(json.dumps({"prompt": q, "completion": "x", "correct": False}) + "\n" for q in "ab"))

    def measured_half(cfg, folder, task, heldout, dump, *_):
        dump.write_text("".join(json.dumps({"prompt": q, "completion": c, "correct": c == "1"}) + "\n"
                                for q, c in (("a", "1"), ("b", "x"))))
        return 0.5, {}

    monkeypatch.setattr(rl, "saved_model_scores", measured_half)
    measured = rl.Measured(rows, (0.0, {}), None, torch.get_num_threads())
    before, after, compared, _ = rl.after_training(run, tiny_cfg(), model, None, measured)
    assert (before, after) == (0.0, 0.0) and compared["weights_changed"] is False
    assert compared["heldout_accuracy_after_measured"] == 0.5 and compared["heldout_delta"] == 0.0
    summary = {"heldout_accuracy_before": before, "heldout_accuracy_after": after, "heldout_n": 2, "steps": 1,
               "wall_minutes": 0.1, **compared}
    assert "(+0.0 points: RUN/model holds the starting weights, unchanged)" in closing_table(summary)

    weights = load_file(model / "model.safetensors")
    name = next(iter(weights))
    weights[name] = weights[name].clone()
    weights[name].view(-1)[0] += 1e-3
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    before, after, compared, _ = rl.after_training(run, tiny_cfg(), model, None, measured)
    # d = (1, 0): mean 0.5, paired s.e. sqrt((0.25 + 0.25) / (2 * 1)) = 0.5
    assert (after, compared["weights_changed"], compared["heldout_delta_se"]) == (0.5, True, 0.5)
    summary.update(heldout_accuracy_after=after, **compared)
    assert "(+50.0 ± 50.0 points, paired s.e.; 1 of 2 answers changed)" in closing_table(summary)


def test_rewards_finite_in_float32_whose_sum_and_square_are_not_train_and_summarise(tmp_path):
    """A reward function returning 3.4e38 (the float32 format's edge, accepted as finite): its group std
    squared past float32 (every advantage NaN, every update skipped), the step's mean summed past it (a
    null in metrics.jsonl) and the closing summary then stopped in a traceback. Statistics run in float64
    now: the updates change the weights, every step's reward mean is a finite number, and the summary's
    averages are those numbers."""
    summary = train(tiny_cfg("task.verifier=toy_verifiers:near_float32_max", "run.steps=2", "task.n_heldout=2",
                             "task.verifier_workers=1"), tmp_path)
    steps = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in steps if "reward/mean" in m]
    assert len(steps) == 2 and summary["weights_changed"] and summary["steps"] == 2
    assert all(0 < m["reward/mean"] <= 3.4e38 and m["actor/grad_norm"] > 0 for m in steps)
    assert all(m.get("actor/nonfinite_steps", 0) == 0 for m in steps)
    first, last = steps[0]["reward/mean"], steps[1]["reward/mean"]
    assert (summary["reward_mean_first"], summary["reward_mean_last"]) == (first, last)
