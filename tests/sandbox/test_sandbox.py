"""The sandbox itself (rlpost/sandbox/: run.py, launch.py, isolation.py): both backends run honest
programs, say exactly what they guarantee, enforce the limits the kernel can enforce, and clean up
whatever a program leaves, without ever raising for it. The hostile programs are in
test_hostile.py; the grading contract is in test_code.py.

bwrap tests skip where bubblewrap cannot run; cgroup tests skip where no cgroup can be made
(neither root nor a delegated v2 subtree), naming what is missing.
"""

import glob
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from rlpost import wire
from rlpost.sandbox import hostdir, isolation, launch, run, slots
from rlpost.sandbox import BACKENDS, Limits, SandboxUnavailable, guarantees, resolve_backend, run_python

ROOT = os.geteuid() == 0
FAST = Limits(wall_s=3.0, cpu_s=2, memory_mb=128, max_disk_mb=16, max_processes=16)


@pytest.fixture(autouse=True)
def rlimits_as_root_allowed(monkeypatch):
    """These tests run the rlimits backend as root on purpose (per-run uids, the tmpfs working
    directory); test_rlimits_as_root_is_refused_unless_allowed unsets it."""
    monkeypatch.setenv(run.ALLOW_ROOT_ENV, "1")


@pytest.fixture(params=BACKENDS)
def backend(request):
    if request.param == "bwrap" and not run.bwrap_works():
        pytest.skip("bubblewrap is missing or cannot create namespaces here (apt-get install bubblewrap)")
    return request.param


needs_cgroup = pytest.mark.skipif(isolation.cgroup_host() is None,
                                  reason="no cgroup can be made here (needs root or a delegated cgroup v2 subtree)")


def test_basic_run_stdin_files_and_exit_codes(backend):
    res = run_python("import pkg.helper\nprint(pkg.helper.X, input()[::-1])", stdin="olleh\n",
                     files={"pkg/helper.py": "X = 7", "pkg/__init__.py": ""}, backend=backend, limits=FAST)
    assert (res.status, res.stdout, res.backend, res.cleanup) == ("ok", "7 hello\n", backend, "")
    assert run_python("import sys; sys.exit(3)", backend=backend, limits=FAST).returncode == 3
    assert run_python("raise ValueError('boom')", backend=backend).stderr.rstrip().endswith("ValueError: boom")
    for bad in ("../escape.py", "/abs.py", "a/../../b.py"):
        with pytest.raises(ValueError):
            run_python("pass", files={bad: ""}, backend=backend)


def test_program_sees_only_its_inputs(backend):
    """Only main.py and its files in the working directory, a scrubbed environment, and no
    descriptor beyond 0-2: nothing the grader holds is reachable (see test_code for the grader)."""
    probe = ("import json, os\nprint(json.dumps([sorted(os.listdir('.')), sorted(os.environ),"
             " sorted(int(f) for f in os.listdir('/proc/self/fd'))]))")
    res = run_python(probe, files={"data.txt": "x"}, backend=backend, limits=FAST)
    files, env, fds = json.loads(res.stdout)
    assert files == ["data.txt", "main.py"]
    assert set(env) - {"PWD"} == {"HOME", "LANG", "MALLOC_ARENA_MAX", "PATH", "TMPDIR"}  # bwrap sets PWD
    assert fds == [0, 1, 2, 3]  # stdin, stdout, stderr, and the descriptor listdir itself opened


def test_bwrap_workdir_is_a_capped_tmpfs_not_the_host_disk():
    if not run.bwrap_works():
        pytest.skip("bubblewrap is missing or cannot create namespaces here")
    probe = ("import os\nst = os.statvfs('.')\nprint(os.getcwd(), st.f_blocks * st.f_frsize >> 20)\n"
             "print(sorted(os.listdir('/')))")
    res = run_python(probe, limits=Limits(max_disk_mb=24), backend="bwrap")
    assert res.stdout.splitlines()[0] == "/sandbox 24"  # --size 24 MiB, at a path that names nothing on the host
    assert set(eval(res.stdout.splitlines()[1])) <= {"bin", "dev", "lib", "lib32", "lib64", "libx32", "proc",
                                                      "sandbox", "sbin", "usr"}


