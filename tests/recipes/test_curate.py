"""rlpost curate (recipes/curate.py): the pass-rate band, exact and near duplicates and held-out overlap,
by hand, then end to end on the tiny model with a verifier whose verdict is fixed per row."""

import json
from pathlib import Path

import datasets
import pyarrow.parquet as pq
import pytest
from helpers import cli

from rlpost import config
from rlpost.envs import dataset
from rlpost.envs.decontam import overlapping
from rlpost.recipes.curate import (STACKED, duplicates, in_band, normalise, parse_band, shifted, shingles, stacked,
                                   strata_of, strata_table, table)

LONG = "Write the full name of the capital city of the country that lies directly north of the one named here: {}"
PRIME = "Name a prime number larger than one hundred and give its two nearest primes"
ROWS = [
    {"prompt": "What is 2 + 3?", "answer": "pass"},
    {"prompt": "what   is 2 + 3?", "answer": "pass"},  # row 0 again: case and spaces do not count
    {"prompt": "What is 2 * 3?", "answer": "fail"},  # one character from row 0, and another problem
    {"prompt": LONG.format("Spain"), "answer": "pass"},
    {"prompt": LONG.format("Spain") + " please", "answer": "fail"},  # row 3 and a word: 19 of 20 grams shared
    {"prompt": PRIME, "answer": "pass"},  # the held-out row itself
]
TINY_CURATE = ["--model", "tiny", "--k", "4", "task.verifier=toy_verifiers:says_pass", "rollout.max_new_tokens=4",
               "run.threads=1", "run.progress=false"]


def test_the_band_is_parsed_inclusive_and_refused_in_one_line():
    assert parse_band("0.1-0.9") == (0.1, 0.9) and parse_band(" 0 - 1 ") == (0.0, 1.0)
    for bad in ("0.9-0.1", "0.1", "a-b", "0.1-1.5", "-0.1-0.5"):
        with pytest.raises(config.ConfigError, match="--keep: expected a band"):
            parse_band(bad)
    band = (0.1, 0.9)
    # k = 8: 1/8 = 0.125 and 7/8 = 0.875 are in; 0 and 1 (all fail, all pass: no signal for a group) are out
    assert [in_band(c / 8, band) for c in range(9)] == ["below the band", *[""] * 7, "above the band"]
    assert in_band(0.1, band) == in_band(0.9, band) == ""  # the ends belong to the band


def test_duplicates_by_hand():
    texts = [r["prompt"] for r in ROWS]
    assert normalise(texts[1]) == normalise(texts[0]) != normalise(texts[2])
    assert len(shingles(normalise(texts[3]))) == 19 and len(shingles("one two")) == 1  # 21 words; short: one gram
    assert duplicates(texts) == {1: (0, "exact", 1.0), 4: (3, "near", 19 / 20)}
    assert duplicates(texts, near=0.96) == {1: (0, "exact", 1.0)}  # 0.95 < 0.96
    assert duplicates(texts, near=1) == {1: (0, "exact", 1.0)}
    # short templated prompts one number apart: 10 words, 3 of the 8 grams hold the number, J = 5 / 11
    a, b = "What is 17 * 6? Reply with only the number.", "What is 17 * 7? Reply with only the number."
    assert duplicates([a, b]) == {} and duplicates([a, b], near=0.3) == {1: (0, "near", 5 / 11)}
    # the first of a kind is kept, and a third copy points to it, not to the second
    assert duplicates(["x y z", "X  y z", "x y z"]) == {1: (0, "exact", 1.0), 2: (0, "exact", 1.0)}


def test_training_rows_overlapping_a_held_out_prompt_are_found():
    row = lambda text: {"messages": [{"role": "user", "content": text}]}  # noqa: E731
    words = [f"w{i}" for i in range(20)]  # 13 grams of 8 words
    held = [row(" ".join(words))]
    train = [row(" ".join(words[:14])), row(" ".join(words[:10])), row("unrelated text " * 5), row(" ".join(words))]
    # words[:14] holds grams 0..6 of the 13: 7 >= 0.5 * 13; words[:10] holds 3, fewer than half
    assert overlapping(train, held, 0.5) == {0: 0, 3: 0}
    assert overlapping(train, held, 0.6) == {3: 0}  # 7 / 13 = 0.54


