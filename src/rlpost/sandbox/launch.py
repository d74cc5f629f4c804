"""How a sandbox run is started: the boot shim, the bubblewrap command line, and the gate that
holds the run until the parent has put it in its cgroup.

run.py says what the backends guarantee; this is the mechanics. Nothing here decides a
limit; it only makes sure each one is in place before the program's first instruction:

* the run starts *held*: under bwrap at ``--block-fd`` (the sandbox's pid 1 exists but has not
  forked), under rlimits in the boot shim's first line. The parent reads the sandbox's pid 1 from
  ``--info-fd``, writes both pids into the run's cgroup, then opens the gate. A process placed
  after it forked would leave its children outside the cgroup's caps;
* under bwrap every file the run gets (the program's code, its stdin, the seccomp filter) is an
  anonymous memfd, copied in or closed by bwrap: nothing is on the host disk, and nothing but
  stdin, stdout and stderr is open in the program. (rlimits: the code is in the host directory.)
"""

from __future__ import annotations

import functools
import math
import os
import re
import select
import shutil
import subprocess
import sys
import time
from rlpost.sandbox import isolation, slots
from rlpost.sandbox.limits import Limits

SYSTEM_PATH = "/usr/bin:/bin"  # the PATH bwrap is found on and the program starts with
NOBODY = 65534
INSIDE = "/sandbox"  # the working directory as the program sees it under bwrap
MAIN = "main.py"

# Boot shim: wait at the gate (rlimits backend: until the parent has put this process in its
# cgroup; bwrap has --block-fd for that; end of file there means the parent died first: exit),
# set the rlimits on itself, install the seccomp filter when asked (rlimits backend; bwrap
# installs it itself), say on the `started` pipe that the program is about to start (a run
# whose byte never came failed in the sandbox, not in the program: bwrap that could not fork,
# say), then become the program (same pid, limits inherited).
# CPU gets a 1 s gap between the soft limit (SIGXCPU, which kills Python)
# and the hard one (SIGKILL), for programs that catch SIGXCPU.
BOOT = """import os, resource as r, sys
gate, started, cpu, mem, nproc, fsize, bpf, main = sys.argv[1:9]
if gate != "-":
    if os.read(int(gate), 1) != b"\\n":
        sys.exit("rlpost boot: the parent died before opening the gate; not running the program")
    os.close(int(gate))
for k, v in ((r.RLIMIT_CPU, (int(cpu), int(cpu) + 1)), (r.RLIMIT_AS, (int(mem), int(mem))),
             (r.RLIMIT_NPROC, (int(nproc), int(nproc))), (r.RLIMIT_FSIZE, (int(fsize), int(fsize))),
             (r.RLIMIT_CORE, (0, 0))):
    r.setrlimit(k, v)
if bpf != "-":
    import ctypes
    libc, prog = ctypes.CDLL(None, use_errno=True), ctypes.create_string_buffer(bytes.fromhex(bpf))
    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    fprog = Prog(len(bpf) // 16, ctypes.addressof(prog))
    if libc.prctl(38, 1, 0, 0, 0) or libc.prctl(22, 2, ctypes.byref(fprog), 0, 0):  # NO_NEW_PRIVS; SECCOMP
        sys.exit("rlpost boot: could not install the seccomp filter; refusing to run the program")
os.write(int(started), b"1")
os.close(int(started))
os.execv(sys.executable, [sys.executable, "-E", "-s", "-B", main])
"""



def python_path() -> str:
    """The interpreter to run inside; see the module docstring for why the system one."""
    # realpath: a venv's bin/python is a link into sys.base_prefix, the only tree bwrap binds
    return "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else os.path.realpath(sys.executable)


@functools.cache
def bwrap_path() -> str | None:
    """The bwrap every run uses, probe included: the one on SYSTEM_PATH, never the caller's PATH."""
    return shutil.which("bwrap", path=SYSTEM_PATH)


