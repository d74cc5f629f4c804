"""The hostile suite: every program in tests/envs/hostile/ is graded through the real verifier
(rlpost.envs.code.score) with the code task's row format, under each backend, and must

* score 0 (each program defines a correct `add`, or prints the right sum, only if its attack
  worked, so a reward above 0 *is* a breach; reward hacks get their wrong answer graded),
* leave nothing on the host (no file carrying its marker, no process, no cgroup, no SysV
  segment, no working directory), and
* stay within its limits (the run's cgroup peak memory under the cap, the wall time bounded).

A program headed ``# requires: G`` is contained only where guarantee G holds; under a backend
without G (rlimits lacks network, filesystem and IPC isolation) it is skipped, naming G. One
headed ``# tests: [...]`` is graded against those tests (the exactness programs) instead of add's.
The programs run concurrently (4 sandboxes), interleaved with correct programs that must all
score 1.0: nothing one program does may cost another its reward. Small limits keep the whole
suite around 60 s on 2 cores. A second batch sends the status forgeries, exactness and clean-up
programs through the verifier runner itself (3 worker processes, 4 sandboxes), as a run does.
"""

from __future__ import annotations

import ctypes
import fcntl
import glob
import json
import os
import re
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rlpost import wire
from rlpost.envs import grading
from rlpost.envs.code import score
from rlpost.rewards.runner import VerifierRunner
from rlpost.sandbox import hostdir, isolation, run, slots

HOSTILE = Path(__file__).parent / "hostile"
PROGRAMS = sorted(p.stem for p in HOSTILE.glob("*.py"))
LIMITS = {"wall_s": 2.0, "cpu_s": 1, "memory_mb": 128, "max_disk_mb": 32, "max_processes": 16}
CAP_MB = LIMITS["memory_mb"] + LIMITS["max_disk_mb"]  # the run's cgroup memory cap (total_memory_mb = 0)
PARALLEL = 4
CALL_TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(10, 1) == 11",
              {"call": "add(7, 7)", "expected": 14}]
IO_TESTS = [{"stdin": "1 2\n", "stdout": "3"}, {"stdin": "10 -4\n", "stdout": "6"}]
GOOD = {"call": "def add(a, b):\n    return a + b\n", "io": "print(sum(map(int, input().split())))\n"}


def header(name: str) -> tuple[str, list[str]]:
    """(form, required guarantees) from a program's '# form:' and '# requires:' lines."""
    text = (HOSTILE / f"{name}.py").read_text()
    form = re.search(r"^# form: (\w+)", text, re.M)[1]
    requires = re.search(r"^# requires: (.+)$", text, re.M)
    return form, [g.strip() for g in requires[1].split(",")] if requires else []


def graded_tests(name: str, form: str) -> list:
    """The tests a program is graded against: its '# tests:' line (JSON, continued on '#  ' lines), else add's."""
    own = re.search(r"^# tests: (.+(?:\n#  +.+)*)$", (HOSTILE / f"{name}.py").read_text(), re.M)
    if not own:
        return CALL_TESTS if form == "call" else IO_TESTS
    return json.loads(" ".join(line.lstrip("# ") for line in own[1].split("\n")))


def test_suite_covers_every_class_of_the_issue():
    prefixes = {p.split("_")[0] for p in PROGRAMS}
    assert len(PROGRAMS) >= 40
    assert {"hack", "loop", "bomb", "flood", "net", "secret", "write", "kill", "daemon", "ptrace", "ipc",
            "keyring", "priv", "cross", "forge", "exact", "clean", "path", "proc"} <= prefixes
    for name in PROGRAMS:
        form, requires = header(name)
        assert form in ("call", "io") and set(requires) <= set(run.guarantees("bwrap")), name


# --- the host side of the attacks: things a contained program must not reach -----------------