def test_guarantees_name_everything_and_bwrap_with_cgroups_has_them_all():
    names = {"wall_time", "cpu_time", "output_cap", "memory_per_process", "memory_total", "process_count",
             "disk_quota", "tree_kill", "network_isolated", "fs_read_isolated", "fs_write_isolated", "ipc_isolated",
             "userns_blocked", "keyring_isolated", "ptrace_blocked", "parent_protected", "runs_isolated"}
    assert set(guarantees("bwrap")) == set(guarantees("rlimits")) == names
    weak = guarantees("rlimits")
    # What rlimits can never have, on any machine: these need namespaces.
    assert not any(weak[g] for g in ("network_isolated", "fs_read_isolated", "fs_write_isolated", "ipc_isolated",
                                     "runs_isolated", "userns_blocked"))
    assert weak["disk_quota"] == (ROOT and hostdir.can_mount())  # a tmpfs working directory of its own
    assert weak["memory_total"] == (isolation.cgroup_host() is not None)
    assert weak["parent_protected"] == weak["tree_kill"] or isolation.cgroup_host() is not None
    if ROOT and os.access("/sys/fs/cgroup", os.W_OK):  # root with a writable cgroupfs makes cgroups
        assert isolation.cgroup_host() is not None
    if ROOT and isolation.cgroup_host() and os.uname().machine in isolation.SECCOMP_ARCHES \
            and run.bwrap_works() and "--size" in subprocess.run(["/usr/bin/bwrap", "--help"], capture_output=True,
                                                                 text=True).stdout:
        assert all(guarantees("bwrap").values()), guarantees("bwrap")


def test_rlimits_warns_naming_every_missing_guarantee():
    run._warn_missing.cache_clear()
    missing = run.unprotected("rlimits")
    assert missing and all(run.UNPROTECTED[k] in missing for k, ok in guarantees("rlimits").items() if not ok)
    with pytest.warns(RuntimeWarning) as caught:
        run_python("pass", backend="rlimits", limits=FAST)
    text = str(caught[0].message)
    assert all(phrase in text for phrase in missing) and "apt-get install bubblewrap" in text


@pytest.mark.skipif(not ROOT, reason="the refusal is for root")
def test_rlimits_as_root_is_refused_unless_allowed(monkeypatch):
    monkeypatch.delenv(run.ALLOW_ROOT_ENV)
    with pytest.raises(SandboxUnavailable, match="task.sandbox_allow_root=true"):
        run_python("print(1)", backend="rlimits", limits=FAST)
    assert run_python("print(1)", backend="rlimits", limits=FAST, allow_root=True).stdout == "1\n"


def test_naming_bwrap_where_it_cannot_run_refuses(monkeypatch):
    monkeypatch.setattr(run, "bwrap_works", lambda: False)
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap.*task.sandbox=rlimits"):
        resolve_backend("bwrap")
    with pytest.raises(SandboxUnavailable):
        run_python("pass", backend="bwrap")
    assert resolve_backend("rlimits") == "rlimits" and resolve_backend("rlimit") == "rlimits"


