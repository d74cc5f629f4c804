"""observe/suite_report.py: a suite's results as HTML (the run report's section, the page beside the JSON),
read back from the page by hand-worked numbers."""

import html
import json
import re

import pytest

from rlpost.observe import suite_report
from rlpost.observe.report import build_html
from rlpost.types.errors import DataError

RESULT = {
    "suite": "evals/suite.yaml", "model": "runs/r/model", "samples": 4, "ks": [1, 4],
    "sets": {"arith": {"heldout_accuracy": 0.625, "n": 8, "by_source": {"add": 0.75, "mul": 0.5},
                       "problems": {},
                       "sampled": {"pass@1": 0.5, "maj@1": 0.5, "pass@4": 0.875, "maj@4": 0.625,
                                   "problems/add": 4, "pass@1/add": 0.6875, "pass@4/add": 1.0,
                                   "maj@1/add": 0.6875, "maj@4/add": 0.75, "problems/mul": 4,
                                   "pass@1/mul": 0.3125, "pass@4/mul": 0.75, "maj@1/mul": 0.3125, "maj@4/mul": 0.5}},
             "gsm": {"heldout_accuracy": 0.25, "n": 4, "by_source": {}, "problems": {}, "sampled": {}}},
    "against": "runs/base.json",
    "flips": {"arith": {"compared": 8, "before": 0.5, "now": 0.625, "fixed": ["what is 2+<3>?", "b"],
                        "broken": ["c"]}},
}


def rows(page: str) -> list[list[str]]:
    """Every table row's cells, tags stripped and entities read back."""
    return [[html.unescape(re.sub("<[^>]+>", "", c)) for c in re.findall(r"<t[dh]>(.*?)</t[dh]>", r)]
            for r in re.findall(r"<tr>(.*?)</tr>", page)]


@pytest.mark.plots  # reads the bar plot
def test_the_set_source_and_regression_tables_hold_the_numbers():
    page = suite_report.page(RESULT)
    got = rows(page)
    assert got[0] == ["set", "source", "n", "accuracy", "pass@1", "maj@1", "pass@4", "maj@4"]
    assert got[1] == ["arith", "", "8", "0.625", "0.500", "0.500", "0.875", "0.625"]
    assert got[2] == ["", "add", "4", "0.750", "0.688", "0.688", "1.000", "0.750"]  # 0.6875 to 3 places
    assert got[3] == ["", "mul", "4", "0.500", "0.312", "0.312", "0.750", "0.500"]
    assert got[4] == ["gsm", "", "4", "0.250", "", "", "", ""]  # no samples kept for it: blank, never 0
    # the regression table: 0.5 -> 0.625 is +0.125; two fixed, one broken, each listed by prompt (escaped)
    assert got[5] == ["set", "compared", "before", "now", "change", "fixed", "broken"]
    assert got[6] == ["arith", "8", "0.500", "0.625", "+0.125", "2", "1"]
    assert "arith: 2 fixed" in page and "arith: 1 broken" in page and "what is 2+&lt;3&gt;?" in page
    assert "<3>" not in page
    # the bar plot: one bar per set now, one before for the compared set (0 height for gsm, not compared)
    svg = page[page.find("<svg"):]
    assert svg and "before (base.json)" in svg and "now (model)" in svg


def test_no_against_no_regression_table_and_no_samples_no_sampled_columns():
    bare = {"suite": "s.yaml", "model": "tiny",
            "sets": {"x": {"heldout_accuracy": 1 / 3, "n": 3, "by_source": {"a": 0.0}, "problems": {}}}}
    got = rows(suite_report.section([bare]))
    assert got == [["set", "source", "n", "accuracy"], ["x", "", "3", "0.333"], ["", "a", "", "0.000"]]
    assert "Against" not in suite_report.section([bare])


def test_a_run_folder_is_named_by_itself_or_its_model_folder_and_nothing_else(tmp_path):
    run = tmp_path / "r"
    (run / "model").mkdir(parents=True)
    (run / "config.yaml").write_text("{}")
    (run / "model" / "config.json").write_text("{}")
    assert suite_report.run_of(str(run)) == run and suite_report.run_of(str(run / "model")) == run
    assert suite_report.run_of("embedded") is None and suite_report.run_of(str(tmp_path)) is None
    other = tmp_path / "m"
    other.mkdir()
    (other / "config.json").write_text("{}")  # a model folder, not a run's
    assert suite_report.run_of(str(other)) is None


