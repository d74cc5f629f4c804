"""rlpost prm and rlpost search (recipes/search_args.py, recipes/test_time.py, envs/step_data.py): the
step-labelled format by hand and against hostile rows, the selectors' summary by hand, and each
command end to end on the tiny model, with the equal-budget invariants of the N-sample selectors."""

import json
import math
from types import SimpleNamespace

import pytest
import torch
from helpers import TINY_EVAL, cli, tiny_cfg

from rlpost.envs import step_data
from rlpost.recipes import test_time
from rlpost.recipes.search import SearchResult
from rlpost.recipes.test_time import data_examples, summarise
from rlpost.rewards.prm import agg_last, agg_min
from rlpost.types.batch import Rollouts
from rlpost.types.errors import DataError

EVAL = [o for o in TINY_EVAL if not o.startswith(("task.n_train", "task.n_heldout"))]
ROWS = [{"prompt": "add", "steps": ["ab", "cd"], "labels": [1, 0.25]},
        {"prompt": [{"role": "user", "content": "sub"}], "steps": ["xy"], "labels": [False]}]


def write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_step_rows_to_examples_by_hand(tmp_path, tiny):
    rows = step_data.read(str(write(tmp_path / "s.jsonl", ROWS)))
    assert [(r.steps, r.labels, r.where) for r in rows] == [(["ab", "cd"], [1.0, 0.25], f"{tmp_path}/s.jsonl:1"),
                                                           (["xy"], [0.0], f"{tmp_path}/s.jsonl:2")]
    tok = tiny.tokenizer  # one token a character: "ab\ncd" + EOS = a b \n c d </s>, steps end at 2 and 5
    (first, second) = data_examples(rows, tok, outcome=False)
    assert len(first.completion_ids) == 6 and first.completion_ids[-1] == tok.eos_token_id
    assert (first.positions, first.targets) == ([2, 5], [1.0, 0.25])
    assert (second.positions, second.targets) == ([2], [0.0])  # x y </s>: one step, to the final token
    text = tok.apply_chat_template([{"role": "user", "content": "add"}], add_generation_prompt=True, tokenize=False)
    assert first.prompt_ids == tok(text, add_special_tokens=False).input_ids  # as the sampler renders a prompt
    outcome = data_examples(rows, tok, outcome=True)  # an ORM: the last label, at the final token only
    assert [(e.positions, e.targets) for e in outcome] == [([5], [0.25]), ([2], [0.0])]


@pytest.mark.parametrize("row, said", [
    ({"prompt": "p", "steps": ["a\nb"], "labels": [1]}, "steps[0] is more than one line"),
    ({"prompt": "p", "steps": ["a", "  "], "labels": [1, 1]}, "steps[1] is blank"),
    ({"prompt": "p", "steps": [], "labels": []}, "'steps' must be a non-empty list"),
    ({"prompt": "p", "steps": "a", "labels": [1]}, "'steps' must be a non-empty list"),
    ({"prompt": "p", "steps": ["a", "b"], "labels": [1]}, "'labels' must be a list of one label a step (2)"),
    ({"prompt": "p", "steps": ["a"], "labels": [1.5]}, "labels[0] must be a number in [0, 1]"),
    ({"prompt": "p", "steps": ["a"], "labels": ["1"]}, "labels[0] must be a number in [0, 1]"),
    ({"prompt": 3, "steps": ["a"], "labels": [1]}, "'prompt' must be a string or a list of chat messages"),
    ('{"prompt": "p", "steps": ["a"], "labels": [NaN]}', "labels[0] must be a number in [0, 1]"),
])
def test_bad_step_rows_are_one_line_naming_file_line_and_field(tmp_path, row, said):
    path = write(tmp_path / "s.jsonl", [ROWS[0], row])
    with pytest.raises(DataError) as e:
        step_data.read(str(path))
    assert str(e.value).startswith(f"{path}:2: ") and said in str(e.value) and "\n" not in str(e.value)


def test_summary_by_hand():
    # 4 problems. majority right on 0, 1; best-of-N right on 0, 2, 3: +1 problem, paired differences
    # d = (0, -1, +1, +1), mean 0.25, sd^2 = ((-.25)^2 + (-1.25)^2 + 2 (.75)^2) / 3 = 2.75 / 3, s.e. = sqrt(2.75/12)
    found = {"majority": SearchResult([], [10, 12, 8, 10], [4] * 4, []),
             "prm-best": SearchResult([], [10, 12, 8, 10], [4] * 4, [])}
    table = summarise(found, {"majority": [True, True, False, False], "prm-best": [1, 0, 1, 1]})
    best = table["prm-best"]
    assert (best["accuracy"], best["tokens"], best["samples"]) == (0.75, 10.0, 4.0)
    assert best["se"] == pytest.approx(math.sqrt(0.75 * 0.25 / 4))
    assert best["delta_vs_majority"] == 0.25 and best["delta_se"] == pytest.approx(math.sqrt(2.75 / 12))
    assert table["majority"]["delta_vs_majority"] == 0 and table["majority"]["delta_se"] == 0
    assert "delta_vs_majority" not in summarise({"greedy": found["majority"]}, {"greedy": [1, 0, 0, 0]})["greedy"]


