"""Each health check fires on a constructed history showing its failure and stays quiet on a
healthy one; `rlpost doctor` prints the finding and its knob."""

import json

from helpers import cli

from rlpost.observe import diagnostics as dg


def healthy(n=12):
    return [{"step": s, "actor/logp_diff_sampler_mean": 0.01, "actor/logp_diff_sampler_max": 0.3,
             "actor/entropy": 1.0 - 0.02 * s, "actor/kl": 0.01 + 0.001 * s, "response_length/mean": 8.0,
             "response_length/clip_ratio": 0.01, "reward/mean": 0.3 + 0.02 * s, "reward/outside_band_frac": 0.4,
             "reward/zero_std_frac": 0.4, "reward/min": 0.0, "reward/max": 1.0, "actor/grad_norm": 0.5,
             **({"eval/heldout_accuracy": 0.4 + 0.01 * s} if s % 4 == 0 else {})} for s in range(1, n + 1)]


def test_a_healthy_run_has_no_findings():
    assert dg.diagnose(healthy()) == []


def test_each_check_fires_on_its_failure():
    cases = {
        "sampler_mismatch": lambda h: h[5].update({"actor/logp_diff_sampler_max": 3.5}),
        "entropy_collapse": lambda h: h[8].update({"actor/entropy": 0.1}),  # < 20% of ~0.96 early
        "kl_explosion": lambda h: h[9].update({"actor/kl": 0.3}),  # > 10 x median of the steps before (~0.015)
        "length_inflation": lambda h: h[7].update({"response_length/mean": 20.0, "response_length/clip_ratio": 0.5}),
        # held-out evaluations at steps 4, 8: reward up (means over steps 2-4 vs 6-8), accuracy down 0.44 -> 0.30
        "proxy_overfit": lambda h: h[7].update({"eval/heldout_accuracy": 0.30}),
        "outside_learnable_band": lambda h: [r.update({"reward/zero_std_frac": 0.95}) for r in h],
        "truncation": lambda h: h[5].update({"response_length/clip_ratio": 0.87}),  # length not doubled
        "constant_reward": lambda h: [r.update({"reward/max": 0.0}) for r in h],
        "no_update": lambda h: [r.update({"actor/grad_norm": 0.0}) for r in h],
    }
    for name, breaks in cases.items():
        h = healthy()
        breaks(h)
        found = [f.name for f in dg.diagnose(h)]
        assert found == [name], (name, found)


def test_health_metrics_warn_once():
    warnings = []
    health = dg.Health(warnings.append)
    h = healthy()
    h[5]["actor/logp_diff_sampler_mean"] = 0.2
    for i in range(len(h)):
        m = health.metrics(h[: i + 1])
    assert m["health/sampler_mismatch"] == 1.0 and m["health/entropy_collapse"] == 0.0
    assert len(warnings) == 1 and "rollout.dtype=float32" in warnings[0]


def test_doctor_cli(tmp_path):
    h = healthy()
    h[9]["actor/kl"] = 2.0
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in h))
    r = cli("doctor", str(tmp_path))
    assert r.returncode == 0 and "kl_explosion (from step 10)" in r.stdout and "trainer.lr" in r.stdout
    r = cli("doctor", str(tmp_path / "nope"))
    assert r.returncode == 2 and "no metrics.jsonl" in r.stderr


def test_entropy_collapse_advice_names_the_covariance_controls():
    # Cui et al. 2025's Clip-Cov and KL-Cov are the targeted fix for collapse; the advice must name
    # keys that exist (algo.cov_control and its values).
    import typing

    from rlpost.sections import AlgoConfig
    h = healthy()
    h[8]["actor/entropy"] = 0.1
    found = [f for f in dg.diagnose(h) if f.name == "entropy_collapse"]
    assert found and "algo.cov_control=clip_cov or kl_cov" in found[0].knob
    assert {"clip_cov", "kl_cov"} <= set(typing.get_args(typing.get_type_hints(AlgoConfig)["cov_control"]))


