"""rlpost.Trainer, the TRL-shaped Python API: the README's demo snippet on the tiny model, rows and
callables in, the same run folder out (config.yaml, so `rlpost eval` and `--resume` work on it)."""

import json
import re
import subprocess
import sys

import datasets
import pytest
from helpers import ROOT, TINY, run_cli

import rlpost
from rlpost.config import ConfigError


def readme_demo() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    return next(b for b in blocks if "rlpost.Trainer(" in b)


def test_import_rlpost_loads_no_torch_and_exports_the_api():
    code = "import sys, rlpost; assert 'torch' not in sys.modules; print('ok')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={"PYTHONPATH": ":".join(sys.path), "PATH": "/usr/bin:/bin"})
    assert r.stdout.strip() == "ok", r.stderr[-2000:]
    assert {"Trainer", "train", "Task", "load_config", "export_run"} <= set(dir(rlpost))


def test_the_readme_demo_runs_through_the_api_in_10_lines(tmp_path, monkeypatch):
    snippet = readme_demo()
    assert len([line for line in snippet.splitlines() if line.strip()]) <= 10
    assert 'model="embedded"' in snippet
    monkeypatch.chdir(tmp_path)  # the run folder goes under ./runs
    exec(snippet.replace('model="embedded"', f'model="tiny", overrides={TINY!r}'), {})
    (run,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["heldout_n"] == 8 and (run / "model" / "config.json").exists()
    assert "reward/last_integer" in (run / "metrics.jsonl").read_text()  # the function was the reward


@pytest.mark.slow
def test_callables_and_a_datasets_dataset_then_eval_and_resume_from_the_cli(tmp_path):
    scale = 0.5  # captured by the closure: the worker gets the function by value, not by name

    def odd_half(completion, row):  # verifier-style
        return scale * (len(completion) % 2)

    def trl_style(prompts, completions, answer, **kwargs):  # TRL's signature; columns arrive as keywords
        return [0.25 * (c[0]["content"][:1] == a) for c, a in zip(completions, answer)]

    rows = datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": str(d)}], "answer": str(d)}
                                       for d in range(10)] * 4)
    # ten prompts repeated: every held-out row is also a training row, which decontamination would
    # refuse (envs/decontam.py); accepted here, the point is the callables
    trainer = rlpost.Trainer(model="tiny", reward_funcs=[odd_half, trl_style, lambda c, r: 0.0], train_dataset=rows,
                             overrides=[*TINY, "task.max_contamination=1"], output_dir=tmp_path / "run")
    summary = trainer.train()
    run = tmp_path / "run"
    assert summary["run_dir"] == str(run)
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert {"reward/odd_half", "reward/trl_style", "reward/reward_2"} <= set(metrics[0])
    samples = [json.loads(line) for line in (run / "samples" / "step_000002.jsonl").read_text().splitlines()]
    assert {s["reward"] for s in samples} <= {0.0, 0.25, 0.5, 0.75}
    # a fresh process: the run folder's config names the pickled functions, and they load there
    e = run_cli("eval", str(run), "--n", "4")
    assert e.returncode == 0, e.stderr[-2000:]
    r = run_cli("train", "--resume", str(run), "run.steps=3")
    assert r.returncode == 0, r.stderr[-2000:]
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 3


def test_bad_inputs_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="rows without 'answer' need reward_funcs or a verifier"):
        rlpost.Trainer(model="tiny", train_dataset=[{"prompt": "1"}], output_dir=tmp_path / "a")
    with pytest.raises(ConfigError, match="model: expected a name or a folder"):
        rlpost.Trainer(model=object(), output_dir=tmp_path / "b")
    with pytest.raises(ConfigError, match="trainer.lr: expected a number > 0"):
        rlpost.Trainer(model="tiny", config={"trainer": {"lr": -1}}, output_dir=tmp_path / "c")
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()  # refused before any folder


