"""The compiled trainer step (trainer.compile): the packed trunk's per-token layers and the chunked
log-prob head through ``torch.compile`` (inductor), with their row counts rounded up to a ladder.

What runs compiled. The parts of an update that are many small elementwise passes between matmuls:
each decoder layer's token-wise work (RMSNorm, the fused q/k/v projection, RoPE; then the output
projection, the residual adds, RMSNorm, gate/up, SiLU x up, down: ``pre_attention`` and
``post_attention`` in model/packed.py) and ``ChunkedLogp``'s per-chunk log-softmax, top-p truncation,
entropy and its closed-form gradient (model/chunked.py), where a 49152-wide row is read and written
several times a token eagerly and once or twice fused. Attention (its backward written out, a small
share of the work) and the batch-side glue stay eager, so a graph is a function of one tensor shape:
the rows. transformers' forward (trainer.forward=hf, LoRA) gets the compiled head only.

Shapes. Every row count is rounded up to the ladder (``bucket``: m 2^k for m in 4..7, four rungs an
octave, at least ``MIN_ROWS``), as the CUDA-graph decode rounds its batch sizes (roles/rollout_static.py),
the padding rows zeros that no output keeps. A graph is compiled per (function, rung, dtypes), and
the rungs a run meets are few: its token counts vary within an octave or two. Each waste is at most
a fifth of the rows (a fifth of 80 is 16, the step to 96) and about a tenth on average.

Cost and cache. Compiling is paid in the first update that meets a rung (the first step's update time
includes it), timed here and said once in one line after that update (``Step.report``); inductor's
FX graph cache lives under ``~/.cache/rlpost/inductor/<torch version>-<CPU capability>`` ($RLPOST_CACHE;
``cache_dir``) unless TORCHINDUCTOR_CACHE_DIR is set, so a later run on this machine loads its graphs
instead of compiling them, and never graphs made for another kind of CPU. A compilation that
fails (no compiler, an op inductor cannot lower) is said in one line and the run goes on eagerly.

Mode. On CUDA ``max-autotune-no-cudagraphs`` (tuned matmul and fused kernels; CUDA graphs would need
every rung captured with its own memory pool), on the CPU inductor's default (its C++ backend). The
same code runs both; only ``Step``'s options differ.
"""

from __future__ import annotations

import os
import time
from typing import Callable

import torch
from torch import Tensor

from rlpost.console import say, say_once
from rlpost.model import device

MIN_ROWS = 16  # the smallest rung: below it a graph per count would cost more than the padding
RUNGS = (4, 5, 6, 7)  # m 2^k: the ladder's rungs in each octave
MODES = ("auto", "on", "off")


def bucket(rows: int) -> int:
    """The smallest rung of the ladder holding ``rows`` (16, 20, 24, 28, 32, 40, 48, 56, 64, 80, ...)."""
    if rows <= MIN_ROWS:
        return MIN_ROWS
    octave = 1 << (rows.bit_length() - 3)  # rows in [4 octave, 8 octave)
    return next((m * octave for m in RUNGS if m * octave >= rows), 8 * octave)


def pad_rows(t, rows: int):
    """``t`` with zero rows appended up to ``rows`` (dim 0); ``t`` itself when it has them. A tuple is
    padded element by element; None stays None."""
    if isinstance(t, (tuple, list)):
        return tuple(pad_rows(x, rows) for x in t)
    extra = rows - t.shape[0] if t is not None else 0
    return t if extra == 0 else torch.cat([t, t.new_zeros(extra, *t.shape[1:])])


def signature(value) -> tuple | object:
    """What a graph is compiled for: tensors by shape and dtype (never by identity: the weights' bf16
    copies are new tensors every mini-batch), tuples element by element, constants as they are."""
    if isinstance(value, Tensor):  # requires_grad matters to a graph only where grad is on
        return tuple(value.shape), value.dtype, value.requires_grad and torch.is_grad_enabled()
    if isinstance(value, (tuple, list)):
        return tuple(signature(v) for v in value)
    return value


# The user's TORCHINDUCTOR_CACHE_DIR, read before anything imports inductor, whose import sets the
# variable to its own default (a folder under /tmp) when it is unset.
_USER_CACHE = os.environ.get("TORCHINDUCTOR_CACHE_DIR")


def kernel_kind() -> str:
    """What this process's compiled CPU kernels are made for: torch's version and ATen's CPU capability
    (ATEN_CPU_CAPABILITY caps it), which inductor's C++ code generation follows. Inductor's FX graph cache
    does not key on the capability: on an AVX-512 machine a graph cached by a run at full width and loaded
    by one under the AVX2 cap loaded 32 bf16 into a 16-wide vector and crashed (a segfault); a cache
    directory shared by machines of two kinds (a network home) would do the same."""
    return f"torch{torch.__version__.split('+')[0]}-{torch.backends.cpu.get_cpu_capability().lower()}"


