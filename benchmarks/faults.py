"""The fault campaign of issue 24, rerunnable: faults a run must survive, bad inputs that must end
in one clear line.

    .venv/bin/python benchmarks/faults.py [--only SUBSTRING] [--out benchmarks/results/faults.md]

Every case runs the real CLI in a subprocess on the tiny model (tests/helpers.py's TINY) and is
judged from outside, as a user would see it:

- a **fault** is survived when the command ends (no hang: each has a timeout), with no Python
  traceback on stderr, no verifier worker left running, and the run's data intact: where the
  case resumes, the resumed run ends bit-identical to an uninterrupted one (same final weights),
  else the newest checkpoint verifies and metrics.jsonl reads.
- a **bad input** gets a clear line when the command exits 2 (1 for a run-time stop), its last
  stderr line starts with ``rlpost: error:`` and names the key, file or path, and there is no
  traceback.

Root is needed for the disk-full and read-only cases (a small tmpfs); without it they are
reported as skipped. Writes a table (one row per case) to --out and prints the two figures.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "src")]

from helpers import TINY  # noqa: E402

PY = sys.executable
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT / "src"), *sys.path])}
BASE = [*TINY, "task.verifier=toy_verifiers:odd_length", "task.verifier_workers=1", "run.steps=4",
        "run.checkpoint_every=1", "run.keep_checkpoints=2"]

# SIGKILL on the n-th call of a checkpoint-writing function (a kill timed into the write).
KILL_IN = r"""
import os, signal, shutil, sys, torch
from rlpost.cli import main
from rlpost.model import checkpoint
owner, attr, n = ({"torch": torch, "checkpoint": checkpoint, "shutil": shutil, "os": os}[sys.argv[1]], sys.argv[2],
                  int(sys.argv[3]))
real, count = getattr(owner, attr), [0]
def hit(*a, **k):
    count[0] += 1
    if count[0] == n:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*a, **k)
setattr(owner, attr, hit)
sys.exit(main(sys.argv[4:]))
"""


def cli(*args, timeout=600, stdin=None):
    return subprocess.run([PY, "-m", "rlpost.cli", *args], capture_output=True, text=True, env=ENV, cwd=ROOT,
                          timeout=timeout)


def train_until_first_step(run: Path, *overrides: str) -> subprocess.Popen:
    """`rlpost train` into folder `run` (BASE + overrides), returned once its first step is logged
    (or it ended): the moment the signal and kill cases strike."""
    p = subprocess.Popen([PY, "-m", "rlpost.cli", "train", *BASE, *overrides, f"run.out_dir={run.parent}",
                          f"run.name={run.name}"], stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
    while not (run / "metrics.jsonl").exists() and p.poll() is None:
        time.sleep(0.05)
    return p


def parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def ours_or_orphaned(pid: int) -> bool:
    """A worker this campaign started (this process is an ancestor) or one whose rlpost died
    without it (re-parented to init); not another user's run or test suite on the same machine."""
    ppid = parent(pid)
    if ppid == 1:
        return True
    while ppid > 1:
        if ppid == os.getpid():
            return True
        ppid = parent(ppid)
    return False


def orphans() -> list[int]:
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if b"rlpost.rewards.worker" in Path(f"/proc/{pid}/cmdline").read_bytes() and ours_or_orphaned(int(pid)):
                out.append(int(pid))
        except OSError:
            pass
    return out


