"""Run model-written Python without letting it touch the trainer, the machine or the network.

A code-task reward means executing whatever the policy wrote. During RL the policy explores, so
sooner or later it writes an infinite loop, a fork bomb, a 10 GB allocation or a
``print`` in a ``while True``; and a policy that finds it can read the tests, the user's SSH key
or the trainer's memory will learn to. ``run_python`` runs one program under a set of limits and
always returns a ``Result``; nothing the program does can raise in, block or kill the caller.

Two backends, chosen once per process (``RLPOST_SANDBOX=auto|bwrap|rlimit``, default auto):

bwrap (bubblewrap), used wherever it exists *and* a trivial program actually runs under it
(containers often disable user namespaces, so the binary being present proves nothing):
  * new user, pid, network, ipc, uts and mount namespaces (``--unshare-all``): no network at all,
    not even the host's localhost; the pid namespace hides every outside process, and when the
    outer bwrap dies (``--die-with-parent``) the kernel kills everything inside;
  * the root is an empty tmpfs, remounted read-only, with read-only binds of /usr and the /lib*,
    /bin links: no /etc, no /home, no /tmp. The only writable place is the throwaway working
    directory, bound at /sandbox and deleted afterwards;
  * the program runs as uid 65534 inside. When *we* are root it must also be 65534 outside, so
    bwrap itself is started as nobody: a process whose real uid is 0 ignores RLIMIT_NPROC (the
    kernel exempts INIT_USER), which would leave a fork bomb uncapped;
  * rlimits are set *inside* the sandbox by a tiny boot shim that then execs the program, so
    RLIMIT_NPROC counts only processes in the sandbox's own user namespace, not every process
    the same uid owns on the machine.
  The interpreter is the system /usr/bin/python3 (stdlib only): it lives under /usr, which is
  bound anyway, whereas sys.executable is often a venv or pyenv build under $HOME, and binding
  $HOME is exactly what must not happen. Only when /usr/bin/python3 is missing is
  sys.base_prefix bound read-only at its own path and sys.executable used.

rlimit (fallback): a plain subprocess in a new session, through the same boot shim (same
rlimits), with a scrubbed environment and a temp working directory; when we are root it runs as
nobody (so RLIMIT_NPROC binds and it cannot signal root processes, though it can signal other
processes of nobody). It has no network isolation, the filesystem stays readable (and
world-writable places like /tmp writable), and a child that calls setsid() escapes the final
process-group kill. Run as a non-root user it also shares RLIMIT_NPROC with, and can signal,
every process of that user, the trainer included. ``guarantees()`` says exactly which properties
hold, and the first fallback run warns once, loudly.

Cost: one run of a trivial program takes ~25-35 ms with either backend (measured on a 2-core
container); the bwrap probe is one such run, once per process.

Limits are per process: memory_mb caps each process's address space, so the worst case is
max_processes x memory_mb (there is no cgroup here to cap the total). Threads count against
both caps (each reserves a stack; MALLOC_ARENA_MAX=2 stops glibc reserving 64 MB per thread). RLIMIT_FSIZE caps each
file, not the directory: a program can still write many files until its wall time runs out.
"""

from __future__ import annotations

import functools
import math
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass

NOBODY = 65534
INSIDE = "/sandbox"  # the working directory as the program sees it under bwrap
MAIN = "main.py"
KILL_WAIT_S = 2.0  # after a kill, how long to wait for the pipes to close

# Boot shim: set the rlimits on itself, then become the program (same pid, limits inherited).
# It runs inside the sandbox, so RLIMIT_NPROC is counted in the sandbox's own user namespace.
# CPU gets a 1 s gap between the soft limit (SIGXCPU, which kills Python) and the hard one
# (SIGKILL), for programs that catch SIGXCPU.
BOOT = """import os, resource as r, sys
cpu, mem, nproc, fsize = map(int, sys.argv[1:5])
for k, v in ((r.RLIMIT_CPU, (cpu, cpu + 1)), (r.RLIMIT_AS, (mem, mem)), (r.RLIMIT_NPROC, (nproc, nproc)),
             (r.RLIMIT_FSIZE, (fsize, fsize)), (r.RLIMIT_CORE, (0, 0))):
    r.setrlimit(k, v)
os.execv(sys.executable, [sys.executable, "-E", "-s", "-B", sys.argv[5]])
"""


