"""verl's parquet rows train as they are: prompt as chat messages, data_source and extra_info kept,
the answer read from reward_model.ground_truth."""

import json

import datasets
import pytest
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
    task = build_task(cfg.task)
    row = next(r for r in task.train if r["extra_info"]["index"] == 5)
    assert row["messages"] == [{"role": "system", "content": "Be brief."},
                               {"role": "user", "content": "What is 5 + 1?"}]
    assert row["answer"] == "6" and row["data_source"] == "openai/gsm8k" and row["reward_model"]["ground_truth"] == "6"
    summary = train(cfg, tmp_path / "run")
    assert summary["steps"] == 2 and summary["heldout_n"] == 4
    # a dotted answer column reads any nested field
    nested = build_task(tiny_cfg("task.name=dataset", f"task.data={tmp_path / 'train.parquet'}",
                                 "task.answer_column=extra_info.index", "task.n_heldout=4").task)
    assert {r["answer"] for r in nested.train} <= {str(i) for i in range(40)}


def test_a_small_dataset_keeps_nine_tenths_for_training(tmp_path):
    # 200 held-out rows (the demo's) out of 60 would have taken half of them; at most a tenth is held out
    datasets.Dataset.from_list(verl_rows(60)).to_parquet(str(tmp_path / "train.parquet"))
    task = build_task(tiny_cfg("task.name=dataset", f"task.data={tmp_path / 'train.parquet'}",
                               "task.n_heldout=200").task)
    assert (len(task.train), len(task.heldout)) == (54, 6)


def test_verl_extras_and_data_sources_reach_metrics_and_samples(tmp_path):
    rows = verl_rows(40)
    for i, r in enumerate(rows):
        r["data_source"] = "openai/gsm8k" if i % 2 else "lighteval/MATH"
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "train.parquet"))
    cfg = tiny_cfg("task.name=dataset", f"task.data={tmp_path / 'train.parquet'}", "task.n_heldout=8",
                   "task.verifier=toy_verifiers:compute_score_extras")
    train(cfg, tmp_path / "run")
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    samples = [json.loads(x) for x in (tmp_path / "run" / "samples" / "step_000001.jsonl").read_text().splitlines()]
    # compute_score's extras: numbers and bools averaged (verl's reward_extra_info), every extra in the samples
    assert lines[0]["reward_extra/acc"] == pytest.approx(sum(s["info"]["acc"] for s in samples) / len(samples))
    assert lines[0]["reward_extra/length"] == pytest.approx(sum(len(s["completion"]) for s in samples) / len(samples))
    assert "reward_extra/pred" not in lines[0] and "pred" in samples[0]["info"]  # a string: no mean, still kept
    # per data_source, as verl's val-core/<data_source>/...: training reward and held-out accuracy
    assert {k for k in lines[0] if k.startswith("mix/share/")} <= {"mix/share/openai/gsm8k", "mix/share/lighteval/MATH"}
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    n = summary["heldout_n/openai/gsm8k"] + summary["heldout_n/lighteval/MATH"]
    assert n == 8 and "heldout_accuracy_after/openai/gsm8k" in summary


