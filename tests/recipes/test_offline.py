"""SFT, reward model and DPO on the tiny model through the real code, on synthetic data it can
learn: the prompt is a digit, the preferred completion repeats it, the rejected one is another."""

import json
import random

import pytest
import torch
from helpers import TINY_DATA, TINY_ROUNDS, at_train_step, cli, power_cut, run_cli, tiny_cfg

from rlpost.config import ConfigError
from rlpost.model.load import load_policy
from rlpost.recipes.offline import train_offline


def digit_pairs(n, seed):
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        d = rng.randint(0, 9)
        rows.append({"prompt": str(d), "chosen": str(d), "rejected": str((d + rng.randint(1, 9)) % 10)})
    return rows


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture
def pairs(tmp_path):
    return (write_jsonl(tmp_path / "train.jsonl", digit_pairs(256, 0)),
            write_jsonl(tmp_path / "eval.jsonl", digit_pairs(64, 1)))


def test_sft_learns_to_copy_the_digit(tmp_path):
    rows = [{"prompt": r["prompt"], "completion": r["chosen"]} for r in digit_pairs(256, 0)]
    data = write_jsonl(tmp_path / "sft.jsonl", rows)
    cfg = tiny_cfg(f"pref.data={data}", "pref.epochs=3", "pref.batch_size=16", "trainer.lr=3e-3")
    s = train_offline(cfg, tmp_path / "sft", "sft")
    # a random 76-token model: NLL/token ~ log 76 = 4.3 over (digit, EOS); learnt: both near-certain
    assert s["heldout_before"]["sft/nll"] > 3.0 and s["heldout_after"]["sft/nll"] < 0.5, s
    assert (tmp_path / "sft" / "model" / "config.json").exists()


def test_reward_model_learns_the_preference(tmp_path, pairs):
    train, held = pairs
    cfg = tiny_cfg(f"pref.data={train}", f"pref.eval_data={held}", "pref.epochs=4", "pref.batch_size=16",
                   "trainer.lr=3e-3", "algo.critic_lr=3e-3")
    s = train_offline(cfg, tmp_path / "rm", "rm")
    assert s["heldout_after"]["rm/accuracy"] >= 0.8, s  # the bar
    assert (tmp_path / "rm" / "model" / "value_head.safetensors").exists()


@pytest.mark.parametrize("loss", ["dpo", "ipo", "kto", "orpo", "simpo"])
def test_every_preference_loss_raises_the_heldout_margin(tmp_path, pairs, loss):
    train, held = pairs
    cfg = tiny_cfg(f"pref.data={train}", f"pref.eval_data={held}", f"pref.loss={loss}", "pref.epochs=2",
                   "pref.batch_size=16", "trainer.lr=1e-3")
    s = train_offline(cfg, tmp_path / loss, "dpo")
    before, after = s["heldout_before"], s["heldout_after"]
    # implicit rewards are on each loss's own scale (ORPO's is lam * mean log-prob): compare, don't bar
    assert after["rewards/margin"] > before["rewards/margin"], (loss, before, after)
    assert after["rewards/accuracy"] > 0.7, (loss, after)


def test_bad_rows_are_named_or_skipped(tmp_path):
    rows = digit_pairs(20, 0)
    lines = [json.dumps(r) for r in rows]
    lines[6] = json.dumps({"prompt": "3", "chosen": "3"})  # line 7: no 'rejected'
    data = tmp_path / "bad.jsonl"
    data.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=r"bad.jsonl:7: expected 'rejected'"):
        train_offline(tiny_cfg(f"pref.data={data}"), tmp_path / "refuse", "dpo")
    s = train_offline(tiny_cfg(f"pref.data={data}", "pref.on_bad_row=skip"), tmp_path / "skip", "dpo")
    assert s["skipped_rows"] == 1 and s["rows"] + s["heldout_rows"] == 19
    r = cli("dpo", *TINY_DATA, f"pref.data={data}", f"run.out_dir={tmp_path}")
    assert r.returncode == 2 and "bad.jsonl:7" in r.stderr and "Traceback" not in r.stderr


