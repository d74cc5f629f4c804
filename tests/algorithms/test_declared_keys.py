"""Each algorithm's declared keys (``reads``, beside its traits) are what its ``from_config`` reads.

config_check.py and build.check refuse a key the chosen algorithm does not declare and another does, so a
declaration that drifts from the code either refuses a key the algorithm uses or lets one through that it
ignores. Here the algo section is wrapped in a recorder while each algorithm is built: every key it touches
is recorded, and an undeclared one raises at once, naming it.
"""

import pytest

from rlpost import algorithms, config, config_check
from rlpost.algorithms import ALGORITHMS

# Keys an algorithm's own code never touches though they are its: the critic's, read where the critic is built.
CRITIC = {"critic", "critic_lr"}


class Recorder:
    """The algo section, recording each key read; a key outside ``allowed`` raises, its reader in the traceback."""

    def __init__(self, algo, allowed):
        self._algo, self._allowed, self.keys = algo, allowed, set()

    def __getattr__(self, key):
        if key not in self._allowed:
            raise AssertionError(f"reads algo.{key}, which it does not declare")
        self.keys.add(key)
        return getattr(self._algo, key)


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_an_algorithm_reads_exactly_the_keys_it_declares(name):
    cls = ALGORITHMS[name]
    declared = algorithms.knobs_read(cls)
    # a fixed aggregator replaces what the parent's from_config built from algo.loss_agg: read, yet not used
    inherited = {"loss_agg"} if cls.traits.fixed_aggregator else set()
    recorder = Recorder(config.AlgoConfig(), declared | inherited)
    cls.from_config(recorder, 4, 8)
    assert recorder.keys - inherited == declared - (CRITIC if cls.traits.needs_values else set())
    assert not (CRITIC & declared) or cls.traits.needs_values


def test_the_recorder_catches_an_undeclared_read():
    recorder = Recorder(config.AlgoConfig(), {"baseline", "baseline_decay"})  # reinforce reads loss_agg too
    with pytest.raises(AssertionError, match="algo.loss_agg"):
        ALGORITHMS["reinforce"].from_config(recorder, 4, 8)


def test_every_shipped_algorithm_declares_its_keys_and_config_check_reads_them_all():
    assert all(isinstance(cls.__dict__.get("reads"), tuple) for cls in ALGORITHMS.values())  # its own, not inherited
    assert set(config_check.algo_knobs()) == set(ALGORITHMS)