def _syscall_numbers():
    return isolation.SECCOMP_ARCHES.get(os.uname().machine, (0, (None,) * 6))[1]


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """A loopback listener, an abstract unix socket, a world-readable secret and task data file,
    a session key, a SysV segment and a secret environment variable, all torn down after."""
    d = tmp_path_factory.mktemp("hostile")
    os.chmod(d, 0o755)
    secret, data = d / "id_rsa", d / "data.jsonl"
    secret.write_text("FAKE PRIVATE KEY")
    data.write_text(json.dumps({"prompt": "p", "tests": CALL_TESTS + IO_TESTS}) + "\n")
    for p in (secret, data):
        os.chmod(p, 0o644)
    listener, abstract = socket.socket(), socket.socket(socket.AF_UNIX)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    abstract_name = f"rlpost-hostile-{os.getpid()}"
    abstract.bind("\0" + abstract_name)
    abstract.listen()
    abstract.setblocking(False)
    libc = ctypes.CDLL(None, use_errno=True)
    add_key, _, keyctl = _syscall_numbers()[:3]
    key_id = libc.syscall(add_key, b"user", b"rlpost-hostile", b"EXPECTED=3", 10, ctypes.c_int(-3)) if add_key else -1
    shm_key = 0x524C0000 + os.getpid() % 0xFFFF
    shm_id = libc.shmget(shm_key, 4096, 0o1644)
    os.environ["RLPOST_HOSTILE_SECRET"] = "1"
    values = {"HOST_PORT": str(listener.getsockname()[1]), "ABSTRACT_NAME": abstract_name, "SECRET_PATH": str(secret),
              "DATA_PATH": str(data), "HOST_HOME": os.path.expanduser("~"), "PARENT_PID": str(os.getpid()),
              "KEY_ID": str(key_id), "SHM_KEY": str(shm_key)}
    yield values, listener, abstract
    del os.environ["RLPOST_HOSTILE_SECRET"]
    if key_id > 0:
        libc.syscall(keyctl, 3, key_id)  # KEYCTL_REVOKE
    if shm_id >= 0:
        libc.shmctl(shm_id, 0, None)  # IPC_RMID
    listener.close()
    abstract.close()


def source(name: str, values: dict, mark: str) -> str:
    text = (HOSTILE / f"{name}.py").read_text().replace("MARK", mark)
    for key, value in values.items():
        text = text.replace(key, value)
    return f"```python\n{text}\n```"


# --- traces ------------------------------------------------------------------------------------

SEARCHED = ["/tmp", "/var/tmp", "/dev/shm", "/", os.path.expanduser("~"), os.getcwd(), os.path.dirname(os.getcwd())]


def marked_files(mark: str) -> list[str]:
    return [p for d in SEARCHED for p in glob.glob(os.path.join(d, f"*{mark}*"))]


def slot_uid_processes() -> list[int]:
    """Processes still running under a sandbox slot's uid (root only: otherwise uids are shared)."""
    lo = slots.SLOT_UID_BASE
    return [p.pid for p in wire.processes(uids=True) if lo <= p.uid < lo + 2048 and p.state not in "ZX"]


