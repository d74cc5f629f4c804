import pytest

from rlpost import config
from rlpost.envs.arithmetic import evaluate, build_splits, numbered_steps, score, score_steps, score_worked


def test_score_last_integer():
    row = {"answer": "19"}
    assert score("12 + 7 = 19", row) == (1.0, {"correct": True, "parsed": True, "pred": "19"})
    assert score("19, no wait, 20", row)[0] == 0.0
    assert score("The answer is nineteen.", row) == (0.0, {"correct": False, "parsed": False, "pred": None})
    assert score("1,019", {"answer": "1019"})[0] == 1.0


def test_score_steps_pays_for_the_whole_chain_of_running_totals():
    row = {"expr": "3 + 8 + 7", "answer": "18"}
    info = lambda steps, whole, wrong: {"steps": steps, "whole_chain": whole, "wrong_equations": wrong}
    assert score_steps("3 + 8 = 11\n11 + 7 = 18\nAnswer: 18", row) == (1.0, info(2, True, 0))
    assert score_steps("3 + 8 = 11\n11 + 7 = 18\nAnswer: 19", row)[0] == 1.0  # the working only: score() has the answer
    assert score_steps("First, 3 + 8 = 11. Answer: 11", row) == (0.0, info(1, False, 0))  # half
    assert score_steps("11 + 7 = 18, since 3 + 8 = 11", row)[0] == 0.0  # out of order
    assert score_steps("Answer: 18", row) == (0.0, info(0, False, 0))  # a bare guess earns nothing
    # a guessed total first ('8 + 7 = 21' is inside it) halves a whole chain
    assert score_steps("3 + 8 + 7 = 21\n3 + 8 = 11\n11 + 7 = 18", row) == (0.5, info(2, True, 1))
    assert score_steps("3 + 8 = 12\n12 + 7 = 19", row)[0] == 0.0
    assert score_steps("10 - 4 = 6\n6 + 1,000 = 1,006", {"expr": "10 - 4 + 1000"})[0] == 1.0
    assert score_steps("2 + 12 = 14", {"expr": "2 + 3 * 4"}) == (0.0, info(0, False, 0))  # '*': no left-to-right chain


def test_score_worked_pays_the_answer_only_after_the_chain():
    row = {"expr": "3 + 8 + 7", "answer": "18"}
    assert score_worked("3 + 8 = 11\n11 + 7 = 18\nAnswer: 18", row)[0] == 2.0
    assert score_worked("3 + 8 = 11\n11 + 7 = 18\nAnswer: 17", row)[0] == 1.0
    assert score_worked("3 + 8 + 7 = 21\n3 + 8 = 11\n11 + 7 = 18. Answer: 18", row)[0] == 1.0  # a wrong guess first
    assert score_worked("3 + 8 + 7 = Answer: 18", row) == (0.0, {"steps": 0, "whole_chain": False, "wrong_equations": 0,
                                                               "correct": True, "parsed": True,
                                                               "pred": "18"})  # a right guess: nothing


def test_precedence_without_eval():
    assert evaluate("2 + 3 * 4") == 14 and evaluate("10 - 2 - 3") == 5 and evaluate("7") == 7


def test_splits_are_fixed_disjoint_and_sized():
    tcfg = config.load(None, ["task.ops=+", "task.min_a=10", "task.max_a=99", "task.min_b=1", "task.max_b=9",
                           "task.n_train=300", "task.n_heldout=50"]).task
    train, heldout = build_splits(tcfg)
    again = build_splits(tcfg)[1]
    assert heldout == again  # the held-out split is fixed by the seed
    assert len(train) == 300 and len(heldout) == 50
    assert not {r["expr"] for r in train} & {r["expr"] for r in heldout}
    for r in heldout[:20]:
        a, b = r["expr"].split(" + ")
        assert int(a) + int(b) == int(r["answer"]) and 10 <= int(a) <= 99 and 1 <= int(b) <= 9
        assert r["messages"][-1]["content"] == f"What is {r['expr']}? Reply with only the number."


def test_subtraction_stays_non_negative():
    tcfg = config.load(None, ["task.ops=-", "task.min_a=0", "task.max_a=9", "task.min_b=0", "task.max_b=9"]).task
    train, heldout = build_splits(tcfg)
    assert all(int(r["answer"]) >= 0 for r in train + heldout)


def test_min_terms_mixes_chain_lengths_in_training_and_holds_out_the_longest():
    tcfg = config.load(None, ["task.ops=+-", "task.n_terms=6", "task.min_terms=3", "task.n_train=2000",
                           "task.n_heldout=100"]).task
    train, heldout = build_splits(tcfg)
    operands = lambda r: len(r["expr"].split()) // 2 + 1
    assert {operands(r) for r in heldout} == {6}  # held-out accuracy is the longest chain's
    counts = [sum(operands(r) == n for r in train) for n in range(3, 7)]
    assert sum(counts) == 2000 and counts == sorted(counts, reverse=True) and counts[-1] > 200  # 1 : 1/2 : 1/3 : 1/4
    assert not {r["expr"] for r in train} & {r["expr"] for r in heldout}
    assert all(evaluate(r["expr"]) == int(r["answer"]) >= 0 for r in train + heldout)
    off = build_splits(config.load(None, ["task.n_terms=4", "task.n_train=50"]).task)[0]
    assert {operands(r) for r in off} == {4}  # 0 (the default): every problem has task.n_terms


def test_min_terms_outside_two_to_n_terms_is_one_clear_error():
    for bad in ("task.min_terms=1", "task.min_terms=5"):
        with pytest.raises(config.ConfigError,
                           match=r"task\.min_terms: expected 0 \(off\) or 2 to task\.n_terms \(4\)"):
            config.load(None, ["task.n_terms=4", bad])


def test_steps_placeholder_lists_each_operation_on_its_numbered_line():
    assert numbered_steps("4 + 7 - 2") == "Start with 4.\nStep 1: + 7\nStep 2: - 2"
    assert numbered_steps("5") == "Start with 5."
    tcfg = config.load(None, ["task.ops=+-", "task.n_terms=4", "task.n_heldout=5", "task.n_train=5",
                           "task.prompt=Add these up.\n{steps}"]).task
    train, heldout = build_splits(tcfg)
    for row in train + heldout:
        text = row["messages"][-1]["content"]
        lines = text.split("\n")[1:]
        assert text.startswith("Add these up.\nStart with ") and len(lines) == 4 and lines[-1].startswith("Step 3: ")
        assert " ".join([lines[0][len("Start with "):-1]] + [ln.split(": ", 1)[1] for ln in lines[1:]]) == row["expr"]


def test_steps_placeholder_with_multiplication_or_no_placeholder_is_one_clear_error():
    with pytest.raises(config.ConfigError, match=r"task\.prompt: \{steps\} lists the operations left to right"):
        config.load(None, ["task.ops=+*", "task.prompt={steps}"])
    with pytest.raises(config.ConfigError,
                       match=r"task\.prompt: expected a template containing \{expr\} or \{steps\}"):
        config.load(None, ["task.prompt=What is it?"])
