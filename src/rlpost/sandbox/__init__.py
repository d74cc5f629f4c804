"""The sandbox for model-written code: run a program under limits and isolation, get a ``Result``.

Its own package (it imports nothing else of rlpost and no torch; task families in ``envs/`` use it):

  limits.py     ``Limits`` (what a run may use) and ``Result`` (what it returned)
  run.py        ``run_python``: the backends (bubblewrap, plain rlimits), what each guarantees, one run
  launch.py     how a run starts: the boot shim, the bubblewrap command line, the cgroup gate
  isolation.py  the host side: slots, cgroups, the seccomp filter, the kill, the clean-up
"""

from rlpost.sandbox.limits import Limits, Result
from rlpost.sandbox.run import (BACKENDS, INSTALL_HINT, SandboxUnavailable, bwrap_works, guarantees, resolve_backend,
                                run_python)

__all__ = ["BACKENDS", "INSTALL_HINT", "Limits", "Result", "SandboxUnavailable", "bwrap_works", "guarantees",
           "resolve_backend", "run_python"]
