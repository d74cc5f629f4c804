"""torch's thread count follows the other processes' work on this process's cores (model/cores.py)."""

import torch

from rlpost.model import cores
from rlpost.model.cores import Cores, Sample


def feed(monkeypatch, c: Cores, others: list[float], ours: float = 1.0) -> list[int]:
    """Thread counts after intervals of 1 s in which other processes did ``others`` cores' work."""
    got = []
    for o in others:
        last = c.last
        nxt = Sample(last.wall + 1.0, last.busy + o + ours, last.ours + ours)
        monkeypatch.setattr(cores, "sample", lambda cpus, n=nxt: n)
        got.append(c.adjust())
    return got


def test_a_busy_neighbour_takes_a_core_and_gives_it_back(monkeypatch):
    threads = torch.get_num_threads()
    try:
        monkeypatch.setattr(cores, "sample", lambda cpus: Sample(0.0, 0.0, 0.0))
        c = Cores(0)
        c.cpus, c.most, c.threads = [0, 1], 2, 2
        # quiet, a neighbour at one core (it gets 2/3 of one while we spin on both), it stays (now a full
        # core), it drops to 0.4 (inside the margin: the core stays given up), it leaves
        assert feed(monkeypatch, c, [0.0, 0.67, 1.0, 0.4, 0.1]) == [2, 1, 1, 1, 2]
        assert torch.get_num_threads() == 2 and abs(c.others - 0.1) < 1e-9
        assert feed(monkeypatch, c, [0.5]) == [2]  # under 0.6 of a core: not worth a core
        assert feed(monkeypatch, c, [5.0]) == [1]  # never fewer than one thread
    finally:
        torch.set_num_threads(threads)


def test_intervals_too_short_decide_nothing(monkeypatch):
    monkeypatch.setattr(cores, "sample", lambda cpus: Sample(0.0, 0.0, 0.0))
    c = Cores(0)
    c.most = c.threads = 2
    monkeypatch.setattr(cores, "sample", lambda cpus: Sample(0.1, 5.0, 0.0))  # 0.1 s later, "50 cores" busy
    assert c.adjust() == 2 and c.last.wall == 0.0


def test_an_explicit_count_stays(monkeypatch):
    threads = torch.get_num_threads()
    try:
        c = Cores(1)
        assert torch.get_num_threads() == 1 and c.adjust() == 1 and c.last is None
    finally:
        torch.set_num_threads(threads)


def test_the_counters_read_this_machine():
    s = cores.sample([0])
    assert s is not None and s.busy > 0 and s.ours > 0  # this process has used CPU time by now