@dataclass
class Limits:
    wall_s: float = 5.0
    """wall-clock seconds before the whole process tree is killed"""
    cpu_s: float = 5
    """CPU seconds per process (RLIMIT_CPU)"""
    memory_mb: int = 512
    """address space per process (RLIMIT_AS)"""
    max_processes: int = 32
    """processes and threads in the sandbox (RLIMIT_NPROC)"""
    max_output_bytes: int = 1 << 20
    """cap on stdout and on stderr; the program is killed when either goes over"""
    max_file_mb: int = 16
    """largest file the program may write (RLIMIT_FSIZE)"""


@dataclass
class Result:
    status: str  # "ok" | "error" (non-zero exit) | "timeout" | "memory" | "output_limit" | "killed"
    returncode: int | None  # exit code; -N = killed by signal N (bwrap's 128 + N is mapped to -N)
    stdout: str  # decoded, at most max_output_bytes
    stderr: str  # decoded, at most max_output_bytes
    wall_s: float
    backend: str  # "bwrap" | "rlimit"


# --- backend choice -------------------------------------------------------------------------


def _python() -> str:
    """The interpreter to run inside; see the module docstring for why the system one."""
    # realpath: a venv's bin/python is a link into sys.base_prefix, the only tree bwrap binds
    return "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else os.path.realpath(sys.executable)


def _as_nobody() -> dict:
    """Popen arguments that drop root to nobody (done in C by Popen, no preexec_fn)."""
    return {"user": NOBODY, "group": NOBODY, "extra_groups": []} if os.geteuid() == 0 else {}


