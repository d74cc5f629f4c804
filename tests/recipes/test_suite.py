"""rlpost eval SUITE.yaml (recipes/suite.py): several sets in one command, per source, and the regression
table against an earlier result or model, on the tiny model with a verifier whose verdict is fixed per row."""

import json
import re

import pytest
from helpers import TINY, TINY_EVAL, cli

from rlpost.recipes.suite import flips, is_suite, report

EVAL = [o for o in TINY_EVAL if not o.startswith(("task.n_train", "task.n_heldout"))]
HELD = [{"prompt": "first", "answer": "pass", "data_source": "a"}, {"prompt": "second", "answer": "fail",
                                                                     "data_source": "b"},
        {"prompt": "third", "answer": "pass", "data_source": "b"}]


def write_suite(tmp_path, sets: dict, **extra):
    (tmp_path / "suite.yaml").write_text(json.dumps({"model": "tiny", "overrides": EVAL, "sets": sets, **extra}))


def dataset_set(tmp_path, monkeypatch) -> list[str]:
    """HELD as both the training and the held-out file of a dataset task in tmp_path (the working
    folder), scored by a verifier that passes what says so: the overrides of one suite set."""
    monkeypatch.chdir(tmp_path)
    rows = "".join(json.dumps(r) + "\n" for r in HELD)
    (tmp_path / "train.jsonl").write_text(rows)
    (tmp_path / "held.jsonl").write_text(rows)
    return ["task.name=dataset", "task.data=train.jsonl", "task.eval_data=held.jsonl",
            "task.verifier=toy_verifiers:says_pass"]


def test_a_suite_per_set_and_source_then_what_flipped(tmp_path, monkeypatch):
    data = dataset_set(tmp_path, monkeypatch)
    write_suite(tmp_path, {"mine": data, "arith": ["task.name=arithmetic", "task.n_heldout=4"]})
    r = cli("eval", "suite.yaml")
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result == json.loads((tmp_path / "suite.results.json").read_text())
    mine = result["sets"]["mine"]
    # says_pass: right exactly on the rows whose answer is "pass", whatever the model wrote
    assert mine["heldout_accuracy"] == pytest.approx(2 / 3) and mine["n"] == 3
    assert mine["problems"] == {"first": True, "second": False, "third": True}
    assert mine["by_source"] == {"a": 1.0, "b": 0.5}
    assert result["sets"]["arith"]["n"] == 4 and len(result["sets"]["arith"]["problems"]) == 4
    # against an earlier result: "first" was wrong then (fixed now), "second" right (broken now)
    before = {"sets": {"mine": {**mine, "heldout_accuracy": 1 / 3,
                                "problems": {"first": False, "second": True, "third": True}}}}
    (tmp_path / "before.json").write_text(json.dumps(before))
    r = cli("eval", "suite.yaml", "--against", "before.json", "--out", "now.json")
    assert r.returncode == 0, r.stderr[-2000:]
    table = json.loads((tmp_path / "now.json").read_text())["flips"]
    assert table == {"mine": {"compared": 3, "before": 1 / 3, "now": pytest.approx(2 / 3), "fixed": ["first"],
                              "broken": ["second"]}}  # arith is not in the earlier result: not compared
    # against a model: the same tiny model, greedy, flips nothing
    r = cli("eval", "suite.yaml", "--against", "tiny", "--out", "same.json", "--n", "2")
    flipped = json.loads((tmp_path / "same.json").read_text())["flips"]
    assert r.returncode == 0 and {k: (len(v["fixed"]), len(v["broken"])) for k, v in flipped.items()} == {
        "mine": (0, 0), "arith": (0, 0)}


def test_flips_by_hand():
    now = {"s": {"heldout_accuracy": 0.5, "problems": {"a": True, "b": False, "c": True, "new": True}}}
    before = {"s": {"heldout_accuracy": 0.5, "problems": {"a": False, "b": True, "c": True, "gone": False}}}
    assert flips(now, before) == {"s": {"compared": 3, "before": 0.5, "now": 0.5, "fixed": ["a"], "broken": ["b"]}}


