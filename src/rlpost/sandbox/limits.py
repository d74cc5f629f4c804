"""What a sandbox run is given (``Limits``) and what it returns (``Result``): plain values shared by
run.py, which runs a program, and launch.py, which starts it (kept apart so neither imports the other
for its types)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Limits:
    wall_s: float = 5.0
    """wall-clock seconds before the whole process tree is killed"""
    cpu_s: float = 5
    """CPU seconds per process (RLIMIT_CPU)"""
    memory_mb: int = 512
    """address space per process (RLIMIT_AS)"""
    max_processes: int = 32
    """processes and threads in the sandbox (RLIMIT_NPROC; the cgroup's pids.max where there is one)"""
    max_output_bytes: int = 1 << 20
    """cap on stdout and on stderr; the program is killed when either goes over"""
    max_file_mb: int = 16
    """largest file the program may write (RLIMIT_FSIZE; also caps each memfd)"""
    max_disk_mb: int = 64
    """size of the working directory (a tmpfs of this size: bwrap, and rlimits as root where mounts are allowed)"""
    total_memory_mb: int = 0
    """memory of the whole run, memfd, tmpfs and shared memory included (cgroup); 0 = memory_mb + max_disk_mb"""


@dataclass
class Result:
    status: str  # "ok" | "error" (non-zero exit) | "timeout" | "memory" | "output_limit" | "killed"
    returncode: int | None  # exit code; -N = killed by signal N (bwrap's 128 + N is mapped to -N)
    stdout: str  # decoded, at most max_output_bytes
    stderr: str  # decoded, at most max_output_bytes
    wall_s: float
    backend: str  # "bwrap" | "rlimits"
    peak_memory_mb: float | None = None  # the run's cgroup peak, where there is a cgroup
    cleanup: str = ""  # what could not be cleaned up (never raised: the program's result stands)
    sandbox_error: str = ""  # why the program never started (bwrap could not fork, say): the sandbox failed, not it