def test_bwrap_is_the_system_one_and_a_failed_probe_is_never_silent(monkeypatch, tmp_path):
    """A `bwrap` first on the caller's PATH is never run (the sandbox's PATH is /usr/bin:/bin, so
    the probe used to ask one bwrap and the runs use another); and when `bwrap --help` cannot be
    read, bwrap is unusable, not used without --size and --disable-userns."""
    fake = tmp_path / "bwrap"
    fake.write_text(f"#!/bin/sh\ntouch {tmp_path}/ran\necho --unshare-all\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    probes = (run.launch.bwrap_path, run.launch.bwrap_flags, run.bwrap_works)  # cached once per process
    for f in probes:
        f.cache_clear()
    try:
        assert run.launch.bwrap_path() in (None, "/usr/bin/bwrap", "/bin/bwrap")
        if run.launch.bwrap_path() is not None:
            assert run.launch.bwrap_flags() is not None and run.bwrap_works()
            run_python("print(1)", backend="bwrap", limits=FAST)
        assert not (tmp_path / "ran").exists()
        for f in probes:
            f.cache_clear()
        monkeypatch.setattr(run.launch, "bwrap_path", lambda: str(fake))  # a bwrap whose --help fails
        (fake.write_text("#!/bin/sh\nexit 1\n"), fake.chmod(0o755))
        assert run.launch.bwrap_flags() is None and not run.bwrap_works()
        with pytest.raises(SandboxUnavailable):
            run_python("print(1)", backend="bwrap", limits=FAST)
    finally:
        for f in probes:
            f.cache_clear()


def test_bwraps_own_init_is_out_of_the_programs_reach():
    if not run.bwrap_works():
        pytest.skip("bubblewrap is missing or cannot create namespaces here")
    probe = ("import os\nout = []\nfor name in ('mem', 'maps', 'environ', 'fd'):\n    try:\n"
             "        out.append(len(os.listdir('/proc/1/fd')) if name == 'fd' else len(open('/proc/1/' + name, "
             "'rb').read(64)))\n    except OSError as e:\n        out.append(e.errno)\n"
             "print(out, os.getppid(), sorted(os.listdir('/proc/1')))")
    res = run_python(probe, backend="bwrap", limits=FAST)
    assert res.stdout == "[2, 2, 2, 2] 1 []\n", res  # ENOENT each: /proc/1 is an empty read-only tmpfs


# --- kernel-enforced limits --------------------------------------------------------------------


@needs_cgroup
def test_run_cgroup_has_the_caps_and_is_gone_after(backend, monkeypatch):
    """While the program runs, the parent reads its cgroup's caps; afterwards it is removed. The cgroup watched is
    the one this run made (its name taken as it is made): another test's sandbox run on the machine at the same
    time (an xdist worker beside this one) makes its own rlpost-slot cgroups, with other caps."""
    host = isolation.cgroup_host()
    seen, ours, real = {}, [], isolation.RunCgroup
    monkeypatch.setattr(isolation, "RunCgroup", lambda h, name, *a, **kw: ours.append(name) or real(h, name, *a, **kw))

    def watch():
        while not done.is_set() and not seen:
            for name in os.listdir(host.pids):
                if name in ours:
                    mem = "memory.max" if host.version == 2 else "memory.limit_in_bytes"
                    try:
                        pids = open(f"{host.pids}/{name}/pids.max").read().strip()
                        # written last (isolation.RunCgroup): read before it, the caps are not all set yet
                        if pids != "max":
                            seen.update(pids=pids, mem=int(open(f"{host.memory}/{name}/{mem}").read()), cgroup=name)
                    except OSError:
                        pass
            time.sleep(0.01)

    done = threading.Event()
    t = threading.Thread(target=watch)
    t.start()
    try:
        res = run_python("import time; time.sleep(1)", backend=backend,
                         limits=Limits(wall_s=20.0, memory_mb=100, max_disk_mb=20, max_processes=10))
    finally:
        done.set()
        t.join()
    assert res.status == "ok" and res.cleanup == ""
    assert (seen["pids"], seen["mem"]) == ("13", 120 << 20)  # 10 + 3 (bwrap, its init, the shim); 100 + 20 MiB
    assert seen["cgroup"] not in os.listdir(host.pids)


@needs_cgroup
def test_memfd_pages_count_against_the_run(backend):
    """RLIMIT_AS never sees memfd pages; the cgroup does: 40 x 8 MB stops at the 120 MB cap."""
    fill = ("import os\nfor i in range(40):\n    fd = os.memfd_create('m')\n"
            "    for k in range(8):\n        os.pwrite(fd, b'x' * (1 << 20), k << 20)\nprint('all')")
    res = run_python(fill, backend=backend, limits=Limits(memory_mb=100, max_disk_mb=20))
    assert res.status == "memory" and "all" not in res.stdout and res.peak_memory_mb <= 120


def test_seccomp_blocks_keyrings_and_ptrace(backend):
    if isolation.seccomp_filter() is None:
        pytest.skip(f"no seccomp syscall table for {os.uname().machine}")
    probe = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
             f"nrs = {isolation.SECCOMP_ARCHES[os.uname().machine][1]}\n"
             "print(libc.syscall(nrs[2], 0, -3, 0, 0, 0), ctypes.get_errno(), libc.ptrace(16, 1, 0, 0), "
             "ctypes.get_errno())")
    res = run_python(probe, backend=backend, limits=FAST)
    assert res.stdout.split() == ["-1", "1", "-1", "1"]  # keyctl(GET_KEYRING_ID, session) and PTRACE_ATTACH: EPERM