def test_strata_by_hand():
    # rows 0-3 of stratum a, 4-5 of b, 6 of c; row 3 dropped before sampling, rows 0 and 1 by the band
    strata = ["a", "a", "a", "a", "b", "b", "c"]
    status = [{"row": 0, "pass_rate": 1.0, "dropped": "above the band"}, {"row": 1, "pass_rate": 0.0,
              "dropped": "below the band"}, {"row": 2, "pass_rate": 0.5}, {"row": 3, "dropped": "exact duplicate"},
              {"row": 4, "pass_rate": 0.25}, {"row": 5, "pass_rate": 0.75}, {"row": 6, "pass_rate": 0.5}]
    table = strata_table(strata, status)
    assert list(table) == ["a", "b", "c"]  # largest first
    # a: 4 of the 7 read (57%), 3 of the 6 sampled (50%), 1 of the 4 kept (25%)
    assert table["a"] == {"read": 4, "sampled": 3, "kept": 1, "mean_pass_rate": 0.5, "share_read": 0.5714,
                          "share_sampled": 0.5, "share_kept": 0.25}
    assert table["b"]["mean_pass_rate"] == 0.5 and (table["b"]["share_sampled"], table["b"]["share_kept"]) == (
        0.3333, 0.5)
    # read -> kept: a 4/7 -> 1/4 (/2.29), c 1/7 -> 1/4 (x1.75), b 2/7 -> 2/4 (x1.75, as c): the largest move first
    assert shifted(table) == ["'a' 57% -> 50% -> 25%", "'c' 14% -> 17% -> 25%", "'b' 29% -> 33% -> 50%"]
    # within the bar, or too small a stratum to tell: nothing
    counts = lambda x, y, z: {n: {"read": x[i], "sampled": y[i], "kept": z[i]}  # noqa: E731
                              for i, n in enumerate(("x", "rest"))}
    assert shifted(counts((50, 50), (50, 50), (34, 66))) == []  # x 0.5 -> 0.34 (/1.47), rest 0.5 -> 0.66 (x1.32)
    assert shifted(counts((50, 50), (40, 60), (33, 67))) == ["'x' 50% -> 40% -> 33%"]  # 0.5 / 0.33 = 1.52
    assert shifted(counts((4, 96), (4, 96), (0, 50))) == []  # x: 4% of the rows read, too small to tell
    assert shifted(counts((30, 70), (10, 70), (10, 70))) == ["'x' 30% -> 12% -> 12%"]  # by deduplication alone


def test_a_column_of_ids_as_strata_is_counted_in_one_pass_and_printed_short():
    # 20,000 rows, each its own stratum (an id column): one pass over the rows, no line (no stratum holds 5%),
    # and the console shows the 20 largest and says how many more the report holds
    n = 20_000
    strata = [f"id{i}" for i in range(n)]
    status = [{"row": i, "pass_rate": 0.5} for i in range(n)]
    by = strata_table(strata, status)
    assert len(by) == n and by["id7"]["kept"] == 1 and shifted(by) == []
    report = {"read": n, "unreadable": 0, "dropped": {}, "kept": n, "keep": [0.1, 0.9], "k": 8, "out": "o",
              "strata": {"column": "id", "by": by}}
    lines = table(report).splitlines()
    assert len(lines) == 2 + 1 + 20 + 1 and lines[-1] == "  ... and 19980 smaller strata (report.json)"


