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


@pytest.mark.parametrize("command", ["rsft", "dpo"])
def test_a_run_in_rounds_cut_short_goes_on_as_the_uninterrupted_one(tmp_path, monkeypatch, command):
    """rsft and online DPO keep RUN/rounds.json (recipes/round_state.py). Three crashes, each followed by
    `--resume`: during round 2's training (its rows are on disk and its folder checkpoints every step: it trains
    on from there), after round 2 trained but before its held-out measure (it is measured, not trained again),
    and while round 3 samples (it samples again, drawing the prompts and samples the uninterrupted run drew).
    The rounds' records, the metric lines and the final weights equal the uninterrupted run's."""
    from safetensors.torch import load_file

    from helpers import TINY_ROUNDS, at_call, at_train_step, cli, power_cut
    from rlpost.recipes import online, rsft

    args = [command, *TINY_ROUNDS, "pref.online_rounds=3", "pref.online_prompts=8", "pref.batch_size=2",
            "task.verifier=toy_verifiers:odd_length", "run.checkpoint_every=1", f"run.out_dir={tmp_path}",
            *(["pref.rsft_keep=all"] if command == "rsft" else [])]
    assert cli(*args, "run.name=whole").returncode == 0
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    first = len((whole / "round_1" / "metrics.jsonl").read_text().splitlines())  # round 1's optimizer steps

    from rlpost.roles.trainer import Trainer

    collect = "accepted_rows" if command == "rsft" else "onpolicy_pairs"
    module = rsft if command == "rsft" else online
    cuts = [(Trainer, "train_step", at_train_step(first + 2, power_cut)),  # round 2's second step
            (online, "model_accuracy", at_call(1, online.model_accuracy, power_cut)),  # the resume's first: round 2
            (module, collect, at_call(1, getattr(module, collect), power_cut))]  # the next resume's first: round 3
    for i, (where, name, patched) in enumerate(cuts):
        monkeypatch.setattr(where, name, patched)
        with pytest.raises(RuntimeError, match="power cut"):
            cli(*args, "run.name=cut") if i == 0 else cli(command, "--resume", str(cut))
        monkeypatch.undo()
        state = json.loads((cut / "rounds.json").read_text())
        assert (state["done"], state.get("pending", {}).get("round")) == [(1, 2), (1, 2), (2, None)][i], state
    r = cli(command, "--resume", str(cut))
    assert r.returncode == 0 and "resuming from the end of round 2" in r.stderr, r.stderr
    a, b = (json.loads((tmp_path / name / "summary.json").read_text()) for name in ("whole", "cut"))
    assert a["rounds"] == b["rounds"] and len(a["rounds"]) == 4
    assert all(r.get("skipped") is None for r in a["rounds"])  # every round trained: the test covers training
    lines = [[json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
             for name in ("whole", "cut")]
    assert [x["step"] for x in lines[1]] == [1, 2, 3] and lines[0] == lines[1]
    wa, wb = (load_file(tmp_path / name / "model" / "model.safetensors") for name in ("whole", "cut"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert cli(command, "--resume", str(cut)).returncode == 2  # finished: refused


def test_a_run_in_rounds_with_nothing_to_go_on_from_names_start_over(tmp_path):
    """No rounds.json (stopped while measuring its base model) or a damaged one: --resume refuses in one line naming
    --start-over, which trains the run again from round 1, the earlier round folders replaced."""
    from helpers import TINY_ROUNDS, cli

    args = ["rsft", *TINY_ROUNDS, "pref.online_prompts=8", "pref.batch_size=4",
            "task.verifier=toy_verifiers:odd_length", f"run.out_dir={tmp_path}", "run.name=r"]
    assert cli(*args).returncode == 0
    run = tmp_path / "r"
    before = (run / "round_1" / "accepted.jsonl").read_text()
    (run / "summary.json").unlink()
    state = json.loads((run / "rounds.json").read_text())
    for damage, said in ((lambda p: p.write_text(json.dumps({**state, "kind": "online_dpo"})),
                          "kind: the state of an online_dpo run, not of rsft"),
                         (lambda p: p.write_text("{}"), "rounds.json: kind: missing"),
                         (lambda p: p.unlink(), "nothing to go on from (it stopped while measuring its base model"),
                         (lambda p: p.write_text("{"), "rounds.json: not readable JSON")):
        damage(run / "rounds.json")
        r = cli("rsft", "--resume", str(run))
        assert r.returncode == 2 and said in r.stderr and "--start-over" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    (run / "round_1" / "stale").write_text("from the earlier start")
    r = cli("rsft", "--resume", str(run), "--start-over")
    assert r.returncode == 0 and "resuming from round 1 (--start-over)" in r.stderr, r.stderr
    assert not (run / "round_1" / "stale").exists() and (run / "round_1" / "accepted.jsonl").read_text() == before
    assert json.loads((run / "rounds.json").read_text())["done"] == 1


def test_a_pending_rounds_missing_rows_are_drawn_again_as_they_were(tmp_path, monkeypatch):
    """rounds.json says round 1 sampled, but its rows are gone: the resume samples it again from the RNG state before
    that draw, so the run ends as the uninterrupted one did (it drew other prompts when the state was the one after)."""
    from helpers import TINY_ROUNDS, cli, power_cut
    from rlpost.recipes import online

    args = ["rsft", *TINY_ROUNDS, "pref.online_rounds=2", "pref.online_prompts=8", "pref.batch_size=4",
            "task.verifier=toy_verifiers:odd_length", "pref.rsft_keep=all", f"run.out_dir={tmp_path}"]
    assert cli(*args, "run.name=whole").returncode == 0
    with monkeypatch.context() as m:
        m.setattr(online, "train_offline", lambda *a, **kw: power_cut())  # round 1's training
        with pytest.raises(RuntimeError, match="power cut"):
            cli(*args, "run.name=cut")
    (tmp_path / "cut" / "round_1" / "accepted.jsonl").unlink()
    r = cli("rsft", "--resume", str(tmp_path / "cut"))
    assert r.returncode == 0 and "accepted.jsonl: missing, though rounds.json says round 1 sampled" in r.stderr
    a, b = (json.loads((tmp_path / name / "summary.json").read_text())["rounds"] for name in ("whole", "cut"))
    assert a == b
