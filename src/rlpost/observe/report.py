"""`rlpost report RUN_DIR`: one self-contained HTML page (inline SVG plots, no external files or
scripts) from what a run folder already holds: metrics.jsonl, summary.json, config.yaml and
samples/. It can be written while the run is going (it reads only complete lines).

Plots: reward and held-out accuracy (and, for a task.mix run, both per family); each reward function's
mean (reward/<fn>, with task.reward_funcs); pass@k for k = 1..64 before
and after training (run.passk_eval); KL to the reference (only when the run has one); the policy's
change per update (PPO's old -> new KL); entropy; response length and truncation; clip fractions;
the sampler/trainer importance-ratio histogram; group reward std and the all-pass / all-fail
shares; grad norm; throughput; wall-clock per role per step, stacked, and a step's timeline (its phases' medians on the
rollout and trainer lanes, as the topology orders them: observe/timeline.py). Then the health findings
(observe/diagnostics.py), the evaluation suites run on the run's model (RUN/suites/: per set and source, the
regression table, observe/suite_report.py) and, for a few steps, the top-reward and random samples for a human
audit. An ``rlpost sft|rm|dpo`` run gets its training loss and held-out metrics before / after
instead of the RL plots. Steps are integer ticks, legends sit below the plot (never over the
data) in a readable size, and summary numbers are rounded to 3 significant digits. A series that
is 0 at every step is not drawn: a line under the plots names it and why (the policy change and
the PPO clip fraction of one epoch over one mini-batch, where the ratio is 1 by construction; a
verifier's flag that was false for every completion; a reward function that gave 0 throughout).
The config section lists what the run set away from the defaults; the whole file is one click
away.
"""

from __future__ import annotations

import html
import io
import json
import random
import statistics
from pathlib import Path

import matplotlib
import yaml

matplotlib.use("Agg")  # no display: render to SVG text
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from rlpost.algorithms import core  # noqa: E402
from rlpost.config import Config, default_max_new_tokens, run_config_path, to_dict  # noqa: E402
from rlpost.model.checkpoint import write_atomic  # noqa: E402
from rlpost.observe import jsonl, suite_report, timeline  # noqa: E402
from rlpost.observe.diagnostics import diagnose, unjudged  # noqa: E402
from rlpost.types.errors import DataError  # noqa: E402
from rlpost.types.schema import Where, check  # noqa: E402