def test_a_list_of_right_answers_scores_any_of_them(tmp_path):
    """TriviaQA's aliases, verl's list ground truths: each counts; a list of non-answers is refused naming its row."""
    from rlpost.envs.dataset import exact_match
    from rlpost.envs.math import score
    from rlpost.types.errors import DataError

    data = tmp_path / "rows.jsonl"
    rows = [{"prompt": f"Name {i}", "answer": ["Paris", "paris, France"] if i % 2 else [1, 2.5]} for i in range(20)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = build_task(tiny_cfg("task.name=dataset", f"task.data={data}", "task.n_heldout=2").task)
    row = next(r for r in task.train if r["answer"][0] == "Paris")
    assert row["answer"] == ["Paris", "paris, France"]
    assert [exact_match(c, row)[0] for c in ("Paris", "It is\nparis, France.", "Lyon", "")] == [1.0, 1.0, 0.0, 0.0]
    numbers = next(r for r in task.train if r["answer"] == ["1", "2.5"])
    assert [exact_match(c, numbers)[0] for c in ("it is 2.5", "1", "3")] == [1.0, 1.0, 0.0]
    assert [score(c, {"answer": ["1/2", "3"]})[0] for c in ("\\boxed{0.5}", "\\boxed{3}", "\\boxed{4}")] == [1, 1, 0]
    for bad in ([], [{"a": 1}], [True]):
        data.write_text("".join(json.dumps({"prompt": "x", "answer": bad if i == 5 else "1"}) + "\n"
                                for i in range(20)))
        with pytest.raises(DataError, match=r"rows.jsonl:6: 'answer' is a list|rows.jsonl:6: missing 'answer'"):
            build_task(tiny_cfg("task.name=dataset", f"task.data={data}", "task.n_heldout=2").task)


def test_a_mapping_answer_is_refused_naming_the_dotted_column_unless_a_verifier_of_yours_reads_it(tmp_path):
    from rlpost.types.errors import DataError

    data = tmp_path / "trivia.jsonl"
    data.write_text("".join(json.dumps({"question": f"Q{i}", "answer": {"value": "Paris", "aliases": ["Paris"]}})
                            + "\n" for i in range(20)))
    common = ["task.name=dataset", f"task.data={data}", "task.n_heldout=2", "task.prompt_column=question"]
    with pytest.raises(DataError, match=r"trivia.jsonl:1: 'answer' is a mapping \(value, aliases\); .* "
                                        r"e.g. task.answer_column=answer.value$"):
        build_task(tiny_cfg(*common).task)
    assert build_task(tiny_cfg(*common, "task.answer_column=answer.aliases").task).train[0]["answer"] == ["Paris"]
    mine = build_task(tiny_cfg(*common, "task.verifier=toy_verifiers:half").task)
    assert mine.train[0]["answer"] == {"value": "Paris", "aliases": ["Paris"]}


@pytest.mark.parametrize("prompt, answer, expected", [
    ("What?", "   ", r"rows.jsonl:1: missing 'answer'"),
    ("What?", float("nan"), r"rows.jsonl:1: 'answer' is nan; expected an answer"),
    ([{"role": "user", "content": None}], "1", r"rows.jsonl:1: 'prompt'\[0\].content: expected text .*got null"),
    ([{"role": "human", "content": "hi"}], "1", r"'prompt'\[0\]: role 'human'; expected one of system, user, "
                                                r"assistant, tool \(ShareGPT's human and gpt are user and assistant\)"),
    ([{"from": "human", "value": "hi"}], "1", r"'prompt'\[0\]: a ShareGPT message"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], "1",
     r"'prompt': must end with a user message .* got 'assistant' last"),
])
def test_prompts_and_answers_no_run_can_use_are_named(tmp_path, prompt, answer, expected):
    from rlpost.types.errors import DataError

    data = tmp_path / "rows.jsonl"
    good = [json.dumps({"prompt": f"Q{i}", "answer": str(i)}) for i in range(20)]
    data.write_text("\n".join([json.dumps({"prompt": prompt, "answer": answer}), *good]) + "\n")
    with pytest.raises(DataError, match=expected):
        build_task(tiny_cfg("task.name=dataset", f"task.data={data}", "task.n_heldout=2").task)


def test_openai_content_parts_are_their_text(tmp_path):
    data = tmp_path / "rows.jsonl"
    parts = [{"type": "text", "text": "What is "}, {"type": "text", "text": "2 + 2?"}]
    data.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": parts}], "answer": "4", "i": i}) + "\n"
                            for i in range(20)))
    task = build_task(tiny_cfg("task.name=dataset", f"task.data={data}", "task.n_heldout=2").task)
    assert task.train[0]["messages"] == [{"role": "user", "content": "What is 2 + 2?"}]
