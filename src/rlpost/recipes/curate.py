"""``rlpost curate DATA``: the data a run should train on, chosen before it starts.

In order, each row dropped at the first rule it breaks (``OUT/rows.jsonl`` says which):

1. **Rows the task cannot read** stop it in one line naming ``file:line`` (``task.on_bad_row=skip``
   drops and counts them), as training would.
2. **Duplicates**: an exact one (the same prompt text once lower-cased and its whitespace collapsed)
   and a near one (MinHash over the normalised text's word 3-grams, ``datasketch``'s LSH for the
   candidates, then the grams' true Jaccard similarity at least ``--near``) are dropped in favour
   of the first row of their kind. A templated task's prompts that differ by one number are far
   apart at the default 0.8 when short (a few words: 3 of 7 grams differ) and close when long.
3. **Overlap with the held-out rows** (``--heldout FILE``, else ``task.eval_data``): a training row
   holding at least ``task.contamination_overlap`` of a held-out prompt's own word 8-grams
   (envs/decontam.py: the check training runs on the other side) is dropped.
4. **The learnable band**: every row left is sampled ``--k`` times by the model (``--model``, the
   base model by default) at ``rollout.temperature`` and scored by the task's verifier; a row whose
   pass rate lies outside ``--keep LO-HI`` (0.1-0.9 by default) is dropped. A prompt every sample
   solves, or none does, gives a group algorithm no signal (all advantages 0: DAPO's dynamic
   sampling filters such groups out at training time, paying for their samples every step).

With ``--strata COLUMN`` (a MATH set's ``level`` or ``type``, TACO's ``difficulty``, a mix's ``source``)
the report also counts each stratum (rows read, sampled, kept, its mean pass rate, its share of the
rows at each of the three), the histogram stacks them, and one line says when curation moves a
stratum's share of the rows by 1.5x or more, and at which step: filters by text and by pass rate
also change what the data is about (a family with few distinct problems shrinks under deduplication,
one the base model fails at the start under the band, though training may well teach it).

The kept rows are written as they were read (the same columns, in the input's format: JSONL,
parquet or a ``datasets`` folder), so ``task.data=OUT/NAME`` takes them; beside them ``OUT/rows.jsonl``
(every input row: its pass rate, kept or why dropped), ``OUT/report.json`` (the counts, the band, the
pass-rate histogram) and ``OUT/pass_rate.svg`` (the histogram, the band marked).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections import Counter
from pathlib import Path

from rlpost import config, machine
from rlpost.console import say
from rlpost.envs import code, code_formats, decontam, dataset
from rlpost.envs.data import DataError, check_rows, read_rows
from rlpost.observe.runfolder import remove_entries
from rlpost.types import folders
from rlpost.types.errors import ConfigError, writing

BAND = (0.1, 0.9)
NEAR = 0.8  # Jaccard similarity of word 3-grams from which two prompts are near duplicates
SHINGLE = 3  # words per MinHash shingle
PERMUTATIONS = 128  # MinHash permutations: a Jaccard estimate within ~0.09 (one s.d. at J = 0.5)
FOLDER_KIND = "curate"
SHIFT = 1.5  # a stratum whose share of the rows curation multiplies or divides by this much is named
MIN_SHARE = 0.05  # of the rows read: a smaller stratum's share moves by chance
STACKED = 8  # strata drawn in the histogram; the rest as one
SHOWN = 20  # strata in the console's table, the largest; OUT/report.json has them all
NONE = "(none)"  # the stratum of a row without the column
OWN = ("rows.jsonl", "report.json", "pass_rate.svg", folders.MARKER)  # curate's own files in OUT


def parse_band(text: str) -> tuple[float, float]:
    """'0.1-0.9' -> (0.1, 0.9); one line naming --keep otherwise."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*-\s*([0-9.]+)\s*", text)
    try:
        lo, hi = (float(m[1]), float(m[2])) if m else (math.nan, math.nan)
    except ValueError:
        lo = hi = math.nan
    if not (0 <= lo <= hi <= 1):
        raise ConfigError(f"--keep: expected a band of pass rates LO-HI with 0 <= LO <= HI <= 1, e.g. 0.1-0.9, "
                          f"got {text!r}")
    return lo, hi


def normalise(text: str) -> str:
    """What makes two prompts the same: case and runs of whitespace do not count; punctuation does
    ('2 + 3' and '2 * 3' are different problems)."""
    return " ".join(text.lower().split())