def cache_dir() -> str:
    """Inductor's cache: TORCHINDUCTOR_CACHE_DIR where the user set it, else ours, one folder a kernel kind
    (``kernel_kind``), set for this process before its first compile (inductor reads the variable each time
    it looks for its cache). Inductor's own default (a folder under /tmp, which its import sets) is not the
    user's: it is replaced too, as it mixes kinds."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    default = os.path.abspath(default_cache_dir())
    user = _USER_CACHE if _USER_CACHE is not None and os.path.abspath(_USER_CACHE) != default else None
    now = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if user is not None or (now is not None and os.path.abspath(now) != default):
        return now or user
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(device.cache_dir() / "inductor" / kernel_kind())
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]


def pays(cuda: bool) -> tuple[bool, str]:
    """trainer.compile=auto's choice and its reason, from benchmarks/README.md ("compiled_update.py"):
    on CUDA the update is launch-bound (issue 54's profile: 19,623 kernels an update, the GPU busy
    0.49 s of 0.75) and fusing is what closes it (not yet measured on a GPU: the rule is the profile's).
    On the CPU the matmuls dominate: on 2 cores of an Intel AMX machine (2026-12-07, 12 demo-shaped
    updates) the compiled update took 0.93x the eager one's time in bf16 and 1.05x under the AVX2 cap in
    float32 (about 1.0x pair by pair on both), once its 40 graphs were compiled (61-67 s, over the
    first 8 updates, each slower then): more than the demo's 25 updates earn back."""
    if cuda:
        return True, "on CUDA the update is launch-bound; fused kernels pay"
    return False, "on the CPU the matmuls dominate the update and compiling its graphs costs more than it saves"


def resolve(setting: str, cuda: bool) -> bool:
    """trainer.compile for this run's device: 'on', 'off', or 'auto' (``pays``), said in one line."""
    if setting not in MODES:
        raise ValueError(f"trainer.compile={setting!r}: expected one of {', '.join(MODES)}")
    if setting != "auto":
        return setting == "on"
    on, why = pays(cuda)
    say_once(f"trainer.compile=auto: {'on' if on else 'off'} ({why})")  # once a run, however many trainers
    return on


RECOMPILE_LIMIT = 64  # dynamo's graphs per function (8 by default, past which it runs that function eagerly)
_compiled: dict[tuple, Callable] = {}  # (fn, cuda) -> torch.compile(fn): one per process, every trainer's
_timing: list = [None]  # the Step whose graphs are compiling now (the backend's timings go to it)


def _backend(cuda: bool) -> Callable:
    """Inductor in this device's mode, every graph's compile (forward, and backward on its first
    backward) timed into the Step that is compiling."""
    options = torch._inductor.list_mode_options("max-autotune-no-cudagraphs") if cuda else {}

    def backend(gm, example_inputs):
        from torch._inductor.compile_fx import compile_fx, compile_fx_inner

        def inner(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return compile_fx_inner(*args, **kwargs)
            finally:
                if _timing[0] is not None:
                    _timing[0].timed(time.perf_counter() - t0)

        return compile_fx(gm, example_inputs, inner_compile=inner, config_patches=options or None)

    return backend


def compiled_fn(fn: Callable, cuda: bool) -> Callable:
    """``fn`` through torch.compile (inductor, static shapes), made once per process and device kind."""
    key = (fn, cuda)
    if key not in _compiled:
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        _compiled[key] = torch.compile(fn, backend=_backend(cuda), dynamic=False)
    return _compiled[key]


class Step:
    """One trainer's compiled pieces: ``wrap`` a function to run it compiled on ladder-rounded rows.
    Counts the graphs it compiled (``graphs``: one per function, rung and dtypes) and the seconds it
    spent on them (``compile_s``); ``failed`` once a compilation failed and everything runs eagerly."""

    def __init__(self, cuda: bool):
        self.cuda, self.cache = cuda, cache_dir()
        self.graphs: set[tuple] = set()
        self.compile_s, self.failed, self._reported, self._outside = 0.0, None, 0, True
        self._wrapped: dict[tuple, Callable] = {}  # (fn, rows) -> its ``wrap``

    def timed(self, seconds: float) -> None:
        """A graph's compile took ``seconds``: counted unless inside a forward call already timed whole."""
        if self._outside:  # a backward's graph, compiled on its first backward
            self.compile_s += seconds

    def wrap(self, fn: Callable, rows: tuple[int, ...]) -> Callable:
        """``fn`` compiled; ``rows``: which arguments are (N, ...) tensors of the same N, padded to
        ``bucket(N)`` (every tensor output is cut back to N rows). Other arguments (weights, None,
        numbers) pass as they are; a number is a constant of the graph. A tuple among ``rows`` holds row
        tensors (or None)."""
        made = self._wrapped.get((fn, rows))
        if made is None:
            made = self._wrapped[(fn, rows)] = self._wrap(fn, rows)
        return made

    def _wrap(self, fn: Callable, rows: tuple[int, ...]) -> Callable:
        def call(*args):
            if self.failed is not None:
                return fn(*args)
            n = args[rows[0]].shape[0]
            padded = [pad_rows(a, bucket(n)) if i in rows else a for i, a in enumerate(args)]
            key = (fn.__qualname__, torch.is_grad_enabled(), signature(padded))
            compiled = compiled_fn(fn, self.cuda)
            fresh = key not in self.graphs
            t0, self._outside, _timing[0] = time.perf_counter(), not fresh, self
            try:
                out = compiled(*padded)
            except Exception as e:  # noqa: BLE001 (any failure to compile: run eagerly, said once)
                self.failed = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
                say(f"trainer.compile: compilation failed ({self.failed}); the update runs eagerly")
                return fn(*args)
            finally:
                self._outside = True
            if fresh:
                self.graphs.add(key)
                self.compile_s += time.perf_counter() - t0
            return tuple(o[:n] if isinstance(o, Tensor) else o for o in out) if isinstance(out, tuple) else out[:n]

        return call

    def report(self) -> None:
        """Say, once (after the first update that compiled), how many graphs took how long."""
        if self._reported or not self.graphs or self.failed is not None:
            return
        self._reported = len(self.graphs)
        mode = "max-autotune-no-cudagraphs" if self.cuda else "default"
        say(f"trainer.compile: {len(self.graphs)} graphs compiled in {self.compile_s:.1f} s (inductor, mode {mode}; "
            f"cache {self.cache}), counted in this update's time")
