"""The pass@k curve at a run's start and end (run.passk_eval): the unbiased estimator averaged over
problems by hand, the training samples unchanged by it, and summary.json and the report keep it."""

import json
from fractions import Fraction
from math import comb
from types import SimpleNamespace

import matplotlib.pyplot as plt
import torch
from helpers import TINY

from rlpost import config
from rlpost.observe import jsonl, report
from rlpost.recipes import evaluate, rl


def test_curve_averages_the_unbiased_estimator_over_problems_and_restores_the_rng():
    # problem 0: 16 of its 64 samples correct; problem 1: none. pass@k = (1 - C(48, k) / C(64, k)) / 2.
    def generate(rows, n, temperature, top_p, max_new_tokens):
        torch.rand(3)  # the sampler draws from torch's RNG
        return SimpleNamespace(rows=[r for r in rows for _ in range(n)], completions=["x"] * (len(rows) * n))

    def score(batch):
        right = [1.0 if row["id"] == 0 and i % 4 == 0 else 0.0 for i, row in enumerate(batch.rows)]
        return torch.tensor(right), [{} for _ in right], {}

    roles = SimpleNamespace(rollout=SimpleNamespace(generate=generate), grader=SimpleNamespace(score=score))
    cfg = config.load(None, TINY)
    rows = [{"messages": [{"role": "user", "content": "q"}], "id": i} for i in range(2)]
    state = torch.get_rng_state()
    curve = evaluate.passk_curve(roles, rows, cfg)
    assert torch.equal(torch.get_rng_state(), state)
    assert list(curve) == ["1", "2", "4", "8", "16", "32", "64"]
    for k, v in curve.items():
        want = (1 - Fraction(comb(48, int(k)), comb(64, int(k)))) / 2
        assert abs(v - float(want)) < 1e-12, k
    assert abs(curve["1"] - 0.125) < 1e-12 and curve["64"] == 0.5  # 16 of 64 right; pass@64 sees every sample


def test_a_run_keeps_both_curves_and_trains_on_the_same_samples_with_it_off(tmp_path, monkeypatch):
    runs = {}
    for on in (4, 0):
        cfg = config.load(None, [*TINY, f"run.passk_eval={on}", "task.verifier=toy_verifiers:odd_length",
                                 "run.full_eval=true"])  # 2 steps train on 32 samples: sized to them, no curve
        runs[on] = (rl.train(cfg, tmp_path / str(on)), jsonl.read_lines(tmp_path / str(on) / "metrics.jsonl"))
    summary, history = runs[4]
    assert summary["passk_problems"] == 4 and summary["passk_samples"] == 64
    for curve in (summary["passk_before"], summary["passk_after"]):
        values = [curve[str(2**i)] for i in range(7)]
        assert values == sorted(values) and 0 <= values[0] <= values[-1] <= 1  # pass@k never falls as k grows
    assert "passk_before" not in runs[0][0]
    assert [h["reward/mean"] for h in history] == [h["reward/mean"] for h in runs[0][1]]  # the same training samples
    assert json.loads((tmp_path / "4" / "summary.json").read_text())["passk_after"] == summary["passk_after"]
    titles = []  # the report's figures, by title (not drawn: tests/conftest.py)
    monkeypatch.setattr(report, "_svg", lambda fig: titles.append(fig.axes[0].get_title()) or plt.close(fig) or "")
    report.write_report(tmp_path / "4")
    assert "pass@k, 4 held-out problems x 64 samples (T=0.7)" in titles
    titles.clear()
    report.write_report(tmp_path / "0")
    assert not [t for t in titles if t.startswith("pass@k")]  # off: no curve, no plot


def sizes(*overrides: str, env: bool = False, n_heldout: int = 200) -> tuple:
    return evaluate.eval_sizes(config.load(None, list(overrides)), n_heldout, env)


def test_evaluation_is_sized_to_the_runs_own_sampling_budget():
    # 2 steps x 16 prompts x 8 samples = 256 training samples: 256 // 64 = 4 problems of the curve, not 32
    held, passk, line = sizes("run.steps=2")
    assert (held, passk) == (200, 4)
    assert "pass@k curve on 4 problems (32 x 64 samples = 2,048" in line and "256 the run trains on" in line
    assert "run.full_eval=true" in line
    assert sizes("run.steps=3", "rollout.prompts_per_step=3", "rollout.group_size=7")[1] == 0  # 63 < 64: off
    assert sizes("run.steps=2", "run.full_eval=true") == (200, 32, None)
    assert sizes("run.steps=25") == (200, 32, None)  # 25 x 128 = 3,200 samples: 50 problems' worth, all 32 drawn
    # an environment run: one held-out episode per training prompt, 2 x 16 = 32 of its 200
    held, passk, line = sizes("run.steps=2", env=True)
    assert (held, passk) == (32, 4) and "32 held-out episodes of 200" in line
    assert sizes("run.steps=2", "run.eval_n=20", env=True)[0] == 20  # asked for fewer: as asked
    assert sizes("run.steps=2", "run.eval_n=20", "run.full_eval=true", env=True)[:2] == (20, 20)


def test_a_two_step_run_draws_no_full_curve_says_so_and_shows_every_evaluations_bar(tmp_path, capsys):
    default = [o for o in TINY if not o.startswith(("run.passk_eval", "run.progress"))]  # the curve as shipped: 32
    summary = rl.train(config.load(None, [*default, "run.progress=true"]), tmp_path / "run")
    err = capsys.readouterr().err
    assert "passk_before" not in summary  # 2 x 4 x 4 = 32 samples trained on: no 2 x 8 x 64 curve
    assert "evaluation sized to this 2-step run: the pass@k curve off (8 x 64 samples = 512" in err
    assert "run.full_eval=true" in err
    assert err.count("held-out:") >= 2 and "problem/s]" in err  # before and after, each with its bar and rate
    cfg = config.load(None, [*TINY, "run.passk_eval=2", "run.full_eval=true", "run.progress=true"])
    evaluate.passk_curve(SimpleNamespace(rollout=SimpleNamespace(generate=lambda rows, n, **kw: SimpleNamespace(
        rows=[r for r in rows for _ in range(n)], completions=["x"] * (len(rows) * n))),
        grader=SimpleNamespace(score=lambda b: (torch.zeros(len(b.rows)), [{}] * len(b.rows), {}))),
        [{"messages": [{"role": "user", "content": "q"}]}] * 2, cfg)
    bar = capsys.readouterr().err
    assert "pass@k:" in bar and "/2 [" in bar  # the curve's pass, out of its problems, with its time left