@functools.cache
def bwrap_flags() -> frozenset[str] | None:
    """Optional flags this bwrap knows (older releases lack --size and --disable-userns); None
    when ``bwrap --help`` itself fails, which makes bwrap unusable (run.bwrap_works), never a
    silent run without them."""
    path = bwrap_path()
    if path is None:
        return None
    try:
        out = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=30, env={"PATH": SYSTEM_PATH})
    except (OSError, subprocess.SubprocessError):
        return None
    text = out.stdout + out.stderr
    if "--unshare-all" not in text:
        return None
    return frozenset(f for f in ("--disable-userns", "--size") if f in text)


def _boot_args(limits: Limits, gate: int | None, started: int, bpf: bytes | None) -> list[str]:
    mib = 1 << 20
    cpu = max(1, math.ceil(limits.cpu_s))  # RLIMIT_CPU counts whole seconds; 0 would mean "now"
    return [python_path(), "-E", "-s", "-B", "-c", BOOT, "-" if gate is None else str(gate), str(started), str(cpu),
            str(int(limits.memory_mb * mib)), str(int(limits.max_processes)), str(int(limits.max_file_mb * mib)),
            bpf.hex() if bpf else "-", MAIN]


def _system_mounts() -> list[str]:
    """Read-only view of what Python needs: /usr, the /lib* and /bin links, and nothing else."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):  # merged-/usr systems: /lib -> usr/lib
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    prefix = sys.base_prefix
    if not python_path().startswith("/usr/"):
        args += ["--ro-bind", prefix, prefix]  # the interpreter's install tree, not the home above it
    return args


def _bwrap_cmd(limits: Limits, fds: dict[str, int], files: dict[str, int]) -> list[str]:
    """fds: info, block and (optionally) seccomp descriptors; files: name -> memfd to copy in."""
    flags = bwrap_flags() or frozenset()
    size = ["--size", str(int(limits.max_disk_mb) << 20)] if "--size" in flags else []
    dirs = sorted({os.path.dirname(n) for n in files} - {""})
    copy_in = [a for d in dirs for a in ("--dir", f"{INSIDE}/{d}")]
    copy_in += [a for n, fd in files.items() for a in ("--file", str(fd), f"{INSIDE}/{n}")]
    seccomp = ["--seccomp", str(fds["seccomp"])] if "seccomp" in fds else []
    return [
        bwrap_path() or "bwrap", "--info-fd", str(fds["info"]), "--block-fd", str(fds["block"]), *seccomp,
        "--unshare-all", "--unshare-user", *(flags & {"--disable-userns"}),
        "--die-with-parent", "--new-session", "--hostname", "sandbox",
        # /proc/1 is bubblewrap's own init, the program's parent: hidden under an empty read-only tmpfs,
        # so its memory (/proc/1/mem), maps and descriptors are not there to read
        "--tmpfs", "/", *_system_mounts(), "--proc", "/proc", "--tmpfs", "/proc/1", "--remount-ro", "/proc/1",
        "--dev", "/dev",
        *size, "--tmpfs", INSIDE, *copy_in, "--chdir", INSIDE,
        # Read-only root and /dev: otherwise their tmpfs (RAM, no size cap) is a way to fill memory.
        "--remount-ro", "/dev", "--remount-ro", "/",
        "--clearenv", "--setenv", "PATH", SYSTEM_PATH, "--setenv", "HOME", INSIDE,
        "--setenv", "TMPDIR", INSIDE, "--setenv", "LANG", "C.UTF-8", "--setenv", "MALLOC_ARENA_MAX", "2",
        "--uid", str(NOBODY), "--gid", str(NOBODY),
        *_boot_args(limits, None, fds["started"], None),
    ]


def _memfd(data: bytes) -> int:
    """An anonymous in-memory file holding `data`, rewound: no host path, nothing to delete."""
    fd = os.memfd_create("rlpost", os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def spawn(backend: str, files: dict[str, str], stdin: str, limits: Limits, slot: slots.Slot,
          workdir: str | None) -> subprocess.Popen:
    """Start the run, held at its gate: proc.gate_fd releases it, proc.info_fd (bwrap) says its pid 1,
    proc.started_fd gets a byte once the program is about to start (started)."""
    mine: list[int] = []  # descriptors the child needs and we close once it has them
    keep: list[int] = []  # our ends, closed by _finish
    try:
        mine.append(stdin_fd := _memfd(stdin.encode()))
        started_r, started_w = os.pipe()
        keep.append(started_r)
        mine.append(started_w)
        if backend == "bwrap":
            info_r, info_w = os.pipe()
            block_r, block_w = os.pipe()
            keep += [info_r, block_w]
            mine += [info_w, block_r]
            fds = {"info": info_w, "block": block_r, "started": started_w}
            if (bpf := isolation.seccomp_filter()) is not None:
                mine.append(fds.setdefault("seccomp", _memfd(bpf)))
            file_fds = {n: _memfd(text.encode()) for n, text in files.items()}
            mine += file_fds.values()
            cmd, cwd, env = _bwrap_cmd(limits, fds, file_fds), "/", {"PATH": SYSTEM_PATH}
        else:  # the boot shim's own gate: it reads one byte before doing anything
            gate_r, block_w = os.pipe()
            keep.append(block_w)
            mine.append(gate_r)
            info_r, cwd = None, workdir
            cmd = _boot_args(limits, gate_r, started_w, isolation.seccomp_filter())
            env = {"PATH": SYSTEM_PATH, "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8",
                   "MALLOC_ARENA_MAX": "2"}
        user = {"user": slot.uid, "group": slot.uid, "extra_groups": []} if os.geteuid() == 0 else {}
        # A new session gives the outer process its own process group and session, killed whole.
        proc = isolation.popen(cmd, stdin=stdin_fd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd,
                                env=env, start_new_session=True, close_fds=True, pass_fds=mine[1:], **user)
    except BaseException:
        for fd in keep:
            os.close(fd)
        raise
    finally:
        for fd in mine:
            os.close(fd)
    proc.info_fd, proc.gate_fd, proc.pid1_fd, proc.started_fd = info_r, block_w, None, started_r
    return proc


def started(proc: subprocess.Popen) -> bool:
    """Did the run's program start (its boot shim wrote the byte)? Asked once the run is over."""
    os.set_blocking(proc.started_fd, False)
    try:
        return os.read(proc.started_fd, 1) == b"1"
    except BlockingIOError:  # no byte, and some process of the run still holds the pipe
        return False