LEGEND_SIZE = 9  # points; the page shows a 5.2-inch figure ~560 px wide, so 9 pt reads as ~13 px (7 was ~10 px)
# Why a metric can be 0 at every step of a healthy run; named under the plots when it is not drawn.
ZERO_WHY = {
    "actor/ppo_kl": "one epoch over one mini-batch (trainer.epochs=1, trainer.mini_batch_size=0): the policy has not "
                    "moved when the ratio is taken",
    "actor/pg_clipfrac": "the same: with the ratio at 1 nothing is clipped (more epochs or mini-batches make it move)",
}
ROLES = ["gen", "reward", "ref", "old", "adv", "update", "sync", "eval"]  # timing_s/<role>, stacked in this order
# (title, [(metric, label)], y label): one line plot each; a plot with no data is left out.
LINE_PLOTS = [
    # actor/kl and critic/kl exist only when there is a reference (algo.kl_coef > 0).
    ("KL to the reference", [("actor/kl", "in the loss"), ("critic/kl", "in the reward")], "nats / token"),
    ("Policy change per update", [("actor/ppo_kl", "KL old -> new policy")], "nats / token"),
    ("Policy entropy", [("actor/entropy", "mean entropy")], "nats / token"),
    ("Response length", [("response_length/mean", "mean"), ("response_length/max", "max")], "tokens"),
    ("Clip fractions", [("actor/pg_clipfrac", "PPO ratio clipped"), ("response_length/clip_ratio", "truncated"),
                        ("actor/is_weight_clipfrac", "IS weight clipped (CISPO)")], "share"),
    ("Group reward spread", [("reward/group_std", "group reward std"),
                             ("reward/zero_std_frac", "groups with one reward"),
                             ("reward/all_pass_frac", "all-pass groups"), ("reward/all_fail_frac", "all-fail groups")],
     ""),
    ("Gradient norm (pre-clip)", [("actor/grad_norm", "policy"), ("critic/grad_norm", "critic")], ""),
    ("Throughput", [("perf/gen_tokens_per_s", "generated tokens / s"), ("perf/throughput", "all tokens / s")],
     "tokens / s"),
    # Environment episodes only (task.name=env or tools, docs/environments.md).
    ("Environment episodes", [("env/turns_mean", "turns per episode"),
                              ("env/tool_calls_per_episode", "tool calls per episode"),
                              ("env/errors", "environment errors"), ("env/timeouts", "environment timeouts")],
     "per episode; count"),
    ("Reward per turn", [("env/turn_reward/mean", "mean over turns"), ("env/turn_reward/first", "first turn"),
                         ("env/turn_reward/last", "last turn")], "reward"),
    # Ray topologies only (docs/distributed.md); a plot with no data is not drawn.
    ("Staleness of trained samples", [("async/staleness_mean", "mean"), ("async/staleness_max", "max"),
                                      ("async/token_staleness_mean", "per token, mean"),
                                      ("async/token_staleness_max", "per token, max")], "versions behind"),
    # The off-policy stabilisers (algo.icepop_c, algo.offpolicy_mask_delta: docs/algorithms.md), a step's share masked.
    ("Off-policy masking", [("actor/icepop_masked_frac", "tokens outside ICEPOP's band"),
                            ("actor/offpolicy_masked_frac", "sequences masked (negative advantage, far off-policy)")],
     "share"),
    # Partial rollouts (dist.partial_rollouts): a batch's share of rows, and a count over the run so far.
    ("Partial rollouts", [("async/mixed_version_rows", "rows sampled under two versions")], "share of a batch"),
    ("Weight loads mid-decode (run total)", [("async/inflight_weight_loads", "loads so far")], "count"),
    ("Idle time", [("async/trainer_idle_frac", "trainer"), ("async/rollout_idle_frac", "rollout workers")], "share"),
    ("Rollout queue", [("async/queue_depth", "sampled sequences waiting")], "sequences"),
]


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]  # drop the XML prolog and doctype: inline in HTML


def _series(history, key):
    pts = [(h["step"], h[key]) for h in history if isinstance(h.get(key), (int, float))]
    return [p[0] for p in pts], [p[1] for p in pts]


def finish(ax, title: str, ylabel: str = "", **kw) -> None:
    """Title, labels, integer step ticks, and the legend under the axes, never over the data."""
    ax.set(title=title, xlabel="step", ylabel=ylabel, **kw)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=LEGEND_SIZE, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)


def line_figure(history, title, keys, ylabel):
    """The figure of one line plot, or None when none of its metrics has data."""
    fig, ax = plt.subplots(figsize=(5.2, 3.0))
    drawn = 0
    for key, label in keys:
        x, y = _series(history, key)
        if x and any(y):  # a series of zeros says nothing a plot should show: always_zero names it
            ax.plot(x, y, marker="." if len(x) < 40 else None, label=f"{label} ({key})")
            drawn += 1
    if not drawn:
        plt.close(fig)
        return None
    finish(ax, title, ylabel)
    return fig


def line_plot(history, title, keys, ylabel) -> str | None:
    fig = line_figure(history, title, keys, ylabel)
    return _svg(fig) if fig is not None else None


def verifier_plot(history) -> str | None:
    """What the reward functions found beside the reward, per step (reward_extra/<key>: a share of the
    completions for a verifier's bools such as 'parsed', 'whole_chain', 'correct'; verl's extras as
    they come): the format health a reward's mean hides. None when no function reports any."""
    keys = sorted({k for h in history for k in h if k.startswith("reward_extra/")})
    return line_plot(history, "What the verifier found (per completion)",
                     [(k, k.partition("/")[2]) for k in keys], "share or mean") if keys else None


