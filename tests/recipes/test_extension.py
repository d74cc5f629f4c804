"""Extension points a TRL or verl user expects: an algorithm of your own by import path
(algo.name=module:Class, kept in config.yaml) and callbacks (TRL's callbacks=)."""

import os
import signal

import pytest
import yaml
from helpers import TINY, cli, objective, tiny_cfg

from rlpost import config
from rlpost.algorithms import resolve
from rlpost.build import check_algorithm
from rlpost.recipes.rl import train
from rlpost.types.errors import ConfigError

OWN = '''from dataclasses import dataclass
from rlpost.algorithms.grpo import GRPO

@dataclass
class HalfGRPO(GRPO):
    """GRPO with every advantage halved: a patch of one line, as the shipped algorithms are."""
    name = "half_grpo"

    def advantages(self, batch):
        adv = super().advantages(batch)
        adv.tokens = adv.tokens / 2
        adv.metrics["half/called"] = 1.0
        return adv
'''


@pytest.fixture
def own_algorithm(tmp_path, monkeypatch):
    (tmp_path / "my_algo.py").write_text(OWN)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_an_algorithm_by_file_or_module_is_built_and_its_path_kept(own_algorithm, monkeypatch):
    cfg = config.load(None, ["algo.name=my_algo.py:HalfGRPO"])
    assert cfg.algo.name == f"{own_algorithm / 'my_algo.py'}:HalfGRPO"  # absolute: eval and --resume run from anywhere
    assert type(objective(cfg).algo).__name__ == "HalfGRPO"
    monkeypatch.syspath_prepend(str(own_algorithm))
    assert type(objective(config.load(None, ["algo.name=my_algo:HalfGRPO"])).algo).__name__ == "HalfGRPO"


@pytest.mark.parametrize("name, says", [
    ("no_such_module:X", "cannot import no_such_module:X (ModuleNotFoundError"),
    ("my_algo:GRPO_TYPO", "cannot import my_algo:GRPO_TYPO (AttributeError"),
    ("os:path", "is not an algorithm: expected a class with traits, from_config, advantages, loss"),
    ("my_algo.py", "expected one of reinforce, ppo"),
])
def test_what_is_not_an_algorithm_is_refused_in_one_line(own_algorithm, monkeypatch, name, says):
    monkeypatch.syspath_prepend(str(own_algorithm))
    with pytest.raises(ConfigError) as e:
        check_algorithm(config.load(None, [f"algo.name={name}"]))
    assert str(e.value).startswith("algo.name: ") and says in str(e.value) and "\n" not in str(e.value)


def test_own_algorithm_trains_and_callbacks_see_every_step(own_algorithm):
    seen = []

    class Recorder:  # only the hooks it needs
        def on_train_begin(self, cfg, run_dir):
            seen.append(("begin", cfg.algo.name.rpartition(":")[2], os.path.isdir(run_dir)))

        def on_step_end(self, step, metrics, roles):
            seen.append(("step", step, metrics.get("half/called"), roles.trainer is not None))

        def on_train_end(self, summary):
            seen.append(("end", summary["run_dir"]))

    run_dir = own_algorithm / "run"
    summary = train(tiny_cfg("algo.name=my_algo.py:HalfGRPO"), run_dir, callbacks=[Recorder(), object()])
    assert seen == [("begin", "HalfGRPO", True), ("step", 1, 1.0, True), ("step", 2, 1.0, True), ("end", str(run_dir))]


def test_a_run_of_your_own_algorithm_keeps_it_for_eval_from_another_folder(own_algorithm, monkeypatch):
    r = cli("train", *TINY, f"run.out_dir={own_algorithm}", "run.name=own", "algo.name=my_algo.py:HalfGRPO")
    assert r.returncode == 0, r.stderr[-2000:]
    run = own_algorithm / "own"
    assert (yaml.safe_load((run / "config.yaml").read_text())["algo"]["name"]
            == f"{own_algorithm / 'my_algo.py'}:HalfGRPO")
    monkeypatch.chdir("/")
    e = cli("eval", str(run), "--n", "4", "--json")
    assert e.returncode == 0, e.stderr[-2000:]



@pytest.mark.parametrize("body, says", [
    ("import sys\nsys.exit(0)\n", "importing {name} called sys.exit(0) (at {file}:2, in <module>); "),
    ("x = 1\nraise KeyboardInterrupt\n", "importing {name} raised KeyboardInterrupt (at {file}:2, in <module>), "
                                         "though no Ctrl-C came; "),
    ("import math\nmath.sqrt(-1)\n", "cannot import {name} (ValueError: math domain error) (at {file}:2, in <module>)"),
])
def test_a_module_that_exits_or_raises_at_import_is_one_line(own_algorithm, body, says):
    # sys.exit(0) there ended `rlpost train` with status 0 and no word; its own KeyboardInterrupt read as a Ctrl-C
    file = own_algorithm / "bad_algo.py"
    file.write_text(body)
    r = cli("train", *TINY, f"run.out_dir={own_algorithm}", "run.name=bad", "algo.name=bad_algo.py:Algo")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith(f"rlpost: error: algo.name: {says.format(name=f'{file}:Algo', file=file)}"), lines
    assert not (own_algorithm / "bad").exists()


def test_a_real_ctrl_c_while_the_module_imports_is_still_a_ctrl_c(own_algorithm):
    (own_algorithm / "slow_algo.py").write_text("import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\n"
                                                "time.sleep(5)\n")
    r = cli("train", *TINY, f"run.out_dir={own_algorithm}", "run.name=c", "algo.name=slow_algo.py:Algo")
    assert r.returncode == 130 and "stopped by SIGINT" in r.stderr and "algo.name" not in r.stderr, r.stderr
    # outside the CLI's handlers (the Python API): Python's own handler raises, and that stays a Ctrl-C
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt) as stop:
            resolve(f"{own_algorithm / 'slow_algo.py'}:Algo")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert type(stop.value) is KeyboardInterrupt


BROKEN = '''from dataclasses import dataclass
from rlpost.algorithms.grpo import GRPO

@dataclass
class BrokenAdvantages(GRPO):
    name = "broken_advantages"

    def advantages(self, batch):
        assert batch is None, "advantages broke"

@dataclass
class BrokenLoss(GRPO):
    name = "broken_loss"

    def loss(self, logp, batch):
        raise ValueError("the loss broke")
'''


@pytest.mark.parametrize("cls, says", [
    ("BrokenAdvantages", "AssertionError: advantages broke (at {file}:9, in advantages)"),
    ("BrokenLoss", "ValueError: the loss broke (at {file}:16, in loss)"),
])
def test_your_algorithm_raising_in_training_is_one_line_naming_its_line(own_algorithm, cls, says):
    # it was the user's traceback through the loop; the line names the algorithm, the error and the user's line
    file = own_algorithm / "broken.py"
    file.write_text(BROKEN)
    r = cli("train", *TINY, f"run.out_dir={own_algorithm}", "run.name=b", f"algo.name=broken.py:{cls}")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1] == (f"rlpost: error: algo.name: your algorithm {file}:{cls} raised "
                                                 + says.format(file=file))