J = lambda rows: "".join(json.dumps(r) + "\n" for r in rows)  # noqa: E731
# Rows each command's schema refuses, in one line naming the file, the line and the field (issue 43:
# each raised from deep inside), and a split that leaves no rows; all before a run folder exists.
BAD_ROWS = {
    "sft: messages that are strings": ("sft", J([{"messages": ["hi", "there"]}] * 4),
                                       "rows.jsonl:1: messages[0]: expected a mapping"),
    "sft: messages without content": ("sft", J([{"messages": [{"role": "user"}, {"role": "assistant"}]}] * 4),
                                      "rows.jsonl:1: messages[0].content: missing"),
    "sft: only an assistant turn": ("sft", J([{"messages": [{"role": "assistant", "content": "x"}]}] * 4),
                                    "rows.jsonl:1: 'messages' needs a user turn before the assistant's"),
    "sft: a role no template knows": ("sft", J([{"messages": [{"role": "wizard", "content": "a"},
                                                              {"role": "assistant", "content": "b"}]}] * 4),
                                      "messages[0].role: expected system, user, assistant or tool, got 'wizard'"),
    "dpo: an empty file": ("dpo", "", "leaves 0 training and 0 held-out rows"),
    "sft: a split with no held-out row": ("sft", J([{"prompt": "1", "completion": "1"}]),
                                          "leaves 1 training and 0 held-out"),
    "dpo: a FIFO": ("dpo", None, "rows.jsonl is a FIFO"),
}


@pytest.mark.parametrize("case", BAD_ROWS)
def test_rows_that_do_not_fit_are_one_line_before_any_folder(tmp_path, case):
    import os

    kind, text, said = BAD_ROWS[case]
    data = tmp_path / "rows.jsonl"
    os.mkfifo(data) if text is None else data.write_text(text)
    r = cli(kind, *TINY_DATA, f"pref.data={data}", f"run.out_dir={tmp_path}", "run.name=x")
    last = r.stderr.strip().splitlines()[-1]
    assert (r.returncode == 2 and "Traceback" not in r.stderr and last.startswith("rlpost: error:")
            and said in last), last
    assert not (tmp_path / "x").exists()


def test_online_dpo_stops_when_the_reward_function_returns_text(tmp_path):
    r = cli("dpo", *TINY_ROUNDS, "pref.online_rounds=1", "pref.online_prompts=4",
            "task.verifier=toy_verifiers:returns_text",
            f"run.out_dir={tmp_path}", "run.name=o")
    # a value check is not a crash: the first failure is its one line ("returned 'yes', expected a finite number")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "toy_verifiers:returns_text failed" in r.stderr and "returned 'yes', expected a finite number" in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(
        "rlpost: error: reward function returns_text failed on 8 of 8 completions")


def test_rows_from_jsonl_parquet_and_a_datasets_folder_agree(tmp_path):
    import datasets

    from rlpost.envs.data import read_rows

    rows = digit_pairs(10, 3)
    ds = datasets.Dataset.from_list(rows)
    ds.to_parquet(str(tmp_path / "d.parquet"))
    ds.save_to_disk(str(tmp_path / "folder"))
    plain = [{k: r[k] for k in ("prompt", "chosen", "rejected")}
             for r in read_rows(write_jsonl(tmp_path / "d.jsonl", rows))]
    assert plain == rows
    assert read_rows(tmp_path / "d.parquet") == read_rows(tmp_path / "folder") == [
        {**r, "_line": i} for i, r in enumerate(rows, 1)]  # a table's rows are counted, as a file's lines are
    with pytest.raises(ConfigError, match="file not found"):
        read_rows(tmp_path / "missing.jsonl")


