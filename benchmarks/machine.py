"""What every results file says about where its figures came from: the command, the date, the CPU
kind (with the precision rlpost's probe picks there) and the load average around the run.

Timings on these 2-core machines move with whatever else runs: a figure without its machine and
its load cannot be compared with another. Imported by the benchmark scripts (same folder)."""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


CAPS = ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")  # the instruction-set caps that mimic the AVX2 kind


def caps() -> str:
    """The caps in force, as the command line that set them ('' when none)."""
    return " ".join(f"{k}={os.environ[k]}" for k in CAPS if k in os.environ)


def isa_tag() -> str:
    """This CPU's kind as torch sees it under any caps in force: 'avx2', 'avx512', ..., with 'cap'
    after it when the kind comes from a cap (results files are named by it, so each kind's
    figures, and a capped machine's beside a real one's, stay side by side)."""
    import torch

    return torch.backends.cpu.get_cpu_capability().lower() + ("cap" if caps() else "")


def omp_wait() -> str:
    """The OpenMP wait settings the children inherit ('GNU OpenMP's default' when none is set)."""
    return " ".join(f"{k}={os.environ[k]}" for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k in os.environ) \
        or "GNU OpenMP's default"


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


class Header:
    """Start it before the measurements (it reads the load then), render it after."""

    def __init__(self):
        self.start, self.load_before = time.strftime("%Y-%m-%d %H:%M"), load()

    def render(self) -> str:
        import torch

        from rlpost.model import precision

        c = precision.choose()
        cmd = " ".join([*filter(None, [caps()]), ".venv/bin/python", os.path.relpath(sys.argv[0], Path.cwd()),
                        *sys.argv[1:]])
        return (f"`{cmd}`, {self.start} to {time.strftime('%H:%M')}; {cpu_name()}, {os.cpu_count()} cores, "
                f"torch {torch.__version__} ({c.probe.isa}); load average (1, 5, 15 min) {self.load_before} before, "
                f"{load()} after; precision: {'bf16' if c.bf16 else 'float32'} ({c.reason}); OpenMP wait: "
                f"{omp_wait()}.\n\n")


def write_results(name: str, data, header: Header, text: str) -> None:
    """results/<name>-<isa>.json (the raw figures) and .md (the header, then the table)."""
    import json

    tag = isa_tag()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}-{tag}.json").write_text(json.dumps(data, indent=1))
    (RESULTS / f"{name}-{tag}.md").write_text(header.render() + text)


def median_s(fn, reps: int = 5) -> float:
    """Median wall time of ``reps`` calls of ``fn``, after one warm-up call (first calls allocate
    and pick kernels)."""
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)
