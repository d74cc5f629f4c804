"""Run folders: one command at a time (fcntl lock), a run never overwritten, a failed start leaves
nothing behind; metrics.jsonl appends are whole lines even on a full disk, and a torn last line
is read past."""

import json

import pytest
from helpers import tiny_cfg, tmpfs

from rlpost.observe import jsonl, runfolder
from rlpost.types import folders
from rlpost.types.errors import ConfigError, DataError, RunError


def test_a_second_command_on_a_held_folder_is_refused_naming_the_holder(tmp_path):
    run = tmp_path / "x"
    with runfolder.claim(run, "new") as rf:
        rf.write_config(tiny_cfg())
        with pytest.raises(ConfigError, match=r"another rlpost command \(pid \d+\) is using this run folder"):
            with runfolder.claim(run, "new"):
                pass
        with pytest.raises(ConfigError, match="another rlpost command"):
            with runfolder.claim(run, "resume"):
                pass
        (run / "metrics.jsonl").write_text('{"step": 1}\n')
    # the holder is done, and the folder holds a run now: a new run refuses it, a resume may take it
    with pytest.raises(ConfigError, match=r"run.name: .* already holds a run; use --resume"):
        with runfolder.claim(run, "new", "use --resume"):
            pass
    with runfolder.claim(run, "resume"):
        pass


@pytest.mark.parametrize("state", ["lock only", "marker being written", "marker of another kind"])
def test_a_start_racing_a_claim_is_told_the_folder_is_in_use_not_what_it_half_holds(tmp_path, state):
    # Two starts with one run.name (tests/test_faults.py races two processes): the loser may look while the
    # winner holds .lock and has not yet written its marker, or has written half of it. It read those states
    # as "a pipeline folder" (a .lock without config.yaml, an older rlpost's) or "a damaged marker"; the
    # lock says what they are. The holder here is another open file description with a pid not ours.
    import fcntl
    import os

    run = tmp_path / "same"
    run.mkdir()
    fd = os.open(run / folders.LEGACY_LOCK, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, b"999999\n")
        if state != "lock only":
            (run / folders.MARKER).write_text("" if state == "marker being written" else '{"kind": "pipeline"}\n')
        for check in (lambda: runfolder.check_new(run, "pick another run.name", "run.name"),
                      lambda: runfolder.claim(run, "new").__enter__()):
            with pytest.raises(ConfigError, match=r"another rlpost command \(pid 999999\) is using this"):
                check()
    finally:
        os.close(fd)
    # the holder gone (a start killed right after creating .lock leaves just that): the folder is empty to a new run
    (run / folders.MARKER).unlink(missing_ok=True)
    with runfolder.claim(run, "new") as rf:
        rf.write_config(tiny_cfg())
    assert folders.kind_of(run) == "run"


@pytest.mark.parametrize("made_it", [False, True])
def test_a_start_refused_by_the_lock_removes_nothing_of_the_holders(tmp_path, monkeypatch, made_it):
    # The race of two starts with one name: the loser listed the folder (or made it) before the holder wrote
    # anything, then found the lock held. What it would count as its own additions are the holder's files.
    run = tmp_path / "x"
    with runfolder.claim(run, "new") as rf:
        rf.write_config(tiny_cfg())
        (run / "metrics.jsonl").write_text('{"step": 1}\n')
        with monkeypatch.context() as m:
            m.setattr(runfolder, "_make", lambda *a: made_it)
            listings = [[]]  # the loser's first listing is from before the holder wrote; later ones are true
            real_listdir = runfolder.os.listdir
            m.setattr(runfolder.os, "listdir", lambda path: listings.pop() if listings else real_listdir(path))
            with pytest.raises(runfolder.HeldElsewhere, match="another rlpost command"):
                with runfolder.claim(run, "new"):
                    pass
        assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n' and (run / "config.yaml").is_file()


def test_a_failed_start_leaves_no_folder_behind(tmp_path):
    run = tmp_path / "runs" / "x"
    with pytest.raises(KeyboardInterrupt), runfolder.claim(run, "new") as rf:
        rf.write_config(tiny_cfg())
        (run / "samples").mkdir()
        raise KeyboardInterrupt
    assert not run.exists()
    # a folder left by a start that was SIGKILLed (its marker and config.yaml) is reused, not refused
    run.mkdir()
    folders.mark(run, "run")
    (run / "config.yaml").write_text("run: {}\n")
    with runfolder.claim(run, "new") as rf:
        rf.write_config(tiny_cfg())
    assert (run / "config.yaml").exists()


