"""Nothing lost (issue 43): every command that writes writes only into a new or empty folder or one
it owns, rlpost export never touches the run it reads, a resume checks everything before writing
anything, and a metrics file damaged or deleted since loses no step. One tiny run is trained once
and copied for each case; every case compares the folder byte for byte before and after."""

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers import TINY, cli

from rlpost.model import checkpoint

ARGS = [*TINY, "run.steps=3", "run.checkpoint_every=1", "run.keep_checkpoints=2",
        "task.verifier=toy_verifiers:odd_length", "task.verifier_workers=1"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("trained")
    r = cli("train", *ARGS, f"run.out_dir={out}", "run.name=run")
    assert r.returncode == 0, r.stderr[-2000:]
    return out / "run"


@pytest.fixture
def run(trained, tmp_path):
    return Path(shutil.copytree(trained, tmp_path / "run"))


def snapshot(folder: Path) -> dict:
    """Every file's bytes (by hash), but the lock's pid: what 'nothing lost' compares."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".lock"}


def refused(args, *named) -> str:
    r = cli(*args)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2 and "Traceback" not in r.stderr and last.startswith("rlpost: error: "), r.stderr[-2000:]
    assert all(n in last for n in named), last
    return last


def test_export_never_touches_the_run_and_writes_only_where_it_may(run, tmp_path):
    before = snapshot(run)
    refused(["export", str(run), "--out", str(run)], "inside the run folder it exports from")
    refused(["export", str(run), "--out", str(run / "checkpoints")], "inside the run folder")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "config.json").write_text("mine")
    refused(["export", str(run), "--out", str(theirs)], "holds files rlpost did not write (config.json)")
    assert (theirs / "config.json").read_text() == "mine"
    other = Path(shutil.copytree(run, tmp_path / "other"))
    refused(["export", str(run), "--out", str(other)], "is an rlpost run folder, not an export folder")
    assert cli("export", str(run), "--step", "2").returncode == 0  # the default: beside the run
    assert (tmp_path / "run-model_step_2" / "model.safetensors").exists()
    assert cli("export", str(run), "--step", "2").returncode == 0  # its own earlier export may be replaced, not others
    (tmp_path / "run-model_step_2" / "README.md").write_text("my notes")
    refused(["export", str(run), "--step", "2"], "holds files rlpost export did not write (README.md)")
    assert snapshot(run) == before and snapshot(other) == snapshot(run)


def test_eval_and_report_replace_only_a_file_they_wrote(run):
    before = snapshot(run)
    refused(["eval", str(run), "--n", "2", "--out", str(run / "metrics.jsonl"), "--overwrite"],
            "not a file rlpost eval wrote")
    refused(["report", str(run), "--out", str(run / "summary.json")], "not a file rlpost report wrote")
    refused(["report", str(run), "--out", str(run / "samples")], "is a folder")
    assert snapshot(run) == before


@pytest.mark.parametrize("damage", ["empty", "not YAML", "a list", "an invalid value"])
def test_a_damaged_config_is_refused_never_rewritten(run, damage):
    text = {"empty": "", "not YAML": "run: [1, 2\n", "a list": "- 1\n",
            "an invalid value": (run / "config.yaml").read_text().replace("steps: 3", "steps: -3")}[damage]
    (run / "config.yaml").write_text(text)
    before = snapshot(run)
    refused(["train", "--resume", str(run), "run.steps=4", "trainer.lr=2e-3"], "config.yaml")
    assert snapshot(run) == before and not list(run.glob("config.resume-*"))


@pytest.mark.parametrize("path, make", [("checkpoints/.latest.tmp", "folder"), ("metrics.jsonl", "folder"),
                                        ("samples", "file"), ("model", "file")])
def test_a_resume_checks_what_it_will_write_before_writing_anything(run, path, make):
    target = run / path
    shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
    target.mkdir() if make == "folder" else target.write_text("x")
    before = snapshot(run)
    refused(["train", "--resume", str(run), "run.steps=4", "trainer.lr=2e-3"], str(target),
            f"a {make} where the run writes")
    assert snapshot(run) == before and not list(run.glob("config.resume-*"))


def test_a_folder_that_is_no_run_is_refused_and_left_as_it_was(tmp_path):
    folder = tmp_path / "x"
    folder.mkdir()
    (folder / "metrics.jsonl").write_text('{"step": 1}\n')
    refused(["train", "--resume", str(folder), "trainer.lr=2e-3"], "no config.yaml there")
    assert sorted(p.name for p in folder.iterdir()) == ["metrics.jsonl"]


@pytest.mark.parametrize("damage", ["a line damaged in the middle", "deleted"])
def test_a_damaged_or_deleted_metrics_file_loses_no_step_on_resume(run, damage):
    metrics = run / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    if damage == "deleted":
        metrics.unlink()
    else:
        lines[1] = lines[1][:25]
        metrics.write_text("\n".join(lines) + "\n")
        (run / "checkpoints" / "step_junk").mkdir()  # and something that is no checkpoint: ignored, kept
        (run / "checkpoints" / "step_junk" / "notes").write_text("mine")
    r = cli("train", "--resume", str(run), "run.steps=4")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "rebuilt steps 1-3 from step_000003's copy" in r.stderr
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [1, 2, 3, 4]
    if damage != "deleted":  # the damaged file is kept beside it, as it was; the stray folder too
        assert (run / "metrics.jsonl.damaged-1").read_text() == "\n".join(lines) + "\n"
        assert ("step_junk: not a checkpoint" in r.stderr
                and (run / "checkpoints" / "step_junk" / "notes").read_text() == "mine")
        assert [p.name for p in checkpoint.candidates(run)] == ["step_000004", "step_000003"]


def test_a_checkpoint_of_another_algorithm_is_refused_by_name(run):
    ckpt = run / "checkpoints" / "step_000003"
    state = torch.load(ckpt / "state.pt", weights_only=False)
    torch.save({**state, "algo_name": "ppo"}, ckpt / "state.pt")
    files = {n: {"bytes": (ckpt / n).stat().st_size, "sha256": checkpoint.sha256(ckpt / n)}
             for n in ("model.safetensors", "trainer.pt", "state.pt", "metrics.jsonl")}
    (ckpt / "manifest.json").write_text(json.dumps({"step": 3, "files": files}))  # intact: only its kind differs
    before = snapshot(run)
    refused(["train", "--resume", str(run), "run.steps=4", "trainer.lr=2e-3"], "a checkpoint of a ppo run",
            "this run is grpo")
    assert snapshot(run) == before


def test_a_damaged_held_out_dump_is_named_before_a_resume_trains(run):
    # samples/eval_before.jsonl is read back at the end of the run (a mix's per-family 'before'):
    # damaged, it was a traceback after the whole resumed training; now it is refused at the start
    dump = run / "samples" / "eval_before.jsonl"
    lines = dump.read_text().splitlines()
    dump.write_text("\n".join([lines[0], '{"correct": "yes"}', *lines[1:]]) + "\n")
    before = snapshot(run)
    refused(["train", "--resume", str(run), "run.steps=4", "trainer.lr=2e-3"],
            "eval_before.jsonl:2: correct: expected true or false")
    assert snapshot(run) == before and not list(run.glob("config.resume-*"))
