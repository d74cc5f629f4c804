"""task.reward_model takes a Hugging Face sequence-classification reward model (what TRL's
RewardTrainer writes and most published RMs are), as well as `rlpost rm`'s folder."""

import pytest
import torch
from helpers import tiny_cfg
from transformers import LlamaConfig, LlamaForSequenceClassification

from rlpost.config import ConfigError
from rlpost.model.encode import encode
from rlpost.model.load import tiny_model, tiny_tokenizer
from rlpost.recipes.rl import train
from rlpost.rewards.reward_model import SequenceClassifierScorer, load_reward_model


@pytest.fixture
def hf_rm(tmp_path):
    tok = tiny_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, num_labels=1, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(cfg)
    model.save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    return tmp_path / "rm", model.eval(), tok


def test_scores_are_the_classifiers_logit_on_the_templated_conversation(hf_rm):
    folder, model, tok = hf_rm
    prompts = [[{"role": "user", "content": q}] for q in ("1+1", "22*3", "7")]
    batch = encode(tok, prompts, ["2", "66 it is", "seven"], [0, 1, 2])
    # 2 + 1: padding inside a micro-batch
    scorer = load_reward_model(str(folder), micro_batch_size=2, autocast_bf16=False)
    assert isinstance(scorer, SequenceClassifierScorer)
    scores, infos, _ = scorer.score(batch)
    with torch.no_grad():  # one conversation at a time, no padding at all
        expected = [model(**tok(tok.apply_chat_template([*p, {"role": "assistant", "content": c}], tokenize=False),
                                return_tensors="pt", add_special_tokens=False)).logits[0, 0]
                    for p, c in zip(prompts, batch.completions)]
    assert torch.allclose(scores, torch.stack(expected), atol=1e-5)
    assert infos[0]["rm_score"] == pytest.approx(scores[0].item())


def test_rlhf_run_with_a_sequence_classification_rm(hf_rm, tmp_path):
    folder, _, _ = hf_rm
    import json

    summary = train(tiny_cfg(f"task.reward_model={folder}"), tmp_path / "run")
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # the RM's real-valued scores are the reward (the arithmetic verifier alone gives the tiny model all zeros)
    assert summary["steps"] == 2 and all(m["reward/std"] > 0 for m in metrics)


def test_a_folder_that_is_no_reward_model_is_refused(tmp_path):
    tok = tiny_tokenizer()
    tiny_model(len(tok)).save_pretrained(tmp_path)  # a causal LM, no value head
    with pytest.raises(ConfigError, match="neither an `rlpost rm` model folder .* LlamaForCausalLM"):
        load_reward_model(str(tmp_path))