def test_config_as_a_dict_or_recipe_with_dotted_overrides(tmp_path):
    t = rlpost.Trainer(model="tiny", config={"trainer.lr": 3e-4, "rollout": {"group_size": 2}},
                       overrides={"run.steps": 7}, output_dir=tmp_path / "r")
    assert (t.config.trainer.lr, t.config.rollout.group_size, t.config.run.steps) == (3e-4, 2, 7)
    t = rlpost.Trainer(config=ROOT / "recipes" / "tiny_smoke.yaml", overrides=["run.steps=3"],
                       output_dir=tmp_path / "s")
    assert t.config.model.name == "tiny" and t.config.run.steps == 3


def test_your_rows_get_a_length_cap_for_real_answers(tmp_path):
    # The demo's 16 tokens cut off 87.5% of a verl user's answers; rows of your own get TRL's 256, cut to
    # half the context of a model whose context is smaller (tiny's 256: 128, said in one line by defaults.py)
    rows = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(20)]
    t = rlpost.Trainer(model="tiny", train_dataset=rows, output_dir=tmp_path / "r")
    assert t.config.rollout.max_new_tokens == 128 and t.config.task.name == "dataset"
    t = rlpost.Trainer(model="tiny", train_dataset=rows, overrides=["rollout.max_new_tokens=32"],
                       output_dir=tmp_path / "s")
    assert t.config.rollout.max_new_tokens == 32
    # the demo's task
    assert rlpost.Trainer(model="tiny", output_dir=tmp_path / "t").config.rollout.max_new_tokens == 16


def test_rows_without_answers_say_which_function_scores_heldout(tmp_path, capsys):
    # a format reward listed first would silently be the held-out metric: the choice is said, and verifier= makes it
    def format_ok(completion, row):
        return 0.1

    def correct(completion, row):
        return 1.0

    rows = [{"prompt": f"q{i}"} for i in range(20)]
    rlpost.Trainer(model="tiny", reward_funcs=[format_ok, correct], train_dataset=rows, output_dir=tmp_path / "a")
    assert "held-out accuracy: scored by the first reward function, format_ok" in capsys.readouterr().err
    t = rlpost.Trainer(model="tiny", reward_funcs=[format_ok, correct], verifier=correct, train_dataset=rows,
                       output_dir=tmp_path / "b")
    assert "held-out accuracy: scored by" not in capsys.readouterr().err and t.config.task.verifier


def test_the_write_rule_a_finished_run_is_never_overwritten_and_a_failed_start_leaves_nothing(tmp_path):
    from rlpost.types import folders

    rows = [{"prompt": str(i), "answer": str(i)} for i in range(30)]
    # the model's limits are checked on the rows in memory: nothing is written, not even the folder
    bad = rlpost.Trainer(model="tiny", train_dataset=[*rows, {"prompt": "1" * 400, "answer": "1"}], overrides=TINY,
                         output_dir=tmp_path / "a")
    with pytest.raises(ConfigError, match="train_dataset row 31: the prompt is longer than the model's context"):
        bad.train()
    assert not (tmp_path / "a").exists()
    # found after the claim (a reward function that does not import): the rows, pickles and config it wrote go
    (tmp_path / "b").mkdir()
    late = rlpost.Trainer(model="tiny", reward_funcs=["toy_verifiers:no_such", lambda c, r: 0.0], train_dataset=rows,
                          overrides=TINY, output_dir=tmp_path / "b")
    with pytest.raises(ConfigError, match="cannot import 'toy_verifiers:no_such'"):
        late.train()
    assert list((tmp_path / "b").iterdir()) == []
    # a finished run, and a folder of the user's own, are refused as the CLI refuses them
    (tmp_path / "done").mkdir()
    folders.mark(tmp_path / "done", "run")
    (tmp_path / "done" / "summary.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"output_dir: .*done already holds a run; pass resume=True to continue it"):
        rlpost.Trainer(model="tiny", train_dataset=rows, overrides=TINY, output_dir=tmp_path / "done").train()
    assert sorted(p.name for p in (tmp_path / "done").iterdir()) == [".rlpost", "summary.json"]
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"output_dir: .*mine holds files rlpost did not write \(notes.txt\)"):
        rlpost.Trainer(model="tiny", train_dataset=rows, overrides=TINY, output_dir=tmp_path / "mine").train()


