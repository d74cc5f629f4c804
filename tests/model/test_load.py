"""Model loading: the tiny model, bad specs, and (slow) the embedded SmolLM2 from its GGUF."""

import pytest
import torch

from rlpost.model.load import ModelLoadError, load_policy, load_tokenizer


def test_tiny_tokenizer_round_trips_and_pads_left():
    tok = load_tokenizer("tiny")
    assert tok.padding_side == "left" and tok.pad_token == "<pad>"
    ids = tok("12 + 3 = 15", add_special_tokens=False).input_ids
    assert tok.decode(ids) == "12 + 3 = 15" and len(ids) == len("12 + 3 = 15")
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert text == "<|user|>hi<|assistant|>"


def test_tiny_model_is_seeded_and_does_not_touch_global_rng():
    state = torch.get_rng_state()
    a, b = load_policy("tiny", seed=3).model, load_policy("tiny", seed=3).model
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


def test_bad_model_path_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="cannot load model"):
        load_policy(str(tmp_path / "missing"))


@pytest.mark.slow
def test_embedded_model_loads_with_chat_template_and_eos():
    loaded = load_policy("embedded", dtype=torch.bfloat16)
    tok = loaded.tokenizer
    assert tok.padding_side == "left" and tok.eos_token == "<|im_end|>" and tok.pad_token_id is not None
    text = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True,
                                   tokenize=False)
    assert text.endswith("<|im_start|>assistant\n") and "<|im_start|>user\nWhat is 2 + 3?<|im_end|>" in text
    assert loaded.model.config.num_hidden_layers == 30 and loaded.model.dtype == torch.bfloat16
    enc = tok([text], return_tensors="pt", add_special_tokens=False)
    out = loaded.model.generate(**enc, max_new_tokens=8, do_sample=False)
    assert "5" in tok.decode(out[0, enc.input_ids.shape[1]:])


def test_base_model_without_chat_template_gets_a_plain_one_said_once(tmp_path, capsys):
    from rlpost.model.load import PLAIN_CHAT_TEMPLATE, tiny_model, tiny_tokenizer

    tok = tiny_tokenizer()
    tok.chat_template = None  # a base model's tokenizer
    tok.save_pretrained(tmp_path)
    tiny_model(len(tok)).save_pretrained(tmp_path)
    a, b = load_policy(str(tmp_path)), load_policy(str(tmp_path))
    assert capsys.readouterr().err.count("has no chat template") == 1
    text = b.tokenizer.apply_chat_template([{"role": "user", "content": "2+3"}], add_generation_prompt=True,
                                           tokenize=False)
    assert a.tokenizer.chat_template == PLAIN_CHAT_TEMPLATE and text == "User: 2+3\nAssistant:"


def test_a_missing_folder_under_a_local_one_is_no_hub_id(tmp_path, monkeypatch):
    # runs/typo has a hub id's shape, but runs/ is a folder here: no such folder, not the hub's offline error
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    with pytest.raises(ModelLoadError, match="cannot load model 'runs/typo': no such file or folder"):
        load_tokenizer("runs/typo")


def test_a_folder_without_config_json_says_so(tmp_path):
    # not transformers' guess ("install sentencepiece or tiktoken"): what the folder lacks, and what it holds
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="holds no config.json, so it is no model folder \\(it is empty\\)"):
        load_tokenizer(str(tmp_path / "empty"))
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("x")
    with pytest.raises(ModelLoadError, match="it holds a.txt"):
        load_policy(str(tmp_path / "notes"))


def test_a_run_folder_without_model_says_how_to_get_one(tmp_path):
    (tmp_path / "config.yaml").write_text("{}\n")
    with pytest.raises(ModelLoadError, match=f"rlpost export {tmp_path}"):
        load_policy(str(tmp_path))


def test_unreachable_hub_means_offline_mode_and_a_clear_error(monkeypatch):
    # A closed local port stands in for a hub that cannot be reached.
    from huggingface_hub import constants

    from rlpost.model import load

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(load, "_HUB_CHECKED", [])
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # so the "1" set below is undone after the test
    with pytest.raises(ModelLoadError, match=r"cannot load model 'someorg/somemodel' \(the hub cannot be reached"):
        load_policy("someorg/somemodel")
    assert constants.HF_HUB_OFFLINE is True


def test_attn_implementation_reaches_the_trainer_and_reference_and_computes_the_same():
    # model.attn_implementation: the trainer's and reference's models run that kernel; eager and sdpa
    # are the same function (float32, a left-padded row), so the choice is speed, not the policy.
    from helpers import tiny_cfg

    from rlpost.build import build_roles
    from rlpost.envs import Task

    roles = build_roles(tiny_cfg("model.attn_implementation=eager", "algo.kl_coef=0.1"),
                        Task([], [], "toy_verifiers:odd_length"))
    roles.close()
    assert roles.trainer.model.config._attn_implementation == "eager"
    assert roles.reference.model.config._attn_implementation == "eager"
    sdpa, eager = load_policy("tiny").model, load_policy("tiny", attn="eager").model
    assert sdpa.config._attn_implementation == "sdpa"  # auto: transformers picks sdpa for Llama
    ids, mask = torch.randint(0, 50, (2, 7)), torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1] * 7])
    with torch.no_grad():
        a, b = sdpa(input_ids=ids, attention_mask=mask).logits, eager(input_ids=ids, attention_mask=mask).logits
    assert torch.allclose(a[:, 2:], b[:, 2:], atol=1e-5)


def test_an_attn_implementation_transformers_refuses_names_the_field():
    # flash-attn is not installed on these machines (and needs a GPU): a config error, not a traceback
    from rlpost.types.errors import ConfigError

    with pytest.raises(ConfigError, match="model.attn_implementation=flash_attention_2"):
        load_policy("tiny", attn="flash_attention_2")
