"""The fault suite (issue 24): every fault ends in one clear line, no run data is lost or
poisoned, and no process is left behind. Runs in this process through ``cli.main`` where a real
process boundary is not the point (faster: no Python or torch start-up per run); a real SIGKILL
is tests/test_resume.py's."""

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from helpers import ROOT, TINY, TINY_DATA, TINY_ROWS, remount_read_only, tmpfs, verifier_workers
from safetensors.torch import load_file

from rlpost import cli, config
from rlpost.model import checkpoint
from rlpost.observe import jsonl
from rlpost.recipes import resume, rl, sampling_stage
from rlpost.types import folders

ARGS = [*TINY, "task.verifier=toy_verifiers:odd_length", "task.verifier_workers=1"]


@pytest.fixture(autouse=True)
def toy_modules_importable(monkeypatch):
    """The verifier workers find tests/toy_verifiers.py through PYTHONPATH, as a user's module."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))


def main(*args, capsys=None):
    code = cli.main(list(args))
    return code, capsys.readouterr().err if capsys else ""


def test_sigterm_finishes_the_step_saves_it_and_stops_every_child(tmp_path, capsys, monkeypatch):
    train = rl.train
    term_after_1 = lambda s: os.kill(os.getpid(), signal.SIGTERM) if s == 1 else None
    monkeypatch.setattr(rl, "train", lambda *a, **k: train(*a, **k, on_step_end=term_after_1))
    code, err = main("train", *ARGS, "run.steps=4", f"run.out_dir={tmp_path}", "run.name=t", capsys=capsys)
    # the signal came after step 1's checkpoint decision: step 2 ran, was saved, and the run stopped
    assert code == 128 + signal.SIGTERM, err
    assert "stopped by SIGTERM after step 2, whose checkpoint is saved" in err and "Traceback" not in err
    assert [p.name for p in checkpoint.candidates(tmp_path / "t")] == ["step_000002"]
    assert verifier_workers() == []
    monkeypatch.setattr(rl, "train", train)
    code, err = main("train", "--resume", str(tmp_path / "t"), capsys=capsys)
    assert code == 0, err
    assert [r["step"] for r in jsonl.read_lines(tmp_path / "t" / "metrics.jsonl")] == [1, 2, 3, 4]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP, signal.SIGQUIT])
def test_a_stop_signal_during_start_up_is_one_line_and_leaves_no_folder(tmp_path, capsys, monkeypatch, sig):
    def interrupted(*a, **k):
        # inside train(), after the folder is claimed; to the main thread, and waited for there:
        # sent to the process, it may land on another thread (left by an earlier test), and the
        # main thread could run on past this function before Python handles it
        signal.pthread_kill(threading.main_thread().ident, sig)
        time.sleep(5)  # the handler's exception ends the sleep
    monkeypatch.setattr(sampling_stage, "make_stream", interrupted)  # the stream is made as train() builds its stage
    code, err = main("train", *ARGS, f"run.out_dir={tmp_path}", "run.name=c", capsys=capsys)
    last = err.strip().splitlines()[-1]
    assert code == 128 + sig and "Traceback" not in err and last.startswith(f"rlpost: stopped by {sig.name}")
    assert not (tmp_path / "c").exists()


def test_sighup_stops_like_sigterm_sigusr1_says_where_and_sigquit_stops_at_once(tmp_path, capsys, monkeypatch):
    train, pids = rl.train, tmp_path / "daemons"
    monkeypatch.setenv("RLPOST_TEST_DAEMON_PIDS", str(pids))  # the reward function leaves a setsid() daemon per call
    send = {1: signal.SIGUSR1, 2: signal.SIGHUP}
    hook = lambda s: os.kill(os.getpid(), send[s]) if s in send else None
    hooked = lambda *a, **k: train(*a, **k, on_step_end=hook)  # noqa: E731
    monkeypatch.setattr(rl, "train", hooked)
    monkeypatch.setattr(resume, "train", hooked)  # --resume's own import of it
    code, err = main("train", *ARGS, "task.reward_funcs=toy_verifiers:starts_a_daemon", "run.steps=5",
                     f"run.out_dir={tmp_path}", "run.name=h", capsys=capsys)
    assert code == 128 + signal.SIGHUP and "stopped by SIGHUP after step 3, whose checkpoint is saved" in err
    assert "SIGUSR1: step 1 of 5 running" in err and "Traceback" not in err
    assert [p.name for p in checkpoint.candidates(tmp_path / "h")] == ["step_000003"]
    daemons = [int(p) for p in pids.read_text().split()]
    assert len(daemons) >= 16 and not [p for p in daemons if running(p)] and verifier_workers() == []
    send.clear()
    send[4] = signal.SIGQUIT  # after step 4's checkpoint: the stop says so
    code, err = main("train", "--resume", str(tmp_path / "h"), capsys=capsys)
    assert code == 128 + signal.SIGQUIT and "stopped at once by SIGQUIT after step 4" in err
    assert [r["step"] for r in jsonl.read_lines(tmp_path / "h" / "metrics.jsonl")] == [1, 2, 3, 4]


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def test_a_reward_function_failing_on_the_first_batch_stops_before_any_update(tmp_path, capsys):
    code, err = main("train", *ARGS, "task.reward_funcs=toy_verifiers:raises", f"run.out_dir={tmp_path}", "run.name=r",
                     capsys=capsys)
    assert code == 1
    assert err.strip().splitlines()[-1].startswith(
        "rlpost: error: reward function raises failed on 16 of 16 completions at step 1")
    assert err.count("Traceback (most recent call last)") == 1  # the first failure, once, with its traceback
    run = tmp_path / "r"
    assert not checkpoint.candidates(run) and "RuntimeError: broken verifier" in (run / "verifier.log").read_text()
    assert verifier_workers() == []


@pytest.mark.parametrize("fn,said", [("always_nan", "returned nan, expected a finite number"),
                                     ("past_float32", "returned 1e+39, expected a finite number in float32")])
def test_a_reward_function_returning_nan_or_past_float32_is_one_line(tmp_path, capsys, fn, said):
    # a value check, not a crash: the reward function's line, no traceback of rlpost's (nor any), and the
    # guard's stop (every completion of the first batch failed)
    code, err = main("train", *ARGS, f"task.reward_funcs=toy_verifiers:{fn}", f"run.out_dir={tmp_path}",
                     "run.name=n", capsys=capsys)
    assert code == 1 and "Traceback" not in err, err
    assert f"reward function toy_verifiers:{fn} failed (the first error; " in err and said in err
    assert err.strip().splitlines()[-1].startswith(f"rlpost: error: reward function {fn} failed on 16 of 16")
    assert verifier_workers() == []


def test_reward_failures_are_counted_and_shown_by_doctor_and_the_report(tmp_path, capsys):
    data = tmp_path / "rows.jsonl"  # with two malformed rows, skipped and counted in the summary
    data.write_text("".join(json.dumps({"prompt": str(i), "answer": str(i)}) + "\n" for i in range(30))
                    + '{"answer": "1"}\n{"prompt": "", "answer": "2"}\n')
    code, err = main("train", *ARGS, "task.reward_funcs=toy_verifiers:fails_on_multiples_of_three", "task.name=dataset",
                     f"task.data={data}", "task.on_bad_row=skip", "task.n_heldout=4",
                     "task.max_reward_error_frac=1", f"run.out_dir={tmp_path}", "run.name=d", capsys=capsys)
    assert code == 0, err
    run = tmp_path / "d"
    assert (json.loads((run / "summary.json").read_text())["skipped_rows"] == 2
            and "skipped 2 data rows, malformed or too long for the context" in err)
    rows = jsonl.read_lines(run / "metrics.jsonl")
    errors = sum(r["verifier/fails_on_multiples_of_three/errors"] for r in rows)
    assert errors > 0 and all(r["verifier/fails_on_multiples_of_three/calls"] == 16 for r in rows)
    capsys.readouterr()
    code = cli.main(["doctor", str(run)])
    text = capsys.readouterr().out
    assert code == 0 and f"reward function fails_on_multiples_of_three failed on {errors} of 32 completions" in text
    assert "reward_errors" in (run / "report.html").read_text()


def test_nonfinite_losses_skip_the_update_and_n_in_a_row_stop_before_saving(tmp_path):
    from rlpost import build

    calls = []

    def nan_loss_from_step_2(*a, **k):
        roles = build.build_roles(*a, **k)
        loss = roles.algo.loss

        def poisoned(logp, batch, **extra):
            value, metrics = loss(logp, batch, **extra)
            return (value * float("nan") if calls else value), metrics
        roles.algo.loss = poisoned
        return roles

    cfg = config.load(None, [*ARGS, "run.steps=5", "run.checkpoint_every=1", "run.keep_checkpoints=5",
                             "trainer.max_nonfinite_steps=2"])
    with pytest.raises(Exception) as e:
        rl.train(cfg, tmp_path, make_roles=nan_loss_from_step_2, on_step_end=calls.append)
    assert "2 training steps in a row with a non-finite loss or gradient (the last at step 3)" in str(e.value)
    # step 2's update was skipped: its checkpoint holds step 1's weights; step 3 was not saved
    assert [p.name for p in checkpoint.candidates(tmp_path)] == ["step_000002", "step_000001"]
    a, b = (load_file(tmp_path / "checkpoints" / f"step_00000{i}" / "model.safetensors") for i in (1, 2))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert jsonl.read_lines(tmp_path / "metrics.jsonl")[1]["actor/nonfinite_steps"] == 1


def test_resume_validates_everything_before_writing_anything(tmp_path, capsys):
    run = tmp_path / "v"
    code, err = main("train", *ARGS, "run.steps=3", "run.checkpoint_every=1", "run.keep_checkpoints=2",
                     f"run.out_dir={tmp_path}", "run.name=v", capsys=capsys)
    assert code == 0, err
    for change, key in (("algo.name=ppo", "algo.name"), ("model.lora_r=8", "model.lora_r"),
                        ("rollout.group_size=2", "rollout.group_size")):
        code, err = main("train", "--resume", str(run), change, capsys=capsys)
        assert (code == 2 and err.strip().startswith(f"rlpost: error: {key}: cannot change on --resume")
                and "\n" not in err.strip())
    code, err = main("train", "--resume", str(run), "rollout.group_size=2", "rollout.temperature=0.5", capsys=capsys)
    assert code == 2 and "(and rollout.temperature cannot either)" in err and len(err.strip().splitlines()) == 1, err
    code, err = main("train", "--resume", str(run), "run.steps=2", capsys=capsys)  # fewer than it has taken
    assert code == 2 and "run.steps=2: " in err and "is at step 3 already" in err and "run.steps=3" in err, err
    assert sorted(p.name for p in run.glob("config*")) == ["config.yaml"]
    # the newest checkpoint corrupt: a line, then the one before; a changed lr is applied and recorded
    (run / "checkpoints" / "step_000003" / "model.safetensors").write_bytes(b"torn")
    code, err = main("train", "--resume", str(run), "run.steps=4", "trainer.lr=2e-3", capsys=capsys)
    assert code == 0, err
    assert "step_000003 is corrupt: model.safetensors has 4 bytes" in err and "falling back to step_000002" in err
    rows = jsonl.read_lines(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and [r["actor/lr"] for r in rows] == [1e-3, 1e-3, 2e-3, 2e-3]
    assert config.load(run / "config.yaml").trainer.lr == 1e-3
    assert (config.load(run / "config.resume-1.yaml").trainer.lr == 2e-3
            and config.run_config_path(run).name == "config.resume-1.yaml")


def test_resume_without_a_checkpoint_refuses_unless_asked_to_start_over(tmp_path, capsys):
    run = tmp_path / "n"
    run.mkdir()
    config.save(config.load(None, ARGS), run / "config.yaml")
    (run / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n')
    code, err = main("train", "--resume", str(run), capsys=capsys)
    assert code == 2 and "no intact checkpoint to resume from; add --start-over" in err
    assert len(jsonl.read_lines(run / "metrics.jsonl")) == 1  # untouched
    code, err = main("train", "--resume", str(run), "--start-over", capsys=capsys)
    assert code == 0, err
    assert [r["step"] for r in jsonl.read_lines(run / "metrics.jsonl")] == [1, 2]


def test_disk_full_mid_run_is_one_line_and_the_run_survives(tmp_path, capsys):
    with tmpfs(tmp_path / "disk", "1400k") as disk:  # room for one checkpoint of the tiny model, not two
        code, err = main("train", *ARGS, "run.steps=3", "run.checkpoint_every=1", "run.keep_checkpoints=3",
                         f"run.out_dir={disk}", "run.name=f", capsys=capsys)
        assert code == 1 and "Traceback" not in err
        assert "No space left on device" in err.strip().splitlines()[-1] and str(disk / "f") in err
        run = disk / "f"
        assert checkpoint.newest_intact(run) is not None  # the checkpoint before is whole
        steps = [r["step"] for r in jsonl.read_lines(run / "metrics.jsonl")]
        assert steps == list(range(1, len(steps) + 1))
        assert cli.main(["doctor", str(run)]) == 0


def test_a_read_only_run_folder_is_one_line(tmp_path, capsys):
    with tmpfs(tmp_path / "disk", "4m") as disk:
        code, err = main("train", *ARGS, "run.steps=1", f"run.out_dir={disk}", "run.name=ro", capsys=capsys)
        assert code == 0, err
        remount_read_only(disk)
        code, err = main("train", "--resume", str(disk / "ro"), "run.steps=2", capsys=capsys)
        assert code == 2 and "cannot lock the run folder (Read-only file system)" in err and "Traceback" not in err
        code, err = main("eval", str(disk / "ro"), "--n", "2", capsys=capsys)
        assert code == 1 and "Read-only file system" in err.strip().splitlines()[-1] and "Traceback" not in err


def test_config_errors_come_before_torch_is_imported():
    code = ("import sys\nfrom rlpost.cli import main\nrc = main(['train', 'rollout.group_size=0'])\n"
            "print(rc, 'torch' in sys.modules)")
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert r.stdout.split() == ["2", "False"], r.stderr


def bad_inputs(tmp: Path) -> dict:
    """Each bad input of the campaign: (command-line arguments, what its one line must say)."""
    (tmp / "latin1.yaml").write_bytes("run:\n  name: caf\xe9\n".encode("latin-1"))
    (tmp / "twice.yaml").write_text("task:\n  n_train: 10\nrun:\n  steps: 1\ntask:\n  n_heldout: 5\n")
    (tmp / "a_file").write_text("")
    (tmp / "latin1.jsonl").write_bytes(b'{"prompt": "1+1", "answer": "2"}\n{"prompt": "caf\xe9", "answer": "1"}\n')
    (tmp / "bad.parquet").write_bytes(b"PAR1 this is not parquet")
    (tmp / "not_a_dataset").mkdir()
    (tmp / "not_a_dataset" / "x.txt").write_text("hello")
    from rlpost.model.load import load_policy, save_model
    tiny = load_policy("tiny")
    save_model(tiny.model, tiny.tokenizer, tmp / "truncated")
    weights = tmp / "truncated" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    save_model(tiny.model, tiny.tokenizer, tmp / "no_tokenizer")
    for f in (tmp / "no_tokenizer").glob("*token*"):
        f.unlink()
    data = ["task.name=dataset", "task.n_heldout=1"]
    os.mkfifo(tmp / "fifo.jsonl")
    (tmp / "zero.jsonl").symlink_to("/dev/zero")
    rows = "".join(json.dumps({"prompt": str(i), "answer": str(i)}) + "\n" for i in range(20))
    # 10 MB: the same, slower
    (tmp / "huge_prompt.jsonl").write_text(rows + json.dumps({"prompt": "7 " * 200_000, "answer": "7"}) + "\n")
    return {
        "seed past what the libraries take": (["run.seed=18446744073709551616"],
                                              "run.seed: expected an integer >= 0 and <= 4294967295"),
        "threads past the cores": (["run.threads=100000"], "run.threads: expected at most"),
        "a LoRA target the model lacks": (["model.lora_r=4", "model.lora_targets=q_proj,no_such_proj"],
                                          "model.lora_targets: model tiny has no module named 'no_such_proj'"),
        "a FIFO as the data": ([*data, f"task.data={tmp / 'fifo.jsonl'}"], "fifo.jsonl is a FIFO"),
        "/dev/zero as the data": ([*data, f"task.data={tmp / 'zero.jsonl'}"], "zero.jsonl is a device"),
        "a huge prompt": ([*data, f"task.data={tmp / 'huge_prompt.jsonl'}"],
                          "the prompt is longer than the model's context"),
        "a 100 KB value": (["task.verifier=" + "m" * 100_000 + ":f"], "characters]..."),
        "'=5' as an override": (["=5"], "override '=5': no key before '='"),
        "non-UTF-8 recipe": ([str(tmp / "latin1.yaml")], "latin1.yaml line 2: not UTF-8 text (byte 0xe9)"),
        "recipe is a folder": ([str(tmp)], "is a folder, expected a YAML file"),
        "duplicated section": ([str(tmp / "twice.yaml")], "line 5: not valid YAML (duplicate key 'task'"),
        "run.out_dir is a file": ([f"run.out_dir={tmp / 'a_file'}"], "run.out_dir: "),
        "misspelt task.reward_funcs": (["task.reward_funcs=toy_verifiers:no_such_fn"],
                                       "task.reward_funcs: cannot import 'toy_verifiers:no_such_fn' (AttributeError"),
        "huge group_size": (["rollout.group_size=100000"], "rollout.group_size: expected an integer >= 1 and <= 1024"),
        "huge max_new_tokens": (["rollout.max_new_tokens=10000000"], "rollout.max_new_tokens: expected an integer"),
        "infinite lr": (["trainer.lr=inf"], "trainer.lr: expected a finite number > 0 and <= 1"),
        "non-UTF-8 JSONL": ([*data, f"task.data={tmp / 'latin1.jsonl'}"], "latin1.jsonl:2: not UTF-8 text (byte 0xe9"),
        "corrupt parquet": ([*data, f"task.data={tmp / 'bad.parquet'}"], "bad.parquet: not a readable parquet file"),
        "folder that is no dataset": ([*data, f"task.data={tmp / 'not_a_dataset'}"],
                                      "not_a_dataset: a folder, but not one saved by `datasets`"),
        "truncated model weights": ([f"model.name={tmp / 'truncated'}"], "its model does not load"),
        "no tokenizer": ([f"model.name={tmp / 'no_tokenizer'}"], "its tokenizer does not load"),
    }


def test_every_bad_input_is_one_line_naming_it_exit_2_and_no_folder(tmp_path, capsys):
    runs = tmp_path / "runs"
    for name, (args, expected) in bad_inputs(tmp_path).items():
        capsys.readouterr()
        code = cli.main(["train", *ARGS, f"run.out_dir={runs}", "run.name=bad", *args])  # args win: they come last
        err = capsys.readouterr().err
        last = err.strip().splitlines()[-1]
        assert code == 2 and "Traceback" not in err, (name, err[-2000:])
        assert last.startswith("rlpost: error: ") and expected in last and len(last) < 1200, (name, last[:2000])
        assert not (runs / "bad").exists(), name


def test_sft_refuses_an_existing_run_and_a_failed_start_leaves_nothing(tmp_path, capsys):
    code, err = main("sft", *TINY_DATA, "pref.data=/no/such.jsonl", f"run.out_dir={tmp_path}", "run.name=s",
                     capsys=capsys)
    assert code == 2 and "data: file not found: /no/such.jsonl" in err and not (tmp_path / "s").exists()
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "summary.json").write_text("{}")
    code, err = main("sft", *TINY_ROWS, f"run.out_dir={tmp_path}", "run.name=s", capsys=capsys)  # not rlpost's folder
    assert code == 2 and "holds files rlpost did not write (summary.json)" in err
    folders.mark(tmp_path / "s", "run")  # rlpost's, and a finished run
    code, err = main("sft", *TINY_ROWS, f"run.out_dir={tmp_path}", "run.name=s", capsys=capsys)
    assert code == 2 and "already holds a run" in err and (tmp_path / "s" / "summary.json").read_text() == "{}"


@pytest.mark.slow  # a second rlpost process (prlimit): ~6 s of Python, torch and transformers start-up
def test_a_batch_too_big_for_memory_is_one_line(tmp_path):
    # Under a 6 GB address-space limit (so that the allocation fails here, whatever the machine).
    import subprocess
    import sys
    args = [*TINY, "rollout.group_size=1024", "rollout.prompts_per_step=4096", "run.eval_n=1",
            "trainer.mini_batch_size=0", "trainer.micro_batch_size=0", "task.verifier=toy_verifiers:odd_length",
            f"run.out_dir={tmp_path}", "run.name=oom"]
    r = subprocess.run(["prlimit", f"--as={6 << 30}", sys.executable, "-m", "rlpost.cli", "train", *args],
                       capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                           [str(ROOT / "tests"), *sys.path])}, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1].startswith("rlpost: error: out of memory")


class Killed(BaseException):
    """What a SIGKILL leaves: no handler and no `except Exception` runs (finally blocks do, which
    only close the roles' processes)."""


def kill_on(calls: int):
    """A stand-in for a function that kills the run on its `calls`-th call."""
    count = []

    def hit(*a, **k):
        count.append(1)
        if len(count) == calls:
            raise Killed
        return hit.real(*a, **k)
    return hit


# (what to replace in model/checkpoint.py, on which call): the points of step 3's checkpoint write
KILL_POINTS = {
    "trainer.pt being written": ("checkpoint.torch.save", 5),  # 2 calls per checkpoint
    "after trainer.pt, before the weights": ("checkpoint.save_file", 3),  # 1 call per checkpoint
    "a file being hashed (on the second thread)": ("checkpoint.sha256", 9),  # 4 calls per checkpoint
    "all files written and hashed, no manifest yet": ("checkpoint.write_atomic", 5),  # manifest, latest
    "renamed into place, latest not updated": ("checkpoint._fsync_dir", 3),
    "latest updated, the old one not yet deleted": ("checkpoint.shutil.rmtree", 5),  # tmp clean-up + rotation
}


@pytest.mark.slow
def test_a_kill_at_any_point_of_a_checkpoint_write_resumes_exactly(tmp_path, monkeypatch):
    cfg = config.load(None, [*ARGS, "run.steps=4", "run.checkpoint_every=1", "run.keep_checkpoints=1"])
    rl.train(cfg, tmp_path / "full")
    want = load_file(tmp_path / "full" / "checkpoints" / "step_000004" / "model.safetensors")
    for name, (target, call) in KILL_POINTS.items():
        run = tmp_path / name.replace(" ", "_").replace(",", "")
        module, attr = target.rsplit(".", 1)
        owner = {"checkpoint": checkpoint, "checkpoint.torch": checkpoint.torch,
                 "checkpoint.shutil": checkpoint.shutil}[module]
        hit = kill_on(call)
        hit.real = getattr(owner, attr)
        with monkeypatch.context() as m:
            m.setattr(owner, attr, hit)
            with pytest.raises(Killed):
                rl.train(cfg, run)
        assert verifier_workers() == [], name
        rl.train(cfg, run, resume=True)
        got = load_file(run / "checkpoints" / "step_000004" / "model.safetensors")
        assert all(torch.equal(want[k], got[k]) for k in want), name
        assert [r["step"] for r in jsonl.read_lines(run / "metrics.jsonl")] == [1, 2, 3, 4], name
        assert not list((run / "checkpoints").glob(".tmp*")), name


@pytest.mark.slow
def test_two_runs_started_together_with_one_name_one_runs_the_other_refuses(tmp_path):
    import subprocess
    import sys
    args = [sys.executable, "-m", "rlpost.cli", "train", *ARGS, f"run.out_dir={tmp_path}", "run.name=same"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), *sys.path])}
    procs = [subprocess.Popen(args, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT) for _ in range(2)]
    results = sorted((p.wait(timeout=600), p.stderr.read()) for p in procs)
    (ok, _), (refused, err) = results
    assert ok == 0 and refused == 2, results
    assert ("another rlpost command" in err or "already holds a run" in err) and "Traceback" not in err
    assert [r["step"] for r in jsonl.read_lines(tmp_path / "same" / "metrics.jsonl")] == [1, 2]


