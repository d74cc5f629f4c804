"""The verifier runner never crashes, hangs or poisons the step: raising, hanging, printing,
dying, NaN-returning, memory-hungry verifiers; and the calling conventions (TRL, verl)."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from rlpost.rewards.runner import VerifierRunner
from rlpost.types.errors import ConfigError


class FakeBatch:
    def __init__(self, completions, rows=None):
        self.completions = completions
        self.rows = rows or [{"answer": "1"}] * len(completions)


def test_raising_verifier_scores_zero_and_is_counted():
    r = VerifierRunner("toy_verifiers:raises", timeout_s=5)
    rewards, infos, m = r.score(FakeBatch(["a", "b"]))
    assert rewards.tolist() == [0.0, 0.0] and m["verifier/errors"] == 2
    assert "RuntimeError: broken verifier" in infos[0]["error"]
    r.close()


def test_hanging_verifier_times_out_and_the_rest_still_score():
    r = VerifierRunner("toy_verifiers:hangs", timeout_s=0.5)
    t0 = time.perf_counter()
    rewards, infos, m = r.score(FakeBatch(["ok", "hang", "ok"]))
    assert time.perf_counter() - t0 < 10
    assert rewards.tolist() == [1.0, 0.0, 1.0]
    assert m["verifier/timeouts"] == 1 and infos[1] == {"timeout": True}
    r.close()


def test_a_verifiers_bools_are_shares_in_the_metrics_and_its_other_values_are_not():
    # arithmetic's score: {'correct': bool, 'parsed': bool, 'pred': str | None}; a parsed answer has no mean
    r = VerifierRunner("rlpost.envs.arithmetic:score", timeout_s=5)
    rewards, infos, m = r.score(FakeBatch(["1", "so 2", "none", "11"]))
    r.close()
    assert rewards.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert m["reward_extra/correct"] == 0.25 and m["reward_extra/parsed"] == 0.75
    assert not any(k.startswith("reward_extra/pred") for k in m) and infos[1]["pred"] == "2"
    from rlpost.rewards.runner import extra_metrics

    # the same info as a verl compute_score's extras: its numbers are averaged too (verl's reward_extra_info)
    infos = [{"acc": True, "steps": 3, "pred": "7"}, {"acc": False, "steps": 1}]
    assert extra_metrics(infos) == {"reward_extra/acc": 0.5, "reward_extra/steps": 2.0}
    assert extra_metrics(infos, numbers=False) == {"reward_extra/acc": 0.5}


def test_extra_metrics_average_over_the_completions_carrying_each_key_and_leave_timeout_out():
    from rlpost.rewards.runner import extra_metrics

    # a timed-out call's info is the runner's {'timeout': True}, an error's {'error': ...}: neither counts
    # towards another key's mean, and the timeout flag is no metric (verifier/timeouts counts it)
    infos = [{"acc": True, "steps": 4}, {"acc": False}, {"timeout": True}, {"error": "boom"}]
    assert extra_metrics(infos) == {"reward_extra/acc": 0.5, "reward_extra/steps": 4.0}  # not 0.25 and 1.0
    assert extra_metrics(infos, numbers=False) == {"reward_extra/acc": 0.5}
    assert extra_metrics([{"timeout": True}]) == {} and extra_metrics([]) == {}


def test_printing_and_plain_float_verifiers():
    r = VerifierRunner("toy_verifiers:prints", timeout_s=5)
    assert r.score(FakeBatch(["x"]))[0].tolist() == [0.5]
    r.close()
    r = VerifierRunner("toy_verifiers:returns_float", timeout_s=5)
    assert r.score(FakeBatch(["x"]))[0].tolist() == [0.25]
    r.close()


def test_verifier_that_kills_its_worker():
    r = VerifierRunner("toy_verifiers:kills_itself", timeout_s=5)
    rewards, _, m = r.score(FakeBatch(["ok", "die", "ok"]))
    assert rewards.tolist() == [1.0, 0.0, 1.0] and m["verifier/errors"] == 1
    r.close()


def test_bad_import_path_fails_early_with_a_clear_message():
    with pytest.raises(ConfigError,
                       match=r"^task.verifier: cannot import 'toy_verifiers:does_not_exist' \(AttributeError"):
        VerifierRunner("toy_verifiers:does_not_exist", timeout_s=1)
    with pytest.raises(ConfigError, match="module:function"):
        VerifierRunner("no_colon_here", timeout_s=1)
    with pytest.raises(ConfigError,
                       match=r"^task.reward_funcs: cannot import 'no_such_module:f' \(ModuleNotFoundError"):
        VerifierRunner("no_such_module:f", timeout_s=1, key="task.reward_funcs")


def test_nan_inf_and_non_numbers_are_errors_scored_zero(capfd):
    r = VerifierRunner("toy_verifiers:returns_nan", timeout_s=5)
    try:
        rewards, infos, m = r.score(FakeBatch(["nan", "inf", "text", "none", "ok"]))
    finally:
        r.close()
    assert rewards.tolist() == [0.0, 0.0, 0.0, 0.0, 1.0] and torch.isfinite(rewards).all()
    assert m["verifier/errors"] == 4 and m["verifier/returns_nan/errors"] == 4 and m["verifier/returns_nan/calls"] == 5
    assert "expected a finite number" in infos[0]["error"]
    # the first failure is printed once, with what went wrong; the rest are only counted
    err = capfd.readouterr().err
    assert err.count("reward function toy_verifiers:returns_nan failed") == 1 and "returned nan" in err


def test_a_nan_reward_is_one_line_without_a_traceback(capfd):
    # a value check of rlpost's, not a crash: the line says what was returned, and no frame of rlpost's shows
    r = VerifierRunner("toy_verifiers:always_nan", timeout_s=5)
    try:
        _, infos, m = r.score(FakeBatch(["a", "b"]))
    finally:
        r.close()
    err = capfd.readouterr().err
    assert m["verifier/errors"] == 2 and infos[0]["error"] == "returned nan, expected a finite number"
    assert err.strip().endswith("returned nan, expected a finite number") and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err and "worker.py" not in err and "BadReward" not in err


def test_a_reward_past_float32_is_refused_as_the_loop_would_hold_it(capfd):
    # 1e39 is a finite float64 but inf as the float32 the loop keeps rewards in; 3.4e38 is in range
    r = VerifierRunner("toy_verifiers:past_float32", timeout_s=5)
    try:
        rewards, infos, m = r.score(FakeBatch(["big", "in range"]))
    finally:
        r.close()
    assert rewards.tolist() == [0.0, torch.tensor(3.4e38).item()] and torch.isfinite(rewards).all()
    assert m["verifier/errors"] == 1
    assert infos[0]["error"].startswith("returned 1e+39, expected a finite number in float32")
    err = capfd.readouterr().err
    assert "Traceback" not in err and "returned 1e+39" in err


def test_reward_value_checks_float32_at_its_edge():
    from rlpost.types.values import NotAReward, reward_value

    edge = 2.0**128 - 2.0**103  # halfway between float32's max and 2^128: rounds (to even) to inf
    below = 2.0**128 - 2.0**103 - 2.0**75  # the next float64 down rounds to float32's max
    assert torch.isinf(torch.tensor(edge)) and torch.isfinite(torch.tensor(below))  # torch's own rounding
    assert reward_value(below) == below and reward_value(-below) == -below and reward_value(True) == 1.0
    for bad in (edge, -edge, 1e39, float("nan"), float("-inf"), 10**400, "1.0", None, [1.0]):
        with pytest.raises(NotAReward):
            reward_value(bad)


def test_a_verifiers_correct_must_be_a_boolean(capfd):
    # bool("no") is True: held-out accuracy would count it correct. Refused in one line naming the key;
    # numpy's bool is a boolean and arrives as Python's
    r = VerifierRunner("toy_verifiers:correct_as_text", timeout_s=5)
    try:
        rewards, infos, m = r.score(FakeBatch(["no", "numpy", "false"]))
    finally:
        r.close()
    assert m["verifier/errors"] == 1 and rewards.tolist() == [0.0, 0.0, 0.0]
    assert infos[0]["error"] == "returned info['correct'] = 'no' (a str), expected True or False"
    assert infos[1] == {"correct": False} and type(infos[1]["correct"]) is bool and infos[2] == {"correct": False}
    assert "Traceback" not in capfd.readouterr().err


def test_first_exception_is_printed_once_with_its_traceback(capfd):
    r = VerifierRunner("toy_verifiers:raises", timeout_s=5)
    try:
        r.score(FakeBatch(["a", "b", "c"]))
        r.score(FakeBatch(["d"]))
    finally:
        r.close()
    err = capfd.readouterr().err
    assert err.count("failed (the first error") == 1
    assert "Traceback (most recent call last)" in err and 'raise RuntimeError("broken verifier")' in err


ROWS = [{"prompt": "p1", "answer": "a"}] * 3 + [{"prompt": "p2", "answer": "b"}] * 2


class TRLBatch(FakeBatch):
    def __init__(self, completions, rows, version):
        super().__init__(completions, rows)
        self.completion_ids = torch.tensor([[len(c), 7, 0] for c in completions])
        self.completion_mask = torch.tensor([[True, True, False]] * len(completions))
        self.policy_version = version


def test_trl_functions_get_the_whole_batch_once_with_trls_arguments():
    r = VerifierRunner("toy_verifiers:group_aware", timeout_s=5, workers=2, max_steps=9)
    try:
        assert r.style == "trl"
        rewards, _, m = r.score(TRLBatch(["xx", "x", "xxx", "yy", "y"], ROWS, version=3))
    finally:
        r.close()
    # shortest of each group scores 1; + 10 x global_step (3) + 100 x the group size it saw (3 or 2)
    assert rewards.tolist() == [330.0, 331.0, 330.0, 230.0, 231.0]
    assert m["verifier/group_aware/calls"] == 5 and m["verifier/errors"] == 0


def test_verl_compute_score_and_its_nested_ground_truth():
    r = VerifierRunner("toy_verifiers:compute_score", timeout_s=5)
    rows = [{"data_source": "plain", "reward_model": {"ground_truth": "42"}},
            {"data_source": "dict", "reward_model": {"ground_truth": "7"}, "extra_info": {"i": 1}},
            {"data_source": "plain", "answer": "9"}]
    try:
        rewards, infos, _ = r.score(FakeBatch(["42", "7", "8"], rows))
    finally:
        r.close()
    assert rewards.tolist() == [1.0, 1.0, 0.0] and infos[1] == {"acc": True}


def test_a_module_in_the_current_directory_or_the_run_folder_imports_without_pythonpath(tmp_path, monkeypatch):
    from helpers import tiny_cfg

    from rlpost import build

    here, run = tmp_path / "here", tmp_path / "run"
    here.mkdir(), run.mkdir()
    (here / "my_rewards_here.py").write_text("def score(completion, row):\n    return 0.75, {}\n")
    (run / "my_rewards_in_run.py").write_text("def score(completion, row):\n    return 0.25, {}\n")
    monkeypatch.chdir(here)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    for path, want in (("my_rewards_here:score", 0.75), ("my_rewards_in_run:score", 0.25)):
        r = build.make_runner(tiny_cfg("task.verifier_workers=1"), path, "task.verifier", run)
        try:
            assert r.score(FakeBatch(["x"]))[0].tolist() == [want]
        finally:
            r.close()
    with pytest.raises(ConfigError, match="cannot import 'my_rewards_in_run:score'"):
        build.make_runner(tiny_cfg(), "my_rewards_in_run:score", "task.verifier", None)  # not without the run folder


def test_a_reward_function_named_by_file_path(tmp_path):
    # verl names its reward function by file (custom_reward_function.path + .name): file.py:function
    (tmp_path / "my_reward.py").write_text("def compute_score(data_source, solution_str, ground_truth, "
                                           "extra_info=None):\n"
                                           "    return float(solution_str.strip() == ground_truth)\n")
    r = VerifierRunner(f"{tmp_path / 'my_reward.py'}:compute_score", timeout_s=5)
    rewards, _, _ = r.score(FakeBatch(["7", "8"], [{"reward_model": {"ground_truth": "7"}}] * 2))
    r.close()
    assert rewards.tolist() == [1.0, 0.0]


def test_a_missing_column_is_named_with_the_columns_there_are():
    # TRL passes dataset columns as keywords: a function that wants `solution` from rows that have `answer`
    r = VerifierRunner("toy_verifiers:wants_solution", timeout_s=5)
    _, infos, m = r.score(FakeBatch(["a", "b"]))
    r.close()
    assert m["verifier/errors"] == 2
    assert "needs the column 'solution', which the rows do not have (their columns: answer)" in infos[0]["error"]
    r = VerifierRunner("toy_verifiers:reads_solution", timeout_s=5)  # verifier-style: row["solution"]
    _, infos, _ = r.score(FakeBatch(["a"]))
    r.close()
    assert "KeyError: 'solution': the row has no such column (its keys: answer)" in infos[0]["error"]


@pytest.mark.skipif(os.geteuid() != 0, reason="a sandbox uid of its own (rlimits as root) is what writes here")
def test_a_module_a_sandboxed_program_left_in_the_current_directory_is_never_imported(tmp_path, monkeypatch, capsys,
                                                                                      request):
    """The run starts in a folder every user can write. A program under rlimits (root: the run has
    a uid of its own) leaves sitecustomize.py and pickle.py there; a verifier worker started
    afterwards imports neither (it would at start-up, from PYTHONPATH, and via `python -c`'s ''),
    and the console says why the folder is left out. Bubblewrap's programs can write no host path."""
    from helpers import tiny_cfg

    from rlpost import build
    from rlpost.sandbox import run_python

    shared, marker = Path(tempfile.mkdtemp(prefix="rlpost-test-shared-")), tmp_path / "imported"  # reachable by any uid
    request.addfinalizer(lambda: shutil.rmtree(shared))
    os.chmod(shared, 0o777)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "my_rewards_safe.py").write_text("def score(completion, row):\n    return 0.5, {}\n")
    module = f"open({str(marker)!r}, 'a').write(__name__)\ndef score(c, r):\n    return 1.0\n"
    plant = (f"import os\nfor name in ('sitecustomize.py', 'pickle.py', 'my_rewards_planted.py'):\n"
             f"    with open(os.path.join({str(shared)!r}, name), 'w') as f:\n        f.write({module!r})\n"
             "print('planted')")
    res = run_python(plant, backend="rlimits", allow_root=True)
    assert res.stdout == "planted\n", res
    assert os.stat(shared / "pickle.py").st_uid != 0  # written by the sandbox's uid, not by us
    monkeypatch.chdir(shared)
    r = build.make_runner(tiny_cfg("task.verifier_workers=1"), "my_rewards_safe:score", "task.verifier",
                          tmp_path / "run")
    try:
        assert r.score(FakeBatch(["x"]))[0].tolist() == [0.5]
    finally:
        r.close()
    assert not marker.exists()
    assert f"will not import from {shared}: {shared} is writable by every user" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="cannot import 'my_rewards_planted:score'"):
        build.make_runner(tiny_cfg("task.verifier_workers=1"), "my_rewards_planted:score", "task.verifier", None)
    assert not marker.exists()