# Two problems, N = 3 samples each, scripted: (text, tokens) of each sample, the right answer, and the scorers' scores.
SAMPLES = [[("7", 1), ("7", 2), ("9", 3)], [("4", 1), ("5", 1), ("5", 1)]]
ANSWERS = ["9", "4"]
SCORES = {"prm": {agg_min: [0.2, 0.3, 0.9, 0.8, 0.1, 0.3], agg_last: [0.9, 0.1, 0.1, 0.1, 0.1, 0.9]},
          "orm": {agg_last: [0.5, 0.6, 0.1, 0.1, 0.2, 0.9]}}


class Scripted:
    """The roles search reads: a sampler drawing SAMPLES, a verifier (right = the answer, its pred = the text)."""

    def __init__(self):
        self.rollout, self.grader, self.model = self, self, None

    def generate(self, rows, n, temperature, top_p, max_new_tokens):
        picked = [SAMPLES[r["i"]] for r in rows]
        ids = [[5] * k + [0] * (3 - k) for samples in picked for _, k in samples]  # k tokens, then padding
        cids = torch.tensor(ids)
        return Rollouts(prompt_ids=torch.ones(len(ids), 1, dtype=torch.long), prompt_mask=torch.ones(len(ids), 1) > 0,
                        completion_ids=cids, completion_mask=cids != 0, sampler_logp=torch.zeros(cids.shape),
                        truncated=torch.zeros(len(ids)) > 0, group_ids=torch.arange(len(ids)) // n,
                        rows=[r for r in rows for _ in range(n)], completions=[t for s in picked for t, _ in s])

    def score(self, batch):
        right = [c == ANSWERS[r["i"]] for c, r in zip(batch.completions, batch.rows)]
        return torch.tensor(right, dtype=torch.float32), [{"correct": x, "pred": c} for x, c in
                                                          zip(right, batch.completions)], {}


def test_the_selectors_at_one_budget_by_hand(monkeypatch):
    # majority: problem 0 votes 7 (2 of 3, wrong), problem 1 votes 5 (wrong): 0. oracle: a right sample in both: 1.
    # prm-best (min): 0.9 -> "9" and 0.8 -> "4", both right: 1, +1 against majority on each problem (s.e. 0).
    # prm-last: 0.9 -> "7" and 0.9 -> "5": 0. orm-best: 0.6 -> "7" and 0.9 -> "5": 0.
    # prm-weighted (min): problem 0 "7" 0.5 vs "9" 0.9, problem 1 "4" 0.8 vs "5" 0.4: both right, 1.
    # tokens: problem 0's samples 1 + 2 + 3 = 6, problem 1's 3: 4.5 a problem for every N-sample method; samples 3
    fake = lambda path, cfg, near: SimpleNamespace(  # noqa: E731
        score_rollouts=lambda batch, agg: SCORES[path][agg]) if path else None
    monkeypatch.setattr(test_time, "load_scorer", fake)
    args = SimpleNamespace(n=3, prm="prm", orm="orm", aggregate="min")
    chosen = ["majority", "orm-best", "prm-best", "prm-last", "prm-weighted"]
    table = test_time.methods_table(Scripted(), [{"i": 0}, {"i": 1}], tiny_cfg(), chosen, args)
    got = {m: (t["accuracy"], t["correct"], t["tokens"], t["samples"]) for m, t in table.items()}
    assert got == {"majority": (0.0, [0.0, 0.0], 4.5, 3.0), "orm-best": (0.0, [0.0, 0.0], 4.5, 3.0),
                   "prm-best": (1.0, [1.0, 1.0], 4.5, 3.0), "prm-last": (0.0, [0.0, 0.0], 4.5, 3.0),
                   "prm-weighted": (1.0, [1.0, 1.0], 4.5, 3.0), "oracle": (1.0, [1.0, 1.0], 4.5, 3.0)}
    assert (table["prm-best"]["delta_vs_majority"], table["prm-best"]["delta_se"]) == (1.0, 0.0)


@pytest.mark.slow
def test_prm_then_search_end_to_end_on_the_tiny_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "s.jsonl", ROWS)
    common = [*EVAL, "task.n_train=8", "task.n_heldout=4", "--model", "tiny"]
    r = cli("prm", "s.jsonl", "--out", "from_data", *common, "--epochs", "2", "--batch-size", "2")
    assert r.returncode == 0, r.stderr[-2000:]
    info = json.loads((tmp_path / "from_data" / "prm.json").read_text())
    assert (info["kind"], info["solutions"], info["labels"], info["optimizer_steps"]) == ("process", 2, 3, 2)
    odd = ["task.verifier=toy_verifiers:odd_length"]  # right or wrong by the completion's length: varies by sample
    r = cli("prm", "--out", "orm", "--outcome", *common, *odd, "--problems", "2", "--n", "2", "--m", "2")
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert (summary["kind"], summary["data"], summary["solutions"]) == ("outcome", "monte-carlo", 4)
    r = cli("search", *common, *odd, "--prm", "from_data", "--orm", "orm", "--n", "4", "--out", "s.json")
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result == json.loads((tmp_path / "s.json").read_text()) and result["out"] == "s.json"
    table = result["methods"]
    assert list(table) == ["greedy", "majority", "orm-best", "prm-best", "prm-last", "prm-weighted", "beam", "oracle"]
    pick = ["majority", "orm-best", "prm-best", "prm-last", "prm-weighted"]
    # equal budget: every N-sample selector chose from the same 4 samples a problem, so the same tokens, and none is
    # right where no sample was (the oracle: any of the 4 right)
    assert len({table[m]["tokens"] for m in [*pick, "oracle"]}) == 1 and all(table[m]["samples"] == 4 for m in pick)
    for m in pick:
        assert all(c <= o for c, o in zip(table[m]["correct"], table["oracle"]["correct"])), m
    assert table["greedy"]["samples"] == 1 and table["beam"]["samples"] <= 4 * 4  # 4 proposals a round, 4 rounds