# --- issue 51, round three: a full disk names its file; a signal a library wrapped; eval's race ---


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished tiny run (its checkpoint, model, report), for the commands that read one."""
    out = tmp_path_factory.mktemp("finished")
    assert cli.main(["train", *TINY, "run.steps=1", f"run.out_dir={out}", "run.name=run"]) == 0
    return out / "run"


def full_disk(disk: Path) -> None:
    """Fill the tmpfs at ``disk`` up to its last byte."""
    with open(disk / "filler", "ab", buffering=0) as f:  # unbuffered: nothing left to flush when it is closed
        try:
            while f.write(b"\0" * 4096):
                pass
        except OSError:
            pass


def test_a_full_disk_names_the_file_each_writer_was_writing(tmp_path, capsys, finished_run):
    import shutil

    from rlpost.model.load import load_policy, save_model
    from rlpost.types.errors import RunError

    with tmpfs(tmp_path / "disk", "4m") as disk:
        run = disk / "run"
        shutil.copytree(finished_run, run, ignore=shutil.ignore_patterns("report.html", "model"))
        full_disk(disk)
        for args, named in ((["report", str(run)], run / "report.html"),
                            (["report", str(run), "--out", str(disk / "r.html")], disk / "r.html"),
                            (["export", str(run), "--out", str(disk / "x")], disk / "x"),
                            (["eval", str(run), "--n", "2"], run / "eval_samples.jsonl")):
            code, err = main(*args, capsys=capsys)
            last = err.strip().splitlines()[-1]
            assert code == 1 and "Traceback" not in err, (args, err[-2000:])
            assert last == f"rlpost: error: cannot write {named}: No space left on device", (args, last)
        with pytest.raises(RunError, match=f"^cannot write {disk / 'note'}: No space left on device$"):
            checkpoint.write_atomic(disk / "note", "x" * 100_000)
        (disk / "filler").unlink()  # room for part of the model folder, not all of it: a writer's own error
        full_disk(disk)
        os.truncate(disk / "filler", os.path.getsize(disk / "filler") - 64_000)
        tiny = load_policy("tiny")
        with pytest.raises(RunError, match=f"^cannot write {disk / 'model'}: No space left on device"):
            save_model(tiny.model, tiny.tokenizer, disk / "model")
        assert sorted(p.name for p in disk.iterdir()) == ["filler", "run"]  # no half folder, no temporary one


def test_a_second_sigterm_inside_a_checkpoint_write_stops_at_once_leaving_no_half_checkpoint(tmp_path, capsys,
                                                                                          monkeypatch):
    import io

    train, save, armed = rl.train, checkpoint.torch.save, []

    def first_term(step):
        if step == 1:  # after step 1's checkpoint: step 2 runs, and its checkpoint is the next write
            os.kill(os.getpid(), signal.SIGTERM)
            armed.append(True)

    class Signalled(io.RawIOBase):
        """The file torch.save writes through: the second SIGTERM lands in its third write, inside the
        zip writer, which turns the handler's exception into its RuntimeError ('unexpected pos')."""

        def __init__(self, f):
            self.f, self.writes = f, 0

        def writable(self):
            return True

        def write(self, b):
            self.writes += 1
            if self.writes == 3:
                signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)
            return self.f.write(b)

    monkeypatch.setattr(rl, "train", lambda *a, **k: train(*a, **k, on_step_end=first_term))
    monkeypatch.setattr(checkpoint.torch, "save", lambda obj, f, *a, **k: save(obj, Signalled(f) if armed else f))
    code, err = main("train", *ARGS, "run.steps=4", "run.checkpoint_every=1", f"run.out_dir={tmp_path}", "run.name=t",
                     capsys=capsys)
    last = err.strip().splitlines()[-1]
    assert code == 128 + signal.SIGTERM and "Traceback" not in err and "RuntimeError" not in err, err[-2000:]
    assert last.startswith("rlpost: stopped by a second SIGTERM during step 2; that step was not saved")
    assert f"(`rlpost train --resume {tmp_path / 't'}` continues from the last checkpoint)" in last  # step 1's is kept
    assert sorted(p.name for p in (tmp_path / "t" / "checkpoints").iterdir()) == ["latest", "step_000001"]
    assert checkpoint.newest_intact(tmp_path / "t").name == "step_000001"


