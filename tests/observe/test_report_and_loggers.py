"""A real tiny run with the loggers on: the same metrics reach TensorBoard and W&B (offline), and
`rlpost report` writes a self-contained page that headless Chromium renders."""

import json
import re
import shutil
import subprocess

import pytest
from helpers import TINY, cli, run_cli


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """4 steps with the console and TensorBoard loggers, in this process (a second process costs
    ~6 s of start-up; W&B, which changes process-wide state, gets its own: see its test)."""
    out = tmp_path_factory.mktemp("runs")
    r = cli("train", *TINY, "run.steps=4", "run.eval_every=2", "algo.kl_coef=0.1", f"run.out_dir={out}",
            "run.name=r", "run.loggers=console,tensorboard", "task.verifier=toy_verifiers:odd_length")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "rlpost: step 4 reward/mean=" in r.stderr  # the console logger
    return out / "r"


def test_tensorboard_gets_the_jsonl_metrics(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    tb = {e.step: e.value for e in acc.Scalars("reward/mean")}
    assert tb == pytest.approx({m["step"]: m["reward/mean"] for m in lines})
    assert "actor/kl" in acc.Tags()["scalars"] and "health/kl_explosion" in acc.Tags()["scalars"]
    assert "hist/sampler_ratio" in acc.Tags()["histograms"]


# W&B sets os.environ (WANDB_MODE) and starts a service process that lives as long as the process
# that logged: so a process of its own, the real entry point's, ~9 s of start-up on 2 cores.
@pytest.mark.slow
def test_wandb_offline_run_is_written(tmp_path):
    r = run_cli("train", *TINY, f"run.out_dir={tmp_path}", "run.name=w", "run.loggers=wandb",
                "task.verifier=toy_verifiers:odd_length")
    assert r.returncode == 0, r.stderr[-3000:]
    runs = list((tmp_path / "w" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


def test_unknown_or_missing_logger_is_a_config_error(tmp_path):
    r = cli("train", *TINY, f"run.out_dir={tmp_path}", "run.loggers=tensorbored")
    assert r.returncode == 2 and "run.loggers: unknown logger 'tensorbored'" in r.stderr


@pytest.mark.plots  # reads the plots: drawn, not left to conftest.py's stand-in
def test_report_has_every_plot_and_samples(run):
    r = cli("report", str(run))
    assert r.returncode == 0, r.stderr
    page = (run / "report.html").read_text()
    assert "<script" not in page and "src=" not in page  # self-contained
    for title in ("Reward and held-out accuracy", "KL to the reference", "Policy entropy", "Response length",
                  "Clip fractions", "Group reward spread", "Gradient norm", "Throughput",
                  "pi_trainer / pi_sampler", "Wall-clock per role per step"):
        assert title in page, title
    # one epoch over one mini-batch: the old -> new KL is 0 at every step, so its plot is not drawn but named, with why
    assert "Policy change per update" not in page and "<code>actor/ppo_kl</code>: one epoch over one mini-batch" in page
    assert page.count("<svg") == 11  # reward, 7 line plots, ratio histogram, timing, the step's timeline
    assert "top reward" in page and "random" in page and "Health" in page
    assert [int(x) for x in re.findall(r"<h3>step (\d+)</h3>", page)] == [1, 3, 4]  # first, middle, last


def test_report_steps_picks_the_sample_steps(run, tmp_path):
    r = cli("report", str(run), "--steps", "2", "--out", str(tmp_path / "two.html"))
    assert r.returncode == 0 and re.findall(r"<h3>step (\d+)</h3>", (tmp_path / "two.html").read_text()) == ["2"]


@pytest.mark.plots  # reads the plots: drawn, not left to conftest.py's stand-in
@pytest.mark.slow  # two launches of headless Chromium, 3-6 s on 2 cores; the fast tests count the page's plots
def test_report_renders_in_headless_chromium(run, tmp_path):
    # Debian's chromium is installed by scripts/setup.sh (best effort), never by a test.
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("no chromium on PATH (scripts/setup.sh installs it where apt-get and root are available)")
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                          (run / "report.html").as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert len(re.findall(r"<svg", dom.stdout)) == 11  # the browser parsed every inline plot
    shot = tmp_path / "report.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={shot}",
                    "--window-size=1200,2400", (run / "report.html").as_uri()], capture_output=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 20_000  # a page with pictures, not a blank one


def test_mlflow_file_store_gets_the_metrics(tmp_path):
    mlflow = pytest.importorskip("mlflow")
    from helpers import tiny_cfg

    from rlpost.recipes.rl import train

    train(tiny_cfg("run.loggers=mlflow", "run.steps=2", "task.verifier=toy_verifiers:odd_length"), tmp_path)
    client = mlflow.tracking.MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    run = client.search_runs([client.get_experiment_by_name("rlpost").experiment_id])[0]
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    got = [m.value for m in client.get_metric_history(run.info.run_id, "reward.mean")]
    assert got == pytest.approx([m["reward/mean"] for m in lines])
    assert run.data.params["rollout.group_size"] == "4"


def history(steps=3, **metrics):
    return [{"step": i, **{k: v * i for k, v in metrics.items()}} for i in range(1, steps + 1)]


@pytest.mark.plots  # reads the plots: drawn, not left to conftest.py's stand-in
def test_kl_to_the_reference_is_plotted_only_with_a_reference(tmp_path):
    from rlpost.observe.report import build_html

    # no reference (kl_coef = 0): GRPO still logs PPO's old -> new KL, which is not a KL to a reference
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(h) + "\n"
                                                    for h in history(**{"actor/ppo_kl": 0.01, "reward/mean": 0.1})))
    page = build_html(tmp_path)
    assert "KL to the reference" not in page and "Policy change per update" in page
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(h) + "\n"
                                                    for h in history(**{"actor/kl": 0.01, "reward/mean": 0.1})))
    assert "KL to the reference" in build_html(tmp_path)


