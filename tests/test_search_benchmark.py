"""benchmarks/search.py's arithmetic line checker (`--labels checker`): the step labels a PRM in
benchmarks/README.md was trained on, worked by hand."""

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def search_module():
    if "search_benchmark" not in sys.modules:
        spec = importlib.util.spec_from_file_location("search_benchmark", ROOT / "benchmarks" / "search.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return sys.modules["search_benchmark"]


def test_a_line_keeps_the_path_when_true_and_a_partial_result_and_the_last_is_the_grade():
    s = search_module()
    assert s.prefix_values("5 + 3 - 2") == {8, 6} and s.prefix_values("9 - 8 + 7") == {1, 8}
    label = s.step_labels
    assert label("5 + 3 - 2", ["5 + 3 = 8", "8 - 2 = 6", "Answer: 6"], 1.0) == [1, 1, 1]
    assert label("5 + 3 - 2", ["5 + 3 = 9", "9 - 2 = 7", "Answer: 7"], 0.0) == [0, 0, 0]  # the first error ends it
    assert label("5 + 3 - 2", ["5 + 3 = 8", "8 - 2 = 5", "Answer: 6"], 1.0) == [1, 0, 1]  # the last: the grade
    assert label("5 + 3 - 2", ["5 + 3 - 2 = 6", "Answer: 6"], 1.0) == [1, 1]  # the whole sum in one line
    assert label("5 + 3 - 2", ["5 + 2 = 7", "7 + 3 = 10", "Answer: 10"], 0.0) == [0, 0, 0]  # true, off the chain
    assert label("5 + 3 - 2", ["Let us add.", "5 + 3 = 8.", "Answer: 6"], 1.0) == [1, 1, 1]  # prose keeps it
    assert label("5 + 3 - 2", [], 0.0) == []


def test_rows_from_an_eval_sample_file_are_rlpost_prm_step_rows(tmp_path):
    from rlpost.envs.step_data import parse

    s = search_module()
    rows = [{"prompt": [{"role": "user", "content": "Compute 4 + 4 - 3."}], "answer": "5", "expr": "4 + 4 - 3"}]
    samples = tmp_path / "samples.jsonl"
    samples.write_text(json.dumps({"problem": 0, "completion": "4 + 4 = 8\n\n8 - 3 = 5\nAnswer: 5", "correct": True})
                       + "\n" + json.dumps({"problem": 0, "completion": "  \n", "correct": False}) + "\n")
    (row,) = s.checker_rows(rows, samples)  # a blank completion has no step: no row
    assert row["steps"] == ["4 + 4 = 8", "8 - 3 = 5", "Answer: 5"] and row["labels"] == [1, 1, 1]
    assert parse(row, "x.jsonl:1").steps == row["steps"]
