"""The sandbox itself (rlpost/sandbox/: run.py, launch.py, isolation.py): both backends run honest
programs, say exactly what they guarantee, enforce the limits the kernel can enforce, and clean up
whatever a program leaves, without ever raising for it. The hostile programs are in
test_hostile.py; the grading contract is in test_code.py.

bwrap tests skip where bubblewrap cannot run; cgroup tests skip where no cgroup can be made
(neither root nor a delegated v2 subtree), naming what is missing.
"""

import glob
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from rlpost.sandbox import isolation, run
from rlpost.sandbox import BACKENDS, Limits, SandboxUnavailable, guarantees, resolve_backend, run_python

ROOT = os.geteuid() == 0
FAST = Limits(wall_s=3.0, cpu_s=2, memory_mb=128, max_disk_mb=16, max_processes=16)


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
                                     "disk_quota", "runs_isolated", "userns_blocked"))
    assert weak["memory_total"] == (isolation.cgroup_host() is not None)
    assert weak["parent_protected"] == weak["tree_kill"] or isolation.cgroup_host() is not None
    if ROOT and os.access("/sys/fs/cgroup", os.W_OK):  # root with a writable cgroupfs makes cgroups
        assert isolation.cgroup_host() is not None
    if ROOT and isolation.cgroup_host() and os.uname().machine in isolation.SECCOMP_ARCHES \
            and run.bwrap_works() and "--size" in subprocess.run(["bwrap", "--help"], capture_output=True, text=True).stdout:
        assert all(guarantees("bwrap").values()), guarantees("bwrap")


def test_rlimits_warns_naming_every_missing_guarantee():
    run._warn_missing.cache_clear()
    missing = sorted(k for k, ok in guarantees("rlimits").items() if not ok)
    with pytest.warns(RuntimeWarning) as caught:
        run_python("pass", backend="rlimits", limits=FAST)
    text = str(caught[0].message)
    assert all(name in text for name in missing) and "apt-get install bubblewrap" in text


def test_naming_bwrap_where_it_cannot_run_refuses(monkeypatch):
    monkeypatch.setattr(run, "bwrap_works", lambda: False)
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap.*task.sandbox=rlimits"):
        resolve_backend("bwrap")
    with pytest.raises(SandboxUnavailable):
        run_python("pass", backend="bwrap")
    assert resolve_backend("rlimits") == "rlimits" and resolve_backend("rlimit") == "rlimits"


# --- kernel-enforced limits --------------------------------------------------------------------