def test_plots_tick_whole_steps_and_keep_legends_off_the_data():
    from rlpost.observe.report import line_figure

    fig = line_figure(history(3, **{"response_length/mean": 2.0, "response_length/max": 3.0}), "Response length",
                      [("response_length/mean", "mean"), ("response_length/max", "max")], "tokens")
    fig.canvas.draw()
    ax = fig.axes[0]
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks  # 1, 2, 3; not 1.0, 1.25, ...
    legend = ax.get_legend().get_window_extent()
    assert not legend.overlaps(ax.get_window_extent())  # below the axes, not over the lines


def test_summary_numbers_are_rounded():
    from rlpost.observe.report import summary_items

    rows = summary_items({"wall_minutes": 7.266512, "steps": 25, "heldout_before": {"sft/nll": 4.31234567}})
    assert rows == [("wall_minutes", 7.27), ("steps", 25), ("heldout_before sft/nll", 4.31)]


@pytest.mark.plots  # reads the plots: drawn, not left to conftest.py's stand-in
def test_zero_series_are_not_drawn_and_the_histogram_counts_its_bars(tmp_path):
    from rlpost.observe.report import LEGEND_SIZE, build_html, line_figure, ratio_plot

    # the PPO clip fraction of one epoch over one mini-batch is 0 at every step: not a line of its plot
    h = history(3, **{"actor/pg_clipfrac": 0.0, "response_length/clip_ratio": 0.1})
    fig = line_figure(h, "Clip fractions", [("actor/pg_clipfrac", "PPO"), ("response_length/clip_ratio", "truncated")],
                      "share")
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["truncated (response_length/clip_ratio)"]
    assert fig.axes[0].get_legend().get_texts()[0].get_fontsize() == LEGEND_SIZE >= 9  # was 7: unreadable
    assert line_figure(history(3, **{"actor/ppo_kl": 0.0}), "Policy change", [("actor/ppo_kl", "KL")], "") is None
    # one bin of 996 tokens and a tail of 4: shares on a linear axis, each count written on its bar
    svg = ratio_plot([{"step": 1, "hist/sampler_ratio": [0, 0, 0, 0, 0, 996, 4, 0, 0, 0, 0]}])
    assert "1,000 tokens" in svg and "share of tokens" in svg
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in h))
    (tmp_path / "config.yaml").write_text("model:\n  name: tiny\nrollout:\n  group_size: 8\n  max_new_tokens: 16\n"
                                          "run:\n  progress: false\n")
    page = build_html(tmp_path)
    assert "<code>actor/pg_clipfrac</code>: the same: with the ratio at 1" in page
    # the config section: what differs from the defaults (group_size 8 and 16 tokens are the defaults), the rest folded
    assert "<pre>model.name=tiny\nrun.progress=false</pre><details>" in page
    assert "too few steps to judge <b>entropy_collapse</b>" in page


@pytest.mark.plots  # reads the plot's text: drawn, not conftest.py's stand-in
def test_what_the_verifier_found_is_one_plot_and_absent_without_it():
    from rlpost.observe.report import plots_for, verifier_plot

    h = history(3, **{"reward_extra/whole_chain": 0.5, "reward_extra/correct": 0.25})
    fig_svg = verifier_plot(h)
    assert "What the verifier found" in fig_svg and "whole_chain" in fig_svg and "correct" in fig_svg
    assert verifier_plot(history(3)) is None  # no reward_extra/ metric: no plot
    assert sum(p is not None for p in plots_for(h, None)) == sum(p is not None for p in plots_for(history(3), None)) + 1


