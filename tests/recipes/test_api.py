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
from rlpost.types.errors import RunError


def readme_demo() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    return next(b for b in blocks if "rlpost.Trainer(" in b)


def test_import_rlpost_loads_no_torch_and_exports_the_api():
    code = "import sys, rlpost; assert 'torch' not in sys.modules; print('ok')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={"PYTHONPATH": ":".join(sys.path), "PATH": "/usr/bin:/bin"})
    assert r.stdout.strip() == "ok", r.stderr[-2000:]
    assert {"Trainer", "train", "Task", "load_config", "export_run"} <= set(dir(rlpost))


def test_trainer_names_every_config_mistake_before_torch_loads(tmp_path):
    # a misspelt key and a wrong type, one line each, with torch not yet imported (it takes seconds; the
    # check a fraction of one)
    code = ("import sys, rlpost\n"
            "try:\n"
            "    rlpost.Trainer(model='embedded', reward_funcs='no_such_file.py:f',\n"
            "                   overrides={'trainer.lrr': 1, 'rollout.group_size': 'a'})\n"
            "except ValueError as e:\n"
            "    print(e)\n"
            "print('torch loaded:', 'torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                       env={"PYTHONPATH": ":".join(sys.path), "PATH": "/usr/bin:/bin"})
    lines = r.stdout.strip().splitlines()
    assert lines[-1] == "torch loaded: False", r.stdout + r.stderr[-2000:]
    assert [line.split(":")[0] for line in lines[:-1]] == ["trainer.lrr", "rollout.group_size"], lines
    # the file is named once the keys are right (the functions' paths are checked with the task's keys)
    code = code.replace("overrides={'trainer.lrr': 1, 'rollout.group_size': 'a'}", "overrides={}")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                       env={"PYTHONPATH": ":".join(sys.path), "PATH": "/usr/bin:/bin"})
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("task.reward_funcs: no file no_such_file.py"), r.stdout + r.stderr
    assert lines[1] == "torch loaded: False"


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
    with pytest.raises(ConfigError, match=r"^dataset: a dict of columns \(prompt, answer\); pass rows"):
        rlpost.Trainer(model="tiny", train_dataset={"prompt": ["a"], "answer": ["1"]}, output_dir=tmp_path / "d")

    class Env:
        def reset(self, row):
            return "hi"

    with pytest.raises(ConfigError, match=r"^environment: expected an environment class .*got Env \(an instance"):
        rlpost.Trainer(model="tiny", environment=Env(), output_dir=tmp_path / "e")


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


# TRL's GRPOConfig fields docs/coming-from.md maps, each set off TRL's default, and the rlpost overrides they are
TRL_FIELDS = {"learning_rate": 3e-6, "num_generations": 2, "max_completion_length": 8, "num_iterations": 2,
              "beta": 0.04, "epsilon": 0.1, "epsilon_high": 0.3, "temperature": 0.9, "top_p": 0.95,
              "loss_type": "dr_grpo", "scale_rewards": "none", "mask_truncated_completions": True, "max_steps": 3,
              "seed": 7, "save_steps": 2, "save_total_limit": 2, "warmup_steps": 1, "lr_scheduler_type": "cosine",
              "max_grad_norm": 0.5, "weight_decay": 0.01, "gradient_checkpointing": False, "reward_weights": [1.0]}
THE_SAME_IN_RLPOST = ["trainer.lr=3e-6", "rollout.group_size=2", "rollout.max_new_tokens=8", "trainer.epochs=2",
                      "algo.kl_coef=0.04", "algo.clip_eps_low=0.1", "algo.clip_eps_high=0.3",
                      "rollout.temperature=0.9", "rollout.top_p=0.95", "algo.loss_agg=const_norm",
                      "algo.scale_by_std=false", "algo.overlong_filter=true", "run.steps=3", "run.seed=7",
                      "run.checkpoint_every=2", "run.keep_checkpoints=2", "trainer.warmup_steps=1",
                      "trainer.schedule=cosine", "trainer.max_grad_norm=0.5", "trainer.weight_decay=0.01",
                      "model.gradient_checkpointing=false"]  # and reward_weights=[1.0]


def test_trls_grpo_config_and_lora_config_give_the_config_of_the_rlpost_overrides(tmp_path):
    # Trainer(args=GRPOConfig(...), peft_config=LoraConfig(...)) was a bare TypeError: each field the name
    # table maps is taken as that table says (a GRPOConfig's unset fields, TRL's defaults, are not)
    from peft import LoraConfig
    from trl import GRPOConfig

    from rlpost.config import to_dict

    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(20)]

    def make(**kw):
        return to_dict(rlpost.Trainer(model="tiny", reward_funcs=["toy_verifiers:odd_length"], train_dataset=rows,
                                      output_dir=tmp_path / "r", **kw).config)

    lora = ["model.lora_r=4", "model.lora_alpha=8", "model.lora_dropout=0.1", "model.lora_targets=q_proj,v_proj"]
    ours = make(overrides=[*THE_SAME_IN_RLPOST, *lora], reward_weights=[1.0])
    peft = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["v_proj", "q_proj"], task_type="CAUSAL_LM")
    assert make(args=GRPOConfig(use_cpu=True, **TRL_FIELDS), peft_config=peft) == ours
    assert make(args=TRL_FIELDS, peft_config=peft) == ours  # a dict of the same fields
    assert ours != make(), "the fields change the config"
    # a GRPOConfig left at TRL's defaults changes nothing (TRL's lr 1e-6 is not taken for one the user set);
    # a flag set False (bf16=False, as a machine without a bf16 GPU needs) leaves rlpost's default
    assert make(args=GRPOConfig(use_cpu=True)) == make() == make(args=GRPOConfig(bf16=False))
    # overrides= wins over args= for a key set in both
    assert make(args={"learning_rate": 3e-6}, overrides={"trainer.lr": 5e-6})["trainer"]["lr"] == 5e-6


