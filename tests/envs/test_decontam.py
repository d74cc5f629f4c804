"""Decontamination (envs/decontam.py): n-gram overlap of held-out prompts with training prompts, by hand."""

import json

import pytest

from rlpost import config
from rlpost.envs import build_task
from rlpost.envs.decontam import contamination, ngrams
from rlpost.types.errors import ConfigError


def row(text):
    return {"messages": [{"role": "user", "content": text}]}


def test_ngrams_by_hand():
    # 10 words -> 3 grams of 8; fewer than 8 words -> the prompt whole, as one gram; lower-cased
    assert len(ngrams("a b c d e f g h i j")) == 3 and ngrams("What is 2+2?") == {("what", "is", "2+2?")}


def test_contamination_by_hand():
    train = [row("the quick brown fox jumps over the lazy dog today")]
    held = [row("The quick brown fox jumps over the lazy dog today"),  # a copy: 3 of 3 grams in the training prompt
            row("the quick brown fox jumps over the lazy dog tomorrow"),  # last word changed: 2 of 3 grams
            row("an unrelated prompt about something else entirely here")]  # 0 of 3
    at_08 = contamination(train, held, threshold=0.8)
    assert (at_08["contamination_checked"], at_08["contamination_contaminated"]) == (3, 1)
    assert at_08["contamination_examples"] == ["The quick brown fox jumps over the lazy dog today"]
    assert contamination(train, held, threshold=0.5)["contamination_contaminated"] == 2  # 2/3 >= .5 too


def test_a_shared_template_is_not_contamination():
    # 12 held-out prompts share an 11-word template around their number: of their 4 grams the 3 that
    # hold only template words occur in all 12 (> 10%), so they are left out; the gram with the number
    # is each prompt's own. Only the prompt whose number the training prompt has (99) is contaminated;
    # without the template rule each prompt would have 3 of 4 grams in the training prompt.
    template = "answer with only the number please and thank you kindly: {}"
    train = [row(template.format(99))]
    held = [row(template.format(k)) for k in [*range(11), 99]]
    found = contamination(train, held, threshold=0.5)
    assert found["contamination_checked"] == 12 and found["contamination_contaminated"] == 1
    assert found["contamination_examples"] == [template.format(99)]


def test_training_refuses_a_contaminated_split_and_eval_reports_it(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"problem number {i} asks for the sum of {i} and {i + 1}",
                                        "answer": str(2 * i + 1)}) + "\n" for i in range(20)))
    same = [f"task.name=dataset", f"task.data={data}", f"task.eval_data={data}"]  # held-out = training rows
    with pytest.raises(ConfigError, match=r"task.max_contamination: 20 of 20 held-out prompts \(100.0%\)") as refused:
        build_task(config.load(None, same).task)
    # task.eval_data is set already: the hint is to remove the overlap, not to name a held-out file
    assert "Remove those prompts from task.data or task.eval_data" in str(refused.value)
    assert "Separate the splits" not in str(refused.value)
    assert build_task(config.load(None, [*same, "task.max_contamination=1"]).task).contamination is None  # unchecked
    reported = build_task(config.load(None, same).task, refuse_contaminated=False).contamination
    assert reported["contamination_contaminated_frac"] == 1.0
    # the default split of one file (a seeded shuffle) keeps them apart
    assert build_task(config.load(None, same[:2]).task).contamination["contamination_contaminated"] == 0
    # rlpost eval's numbers (recipes/evaluate.py: heldout_accuracy) carry the share, and evaluation runs
    from helpers import tiny_cfg

    from rlpost.recipes.evaluate import heldout_accuracy
    _, n, summary = heldout_accuracy(tiny_cfg(*same, "task.verifier=toy_verifiers:odd_length"), n=2)
    assert n == 2 and summary["contamination_contaminated_frac"] == 1.0 and summary["contamination_checked"] > 0