def test_a_folder_holding_a_users_files_is_refused_and_an_empty_one_left_empty(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError,
                       match=r"^run.name: .*mine holds files rlpost did not write \(notes.txt\); pick a new"):
        with runfolder.claim(tmp_path / "mine", "new"):
            pass
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["notes.txt"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(RuntimeError), runfolder.claim(tmp_path / "empty", "new") as rf:
        rf.write_config(tiny_cfg())
        (rf.path / "data").mkdir()  # what rlpost.Trainer writes at its start: its rows, its pickled functions
        (rf.path / "rlpost_funcs_x.pkl").write_bytes(b"")
        raise RuntimeError
    assert list((tmp_path / "empty").iterdir()) == []  # as it was found


def test_an_export_folder_is_not_a_run_folder_and_the_reverse(tmp_path):
    (tmp_path / "exp").mkdir()
    folders.mark(tmp_path / "exp", "export", files=[])
    with pytest.raises(ConfigError, match="is an rlpost export folder, not a run folder"):
        with runfolder.claim(tmp_path / "exp", "new"):
            pass
    with pytest.raises(ConfigError, match="an rlpost export folder, not a run folder"):
        with runfolder.claim(tmp_path / "exp", "resume"):
            pass


def test_a_failed_resume_removes_only_the_config_it_added(tmp_path):
    with runfolder.claim(tmp_path, "new") as rf:
        rf.write_config(tiny_cfg())
    with pytest.raises(RuntimeError), runfolder.claim(tmp_path, "resume") as rf:
        assert rf.write_config(tiny_cfg("trainer.lr=2e-3")).name == "config.resume-1.yaml"
        raise RuntimeError
    assert sorted(p.name for p in tmp_path.glob("config*")) == ["config.yaml"]


def test_out_dir_that_is_a_file_is_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"^run.out_dir: .*file is a file, expected a folder$"):
        with runfolder.claim(tmp_path / "file" / "x", "new"):
            pass


def test_resume_needs_a_run_folder(tmp_path):
    with pytest.raises(ConfigError, match="no config.yaml there"):
        with runfolder.claim(tmp_path, "resume"):
            pass


def test_a_torn_last_line_is_read_past_and_a_damaged_middle_named(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "reward/me')
    assert [r["step"] for r in jsonl.read_lines(path)] == [1, 2]
    path.write_text('{"step": 1}\n{"ste\n{"step": 3}\n')
    with pytest.raises(DataError, match=r"metrics.jsonl:2: not valid JSON"):
        jsonl.read_lines(path)


def test_an_append_on_a_full_disk_leaves_no_half_line(tmp_path):
    with tmpfs(tmp_path / "disk", "16k") as disk:
        path = disk / "metrics.jsonl"
        jsonl.append(path, {"step": 1})
        (disk / "filler").write_bytes(b"x" * (16 * 1024 - 4096 - 1))  # the disk is now (nearly) full
        with pytest.raises(RunError, match=r"cannot append to .*metrics.jsonl: No space left on device"):
            for step in range(2, 1000):
                jsonl.append(path, {"step": step, "padding": "y" * 500})
        rows = jsonl.read_lines(path)
        assert path.read_text().endswith("\n") and [r["step"] for r in rows] == list(range(1, len(rows) + 1))
        assert json.loads(path.read_text().splitlines()[-1])["step"] == len(rows)


def test_resume_repairs_a_torn_metrics_file(tmp_path):
    from rlpost.observe.runlog import RunLog

    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n{"step": 4, "rew')
    log = RunLog(tmp_path, steps=5, start_step=2, progress=False)
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1}\n{"step": 2}\n'
    assert [h["step"] for h in log.history] == [1, 2]


def test_a_failed_start_keeps_only_its_log_and_the_next_start_clears_what_an_earlier_one_left(tmp_path, capsys):
    # a start that failed in its reward function (first rollout, held-out rows) kept the whole folder: config,
    # rows, samples and pickles, which the next start then wrote beside (a config naming the new pickles, the
    # old ones still there) and appended its own traceback to
    run = tmp_path / "x"
    with pytest.raises(RunError), runfolder.claim(run, "new") as rf:
        rf.write_config(tiny_cfg())
        for folder in ("data", "samples"):
            (run / folder).mkdir()
        (run / "rlpost_funcs_old.pkl").write_bytes(b"")
        (run / "verifier.log").write_text("Traceback ... ValueError: boom\n")
        raise RunError("reward function bad failed on 16 of 16 completions at step 1")
    assert sorted(p.name for p in run.iterdir()) == [".rlpost", "verifier.log"]
    # a start killed by SIGKILL leaves whatever it wrote; a file of the user's beside it is not the run's
    (run / "config.yaml").write_text("run: {}\n")
    (run / "rlpost_funcs_killed.py").write_text("")
    (run / "notes.txt").write_text("mine")
    capsys.readouterr()
    with runfolder.claim(run, "new") as rf:
        assert sorted(p.name for p in run.iterdir()) == [".lock", ".rlpost", "notes.txt"]
        rf.write_config(tiny_cfg())
    assert "removing what an earlier start that got nowhere left there (config.yaml, rlpost_funcs_killed.py, " \
           "verifier.log)" in capsys.readouterr().err
    # a folder holding nothing but an earlier failed start's leftovers is removed whole when this start fails too
    (run / "notes.txt").unlink()
    with pytest.raises(KeyboardInterrupt), runfolder.claim(run, "new") as rf:
        rf.write_config(tiny_cfg())
        raise KeyboardInterrupt
    assert not run.exists()
    # an empty log is no reason to keep anything, and a log of the run's (after step 1) keeps the whole run
    with pytest.raises(RuntimeError), runfolder.claim(run, "new") as rf:
        (run / "env.log").write_text("")
        raise RuntimeError
    assert not run.exists()
    with pytest.raises(RuntimeError), runfolder.claim(run, "new") as rf:
        rf.write_config(tiny_cfg())
        (run / "env.log").write_text("Traceback ...\n")
        (run / "metrics.jsonl").write_text('{"step": 1}\n')
        raise RuntimeError
    assert sorted(p.name for p in run.iterdir()) == [".lock", ".rlpost", "config.yaml", "env.log", "metrics.jsonl"]