def test_online_dpo_builds_pairs_from_the_policys_own_samples(tmp_path):
    from rlpost.recipes.online import run_online_dpo

    # odd_length rewards vary inside every group whatever the model, so every prompt gives a pair
    cfg = tiny_cfg("pref.online_rounds=2", "pref.online_prompts=8", "task.verifier=toy_verifiers:odd_length",
                   "pref.batch_size=4")
    s = run_online_dpo(cfg, tmp_path)
    assert [r["round"] for r in s["rounds"]] == [0, 1, 2]
    pairs = [json.loads(l) for l in (tmp_path / "round_1" / "pairs.jsonl").read_text().splitlines()]
    assert len(pairs) == s["rounds"][1]["online/pairs"] > 0
    assert all(len(p["chosen"]) % 2 == 1 and len(p["rejected"]) % 2 == 0 for p in pairs)  # best odd, worst even
    import yaml

    # round 2 samples from, and starts from, round 1's model
    assert yaml.safe_load((tmp_path / "round_2" / "config.yaml").read_text())["model"]["name"].endswith("round_1/model")


def test_length_grouped_batches_are_a_permutation_with_less_padding():
    from rlpost.recipes.offline import batch_order

    rng = random.Random(0)
    lengths = [rng.randint(1, 100) for _ in range(400)]
    grouped = batch_order(lengths, 8, True, random.Random(1))
    plain = batch_order(lengths, 8, False, random.Random(1))
    assert sorted(grouped) == sorted(plain) == list(range(400))
    pad = lambda order: sum(max(lengths[i] for i in order[b:b + 8]) * 8 for b in range(0, 400, 8)) - sum(lengths)
    assert pad(grouped) < 0.2 * pad(plain)


def test_every_row_trains_each_epoch_the_last_batch_smaller(tmp_path, monkeypatch):
    """21 training rows at pref.batch_size=8: 3 steps an epoch of 8, 8 and 5 rows, every row once (the steps were
    21 // 8 = 2, and 5 rows sat out each epoch unsaid); with length grouping the smaller batch stays last, so the
    cut never mixes two batches."""
    from rlpost.recipes.offline import batch_order
    from rlpost.roles.trainer import Trainer

    lengths = [random.Random(2).randint(1, 50) for _ in range(21)]
    for by_length in (True, False):
        order = batch_order(lengths, 8, by_length, random.Random(1))
        assert sorted(order) == list(range(21))
    grouped = batch_order(list(range(21)), 8, True, random.Random(1))
    assert sorted(grouped[16:]) == [16, 17, 18, 19, 20]  # the 5 longest make the smaller batch, last
    seen, real = [], Trainer.train_step
    monkeypatch.setattr(Trainer, "train_step", lambda self, batch, loss: seen.append(len(batch)) or real(self, batch,
                                                                                                          loss))
    rows = [{"prompt": r["prompt"], "completion": r["chosen"]} for r in digit_pairs(24, 0)]  # 21 train, 3 held out
    s = train_offline(tiny_cfg(f"pref.data={write_jsonl(tmp_path / 'sft.jsonl', rows)}", "pref.batch_size=8",
                               "pref.epochs=2", "pref.heldout_frac=0.125"), tmp_path / "r", "sft")
    assert s["rows"] == 21 and s["steps"] == 6 and seen == [8, 8, 5, 8, 8, 5]


