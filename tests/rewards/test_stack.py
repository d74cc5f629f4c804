"""Reward stacks, TRL-style reward functions, length shaping, and tasks from data files."""

import json
import math

import pytest
import torch

from rlpost import build, config
from rlpost.envs import build_task, dataset
from rlpost.envs.data import DataError
from rlpost.rewards import stack
from rlpost.rewards.runner import VerifierRunner


class FakeBatch:
    def __init__(self, completions, rows):
        self.completions, self.rows = completions, rows

    def __len__(self):
        return len(self.completions)


def test_trl_style_reward_function_gets_prompts_completions_and_columns():
    r = VerifierRunner("toy_verifiers:trl_style", timeout_s=5)
    rows = [{"prompt": "What is 1+1?", "messages": [], "answer": "2"},
            {"prompt": [{"role": "user", "content": "What is 1+1?"}], "messages": [], "answer": "2"},
            {"prompt": "q", "messages": [], "answer": "2"},
            {"prompt": "q", "messages": [], "answer": "2"}]
    rewards, _, m = r.score(FakeBatch(["2", "2", "3", "skip"], rows))
    assert rewards[:3].tolist() == [1.0, 1.5, 0.0]  # chat prompt -> completions as messages (+0.5)
    assert math.isnan(rewards[3]) and m["verifier/errors"] == 0  # None = does not apply
    r.close()


def test_stack_is_the_weighted_sum_and_logs_each_part():
    parts = [("trl_style", VerifierRunner("toy_verifiers:trl_style", 5), 1.0),
             ("half", VerifierRunner("toy_verifiers:half", 5), 0.2)]
    s = stack.RewardStack(parts)
    rows = [{"prompt": "q", "answer": "2"}] * 3
    total, infos, m = s.score(FakeBatch(["2", "3", "skip"], rows))
    assert torch.allclose(total, torch.tensor([1.0 + 0.1, 0.0 + 0.1, 0.0 + 0.1]))  # NaN part left out of the sum
    assert m["reward/trl_style"] == pytest.approx(0.5) and m["reward/half"] == pytest.approx(0.5)
    assert infos[0]["parts"] == {"trl_style": 1.0, "half": 0.5} and infos[0]["half"] is True
    s.close()


def test_build_reward_from_config():
    cfg = config.load(None,
                      ["task.reward_funcs=toy_verifiers:trl_style,toy_verifiers:half", "task.reward_weights=1,0.2"])
    verifier = VerifierRunner("rlpost.envs.arithmetic:score", 5)
    built = build.build_reward(cfg, verifier)
    assert [(n, w) for n, _, w in built.parts] == [("trl_style", 1.0), ("half", 0.2)]
    built.close()
    assert build.build_reward(config.load(None, []), verifier) is verifier
    verifier.close()
    with pytest.raises(config.ConfigError, match="task.reward_weights"):
        config.load(None, ["task.reward_funcs=a:b", "task.reward_weights=1,2"])
    with pytest.raises(config.ConfigError, match="task.reward_weights: weighs task.reward_funcs, which is empty"):
        config.load(None, ["task.reward_weights=1,2"])
    # each function's reward, calls and failures go by its name: two of one name would share them (one failing on
    # every completion would read as half)
    with pytest.raises(config.ConfigError,
                       match="task.reward_funcs: rw:raises and rw_c:raises share the name 'raises'"):
        config.load(None, ["task.reward_funcs=rw:raises,rw_c:raises"])


def cfg_with(**task):
    return config.load(None, [f"task.{k}={v}" for k, v in task.items()]
                       + ["rollout.max_new_tokens=10", "rollout.group_size=4"])


def test_linear_length_penalty_by_hand():
    cfg = cfg_with(length_penalty="linear", length_coef=0.5, length_target=6)
    out = stack.length_shaping(torch.tensor([4, 6, 8, 10]), torch.ones(4, dtype=torch.bool), 4, cfg.task, 10)
    # 0 up to the target, then -0.5 * (L - 6) / (10 - 6)
    assert torch.allclose(out, torch.tensor([0.0, 0.0, -0.25, -0.5]))


