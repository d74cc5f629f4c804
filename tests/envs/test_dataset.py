"""verl's parquet rows train as they are: prompt as chat messages, data_source and extra_info kept,
the answer read from reward_model.ground_truth."""

import datasets
from helpers import tiny_cfg

from rlpost.envs import build_task
from rlpost.recipes.rl import train


def verl_rows(n: int) -> list[dict]:
    # the layout of verl's examples/data_preprocess/gsm8k.py
    return [{"data_source": "openai/gsm8k", "ability": "math",
             "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"What is {i} + 1?"}],
             "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
             "extra_info": {"split": "train", "index": i}} for i in range(n)]


def test_verl_parquet_rows_load_and_train(tmp_path):
    datasets.Dataset.from_list(verl_rows(40)).to_parquet(str(tmp_path / "train.parquet"))  # a tenth held out: 4
    cfg = tiny_cfg("task.name=dataset", f"task.data={tmp_path / 'train.parquet'}", "task.n_heldout=4")
    task = build_task(cfg)
    row = next(r for r in task.train if r["extra_info"]["index"] == 5)
    assert row["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 5 + 1?"}]
    assert row["answer"] == "6" and row["data_source"] == "openai/gsm8k" and row["reward_model"]["ground_truth"] == "6"
    summary = train(cfg, tmp_path / "run")
    assert summary["steps"] == 2 and summary["heldout_n"] == 4
    # a dotted answer column reads any nested field
    nested = build_task(tiny_cfg("task.name=dataset", f"task.data={tmp_path / 'train.parquet'}",
                                 "task.answer_column=extra_info.index", "task.n_heldout=4"))
    assert {r["answer"] for r in nested.train} <= {str(i) for i in range(40)}


def test_a_small_dataset_keeps_nine_tenths_for_training(tmp_path):
    # 200 held-out rows (the demo's) out of 60 would have taken half of them; at most a tenth is held out
    datasets.Dataset.from_list(verl_rows(60)).to_parquet(str(tmp_path / "train.parquet"))
    task = build_task(tiny_cfg("task.name=dataset", f"task.data={tmp_path / 'train.parquet'}", "task.n_heldout=200"))
    assert (len(task.train), len(task.heldout)) == (54, 6)