@pytest.mark.parametrize("suite, args, line", [
    ({"sets": {}}, [], "sets: expected a mapping"),
    ({"sets": {"x": "task.name=math"}}, [], "sets.x: expected a list of key=value overrides"),
    ({"sets": {"x": ["task.bogus=1"]}}, [], "suite.yaml: sets.x: task.bogus"),
    ({"sets": {"x": []}, "extra": 1}, [], "a suite has 'model', 'overrides' and 'sets'"),
    ({"sets": {"x": []}}, ["--against", "missing.json"], "--against: missing.json is not a suite's results JSON"),
    ({"sets": {"x": []}}, ["--n", "-1"], "--n: expected a whole number >= 0"),
    ({"sets": {"x": []}}, ["--k", "2"], "--k: pass@k and maj@k need --samples"),
    ({"sets": {"x": []}}, ["--samples", "2", "--k", "3"], "--k: every k must be >= 1 and <= --samples (2)"),
    ({"sets": {"x": []}}, ["--judge", "HuggingFaceTB/SmolLM2-1.7B"], "--judge HuggingFaceTB/SmolLM2-1.7B: expected a "
                                                                     "local model folder"),
])
def test_bad_suites_are_one_line(tmp_path, monkeypatch, suite, args, line):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "suite.yaml").write_text(json.dumps(suite))
    r = cli("eval", "suite.yaml", *args)
    assert r.returncode == 2 and line in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("text, line", [
    (None, "suite typo.yaml: file not found"),  # not "recipe: file not found" with the shipped recipes listed
    ("sets: [", "suite typo.yaml line 1: not valid YAML"),
    ("- a list", "suite typo.yaml: expected a mapping at the top level"),
])
def test_an_unreadable_suite_file_is_named_a_suite(tmp_path, monkeypatch, text, line):
    monkeypatch.chdir(tmp_path)
    if text is not None:
        (tmp_path / "typo.yaml").write_text(text)
    r = cli("eval", "typo.yaml")
    assert r.returncode == 2 and line in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_sampled_metrics_per_source_and_a_versioned_judge(tmp_path, monkeypatch):
    data = dataset_set(tmp_path, monkeypatch)
    write_suite(tmp_path, {"mine": data})
    r = cli("eval", "suite.yaml", "--samples", "3", "--k", "1,2", "--judge", "tiny")
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    sampled = result["sets"]["mine"]["sampled"]
    # says_pass: every sample of "first" and "third" right, none of "second"; so pass@k = maj@k = 2/3 for every k,
    # source a (first) 1, source b (second, third) 1/2
    for k in (1, 2):
        assert sampled[f"pass@{k}"] == pytest.approx(2 / 3) and sampled[f"maj@{k}"] == pytest.approx(2 / 3)
        assert (sampled[f"pass@{k}/a"], sampled[f"pass@{k}/b"]) == (1.0, 0.5)
        assert (sampled[f"maj@{k}/a"], sampled[f"maj@{k}/b"]) == (1.0, 0.5)
    assert (sampled["problems"], sampled["problems/a"], sampled["problems/b"]) == (3, 1, 2)
    assert result["sets"]["mine"]["problems"] == {"first": True, "second": False, "third": True}  # greedy kept
    judged = result["sets"]["mine"]["judge"]
    scores = judged["scores"]
    assert set(scores) == {"first", "second", "third"} and all(1 <= x <= 9 for x in scores.values())
    assert judged["mean_score"] == pytest.approx(sum(scores.values()) / 3)
    assert judged["mean_score/b"] == pytest.approx((scores["second"] + scores["third"]) / 2)
    from rlpost.rewards import judge

    identity = result["judge"]
    assert (identity["model"], identity["prompt"], identity["rubric"]) == ("tiny", judge.POINTWISE_PROMPT,
                                                                          judge.DEFAULT_RUBRIC)
    # the prompt's version is pinned to its text: a change to the judge prompt, prefix or rubric fails here until
    # JUDGE_PROMPT_VERSION (recipes/evaluate.py) is bumped and this hash with it
    assert (identity["prompt_version"], identity["sha256"]) == (1, PINNED_JUDGE_SHA256)