def test_lora_in_sft_changes_the_result_and_trains_only_adapters(tmp_path):
    from safetensors.torch import load_file

    rows = [{"prompt": r["prompt"], "completion": r["chosen"]} for r in digit_pairs(64, 0)]
    data = write_jsonl(tmp_path / "sft.jsonl", rows)
    base = ["pref.epochs=1", "pref.batch_size=16", "trainer.lr=3e-3", f"pref.data={data}"]
    full = train_offline(tiny_cfg(*base), tmp_path / "full", "sft")
    lora = train_offline(tiny_cfg(*base, "model.lora_r=4"), tmp_path / "lora", "sft")
    # same data, seed and steps: the held-out NLL differs once LoRA is really on
    assert full["heldout_before"]["sft/nll"] == lora["heldout_before"]["sft/nll"]
    assert full["heldout_after"]["sft/nll"] != lora["heldout_after"]["sft/nll"]
    init = load_policy("tiny").model.state_dict()
    for run, moved in (("full", "embed_tokens"), ("lora", None)):
        after = load_file(tmp_path / run / "model" / "model.safetensors")
        changed = [k for k in after if not torch.equal(after[k], init[k])]
        if moved:  # a full fine-tune moves the embedding and norms too
            assert any(moved in k for k in changed) and any("norm" in k for k in changed)
        else:  # LoRA: only the adapted linear layers moved (merged), nothing else
            assert changed and all(k.endswith("proj.weight") for k in changed), changed
    assert (tmp_path / "lora" / "adapter" / "adapter_config.json").exists()


@pytest.mark.parametrize("kind", ["rm", "dpo"])
def test_lora_in_rm_and_dpo_trains_only_adapters(tmp_path, pairs, kind):
    from safetensors.torch import load_file

    train, held = pairs
    cfg = tiny_cfg(f"pref.data={train}", f"pref.eval_data={held}", "pref.batch_size=32", "trainer.lr=3e-3",
                   "model.lora_r=4")
    s = train_offline(cfg, tmp_path / kind, kind)
    after = load_file(tmp_path / kind / "model" / "model.safetensors")
    init = load_policy("tiny").model.state_dict()
    changed = [k for k in after if not torch.equal(after[k], init[k])]
    assert changed and all(k.endswith("proj.weight") for k in changed), changed
    if kind == "rm":  # the head trains in full beside the adapters, and the loss is named for what it is
        assert s["loss"] == "bradley_terry" and (tmp_path / kind / "model" / "value_head.safetensors").exists()
        assert s["heldout_after"]["rm/accuracy"] != s["heldout_before"]["rm/accuracy"]
    else:
        assert s["heldout_after"]["rewards/margin"] > s["heldout_before"]["rewards/margin"]


@pytest.mark.parametrize("layout", ["explicit_conversational", "implicit_conversational", "implicit_standard",
                                    "ultrafeedback"])
def test_trl_preference_layouts_are_read_and_train(tmp_path, layout):
    from rlpost.envs.data import preference_triple

    plain = digit_pairs(64, 0)

    def convert(r):
        user, chosen, rejected = [{"role": "user", "content": r["prompt"]}], r["chosen"], r["rejected"]
        if layout == "explicit_conversational":
            return {"prompt": user, "chosen": [{"role": "assistant", "content": chosen}],
                    "rejected": [{"role": "assistant", "content": rejected}]}
        if layout == "ultrafeedback":  # UltraFeedback-binarized: a string prompt, whole conversations
            return {"prompt": r["prompt"], "prompt_id": "x", "score_chosen": 8.0,
                    "chosen": [*user, {"role": "assistant", "content": chosen}],
                    "rejected": [*user, {"role": "assistant", "content": rejected}]}
        if layout == "implicit_conversational":
            return {"chosen": [*user, {"role": "assistant", "content": chosen}],
                    "rejected": [*user, {"role": "assistant", "content": rejected}]}
        return {"chosen": f"Q{r['prompt']} A: {chosen}", "rejected": f"Q{r['prompt']} A: {rejected}"}

    rows = [convert(r) for r in plain]
    prompt, chosen, rejected = preference_triple(rows[0], "x")
    if layout == "implicit_standard":  # TRL's split: the shared text is the prompt, the space stays with the answers
        assert (prompt == [{"role": "user", "content": f"Q{plain[0]['prompt']} A:"}]
                and chosen == f" {plain[0]['chosen']}")
    else:
        assert (prompt, chosen, rejected) == ([{"role": "user", "content": plain[0]["prompt"]}], plain[0]["chosen"],
                                              plain[0]["rejected"])
    data = write_jsonl(tmp_path / "pairs.jsonl", rows)
    for kind in ("dpo", "rm"):
        s = train_offline(tiny_cfg(f"pref.data={data}", "pref.batch_size=32"), tmp_path / kind, kind)
        assert s["rows"] == 57 and s["skipped_rows"] == 0  # 64 minus the 10% held out, none refused