def test_import_paths_another_uid_could_write_are_left_out(tmp_path):
    from rlpost.rewards.runner import safe_import_paths

    mine, open_dir, sticky = tmp_path / "mine", tmp_path / "open", tmp_path / "sticky"
    for d, mode in ((mine, 0o755), (open_dir, 0o777), (sticky, 0o1777)):
        d.mkdir()
        os.chmod(d, mode)
    (sticky / "inner").mkdir()
    (open_dir / "inner").mkdir()
    kept, refused = safe_import_paths([str(mine), str(open_dir), str(sticky), str(sticky / "inner"),
                                       str(open_dir / "inner"), str(mine / "not-yet")])
    # a sticky folder protects what is in it (/tmp/yours), not itself: anyone can add a module to it
    assert kept == [str(mine), str(sticky / "inner"), str(mine / "not-yet")]
    assert set(refused) == {str(open_dir), str(sticky), str(open_dir / "inner")}


def test_what_a_reward_function_prints_shows_on_the_console_at_first(tmp_path, capsys):
    # TRL users debug reward functions with print: the first lines reach the console, the rest verifier.log
    log = tmp_path / "verifier.log"
    r = VerifierRunner("toy_verifiers:prints_lines", timeout_s=5, log_path=log)
    r.score(FakeBatch(["x", "a"]))  # the first raises: its traceback is reported once, not echoed again
    r.score(FakeBatch([str(i) for i in range(12)]))
    r.close()
    echoed = [line for line in capsys.readouterr().err.splitlines() if "reward function output" in line]
    assert echoed[:2] == ["rlpost: reward function output: scoring 'x'", "rlpost: reward function output: answer 1"]
    assert len(echoed) == 21 and "more reward function output in" in echoed[-1]  # 20 lines, then where the rest is
    assert not any("Traceback" in line or "ValueError" in line for line in echoed)
    assert "scoring '11'" in log.read_text()  # everything is in the log