def test_seccomp_filter_program_is_well_formed():
    # 4 arch/nr loads and checks, 2 for x32, one compare per refused call, allow, EPERM: 8 bytes each
    bpf = isolation.seccomp_filter()
    if bpf is None:
        pytest.skip(f"no seccomp syscall table for {os.uname().machine}")
    n = 4 + (2 if os.uname().machine == "x86_64" else 0) + 6 + 2
    assert len(bpf) == 8 * n and bpf[-8:] == bytes([6, 0, 0, 0, 1, 0, 5, 0])  # RET ERRNO(EPERM)


@pytest.mark.skipif(not ROOT, reason="per-run uids need root")
def test_concurrent_runs_get_their_own_uid():
    """Two runs at once: under rlimits each sees a different slot uid, never root or nobody.

    The two programs meet in a shared folder (each waits until the other has written its uid), so
    they certainly ran at the same time: with sleeps instead, a loaded machine (or another test run
    holding slot 0 of the machine-wide pool) could run them one after the other on the same slot."""
    meet = tempfile.mkdtemp(prefix="rlpost-meet-", dir="/dev/shm")
    os.chmod(meet, 0o777)
    # each uid written whole under a temporary name, then renamed: read as the file was being written, the other
    # run's uid came back '' (seen once in CI under load)
    program = (f"import json, os, time\n"
               f"name = os.path.join({meet!r}, os.urandom(8).hex())\n"
               f"with open(name + '.tmp', 'w') as f:\n    f.write(str(os.getuid()))\n"
               f"os.rename(name + '.tmp', name)\n"
               f"done = lambda: [n for n in os.listdir({meet!r}) if not n.endswith('.tmp')]\n"
               f"stop = time.monotonic() + 40\nwhile len(done()) < 2 and time.monotonic() < stop:\n"
               f"    time.sleep(0.01)\nprint(json.dumps(sorted(open(os.path.join({meet!r}, n)).read() "
               f"for n in done())))")
    out = []
    threads = [threading.Thread(target=lambda: out.append(run_python(
        program, backend="rlimits", parallel=2, limits=Limits(wall_s=60.0, cpu_s=2, memory_mb=128, max_processes=16))))
        for _ in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for name in os.listdir(meet):
            os.unlink(os.path.join(meet, name))
        os.rmdir(meet)
    assert all(res.status == "ok" for res in out), out
    seen = [json.loads(res.stdout) for res in out]  # each run's view of both uids, once they met
    assert seen[0] == seen[1] and len(seen[0]) == 2, seen
    uids = {int(u) for u in seen[0]}
    lo = slots.SLOT_UID_BASE + 1024  # the rlimits block of slot uids
    assert len(uids) == 2 and all(lo <= u < lo + 2 for u in uids)


@pytest.mark.slow  # several seconds of process start-up; make test runs it, make test-fast skips it
def test_slots_bound_how_many_run_at_once(backend):
    """Judged from when each program ran (its own clock readings), not from the batch's wall time,
    which a loaded machine stretches: with 1 slot no two runs overlap, with 2 never three, and
    with 3 slots at least two do (the pool is machine-wide: another test run may hold a slot)."""
    def most_at_once(parallel):
        spans = []
        program = "import time; t = time.time(); time.sleep(1.0); print(t, time.time())"
        threads = [threading.Thread(target=lambda: spans.append(run_python(
            program, backend=backend, parallel=parallel, limits=Limits(wall_s=30.0, cpu_s=2, memory_mb=128,
                                                                        max_disk_mb=16, max_processes=16))))
            for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(res.status == "ok" for res in spans), spans
        edges = sorted((float(x), step) for res in spans for x, step in zip(res.stdout.split(), (1, -1)))
        return max(itertools.accumulate(step for _, step in edges))  # an end sorts before a start at the same time

    assert most_at_once(1) == 1 and most_at_once(2) <= 2 and most_at_once(3) >= 2


@pytest.mark.slow  # several seconds of process start-up; make test runs it, make test-fast skips it
@pytest.mark.skipif(not ROOT, reason="per-run uids need root")
def test_rlimits_fork_bomb_then_correct_run_on_the_same_slot():
    """The bomb's orphans are reaped before its slot is given back: the next run on that slot
    (same uid) can still fork, so a correct program is not refused because of the previous one."""
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    lim = Limits(wall_s=1.0, cpu_s=1, max_processes=16)
    assert run_python(bomb, backend="rlimits", parallel=1, limits=lim).status == "timeout"
    res = run_python("import os\npid = os.fork()\nif pid == 0: os._exit(0)\nos.waitpid(pid, 0); print('forked')",
                     backend="rlimits", parallel=1, limits=lim)
    assert res.stdout == "forked\n", res


# --- reaping what a run orphans ------------------------------------------------------------------

# A child subreaper, as every verifier worker is (wire.die_with): each run's orphans become its
# children. It starts a child of its own that has exited (its Popen has not waited yet), runs N
# programs that each fork a child and exit, and prints the run statuses, its zombie children other
# than its own, and the exit status its own child's Popen reads.
SUBREAPER = r"""import ctypes, json, os, subprocess, sys
assert ctypes.CDLL(None).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
from rlpost.sandbox import Limits, run_python
own = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(7)"])
os.waitid(os.P_PID, own.pid, os.WEXITED | os.WNOWAIT)  # exited, left unreaped: its Popen's to read
program = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\nprint(input())"
runs = [run_python(program, stdin=f"{i}\n", backend=sys.argv[1], limits=Limits(wall_s=10), parallel=2).stdout
        for i in range(int(sys.argv[2]))]
zombies = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        state, ppid = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[:2]
    except OSError:
        continue
    if int(ppid) == os.getpid() and state == "Z" and int(pid) != own.pid:
        zombies.append(pid)
print(json.dumps([runs, zombies, own.wait()]))
"""


def test_a_subreaper_is_left_no_zombie_and_keeps_its_own_childs_status(backend):
    """Run by a child subreaper, no run leaves it a zombie (under bwrap, each run's pid 1 was left one
    until it hit the process limit and bwrap could not fork), and reaping them never takes the exit
    status of a child it started itself."""
    out = subprocess.run([sys.executable, "-c", SUBREAPER, backend, "12"], capture_output=True, text=True,
                         timeout=120)
    runs, zombies, own_status = json.loads(out.stdout.splitlines()[-1])
    assert runs == [f"{i}\n" for i in range(12)], out.stderr
    assert zombies == [] and own_status == 7


@pytest.mark.slow  # ~20 s: several hundred sandbox runs, 2 cores
def test_code_grading_through_the_verifier_workers_leaves_them_no_zombie():
    """The code task graded by the real verifier worker processes (child subreapers) for several
    hundred sandbox runs in each backend: every correct program is paid, and the workers are left
    no zombie and no process at all (the issue: one zombie per bubblewrap run, 2,128 at the peak,
    then bwrap could not fork and every later sample scored 0)."""
    from rlpost.rewards.runner import VerifierRunner
    from rlpost.wire import descendants

    class Batch:  # the runner reads only these two fields of a Rollouts
        def __init__(self, completions, rows):
            self.completions, self.rows = completions, rows

    program = "```python\nimport os, time\nif os.fork() == 0:\n    time.sleep(60)\nprint(2 * int(input()))\n```"
    backends = [b for b in BACKENDS if b == "rlimits" or run.bwrap_works()]
    for backend in backends:
        row = {"tests": [{"stdin": f"{i}\n", "stdout": f"{2 * i}"} for i in range(8)],
               "limits": {"wall_s": 10.0, "memory_mb": 128},
               "sandbox": {"backend": backend, "parallel": 2, "allow_root": True}}
        runner = VerifierRunner("rlpost.envs.code:score", timeout_s=120, workers=2)
        try:
            rewards, infos, metrics = runner.score(Batch([program] * 20, [row] * 20))  # 160 sandbox runs
            assert rewards.tolist() == [1.0] * 20, infos
            assert sum(info["runs"] for info in infos) == 160 and metrics["verifier/errors"] == 0
            left = {pid: len(descendants(pid)) for pid in runner.pids()}  # zombies included
            assert list(left.values()) == [0, 0], (backend, left)
        finally:
            runner.close()


@pytest.mark.skipif(not ROOT, reason="bwrap runs as the slot's uid only as root; as a user the limit counts ours")
def test_a_program_the_sandbox_never_started_is_a_grading_error_not_a_wrong_answer():
    """bwrap inherits the process limit of the slot's uid; once its runs' zombies filled it, bwrap
    could not fork ("Can't fork for pid 1") and every sample scored 0 as if wrong. Such a run says
    the sandbox never started the program, and the grade says it is a grading error; a program that
    fails by itself is not one."""
    import resource

    from rlpost.envs.grading import grade

    if not run.bwrap_works():
        pytest.skip("bubblewrap is missing or cannot create namespaces here")
    tests, program = ["assert double(4) == 8"], "def double(x):\n    return 2 * x"
    soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    resource.setrlimit(resource.RLIMIT_NPROC, (1, hard))  # the outer bwrap, and no process more of its uid
    try:
        res = run_python("print(1)", backend="bwrap", limits=FAST)
        reward, info = grade(program, tests, FAST, "bwrap", 1)
    finally:
        resource.setrlimit(resource.RLIMIT_NPROC, (soft, hard))
    assert res.status == "error" and "the sandbox never started the program" in res.sandbox_error, res
    assert "bwrap:" in res.sandbox_error and (reward, info["grading_error"]) == (0.0, True), info
    assert "never started" in info["sandbox_error"]
    reward, info = grade("def double(x):\n    raise SystemExit(1)", tests, FAST, "bwrap", 1)
    assert (reward, info["grading_error"]) == (0.0, False) and "sandbox_error" not in info, info
    assert run_python("import sys; sys.exit(3)", backend="bwrap", limits=FAST).sandbox_error == ""
    assert grade(program, tests, FAST, "bwrap", 1)[0] == 1.0


# --- what a killed worker leaves --------------------------------------------------------------


def test_cgroup_dirs_parsed_from_mountinfo(monkeypatch, tmp_path):
    """A v2-only host inside a cgroup namespace: /proc/self/cgroup says '0::/', the mount root is '/'."""
    mountinfo = tmp_path / "mountinfo"
    cgroup = tmp_path / "cgroup"
    mountinfo.write_text("30 25 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
                         "31 25 0:27 /sub /mnt/v1mem rw - cgroup cgroup rw,memory\n")
    cgroup.write_text("0::/job/worker\n4:memory:/sub/job\n")
    real_open = open
    monkeypatch.setattr("builtins.open", lambda p, *a, **k: real_open(
        {"/proc/self/mountinfo": mountinfo, "/proc/self/cgroup": cgroup}.get(p, p), *a, **k))
    assert isolation.own_cgroup_dirs() == {"": "/sys/fs/cgroup/job/worker", "memory": "/mnt/v1mem/job"}


@pytest.mark.parametrize("opened", [True, False])
def test_the_boot_shim_runs_the_program_only_once_its_gate_is_opened(tmp_path, opened):
    """The rlimits boot shim waits at its gate until the parent has placed it in its cgroup. If the
    parent dies first, the gate reads end of file: the shim exits and the program never runs
    outside its cgroup's caps."""
    (tmp_path / launch.MAIN).write_text("open('ran', 'w').write('yes')\n")
    gate_r, gate_w = os.pipe()
    started_r, started_w = os.pipe()
    shim = subprocess.Popen([sys.executable, "-c", launch.BOOT, str(gate_r), str(started_w), "10", str(4 << 30),
                             "4096", str(1 << 20), "-", launch.MAIN], cwd=tmp_path, pass_fds=(gate_r, started_w),
                            stderr=subprocess.PIPE)
    os.close(gate_r)
    os.close(started_w)
    if opened:
        os.write(gate_w, b"\n")
    os.close(gate_w)
    err = shim.communicate(timeout=60)[1].decode()
    began = os.read(started_r, 1)
    os.close(started_r)
    assert (shim.returncode == 0, began, (tmp_path / "ran").exists()) == (opened, b"1" if opened else b"", opened), err
    assert opened or "parent died before opening the gate" in err


@pytest.mark.skipif(not ROOT, reason="per-run uids need root")
def test_a_worker_killed_mid_run_leaves_nothing_to_the_next_run():
    """A verifier worker SIGKILLed by the runner's timeout while its rlimits program runs: the
    program is orphaned, still running under the slot's uid, and its cgroup and working directory
    are still there. The next run on that slot finds them in the slot's registry, kills the
    program and removes both before it starts."""
    lo = slots.SLOT_UID_BASE + 1024  # slot 0 of the rlimits block
    worker = subprocess.Popen([sys.executable, "-c", "from rlpost.sandbox import Limits, run_python\n"
                               "run_python('import time; time.sleep(60)', backend='rlimits', parallel=1, "
                               "limits=Limits(wall_s=60), allow_root=True)"],
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    alive = lambda: [p.pid for p in wire.processes(uids=True) if p.uid == lo and p.state not in "ZX"]
    # the program itself, past the boot shim's gate: a shim still held there when the worker dies exits
    running = lambda: [p for p in alive() if argv(p)[-2:] == ["-B", launch.MAIN]]  # the shim's ends [bpf, MAIN]
    deadline = time.monotonic() + 90  # the worker waits for slot 0 and clears what an earlier holder left first
    while not running() and worker.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    started, exited = bool(running()), worker.poll()
    worker.kill()
    worker.wait()
    assert started, (f"the worker (exit status {exited}) never started its program under uid {lo} in 90 s; "
                     f"slot 0's lock: {slot_lock_holders()}")
    assert alive(), "the orphaned program should still be running"
    fd = os.open(f"{slots.slot_dir()}/slot-0.lock", os.O_RDONLY)
    left = slots.read_registry(fd)
    os.close(fd)
    assert {e["kind"] for e in left} >= {"workdir"} and all(os.path.exists(e["path"]) for e in left)
    res = run_python("print('next')", backend="rlimits", parallel=1, limits=FAST)
    assert res.stdout == "next\n" and res.cleanup == "" and not alive()
    assert not [e for e in left if os.path.exists(e["path"])], (left, res)  # its cgroups and its working directory


def argv(pid: int) -> list[str]:
    """A process's command line; [] once it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def slot_lock_holders() -> list[str]:
    """Who holds a lock on rlimits slot 0's lock file, from /proc/locks: what a stuck test reports."""
    ino = os.stat(f"{slots.slot_dir()}/slot-0.lock").st_ino
    holders = []
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if len(fields) > 5 and fields[5].rsplit(":", 1)[-1] == str(ino):
            pid = fields[4]
            try:
                holders.append(f"{pid} {Path(f'/proc/{pid}/cmdline').read_bytes().replace(bytes(1), b' ')[:200]!r}")
            except OSError:
                holders.append(f"{pid} (gone)")
    return holders