def settled_orphans(before: set, grace_s: float = 10.0) -> set:
    """Workers left by a killed command that are still there after ``grace_s``. A worker ends itself
    when its parent dies (PR_SET_PDEATHSIG's SIGTERM, or EOF on its watchdog pipe), but on a loaded
    machine that takes a moment: a worker seen the instant the parent died is not yet a leak."""
    deadline = time.monotonic() + grace_s
    while (left := set(orphans()) - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def weights(run: Path, step: int = 4) -> dict:
    from safetensors.torch import load_file

    return load_file(run / "checkpoints" / f"step_{step:06d}" / "model.safetensors")


def same(a: dict, b: dict) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


class Campaign:
    def __init__(self, tmp: Path, only: str):
        self.tmp, self.only, self.rows = tmp, only, []
        self.reference: dict | None = None
        self.before = set(orphans())

    def record(self, kind: str, name: str, ok: bool | None, detail: str) -> None:
        self.rows.append((kind, name, ok, detail.replace("|", "/").replace("\n", " ")[:230]))
        print(f"[{kind}] {'skip' if ok is None else 'ok  ' if ok else 'FAIL'} {name}: {detail[:200]}", flush=True)

    def wanted(self, name: str) -> bool:
        return self.only in name

    def fresh(self) -> Path:
        return Path(tempfile.mkdtemp(dir=self.tmp))

    # --- helpers for the fault cases ---------------------------------------------------------

    def full_reference(self) -> dict:
        if self.reference is None:
            out = self.fresh()
            r = cli("train", *BASE, f"run.out_dir={out}", "run.name=ref")
            assert r.returncode == 0, r.stderr[-2000:]
            self.reference = weights(out / "ref")
        return self.reference

    def resumes_exactly(self, run: Path, first, allow_start_over: bool = False) -> tuple[bool, str]:
        """After a fault: the command ended without traceback and no orphan; resuming ends where the
        uninterrupted run ends."""
        new_orphans = settled_orphans(self.before)
        if "Traceback" in first.stderr or new_orphans:
            return False, f"traceback or orphan workers {new_orphans}: {first.stderr[-300:]}"
        r = cli("train", "--resume", str(run))
        started_over = ""
        if (allow_start_over and r.returncode == 2
                and "no intact checkpoint to resume from; add --start-over" in r.stderr):
            # killed inside the first checkpoint's write: nothing was saved, so nothing is lost; the
            # refusal is one line, and the run it names trains from step 0 to the same weights
            r, started_over = (cli("train", "--resume", str(run), "--start-over"),
                               "no checkpoint yet: refused in one line, then --start-over; ")
        if r.returncode != 0:
            return False, f"resume exit {r.returncode}: {r.stderr.strip().splitlines()[-1:]}"
        ok = same(weights(run), self.full_reference())
        lines = [x for x in r.stderr.splitlines() if "corrupt" in x or "resuming" in x]
        return (ok, started_over + ("bit-exact after resume" if ok else "resumed, but weights differ")
                + ("; " + lines[0] if lines else ""))

    # --- the faults ---------------------------------------------------------------------------

    def kills(self) -> None:
        for step in (1, 2, 3):
            name = f"SIGKILL after step {step}"
            if self.wanted(name):
                run = self.fresh() / "k"
                code = ("import os, signal, sys\nfrom rlpost.cli import main\nfrom rlpost.recipes import rl\n"
                        "t = rl.train\n"
                        "rl.train = lambda *a, **k: t(*a, **k, on_step_end=lambda s: os.kill(os.getpid(), "
                        f"signal.SIGKILL) if s == {step} else None)\nsys.exit(main(sys.argv[1:]))")
                first = subprocess.run([PY, "-c", code, "train", *BASE, f"run.out_dir={run.parent}", "run.name=k"],
                                       capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=600)
                self.record("fault", name, *self.resumes_exactly(run, first))
        points = [("torch", "save", n, f"torch.save call {n}") for n in (3, 4, 5, 6)]
        points += [("checkpoint", "sha256", n, f"checksum call {n}") for n in (2, 5, 7)]
        points += [("checkpoint", "write_atomic", n, f"manifest/latest write {n}") for n in (2, 3, 4, 6)]
        points += [("os", "replace", n, f"os.replace call {n}") for n in (3, 5, 8)]
        points += [("shutil", "rmtree", n, f"rmtree call {n}") for n in (3, 5, 6)]
        for owner, attr, n, what in points:
            name = f"SIGKILL inside a checkpoint write ({what})"
            if self.wanted(name):
                run = self.fresh() / "k"
                first = subprocess.run([PY, "-c", KILL_IN, owner, attr, str(n), "train", *BASE,
                                        f"run.out_dir={run.parent}",
                                        "run.name=k"], capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=600)
                if first.returncode != -signal.SIGKILL:
                    self.record("fault", name, False, f"not killed (exit {first.returncode})")
                    continue
                self.record("fault", name, *self.resumes_exactly(run, first, allow_start_over=True))
        rng = random.Random(0)
        for i in range(4):
            name = f"SIGKILL at a random moment #{i + 1}"
            if self.wanted(name):
                run = self.fresh() / "k"
                p = train_until_first_step(run)
                time.sleep(rng.uniform(0, 3))
                p.kill()
                err = p.communicate()[1]
                if not list((run / "checkpoints").glob("step_*")):
                    self.record("fault", name, True,
                                "killed before the first checkpoint: nothing to resume, nothing lost")
                    continue
                self.record("fault", name, *self.resumes_exactly(run, subprocess.CompletedProcess([], -9, "", err)))

    def corruptions(self) -> None:
        src = self.fresh()
        # 3 kept: with step 4's folder removed below (killed after step 3's checkpoint), steps 2 and 3
        # are what such a run holds, so a corrupt step 3 has step 2 to fall back to
        r = cli("train", *BASE, "run.keep_checkpoints=3", f"run.out_dir={src}", "run.name=c")
        assert r.returncode == 0, r.stderr[-2000:]
        cases = {
            "truncated model.safetensors":
                lambda c: (c / "model.safetensors").write_bytes((c / "model.safetensors").read_bytes()[:99]),
            "empty model.safetensors": lambda c: (c / "model.safetensors").write_bytes(b""),
            "bit flip in model.safetensors": lambda c: _flip(c / "model.safetensors"),
            "missing model.safetensors": lambda c: (c / "model.safetensors").unlink(),
            "truncated trainer.pt": lambda c: (c / "trainer.pt").write_bytes((c / "trainer.pt").read_bytes()[:99]),
            "missing trainer.pt": lambda c: (c / "trainer.pt").unlink(),
            "empty state.pt": lambda c: (c / "state.pt").write_bytes(b""),
            "bit flip in state.pt": lambda c: _flip(c / "state.pt"),
            "missing manifest.json": lambda c: (c / "manifest.json").unlink(),
            "garbage manifest.json": lambda c: (c / "manifest.json").write_text("{"),
            "empty step folder": lambda c: [p.unlink() for p in c.iterdir()],
            "empty latest": lambda c: (c.parent / "latest").write_text(""),
            "latest names a missing step": lambda c: (c.parent / "latest").write_text("step_000099"),
            "torn last metrics line": lambda c: _tear(c.parents[1] / "metrics.jsonl"),
        }
        for what, corrupt in cases.items():
            name = f"corrupt checkpoint: {what}"
            if not self.wanted(name):
                continue
            run = self.fresh() / "c"
            shutil.copytree(src / "c", run)
            shutil.rmtree(run / "checkpoints" / "step_000004")  # as if killed after step 3's checkpoint
            (run / "checkpoints" / "latest").write_text("step_000003")
            _keep_steps(run, 3)
            corrupt(run / "checkpoints" / "step_000003")
            self.record("fault", name, *self.resumes_exactly(run, subprocess.CompletedProcess([], 0, "", "")))

    def disks(self) -> None:
        if os.geteuid() != 0:
            for name in ("disk full during a checkpoint", "disk full during a metrics append", "read-only run folder"):
                self.record("fault", name, None, "skipped: needs root to mount a small tmpfs")
            return
        name = "disk full during a checkpoint"
        if self.wanted(name):
            with _tmpfs(self.fresh(), "1400k") as disk:
                r = cli("train", *BASE, f"run.out_dir={disk}", "run.name=f")
                last = r.stderr.strip().splitlines()[-1]
                ok = r.returncode == 1 and "No space left on device" in last and "Traceback" not in r.stderr
                ok &= self._intact(disk / "f")
                self.record("fault", name, ok, last)
        name = "disk full during a metrics append"
        if self.wanted(name):
            with _tmpfs(self.fresh(), "3m") as disk:
                code = ("import sys, os\nfrom rlpost.cli import main\nfrom rlpost.observe import jsonl\n"
                        "real = jsonl.append\ndef full(path, row):\n    if row['step'] == 3:\n"
                        "        f = path.parent / 'filler'\n        with open(f, 'wb') as h:\n            try:\n"
                        "                h.write(b'x' * (8 << 20))\n            except OSError:\n                pass\n"
                        "    return real(path, row)\njsonl.append = full\nsys.exit(main(sys.argv[1:]))")
                r = subprocess.run([PY, "-c", code, "train", *BASE, "run.checkpoint_every=0", f"run.out_dir={disk}",
                                    "run.name=m"], capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=600)
                last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
                text = (disk / "m" / "metrics.jsonl").read_text()
                ok = (r.returncode == 1 and "No space left on device" in last and text.endswith("\n")
                      and "Traceback" not in r.stderr)
                self.record("fault", name, ok, last)
        name = "read-only run folder"
        if self.wanted(name):
            with _tmpfs(self.fresh(), "4m") as disk:
                r = cli("train", *BASE, "run.steps=1", f"run.out_dir={disk}", "run.name=ro")
                subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
                outs = [cli("train", "--resume", str(disk / "ro"), "run.steps=2"),
                        cli("eval", str(disk / "ro"), "--n", "2"),
                        cli("report", str(disk / "ro")), cli("doctor", str(disk / "ro"))]
                ok = all("Traceback" not in o.stderr for o in outs) and [o.returncode for o in outs] == [2, 1, 1, 0]
                self.record("fault", name, ok, " // ".join(o.stderr.strip().splitlines()[-1] if o.stderr.strip() else
                                                          f"exit {o.returncode}" for o in outs))

    def _intact(self, run: Path) -> bool:
        sys.path[:0] = [str(ROOT / "src")]
        from rlpost.model import checkpoint
        from rlpost.observe import jsonl

        rows = jsonl.read_lines(run / "metrics.jsonl")
        return checkpoint.newest_intact(run) is not None and [r["step"] for r in rows] == list(range(1, len(rows) + 1))

    def signals(self) -> None:
        for sig, code in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
            name = f"{sig.name} mid-run"
            if self.wanted(name):
                run = self.fresh() / "s"
                p = train_until_first_step(run, "run.checkpoint_every=0")
                p.send_signal(sig)
                err = p.communicate(timeout=300)[1]
                saved = list((run / "checkpoints").glob("step_*"))
                ok = p.returncode == code and bool(saved) and "Traceback" not in err
                ok2, detail = (self.resumes_exactly(run, subprocess.CompletedProcess([], 0, "", err)) if ok
                               else (False, ""))
                self.record("fault", name, ok and ok2, f"exit {p.returncode}; {err.strip().splitlines()[-1]}; {detail}")
        name = "SIGINT twice mid-run"
        if self.wanted(name):
            run = self.fresh() / "s"
            p = train_until_first_step(run)
            p.send_signal(signal.SIGINT)
            time.sleep(0.2)
            p.send_signal(signal.SIGINT)
            err = p.communicate(timeout=300)[1]
            stray = set(orphans()) - self.before
            self.record("fault", name, p.returncode == 130 and "Traceback" not in err and not stray,
                        f"exit {p.returncode}; workers left {sorted(stray)}; {err.strip().splitlines()[-1]}")
        for sig in (signal.SIGINT, signal.SIGTERM):
            name = f"{sig.name} during start-up"
            if self.wanted(name):
                out = self.fresh()
                p = subprocess.Popen([PY, "-m", "rlpost.cli", "train", *BASE, f"run.out_dir={out}", "run.name=u"],
                                     stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
                line = p.stderr.readline()  # 'rlpost: run folder ...': the config is written, the model not loaded
                p.send_signal(sig)
                err = line + p.communicate(timeout=300)[1]
                ok = p.returncode == 128 + sig and "Traceback" not in err and not (out / "u").exists()
                self.record("fault", name, ok, f"exit {p.returncode}; {err.strip().splitlines()[-1]}")

    def concurrency(self) -> None:
        name = "two runs started together with one run.name"
        if self.wanted(name):
            out = self.fresh()
            ps = [subprocess.Popen([PY, "-m", "rlpost.cli", "train", *BASE, f"run.out_dir={out}", "run.name=same"],
                                   stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT) for _ in range(2)]
            res = sorted((p.wait(timeout=600), p.stderr.read()) for p in ps)
            steps = (out / "same" / "metrics.jsonl").read_text().count("\n")
            ok = [c for c, _ in res] == [0, 2] and steps == 4 and "Traceback" not in res[1][1]
            self.record("fault", name, ok, res[1][1].strip().splitlines()[-1])
        name = "a resume while the run still trains"
        if self.wanted(name):
            out = self.fresh()
            # long enough to be still training when the resume (a new interpreter, torch's import) gets
            # to the lock: with BASE's 4 steps it could end first, and the resume then rightly went on
            p = subprocess.Popen([PY, "-m", "rlpost.cli", "train", *BASE, "run.steps=2000", f"run.out_dir={out}",
                                  "run.name=busy"], stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
            while not (out / "busy" / "config.yaml").exists():
                time.sleep(0.05)
            r = cli("train", "--resume", str(out / "busy"))
            busy = p.poll() is None
            p.send_signal(signal.SIGINT)  # the stop a user sends: saves and exits
            p.communicate(timeout=600)
            ok = busy and r.returncode == 2 and "another rlpost command" in r.stderr
            self.record("fault", name, ok, r.stderr.strip().splitlines()[-1])

    def verifiers(self) -> None:
        cases = [  # (name, task.verifier, extra overrides, expected exit, what the last line / stderr must say)
            ("verifier writes to fd 1 and 2", "toy_verifiers:echo_fd1", [], 0, "report with plots"),
            ("verifier hangs on some completions", "toy_verifiers:hangs", ["task.verifier_timeout_s=0.5"], 0,
             "report with plots"),
            ("verifier spins forever", "toy_verifiers:spins", ["task.verifier_timeout_s=0.5"], 1,
             "failed on 8 of 8 completions on the held-out rows"),
            ("verifier raises on everything", "toy_verifiers:raises", [], 1,
             "failed on 8 of 8 completions on the held-out rows"),
            ("verifier returns NaN/inf/strings", "toy_verifiers:returns_nan", [], 0, "report with plots"),
            ("verifier allocates 64 GB", "toy_verifiers:allocates", ["task.verifier_memory_mb=1024"], 0,
             "report with plots"),
            ("verifier kills its own process", "toy_verifiers:kills_itself", [], 0, "report with plots"),
            ("verifier module exits at import", "toy_exit_at_import:score", [], 2, "exited with code 3"),
            ("verifier module is not there", "no_such_module:score", [], 2, "no module 'no_such_module'"),
        ]
        for name, path, extra, code, expect in cases:
            if self.wanted(name):
                out = self.fresh()
                r = cli("train", *BASE, "run.steps=2", f"task.verifier={path}", *extra, f"run.out_dir={out}",
                        "run.name=v", timeout=300)
                stray = set(orphans()) - self.before
                last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
                # a verifier's own traceback is printed (once) inside rlpost's line about it; an
                # uncaught one of rlpost's would be the last thing on stderr
                ok = r.returncode == code and expect in r.stderr and last.startswith("rlpost:") and not stray
                self.record("fault", name, ok, f"exit {r.returncode}: {r.stderr.strip().splitlines()[-1]}")
        name = "SIGKILL of rlpost while a verifier spins"
        if self.wanted(name):
            out = self.fresh()
            p = subprocess.Popen([PY, "-m", "rlpost.cli", "train", *BASE, "task.verifier=toy_verifiers:spins",
                                  "task.verifier_timeout_s=100", f"run.out_dir={out}", "run.name=o"],
                                 stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
            while not set(orphans()) - self.before:
                time.sleep(0.1)
            time.sleep(2)
            p.kill()
            p.wait()
            stray = settled_orphans(self.before)
            self.record("fault", name, not stray, f"workers left: {sorted(stray)}")

    # --- bad inputs -----------------------------------------------------------------------------

    def bad_inputs(self) -> None:
        t = self.fresh()
        (t / "latin1.yaml").write_bytes("run:\n  name: caf\xe9\n".encode("latin-1"))
        (t / "twice.yaml").write_text("task:\n  n_train: 10\ntask:\n  n_heldout: 5\n")
        (t / "broken.yaml").write_text("task: [1, 2\n")
        (t / "list.yaml").write_text("- a\n- b\n")
        (t / "file").write_text("")
        (t / "latin1.jsonl").write_bytes(b'{"prompt": "1+1", "answer": "2"}\n{"prompt": "caf\xe9", "answer": "1"}\n')
        (t / "badjson.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n{"prompt": \n')
        (t / "noanswer.jsonl").write_text('{"prompt": "1+1"}\n' * 4)
        (t / "bad.parquet").write_bytes(b"PAR1 nope")
        (t / "notds").mkdir()
        (t / "notds" / "x.txt").write_text("x")
        sys.path[:0] = [str(ROOT / "src")]
        from rlpost.model.load import load_policy, save_model

        tiny = load_policy("tiny")
        save_model(tiny.model, tiny.tokenizer, t / "trunc")
        (t / "trunc" / "model.safetensors").write_bytes((t / "trunc" / "model.safetensors").read_bytes()[:999])
        save_model(tiny.model, tiny.tokenizer, t / "notok")
        for f in (t / "notok").glob("*token*"):
            f.unlink()
        done = self.fresh()
        assert cli("train", *BASE, "run.steps=1", f"run.out_dir={done}", "run.name=d").returncode == 0
        (done / "husk").mkdir()
        (done / "husk" / "config.yaml").write_text((done / "d" / "config.yaml").read_text())
        out = f"run.out_dir={self.fresh()}"
        ds = ["task.name=dataset", "task.n_heldout=1"]
        cases = [
            ("unknown key", ["train", "rollout.group_sise=4"], 2, "rollout.group_sise: unknown key"),
            ("wrong type", ["train", "rollout.group_size=four"], 2, "rollout.group_size: expected an integer"),
            ("out of range", ["train", "rollout.top_p=2"], 2, "rollout.top_p: expected a number > 0 and <= 1"),
            ("lr = inf", ["train", "trainer.lr=inf"], 2, "trainer.lr: expected a finite number"),
            ("lr = 1e30", ["train", "trainer.lr=1e30"], 2, "trainer.lr: expected a number > 0 and <= 1"),
            ("kl_coef = nan", ["train", "algo.kl_coef=nan"], 2, "algo.kl_coef: expected a finite number"),
            ("non-UTF-8 recipe", ["train", str(t / "latin1.yaml")], 2, "not UTF-8 text"),
            ("recipe is a folder", ["train", str(t)], 2, "is a folder, expected a YAML file"),
            ("recipe not found", ["train", str(t / "nope.yaml")], 2, "recipe: file not found"),
            ("duplicated section", ["train", str(t / "twice.yaml")], 2, "duplicate key 'task'"),
            ("YAML syntax error", ["train", str(t / "broken.yaml")], 2, "not valid YAML"),
            ("recipe is a list", ["train", str(t / "list.yaml")], 2, "expected a mapping of sections"),
            ("misspelt task.verifier", ["train", *BASE, "task.verifier=toy_verifiers:nope", out], 2,
             "task.verifier: cannot import 'toy_verifiers:nope'"),
            ("misspelt task.reward_funcs", ["train", *BASE, "task.reward_funcs=toy_verifiers:nope", out], 2,
             "task.reward_funcs: cannot import 'toy_verifiers:nope'"),
            ("run.out_dir is a file", ["train", *BASE, f"run.out_dir={t / 'file'}"], 2, "is a file, expected a folder"),
            ("huge group_size", ["train", "rollout.group_size=1000000"], 2, "rollout.group_size: expected an integer"),
            ("huge max_new_tokens", ["train", "rollout.max_new_tokens=100000000"], 2,
             "rollout.max_new_tokens: expected"),
            ("batch too big for memory", ["train", *BASE, "rollout.group_size=1024", "rollout.prompts_per_step=4096",
                                          "run.eval_n=1", "trainer.mini_batch_size=0", "trainer.micro_batch_size=0",
                                          out], 2,
             "out of memory"),
            ("resume with another algo.name", ["train", "--resume", str(done / "d"), "algo.name=ppo"], 2,
             "algo.name: cannot change on --resume"),
            ("resume with another lora_r", ["train", "--resume", str(done / "d"), "model.lora_r=8"], 2,
             "model.lora_r: cannot change on --resume"),
            ("resume a folder with no checkpoint", ["train", "--resume", str(done / "husk")], 2,
             "no intact checkpoint"),
            ("resume a folder that is no run", ["train", "--resume", str(t)], 2, "no config.yaml there"),
            ("new run on an existing run folder", ["train", *BASE, f"run.out_dir={done}", "run.name=d"], 2,
             "already holds a run"),
            ("sft on an existing run folder", ["sft", *TINY, f"run.out_dir={done}", "run.name=d"], 2,
             "already holds a run"),
            ("non-UTF-8 JSONL", ["train", *BASE, *ds, f"task.data={t / 'latin1.jsonl'}", out], 2,
             "latin1.jsonl:2: not UTF-8"),
            ("invalid JSON line", ["train", *BASE, *ds, f"task.data={t / 'badjson.jsonl'}", out], 2,
             "badjson.jsonl:2: not valid JSON"),
            ("rows without an answer", ["train", *BASE, *ds, f"task.data={t / 'noanswer.jsonl'}", out], 2,
             "missing 'answer'"),
            ("corrupt parquet", ["train", *BASE, *ds, f"task.data={t / 'bad.parquet'}", out], 2,
             "not a readable parquet"),
            ("folder that is no dataset", ["train", *BASE, *ds, f"task.data={t / 'notds'}", out], 2,
             "not one saved by `datasets`"),
            ("missing data file", ["train", *BASE, *ds, "task.data=/no/such.jsonl", out], 2, "data: file not found"),
            ("sft data missing", ["sft", *TINY, "pref.data=/no/such.jsonl", out], 2, "data: file not found"),
            ("truncated model weights", ["train", *BASE, f"model.name={t / 'trunc'}", out], 2,
             "its model does not load"),
            ("model folder without a tokenizer", ["train", *BASE, f"model.name={t / 'notok'}", out], 2,
             "its tokenizer does not load"),
            ("model path that does not exist", ["eval", "/no/such/model"], 2, "cannot load model"),
            ("eval --k above --samples", ["eval", "tiny", "--samples", "2", "--k", "4"], 2, "--k: every k must be"),
            ("report on a folder that is no run", ["report", str(t)], 2, "no metrics.jsonl there"),
            ("doctor on a folder that is no run", ["doctor", str(t)], 2, "no metrics.jsonl there"),
            ("pipeline recipe without stages", ["pipeline", str(t / "twice.yaml")], 2, "duplicate key"),
            ("--start-over without --resume", ["train", "--start-over"], 2, "--start-over: only with --resume"),
        ]
        for name, args, code, expect in cases:
            if self.wanted(name):
                r = cli(*args, timeout=300)
                last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
                ok = (r.returncode == code and last.startswith("rlpost: error:") and expect in last
                      and "Traceback" not in r.stderr)
                self.record("bad input", name, ok, f"exit {r.returncode}: {last}")

    def report(self, out: Path) -> None:
        lines = ["| kind | case | result | what was seen |", "|---|---|---|---|"]
        lines += [f"| {k} | {n} | {'skipped' if ok is None else 'ok' if ok else 'FAILED'} | {d} |"
                  for k, n, ok, d in self.rows]
        faults = [r for r in self.rows if r[0] == "fault" and r[2] is not None]
        bad = [r for r in self.rows if r[0] == "bad input"]
        summary = (f"faults survived: {sum(r[2] for r in faults)} / {len(faults)}; "
                   f"bad inputs with a clear line: {sum(r[2] for r in bad)} / {len(bad)}")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(summary + "\n\n" + "\n".join(lines) + "\n")
        print(summary)


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _tear(path: Path) -> None:
    path.write_text(path.read_text() + '{"step": 4, "reward/me')


def _keep_steps(run: Path, step: int) -> None:
    lines = [x for x in (run / "metrics.jsonl").read_text().splitlines()
             if x and int(x.split(",")[0].split(":")[1]) <= step]
    (run / "metrics.jsonl").write_text("".join(x + "\n" for x in lines))


class _tmpfs:
    def __init__(self, where: Path, size: str):
        self.path, self.size = where / "disk", size

    def __enter__(self) -> Path:
        self.path.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size}", "tmpfs", str(self.path)], check=True)
        return self.path

    def __exit__(self, *exc) -> None:
        subprocess.run(["umount", "-l", str(self.path)])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="", help="run only the cases whose name contains this")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "faults.md"))
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        c = Campaign(Path(tmp), args.only)
        for part in (c.bad_inputs, c.verifiers, c.signals, c.concurrency, c.disks, c.corruptions, c.kills):
            part()
        c.report(Path(args.out))


if __name__ == "__main__":
    main()