def test_trl_formats_rlpost_does_not_train_say_so_by_name():
    """TRL's language-modelling rows ({"text"}) and KTOTrainer's unpaired rows (prompt, completion, label): one line
    naming the row and saying what rlpost takes instead, not only which key is missing."""
    from rlpost.envs.data import preference_triple, sft_pair
    from rlpost.types.errors import DataError

    with pytest.raises(DataError, match=r"^x row: expected 'completion' .*\(a plain 'text' row, TRL's language-"):
        sft_pair({"text": "Once upon a time"}, "x")
    with pytest.raises(DataError, match=r"^x row: an unpaired row \(prompt, completion, label: KTOTrainer's format\)"):
        preference_triple({"prompt": "2+2?", "completion": "4", "label": True}, "x")


@pytest.mark.plots  # the loss curves are drawn: the page holds a real <svg>
def test_report_on_sft_rm_and_dpo_runs(tmp_path, pairs):
    from rlpost import cli

    train, _ = pairs
    for kind in ("sft", "rm", "dpo"):
        data = train
        if kind == "sft":
            data = write_jsonl(tmp_path / "sft.jsonl",
                               [{"prompt": r["prompt"], "completion": r["chosen"]} for r in digit_pairs(32, 0)])
        train_offline(tiny_cfg(f"pref.data={data}", "pref.batch_size=16"), tmp_path / kind, kind)
        assert cli.main(["report", str(tmp_path / kind)]) == 0, kind
        page = (tmp_path / kind / "report.html").read_text()
        assert f"{kind} training loss" in page and "<svg" in page and "heldout_after" in page, kind
    assert "bradley_terry" in (tmp_path / "rm" / "report.html").read_text()


def test_pairs_whose_chosen_is_their_rejected_are_said(tmp_path, capsys):
    from rlpost.console import _said
    from rlpost.recipes.offline import load_rows

    rows = [{"prompt": str(i), "chosen": "a", "rejected": "a" if i < 3 else "b"} for i in range(10)]
    cfg = tiny_cfg(f"pref.data={write_jsonl(tmp_path / 'p.jsonl', rows)}", "pref.heldout_frac=0.2")
    _said.clear()
    load_rows(cfg, "dpo")
    assert "pref.data: 3 of 8 training pairs have chosen == rejected: they teach nothing" in capsys.readouterr().err
    load_rows(cfg, "rm")  # the same run reads them again: said once
    assert capsys.readouterr().err == ""


def test_a_prompt_longer_than_max_len_is_named_or_skipped(tmp_path, capsys):
    """pref.on_bad_row=skip skips a row whose prompt leaves nothing of pref.max_len, as it skips a malformed one."""
    from rlpost.recipes.offline import preflight

    lines = [json.dumps(r) for r in digit_pairs(20, 0)]
    lines[4] = json.dumps({"prompt": "7 " * 300, "chosen": "7", "rejected": "8"})  # line 5
    data = tmp_path / "long.jsonl"
    data.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=r"long.jsonl:5: the prompt is longer .* \(or pref.on_bad_row=skip skips"):
        preflight(tiny_cfg(f"pref.data={data}", "pref.max_len=64"), "dpo")
    cfg = tiny_cfg(f"pref.data={data}", "pref.max_len=64", "pref.on_bad_row=skip")
    preflight(cfg, "dpo")
    s = train_offline(cfg, tmp_path / "skip", "dpo")
    assert s["skipped_rows"] == 1 and s["rows"] + s["heldout_rows"] == 19
    assert capsys.readouterr().err.count("rows whose prompt does not fit pref.max_len") == 1  # read twice, said once