def shingles(text: str, n: int = SHINGLE) -> set[str]:
    words = text.split()
    return {" ".join(words[i : i + n]) for i in range(max(1, len(words) - n + 1))} if words else {""}


def duplicates(texts: list[str], near: float = NEAR, seed: int = 0) -> dict[int, tuple[int, str, float]]:
    """Row -> (the earlier row it repeats, 'exact' | 'near', Jaccard similarity) for every row that
    repeats a kept one; near = 1 finds exact duplicates only. LSH proposes candidates, the exact
    Jaccard of the grams decides, so a pair is never called near on an estimate alone."""
    from datasketch import MinHash, MinHashLSH  # numpy and scipy: loaded by the one command that needs them

    found: dict[int, tuple[int, str, float]] = {}
    first: dict[str, int] = {}
    lsh = MinHashLSH(threshold=near, num_perm=PERMUTATIONS) if near < 1 else None
    grams: dict[int, set[str]] = {}
    for i, text in enumerate(map(normalise, texts)):
        if text in first:
            found[i] = (first[text], "exact", 1.0)
            continue
        first[text] = i
        if lsh is None:
            continue
        grams[i] = shingles(text)
        sketch = MinHash(num_perm=PERMUTATIONS, seed=seed)
        sketch.update_batch([g.encode() for g in grams[i]])
        close = [(len(grams[i] & grams[j]) / len(grams[i] | grams[j]), j) for j in map(int, lsh.query(sketch))]
        close = [(sim, j) for sim, j in close if sim >= near]
        if close:
            sim, j = max(close, key=lambda c: (c[0], -c[1]))
            found[i] = (j, "near", sim)
            continue
        lsh.insert(str(i), sketch)
    return {i: (int(j), how, sim) for i, (j, how, sim) in found.items()}


def in_band(rate: float, band: tuple[float, float]) -> str:
    """'' when the pass rate is in the band, else why not."""
    return "below the band" if rate < band[0] else "above the band" if rate > band[1] else ""


def load(path: str, tcfg, what: str = "data") -> tuple[list[dict], list[dict], int]:
    """(the raw rows as read, their task rows, rows skipped as unreadable): each row read as training reads it.
    what: the option that named the file, for a file that is not there."""
    convert = code_formats.convert if tcfg.name == "code" else (lambda r, src: r)
    parse = lambda r, src: dataset.to_row(convert(r, src), tcfg, src)  # noqa: E731
    raw, skipped = check_rows(read_rows(path, what), parse, path, tcfg.on_bad_row)
    rows = [parse(r, path) for r in raw]
    if tcfg.name == "code":  # the sandbox settings every code row carries, and the grader's refusals, row by row
        pairs = [(r, code.prepare([t], [], tcfg)[0]) for r, t in zip(raw, rows)]
        skipped += sum(not t for _, t in pairs)
        raw, rows = [r for r, t in pairs if t], [t[0] for _, t in pairs if t]
    return raw, rows, skipped


def write_rows(raw: list[dict], source: Path, out: Path) -> None:
    """The kept rows as they were read, in the input's format (JSONL, parquet, a `datasets` folder)."""
    clean = [{k: v for k, v in r.items() if k != "_line"} for r in raw]
    with writing(out):
        if not clean and source.suffix == ".parquet":  # no row kept: DATA's columns, no rows (read back as none)
            import pyarrow.parquet

            pyarrow.parquet.write_table(pyarrow.parquet.read_schema(str(source)).empty_table(), str(out))
        elif source.suffix == ".parquet" or source.is_dir():
            import datasets

            table = (datasets.Dataset.from_list(clean) if clean
                     else datasets.load_from_disk(str(source)).select([]))  # a datasets folder: its features kept
            table.to_parquet(str(out)) if source.suffix == ".parquet" else table.save_to_disk(str(out))
        else:
            out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in clean))


def strata_of(raw: list[dict], column: str, data: str) -> list[str]:
    """Each row's value of ``column`` as text (``(none)`` where a row lacks it); one line naming
    the column and the columns there are when no row has it."""
    if column == "_line" or not any(column in r for r in raw):  # _line: the line number read_rows adds
        have = sorted({k for r in raw for k in r if k != "_line"})
        raise ConfigError(f"--strata {column}: no row of {data} has a column {column!r} (its columns: "
                          f"{', '.join(have)})")
    def text(v):  # a list as JSON, true as true
        return json.dumps(v, ensure_ascii=False, default=str)
    values = [r.get(column) for r in raw]
    # the string "1" beside the number 1 stays its own stratum: quoted, as JSON writes it
    clash = {v for v in values if isinstance(v, str)} & {text(v) for v in values if v is not None
                                                         and not isinstance(v, str)}
    return [NONE if v is None else text(v) if not isinstance(v, str) or v in clash else v for v in values]