def test_each_trl_shape_rlpost_does_not_take_is_one_line_naming_the_docs_page(tmp_path):
    from peft import LoraConfig, PromptTuningConfig
    from trl import GRPOConfig

    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(20)]

    def refused(*lines, train=None, **kw):
        with pytest.raises(ConfigError) as e:
            t = rlpost.Trainer(model="tiny", train_dataset=rows, output_dir=tmp_path / "r", **kw)
            (train or (lambda t: t.train()))(t)
        said = str(e.value).splitlines()
        assert len(said) == len(lines) and all(re.search(want, got) for want, got in zip(lines, said)), said
        assert all(re.search(r"docs/\w[\w-]*\.md\)?$", got) for got in said), said
        assert not (tmp_path / "r").exists()

    # every set field the table cannot map, at once: counted otherwise, not in the table, a value it has no word for
    refused(r"^args.per_device_train_batch_size=16: counted otherwise .* set rollout.prompts_per_step in overrides=",
            r"^args.logging_steps=5: not a TRL field docs/coming-from.md maps; rlpost's own keys go in overrides=",
            r"^args.loss_type=sapo: no rlpost value for it \(TRL's grpo, bnpo, dapo, dr_grpo map to algo.loss_agg",
            args=GRPOConfig(use_cpu=True, per_device_train_batch_size=16, logging_steps=5, loss_type="sapo"))
    refused(r"^args: expected a TRL config \(GRPOConfig\) or a dict of its fields, got str", args="grpo.yaml")
    refused(r"^peft_config.task_type=SEQ_CLS: rlpost trains a causal LM's adapters \(task_type CAUSAL_LM or None",
            r"^peft_config.use_rslora=true: not a LoRA setting rlpost takes",
            peft_config=LoraConfig(task_type="SEQ_CLS", use_rslora=True))
    refused(r"^peft_config: a PromptTuningConfig \(PROMPT_TUNING\); rlpost trains LoRA adapters",
            peft_config=PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4))
    refused(r"^rlpost.Trainer: optimizers= is not taken here; rlpost builds the optimizer",
            r"^rlpost.Trainer: tools= is not taken here; tools reach the model through an environment",
            optimizers=(None, None), tools=[len])
    refused(r"^Trainer.train: trial= is not taken here", train=lambda t: t.train(trial=None))
    refused(r"^resume_from_checkpoint: .*elsewhere is not this Trainer's output_dir .*; rlpost resumes the run in "
            r"output_dir: pass output_dir='.*elsewhere' and resume_from_checkpoint=True",
            train=lambda t: t.train(resume_from_checkpoint=str(tmp_path / "elsewhere")))
    refused(r"^save_model: no model in .*r yet: train\(\) writes RUN/model at its end", train=lambda t: t.save_model())
    # TRL's processing_class: a tokenizer that is not the model's own (here: tiny's, with a template of its own)
    from rlpost.model.load import load_tokenizer

    other = load_tokenizer("tiny")
    other.chat_template = "{{ messages[0]['content'] }}"
    refused(r"^processing_class: not tiny's own tokenizer \(its chat template differs\); rlpost tokenizes with the "
            "model folder's tokenizer", processing_class=other)


def test_trls_train_and_save_model_shapes_run_resume_and_copy_the_model(tmp_path):
    from trl import GRPOConfig

    from rlpost.model.load import load_tokenizer

    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(30)]
    tiny = [o for o in TINY if not o.startswith("run.steps=")]

    def trainer(steps):
        return rlpost.Trainer(model="tiny", reward_funcs=["toy_verifiers:odd_length"], train_dataset=rows,
                              args=GRPOConfig(use_cpu=True, max_steps=steps), processing_class=load_tokenizer("tiny"),
                              overrides=[*tiny, "task.max_contamination=1"], output_dir=tmp_path / "r")

    assert trainer(1).train()["steps"] == 1
    (newest,) = (tmp_path / "r" / "checkpoints").glob("step_*")
    assert trainer(2).train(resume_from_checkpoint=str(newest))["steps"] == 2  # TRL's checkpoint path: the newest
    t = trainer(3)
    assert t.train(resume_from_checkpoint=True)["steps"] == 3
    assert t.save_model() == tmp_path / "r" / "model"
    out = t.save_model(tmp_path / "saved")
    assert out == tmp_path / "saved" and (out / "config.json").read_bytes() == (
        tmp_path / "r" / "model" / "config.json").read_bytes()
    with pytest.raises(ConfigError, match=r"^save_model: .*r/out is inside the run folder"):
        t.save_model(tmp_path / "r" / "out")


def test_a_start_failing_at_its_first_rollout_leaves_only_its_log_and_a_rerun_starts_clean(tmp_path):
    # it left config.yaml, data/, samples/ and the pickled functions; a rerun wrote its own beside them (its
    # config naming pickles it then removed, the first start's still there) and appended to the first one's log
    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(30)]

    def bad(completion, row):
        raise ValueError("boom")

    for attempt in (1, 2):
        with pytest.raises(RunError, match="reward function bad failed on 16 of 16 completions"):
            rlpost.Trainer(model="tiny", reward_funcs=[bad], train_dataset=rows,
                           overrides=[*TINY, "task.max_contamination=1"], output_dir=tmp_path / "r").train()
        assert sorted(p.name for p in (tmp_path / "r").iterdir()) == [".rlpost", "verifier.log"], attempt
        assert (tmp_path / "r" / "verifier.log").read_text().count("ValueError: boom") == 16, attempt