def test_completions_longer_than_max_len_are_said_to_be_cut(tmp_path, capsys):
    from rlpost.recipes.offline import preflight

    rows = digit_pairs(20, 0)
    rows[0] = {**rows[0], "chosen": "7 " * 30}  # past pref.max_len=16 tokens, within 128
    data = write_jsonl(tmp_path / "long.jsonl", rows)
    preflight(tiny_cfg(f"pref.data={data}", "pref.max_len=16"), "dpo")
    assert "pref.max_len: 1 of 36 completions are longer than 16 tokens and are cut there" in capsys.readouterr().err
    preflight(tiny_cfg(f"pref.data={data}", "pref.max_len=128"), "dpo")
    assert "are cut there" not in capsys.readouterr().err


def test_raw_prompts_are_fed_as_they_are_as_trl_feeds_its_standard_format(tmp_path):
    """Anthropic HH: two transcripts, the shared text the prompt. pref.prompt_format=raw tokenizes that text as it is
    (no chat template around a transcript that has its own turns); conversational rows keep the template."""
    from rlpost.model import encode
    from rlpost.model.load import load_tokenizer

    tok = load_tokenizer("tiny")
    hh = {"chosen": "\n\nHuman: What is 2+2?\n\nAssistant: 4", "rejected": "\n\nHuman: What is 2+2?\n\nAssistant: 5"}
    chat = {"prompt": [{"role": "user", "content": "2+2?"}], "chosen": [{"role": "assistant", "content": "4"}],
            "rejected": [{"role": "assistant", "content": "5"}]}
    raw, templated = (encode.encode_pairs(tok, [hh, chat], 16, raw=r) for r in (True, False))
    prompts, _ = encode.unpadded(raw)
    assert prompts[0] == tok.encode("\n\nHuman: What is 2+2?\n\nAssistant:", add_special_tokens=False)
    assert prompts[0] != encode.unpadded(templated)[0][0]  # chat: the transcript inside the template's user turn
    assert prompts[2] == encode.unpadded(templated)[0][2]  # a conversational row is templated either way
    data = write_jsonl(tmp_path / "hh.jsonl", [{"chosen": f"\n\nHuman: {r['prompt']}\n\nAssistant: {r['chosen']}",
                                                "rejected": f"\n\nHuman: {r['prompt']}\n\nAssistant: {r['rejected']}"}
                                               for r in digit_pairs(40, 0)])
    s = train_offline(tiny_cfg(f"pref.data={data}", "pref.prompt_format=raw"), tmp_path / "dpo", "dpo")
    assert s["rows"] == 36
    with pytest.raises(ConfigError, match="pref.prompt_format: raw feeds pref.data's string prompts"):
        tiny_cfg("pref.prompt_format=raw")


