"""task.mix (envs/mix.py, envs/__init__.py: build_task, config.task_mix): parsing and its errors,
the weighted draw and its resume, the dispatching verifier, the per-family batch metrics, and the
mixed splits (held-out interleaving, decontamination across families)."""

import json

import pytest
from helpers import tiny_cfg

from rlpost import config
from rlpost.envs import MIX_VERIFIER, TASK_KEY, build_task, gym, verifier_timeout
from rlpost.envs.mix import MixedStream, batch_metrics, make_stream, score
from rlpost.rewards.runner import VerifierRunner
from rlpost.types.errors import ConfigError


def rows_of(family: str, n: int) -> list[dict]:
    return [{"messages": [{"role": "user", "content": f"{family} problem {i}"}], "answer": str(i), TASK_KEY: family}
            for i in range(n)]


def stream(seed=7, batch=8, weights=None, n=10, curriculum=None) -> MixedStream:
    weights = weights or {"arithmetic": 0.7, "math": 0.2, "gym": 0.1}
    return MixedStream({f: rows_of(f, n) for f in weights}, weights, batch, seed, curriculum)


# --- parsing ----------------------------------------------------------------------------------


def test_mix_parses_to_families_and_weights_in_order():
    t = config.load(None, ["task.mix= math:2 , arithmetic:0.5"]).task
    assert config.task_mix(t) == {"math": 2.0, "arithmetic": 0.5} and config.task_families(t) == ["math", "arithmetic"]
    off = config.load(None, ["task.name=gym"]).task
    assert config.task_mix(off) == {} and config.task_families(off) == ["gym"]


@pytest.mark.parametrize("overrides, message", [
    (["task.mix=arithmetic"], "task.mix: expected comma-separated 'family:weight' entries"),
    (["task.mix=arithmetic:1,chess:1"],
     "task.mix: unknown family 'chess'; expected some of arithmetic, dataset, math, gym, code$"),
    (["task.mix=arithmetic:1,tools:1"], "task.mix: tools runs multi-turn episodes"),
    (["task.mix=math:1,math:2"], "task.mix: math is named twice"),
    (["task.mix=math:heavy"], "task.mix: the weight of math must be a number, got 'heavy'"),
    (["task.mix=math:0"], "task.mix: the weight of math must be a positive number, got '0'"),
    (["task.mix=math:-1,gym:1"], "task.mix: the weight of math must be a positive number"),
    (["task.mix=math:inf"], "task.mix: the weight of math must be a positive number"),
    (["task.mix=arithmetic:1,dataset:1"], "task.mix: dataset needs task.data"),
    (["task.mix=math:1,code:1", "task.data=x.jsonl"], "task.mix: task.data would feed both math and code"),
    (["task.mix=arithmetic:1,gym:1", "task.data=x.jsonl"],
     "task.data: no family of task.mix='arithmetic:1,gym:1' reads it"),
    (["task.mix=arithmetic:1,math:1", "task.verifier=m:f"],
     "task.verifier: with task.mix each row is scored by its own"),
    (["task.mix=arithmetic:1,math:1", "task.min_a=9", "task.max_a=3"], "task.min_a: expected <= task.max_a"),
])
def test_every_mistake_in_a_mix_is_one_config_error_naming_its_key(overrides, message):
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        config.load(None, overrides)


def test_a_mix_gets_the_longest_default_timeout_of_its_families():
    # defaults: arithmetic 2 s, gym 10 s, code 60 s; task.verifier_timeout_s overrides them all
    assert verifier_timeout(config.load(None, ["task.mix=arithmetic:1,gym:1"]).task) == 10.0
    assert verifier_timeout(config.load(None, ["task.mix=arithmetic:1,code:1"]).task) == 60.0
    assert (verifier_timeout(config.load(None, ["task.mix=arithmetic:1,code:1", "task.verifier_timeout_s=3"]).task)
            == 3.0)


# --- the draw ---------------------------------------------------------------------------------


def test_draw_frequencies_match_the_weights_and_are_fixed_by_the_seed():
    # 20,000 draws: a share's binomial sd is sqrt(p(1-p)/n) <= sqrt(.25/20000) = 0.0035, so 0.015 is
    # over 4 sd; each family's weight is its normalised weight (7:2:1 -> 0.7, 0.2, 0.1).
    s = stream(batch=100, weights={"arithmetic": 7, "math": 2, "gym": 1})
    drawn = [r[TASK_KEY] for _ in range(200) for r in s.next()]
    share = {f: drawn.count(f) / len(drawn) for f in ("arithmetic", "math", "gym")}
    assert (abs(share["arithmetic"] - 0.7) < 0.015 and abs(share["math"] - 0.2) < 0.015
            and abs(share["gym"] - 0.1) < 0.015)
    again = stream(batch=100, weights={"arithmetic": 7, "math": 2, "gym": 1})
    assert [r[TASK_KEY] for _ in range(200) for r in again.next()] == drawn  # the same seed, the same draws
    other = stream(seed=8, batch=100, weights={"arithmetic": 7, "math": 2, "gym": 1})
    assert [r[TASK_KEY] for _ in range(200) for r in other.next()] != drawn


