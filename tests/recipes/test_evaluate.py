"""rlpost eval at a fixed sampling budget: pass@k and maj@k by hand, and through the CLI."""

import json

import pytest

from rlpost.recipes.evaluate import answer_key, by_task, by_task_summary, first_rows, summarise


def rec(problem, sample, answer, correct):
    return {"problem": problem, "sample": sample, "answer": answer, "correct": correct}


def test_summarise_by_hand():
    records = [
        # problem 0: answers 5, 7, 7, 5 with 5 right -> c = 2 of 4
        rec(0, 0, "5", True), rec(0, 1, "7", False), rec(0, 2, "7", False), rec(0, 3, "5", True),
        # problem 1: all wrong
        rec(1, 0, "1", False), rec(1, 1, None, False), rec(1, 2, "1", False), rec(1, 3, "2", False),
    ]
    s = summarise(records, [1, 2, 4])
    assert s["problems"] == 2
    assert s["pass@1"] == pytest.approx((0.5 + 0) / 2)
    assert s["pass@2"] == pytest.approx((1 - 1 / 6 + 0) / 2)  # 1 - C(2,2)/C(4,2)
    assert s["pass@4"] == pytest.approx(0.5)
    # problem 0 (problem 1 scores 0 everywhere): maj@1 = 2 right of 4 = 0.5 = its pass@1;
    # maj@2 over the C(4,2) = 6 pairs: {5,5} -> 1, {7,7} -> 0, four {5,7} ties -> 1/2 each: 3/6 = 0.5;
    # maj@4: 5 and 7 tie 2-2 -> 1/2. Averaged over the two problems: 0.25 each.
    assert s["maj@1"] == s["pass@1"] == pytest.approx(0.25)
    assert s["maj@2"] == s["maj@4"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="k=5"):
        summarise(records, [5])


def test_per_task_accuracy_by_hand(tmp_path):
    # arithmetic: 2 right of 3; math: 0 of 1; a record without a task (one family) is left out
    records = [{"task": "arithmetic", "correct": True}, {"task": "math", "correct": False},
               {"task": "arithmetic", "correct": False}, {"task": "arithmetic", "correct": True}, {"correct": True}]
    assert by_task(records) == {"arithmetic": (2 / 3, 3), "math": (0.0, 1)}
    # summary.json's keys, from the run's eval dumps (a run with no 'after' dump yet has only 'before')
    (tmp_path / "eval_before.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert by_task_summary(tmp_path) == {"heldout_accuracy_before/arithmetic": 2 / 3, "heldout_n/arithmetic": 3,
                                         "heldout_accuracy_before/math": 0.0, "heldout_n/math": 1}
    (tmp_path / "eval_after.jsonl").write_text(json.dumps({"task": "math", "correct": True}) + "\n")
    assert by_task_summary(tmp_path)["heldout_accuracy_after/math"] == 1.0


def test_eval_of_a_mix_reports_each_familys_accuracy():
    from helpers import tiny_cfg

    from rlpost.recipes.evaluate import heldout_accuracy

    # n=3 of the interleaved held-out rows (arithmetic, math, arithmetic, math): both families are in
    acc, n, summary = heldout_accuracy(tiny_cfg("task.mix=arithmetic:1,math:1", "task.n_heldout=2"), n=3)
    per_task = {k: v for k, v in summary.items() if k.startswith("heldout_accuracy/")}
    assert n == 3 and set(per_task) == {"heldout_accuracy/arithmetic", "heldout_accuracy/math"}
    assert acc == pytest.approx((2 * per_task["heldout_accuracy/arithmetic"] + per_task["heldout_accuracy/math"]) / 3)


def test_answer_key():
    assert answer_key({"pred": "12"}, "... 12") == "12"
    assert answer_key({"parsed": True, "extracted": "x"}, "c") == "x"
    assert answer_key({}, "  text ") == "text"


def test_eval_cli_reports_pass_at_k_and_saves_every_sample(tmp_path):
    from helpers import TINY_EVAL, cli

    out = tmp_path / "samples.jsonl"
    overrides = TINY_EVAL
    p = cli("eval", "tiny", *overrides, "--samples", "3", "--k", "1,3", "--out", str(out))
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["n"] == 8 and summary["samples"] == 3 and summary["problems"] == 8
    assert {"pass@1", "pass@3", "maj@1", "maj@3", "heldout_accuracy"} <= set(summary)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert (len(lines) == 8 * 3
            and {(r["problem"], r["sample"]) for r in lines} == {(i, j) for i in range(8) for j in range(3)})
    assert summary["pass@1"] == pytest.approx(sum(r["correct"] for r in lines) / 24)
    assert summary["maj@1"] == pytest.approx(summary["pass@1"])  # one sample's "majority" is that sample
    bad = cli("eval", "tiny", *overrides, "--samples", "2", "--k", "3", "--out", str(out))
    assert bad.returncode == 2 and "--k" in bad.stderr


