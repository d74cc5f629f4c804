"""math-verify answers, the R1 format reward and the R1 reward stack, on hand-picked cases."""

import pytest

pytest.importorskip("math_verify")

from rlpost.envs.math import R1_SYSTEM_PROMPT, format_score, r1_score, score  # noqa: E402


@pytest.mark.parametrize("completion, answer", [
    ("\\boxed{\\frac{1}{2}}", "0.5"),  # LaTeX fraction vs decimal
    ("1/2", "\\frac{1}{2}"),  # plain fraction vs bare LaTeX gold (wrapped in \boxed for parsing)
    ("The answer is 42.", "42"),  # last expression in prose
    ("<answer>3</answer>", "3"),  # math-verify alone finds nothing in "<answer>3</answer>"
    ("<think>7 + 5</think> <answer>\\frac{\\sqrt{3}}{2}</answer>", "\\frac{\\sqrt{3}}{2}"),
    ("<answer>50\\%</answer>", "0.5"),  # percentages
    ("<answer>x = 3</answer>", "3"),  # an assignment reads as its value
    ("<answer>1,000</answer>", "1000"),
    ("$2\\sqrt{2}$", "\\sqrt{8}"),  # symbolic equality
])
def test_equivalent_answers_score_one(completion, answer):
    reward, info = score(completion, {"answer": answer})
    assert reward == 1.0 and info["correct"] is True and isinstance(info["parsed"], str)


@pytest.mark.parametrize("completion, answer", [
    ("The answer is 41.", "42"),
    ("<answer>-3</answer>", "3"),
    ("\\boxed{\\frac{1}{3}}", "0.5"),
    ("<answer>0.333</answer>", "\\frac{1}{3}"),  # math-verify rounds to 6 places; 3 is not enough
])
def test_wrong_answers_score_zero(completion, answer):
    reward, info = score(completion, {"answer": answer})
    assert reward == 0.0 and info["correct"] is False and info["parsed"] is not None  # read, but wrong


@pytest.mark.parametrize("completion, answer", [
    ("To find 8/3 * 1/3, we need to perform", "\\frac{8}{9}"),  # the question restated, cut off: SymPy makes it 8/9
    ("\\boxed{8/3 \\cdot 1/3}", "\\frac{8}{9}"),  # the same in LaTeX, boxed
    ("\\boxed{\\frac{8}{3}\\times\\frac{1}{3}}", "\\frac{8}{9}"),
    ("17 * 23", "391"),
    ("2 - 5", "-3"),  # a minus between operands is an operation; a sign is not (next test)
    ("\\boxed{2^3}", "8"),
    ("2/1 - 8/9 = (2/1) - ", "\\frac{10}{9}"),  # working cut off mid-line: math-verify reads the left side, unevaluated
])
def test_an_operation_left_undone_is_not_an_answer(completion, answer):
    # math-verify alone scores each of these 1: the prediction evaluates to the gold. A model
    # rewarded for them learns to copy the question (the mix benchmark's math rows went 0.04 -> 1.00
    # in 6 steps that way, benchmarks/README.md).
    reward, info = score(completion, {"answer": answer})
    assert reward == 0.0 and info["correct"] is False and info["unevaluated"] is True


@pytest.mark.parametrize("completion, answer", [
    ("8/3 * 1/3 = 8/9", "\\frac{8}{9}"),  # the working, then the value: the last expression is the value
    ("\\boxed{-3}", "-3"),
    ("\\boxed{1+\\sqrt{2}}", "1 + \\sqrt{2}"),  # a gold that is an expression is compared as math-verify does
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\sqrt{3}/2"),  # one fraction bar is a value
    ("1/2", "0.5"),  # a single fraction p/q is a value
    ("-1/2", "-0.5"),
    ("\\boxed{16/18}", "\\frac{8}{9}"),  # not in lowest terms, but a value: math-verify's call, kept
    ("1/1 + 1/1 = 2/1\n\nThis", "2"),
])
def test_values_and_expression_golds_still_score_one(completion, answer):
    reward, info = score(completion, {"answer": answer})
    assert reward == 1.0 and "unevaluated" not in info


def test_nothing_to_parse():
    assert score("I do not know.", {"answer": "3"}) == (0.0, {"correct": False, "parsed": None})
    assert score("", {"answer": "3"})[1]["parsed"] is None


def test_boxed_wins_over_answer_tags_and_last_expression():
    # \boxed{} first, then <answer>, then the last expression (here "9")
    assert score("\\boxed{4} <answer>5</answer> 9", {"answer": "4"})[0] == 1.0
    assert score("<answer>5</answer> then 9", {"answer": "5"})[0] == 1.0
    assert score("4, no, 9", {"answer": "9"})[0] == 1.0