def test_a_mix_gets_a_row_per_family_in_the_closing_table_and_a_plot_in_the_report():
    from rlpost.observe.report import task_plot
    from rlpost.observe.runlog import closing_table

    summary = {"heldout_accuracy_before": 0.25, "heldout_accuracy_after": 0.5, "steps": 2, "wall_minutes": 0.1,
               "heldout_accuracy_before/math": 0.0, "heldout_n/math": 4, "heldout_accuracy_after/math": 0.5}
    # math: 0.0 -> 0.5 is +50 points, over its 4 problems
    assert (closing_table(summary).splitlines()[2]
            == f"{'  math':24s}{0.0:>10.3f}{0.5:>10.3f}   (+50.0 points, 4 problems)")
    one_family = {k: v for k, v in summary.items() if "/" not in k}
    assert len(closing_table(one_family).splitlines()) == 3  # header, held-out accuracy, steps: no family rows
    assert task_plot(history(2, **{"reward/mean": 0.1}), one_family) is None
    assert "<svg" in task_plot(history(2, **{"reward/mean": 0.1, "reward/mean/math": 0.2}), summary)


def test_a_summary_is_read_through_its_schema_and_a_sampled_rounds_run_gets_a_report(tmp_path):
    # issue 43: a damaged summary.json was a traceback; an rsft or online-DPO run's (rounds, no
    # held-out accuracy keys) was a KeyError in the reward plot
    from rlpost.observe.report import build_html

    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n')
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"kind": "rsft", "rounds": [{"round": 0}], "heldout_before": 0.1,
                                   "heldout_after": 0.2}))
    assert "rounds" in build_html(tmp_path)
    for text, said in (("[1]", "summary.json: expected a mapping, got [1]"),
                       ("{not json", "summary.json: not readable JSON"),
                       ('{"steps": "x"}', "summary.json: steps: expected an integer, got 'x'"),
                       ('{"passk_before": {"1": "a"}}', "summary.json: passk_before: expected a pass@k curve")):
        summary.write_text(text)
        r = cli("report", str(tmp_path))
        assert (r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("rlpost: error: ")
                and said in r.stderr), r.stderr


@pytest.mark.plots  # reads the plots' text: drawn, not conftest.py's stand-in
def test_each_reward_function_is_plotted_and_an_all_false_flag_is_named_not_dropped(tmp_path):
    from rlpost.observe.report import build_html, reward_parts, reward_parts_plot

    # task.reward_funcs=...:format_reward,...:accuracy_reward: reward/<fn> each, beside the loop's own reward/ stats
    h = history(3, **{"reward/mean": 0.2, "reward/std": 0.1, "reward/format_reward": 0.5, "reward/accuracy_reward": 0.1,
                      "reward/mean/arithmetic": 0.2, "reward_extra/parsed": 0.0, "reward_extra/correct": 0.1})
    assert reward_parts(h) == ["reward/format_reward", "reward/accuracy_reward"]
    svg = reward_parts_plot(h)
    assert "Reward per function" in svg and "format_reward" in svg and "accuracy_reward" in svg
    assert reward_parts_plot(history(3, **{"reward/mean": 0.2, "reward/max": 1.0})) is None  # one scorer: no plot
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in h))
    page = build_html(tmp_path)
    assert page.count("Reward per function") == 1
    # 'parsed' false for every completion: not a line of the verifier's plot, and named under the plots
    assert ("<li><code>reward_extra/parsed</code>: the verifier&#x27;s flag (or number) was false or 0 for every "
            "completion</li>") in page


def test_samples_show_an_episodes_whole_first_turn_and_a_gold_column_under_its_own_name(tmp_path):
    from types import SimpleNamespace

    import torch

    from rlpost.observe.report import sample_section
    from rlpost.observe.runlog import RunLog

    tool = {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}
    opening = [{"role": "system", "content": "You are a careful agent."}, {"role": "user", "content": "Play."}]
    rows = [{"messages": opening[-1:], "_opening": opening, "_tools": [tool]},  # an environment episode
            {"messages": [{"role": "user", "content": "2+2?"}], "prompt": "2+2?", "solution": "4", "_line": 3},
            {"messages": [{"role": "user", "content": "1+1?"}], "answer": "2", "solution": "2"}]
    batch = SimpleNamespace(rows=rows, completions=["a", "b", "c"], reward=torch.tensor([1.0, 0.5, 0.0]), infos=[])
    log = RunLog(tmp_path, 1, 0, False)
    log.write_samples(1, batch)
    lines = [json.loads(line) for line in (tmp_path / "samples" / "step_000001.jsonl").read_text().splitlines()]
    assert lines[0]["opening"] == {"messages": opening, "tools": [tool]}
    assert lines[1]["columns"] == {"solution": "4"}  # no answer column: the gold under the data's own name
    assert "columns" not in lines[2] and "opening" not in lines[1]
    page = sample_section(tmp_path, [{"step": 1}], n=3)
    assert "<b>system</b><pre>You are a careful agent.</pre><b>user</b><pre>Play.</pre>" in page
    assert "<summary>tools: calculator</summary>" in page
    assert "<b>solution</b>: 4" in page and "<td>2</td>" in page
