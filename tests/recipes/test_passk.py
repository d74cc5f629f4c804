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
        cfg = config.load(None, [*TINY, f"run.passk_eval={on}", "task.verifier=toy_verifiers:odd_length"])
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