def test_pathological_answer_is_cut_off_not_hung():
    # 9^(9^(9^9)) cannot be compared in time: math-verify's 1 s alarm stops it and it scores 0.
    reward, info = score("\\boxed{9^{9^{9^{9}}}}", {"answer": "3"})
    assert reward == 0.0 and info["parsed"] == "9^{9^{9^{9}}}"


@pytest.mark.parametrize("completion", [
    "<think>2 + 1 = 3</think><answer>3</answer>",
    "  <think>\nstep\n</think>\n\n<answer>\n3\n</answer>\n",  # whitespace around and between blocks
])
def test_format_reward_positive(completion):
    assert format_score(completion, {}) == (1.0, {"format": True})


@pytest.mark.parametrize("completion", [
    "<answer>3</answer>",  # no think block
    "<think>a</think>",  # no answer block
    "<answer>3</answer><think>a</think>",  # wrong order
    "<think>a</think><answer>3</answer> and more",  # text after the answer
    "<think>a</think><answer>3</answer><answer>4</answer>",  # a second answer block
    "<think>a<think>b</think><answer>3</answer>",  # nested think
])
def test_format_reward_negative(completion):
    assert format_score(completion, {})[0] == 0.0


@pytest.mark.parametrize("completion, expected", [
    ("<think>1 + 2</think><answer>3</answer>", 1.2),  # 1.0 * 1 + 0.2 * 1
    ("so it is 3", 1.0),  # 1.0 * 1 + 0.2 * 0
    ("<think>1 + 2</think><answer>4</answer>", 0.2),  # 1.0 * 0 + 0.2 * 1
    ("so it is 4", 0.0),  # 1.0 * 0 + 0.2 * 0
])
def test_r1_stack(completion, expected):
    reward, info = r1_score(completion, {"answer": "3"})
    assert reward == pytest.approx(expected)
    assert info["accuracy"] + 0.2 * info["format"] == pytest.approx(expected)


def test_system_prompt_names_both_tags():
    assert "<think>" in R1_SYSTEM_PROMPT and "<answer>" in R1_SYSTEM_PROMPT


@pytest.mark.parametrize("gold, right, wrong", [
    ("\\$32,348", "\\boxed{32348}", "\\boxed{32349}"),  # MATH-500's dollar amounts: "\$" is a dollar sign
    ("\\$18.90", "The total is \\boxed{\\$18.90}.", "\\boxed{18.09}"),
    ("\\text{Evelyn}", "\\boxed{\\text{Evelyn}}", "\\boxed{\\text{Bob}}"),  # a word answer in \text{}
    ("\\text{(C)}", "\\boxed{(C)}", "\\boxed{(D)}"),
])
def test_math_500s_own_answers_parse_and_grade(gold, right, wrong):
    assert score(right, {"answer": gold})[0] == 1.0 and score(wrong, {"answer": gold})[0] == 0.0


def test_answers_no_completion_can_match_are_said_when_the_task_is_built(tmp_path, capsys):
    import json

    from rlpost import config
    from rlpost.envs import build_task

    data = tmp_path / "rows.jsonl"
    gsm = "48/2 = 24 in May.\nAltogether 48+24 = 72.\n#### 72"
    data.write_text("".join(json.dumps({"question": f"Q{i}", "answer": gsm, "x": "not maths at all"}) + "\n"
                            for i in range(12)))
    common = [f"task.data={data}", "task.prompt_column=question", "task.max_contamination=1"]
    build_task(config.load(None, ["task.name=math", *common]).task)  # GSM8K's '#### 72' parses: nothing said
    assert "can never score 1" not in capsys.readouterr().err
    build_task(config.load(None, ["task.name=dataset", *common]).task)
    assert "task.data: 1 of the first 1 answers (answer) can never score 1: they span several lines" in \
        capsys.readouterr().err
    build_task(config.load(None, ["task.name=math", *common, "task.answer_column=x"]).task)
    assert "answers (x) can never score 1: math-verify reads no answer in them" in capsys.readouterr().err
    # off the main thread (a notebook's worker thread) math-verify's signal-based timeout cannot run: no check there,
    # and the task is built as before
    import threading

    built = []
    thread = threading.Thread(target=lambda: built.append(build_task(config.load(None, ["task.name=math", *common,
                                                                                     "task.answer_column=x"]).task)))
    thread.start()
    thread.join()
    assert len(built) == 1 and "can never score 1" not in capsys.readouterr().err