# reward/<key> metrics of the loop itself (recipes/rl.py, rewards/stack.py's shaping, the PRM's): any other
# reward/<name> with no further slash is a part of task.reward_funcs (rewards/stack.py), the user's own signal
REWARD_STATS = {"mean", "std", "max", "min", "all_pass_frac", "all_fail_frac", "outside_band_frac", "zero_std_frac",
                "group_std", "mean_before_filter", "nan_or_inf", "overlong_penalty_mean", "length_shaping_mean",
                "implicit_prm_mean", "process_per_seq", "steps_per_seq"}


def reward_parts(history) -> list[str]:
    """The reward/<fn> keys of the run's reward functions (task.reward_funcs), in their first step's order."""
    keys = dict.fromkeys(k for h in history for k in h if k.startswith("reward/") and "/" not in k[7:]
                         and k[7:] not in REWARD_STATS)
    return list(keys)


def reward_parts_plot(history) -> str | None:
    """Each reward function's mean per step (reward/<fn>): which part moved a rising total. None with one
    scorer and no task.reward_funcs."""
    keys = reward_parts(history)
    return line_plot(history, "Reward per function (task.reward_funcs)", [(k, k[7:]) for k in keys],
                     "mean reward") if keys else None


def reward_plot(history, summary) -> str:
    fig, ax = plt.subplots(figsize=(5.2, 3.0))
    x, y = _series(history, "reward/mean")
    ax.plot(x, y, label="train reward (mean)")
    ex, ey = _series(history, "eval/heldout_accuracy")
    if (summary and summary.get("heldout_accuracy_before") is not None
            and summary.get("heldout_accuracy_after") is not None):
        ex = [0, *ex, summary.get("steps", x[-1] if x else 0)]  # before training = step 0, after = the last step
        ey = [summary["heldout_accuracy_before"], *ey, summary["heldout_accuracy_after"]]
    if ex:
        ax.plot(ex, ey, marker="o", label="held-out accuracy (greedy)")
    if summary and summary.get("selected_step") is not None:  # early stopping chose this step's weights
        ax.axvline(summary["selected_step"], color="0.4", linestyle="--",
                   label=f"selected: step {summary['selected_step']}")
    finish(ax, "Reward and held-out accuracy", ylim=(-0.05, 1.05))
    return _svg(fig)


def task_plot(history, summary) -> str | None:
    """A mix's families (task.mix), one colour each: train reward per step (reward/mean/<task>,
    solid) and held-out accuracy (eval/heldout_accuracy/<task>, before = step 0 and after = the last
    step from summary.json, dashed with markers). None outside a mix."""
    tasks = sorted({k.partition("/")[2].partition("/")[2] for h in history for k in h if k.startswith("reward/mean/")}
                   | {k.partition("/")[2] for k in (summary or {}) if k.startswith("heldout_accuracy_before/")})
    if not tasks:
        return None
    fig, ax = plt.subplots(figsize=(5.2, 3.0))
    for i, task in enumerate(tasks):
        colour = f"C{i % 10}"
        x, y = _series(history, f"reward/mean/{task}")
        ax.plot(x, y, color=colour, label=f"{task}: train reward")
        ex, ey = _series(history, f"eval/heldout_accuracy/{task}")
        if summary and f"heldout_accuracy_before/{task}" in summary:
            ex = [0, *ex, summary.get("steps", x[-1] if x else 0)]
            ey = [summary[f"heldout_accuracy_before/{task}"], *ey, summary.get(f"heldout_accuracy_after/{task}")]
        if ex:
            ax.plot(ex, ey, color=colour, linestyle="--", marker="o", label=f"{task}: held-out accuracy")
    finish(ax, "Per task (task.mix, or data_source)", ylim=(-0.05, 1.05))
    return _svg(fig)