PINNED_JUDGE_SHA256 = "aab1d58a8dee42fd4261641d47eb72bb3f1ef7ff846ea56fd50e8360d221afa7"


def test_a_run_given_to_eval_gets_the_suite_in_its_report(tmp_path, monkeypatch):
    data = dataset_set(tmp_path, monkeypatch)
    # the same rows train and are held out here: the contamination check would refuse the run
    r = cli("train", *TINY, *data, "task.max_contamination=1", "run.steps=1", "run.out_dir=runs", "run.name=r")
    assert r.returncode == 0, r.stderr[-2000:]
    write_suite(tmp_path, {"mine": data})
    before = {"sets": {"mine": {"heldout_accuracy": 1 / 3, "problems": {"first": False, "second": True,
                                                                         "third": True}}}}
    (tmp_path / "before.json").write_text(json.dumps(before))
    r = cli("eval", "suite.yaml", "--model", "runs/r", "--against", "before.json", "--out", "now.json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "suites/suite.json; shown in runs/r/report.html" in r.stderr  # where the results went, in a line
    kept = json.loads((tmp_path / "runs" / "r" / "suites" / "suite.json").read_text())
    assert kept == json.loads((tmp_path / "now.json").read_text()) and kept["model"] == "runs/r"
    # the run's report and the page beside the results JSON: the set (says_pass: 2 of 3), its sources, the regression
    # table (1/3 -> 2/3: "first" fixed, "second" broken) and the bar plot
    for page in ((tmp_path / "runs" / "r" / "report.html").read_text(), (tmp_path / "now.html").read_text()):
        cells = [re.sub("<[^>]+>", "", c) for c in re.findall(r"<td>(.*?)</td>", page[page.find("<h3>suite.yaml"):])]
        assert cells[:12] == ["mine", "", "3", "0.667", "", "a", "", "1.000", "", "b", "", "0.500"]
        assert cells[12:19] == ["mine", "3", "0.333", "0.667", "+0.333", "1", "1"]
        assert "mine: 1 fixed</summary><ul><li><code>first</code>" in page and "<svg" in page
    assert "Evaluation suites" in (tmp_path / "runs" / "r" / "report.html").read_text()
    # a run whose own files are damaged: the results are still written and kept, the report's failure one line
    (tmp_path / "runs" / "r" / "summary.json").write_text("{")
    r = cli("eval", "suite.yaml", "--model", "runs/r/model", "--out", "again.json")
    assert r.returncode == 0 and (tmp_path / "again.html").exists(), r.stderr[-2000:]
    assert "report.html not rebuilt: rlpost: error: " in r.stderr and "summary.json" in r.stderr.splitlines()[-1]
    assert "against" not in json.loads((tmp_path / "runs" / "r" / "suites" / "suite.json").read_text())


def test_an_html_out_keeps_the_json_and_the_page_goes_beside_it(tmp_path):
    result = {"suite": "s.yaml", "model": "tiny",
              "sets": {"x": {"heldout_accuracy": 0.5, "n": 2, "by_source": {}, "problems": {}}}}
    out = tmp_path / "results.html"
    out.write_text(json.dumps(result))
    report(result, out, "s", None)  # no run: nothing hands it a report writer
    assert json.loads(out.read_text()) == result and "0.500" in (tmp_path / "results.html.html").read_text()
    report(result, tmp_path / "s.results.json", "s", None)
    assert "0.500" in (tmp_path / "s.results.html").read_text()
    assert not (tmp_path / "suites").exists()  # "tiny" is no run's model: nothing kept


GOOD = {"heldout_accuracy": 0.5, "n": 2, "by_source": {}, "problems": {"a": True, "b": False}}


@pytest.mark.parametrize("before, line", [
    ({"sets": [1]}, "--against: before.json: 'sets' is not a mapping of set names to results"),
    ({"sets": {"x": 5}}, "--against: before.json: sets.x holds no 'heldout_accuracy' and 'problems'"),
    ({"sets": {"x": {"heldout_accuracy": 0.5}}}, "sets.x holds no 'heldout_accuracy' and 'problems'"),
    ({"sets": {"other": GOOD}}, "--against: before.json shares no set with this suite (its sets: other; this "
                                "suite's: x)"),
])
def test_an_against_file_is_checked_before_anything_is_evaluated(tmp_path, monkeypatch, before, line):
    # a malformed or foreign baseline is one line at once, not a traceback after every set was evaluated
    monkeypatch.chdir(tmp_path)
    write_suite(tmp_path, {"x": ["task.name=arithmetic"]})
    (tmp_path / "before.json").write_text(json.dumps(before))
    r = cli("eval", "suite.yaml", "--against", "before.json")
    assert r.returncode == 2 and line in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_set_names_keys_and_data_are_checked_before_any_set_is_evaluated(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "twice.yaml").write_text('model: tiny\nsets:\n  1: [task.name=arithmetic]\n  "1": [task.name=math]\n')
    r = cli("eval", "twice.yaml")
    assert r.returncode == 2 and "twice.yaml: sets: two sets named '1'" in r.stderr, r.stderr
    write_suite(tmp_path, {"x": ["task.name=arithmetic", "trainer.lr=1"]})  # what eval would ignore, as rlpost eval
    r = cli("eval", "suite.yaml")
    assert r.returncode == 2 and "suite.yaml: sets.x: trainer.lr: rlpost eval would ignore it" in r.stderr, r.stderr
    # a later set's bad row: named under its set before the first set is evaluated, so nothing is lost to it
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a", "answer": "b"}\n[1]\n')
    write_suite(tmp_path, {"good": ["task.name=arithmetic"], "bad": ["task.name=dataset", "task.data=bad.jsonl"]})
    r = cli("eval", "suite.yaml")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "suite.yaml: sets.bad: bad.jsonl:2: expected a JSON object per line" in r.stderr


def test_a_baseline_is_never_written_over(tmp_path, monkeypatch):
    data = dataset_set(tmp_path, monkeypatch)
    write_suite(tmp_path, {"mine": data})
    assert cli("eval", "suite.yaml").returncode == 0
    first = (tmp_path / "suite.results.json").read_text()
    # the docs' second command: the default out is numbered, the baseline stays as it was
    r = cli("eval", "--n", "2", "suite.yaml", "--against", "suite.results.json")
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "suite.results.json").read_text() == first
    assert json.loads((tmp_path / "suite.results.2.json").read_text())["against"] == "suite.results.json"
    r = cli("eval", "suite.yaml", "--against", "suite.results.json", "--out", "./suite.results.json")
    assert r.returncode == 2 and "it is the --against file" in r.stderr, r.stderr
    (tmp_path / "notes.json").write_text("{}")
    r = cli("eval", "suite.yaml", "--out", "notes.json")
    assert r.returncode == 2 and "--out notes.json: exists and is not a suite's results" in r.stderr, r.stderr


def test_a_suite_file_is_known_anywhere_among_the_words(tmp_path, monkeypatch):
    # after an option's value, and in capitals: not taken for a model folder
    data = dataset_set(tmp_path, monkeypatch)
    (tmp_path / "S.YAML").write_text(json.dumps({"model": "tiny", "overrides": EVAL, "sets": {"mine": data}}))
    r = cli("eval", "--n", "1", "S.YAML")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((tmp_path / "S.results.json").read_text())["sets"]["mine"]["n"] == 1
    # the first positional word decides, an option's value never does
    assert is_suite(["s.yml", "--out", "x.json"]) and not is_suite(["RUN", "--out", "r.yaml"])
    assert not is_suite(["tiny", "task.data=a.yaml"]) and not is_suite([])
    # which options take a value is read from the parsers: single `rlpost eval`'s are the suite's too
    import argparse
    from rlpost.recipes import eval_args
    from rlpost.recipes.suite import parser, taking_a_word
    sub = argparse.ArgumentParser().add_subparsers()
    eval_args.add_parser(sub, "")
    assert taking_a_word(sub.choices["eval"]) <= taking_a_word(parser()) and "--against" in taking_a_word(parser())