@pytest.mark.parametrize("wrapped", ["plain", "ModuleNotFoundError", "RuntimeError"])
def test_sigint_during_start_up_even_inside_a_lazy_import_is_one_line_with_no_resume(tmp_path, capsys, monkeypatch,
                                                                                  wrapped):
    def interrupted(*a, **k):
        try:
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            time.sleep(5)  # the handler's exception ends the sleep
        except KeyboardInterrupt as e:
            if wrapped == "ModuleNotFoundError":  # transformers' _LazyModule.__getattr__: `raise ... from e`
                raise ModuleNotFoundError("Could not import module 'AutoTokenizer'. Are this object's requirements "
                                          "defined correctly?") from e
            if wrapped == "RuntimeError":  # raised while handling it: the interrupt is the __context__ only
                raise RuntimeError("Failed to import transformers.models.auto")
            raise
    monkeypatch.setattr(sampling_stage, "make_stream", interrupted)  # the stream is made as train() builds its stage
    code, err = main("train", *ARGS, f"run.out_dir={tmp_path}", "run.name=c", capsys=capsys)
    last = err.strip().splitlines()[-1]
    assert code == 130 and "Traceback" not in err and wrapped not in err.replace("plain", ""), err[-2000:]
    assert last == "rlpost: stopped by SIGINT; nothing was saved, and no run folder is left"
    assert not (tmp_path / "c").exists()