def passk_plot(summary) -> str | None:
    """pass@k against k (log 2 axis) before and after training (run.passk_eval): pass@1 up with the
    large-k end flat is sharpening; the large-k end up is problems solved that were not before."""
    before, after = (summary or {}).get("passk_before") or {}, (summary or {}).get("passk_after") or {}
    if not before or not after:
        return None
    fig, ax = plt.subplots(figsize=(5.2, 3.0))
    for curve, label, style in ((before, "before training", "--"), (after, "after training", "-")):
        ks = sorted(curve, key=int)
        ax.plot([int(k) for k in ks], [curve[k] for k in ks], style, marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set(title=f"pass@k, {summary.get('passk_problems')} held-out problems x {summary.get('passk_samples')} samples "
                 f"(T={summary.get('passk_temperature')})", xlabel="k", ylabel="pass@k (unbiased)", ylim=(-0.05, 1.05))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    return _svg(fig)


def ratio_plot(history) -> str | None:
    """The sampler/trainer ratio per token, all steps: each bin's share on a linear axis with its
    count written on the bar, so a tail of a few tokens is read, not guessed from a log scale."""
    hists = [h["hist/sampler_ratio"] for h in history if isinstance(h.get("hist/sampler_ratio"), list)]
    if not hists:
        return None
    counts = [sum(c) for c in zip(*hists)]
    total = sum(counts) or 1
    edges = core.RATIO_EDGES
    labels = [f"{a:g}-{b:g}" for a, b in zip(edges, edges[1:])]
    fig, ax = plt.subplots(figsize=(5.2, 3.0))
    bars = ax.bar(range(len(counts)), [c / total for c in counts])
    ax.bar_label(bars, labels=[f"{c:,}" if c else "" for c in counts], fontsize=LEGEND_SIZE - 1)
    ax.set_xticks(range(len(counts)), labels, rotation=45, fontsize=LEGEND_SIZE - 1)
    ax.set(title=f"pi_trainer / pi_sampler per token, all steps ({total:,} tokens)", ylabel="share of tokens",
           ylim=(0, 1.15))
    return _svg(fig)


def timing_plot(history) -> str | None:
    steps = [h["step"] for h in history]
    if not steps:
        return None
    fig, ax = plt.subplots(figsize=(5.2, 3.0))
    bottom = [0.0] * len(steps)
    for role in ROLES:
        vals = [h.get(f"timing_s/{role}", 0.0) or 0.0 for h in history]
        if any(vals):
            ax.bar(steps, vals, bottom=bottom, label=role, width=0.9)
            bottom = [b + v for b, v in zip(bottom, vals)]
    finish(ax, "Wall-clock per role per step", "seconds")
    return _svg(fig)


def step_bars(history, topology: str, weight_sync: str = "object_store") -> list[tuple]:
    """The run's own step as lanes (observe/timeline.py): each phase's median over the steps (timing_s/<role>, not
    the held-out pass, which runs on some steps only), laid out as its topology orders them."""
    medians = {}
    for role in ROLES[:-1]:
        vals = [v for h in history if isinstance(v := h.get(f"timing_s/{role}"), (int, float))]
        if vals and statistics.median(vals) > 0:
            medians[role] = statistics.median(vals)
    return timeline.timeline(medians, topology, weight_sync) if "gen" in medians else []


def timeline_plot(history, topology: str, weight_sync: str = "object_store") -> str | None:
    """A step as a Gantt chart, the rollout and the trainer lane, from the run's medians: where the step waits for
    which phase, as `rlpost plan` draws its prediction. None without a rollout timing."""
    bars = step_bars(history, topology, weight_sync)
    if not bars:
        return None
    fig, ax = plt.subplots(figsize=(5.2, 2.2))
    colour = {k: f"C{i % 10}" for i, k in enumerate(dict.fromkeys(k for _, k, _, _ in bars))}
    for lane, k, t0, t1 in bars:
        y = timeline.LANES.index(lane)
        ax.broken_barh([(t0, t1 - t0)], (y - 0.35, 0.7), color=colour[k],
                       label=k if not any(b[1] == k and b[2] < t0 for b in bars) else None)
    ax.set_yticks(range(len(timeline.LANES)), timeline.LANES)
    ax.invert_yaxis()
    ax.set(title=f"A step's timeline ({topology}; medians over steps)", xlabel="seconds")
    ax.grid(alpha=0.3, axis="x")
    ax.legend(fontsize=LEGEND_SIZE, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=4, frameon=False)
    return _svg(fig)


def sample_section(run_dir: Path, history, steps: list[int] | None = None, n: int = 3, seed: int = 0) -> str:
    """Top-reward and random samples of `steps` (default: the first, middle and last step)."""
    if steps is None:
        steps = sorted({history[0]["step"], history[len(history) // 2]["step"], history[-1]["step"]}) if history else []
    rng = random.Random(seed)
    parts = []
    for step in steps:
        path = run_dir / "samples" / f"step_{step:06d}.jsonl"
        if not path.exists():
            continue
        rows = jsonl.read_lines(path, jsonl.SAMPLE)
        top = sorted(rows, key=lambda r: -r["reward"])[:n]
        rand = rng.sample(rows, min(n, len(rows)))
        parts.append(f"<h3>step {step}</h3>" + _sample_table("top reward", top) + _sample_table("random", rand))
    return "".join(parts) or "<p>no samples</p>"


def _sample_table(title: str, rows: list[dict]) -> str:
    body = "".join(f"<tr><td>{_prompt_cell(r)}</td>"
                   f"<td><pre>{html.escape(str(r['completion']))}</pre></td>"
                   f"<td>{_gold_cell(r)}</td><td>{r['reward']:.3f}</td></tr>" for r in rows)
    return (f"<h4>{title}</h4><table><tr><th>prompt</th><th>completion</th><th>answer</th><th>reward</th></tr>"
            f"{body}</table>")


def _prompt_cell(sample: dict) -> str:
    """The last prompt message, or an environment episode's whole first turn: each message of its
    opening by role (the system prompt too) and the tools offered, by name, each schema one click away."""
    opening = sample.get("opening")
    if not isinstance(opening, dict) or not isinstance(opening.get("messages"), list):
        return html.escape(str(sample["prompt"]))
    turns = "".join(f"<b>{html.escape(str(m.get('role')))}</b><pre>{html.escape(str(m.get('content')))}</pre>"
                    for m in opening["messages"] if isinstance(m, dict))
    tools = [t for t in opening.get("tools") or [] if isinstance(t, dict)]
    if tools:
        names = ", ".join(str((t["function"] if isinstance(t.get("function"), dict) else t).get("name", "?"))
                          for t in tools)  # OpenAI's {"type": "function", "function": {...}}, or the function itself
        turns += (f"<details><summary>tools: {html.escape(names)}</summary>"
                  f"<pre>{html.escape(json.dumps(tools, indent=1))}</pre></details>")
    return turns


def _gold_cell(sample: dict) -> str:
    """The row's answer, or, for rows without one, its other columns by name (observe/runlog.py: sample_extras):
    the gold a reward function reads, under whatever name the data gives it."""
    columns = sample.get("columns")
    if sample.get("answer") is None and isinstance(columns, dict) and columns:
        return "<br>".join(f"<b>{html.escape(str(k))}</b>: {html.escape(str(v))}" for k, v in columns.items())
    return html.escape(str(sample.get("answer")))


CSS = """body{font-family:sans-serif;max-width:1150px;margin:auto;padding:1em}
.grid{display:flex;flex-wrap:wrap;gap:8px}.grid>div{flex:0 0 560px}svg{max-width:100%;height:auto}
table{border-collapse:collapse;font-size:13px;margin-bottom:8px}
td,th{border:1px solid #ccc;padding:3px 6px;vertical-align:top}
pre{margin:0;white-space:pre-wrap}.warn{color:#a40}"""


def rounded(value):
    """Summary numbers to 3 significant digits (nested dicts flattened by the caller): an accuracy
    reads 0.355, a time 7.27, not 7.266512."""
    return float(f"{value:.3g}") if isinstance(value, float) else value


def summary_items(summary: dict | None) -> list[tuple[str, object]]:
    """(key, value) rows, nested dicts (sft/rm/dpo's held-out metrics) as key/subkey."""
    rows = []
    for k, v in (summary or {}).items():
        rows += [(f"{k} {sk}", rounded(sv)) for sk, sv in v.items()] if isinstance(v, dict) else [(k, rounded(v))]
    return rows


def plots_for(history, summary) -> list[str | None]:
    if summary and summary.get("kind") in ("sft", "rm", "dpo"):  # offline: a loss curve, no rollouts
        loss = (f"{summary['kind']} training loss ({summary.get('loss')})", [("actor/loss", "loss per step")], "loss")
        return [line_plot(history, *loss),
                line_plot(history, "Gradient norm (pre-clip)", [("actor/grad_norm", "policy")], "")]
    return [reward_plot(history, summary), reward_parts_plot(history), passk_plot(summary), task_plot(history, summary),
            verifier_plot(history), *(line_plot(history, *p) for p in LINE_PLOTS), ratio_plot(history),
            timing_plot(history)]


NUMBER = (float, type(None))
# What the report reads of summary.json: an RL run's, an sft/rm/dpo run's (kind, loss, held-out
# metrics before/after), a sampled-rounds run's (kind rsft or online_dpo, rounds). Only a mapping is required.
SUMMARY = {"kind?": str, "loss?": (str, type(None)), "steps?": int, "heldout_accuracy_before?": NUMBER,
           "heldout_accuracy_after?": NUMBER, "heldout_accuracy_selected?": NUMBER, "selected_step?": (int, type(None)),
           "passk_before?": Where(lambda v: v is None or (isinstance(v, dict) and all(isinstance(x, (int, float))
                                                                                      for x in v.values())),
                                  "a pass@k curve"),
           "passk_after?": Where(lambda v: v is None or (isinstance(v, dict) and all(isinstance(x, (int, float))
                                                                                     for x in v.values())),
                                 "a pass@k curve")}


def read_summary(path: Path) -> dict | None:
    """summary.json checked against ``SUMMARY`` (one line naming the file and the field), None when there is none
    yet."""
    if not path.exists():
        return None
    try:
        summary = json.loads(path.read_text())
    except (ValueError, OSError) as e:
        raise DataError(f"{path}: not readable JSON ({type(e).__name__}); the file was edited or damaged") from None
    return check(summary, SUMMARY, str(path))


def build_html(run_dir: Path, sample_steps: list[int] | None = None) -> str:
    run_dir = Path(run_dir)
    history = jsonl.read_lines(run_dir / "metrics.jsonl")
    summary = read_summary(run_dir / "summary.json")
    dist = (yaml.safe_load(p.read_text()) or {}).get("dist") or {} if (p := run_dir / "config.yaml").is_file() else {}
    plots = [*plots_for(history, summary),
             timeline_plot(history, dist.get("topology", "colocated"), dist.get("weight_sync", "object_store"))]
    summary_rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(str(v))}</td></tr>"
                           for k, v in summary_items(summary))
    return ("<!doctype html><html><head><meta charset='utf-8'><title>rlpost report: "
            f"{html.escape(run_dir.name)}</title><style>{CSS}</style></head><body><h1>rlpost run "
            f"{html.escape(run_dir.name)}</h1><p>{len(history)} "
            f"steps{'' if summary else ' (run in progress or stopped: no summary yet)'}</p>{selected_line(summary)}"
            f"<table>{summary_rows}</table><h2>Health</h2>{health_section(history)}<h2>Plots</h2><div class='grid'>"
            + "".join(f"<div>{p}</div>" for p in plots if p)
            + f"</div>{always_zero(history)}{suites_section(run_dir)}<h2>Samples</h2>"
            f"{sample_section(run_dir, history, sample_steps)}"
            f"<h2>Config</h2>{config_section(run_dir)}</body></html>")


def suites_section(run_dir: Path) -> str:
    """The suites evaluated on the run's model (``rlpost eval SUITE.yaml --model RUN``: RUN/suites/,
    observe/suite_report.py); a damaged file there is one line naming it."""
    found = suite_report.run_section(run_dir)
    return f"<h2>Evaluation suites</h2>{found}" if found else ""


def health_section(history: list[dict]) -> str:
    """The findings and their knobs, and the checks the run is too short to judge."""
    findings = diagnose(history)
    items = "".join(f"<li class='warn'><b>{f.name}</b> (step {f.step}): {html.escape(f.what)}<br>knob: "
                    f"{html.escape(f.knob)}</li>" for f in findings) or "<li>no problems found</li>"
    items += "".join(f"<li>too few steps to judge <b>{name}</b>: it needs {html.escape(what)}</li>"
                     for name, what in unjudged(history).items())
    return f"<ul>{items}</ul>"


def always_zero(history: list[dict]) -> str:
    """The plotted metrics that were 0 at every step (left out of their plots), each with why when known."""
    found = sorted({k for h in history for k in h if k.startswith("reward_extra/")})  # the verifier's flags
    keys = [key for _, series, _ in LINE_PLOTS for key, _ in series] + reward_parts(history) + found
    zero = [k for k in keys if _series(history, k)[0] and not any(_series(history, k)[1])]
    if not zero:
        return ""
    items = "".join(f"<li><code>{html.escape(k)}</code>{': ' + html.escape(zero_why(k)) if zero_why(k) else ''}</li>"
                    for k in zero)
    return f"<p>0 at every step, so not drawn:</p><ul>{items}</ul>"


def zero_why(key: str) -> str:
    if key.startswith("reward_extra/"):
        return "the verifier's flag (or number) was false or 0 for every completion"
    return ZERO_WHY.get(key, "")


def config_section(run_dir: Path) -> str:
    """What the run set away from the defaults, one key a line; the whole config folded below."""
    config_file = run_config_path(run_dir)  # the newest of config.yaml and its config.resume-N.yaml
    if not config_file.exists():
        return "<p>no config.yaml</p>"
    text = config_file.read_text()
    tree, defaults = yaml.safe_load(text) or {}, to_dict(Config())
    # what 0 became
    defaults["rollout"]["max_new_tokens"] = default_max_new_tokens(bool((tree.get("task") or {}).get("data")))
    changed = [f"{sec}.{key}={str(value).lower() if isinstance(value, bool) else value}" for sec, values in tree.items()
               if isinstance(values, dict) for key, value in values.items()
               if defaults.get(sec, {}).get(key, object()) != value]
    return (f"<p>set away from the defaults ({config_file.name} holds all of it):</p>"
            f"<pre>{html.escape(chr(10).join(changed) or '(nothing: the defaults)')}</pre>"
            f"<details><summary>the whole config ({len(text.splitlines())} lines)</summary>"
            f"<pre>{html.escape(text)}</pre></details>")


def selected_line(summary: dict | None) -> str:
    """The step early stopping selected (run.early_stop_patience), whose weights RUN/model holds."""
    if not summary or summary.get("selected_step") is None:
        return ""
    return (f"<p><b>Selected step {summary['selected_step']}</b>: the best held-out accuracy "
            f"({rounded(summary['heldout_accuracy_selected'])}); RUN/model holds its weights "
            "(run.early_stop_patience).</p>")


def write_report(run_dir: Path, out: Path | None = None, sample_steps: list[int] | None = None) -> Path:
    out = Path(out) if out else Path(run_dir) / "report.html"
    write_atomic(out, build_html(run_dir, sample_steps))
    return out
