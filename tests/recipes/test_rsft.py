"""Rejection-sampling SFT (recipes/rsft.py): which samples become rows, by hand, and the real rounds."""

import json
from types import SimpleNamespace

import pytest
import torch
from helpers import rl_batch, tiny_cfg

from rlpost.recipes.rsft import accepted_rows, run_rsft


class FakeRoles:
    """A rollout that 'samples' fixed completions and a verifier that scores them as told."""

    def __init__(self, completions, rewards, lengths):
        mask = torch.tensor([[j < n for j in range(max(lengths))] for n in lengths])
        self.batch = rl_batch(mask, completions=completions)
        self.rollout = SimpleNamespace(generate=lambda rows, n, **kw: self.batch)
        self.verifier = SimpleNamespace(score=lambda b: (torch.tensor(rewards), [{}] * len(rewards), {}))


@pytest.mark.parametrize("keep,want", [
    # prompt 0 (K = 3): "a" (3 tokens, accepted), "a" again (accepted), "bb" (1 token, accepted);
    # prompt 1: nothing accepted (rewards 0, 0.5 < 1) -> no row
    ("all", ["a", "a", "bb"]),
    ("unique", ["a", "bb"]),
    ("shortest", ["bb"]),
])
def test_accepted_rows_by_hand(keep, want):
    roles = FakeRoles(["a", "a ", "bb", "x", "y", "z"], [1.0, 1.0, 2.0, 0.0, 0.5, 0.0], [3, 3, 1, 2, 2, 2])
    rows = [{"messages": [{"role": "user", "content": "p0"}], "answer": "0"},
            {"messages": [{"role": "user", "content": "p1"}]}]
    out, m = accepted_rows(roles, rows, 3, tiny_cfg(f"pref.rsft_keep={keep}"))
    assert [r["completion"].strip() for r in out] == want
    assert all(r["prompt"] == rows[0]["messages"] and r["answer"] == "0" for r in out)
    # 3 of 6 samples accepted, 1 of 2 prompts solved
    assert m["rsft/accepted_frac"] == 0.5 and m["rsft/prompts_solved_frac"] == 0.5 and m["rsft/rows"] == len(want)


def test_rsft_rounds_sample_from_the_previous_round(tmp_path):
    # odd_length accepts about half of the samples whatever the model: every round has rows to learn
    cfg = tiny_cfg("pref.online_rounds=2", "pref.online_prompts=8", "task.verifier=toy_verifiers:odd_length",
                   "pref.batch_size=4", "pref.rsft_keep=all")
    s = run_rsft(cfg, tmp_path)
    assert [r["round"] for r in s["rounds"]] == [0, 1, 2] and s["kind"] == "rsft"
    rows = [json.loads(x) for x in (tmp_path / "round_1" / "accepted.jsonl").read_text().splitlines()]
    assert len(rows) == s["rounds"][1]["rsft/rows"] > 0 and all(len(r["completion"]) % 2 == 1 for r in rows)
    import yaml

    assert yaml.safe_load((tmp_path / "round_2" / "config.yaml").read_text())["model"]["name"].endswith("round_1/model")
    # RUN/model, as every run ends with: the last round's model, what export, serve and the next stage read
    assert s["model"] == str(tmp_path / "model") and (tmp_path / "model").resolve() == (tmp_path / "round_2" /
                                                                                          "model").resolve()
    assert (tmp_path / "model" / "config.json").is_file()


def test_rsft_command_and_pipeline_stage(tmp_path):
    # `rlpost rsft` and a pipeline stage of kind rsft run the same rounds; a key rsft would ignore is refused
    from helpers import TINY_ROUNDS, cli
    common = [*TINY_ROUNDS, "pref.online_prompts=8", "task.verifier=toy_verifiers:odd_length", "pref.batch_size=4"]
    r = cli("rsft", *common, f"run.out_dir={tmp_path}", "run.name=one")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((tmp_path / "one" / "summary.json").read_text())["kind"] == "rsft"
    bad = cli("rsft", *common, "pref.beta=0.2")
    assert bad.returncode == 2 and "pref.beta: rlpost rsft would ignore it" in bad.stderr
    recipe = {"name": "p", "out_dir": str(tmp_path), "base": common, "stages": [{"name": "rs", "kind": "rsft"}]}
    import yaml

    (tmp_path / "p.yaml").write_text(yaml.safe_dump(recipe))
    r = cli("pipeline", str(tmp_path / "p.yaml"))
    assert r.returncode == 0, r.stderr[-2000:]
    rows = json.loads((tmp_path / "p" / "pipeline.json").read_text())
    assert [x["stage"] for x in rows] == ["start", "rs"] and "rejection-sampling SFT: 1 rounds" in rows[1]["other"]


def test_the_final_model_links_the_last_round_or_says_nothing_trained(tmp_path, capsys):
    from rlpost.recipes.online import final_model

    assert final_model(tmp_path, "tiny", "tiny") == "tiny" and not (tmp_path / "model").exists()
    assert "no round trained" in capsys.readouterr().err
    (tmp_path / "round_3" / "model").mkdir(parents=True)
    assert final_model(tmp_path, str(tmp_path / "round_3" / "model"), "tiny") == str(tmp_path / "model")
    assert (tmp_path / "model").is_symlink() and not (tmp_path / "model").readlink().is_absolute()