def test_two_evals_of_one_run_at_once_each_keep_their_samples(finished_run, capsys, monkeypatch):
    from rlpost.recipes import evaluate

    together = threading.Barrier(2, timeout=60)

    def heldout_accuracy(cfg, weights, n, samples=0, ks=(), dump=None):
        together.wait()  # both have chosen the file name before either writes
        dump.write_text(json.dumps({"prompt": "1+1", "completion": str(threading.get_ident())}) + "\n")
        return 0.5, 1, {}

    monkeypatch.setattr(evaluate, "heldout_accuracy", heldout_accuracy)
    codes = []
    threads = [threading.Thread(target=lambda: codes.append(cli.main(["eval", str(finished_run), "--json"])))
               for _ in range(2)]
    threads[0].start()
    while together.n_waiting == 0 and threads[0].is_alive():  # the second starts once the first waits to write:
        time.sleep(0.01)  # Python 3.11's ast (the config's parsing) is not safe in two threads at once
    threads[1].start()
    for t in threads:
        t.join(timeout=120)
    written = sorted(finished_run.glob("eval_samples*.jsonl"))
    assert codes == [0, 0] and [p.name for p in written] == ["eval_samples.2.jsonl", "eval_samples.jsonl"]
    assert {json.loads(p.read_text())["completion"] for p in written} == {str(t.ident) for t in threads}
    assert not list(finished_run.glob(".eval_samples*"))
    for p in written:
        p.unlink()