def test_each_family_walks_its_own_rows_once_per_epoch():
    # 3 rows a family, equal weights: a family's first 3 prompts are its 3 rows, each once
    s = stream(batch=4, weights={"arithmetic": 1, "math": 1}, n=3)
    drawn = [r for _ in range(10) for r in s.next()]
    for f in ("arithmetic", "math"):
        mine = [r["messages"][0]["content"] for r in drawn if r[TASK_KEY] == f][:3]
        assert sorted(mine) == [f"{f} problem {i}" for i in range(3)]
    assert s.epoch >= 1 and s.epoch == min(x.epoch for x in s.streams.values())


def test_resumed_stream_draws_exactly_what_the_uninterrupted_one_draws():
    # With the curriculum on (window 1): prompts scored all-pass are passed over at their next turn,
    # so the state must carry each family's record too. The state goes through JSON (plain data).
    def run(resume_after=None):
        s, out = stream(curriculum=(1, 0.0, 1.0)), []
        for step in range(6):
            if step == resume_after:
                state = json.loads(json.dumps(s.state_dict()))
                s = stream(curriculum=(1, 0.0, 1.0))
                s.load_state_dict(state)
            batch = s.next()
            s.observe(batch, [1.0 if r["answer"] in "02468" else 0.5 for r in batch])
            out.append([r["messages"][0]["content"] for r in batch])
        return out, s.state_dict()

    whole, end = run()
    assert run(resume_after=3) == (whole, end)
    assert sum(end["streams"][f]["skipped"] for f in end["streams"]) > 0  # the curriculum did pass prompts over


def test_peek_is_the_coming_batch_and_moves_nothing():
    s = stream()
    ahead, now = s.peek(2), s.peek()
    assert all(a is b for a, b in zip(now, s.next()))  # peeking moved nothing; the very row objects (pool.py: holds)
    s.next()
    assert s.next() == ahead  # peek(2): the batch after two more calls


def test_the_curriculum_hears_each_family_and_adds_up_its_metrics():
    s = stream(batch=4, weights={"arithmetic": 1, "math": 1}, curriculum=(2, 0.0, 1.0))
    batch = s.next()
    m = s.observe(batch, [0.5] * len(batch))
    assert m == {"curriculum/skipped": 0, "curriculum/tracked_prompts": 4}
    per_family = {f: len(x.history) for f, x in s.streams.items()}
    assert per_family == {f: sum(r[TASK_KEY] == f for r in batch) for f in ("arithmetic", "math")}


def test_make_stream_is_a_plain_prompt_stream_outside_a_mix():
    task = build_task(tiny_cfg("task.n_train=8").task)
    assert type(make_stream(task, 4, 0)).__name__ == "PromptStream" and not task.mix
    assert all(TASK_KEY not in r for r in task.train + task.heldout)


# --- the verifier -----------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:rlpost.sandbox. running model-written code under rlimits:RuntimeWarning")
def test_each_row_is_scored_by_its_own_familys_rules():
    # "\boxed{0.5}" for the answer 1/2: math-verify says equal (1.0); the arithmetic rule (last integer
    # equals the answer) would read 5 and fail. "12 + 7 = 19" for 19: arithmetic's last integer, 1.0.
    half = {"answer": "\\frac{1}{2}", TASK_KEY: "math"}
    assert score("so it is \\boxed{0.5}", half)[0] == 1.0
    assert score("so it is \\boxed{0.5}", {**half, TASK_KEY: "arithmetic", "answer": "5"})[0] == 1.0  # last integer 5
    assert (score("12 + 7 = 19", {"answer": "19", TASK_KEY: "arithmetic"})
            == (1.0, {"correct": True, "parsed": True, "pred": "19"}))
    assert score("12 + 7 = 18", {"answer": "19", TASK_KEY: "arithmetic"})[0] == 0.0
    # a reasoning-gym row: its own scorer reads the <answer> block
    (row,), _ = gym.build_splits("basic_arithmetic", {}, 1, 1, seed=3)
    row = {**row, TASK_KEY: "gym"}
    gold = row["gym"]["entry"]["answer"]
    assert score(f"<answer>{gold}</answer>", row)[0] == 1.0 and score("<answer>nope</answer>", row)[0] < 1.0
    # a code row: its hidden tests, in the sandbox its row names (rlimits: runs where bubblewrap cannot)
    add = {"tests": ["assert add(1, 2) == 3", "assert add(2, 2) == 4"],
           "limits": {"wall_s": 2.0, "cpu_s": 1, "memory_mb": 256},
           "sandbox": {"backend": "rlimits", "parallel": 1, "allow_root": True}, TASK_KEY: "code"}
    assert score("```python\ndef add(a, b):\n    return a + b\n```", add)[0] == 1.0
    assert score("```python\ndef add(a, b):\n    return a * b\n```", add)[0] == 0.5  # 1*2 != 3, 2*2 == 4
    for bad in ({"answer": "1"}, {"answer": "1", TASK_KEY: "tools"}, {"answer": "1", TASK_KEY: "chess"}):
        with pytest.raises(ValueError, match="expected the family of a task.mix row"):
            score("1", bad)