def test_ratio_length_reward_by_hand():
    cfg = cfg_with(length_penalty="ratio", length_coef=1.0)
    lengths = torch.tensor([2, 4, 6, 10, 5, 5, 5, 5])
    correct = torch.tensor([True, False, True, False, True, True, False, False])
    out = stack.length_shaping(lengths, correct, 4, cfg.task, 10)
    # group 1: lam = 0.5 - (L - 2) / 8 = [0.5, 0.25, 0, -0.5]; wrong answers keep only min(0, lam)
    # group 2: all lengths equal -> 0
    assert torch.allclose(out, torch.tensor([0.5, 0.0, 0.0, -0.5, 0, 0, 0, 0]))


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def test_dataset_task_rows_from_jsonl(tmp_path):
    rows = [{"question": f"What is {i}+1?", "solution": i + 1, "level": i % 3} for i in range(20)]
    rows[3] = {"question": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 3+1?"}],
               "solution": 4}
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    cfg = config.load(None, ["task.name=dataset", f"task.data={path}", "task.prompt_column=question",
                             "task.answer_column=solution", "task.n_heldout=5"])
    task = build_task(cfg.task)
    assert len(task.heldout) == 5 and len(task.train) == 15 and task.verifier == "rlpost.envs.dataset:exact_match"
    assert {r["_line"] for r in task.train}.isdisjoint({r["_line"] for r in task.heldout})
    chat = [r for r in task.train + task.heldout if r["_line"] == 4][0]
    assert chat["messages"][0] == {"role": "system", "content": "Be brief."} and chat["answer"] == "4"
    plain = [r for r in task.train + task.heldout if r["_line"] == 1][0]
    assert plain["messages"] == [{"role": "user", "content": "What is 0+1?"}] and plain["level"] == 0


def test_bad_rows_are_named_by_line_and_refused_or_skipped(tmp_path):
    rows = [{"prompt": "q1", "answer": "1"}, {"prompt": "", "answer": "1"}, {"prompt": "q3"}, "not json",
            *[{"prompt": f"p{i}", "answer": "1"} for i in range(10)]]  # not q1 again: a duplicate is contamination
    path = write_jsonl(tmp_path / "d.jsonl", rows[:3] + rows[4:])
    with pytest.raises(DataError, match=r"d.jsonl:2: 'prompt' must be a non-empty string"):
        build_task(config.load(None, ["task.name=dataset", f"task.data={path}"]).task)
    task = build_task(config.load(None, ["task.name=dataset", f"task.data={path}", "task.on_bad_row=skip",
                                         "task.n_heldout=2"]).task)
    assert task.skipped_rows == 2 and len(task.train) + len(task.heldout) == 11
    no_answer = write_jsonl(tmp_path / "f.jsonl", [rows[0], rows[2]])
    with pytest.raises(DataError, match=r"f.jsonl:2: missing 'answer' \(task.answer_column"):
        build_task(config.load(None, ["task.name=dataset", f"task.data={no_answer}"]).task)
    bad_json = write_jsonl(tmp_path / "e.jsonl", rows)
    with pytest.raises(DataError, match=r"e.jsonl:4: not valid JSON"):
        build_task(config.load(None, ["task.name=dataset", f"task.data={bad_json}"]).task)


def test_exact_match():
    assert dataset.exact_match("so it is 1,234.", {"answer": "1234"})[0] == 1.0
    assert dataset.exact_match("Paris", {"answer": "paris"})[0] == 1.0
    assert dataset.exact_match("I think\nLyon", {"answer": "Paris"})[0] == 0.0


@pytest.mark.parametrize("name", ["math", "code", "tools", "gym"])
def test_every_family_builds_disjoint_splits(name):
    task = build_task(config.load(None, [f"task.name={name}", "task.n_train=20", "task.n_heldout=5"]).task)
    assert len(task.train) == 20 and len(task.heldout) == 5
    key = lambda r: json.dumps(r["messages"])
    assert not {key(r) for r in task.train} & {key(r) for r in task.heldout}


def test_gym_config_errors_name_the_field():
    with pytest.raises(config.ConfigError, match="task.gym_name"):
        build_task(config.load(None, ["task.name=gym", "task.gym_name=no_such_dataset"]).task)
    with pytest.raises(config.ConfigError, match="task.gym_config"):
        build_task(config.load(None, ["task.name=gym", "task.gym_config={no_such_key: 1}"]).task)
    with pytest.raises(config.ConfigError, match="task.gym_config"):
        config.load(None, ["task.gym_config=[1, 2]"])


def test_slow_importing_verifier_is_not_a_timeout():
    r = VerifierRunner("toy_slow_import:score", timeout_s=0.5)
    rewards, _, m = r.score(FakeBatch(["a", "b"], [{}, {}]))
    assert rewards.tolist() == [1.0, 1.0] and m["verifier/timeouts"] == 0
    r.close()


def test_exact_match_normalises_as_squad_and_triviaqa_do():
    row = {"answer": ["David Seville", "The Beatles"]}
    for said in ("David Seville!", '"david seville"', "**David Seville**", "Beatles.", "the  beatles"):
        assert dataset.exact_match(said, row)[0] == 1.0, said
    for said in ("The answer is David Seville.", "Seville", "Beatle"):
        assert dataset.exact_match(said, row)[0] == 0.0, said
    assert dataset.exact_match("?", {"answer": "?"})[0] == 1.0 and dataset.exact_match("!", {"answer": "?"})[0] == 0.0