def test_an_environment_opening_longer_than_the_context_is_named_not_out_of_memory(tmp_path, capsys, monkeypatch):
    (tmp_path / "wordy_env.py").write_text(
        "class Wordy:\n"
        "    def rows(self, split, n, seed):\n        return [{'i': i} for i in range(n)]\n"
        "    def reset(self, row):\n        return [{'role': 'user', 'content': '7 ' * 450_000}]\n"
        "    def step(self, message):\n        return 'ok', 1.0, True, {}\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ["PYTHONPATH"]]))  # the workers'
    monkeypatch.syspath_prepend(str(tmp_path))  # this process's (the task's rows)
    code, err = main("train", *TINY, "task.name=env", "task.env=wordy_env:Wordy", f"run.out_dir={tmp_path}",
                     "run.name=e", capsys=capsys)
    last = err.strip().splitlines()[-1]
    assert code == 2 and "Traceback" not in err and "out of memory" not in err, err[-2000:]
    assert last.startswith("rlpost: error: task.env wordy_env:Wordy: reset() returned an opening longer than the "
                           "model's context: 900002 tokens (900000 characters), and the model takes 256 tokens, 6 of "
                           "them for the first turn"), last
    assert not (tmp_path / "e").exists() and verifier_workers() == []


# --- round three: a split with no rows and a model rlpost cannot train are one line each, not a traceback ---

EMPTY_ENV = '''class Empty:
    def rows(self, split, n, seed):
        return []

    def reset(self, row):
        return "hi"

    def step(self, message):
        return "ok", 1.0, True
'''


def t5_folder(folder: Path) -> Path:
    from transformers import T5Config, T5ForConditionalGeneration

    from rlpost.model.load import tiny_tokenizer

    tok = tiny_tokenizer()
    T5ForConditionalGeneration(T5Config(vocab_size=len(tok), d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2,
                                        decoder_start_token_id=0)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def broken_template_folder(folder: Path) -> Path:
    from rlpost.model.load import tiny_model, tiny_tokenizer

    tok = tiny_tokenizer()
    tiny_model(len(tok)).save_pretrained(folder)
    tok.save_pretrained(folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)  # in tokenizer_config.json, as many hub models have it
    meta = json.loads((folder / "tokenizer_config.json").read_text())
    meta["chat_template"] = "{% for m in messages %}{{ m['content'] }"  # a '}' short
    (folder / "tokenizer_config.json").write_text(json.dumps(meta))
    return folder


@pytest.mark.parametrize("case", ["env_rows_empty", "heldout_takes_every_problem", "heldout_takes_every_row", "t5",
                                  "broken_template"])
def test_no_training_rows_and_a_model_rlpost_cannot_train_are_one_line(tmp_path, capsys, monkeypatch, case):
    monkeypatch.chdir(tmp_path)  # the environment's module is found in the current directory
    (tmp_path / "empty_env.py").write_text(EMPTY_ENV)
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps({"prompt": str(i), "answer": str(i)}) + "\n"
                                                 for i in range(10)))
    args, says = {
        "env_rows_empty": (["task.name=env", "task.env=empty_env:Empty"],
                           "task.env: empty_env:Empty.rows('train', 64, 1234) returned no rows"),
        "heldout_takes_every_problem": (["task.min_a=0", "task.max_a=1", "task.min_b=0", "task.max_b=1", "task.ops=+",
                                         "task.n_heldout=50"],
                                        "task.n_heldout: 4 held-out arithmetic problems leave none to train on"),
        "heldout_takes_every_row": (["task.name=dataset", f"task.data={tmp_path / 'rows.jsonl'}", "task.n_heldout=10"],
                                    "task.n_heldout: 10 held-out rows leave none of the 10 usable rows"),
        "t5": ([f"model.name={t5_folder(tmp_path / 't5')}"],
               f"model.name: {tmp_path / 't5'} is a t5 model (T5Config), an encoder-decoder, not a causal language "
               "model"),
        "broken_template": ([f"model.name={broken_template_folder(tmp_path / 'tpl')}"],
                            f"model.name: the chat template of {tmp_path / 'tpl'} "
                            f"({tmp_path / 'tpl' / 'tokenizer_config.json'}'s chat_template) does not compile: line 1: "
                            "unexpected '}'"),
    }[case]
    code, err = main("train", *TINY, *args, f"run.out_dir={tmp_path}", "run.name=n", capsys=capsys)
    last = err.strip().splitlines()[-1]
    assert code == 2 and "Traceback" not in err and last.startswith(f"rlpost: error: {says}"), err[-2000:]
    assert not (tmp_path / "n").exists() and verifier_workers() == []
