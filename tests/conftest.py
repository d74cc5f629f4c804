"""Shared fixtures: a tiny random model with a character tokenizer, and a config for it."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
from helpers import verifier_workers
from hypothesis import HealthCheck, settings

from rlpost.model.load import load_policy

# Tiny-model tests are faster on one thread, and the suite may share 2 cores with other work.
torch.set_num_threads(1)
# Processes that tests start in-process runs from (verifier workers) import the toy verifiers of
# tests/ by module path, as `rlpost` started by run_cli does (tests/helpers.py).
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]
                                           if p)


@pytest.fixture(autouse=True)
def no_leaked_workers():
    """A test that leaves verifier workers running (roles or a runner never closed) fails here, by
    name: later tests that count this process's workers (tests/test_faults.py) would fail instead."""
    before = set(verifier_workers())
    yield
    leaked = set(verifier_workers()) - before
    for pid in leaked:
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    assert not leaked, f"verifier workers left running by this test: {sorted(leaked)} (close its roles or runners)"


def _undrawn(fig) -> str:
    """report._svg for tests that do not read the plots: the figure was built from the run's
    metrics (every series, label and legend), and is closed without being drawn."""
    import matplotlib.pyplot as plt

    plt.close(fig)
    return "<svg><!-- not drawn: tests/conftest.py --></svg>"


@pytest.fixture(autouse=True)
def plots_drawn_only_where_read(request, monkeypatch):
    """Every RL run ends by writing its report (recipes/rl.py), and drawing its ~11 plots takes
    matplotlib ~1.5 s on these 2 cores, most of a tiny run's time. A test marked `plots` gets them
    drawn; elsewhere each figure is built and closed undrawn (observe/report.py's _svg), and the
    rest of the page (summary, health, samples, config) is written as usual."""
    if request.node.get_closest_marker("plots") is None:
        from rlpost.observe import report

        monkeypatch.setattr(report, "_svg", _undrawn)


@pytest.fixture(autouse=True)
def default_ctrl_c():
    """Each test starts with Python's own Ctrl-C (KeyboardInterrupt). In the whole suite something
    leaves another SIGINT handler installed before test_faults.py runs (not found yet: no single
    test directory run alone does it, so it is likely an import at collection), and the signal
    tests there depend on the default."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield


@pytest.fixture
def tiny():
    torch.manual_seed(0)
    return load_policy("tiny")


# Property-based tests (hypothesis) draw the same examples on every run and keep no example
# database: a CI failure reproduces on any machine, and nothing is written into the tree.
settings.register_profile("rlpost", max_examples=40, deadline=None, derandomize=True, database=None,
                          suppress_health_check=[HealthCheck.too_slow])
# Under `make mutate` each mutant runs the properties again: fewer examples keep a mutant's run short
# (the hand-worked and registry-wide tests run first and kill most mutants before these start).
settings.register_profile("rlpost-mutate", parent=settings.get_profile("rlpost"), max_examples=12)
settings.load_profile("rlpost")


def pytest_configure(config):
    # per session, not at import: mutmut runs every mutant's session in a process forked after it
    mutating = os.environ.get("MUTANT_UNDER_TEST", "").startswith("rlpost.")
    settings.load_profile("rlpost-mutate" if mutating else "rlpost")


# The slow tests that keep the machine to themselves (`make test` runs them alone, after the rest): what they check
# rests on both cores, on a wall clock or on counting processes, so a test beside them could fail them.
SERIAL = {
    "distributed/": "Ray with num_cpus=2, two hosts in network namespaces",
    "envs/test_hostile.py": "hostile programs run to their wall-clock limits",
    "sandbox/test_sandbox.py": "wall-clock limits and slots",
    "model/test_precision.py": "it measures the matmuls' speed",
    "model/test_fsdp.py": "two gloo ranks and their rendezvous timeout",
    "test_kill_campaign.py": "SIGKILLs at moments drawn from the run's progress",
    "test_faults.py": "signals, grace periods and out-of-memory runs",
    "recipes/test_serve.py": "a server and a Ctrl-C, with timeouts",
    "roles/test_rollout_agent.py": "agents killed at their deadline",
    "test_workers.py": "a child subreaper counting what a kill orphans",
}


def serial(item) -> bool:
    """Whether a test is one of SERIAL's (marked `serial`: the slow ones run alone, `make test`)."""
    path = item.path.relative_to(Path(__file__).parent).as_posix()
    return any(path == p or (p.endswith("/") and path.startswith(p)) for p in SERIAL)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if serial(item):
            item.add_marker(pytest.mark.serial)
    # The modules holding slow tests first, each whole and in its own order: two xdist workers (--dist loadscope
    # hands out whole modules, in this order) then share the long ones from the start, instead of one worker
    # taking the last long module alone while the other waits.
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)  # stable
    mutate(config, items)


def mutate(config, items):
    """Under `make mutate` (scripts/mutate.py; mutmut names the mutant in MUTANT_UNDER_TEST), a
    mutant of the pure maths (algorithms/, search/) is judged by the maths tests alone: the tests
    that run the tiny model are left to the mutants of model/ and roles/, whose cost they are. And
    the fastest files go first, so a killed mutant stops (pytest -x) after the fewest tests."""
    mutant = os.environ.get("MUTANT_UNDER_TEST", "")
    if not mutant.startswith("rlpost."):
        return
    if mutant.startswith(("rlpost.algorithms.", "rlpost.search.")):
        model_tests = [i for i in items if "/algorithms/" not in str(i.path) and "/search/" not in str(i.path)]
        if model_tests:
            config.hook.pytest_deselected(items=model_tests)
            items[:] = [i for i in items if i not in model_tests]
    first = ("test_every_algorithm", "test_metrics", "test_core", "test_logprobs", "test_properties", "test_trainer")
    rank = lambda i: next((k for k, name in enumerate(first) if name in str(i.path)), len(first))
    items.sort(key=rank)  # stable: the order inside a file is kept