def strata_table(strata: list[str], status: list[dict]) -> dict[str, dict]:
    """Stratum -> rows read, sampled (what reached the band: after the duplicates and the held-out
    overlap), kept, the mean pass rate of its sampled rows, and its share of the rows at each of the
    three (largest first)."""
    sampled, kept, rate_sum = Counter(), Counter(), Counter()  # one pass: a column of ids has a stratum a row
    for s in status:
        name = strata[s["row"]]
        if "pass_rate" in s:
            sampled[name] += 1
            rate_sum[name] += s["pass_rate"]
        kept[name] += "dropped" not in s
    n_sampled, n_kept = sum(sampled.values()), sum(kept.values())
    return {name: {"read": read, "sampled": sampled[name], "kept": kept[name],
                   "mean_pass_rate": round(rate_sum[name] / sampled[name], 4) if sampled[name] else None,
                   "share_read": round(read / len(strata), 4),
                   "share_sampled": round(sampled[name] / n_sampled, 4) if n_sampled else 0.0,
                   "share_kept": round(kept[name] / n_kept, 4) if n_kept else 0.0}
            for name, read in Counter(strata).most_common()}


def shifted(table: dict[str, dict]) -> list[str]:
    """The strata (of at least MIN_SHARE of the rows read) whose share of the rows curation multiplied or
    divided by SHIFT or more, as 'name' 26% -> 18% -> 17% (read -> sampled -> kept: the first arrow is the
    duplicates' and the held-out overlap's doing, the second the band's), the largest moves first."""
    totals = {key: max(sum(t[key] for t in table.values()), 1) for key in ("read", "sampled", "kept")}
    moved = []
    for name, t in table.items():  # from the counts: the shares in the report are rounded
        read, sampled, kept = (t[key] / totals[key] for key in ("read", "sampled", "kept"))
        if read >= MIN_SHARE and (kept * SHIFT <= read or kept >= read * SHIFT):
            moved.append((abs(math.log(max(kept, 1e-9) / read)), f"{name!r} {read:.0%} -> {sampled:.0%} -> {kept:.0%}"))
    return [text for _, text in sorted(moved, reverse=True)]


def stacked(rates: list[float], k: int, strata: list[str]) -> list[tuple[str, list[int]]]:
    """The stacked histogram's bars, bottom first: (label, prompts per pass rate 0/k .. k/k) for the STACKED
    largest strata, then one bar, 'N others', for the rest. Counted in one pass, keyed by position, so a
    stratum whose own value is 'N others' stays its own bar."""
    top = [name for name, _ in Counter(strata).most_common(STACKED)]
    rest = len(set(strata)) - len(top)
    where = {name: i for i, name in enumerate(top)}
    parts = Counter((where.get(s, len(top)), round(p * k)) for p, s in zip(rates, strata))
    labels = top + ([f"{rest} other{'s' if rest > 1 else ''}"] if rest else [])
    return [(name, [parts.get((j, i), 0) for i in range(k + 1)]) for j, name in enumerate(labels)]


def histogram(rates: list[float], k: int, band: tuple[float, float], path: Path,
              strata: list[str] | None = None) -> dict[str, int]:
    """Prompts per pass rate (0/k .. k/k) as {"i/k": count}, and the plot of it with the band marked;
    with ``strata`` (one a rate) the bars are stacked by stratum, the largest STACKED of them."""
    counts = Counter(round(p * k) for p in rates)
    table = {f"{i}/{k}": counts.get(i, 0) for i in range(k + 1)}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3))
    xs = [i / k for i in range(k + 1)]
    if strata:
        bottom = [0] * (k + 1)
        for name, heights in stacked(rates, k, strata):
            ax.bar(xs, heights, width=0.8 / k, bottom=bottom, label=name)
            bottom = [b + h for b, h in zip(bottom, heights)]
    else:
        ax.bar(xs, list(table.values()), width=0.8 / k, color="#4477aa")
    ax.axvspan(band[0], band[1], color="#88cc88", alpha=0.25, label=f"kept: {band[0]:g}-{band[1]:g}")
    ax.set_xlabel(f"pass rate ({k} samples a prompt)")
    ax.set_ylabel("prompts")
    ax.legend()
    fig.tight_layout()
    with writing(path):
        fig.savefig(path, format="svg")
    plt.close(fig)
    return table