@needs_cgroup
def test_run_cgroup_has_the_caps_and_is_gone_after(backend):
    """While the program runs, the parent reads its cgroup's caps; afterwards it is removed."""
    host = isolation.cgroup_host()
    seen = {}

    def watch():
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not seen:
            for name in os.listdir(host.pids):
                if name.startswith(f"rlpost-{os.getpid()}-"):
                    mem = "memory.max" if host.version == 2 else "memory.limit_in_bytes"
                    try:
                        pids = open(f"{host.pids}/{name}/pids.max").read().strip()
                        if pids != "max":  # written last (isolation.RunCgroup): read before it, the caps are not all set yet
                            seen.update(pids=pids, mem=int(open(f"{host.memory}/{name}/{mem}").read()))
                    except OSError:
                        pass
            time.sleep(0.01)

    t = threading.Thread(target=watch)
    t.start()
    res = run_python("import time; time.sleep(1)", backend=backend,
                     limits=Limits(memory_mb=100, max_disk_mb=20, max_processes=10))
    t.join()
    assert res.status == "ok" and res.cleanup == ""
    assert seen == {"pids": "13", "mem": 120 << 20}  # 10 + 3 (bwrap, its init, the shim); 100 + 20 MiB
    assert not [n for n in os.listdir(host.pids) if n.startswith(f"rlpost-{os.getpid()}-")]


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
             "print(libc.syscall(nrs[2], 0, -3, 0, 0, 0), ctypes.get_errno(), libc.ptrace(16, 1, 0, 0), ctypes.get_errno())")
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
    """Two runs at once: under rlimits each sees a different slot uid, never root or nobody."""
    out = []
    threads = [threading.Thread(target=lambda: out.append(run_python(
        "import os, time; time.sleep(0.5); print(os.getuid())", backend="rlimits", parallel=2, limits=FAST).stdout))
        for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    uids = {int(u) for u in out}
    lo = isolation.SLOT_UID_BASE + 1024  # the rlimits block of slot uids
    assert len(uids) == 2 and all(lo <= u < lo + 2 for u in uids)


@pytest.mark.slow  # several seconds of process start-up; make test runs it, make test-fast skips it
def test_slots_bound_how_many_run_at_once(backend):
    # 3 runs of 0.6 s with 1 slot take >= 1.8 s (serial); with 3 slots about one run's time
    def three(parallel):
        t0 = time.monotonic()
        threads = [threading.Thread(target=run_python, args=("import time; time.sleep(0.6)",),
                                    kwargs={"backend": backend, "parallel": parallel, "limits": FAST}) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.monotonic() - t0

    assert three(1) >= 1.8 and three(3) < 1.6


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


# --- cleanup -------------------------------------------------------------------------------------

# The deep trees below are what is deleted, not the disk they are on: on this machine's ext4 each
# rmdir costs ~3 ms (a 3000-deep tree, ~10 s), on a tmpfs ~30 us; remove_tree makes the same calls
# on either. So they are built on /dev/shm (world-writable like /tmp) where there is one.
SHM = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


@pytest.fixture
def tree_dir(request):
    """An empty folder on /dev/shm where there is one, else pytest's tmp_path."""
    if SHM is None:
        yield str(request.getfixturevalue("tmp_path"))
        return
    d = tempfile.mkdtemp(dir=SHM, prefix="rlpost-test-")
    yield d
    subprocess.run(["rm", "-rf", d])


def test_remove_tree_deletes_any_depth_without_recursion(tree_dir):
    top = os.path.join(tree_dir, "t")
    os.mkdir(top)
    fd = os.open(top, os.O_RDONLY)
    for _ in range(3000):  # deeper than the recursion limit, and than PATH_MAX allows by name
        os.mkdir("dd", dir_fd=fd)
        os.close(os.open("f", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd))
        nxt = os.open("dd", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    os.close(fd)
    os.chmod(os.path.join(top, "dd"), 0)  # and unreadable near the top
    isolation.remove_tree(top)
    assert not os.path.exists(top)


def test_rlimits_deep_tree_is_cleaned_and_a_cleanup_failure_is_reported_not_raised(monkeypatch):
    if SHM is not None:  # the run's working directory (run.py: tempfile.mkdtemp) goes there
        monkeypatch.setattr(tempfile, "tempdir", SHM)
    tree = "import os\nfor _ in range(1200):\n    os.mkdir('d'); os.chdir('d')\nos.chmod('..', 0)\nprint('built')"
    res = run_python(tree, backend="rlimits", limits=FAST)
    assert (res.status, res.stdout, res.cleanup) == ("ok", "built\n", "")

    real, left = isolation.remove_tree, []

    def broken(path):
        left.append(path)
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(isolation, "remove_tree", broken)
    res = run_python("print('fine')", backend="rlimits", limits=FAST)
    real(left[0])  # what the broken cleanup left behind
    assert res.status == "ok" and res.stdout == "fine\n" and "RecursionError" in res.cleanup


@needs_cgroup
def test_stale_cgroups_of_dead_workers_are_swept():
    host = isolation.cgroup_host()
    dead = 4_000_000  # above pid_max: no live process has this pid
    paths = [os.path.join(b, f"rlpost-{dead}-0-test") for b in dict.fromkeys((host.memory, host.pids, host.kill, host.cpu)) if b]
    for p in paths:
        os.mkdir(p)
    assert isolation.sweep_stale_cgroups() >= len(paths) and not any(os.path.exists(p) for p in paths)


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
    assert isolation._own_cgroup_dirs() == {"": "/sys/fs/cgroup/job/worker", "memory": "/mnt/v1mem/job"}


@pytest.mark.skipif(not ROOT, reason="per-run uids need root")
def test_a_worker_killed_mid_run_leaves_nothing_to_the_next_run(monkeypatch):
    """A verifier worker SIGKILLed by the runner's timeout while its rlimits program runs: the
    program is orphaned, still running under the slot's uid. The next run on that slot finds the
    slot dirty, kills it and sweeps the dead worker's cgroups before it starts."""
    lo = isolation.SLOT_UID_BASE + 1024  # slot 0 of the rlimits block
    monkeypatch.setattr(run, "_swept", [0])  # this process has swept already: only the dirty slot can tell
    worker = subprocess.Popen([sys.executable, "-c", "from rlpost.sandbox import Limits, run_python\n"
                               "run_python('import time; time.sleep(60)', backend='rlimits', parallel=1, limits=Limits(wall_s=60))"],
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    alive = lambda: [p for p, state, _, uid in isolation._processes() if uid == lo and state not in "ZX"]
    deadline = time.monotonic() + 20
    while not alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    worker.kill()
    worker.wait()
    assert alive(), "the orphaned program should still be running"
    res = run_python("print('next')", backend="rlimits", parallel=1, limits=FAST)
    assert res.stdout == "next\n" and res.cleanup == "" and not alive()
    host = isolation.cgroup_host()
    if host is not None:
        assert not [n for n in os.listdir(host.pids) if n.startswith(f"rlpost-{worker.pid}-")]
    assert not glob.glob(os.path.join(tempfile.gettempdir(), f"rlpost-sbx-{worker.pid}-*"))  # its working directory