def release(proc: subprocess.Popen, cgroup: isolation.RunCgroup | None) -> None:
    """Put the held run into its cgroup, then open its gate. Under bwrap the sandbox's pid 1
    already exists (it blocks in --block-fd), so it is placed too: it has not forked yet. A pidfd
    to it (taken while it is certainly alive) lets the end of the run kill it with no risk of
    hitting a reused pid."""
    pid1 = _read_child_pid(proc.info_fd, time.monotonic() + 10) if proc.info_fd is not None else None
    if pid1 is not None:
        try:
            proc.pid1_fd = os.pidfd_open(pid1)
        except OSError:  # bwrap died already; _collect sees the exit
            pid1 = None
    if cgroup is not None:
        for pid in (proc.pid, pid1):
            if pid is not None:
                try:
                    cgroup.place(pid)
                except ProcessLookupError:
                    pass
    try:
        os.write(proc.gate_fd, b"\n")
    except BrokenPipeError:
        pass
    os.close(proc.gate_fd)


def _read_child_pid(info_fd: int, deadline: float) -> int | None:
    """bwrap writes {"child-pid": N, ...} to --info-fd; N is the sandbox's pid 1, in our namespace."""
    buf = b""
    while time.monotonic() < deadline:
        if m := re.search(rb'"child-pid"\s*:\s*(\d+)\D', buf):
            return int(m[1])
        if not select.select([info_fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            break
        chunk = os.read(info_fd, 4096)
        if not chunk:
            break  # bwrap died before it started the sandbox
        buf += chunk
    return None