def test_a_short_failing_run_is_not_called_healthy(tmp_path):
    # The 2-step run: reward 0, 87.5% of the answers cut off, every group all-fail, no gradient.
    h = [{"step": s, "reward/mean": 0.0, "reward/min": 0.0, "reward/max": 0.0, "response_length/clip_ratio": 0.875,
          "response_length/max": 16.0, "response_length/mean": 15.5, "reward/zero_std_frac": 1.0,
          "reward/outside_band_frac": 1.0, "actor/grad_norm": 0.0} for s in (1, 2)]
    assert [f.name for f in dg.diagnose(h)] == ["truncation", "constant_reward", "no_update"]
    assert "88% of the completions were cut off at the cap of 16 tokens" in dg.truncation(h).what
    assert dg.truncation(h).step == 1
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in h))
    text = dg.doctor_text(tmp_path)
    assert "no health problems" not in text and "3 finding(s)" in text
    assert "too few steps to judge entropy_collapse" in text and "too few steps to judge proxy_overfit" in text


def test_a_healthy_short_run_says_what_it_could_not_judge(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in healthy(2)))
    text = dg.doctor_text(tmp_path)
    assert "no health problems found (9 of 12 checks could judge)" in text, text
    assert "length_inflation: it needs more than 3 steps (has 2)" in text


def test_continuous_rewards_are_not_called_all_pass_or_all_fail():
    # A reward model's scores are never >= 1, so every group is "all-fail" by pass rate, yet each
    # group's rewards differ: the group baseline has signal.
    h = healthy()
    for r in h:
        r.update({"reward/outside_band_frac": 1.0, "reward/zero_std_frac": 0.0, "reward/min": -1.3, "reward/max": 0.7})
    assert dg.diagnose(h) == []
    for r in h:  # a run logged before zero_std_frac existed is judged by the pass-rate share, as then
        del r["reward/zero_std_frac"]
    assert [f.name for f in dg.diagnose(h)] == ["outside_learnable_band"]


def test_truncation_warns_at_step_one():
    warnings = []
    health = dg.Health(warnings.append)
    first = {**healthy(1)[0], "response_length/clip_ratio": 0.9, "response_length/max": 16.0}
    m = health.metrics([first])
    assert m["health/truncation"] == 1.0 and len(warnings) == 1
    assert "rollout.max_new_tokens" in warnings[0] and "(step 1)" in warnings[0]


def test_an_environment_run_hears_about_its_turn_limits_not_a_token_cap():
    first = {**healthy(1)[0], "response_length/clip_ratio": 0.7, "response_length/max": 32.0, "env/episodes": 128}
    found = dg.truncation([first])
    assert found.what == ("70% of the episodes ended at task.max_turns or task.max_episode_tokens "
                          "before the environment ended them")
    assert "task.max_turns" in found.knob and "rollout.max_new_tokens" not in found.knob


def test_doctor_names_a_missing_or_garbage_config_a_garbage_summary_and_a_torn_last_line(tmp_path):
    from helpers import tiny_cfg

    from rlpost import config

    run = tmp_path / "run"
    run.mkdir()
    metrics = "".join(json.dumps(r) + "\n" for r in healthy(2))
    (run / "metrics.jsonl").write_text(metrics)
    config.save(tiny_cfg(), run / "config.yaml")
    (run / "summary.json").write_text('{"steps": 2}\n')
    r = cli("doctor", str(run))
    assert r.returncode == 0 and "run folder" not in r.stdout + r.stderr  # a whole folder: nothing to say
    (run / "metrics.jsonl").write_text(metrics + '{"step": 3, "reward/me')  # the machine stopped mid-write
    (run / "summary.json").write_text('{"steps": 2, "wall_min')
    (run / "config.yaml").write_text("run: [\n")
    r = cli("doctor", str(run))
    said = [line for line in r.stdout.splitlines() if line.startswith("run folder: ")]
    assert r.returncode == 0 and r.stdout.startswith(f"{run}: 2 steps"), r.stdout  # the 2 whole steps are judged
    assert len(said) == 3, r.stdout
    assert said[0].startswith(f"run folder: the run's config does not load (recipe {run / 'config.yaml'} line 2: "
                              "not valid YAML"), said[0]
    assert said[1].startswith(f"run folder: {run / 'summary.json'} is not a JSON object ("), said[1]
    assert said[2].startswith(f"run folder: {run / 'metrics.jsonl'}:3: the last line is cut short"), said[2]
    (run / "config.yaml").unlink()
    r = cli("doctor", str(run), "--json")  # the findings stay JSON on stdout; the folder's problems go to stderr
    assert json.loads(r.stdout) == [] and r.returncode == 0
    assert r.stderr.splitlines()[0] == (f"rlpost: run folder: {run / 'config.yaml'} is missing: the run's settings "
                                        "are gone, so `rlpost train --resume`, `rlpost eval` and `rlpost export` of "
                                        "this folder refuse it")
    assert len(r.stderr.splitlines()) == 3