@pytest.mark.parametrize("kind", ["dpo", "rm"])
def test_micro_batches_never_part_a_pair(tmp_path, kind):
    """DPO's and the reward model's losses read rows 2i, 2i + 1 (chosen, rejected) together. Cut into micro-batches
    (2 or 4 rows, or by tokens), with the prompts run once ahead (which orders rows by their own length), a pair
    used to be parted: the loss paired a chosen with another pair's row and the step after the first moved by
    0.04-0.26 against the one-piece run's; with micro_batch_tokens the loss failed on an odd micro-batch. Every
    cut now gives the one-piece run's losses and weights."""
    rows = digit_pairs(48, 0)
    for i, r in enumerate(rows):  # lengths that differ within a pair, so ordering by own length parts pairs
        r["chosen"] += " x" * (i % 5)
    data = write_jsonl(tmp_path / "p.jsonl", rows)
    runs = {}
    for cut in ("trainer.micro_batch_size=0", "trainer.micro_batch_size=2", "trainer.micro_batch_size=4",
                "trainer.micro_batch_tokens=40"):
        cfg = tiny_cfg(f"pref.data={data}", "pref.batch_size=8", "pref.max_len=64", "algo.critic_lr=1e-3", cut)
        assert cfg.trainer.prompts_once and cfg.trainer.share_prompt_prefix  # the lever that ordered rows
        s = train_offline(cfg, tmp_path / cut.replace("=", "_"), kind)
        lines = [json.loads(x) for x in (tmp_path / cut.replace("=", "_") / "metrics.jsonl").read_text().splitlines()]
        runs[cut] = ([x["actor/loss"] for x in lines], s["heldout_after"])
    one, _ = runs.pop("trainer.micro_batch_size=0")
    assert len(one) == 6  # 43 training pairs: 5 steps of 8, the last of 3
    for cut, (losses, _) in runs.items():
        assert losses == pytest.approx(one, abs=1e-5), cut


