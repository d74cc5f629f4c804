"""The results of ``rlpost eval SUITE.yaml`` (recipes/suite.py) as HTML: a section of the run's report
(observe/report.py) when the model evaluated is a run's (``RUN`` or ``RUN/model``), and a page of its
own beside the results JSON.

Per suite: one table with a row per set and under it a row per source (problems, greedy accuracy;
with ``--samples`` pass@k and maj@k for each k; with ``--judge`` the judge's mean 1-9 score); with
``--against`` the regression table (before, now, the change, how many problems were fixed and
broken, and the flipped prompts themselves folded below); and one bar plot, a bar per set, now beside
before when there is a before. A run keeps every suite evaluated on its model as
``RUN/suites/<suite name>.json`` (the same JSON as ``--out``), so its report shows all of them; a
damaged or unreadable one is a line there naming the file, and the report shows the rest. Every string
from the results (set, source and suite names, prompts, models) is escaped, in the tables and the plot.
"""

from __future__ import annotations

import html
import io
import json
from pathlib import Path

from rlpost.types.errors import DataError, writing

SUITES = "suites"  # RUN/suites/<suite name>.json
FLIPS_SHOWN = 50  # flipped prompts listed per set and direction; the JSON holds them all


def run_of(model: str) -> Path | None:
    """The run folder a model names: RUN (a folder with config.yaml and no config.json, as model/load.py
    reads one) or RUN/model; None for any other model."""
    path = Path(model)
    for folder in (path, path.parent if path.name == "model" else None):
        if folder is not None and (folder / "config.yaml").is_file() and not (folder / "config.json").exists():
            return folder
    return None


def record(run_dir: Path, result: dict, name: str) -> Path:
    """Keep `result` in the run folder (RUN/suites/NAME.json), where its report finds it."""
    path = Path(run_dir) / SUITES / f"{name}.json"
    path.parent.mkdir(exist_ok=True)
    with writing(path):
        path.write_text(json.dumps(result, indent=1) + "\n")
    return path


def load(path: Path) -> dict:
    """One kept suite's results; one line naming the file when it is unreadable or not a suite's JSON."""
    try:
        result = json.loads(Path(path).read_text())
        if not isinstance(result, dict) or not isinstance(result.get("sets"), dict):
            raise ValueError("no 'sets' mapping")
    except (ValueError, OSError) as e:
        raise DataError(f"{path}: not a suite's results JSON ({type(e).__name__}: {e})") from None
    return result


def run_section(run_dir: Path) -> str:
    """Every suite kept in RUN/suites/, by file name ('' when there is none): a damaged or unreadable file is
    one line naming it, and the others are shown all the same."""
    parts = []
    for path in sorted((Path(run_dir) / SUITES).glob("*.json")):
        try:
            parts.append(section([load(path)]))
        except DataError as e:
            parts.append(f"<p class='warn'>{html.escape(str(e))}</p>")
        except (KeyError, TypeError, ValueError, AttributeError) as e:  # parsed, but not the shape suite.py writes
            line = f"{path}: not a suite's results JSON ({type(e).__name__}: {e})"
            parts.append(f"<p class='warn'>{html.escape(line)}</p>")
    return "".join(parts)


def num(value, digits: int = 3) -> str:
    return "" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else html.escape(str(value))


def columns(result: dict) -> list[str]:
    """The sampled metrics shown, in order: pass@k then maj@k for each k of the run."""
    return [f"{m}@{k}" for k in result.get("ks", []) for m in ("pass", "maj")] if result.get("samples") else []


def set_rows(result: dict) -> str:
    """A row per set (bold) and one per source under it."""
    cols, judged = columns(result), "judge" in result
    rows = []
    for name, r in result["sets"].items():
        sampled, judge = r.get("sampled", {}), r.get("judge", {})
        cells = [f"<b>{html.escape(name)}</b>", "", num(r.get("n")), num(r.get("heldout_accuracy"))]
        cells += [num(sampled.get(c)) for c in cols] + ([num(judge.get("mean_score"), 2)] if judged else [])
        rows.append(cells)
        for src, acc in r.get("by_source", {}).items():
            cells = ["", html.escape(src), num(sampled.get(f"problems/{src}", "")), num(acc)]
            cells += [num(sampled.get(f"{c}/{src}")) for c in cols]
            rows.append(cells + ([num(judge.get(f"mean_score/{src}"), 2)] if judged else []))
    head = ["set", "source", "n", "accuracy", *cols, *(["judge (1-9)"] if judged else [])]
    return table(head, rows)