def test_the_stacked_histogram_by_hand():
    # k = 2: bins 0/2, 1/2, 2/2. The STACKED largest strata get a bar each, bottom first; the rest share the
    # last, labelled with how many strata it holds. A real stratum whose value is that label stays its own.
    names = [f"s{i}" for i in range(STACKED - 1)] + ["2 others"]  # STACKED strata drawn, one named like the rest
    rates, strata = [], []
    for j, name in enumerate(names):
        rates += [0.0] * (3 + j) + [1.0] * 2  # ordered by size: s0 the smallest of them, '2 others' the largest
        strata += [name] * (5 + j)
    rates += [0.5, 0.5, 1.0]
    strata += ["x", "y", "y"]  # two small strata: the rest
    bars = stacked(rates, 2, strata)
    assert [name for name, _ in bars] == ["2 others", *reversed(names[:-1]), "2 others"]
    assert bars[0][1] == [3 + STACKED - 1, 0, 2]  # the real stratum, its rows only
    assert bars[-1][1] == [0, 2, 1]  # x and y
    assert sum(map(sum, (h for _, h in bars))) == len(rates)
    assert stacked([0.5], 2, ["a"]) == [("a", [0, 1, 0])]  # one stratum: no 'others' bar


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_curate_end_to_end_on_the_tiny_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "d.jsonl", ROWS)
    write(tmp_path / "h.jsonl", [{"prompt": PRIME, "answer": "x"}])
    r = cli("curate", "d.jsonl", "--heldout", "h.jsonl", "--keep", "0-1", *TINY_CURATE)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout.strip().splitlines()[-1])
    assert report["dropped"] == {"exact duplicate": 1, "near duplicate": 1, "overlaps a held-out row": 1}
    assert (report["read"], report["sampled"], report["kept"]) == (6, 3, 3)
    assert report["pass_rate_histogram"] == {"0/4": 1, "1/4": 0, "2/4": 0, "3/4": 0, "4/4": 2}
    out = tmp_path / "d.jsonl.curated"
    status = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert [s.get("pass_rate") for s in status] == [1.0, None, 0.0, 1.0, None, None]
    assert [s["line"] for s in status] == [1, 2, 3, 4, 5, 6] and status[4]["duplicate_of"] == 3
    # the kept rows as they were read, nothing added; task.data takes them
    kept = [json.loads(line) for line in (out / "d.jsonl").read_text().splitlines()]
    assert kept == [ROWS[0], ROWS[2], ROWS[3]]
    cfg = config.load(None, ["task.name=dataset", f"task.data={out / 'd.jsonl'}"])
    assert [r["prompt"] for r in dataset.load_rows(str(out / "d.jsonl"), cfg.task)[0]] == [ROWS[i]["prompt"]
                                                                                          for i in (0, 2, 3)]
    assert (out / "pass_rate.svg").read_text().lstrip().startswith("<?xml")
    # the default band drops the all-pass and the all-fail rows: nothing is left, and the folder is curate's own
    r = cli("curate", "d.jsonl", "--heldout", "h.jsonl", *TINY_CURATE)
    report = json.loads(r.stdout.strip().splitlines()[-1])
    assert r.returncode == 0 and report["kept"] == 0
    assert report["dropped"]["above the band"] == 2 and report["dropped"]["below the band"] == 1
    assert (out / "d.jsonl").read_text() == ""


def test_curate_counts_strata_and_says_when_the_band_moves_the_mix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rows = ([{"prompt": f"Say the word number {i} aloud", "answer": "pass", "level": "easy"} for i in range(3)]
            + [{"prompt": f"Name the city number {i} here", "answer": "fail", "level": 5} for i in range(3)]
            + [{"prompt": "A row with no level at all", "answer": "fail"}])
    write(tmp_path / "d.jsonl", rows)
    r = cli("curate", "d.jsonl", "--keep", "0-0.5", "--strata", "level", "--near", "1", *TINY_CURATE)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout.strip().splitlines()[-1])
    by = report["strata"]["by"]
    assert report["strata"]["column"] == "level" and list(by) == ["easy", "5", "(none)"]
    assert [(t["read"], t["sampled"], t["kept"], t["mean_pass_rate"]) for t in by.values()] == [
        (3, 3, 0, 1.0), (3, 3, 3, 0.0), (1, 1, 1, 0.0)]
    line = [x for x in r.stderr.splitlines() if "the mix" in x]
    assert len(line) == 1 and ("by level moves: 'easy' 43% -> 43% -> 0%, '5' 43% -> 43% -> 75%, '(none)' 14% -> "
                               "14% -> 25% of the rows") in line[0]
    # without --strata: no such section, no such line
    r = cli("curate", "d.jsonl", "--keep", "0-0.5", "--near", "1", "--out", "plain", *TINY_CURATE)
    assert "strata" not in json.loads(r.stdout.strip().splitlines()[-1]) and "the mix" not in r.stderr