def test_a_judged_suite_gets_its_score_column_per_set_and_source():
    judged = {"suite": "open.yaml", "model": "tiny", "judge": {"model": "judges/j", "prompt_version": 2},
              "sets": {"chat": {"heldout_accuracy": 0.5, "n": 2, "by_source": {"a": 0.5}, "problems": {},
                                "judge": {"mean_score": 6.25, "mean_score/a": 7.125, "scores": {}}}}}
    page = suite_report.section([judged])
    assert rows(page) == [["set", "source", "n", "accuracy", "judge (1-9)"], ["chat", "", "2", "0.500", "6.25"],
                          ["", "a", "", "0.500", "7.12"]]  # 7.125 to 2 places, half to even
    assert "judge judges/j (prompt v2)" in page


HOSTILE = "<script>alert(1)</script>"


@pytest.mark.plots  # the plot's text too
def test_every_string_from_the_results_is_escaped_in_the_tables_and_the_plot():
    bad = {"suite": f"{HOSTILE}.yaml", "model": f"m{HOSTILE}", "samples": 2, "ks": [2],
           "judge": {"model": HOSTILE, "prompt_version": HOSTILE},
           "sets": {f"s{HOSTILE} costs $\\frac$ -->": {
               "heldout_accuracy": 0.5, "n": HOSTILE, "by_source": {f"src{HOSTILE}": 0.5}, "problems": {},
               "sampled": {"pass@2": HOSTILE}, "judge": {"mean_score": 5.0}}},
           "against": f"b{HOSTILE}",
           "flips": {f"s{HOSTILE} costs $\\frac$ -->": {"compared": 1, "before": None, "now": 0.5, "broken": [],
                                                    "fixed": [f"what is {HOSTILE} & 1?"]}}}
    page = suite_report.page(bad)
    assert "<script" not in page.lower() and page.count("-->") == page.count("<!--")  # no comment closed early
    assert f"<code>what is {HOSTILE.replace('<', '&lt;').replace('>', '&gt;')} &amp; 1?</code>" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.split("<svg")[0]  # the set, source, model, judge
    # a '$' pair in a set name is text, not mathtext (which would fail to parse or draw something else)
    assert "costs $\\frac$" in page[page.find("<svg"):]
    # the change of a set whose before is unknown is blank, never a number made up
    assert rows(page)[-1] == [f"s{HOSTILE} costs $\\frac$ -->", "1", "", "0.500", "", "1", "0"]


def test_kept_suites_are_read_back_and_a_damaged_one_is_one_line(tmp_path):
    suite_report.record(tmp_path, RESULT, "suite")
    assert suite_report.load(tmp_path / "suites" / "suite.json") == json.loads(json.dumps(RESULT))
    (tmp_path / "suites" / "broken.json").write_text('{"sets": [')
    with pytest.raises(DataError, match=r"broken.json: not a suite's results JSON \(JSONDecodeError"):
        suite_report.load(tmp_path / "suites" / "broken.json")


def test_the_run_report_shows_its_suites_and_one_line_per_damaged_file(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    assert "Evaluation suites" not in build_html(tmp_path)  # none kept: no section
    suite_report.record(tmp_path, RESULT, "suite")
    suites = tmp_path / "suites"
    (suites / "a_truncated.json").write_text('{"sets": {"x": ')  # sorted before the good one
    (suites / "b_shape.json").write_text(json.dumps({"sets": {"x": {"n": 1}}}))  # no accuracy
    (suites / "c_list.json").write_text("[1, 2]")
    (suites / "d_gone.json").symlink_to(tmp_path / "nowhere.json")  # a dangling link: unreadable
    page = build_html(tmp_path)
    lines = [html.unescape(x) for x in re.findall(r"<p class='warn'>(.*?)</p>", page)]
    assert [line.split(": not a suite's")[0] for line in lines] == [
        str(suites / n) for n in ("a_truncated.json", "b_shape.json", "c_list.json", "d_gone.json")]
    assert "JSONDecodeError" in lines[0] and "KeyError: 'heldout_accuracy'" in lines[1]
    assert "FileNotFoundError" in lines[3]
    # the good suite is there all the same, with its numbers, and so is the rest of the report
    assert ["arith", "8", "0.500", "0.625", "+0.125", "2", "1"] in rows(page)
    assert "Evaluation suites" in page and "<h2>Samples</h2>" in page and "<h2>Config</h2>" in page