def table(head: list[str], rows: list[list[str]]) -> str:
    return ("<table class='suite'><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows) + "</table>")


def flip_rows(result: dict) -> str:
    """The regression table against --against, and the flipped prompts folded below it."""
    rows, lists = [], []
    for name, f in result.get("flips", {}).items():
        known = isinstance(f["now"], (int, float)) and isinstance(f["before"], (int, float))
        rows.append([html.escape(name), num(f["compared"]), num(f["before"]), num(f["now"]),
                     f"{f['now'] - f['before']:+.3f}" if known else "", num(len(f["fixed"])), num(len(f["broken"]))])
        for what in ("broken", "fixed"):
            if f[what]:
                items = "".join(f"<li><code>{html.escape(p)}</code></li>" for p in f[what][:FLIPS_SHOWN])
                left = len(f[what]) - FLIPS_SHOWN
                more = f"<li>and {left} more (the JSON)</li>" if left > 0 else ""
                lists.append(f"<details><summary>{html.escape(name)}: {len(f[what])} {what}</summary>"
                             f"<ul>{items}{more}</ul></details>")
    head = ["set", "compared", "before", "now", "change", "fixed", "broken"]
    return (f"<p>Against <code>{html.escape(str(result['against']))}</code> (wrong to right: fixed; right to "
            f"wrong: broken):</p>{table(head, rows)}{''.join(lists)}")


def plain(text) -> str:
    """Text as matplotlib draws it, literally: a '$' never starts mathtext (a set named '$5 $6' would)."""
    return str(text).replace("$", r"\$")


def bars(result: dict) -> str:
    """A bar per set: greedy accuracy now, and before beside it when compared (inline SVG). matplotlib loads
    here, not with the module: `rlpost eval SUITE.yaml` imports this before any config is checked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["sets"])
    before = result.get("flips", {})
    fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(names) + 2), 3))
    width = 0.38 if before else 0.6
    xs = range(len(names))
    if before:
        ax.bar([x - width / 2 for x in xs], [before[n]["before"] or 0 if n in before else 0 for n in names], width,
               color="#bbbbbb", label=plain(f"before ({Path(str(result['against'])).name})"))
    ax.bar([x + (width / 2 if before else 0) for x in xs], [result["sets"][n]["heldout_accuracy"] or 0 for n in names],
           width, color="#4477aa", label=plain(f"now ({Path(str(result.get('model', ''))).name or 'model'})"))
    ax.set_xticks(list(xs), [plain(n) for n in names], rotation=20 if len(names) > 4 else 0)
    ax.set_ylim(0, 1)
    ax.set_ylabel("greedy accuracy")
    ax.set_title(plain(f"suite {Path(str(result.get('suite', ''))).name}"))
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2, fontsize=9, frameon=False)
    fig.tight_layout()
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    plt.close(fig)
    svg = buf.getvalue()
    return svg[svg.index("<svg"):]  # no XML prolog or doctype: inline in HTML


def section(results: list[dict]) -> str:
    """Every suite's tables and plot (the run report's 'Evaluation suites'); '' when there is none."""
    parts = []
    for r in results:
        judge = r.get("judge") or {}
        extra = [f"{r['samples']} samples a problem" if r.get("samples") else "",
                 f"judge {judge.get('model')} (prompt v{judge.get('prompt_version')})" if judge else ""]
        parts.append(f"<h3>{html.escape(str(r.get('suite', '')))}</h3><p>model <code>"
                     f"{html.escape(str(r.get('model')))}</code>{''.join('; ' + html.escape(e) for e in extra if e)}"
                     f"</p>{set_rows(r)}"
                     + (flip_rows(r) if "flips" in r else "") + f"<div>{bars(r)}</div>")
    return "".join(parts)


def page(result: dict) -> str:
    """One suite's results as a page of their own (beside the results JSON)."""
    style = ("body{font-family:sans-serif;max-width:1000px;margin:auto}table{border-collapse:collapse;margin:.5em 0}"
             "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
             "td:first-child,th:first-child{text-align:left}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>rlpost suite: "
            f"{html.escape(str(result.get('suite', '')))}</title><style>{style}</style></head><body>"
            f"<h1>rlpost eval suite</h1>{section([result])}</body></html>")