def test_the_docs_environment_example_runs_through_the_api(tmp_path, monkeypatch):
    """docs/environments.md's complete environment, exactly, on the tiny model: rlpost.Trainer(environment=...)."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "environments.md").read_text(), re.S)
    snippet = next(b for b in blocks if "environment=Retry" in b)
    assert len(snippet.splitlines()) <= 32 and 'model="embedded"' in snippet
    monkeypatch.chdir(tmp_path)
    tiny = dict(o.split("=", 1) for o in TINY)
    tiny_overrides = f'overrides={{**{tiny!r}, "task.max_turns": 2}}'
    snippet = snippet.replace('model="embedded"', 'model="tiny"')
    exec(snippet.replace('overrides={"task.max_turns": 2}', tiny_overrides), {})
    (run,) = (tmp_path / "runs").iterdir()
    assert run.name.startswith("env-grpo-")
    summary = json.loads((run / "summary.json").read_text())
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert summary["steps"] == 2 and summary["heldout_n"] == 8
    # the class ran in the environment workers: 16 episodes a step, one or two turns each, no failure
    assert [r["env/episodes"] for r in rows] == [16, 16]
    assert all(1 <= r["env/turns_mean"] <= 2 and r["env/errors"] == 0 for r in rows)


def test_a_pickled_reward_functions_traceback_names_its_file(tmp_path):
    # a function of the user's script (__main__, pickled by value) keeps its file: its traceback in the verifier
    # worker names that file and line, where cloudpickle alone names '<dynamic-code>'
    import pickle
    import traceback

    from rlpost.recipes.api import Registry

    script = tmp_path / "train_mine.py"
    script.write_text("def helper(x):\n    return 1 / x\n\n\ndef my_reward(completions, **kw):\n"
                      "    return list(map(helper, [0] * len(completions)))\n")
    found = {"__name__": "__main__"}
    exec(compile(script.read_text(), str(script), "exec"), found)
    registry = Registry(tmp_path)
    assert registry.add(found["my_reward"], "reward_0") == f"{registry.module}:my_reward"
    registry.save()
    loaded = pickle.loads((tmp_path / f"{registry.module}.pkl").read_bytes())
    with pytest.raises(ZeroDivisionError) as e:
        loaded["my_reward"](["a"])
    frames = traceback.extract_tb(e.tb)[1:]
    assert [(f.filename, f.lineno, f.name) for f in frames] == [
        (str(script), 6, "my_reward"), (str(script), 2, "helper")]
    assert frames[-1].line == "return 1 / x"


def test_resume_keeps_the_callbacks_and_refuses_what_a_resume_cannot_change(tmp_path):
    # train(resume=True) dropped the callbacks, and every value outside config.RESUMABLE, without a word
    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(30)]

    def reward(completion, row):
        return float(len(completion) % 2)

    seen = []

    class Recorder:
        def on_step_end(self, step, metrics, roles):
            seen.append(step)

    def trainer(*more, callbacks=()):
        return rlpost.Trainer(model="tiny", reward_funcs=[reward], train_dataset=rows, callbacks=callbacks,
                              overrides=[*TINY, "task.max_contamination=1", *more], output_dir=tmp_path / "r")

    trainer("run.steps=1").train()
    # the same function, registered anew by this Trainer, and run.steps (resumable): the run goes on
    assert trainer("run.steps=2", callbacks=[Recorder()]).train(resume=True)["steps"] == 2
    assert seen == [2]
    refused = r"^algo.name: cannot change on --resume \(the run has 'grpo', asked 'rloo'\)"
    with pytest.raises(ConfigError, match=refused):
        trainer("run.steps=3", "algo.name=rloo").train(resume=True)
    assert len((tmp_path / "r" / "metrics.jsonl").read_text().splitlines()) == 2