@pytest.mark.parametrize("args, said", [
    (["search", "--methods", "majority,best"], "--methods: unknown method 'best'"),
    (["search", "--methods", "beam"], "--methods: beam needs --prm DIR"),
    (["search", "--methods", "orm-best"], "--methods: orm-best needs --orm DIR"),
    (["search", "--n", "0"], "--n: expected a whole number >= 1"),
    (["search", "--prm", "."], "--prm .: not a scorer folder"),
    (["search", "--prm", ".", "--n", "3"], "--beam-width 2: must divide --n 3"),
    (["prm", "missing.jsonl", "--out", "o"], "DATA missing.jsonl: file not found"),
    (["prm", "a.jsonl", "b.jsonl", "--out", "o"], "one DATA file at most"),
    (["prm", "--out", "o", "--m", "0"], "--m: expected a whole number >= 1"),
    (["prm", "--out", "o", "trainer.lr=1"], "trainer.lr: rlpost prm would ignore it (the scorer trains in one "
                                             "process with its own options: --lr"),
    (["search", "algo.name=ppo"], "algo.name: rlpost search would ignore it"),
    (["prm", "--out", "full", "--model", "tiny"], "--out: full holds files rlpost did not write"),
    (["prm", "bad.jsonl", "--out", "o", "--model", "tiny", "rollout.dtype=float32"], "bad.jsonl:1: labels[0]"),
    (["search", "--out", "bad.jsonl", "--model", "tiny"], "--out: bad.jsonl exists and is not the results"),
    (["search", "--out", "nowhere/s.json", "--model", "tiny"], "--out nowhere/s.json: nowhere does not exist"),
    (["prm", "--out", "o", "--lr", "inf"], "--lr: expected a learning rate with 0 < lr <= 1, got inf"),
    (["prm", "--out", "o", "--head-lr", "2"], "--head-lr: expected a learning rate with 0 < lr <= 1, got 2.0"),
    (["search", "--prm", "orm", "--model", "tiny"], "--prm orm: an outcome reward model (prm.json: kind), which --orm "
                                                    "takes; --prm takes a process one"),
    (["prm", "--out", "orm", "--model", "tiny"], "--out orm: holds a scorer rlpost prm trained (prm.json)"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, args, said):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    write(tmp_path / "bad.jsonl", [{"prompt": "p", "steps": ["a"], "labels": [2]}])
    scorer = tmp_path / "orm"  # what rlpost prm --outcome leaves, as far as the checks read it
    scorer.mkdir()
    (scorer / "prm.json").write_text(json.dumps({"kind": "outcome"}))
    (scorer / "value_head.safetensors").write_text("")
    (scorer / ".rlpost").write_text(json.dumps({"kind": "prm"}))
    r = cli(*args)
    assert r.returncode == 2 and said in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("losses, weight, said", [
    ([0.69, float("nan")], 0.0, "its loss was nan at optimizer step 2"),
    ([0.69, 0.5], float("inf"), "its weights are not finite"),
])
def test_a_scorer_that_diverged_is_one_line_and_nothing_is_written(tmp_path, monkeypatch, losses, weight, said):
    # what `--lr 1` can do: the loss or a weight not finite. A NaN scorer would then pass for a trained one
    head = torch.nn.Linear(2, 1)
    torch.nn.init.constant_(head.weight, weight)
    fake = SimpleNamespace(lm=torch.nn.Linear(2, 2), head=head, save=lambda out: pytest.fail("saved"))
    monkeypatch.setattr(test_time, "train_prm", lambda *a, **k: (fake, [{"prm/bce": x} for x in losses]))
    monkeypatch.setattr(test_time, "load_policy_for", lambda *a: SimpleNamespace(model=None))
    write(tmp_path / "s.jsonl", ROWS)
    args = SimpleNamespace(outcome=False, epochs=1, batch_size=2, lr=1.0, head_lr=1.0)
    with pytest.raises(test_time.RunError) as e:
        test_time.train_scorer(tiny_cfg(), str(tmp_path / "s.jsonl"), tmp_path / "out", args)
    assert said in str(e.value) and "nothing written" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "out" / "prm.json").exists()
