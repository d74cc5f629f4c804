"""The sandbox for model-written code: run a program under limits and isolation, get a ``Result``.

Its own package (it imports nothing else of rlpost and no torch; task families in ``envs/`` use it):

  limits.py     ``Limits`` (what a run may use) and ``Result`` (what it returned)
  run.py        ``run_python``: the backends (bubblewrap, plain rlimits), what each guarantees, one run
  launch.py     how a run starts: the boot shim, the bubblewrap command line, the cgroup gate
  slots.py      how many run at once, each run's uid, and the registry of what each slot made
  isolation.py  the host side: cgroups, the seccomp filter, the kill
  hostdir.py    the rlimits backend's working directory (a tmpfs of its own as root)
  cleanup.py    removing a tree the program wrote: by descriptors, never following a link, in bounded time
"""

from rlpost.sandbox.limits import Limits, Result
from rlpost.sandbox.run import (BACKENDS, INSTALL_HINT, SandboxUnavailable, bwrap_works, guarantees, resolve_backend,
                                run_python, unprotected)

__all__ = ["BACKENDS", "INSTALL_HINT", "Limits", "Result", "SandboxUnavailable", "bwrap_works", "guarantees",
           "resolve_backend", "run_python", "unprotected"]
