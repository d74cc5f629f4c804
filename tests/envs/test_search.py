"""The search environment: BM25 by hand, the corpus's questions need their page, and a turn's
search or answer as the environment sees it."""

import json
import math

import pytest

from rlpost.envs.search import BM25, Search, corpus, index, page


def test_bm25_scores_by_hand():
    bm = BM25(["a b", "a c c", "d"])
    # N = 3, lengths 2, 3, 1: avgdl = 2. "c" is in one page: idf = ln((3 - 1 + 0.5) / (1 + 0.5) + 1) = ln(8/3).
    # Page 1 has it twice in 3 words: 2 * 2.5 / (2 + 1.5 * (0.25 + 0.75 * 3 / 2)) = 5 / 4.0625.
    assert bm.scores("c") == pytest.approx({1: math.log(8 / 3) * 5 / 4.0625})
    # "a" is in two pages: idf = ln(1.5 / 2.5 + 1) = ln(1.6); page 0 is shorter than average, so it scores more
    got = bm.scores("A!")
    assert got[0] == pytest.approx(math.log(1.6) * 2.5 / (1 + 1.5 * (0.25 + 0.75)))
    assert got[0] > got[1] and 2 not in got
    assert bm.top("c a", k=2) == ["a c c", "a b"] and bm.top("zzz") == []


def test_a_question_needs_its_page_and_search_finds_it():
    towns = corpus(0, 2000)
    assert len({t["town"] for t in towns}) == 2000 and corpus(0, 2000) == towns
    env = Search()
    train, held = env.rows("train", 50, 1), env.rows("heldout", 50, 1)
    trained_towns = {t["town"] for t in towns[:1000]}
    assert all(any(t in r["question"] for t in trained_towns) for r in train)
    assert not any(r["town"] in trained_towns for r in held) and all(r["town"] in r["question"] for r in held)
    # the town's name alone finds its page, for every question
    assert all(row["answer"] in index(0, 2000).top(row["town"])[0] for row in held)


def test_a_turn_is_a_search_or_an_answer():
    env = Search()
    row = env.rows("heldout", 1, 3)[0]
    town = row["town"]
    opening = env.reset(row)
    assert opening[-1]["content"] == row["question"]
    assert opening[2]["content"].startswith("search: ")  # the worked example
    assert [m["role"] for m in Search(example=False).reset(row)] == ["system", "user"]
    messages, reward, done, info = env.step({"role": "assistant", "content": f"search: {town}"})
    assert not done and reward == 0 and info["tool_calls"] == 1 and row["answer"] in messages[0]["content"]
    assert messages[0]["role"] == "tool"
    call = {"id": "call_0", "type": "function",
            "function": {"name": "search", "arguments": json.dumps({"query": town})}}
    # the tool, called as such
    assert env.step({"role": "assistant", "content": "", "tool_calls": [call]})[0] == messages
    assert env.step({"role": "assistant", "content": f"It is {row['answer']}."})[1:3] == (1.0, True)
    assert env.step({"role": "assistant", "content": "I do not know."})[1:3] == (0.0, True)
    assert page(corpus(0, 1)[0]).count(".") == 4