def test_curate_writes_parquet_for_parquet(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    datasets.Dataset.from_list(ROWS[:3]).to_parquet(str(tmp_path / "d.parquet"))
    r = cli("curate", "d.parquet", "--keep", "0-1", "--out", "c", *TINY_CURATE)
    assert r.returncode == 0, r.stderr[-2000:]
    assert [dict(x) for x in datasets.Dataset.from_parquet(str(tmp_path / "c" / "d.parquet"))] == [ROWS[0], ROWS[2]]
    # nothing kept: an empty table with the input's columns, which curate (and task.data) read back as no rows
    r = cli("curate", "d.parquet", "--keep", "0.5-0.5", "--out", "none", *TINY_CURATE)  # the rates are 0 or 1
    assert r.returncode == 0 and json.loads(r.stdout.strip().splitlines()[-1])["kept"] == 0, r.stderr[-2000:]
    empty = pq.read_table(str(tmp_path / "none" / "d.parquet"))
    assert len(empty) == 0 and set(empty.column_names) == {"prompt", "answer"}
    r = cli("curate", "none/d.parquet", *TINY_CURATE)
    assert r.returncode == 2 and "none/d.parquet: no rows to curate" in r.stderr, r.stderr


def test_curate_never_writes_over_its_data_and_holds_one_curation(tmp_path, monkeypatch):
    # DATA named like curate's own files: the kept rows go beside them under another name, nothing is replaced
    monkeypatch.chdir(tmp_path)
    for name in ("rows.jsonl", "report.json"):
        write(tmp_path / name, ROWS[:3])
        r = cli("curate", name, "--keep", "0-1", "--out", "c", *TINY_CURATE)
        assert r.returncode == 0, r.stderr[-2000:]
        report = json.loads(r.stdout.strip().splitlines()[-1])
        assert report["out"] == str(Path("c") / f"curated-{name}")
        assert [json.loads(x) for x in (tmp_path / "c" / f"curated-{name}").read_text().splitlines()] == [ROWS[0],
                                                                                                          ROWS[2]]
        assert json.loads((tmp_path / "c" / "report.json").read_text())["kept"] == 2  # the report, not data
        assert "pass_rate" in json.loads((tmp_path / "c" / "rows.jsonl").read_text().splitlines()[0])
    # a second curation into the folder: the first one's data goes, so the folder holds what its report says
    assert not (tmp_path / "c" / "curated-rows.jsonl").exists()
    write(tmp_path / "d.jsonl", ROWS[:3])
    assert cli("curate", "d.jsonl", "--keep", "0-1", "--out", "c", *TINY_CURATE).returncode == 0
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == [".rlpost", "d.jsonl", "pass_rate.svg",
                                                                 "report.json", "rows.jsonl"]


def test_an_out_that_cannot_be_made_is_said_before_any_sampling(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "d.jsonl", ROWS[:3])
    (tmp_path / "file").write_text("x")
    r = cli("curate", "d.jsonl", "--out", "file/c", *TINY_CURATE)
    assert r.returncode == 2 and "--out: " in r.stderr and "is a file" in r.stderr and "sampling" not in r.stderr
    # /proc takes no new folder, root or not: the line comes before the sampling, not after it
    r = cli("curate", "d.jsonl", "--out", "/proc/rlpost-no-such-folder", *TINY_CURATE)
    assert r.returncode == 1 and "cannot write /proc/rlpost-no-such-folder" in r.stderr, r.stderr
    assert "sampling" not in r.stderr


@pytest.mark.parametrize("args, line", [
    (["d.jsonl", "--keep", "0.9-0.1"], "--keep: expected a band"),
    (["bad.jsonl"], "bad.jsonl:2: not valid JSON"),
    (["nothere.jsonl"], "data: file not found: nothere.jsonl"),
    (["d.jsonl", "--out", "theirs"], "--out: theirs holds files rlpost did not write (notes.txt)"),
    (["d.jsonl", "--k", "0"], "--k 0: expected at least 1 sample a prompt"),
    (["d.jsonl", "--k", "8", "--keep", "0.2-0.2"], "--keep 0.2-0.2: no pass rate of 8 samples"),
    (["d.jsonl", "--heldout", "nope.jsonl"], "--heldout: file not found: nope.jsonl"),
    (["d.jsonl", "--heldout", "empty.jsonl"], "--heldout: empty.jsonl holds no rows"),
    (["deep.jsonl"], "deep.jsonl:1: JSON nested too deeply to read"),
    (["d.jsonl", "--strata", "_line"], "--strata _line: no row of d.jsonl has a column '_line'"),
    (["d.jsonl", "trainer.lr=1e-5"], "trainer.lr: rlpost eval would ignore it"),
    (["d.jsonl", "--strata", "level"], "--strata level: no row of d.jsonl has a column 'level' (its columns: answer, "
                                       "prompt)"),
])
def test_bad_input_is_one_line_naming_it(tmp_path, monkeypatch, args, line):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "d.jsonl", ROWS)
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a", "answer": "b"}\n{oops\n')
    (tmp_path / "empty.jsonl").write_text("\n")
    (tmp_path / "deep.jsonl").write_text('{"prompt": "a", "answer": "b", "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "notes.txt").write_text("mine")
    rest = [a for i, a in enumerate(TINY_CURATE) if "--k" not in args or i not in (2, 3)]  # the case's own --k
    r = cli("curate", *args, *rest)
    assert r.returncode == 2 and line in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_number_and_its_string_are_two_strata():
    rows = [{"level": 1}, {"level": "1"}, {"level": "2"}, {"level": [1]}, {"level": True}, {}, {"level": None}]
    assert strata_of(rows, "level", "d.jsonl") == ["1", '"1"', "2", "[1]", "true", "(none)", "(none)"]
    assert strata_of([{"level": "1"}, {"level": "2"}], "level", "d.jsonl") == ["1", "2"]  # no clash: as they are