@functools.cache
def _bwrap_flags() -> frozenset[str]:
    """Optional flags this bwrap knows (older releases lack --disable-userns)."""
    try:
        out = subprocess.run(["bwrap", "--help"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    return frozenset(f for f in ("--disable-userns",) if f in out.stdout + out.stderr)


@functools.cache
def bwrap_works() -> bool:
    """Probe once per process: does a trivial program really run under our bwrap command?"""
    if shutil.which("bwrap") is None:
        return False
    res = run_python("print(6 * 7)", limits=Limits(wall_s=20), backend="bwrap")
    return res.status == "ok" and res.stdout.strip() == "42"


def active_backend() -> str:
    """The backend run_python uses when none is named: RLPOST_SANDBOX, else bwrap if it works."""
    choice = os.environ.get("RLPOST_SANDBOX", "auto")
    if choice not in ("auto", "bwrap", "rlimit"):
        raise ValueError(f"RLPOST_SANDBOX={choice!r}: expected auto, bwrap or rlimit")
    if choice == "bwrap" and not bwrap_works():
        raise RuntimeError("RLPOST_SANDBOX=bwrap but bubblewrap is missing or cannot run here")
    if choice == "auto":
        return "bwrap" if bwrap_works() else "rlimit"
    return choice


def guarantees(backend: str | None = None) -> dict[str, bool]:
    """Which isolation properties hold for `backend` (default: the active one) on this machine."""
    backend = backend or active_backend()
    root = os.geteuid() == 0
    full = backend == "bwrap"
    return {
        "wall_time": True, "cpu_time": True, "memory_per_process": True, "output_cap": True,
        "throwaway_dir": True,
        # Fallback as a non-root user: RLIMIT_NPROC counts *all* that user's processes, so it
        # still caps a fork bomb, but the cap is shared with the trainer itself.
        "process_count": True,
        "network_isolated": full,
        "fs_read_isolated": full,  # fallback: everything world-readable is readable
        "fs_write_isolated": full,  # fallback: /tmp and other world-writable places are writable
        "tree_kill": full,  # fallback: a child that calls setsid() survives the group kill
        "parent_protected": full or root,  # fallback as root runs as nobody: cannot signal root
    }


@functools.cache
def _warn_fallback() -> None:
    missing = sorted(k for k, ok in guarantees("rlimit").items() if not ok)
    warnings.warn(
        "rlpost.envs.sandbox: running model-written code under the rlimit FALLBACK (bubblewrap "
        f"missing or unusable, or RLPOST_SANDBOX=rlimit). Missing guarantees: {', '.join(missing)}. Install bubblewrap "
        "(apt-get install bubblewrap) before training on untrusted code.", RuntimeWarning, stacklevel=3)


# --- command lines --------------------------------------------------------------------------


def _boot_args(limits: Limits, script: str) -> list[str]:
    mib = 1 << 20
    cpu = max(1, math.ceil(limits.cpu_s))  # RLIMIT_CPU counts whole seconds; 0 would mean "now"
    return [_python(), "-E", "-s", "-B", "-c", BOOT, str(cpu), str(int(limits.memory_mb * mib)),
            str(int(limits.max_processes)), str(int(limits.max_file_mb * mib)), script]


def _system_mounts() -> list[str]:
    """Read-only view of what Python needs: /usr, the /lib* and /bin links, and nothing else."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):  # merged-/usr systems: /lib -> usr/lib
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    prefix = sys.base_prefix
    if not _python().startswith("/usr/"):
        args += ["--ro-bind", prefix, prefix]  # the interpreter's install tree, not the home above it
    return args


def _bwrap_cmd(workdir: str, limits: Limits, info_fd: int) -> list[str]:
    return [
        "bwrap", "--info-fd", str(info_fd), "--unshare-all", "--unshare-user", *(_bwrap_flags() & {"--disable-userns"}),
        "--die-with-parent", "--new-session", "--hostname", "sandbox",
        "--tmpfs", "/", *_system_mounts(), "--proc", "/proc", "--dev", "/dev",
        "--bind", workdir, INSIDE, "--chdir", INSIDE,
        # Read-only root and /dev: otherwise their tmpfs (RAM, no size cap) is a way to fill memory.
        "--remount-ro", "/dev", "--remount-ro", "/",
        "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", INSIDE,
        "--setenv", "TMPDIR", INSIDE, "--setenv", "LANG", "C.UTF-8", "--setenv", "MALLOC_ARENA_MAX", "2",
        "--uid", str(NOBODY), "--gid", str(NOBODY),
        *_boot_args(limits, MAIN),
    ]


def _spawn(backend: str, workdir: str, limits: Limits, stdin) -> subprocess.Popen:
    info_r = info_w = None
    if backend == "bwrap":
        # bwrap writes {"child-pid": N} (the sandbox's pid 1, in our pid namespace) to --info-fd;
        # _kill_tree waits for N to end, which the kernel allows only once the namespace is empty.
        info_r, info_w = os.pipe()
        cmd, env, cwd = _bwrap_cmd(workdir, limits, info_w), {"PATH": "/usr/bin:/bin"}, "/"
    else:
        cmd, cwd = _boot_args(limits, MAIN), workdir
        env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8", "MALLOC_ARENA_MAX": "2"}
    # A new session gives the outer process its own process group, which _kill_tree kills whole.
    try:
        proc = subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, env=env,
                                start_new_session=True, close_fds=True, pass_fds=(info_w,) if info_w else (),
                                **_as_nobody())
    except BaseException:
        if info_r is not None:
            os.close(info_r)
        raise
    finally:
        if info_w is not None:
            os.close(info_w)
    proc.info_fd = info_r
    return proc


# --- one run --------------------------------------------------------------------------------


def run_python(code: str, stdin: str = "", limits: Limits = Limits(), files: dict[str, str] | None = None,
               backend: str | None = None) -> Result:
    """Run `code` as main.py in a fresh directory holding `files`; never raises for what `code` does.

    backend: "bwrap" or "rlimit" to force one (tests); default active_backend()."""
    backend = backend or active_backend()
    if backend == "rlimit":
        _warn_fallback()
    workdir = _make_workdir(code, files or {})
    try:
        with tempfile.TemporaryFile() as stdin_file:  # a file, not a pipe: a program that never
            stdin_file.write(stdin.encode())  # reads its stdin cannot block us on a full pipe
            stdin_file.seek(0)
            t0 = time.monotonic()
            proc = _spawn(backend, workdir, limits, stdin_file)
            try:
                out, err, why = _collect(proc, limits, t0 + limits.wall_s)
            finally:
                _kill_tree(proc)
                proc.stdout.close()
                proc.stderr.close()
            wall = time.monotonic() - t0
    finally:
        _remove(workdir)
    rc = proc.returncode
    if backend == "bwrap" and rc is not None and rc > 128:
        rc = 128 - rc  # bwrap exits 128 + N when the program died of signal N (sys.exit(130) looks the same)
    stdout, stderr = (b.decode("utf-8", errors="replace") for b in (out, err))
    return Result(why or _classify(rc, stderr), rc, stdout, stderr, wall, backend)


def _make_workdir(code: str, files: dict[str, str]) -> str:
    workdir = tempfile.mkdtemp(prefix="rlpost-sbx-")
    for name, text in {**files, MAIN: code}.items():
        path = os.path.normpath(os.path.join(workdir, name))
        if os.path.isabs(name) or not path.startswith(workdir + os.sep):
            _remove(workdir)
            raise ValueError(f"sandbox file name {name!r} must be relative and stay inside the directory")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    if os.geteuid() == 0:  # the program runs as nobody and owns only its own directory
        for dirpath, dirnames, filenames in os.walk(workdir):
            for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
                os.chown(name, NOBODY, NOBODY)
    return workdir


def _collect(proc: subprocess.Popen, limits: Limits, deadline: float) -> tuple[bytes, bytes, str | None]:
    """Read stdout/stderr incrementally until both close; (out, err, status override or None).

    Reads at most cap + 64 KiB per stream before killing, so gigabytes of output cost nothing."""
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    cap = limits.max_output_bytes
    sel = selectors.DefaultSelector()
    for fd in bufs:
        sel.register(fd, selectors.EVENT_READ)
    why, exited_at = None, None
    while sel.get_map():
        now = time.monotonic()
        if now >= deadline:
            why = "timeout"
            break
        if exited_at is None and proc.poll() is not None:
            exited_at = now  # main process gone: kill stragglers still holding the pipes
            _kill_tree(proc)
        if exited_at is not None and now - exited_at > KILL_WAIT_S:
            break
        for key, _ in sel.select(timeout=min(0.1, deadline - now)):
            chunk = os.read(key.fd, 1 << 16)
            if not chunk:
                sel.unregister(key.fd)
                continue
            bufs[key.fd] += chunk
            if len(bufs[key.fd]) > cap:
                why = "output_limit"
        if why:
            break
    sel.close()
    if why is None and exited_at is None:  # it closed both pipes but may still be running
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            why = "timeout"
    out, err = (bytes(b[:cap]) for b in bufs.values())
    return out, err, why


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the whole process group (bwrap: the outer process, whose death takes the pid
    namespace and everything in it) until it is empty, then reap.

    Repeated because a member that is mid-fork can produce a child after a signal went out.
    Stops for good at the first ESRCH: once the group is empty its id may be reused."""
    stop = time.monotonic() + KILL_WAIT_S
    while not getattr(proc, "group_gone", False) and time.monotonic() < stop:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.group_gone = True
            break
        try:
            proc.wait(timeout=0.01)  # reap the leader; orphans are reaped by init
        except subprocess.TimeoutExpired:
            continue
        if not _group_alive(proc.pid):  # only zombies left, waiting for init to reap them
            proc.group_gone = True
    try:
        proc.wait(timeout=KILL_WAIT_S)
    except subprocess.TimeoutExpired:  # unkillable (D state): leave it to the kernel, never hang
        pass
    if proc.info_fd is not None:
        _wait_namespace_gone(proc.info_fd, stop)
        os.close(proc.info_fd)
        proc.info_fd = None


def _wait_namespace_gone(info_fd: int, stop: float) -> None:
    """Wait until the sandbox's pid 1 has exited. A dying pid-namespace init first kills and
    waits out every process in its namespace, so after this nothing of the sandbox runs."""
    os.set_blocking(info_fd, False)
    try:
        m = re.search(rb'"child-pid"\s*:\s*(\d+)', os.read(info_fd, 4096))
    except BlockingIOError:  # bwrap died before it started the sandbox
        return
    while m and time.monotonic() < stop:
        try:
            with open(f"/proc/{int(m[1])}/stat") as f:
                if f.read().rpartition(")")[2].split()[0] in "ZX":
                    return
        except OSError:  # reaped
            return
        time.sleep(0.005)


def _group_alive(pgid: int) -> bool:
    """Does any process in group `pgid` still run? (killpg also "succeeds" on zombies.)"""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()  # after "pid (comm)": state ppid pgrp
        except (OSError, ValueError):
            continue
        if int(fields[2]) == pgid and fields[0] not in "ZX":
            return True
    return False


def _classify(rc: int | None, stderr: str) -> str:
    """Status from how the process ended (the caller already handled wall time and output)."""
    sig = -rc if rc is not None and rc < 0 else None
    tail = stderr[-4000:]
    if rc == 0:
        return "ok"
    if sig == signal.SIGXCPU:
        return "timeout"  # RLIMIT_CPU
    if "MemoryError" in tail or "Cannot allocate memory" in tail or "bad_alloc" in tail:
        return "memory"  # RLIMIT_AS: Python raises MemoryError
    if sig is not None:
        return "killed"
    return "error"


def _remove(workdir: str) -> None:
    """Delete the throwaway directory, even where the program chmod-ed things to 000."""
    try:
        shutil.rmtree(workdir)
        return
    except OSError:
        pass
    for dirpath, dirnames, _ in os.walk(workdir):  # topdown: fix a directory before entering it
        for d in [dirpath, *(os.path.join(dirpath, n) for n in dirnames)]:
            try:
                os.chmod(d, 0o700, follow_symlinks=False)
            except OSError:
                pass
    shutil.rmtree(workdir, ignore_errors=True)