def test_grading_errors_rising_mid_run_are_said_in_one_line():
    """The code task's share of completions the sandbox could not grade (bwrap could not fork once the
    process limit was reached: every later sample scored 0, silently): a rise mid-run is one health
    line, with the share and where it rose from; a steady small share, or a run without it, is not."""
    def run(shares):
        return [{**row, "reward_extra/grading_error": v} for row, v in zip(healthy(len(shares)), shares)]

    assert dg.grading_errors(healthy()) is None
    assert dg.grading_errors(run([0.05, 0.0, 0.05, 0.08, 0.05])) is None  # at most 0.08 over the lowest before
    found = dg.grading_errors(run([0.0, 0.0, 0.0, 0.25, 1.0]))  # 0.25 over the lowest before (0.1 is the bar)
    assert (found.name, found.step) == ("grading_errors", 4)
    assert found.what == ("the sandbox could not run the programs of 25% of the completions, up from 0% "
                          "(grading errors, not wrong answers): each scored 0")
    assert dg.grading_errors(run([0.75])).step == 1  # over half of step 1: said at once
    warnings, health, h = [], dg.Health([].append), run([0.0, 0.0, 0.0, 0.25, 1.0])
    health.warn = warnings.append
    for i in range(len(h)):
        m = health.metrics(h[: i + 1])
    assert m["health/grading_errors"] == 1.0 and len(warnings) == 1 and "not wrong answers" in warnings[0]


def test_a_critic_is_not_told_about_group_baselines():
    # PPO (one completion a prompt: every "group" has one reward) learns from its critic: the band check is
    # for group baselines, and a stalled PPO run is not told to filter groups
    h = healthy()
    for r in h:
        r.update({"reward/zero_std_frac": 1.0, "algo/group_baseline": 0.0})
    assert dg.diagnose(h) == []
    for r in h:
        r["actor/grad_norm"] = 0.0
    (stuck,) = dg.diagnose(h)
    assert stuck.name == "no_update" and "filter_groups" not in stuck.knob and "group" not in stuck.knob
    for r in h:  # the same history from a group method says both, with the group knobs
        r["algo/group_baseline"] = 1.0
    found = {f.name: f for f in dg.diagnose(h)}
    assert set(found) == {"outside_learnable_band", "no_update"}
    assert "rollout.filter_groups=true" in found["no_update"].knob


def test_an_environment_run_gets_the_environments_advice_not_the_datasets():
    h = [{"step": s, "reward/mean": 0.0, "reward/min": 0.0, "reward/max": 0.0, "reward/zero_std_frac": 1.0,
          "actor/grad_norm": 0.0, "env/episodes": 8} for s in (1, 2)]
    found = {f.name: f for f in dg.diagnose(h)}
    assert set(found) == {"constant_reward", "no_update"}
    assert "every episode of steps 1-2 got reward 0" in found["constant_reward"].what
    for f in found.values():
        assert "task.verifier" not in f.knob and "answer_column" not in f.knob and "a task this model" not in f.knob
        assert "environment" in f.knob
    assert "task.max_turns" in found["constant_reward"].knob
    for r in h:  # the same steps from a dataset run: its verifier's advice
        del r["env/episodes"]
    assert "task.answer_column" in dg.constant_reward(h).knob
