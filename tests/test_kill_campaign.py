"""A fault campaign in miniature: the real `rlpost train`, SIGKILLed at seeded random moments again
and again (during start-up, a step, a checkpoint write, a resume), and started again each time the
way a user would (`--resume`; `--resume --start-over` when it died before its first checkpoint; the
same command when it died before its config was written), ends bit-exact with the run that was
never stopped: the same weights, the same metric lines, its config.yaml as first written, nothing
temporary left, and no worker process outliving the process that started it."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch
from helpers import ROOT, TINY
from safetensors.torch import load_file

from rlpost.model import checkpoint

ARGS = [*TINY, "run.steps=6", "run.checkpoint_every=1", "run.keep_checkpoints=2",
        "task.verifier=toy_verifiers:odd_length", "task.verifier_workers=1"]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), *sys.path])}


def start(args: list[str], log) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rlpost.cli", *args], stdout=log, stderr=log, env=ENV, cwd=ROOT)


def workers_of(pid: int) -> list[int]:
    """Reward workers started by process ``pid`` (wire.py: their argv names the parent) still alive."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat", "rb") as f:
                zombie = f.read().rpartition(b")")[2].split()[0] == b"Z"
        except OSError:
            continue
        if not zombie and any(b"rlpost.rewards.worker" in a for a in argv) and str(pid).encode() in argv[-7:]:
            found.append(int(entry))
    return found


def metric_lines(run):
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(("timing_s/", "perf/"))}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def next_command(run) -> list[str]:
    """What a user runs after a kill: the same command while nothing of the run was kept, else a resume."""
    if not (run / "config.yaml").is_file():
        return ["train", *ARGS, f"run.out_dir={run.parent}", f"run.name={run.name}"]
    if not checkpoint.candidates(run, quiet=True):
        return ["train", "--resume", str(run), "--start-over"]
    return ["train", "--resume", str(run)]


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_loses_nothing(tmp_path):
    t0 = time.monotonic()
    with open(tmp_path / "full.log", "w") as log:
        assert start(["train", *ARGS, f"run.out_dir={tmp_path}", "run.name=full"], log).wait(600) == 0
    whole = time.monotonic() - t0
    run, rng, kills, config_text = tmp_path / "cut", random.Random(43), 0, None
    for attempt in range(8):
        with open(tmp_path / f"attempt{attempt}.log", "w") as log:
            proc = start(next_command(run), log)
            try:
                code = proc.wait(timeout=rng.uniform(0.1, 0.6) * whole if kills < 4 else 600)
            except subprocess.TimeoutExpired:  # still running: killed where it stands
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                kills += 1
                deadline = time.monotonic() + 10  # the workers follow their parent (PR_SET_PDEATHSIG)
                while workers_of(proc.pid) and time.monotonic() < deadline:
                    time.sleep(0.1)
                assert workers_of(proc.pid) == [], f"attempt {attempt}: workers outlived the killed run"
                if config_text is None and (run / "config.yaml").is_file():
                    config_text = (run / "config.yaml").read_text()
                continue
        assert code == 0, (tmp_path / f"attempt{attempt}.log").read_text()[-3000:]
        break
    else:
        pytest.fail("the run never finished")
    print(f"{kills} kills, {attempt + 1} starts; the whole run took {whole:.0f} s")  # shown with -s
    assert kills >= 1  # the campaign killed something (each draw is under the whole run's time; a resume is shorter)
    want, got = (load_file(r / "checkpoints" / "step_000006" / "model.safetensors") for r in (tmp_path / "full", run))
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    assert metric_lines(tmp_path / "full") == metric_lines(run)
    full, cut = (json.loads((r / "summary.json").read_text()) for r in (tmp_path / "full", run))
    assert full["heldout_accuracy_after"] == cut["heldout_accuracy_after"]
    assert config_text is None or (run / "config.yaml").read_text() == config_text
    assert not [p for p in run.rglob("*") if p.name.startswith(".tmp") or p.name.endswith(".tmp")]
    assert sorted(p.name for p in run.glob("config*")) == ["config.yaml"]  # no resume changed the config