class FakeBatch:
    def __init__(self, completions, rows):
        self.completions, self.rows = completions, rows


def test_the_mix_verifier_runs_in_the_worker_processes_with_their_failure_rules():
    # the same path the loop gives VerifierRunner: arithmetic right, math right, a row of no family
    # is a counted verifier error scored 0 (never a crash), and the step goes on
    r = VerifierRunner(MIX_VERIFIER, timeout_s=10, workers=1)
    try:
        rewards, infos, m = r.score(FakeBatch(["19", "\\boxed{\\frac{2}{4}}", "19"], [
            {"answer": "19", TASK_KEY: "arithmetic"}, {"answer": "\\frac{1}{2}", TASK_KEY: "math"}, {"answer": "19"}]))
    finally:
        r.close()
    assert rewards.tolist() == [1.0, 1.0, 0.0] and m["verifier/errors"] == 1 and "ValueError" in infos[2]["error"]


# --- per-family batch metrics -----------------------------------------------------------------


def test_batch_metrics_per_family_by_hand():
    # arithmetic rewards 1, 0, 1, 1: mean 3/4, pass rate 3/4 (reward >= 1), share 4/8
    # math rewards 0.2, 1.2, 0, 0:   mean 1.4/4 = 0.35, pass rate 1/4 (only 1.2 >= 1), share 4/8
    rows = [{TASK_KEY: "arithmetic"}] * 2 + [{TASK_KEY: "math"}] * 4 + [{TASK_KEY: "arithmetic"}] * 2
    m = batch_metrics(rows, [1, 0, 0.2, 1.2, 0, 0, 1, 1])
    assert m == pytest.approx({"reward/mean/arithmetic": 0.75, "reward/pass_rate/arithmetic": 0.75,
                               "mix/share/arithmetic": 0.5, "reward/mean/math": 0.35, "reward/pass_rate/math": 0.25,
                               "mix/share/math": 0.5})
    assert batch_metrics([{}, {}], [1.0, 0.0]) == {}  # outside a mix: nothing


# --- the mixed splits -------------------------------------------------------------------------


def test_a_mix_builds_each_family_stamps_its_rows_and_interleaves_the_heldout():
    task = build_task(tiny_cfg("task.mix=arithmetic:3,math:1", "task.n_train=10", "task.n_heldout=4").task)
    assert task.mix == {"arithmetic": 3.0, "math": 1.0} and task.verifier == MIX_VERIFIER
    assert [r[TASK_KEY] for r in task.train] == ["arithmetic"] * 10 + ["math"] * 10  # n_train of each family
    assert [r[TASK_KEY] for r in task.heldout] == ["arithmetic", "math"] * 4  # so run.eval_n=2 takes one of each
    alone = build_task(tiny_cfg("task.n_train=10", "task.n_heldout=4").task)
    assert [r["messages"] for r in task.heldout[::2]] == [r["messages"] for r in alone.heldout]  # built as alone
    assert task.contamination["contamination_checked"] == 8 and task.contamination["contamination_contaminated"] == 0


def test_decontamination_checks_across_the_families_of_a_mix(tmp_path):
    # A dataset family whose training rows are the arithmetic family's held-out prompts: each family
    # alone is clean, the mix is not, and training refuses it naming task.max_contamination.
    heldout = build_task(tiny_cfg("task.n_heldout=10").task).heldout
    data, evals = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    data.write_text("".join(json.dumps({"prompt": r["messages"][-1]["content"], "answer": r["answer"]}) + "\n"
                            for r in heldout))
    evals.write_text("".join(json.dumps({"prompt": f"Spell the number {i} in words.", "answer": str(i)}) + "\n"
                             for i in range(10)))
    mix = tiny_cfg("task.mix=arithmetic:1,dataset:1", f"task.data={data}", f"task.eval_data={evals}",
                   "task.n_heldout=10")
    with pytest.raises(ConfigError, match=r"^task.max_contamination: 10 of 20 held-out prompts \(50.0%\)"):
        build_task(mix.task)
    found = build_task(mix.task, refuse_contaminated=False).contamination
    assert (found["contamination_checked"], found["contamination_contaminated"]) == (20, 10)