def curate(cfg: config.Config, data: str, out: Path, k: int, band: tuple[float, float], near: float,
           heldout: str, pass_rates, strata_column: str = "", heldout_key: str = "--heldout") -> dict:
    """Curate `data` into `out` (a new or empty folder, or one curate wrote); returns the report.
    pass_rates(cfg, rows, k): each row's share of k samples its verifier marks correct (recipes/evaluate.py).
    strata_column: the column whose values the report counts apart (module docstring). heldout_key: the option
    that named ``heldout``, for the lines about it."""
    folders.check_folder(out, FOLDER_KIND, "--out")
    raw, rows, unreadable = load(data, cfg.task)
    if not rows:
        raise DataError(f"{data}: no rows to curate")
    strata = strata_of(raw, strata_column, data) if strata_column else None  # before any sampling
    held = load(heldout, cfg.task, heldout_key)[1] if heldout else []
    if heldout and not held:
        raise DataError(f"{heldout_key}: {heldout} holds no rows, so nothing could be checked against it")
    status: list[dict] = [{"row": i, **({"line": r["_line"]} if "_line" in r else {})} for i, r in enumerate(raw)]
    for i, (j, how, sim) in duplicates([decontam.prompt_text(r) for r in rows], near, cfg.run.seed).items():
        status[i].update(dropped=f"{how} duplicate", duplicate_of=j, similarity=round(sim, 3))
    live = [i for i, s in enumerate(status) if "dropped" not in s]
    for pos, j in decontam.overlapping([rows[i] for i in live], held, cfg.task.contamination_overlap).items():
        status[live[pos]].update(dropped="overlaps a held-out row", heldout_row=j)
    live = [i for i, s in enumerate(status) if "dropped" not in s]
    with writing(out):  # the folder made before the sampling, so a folder that cannot be written is said first
        out.mkdir(parents=True, exist_ok=True)
    folders.mark(out, FOLDER_KIND)
    skipped = f", {unreadable} unreadable passed over" if unreadable else ""
    say(f"curate: sampling {len(live)} prompts x {k} with {cfg.model.name} (of {len(rows)} read{skipped})")
    rates = pass_rates(cfg, [rows[i] for i in live], k) if live else []
    for i, p in zip(live, rates):
        status[i]["pass_rate"] = p
        if why := in_band(p, band):
            status[i]["dropped"] = why
    kept = [r for r, s in zip(raw, status) if "dropped" not in s]
    name = Path(data).name
    if name in OWN:  # DATA named like one of curate's own files: the kept rows must not be written over
        name = f"curated-{name}"
    forget_earlier(out, out / name)
    write_rows(kept, Path(data), out / name)
    with writing(out / "rows.jsonl"):
        (out / "rows.jsonl").write_text("".join(json.dumps({**s, "kept": "dropped" not in s}) + "\n" for s in status))
    report = {"data": str(data), "out": str(out / name), "model": cfg.model.name, "k": k, "keep": list(band),
              "near": near, "heldout": heldout, "read": len(raw) + unreadable, "unreadable": unreadable,
              "sampled": len(live), "kept": len(kept),
              "dropped": dict(Counter(s["dropped"] for s in status if "dropped" in s)),
              "pass_rate_histogram": histogram(rates, k, band, out / "pass_rate.svg",
                                               [strata[i] for i in live] if strata else None)}
    if strata:
        report["strata"] = {"column": strata_column, "by": strata_table(strata, status)}
        if moved := shifted(report["strata"]["by"]):
            say(f"curate: the mix by {strata_column} moves: {', '.join(moved[:3])} of the rows"
                f"{f' (and {len(moved) - 3} more)' if len(moved) > 3 else ''} (as read -> after the duplicates and "
                f"the held-out overlap -> after the band; report.json: strata)")
    with writing(out / "report.json"):
        (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def forget_earlier(out: Path, now: Path) -> None:
    """Remove the curated data an earlier curate left in ``out`` under another name (OUT/report.json names it),
    so that the folder holds one curation, the one its report describes."""
    try:
        earlier = Path(json.loads((out / "report.json").read_text())["out"])
    except (OSError, ValueError, KeyError, TypeError):
        return
    if earlier.parent.resolve() != out.resolve() or earlier.name in OWN or earlier.name == now.name:
        return  # only a file of this folder, never one of curate's own
    with writing(earlier):
        remove_entries(out, [earlier.name])


def add_parser(sub, options: str) -> None:
    """`rlpost curate`'s arguments (cli.py keeps its own commands; this one's are here)."""
    c = sub.add_parser("curate", help="keep the data rows worth training on (pass-rate band, dedup, overlap)",
                       epilog=options, formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Sample K completions of every row of DATA with the model, keep the rows whose pass "
                                   "rate is in the band, drop exact and near duplicates and rows that overlap the "
                                   "held-out rows; writes OUT/<DATA's name> (the same format) and a report.")
    c.add_argument("data", metavar="DATA", help="a .jsonl or .parquet file or a `datasets` folder, as task.data reads")
    c.add_argument("args", nargs="*", metavar="key=value", help="dotted overrides (task.name, task.verifier, ...)")
    c.add_argument("--model", default="embedded", help="the model that samples (default: the base model, embedded)")
    c.add_argument("--k", type=int, default=8, help="samples per prompt (default 8)")
    c.add_argument("--keep", default="0.1-0.9", help="the pass-rate band kept, LO-HI (default 0.1-0.9)")
    c.add_argument("--near", type=float, default=NEAR, help="Jaccard similarity of word 3-grams from which two "
                   "prompts are near duplicates (default 0.8; 1 = exact duplicates only)")
    c.add_argument("--heldout", default="", help="held-out rows to keep out of the training data (default "
                   "task.eval_data)")
    c.add_argument("--out", default="", help="a new or empty folder (default DATA's name + .curated, here)")
    c.add_argument("--strata", default="", metavar="COLUMN", help="a column whose values the report counts apart "
                   "(e.g. level, type, difficulty, source), saying when curation moves a stratum's share by 1.5x "
                   "or more")


def main(args, evaluation, refuse) -> int:
    """`rlpost curate`: the config and the band checked (refuse: cli.py's check of keys a command ignores), then the
    curation with evaluation("pass_rates") (recipes/evaluate.py's, through cli.py: it loads torch)."""
    refuse("eval", [a.split("=", 1)[0] for a in args.args])  # curate trains nothing, as eval
    if args.k < 1:
        raise ConfigError(f"--k {args.k}: expected at least 1 sample a prompt")
    if not 0 < args.near <= 1:
        raise ConfigError(f"--near {args.near}: expected a similarity with 0 < near <= 1")
    band = parse_band(args.keep)
    if not any(not in_band(i / args.k, band) for i in range(args.k + 1)):
        raise ConfigError(f"--keep {args.keep}: no pass rate of {args.k} samples (0/{args.k}, 1/{args.k}, ..., "
                          f"{args.k}/{args.k}) lies in it, so no row could be kept; widen it or raise --k")
    named = any(a.startswith("task.name=") for a in args.args)
    cfg = machine.check(config.load(None, [f"model.name={args.model}", *([] if named else ["task.name=dataset"]),
                                           f"task.data={args.data}", *args.args]))
    out = Path(args.out or f"{Path(args.data).name}.curated")
    heldout, key = (args.heldout, "--heldout") if args.heldout else (cfg.task.eval_data, "task.eval_data")
    report = curate(cfg, args.data, out, args.k, band, args.near, heldout, evaluation("pass_rates"), args.strata, key)
    print(json.dumps(report) if not sys.stdout.isatty() else table(report))
    return 0


def table(report: dict) -> str:
    """The console's summary: what was read, dropped and why, kept, and where it went."""
    lines = [f"read            {report['read']}"]
    if report["unreadable"]:
        lines.append(f"unreadable      {report['unreadable']}  (task.on_bad_row=skip)")
    lines += [f"{why:<15} {n}" for why, n in sorted(report["dropped"].items())]
    lines += [f"kept            {report['kept']}  (pass rate {report['keep'][0]:g}-{report['keep'][1]:g} of "
              f"{report['k']} samples) -> {report['out']}"]
    if "strata" in report:
        lines.append(f"by {report['strata']['column']}: rows read, sampled, kept, mean pass rate, share of the "
                     f"rows read -> sampled -> kept")
        by = report["strata"]["by"]
        for name, t in list(by.items())[:SHOWN]:
            rate = "-" if t["mean_pass_rate"] is None else f"{t['mean_pass_rate']:.2f}"
            lines.append(f"  {name[:24]:<24} {t['read']:>6} {t['sampled']:>6} {t['kept']:>6}  {rate:>5}  "
                         f"{t['share_read']:.0%} -> {t['share_sampled']:.0%} -> {t['share_kept']:.0%}")
        if len(by) > SHOWN:
            lines.append(f"  ... and {len(by) - SHOWN} smaller strata (report.json)")
    return "\n".join(lines)