def test_eval_samples_are_drawn_from_run_seed_whatever_was_drawn_before(tmp_path):
    # in one process (a notebook, rlpost.Trainer then eval) the torch RNG carries what earlier work drew
    import torch
    from helpers import TINY_EVAL, cli

    texts = []
    for name, before in (("a", 1), ("b", 2), ("c", 2)):
        torch.manual_seed(before)
        seed = ["run.seed=7"] if name == "c" else []
        p = cli("eval", "tiny", *TINY_EVAL, *seed, "--samples", "4", "--out", str(tmp_path / f"{name}.jsonl"))
        assert p.returncode == 0, p.stderr
        texts.append([json.loads(x)["completion"] for x in (tmp_path / f"{name}.jsonl").read_text().splitlines()])
    assert texts[0] == texts[1] and texts[1] != texts[2]


def test_eval_keeps_a_source_name_with_eval_in_it(tmp_path):
    from helpers import tiny_cfg

    from rlpost.recipes.evaluate import heldout_accuracy

    # verl's data_source names: the one with "eval/" inside must come back as written, not "lightMATH"
    rows = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1),
             "data_source": ("lighteval/MATH", "openai/gsm8k")[i % 2]} for i in range(4)]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _, n, summary = heldout_accuracy(tiny_cfg("task.name=dataset", f"task.data={data}", f"task.eval_data={data}"))
    assert n == 4
    assert {k for k in summary if k.startswith("heldout_accuracy/")} == {"heldout_accuracy/lighteval/MATH",
                                                                          "heldout_accuracy/openai/gsm8k"}


def test_paired_delta_by_hand():
    from rlpost.recipes.evaluate import paired_delta

    def dumps(before, after):
        return ([{"prompt": str(i), "completion": str(c), "correct": c} for i, c in enumerate(before)],
                [{"prompt": str(i), "completion": str(c), "correct": c} for i, c in enumerate(after)])

    # d = (0, 1, 0, -1): mean 0, sum of squares 2, s.e. sqrt(2 / (4 * 3)) = sqrt(1/6) = 0.4082...
    out = paired_delta(*dumps([1, 0, 0, 1], [1, 1, 0, 0]))
    assert out["heldout_delta"] == 0 and abs(out["heldout_delta_se"] - 0.408248) < 1e-6
    assert out["heldout_answers_changed"] == 2
    # d = (1, 1, 0, 0, 0): mean 0.4, sum of squares 2 * 0.36 + 3 * 0.16 = 1.2, s.e. sqrt(1.2 / 20) = 0.2449...
    # (unpaired it would be sqrt(0.2 * 0.8 / 5 + 0.6 * 0.4 / 5) = 0.2828...)
    out = paired_delta(*dumps([0, 0, 0, 0, 1], [1, 1, 0, 0, 1]))
    assert abs(out["heldout_delta"] - 0.4) < 1e-12 and abs(out["heldout_delta_se"] - 0.244949) < 1e-6
    # nothing moved: no error; one problem: none; other prompts: not a pair
    assert paired_delta(*dumps([1, 0, 1], [1, 0, 1]))["heldout_delta_se"] == 0
    assert paired_delta(*dumps([1], [0]))["heldout_delta_se"] is None
    b, a = dumps([1, 0], [1, 0])
    assert paired_delta(b, a[::-1]) == {} and paired_delta(b, a[:1]) == {}


def test_eval_counts_the_rows_it_skipped(tmp_path, capsys):
    # task.on_bad_row=skip: the held-out set that was scored is smaller than the file; the result says by how much
    from helpers import tiny_cfg

    from rlpost.recipes.evaluate import heldout_accuracy, model_accuracy

    good = [json.dumps({"prompt": f"What is {i} + 1?", "answer": str(i + 1)}) for i in range(3)]
    train, held = tmp_path / "train.jsonl", tmp_path / "held.jsonl"
    train.write_text("\n".join(good) + "\n")
    held.write_text("\n".join([good[0], '{"prompt": "no answer"}', '{"prompt": 7, "answer": "1"}', good[1]]) + "\n")
    base = ("task.name=dataset", f"task.data={train}", f"task.eval_data={held}", "task.max_contamination=1")
    _, n, summary = heldout_accuracy(tiny_cfg(*base, "task.on_bad_row=skip"))
    assert n == 2 and summary["skipped_rows"] == 2
    assert "skipped 2 data rows" in capsys.readouterr().err
    _, n, summary = heldout_accuracy(tiny_cfg(*base[:2], f"task.eval_data={train}", "task.max_contamination=1"))
    assert n == 3 and "skipped_rows" not in summary
    # a pipeline stage's accuracy (model_accuracy) over run.eval_n problems names that key when the set is smaller
    capsys.readouterr()
    model_accuracy(tiny_cfg(*base[:2], f"task.eval_data={train}", "task.max_contamination=1", "run.eval_n=5"), "tiny")
    assert "run.eval_n 5: the task has 3 held-out rows" in capsys.readouterr().err


def test_asking_for_more_rows_than_the_set_has_says_so(capsys):
    """--n 400 on a 200-row held-out set (task.n_heldout's cap) uses the 200, and says it: a 200-problem
    figure must not pass for a 400-problem one."""
    rows = [{"i": i} for i in range(5)]
    assert first_rows(rows, 3, "--n", "held-out") == rows[:3] and first_rows(rows, 0, "--n", "held-out") == rows
    assert "task has" not in capsys.readouterr().err
    assert first_rows(rows, 9, "--problems", "training") == rows
    err = capsys.readouterr().err
    assert "--problems 9: the task has 5 training rows" in err and "task.n_train" in err