@pytest.mark.parametrize("kind, extra", [("sft", ()), ("dpo", ("model.lora_r=4",)), ("rm", ())])
def test_a_run_cut_short_resumes_with_the_batches_an_uninterrupted_one_takes(tmp_path, pairs, monkeypatch, kind,
                                                                               extra):
    """A crash during step 5 (checkpoints every 3 steps, 4 steps an epoch) and `rlpost KIND --resume`: the
    run goes on from step 3, mid-epoch, with that epoch's row order, then draws the next epoch's order as
    the uninterrupted run did, and ends with the same losses step for step and the same weights."""
    from safetensors.torch import load_file

    from rlpost.roles.trainer import Trainer

    train, held = pairs
    if kind == "sft":  # the chosen answers as completions
        train, held = (write_jsonl(tmp_path / f"sft{i}.jsonl", [{"prompt": r["prompt"], "completion": r["chosen"]}
                                                               for r in digit_pairs(n, i)])
                       for i, n in ((0, 256), (1, 64)))
    args = [kind, *TINY_DATA, f"pref.data={train}", f"pref.eval_data={held}", "pref.epochs=2", "pref.batch_size=64",
            "pref.max_len=64", "run.checkpoint_every=3", *(["algo.critic_lr=1e-3"] if kind == "rm" else []), *extra,
            f"run.out_dir={tmp_path}"]
    whole = cli(*args, "run.name=whole")
    assert whole.returncode == 0, whole.stderr
    monkeypatch.setattr(Trainer, "train_step", at_train_step(5, power_cut))
    with pytest.raises(RuntimeError, match="power cut"):
        cli(*args, "run.name=cut")
    monkeypatch.undo()
    cut = tmp_path / "cut"
    assert sorted(p.name for p in (cut / "checkpoints").glob("step_*")) == ["step_000003"]
    assert not (cut / "model").exists()
    for other in ("train", "rsft", {"sft": "dpo", "dpo": "rm", "rm": "sft"}[kind]):  # its own command only
        r = cli(other, "--resume", str(cut))
        assert r.returncode == 2 and "--resume" in r.stderr and "model" not in {p.name for p in cut.iterdir()}, r.stderr
    r = cli(kind, "--resume", str(cut), "pref.batch_size=32")
    assert r.returncode == 2 and "pref.batch_size: cannot change on --resume" in r.stderr, r.stderr
    r = cli(kind, "--resume", str(cut), "run.threads=1")
    assert r.returncode == 0 and "resuming from step_000003" in r.stderr, r.stderr
    lines = [[json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
             for name in ("whole", "cut")]
    assert [x["step"] for x in lines[1]] == list(range(1, 9))
    assert [x["actor/loss"] for x in lines[0]] == [x["actor/loss"] for x in lines[1]]
    a, b = (json.loads((tmp_path / name / "summary.json").read_text()) for name in ("whole", "cut"))
    assert a["heldout_before"] == b["heldout_before"] and a["heldout_after"] == b["heldout_after"], (a, b)
    wa, wb = (load_file(tmp_path / name / "model" / "model.safetensors") for name in ("whole", "cut"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_reward_models_export_carries_its_scalar_head(tmp_path, pairs):
    """rlpost export writes an rm run's checkpoint with its value_head.safetensors (trainer.pt's critic head), as
    RUN/model has it: without it the folder would load as a policy, not as task.reward_model."""
    from safetensors.torch import load_file

    train, held = pairs
    r = cli("rm", *TINY_DATA, f"pref.data={train}", f"pref.eval_data={held}", "pref.batch_size=64", "pref.max_len=64",
            "run.checkpoint_every=2", "run.keep_checkpoints=3", "algo.critic_lr=1e-2", f"run.out_dir={tmp_path}",
            "run.name=rm")
    assert r.returncode == 0, r.stderr
    run = tmp_path / "rm"
    for step, out in ((None, tmp_path / "last"), (2, tmp_path / "two")):
        e = cli("export", str(run), "--out", str(out), *(["--step", str(step)] if step else []))
        assert e.returncode == 0, e.stderr
    final, last, two = (load_file(p / "value_head.safetensors") for p in (run / "model", tmp_path / "last",
                                                                            tmp_path / "two"))
    assert all(torch.equal(final[k], last[k]) for k in final) and final["weight"].abs().sum() > 0
    assert not torch.equal(final["weight"], two["weight"])  # step 2's head, not the last one's


def test_resume_names_the_way_on_when_there_is_nothing_to_resume(tmp_path):
    """A run stopped before its first checkpoint: --resume refuses, naming --start-over, which trains it again from
    step 0 in its own folder; a finished run, a checkpoint folder and a folder rlpost did not make are each one
    line naming what to do instead."""
    import shutil

    rows = [{"prompt": r["prompt"], "completion": r["chosen"]} for r in digit_pairs(64, 0)]
    args = ["sft", *TINY_DATA, f"pref.data={write_jsonl(tmp_path / 'sft.jsonl', rows)}", "pref.batch_size=16",
            "pref.max_len=64", "run.checkpoint_every=3", f"run.out_dir={tmp_path}", "run.name=s"]
    assert cli(*args).returncode == 0
    run = tmp_path / "s"  # as a SIGKILL during step 3 leaves it: steps 1-2 logged, no checkpoint, no model
    for gone in ("checkpoints", "model"):
        shutil.rmtree(run / gone)
    (run / "summary.json").unlink()
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("".join(x + "\n" for x in lines[:2]))
    r = cli("sft", "--resume", str(run))
    assert r.returncode == 2 and "no intact checkpoint to resume from" in r.stderr and "--start-over" in r.stderr
    assert cli(*args).returncode == 2  # the same command again: the folder holds a run
    r = cli("sft", "--resume", str(run), "--start-over")
    assert r.returncode == 0 and "resuming from step 0 (--start-over)" in r.stderr, r.stderr
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]
    for where, said in ((run, "the run is finished (its summary.json is written)"),
                        (run / "checkpoints" / "step_000004", f"a checkpoint, not a run folder; resume its run, {run}"),
                        (tmp_path, "no config.yaml there; is it a run folder?")):
        r = cli("sft", "--resume", str(where))
        assert r.returncode == 2 and said in r.stderr, r.stderr
    r = cli("sft", "--resume", str(run), "pref.batch_size=8")  # the list of what may change: what sft reads
    assert r.returncode == 2 and "trainer.lr" in r.stderr and "run.steps" not in r.stderr, r.stderr
    r = cli(*args[:-1], "run.name=t", "task.verifier_workers=2")
    assert r.returncode == 2 and "task.verifier_workers: rlpost sft would ignore it" in r.stderr, r.stderr