def left_in_registries() -> list[dict]:
    """What the slots' registries still list (slots another process holds now are its own business)."""
    left, folder = [], slots.slot_dir()
    for i in range(PARALLEL):
        fd = os.open(f"{folder}/slot-{i}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            left += slots.read_registry(fd)
        except BlockingIOError:
            pass
        finally:
            os.close(fd)
    return left


def sysv_segments_of_slots() -> list[str]:
    lo = slots.SLOT_UID_BASE
    with open("/proc/sysvipc/shm") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return [r[1] for r in rows if lo <= int(r[7]) < lo + 2048 or lo <= int(r[9]) < lo + 2048]


def workdirs() -> set[str]:
    return set(os.listdir(hostdir.work_root()))


def machine_allows() -> dict[str, bool]:
    """The bwrap guarantees that depend on this machine, from its own facts: the seccomp syscall
    table needs a known architecture, --size and --disable-userns a recent enough bubblewrap."""
    flags = subprocess.run(["bwrap", "--help"], capture_output=True, text=True).stdout
    seccomp = os.uname().machine in isolation.SECCOMP_ARCHES
    return {"keyring_isolated": seccomp, "ptrace_blocked": seccomp, "disk_quota": "--size" in flags,
            "userns_blocked": "--disable-userns" in flags}


# --- the batch ---------------------------------------------------------------------------------


# Each backend's batch takes 10-12 s of wall time on 2 cores (most of the programs run until their
# 2 s wall limit, 4 at a time), so every test that reads a batch is slow; the fast selection keeps
# test_sandbox.py's limits and clean-up and test_code.py's hostile completions through the runner.
@pytest.fixture(scope="module", params=[pytest.param(b, marks=pytest.mark.slow) for b in run.BACKENDS])
def batch(request, host):
    """Grade every applicable program (and the interleaved correct ones) once per backend."""
    backend = request.param
    if backend == "bwrap" and not run.bwrap_works():
        pytest.skip("bubblewrap is missing or cannot create namespaces here (apt-get install bubblewrap)")
    values, listener, abstract = host
    have = run.guarantees(backend)
    if backend == "bwrap":  # what bwrap lacks must be explained by the machine, never by the code
        have = machine_allows()
        assert {g: ok for g, ok in run.guarantees("bwrap").items() if g in have} == have
    skipped = {n: [g for g in header(n)[1] if not have.get(g, True)] for n in PROGRAMS}
    skipped = {n: lacks for n, lacks in skipped.items() if lacks}
    marks = {n: f"rlpost-hostile-{n}-{os.urandom(4).hex()}" for n in PROGRAMS}
    box = {"backend": backend, "parallel": PARALLEL, "allow_root": True}

    def grade(job):
        name, tests, completion = job
        t0 = time.monotonic()
        reward, info = score(completion, {"tests": tests, "limits": LIMITS, "sandbox": box})
        return name, (reward, info, time.monotonic() - t0)

    jobs = [(n, graded_tests(n, header(n)[0]), source(n, values, marks[n])) for n in PROGRAMS if n not in skipped]
    goods = [(f"good-{form}-{k}", CALL_TESTS if form == "call" else IO_TESTS, GOOD[form])
             for k in range(6) for form in ("call", "io")]
    step = max(1, len(jobs) // len(goods))
    for k, good in enumerate(goods):  # correct programs interleaved through the batch
        jobs.insert(k * (step + 1), good)
    before = workdirs()
    with ThreadPoolExecutor(PARALLEL) as pool:
        results = dict(pool.map(grade, jobs))
    time.sleep(1.5)  # let anything that outlived its run show itself (the daemon acts after 1 s)
    connections = _accept_all(listener) + _accept_all(abstract)
    return {"backend": backend, "results": results, "skipped": skipped, "marks": marks, "connections": connections,
            "leftover_workdirs": workdirs() - before, "registries": left_in_registries(),
            "sysv": sysv_segments_of_slots(), "processes": slot_uid_processes() if os.geteuid() == 0 else []}


def _accept_all(sock) -> int:
    """How many connections are waiting (the sockets are non-blocking)."""
    n = 0
    while True:
        try:
            sock.accept()[0].close()
        except BlockingIOError:
            return n
        n += 1


@pytest.mark.parametrize("name", PROGRAMS)
def test_hostile_program_scores_zero_leaves_nothing_and_stays_within_limits(batch, name):
    if name in batch["skipped"]:
        pytest.skip(f"{batch['backend']} does not guarantee {', '.join(batch['skipped'][name])}")
    reward, info, seconds = batch["results"][name]
    assert reward == 0.0, (name, info)
    assert "cleanup" not in info, info["cleanup"]  # whatever it built, the host side was cleaned up
    assert not marked_files(batch["marks"][name])
    if isolation.cgroup_host() is not None:
        assert info["peak_memory_mb"] <= CAP_MB, info
    # each run ends by its wall limit; +6 s for start-up, the kill, a free slot and (rlimits) deleting
    # what it wrote to the host disk, all slowed by the other hostile programs on 2 cores
    assert seconds <= info["runs"] * LIMITS["wall_s"] + 6.0, (seconds, info)


def test_correct_programs_graded_alongside_all_score_one(batch):
    good = {n: r for n, (r, _, _) in batch["results"].items() if n.startswith("good-")}
    assert len(good) == 12 and set(good.values()) == {1.0}, good


def test_nothing_outlives_the_batch(batch):
    assert batch["connections"] == 0  # neither the loopback listener nor the abstract socket was reached
    assert batch["leftover_workdirs"] == set() and batch["registries"] == [] and batch["sysv"] == []
    assert batch["processes"] == []


def test_a_correct_solution_still_scores_one_after_the_batch(batch):
    row = {"tests": CALL_TESTS, "limits": LIMITS, "sandbox": {"backend": batch["backend"], "allow_root": True}}
    reward, info = score(f"```python\n{GOOD['call']}```", row)
    assert reward == 1.0 and info["statuses"] == ["pass"] * 4 and "cleanup" not in info


# --- the same attacks through the verifier runner: 3 worker processes, 4 sandboxes ------------------

THROUGH_RUNNER = ("forge", "exact", "clean", "proc", "hack", "cross", "daemon", "kill")


class Batch:  # the runner reads only these two fields of a Rollouts
    def __init__(self, completions, rows):
        self.completions, self.rows = completions, rows


@pytest.fixture(scope="module", params=[pytest.param(b, marks=pytest.mark.slow) for b in run.BACKENDS])
def runner_batch(request, host):
    """The forgeries, exactness and clean-up programs (and the other reward hacks) as one batch of
    a run: task.verifier_workers=3 worker processes scoring it, task.sandboxes=4, correct programs
    interleaved; each completion is one verifier call with its deadline."""
    backend = request.param
    if backend == "bwrap" and not run.bwrap_works():
        pytest.skip("bubblewrap is missing or cannot create namespaces here (apt-get install bubblewrap)")
    values, _, _ = host
    have = run.guarantees(backend)
    names = [n for n in PROGRAMS if n.split("_")[0] in THROUGH_RUNNER and all(have.get(g, True) for g in header(n)[1])]
    marks = {n: f"rlpost-hostile-{n}-{os.urandom(4).hex()}" for n in names}
    box = {"backend": backend, "parallel": PARALLEL, "allow_root": True}
    jobs = [(n, graded_tests(n, header(n)[0]), source(n, values, marks[n])) for n in names]
    for k in range(8):  # a correct program after every few hostile ones
        jobs.insert(k * (len(names) // 8 + 1), (f"good-{k}", CALL_TESTS, f"```python\n{GOOD['call']}```"))
    runner = VerifierRunner("rlpost.envs.code:score", timeout_s=30, workers=3)
    try:
        rewards, infos, metrics = runner.score(Batch([c for _, _, c in jobs],
                                                     [{"tests": t, "limits": LIMITS, "sandbox": box}
                                                      for _, t, _ in jobs]))
    finally:
        runner.close()
    time.sleep(1.0)
    return {"backend": backend, "rewards": dict(zip([n for n, _, _ in jobs], rewards.tolist())),
            "infos": dict(zip([n for n, _, _ in jobs], infos)), "metrics": metrics, "marks": marks,
            "registries": left_in_registries(), "processes": slot_uid_processes() if os.geteuid() == 0 else []}


def test_through_the_runner_no_hostile_program_is_paid_and_every_correct_one_is(runner_batch):
    paid = {n: (r, runner_batch["infos"][n]) for n, r in runner_batch["rewards"].items()
            if not n.startswith("good-") and r != 0.0}
    good = {n: r for n, r in runner_batch["rewards"].items() if n.startswith("good-")}
    assert not paid, paid
    assert len(good) == 8 and set(good.values()) == {1.0}, good
    assert runner_batch["metrics"]["verifier/errors"] == 0 and runner_batch["metrics"]["verifier/timeouts"] == 0
    for name, info in runner_batch["infos"].items():
        assert set(info.get("statuses", [])) <= set(grading.STATUSES), (name, info)
        assert "cleanup" not in info, (name, info["cleanup"])
    assert not [m for m in runner_batch["marks"].values() if marked_files(m)]
    assert runner_batch["registries"] == [] and runner_batch["processes"] == []
