"""Config: typed, validated, one-line errors naming the key, exit status 2 from the CLI."""

import json
import re

import pytest
from helpers import ROOT, cli, run_cli

from rlpost import build, config, config_check, defaults
from rlpost.types.errors import ConfigError, ConfigProblems


@pytest.mark.parametrize("override,expected", [
    ("rollout.group_sise=4", "rollout.group_sise: unknown key"),
    ("rollout.group_size=four", "rollout.group_size: expected an integer >= 1 and <= 1024, got 'four'"),
    ("trainer.lr=-1", "trainer.lr: expected a number > 0 and <= 1, got -1.0"),
    ("trainer.lr=inf", "trainer.lr: expected a finite number > 0 and <= 1"),
    ("trainer.lr=1e30", "trainer.lr: expected a number > 0 and <= 1, got 1e+30"),
    ("algo.kl_coef=nan", "algo.kl_coef: expected a finite number >= 0"),
    ("rollout.max_new_tokens=100000000", "rollout.max_new_tokens: expected an integer >= 0 and <= 131072"),
    ("rollout.top_p=1.5", "rollout.top_p: expected a number > 0 and <= 1, got 1.5"),
    ("algo.loss_agg=mean", "algo.loss_agg: expected one of token_mean"),
    ("run.progress=maybe", "run.progress: expected true or false"),
    ("task.name=tools rollout.top_p=0.9", "rollout.top_p: task.name=tools does not yet carry the top-p threshold"),
    ("run.early_stop_patience=2 run.eval_every=0",
     "run.early_stop_patience: needs held-out evaluations during the run"),
    ("rollout.curriculum_window=3 dist.topology=async",
     "rollout.curriculum_window: async workers draw prompts steps ahead"),
    ("rollout.slots=4 rollout.engine=hf", "rollout.slots: decode slots are the own engine's"),
    ("rollout.slots=-1", "rollout.slots: expected an integer >= 0"),
    ("algo.cispo_eps_low=-1", "algo.cispo_eps_low: expected a number >= 0, got -1.0 (or none)"),
    ("nosuch.key=1", "nosuch.key: unknown section nosuch"),
    ("task.prompt_format=raw",
     "task.prompt_format: raw feeds task.data's string prompts as they are: it needs task.data"),
    ("trainer.mini_batch_size=48", "trainer.mini_batch_size: expected a divisor of the rollout batch (128), got 48"),
    ("rollout.group_size=1", "rollout.group_size: expected >= 2 for GRPO"),
    ("algo.kl_target=0.01", "algo.kl_target: adaptive KL starts from kl_coef"),
    ("algo.overlong_buffer=17", "algo.overlong_buffer: expected <= rollout.max_new_tokens (16), got 17"),
    ("algo.critic=both", "algo.critic: expected one of separate, shared"),
    ("rollout.filter_min_pass_rate=0.9 rollout.filter_max_pass_rate=0.5", "rollout.filter_min_pass_rate: expected <="),
    ("algo.name=reinforce algo.kl_coef=0.1", "algo.kl_coef: REINFORCE has no KL term"),
    ("algo.name=reinforce trainer.epochs=2", "trainer.epochs: REINFORCE has no importance ratio"),
    ("algo.name=nosuch", "algo.name: expected one of reinforce, ppo, reinforce_pp, grpo"),
    ("algo.name=dapo rollout.group_size=1", "rollout.group_size: expected >= 2 for DAPO"),
])
def test_bad_values_name_the_key(override, expected):
    # config.load checks what holds for any algorithm; build.check adds what the algorithm needs.
    with pytest.raises(config.ConfigError) as e:
        build.check(config.load(None, override.split()))
    assert str(e.value).startswith(expected) and "\n" not in str(e.value)


def test_yaml_recipe_and_overrides(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("rollout:\n  group_size: 4\ntrainer:\n  lr: 3e-6\n")
    cfg = config.load(recipe, ["rollout.group_size=6"])
    assert cfg.rollout.group_size == 6 and cfg.trainer.lr == 3e-6  # YAML's '3e-6' string becomes a float
    config.save(cfg, tmp_path / "saved.yaml")
    assert config.load(tmp_path / "saved.yaml") == cfg  # the saved effective config round-trips


def test_bad_yaml_names_the_line(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("rollout:\n  group_size: [4\n")
    with pytest.raises(config.ConfigError, match=r"line \d+: not valid YAML"):
        config.load(recipe)


def test_every_field_has_help():
    text = config.help_text()
    for section in ("model", "task", "rollout", "algo", "trainer", "run"):
        cls = config.section_class(section)
        docs = config.field_docs(cls)
        assert set(docs) == {f.name for f in config.fields(cls)}, f"{section} has fields without a docstring"
    assert "rollout.group_size=8" in text


@pytest.mark.parametrize("args", [
    ["train", "trainer.lr=abc"],
    ["train", "recipes/does_not_exist.yaml"],
    ["train", "model.name=/no/such/model", "run.out_dir=/tmp/rlpost-test-runs"],
    ["eval", "/no/such/model"],
    ["train", "model.name=tiny", "task.verifier=no_such_module:score"],
    ["train", "model.name=tiny", "task.verifier=toy_verifiers:no_such_function"],
])
def test_cli_bad_input_is_one_line_exit_2(args):
    r = cli(*args)
    assert r.returncode == 2, r.stderr
    lines = [l for l in r.stderr.splitlines() if l.startswith("rlpost: error:")]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr


def test_every_recipe_validates():
    from helpers import ROOT

    recipes = sorted((ROOT / "recipes").glob("*.yaml"))
    assert recipes
    for r in recipes:
        if "stages:" in r.read_text():  # a pipeline recipe: its stages are checked stage by stage
            from rlpost.recipes.pipeline import read_pipeline, stage_config

            tree = read_pipeline(r)
            for st in tree["stages"]:
                stage_config(tree, st, "tiny", {s["name"]: "rm-folder" for s in tree["stages"]}, ROOT / "runs")
        else:
            config.load(r)


def test_bad_input_from_the_real_entry_point_is_one_line_exit_2():
    # The same path in a separate process: the exit status and stderr a shell sees, no traceback.
    r = run_cli("train", "trainer.lr=abc")
    assert (r.returncode == 2
            and r.stderr.strip() == "rlpost: error: trainer.lr: expected a finite number > 0 and <= 1"), r.stderr


def test_the_length_cap_follows_the_data(tmp_path):
    # The demo's 16 tokens for the generated tasks; rows of your own get TRL's 256; a value you set wins,
    # and config.yaml keeps the number, so eval and --resume read the same cap.
    assert config.load().rollout.max_new_tokens == 16
    data = tmp_path / "rows.jsonl"
    data.write_text('{"prompt": "hi", "answer": "1"}\n')
    assert config.load(None, ["task.name=dataset", f"task.data={data}"]).rollout.max_new_tokens == 256
    assert config.load(None, ["task.name=math", f"task.data={data}"]).rollout.max_new_tokens == 256
    assert config.load(None, ["task.name=dataset", f"task.data={data}",
                              "rollout.max_new_tokens=40"]).rollout.max_new_tokens == 40
    saved = tmp_path / "config.yaml"
    config.save(config.load(None, ["task.name=dataset", f"task.data={data}"]), saved)
    assert "max_new_tokens: 256" in saved.read_text()


def test_the_length_cap_of_rows_fits_a_small_context(tmp_path, capsys):
    # The tiny model's context is 256 tokens: the rows' default 256 new tokens would leave no room for any prompt,
    # so the default is half the context, said in one line; a folder's config.json is read the same way.
    from rlpost.envs import build_task
    from rlpost.model import load

    assert load.tiny_model(8).config.max_position_embeddings == defaults.TINY_CONTEXT
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(f'{{"prompt": "What is {i} + 1?", "answer": "{i + 1}"}}\n' for i in range(10)))
    cfg = config.load(None, ["model.name=tiny", "task.name=dataset", f"task.data={data}"])
    assert cfg.rollout.max_new_tokens == 128
    assert capsys.readouterr().err.count("rollout.max_new_tokens: 128, half of model tiny's 256-token context") == 1
    build.preflight(cfg, build_task(cfg.task))  # the rows now fit: no ConfigError
    folder = tmp_path / "small"
    folder.mkdir()
    (folder / "config.json").write_text('{"max_position_embeddings": 300}')
    assert config.load(None, [f"model.name={folder}", "task.name=dataset",
                              f"task.data={data}"]).rollout.max_new_tokens == 150
    assert config.load(None, ["model.name=tiny", "task.name=dataset", f"task.data={data}",
                              "rollout.max_new_tokens=200"]).rollout.max_new_tokens == 200  # yours is kept


@pytest.mark.parametrize("args, expected", [
    (["learning_rate=1e-6"],
     "learning_rate: expected section.field, e.g. trainer.lr; did you mean trainer.lr=1e-6? (TRL's"),
    (["data.train_files=x.parquet"], "did you mean task.data=x.parquet? (verl's data.train_files"),
    (["algorithm.adv_estimator=gae"],
     "did you mean algo.name=ppo? (verl's algorithm.adv_estimator"),  # the value translated
    (["actor_rollout_ref.rollout.n=16"], "did you mean rollout.group_size=16? (verl's"),
    (["trainer.total_training_steps=100"], "trainer.total_training_steps: unknown key; did you mean run.steps=100?"),
    # the unit differs: no value carried over, the difference said
    (["per_device_train_batch_size=16"], "did you mean rollout.prompts_per_step? (TRL's per_device_train_batch_size: "
                                         "TRL counts completions"),
    (["actor_rollout_ref.actor.kl_loss_type=low_var_kl"], "did you mean algo.kl_estimator=k3?"),
    (["data.max_prompt_length=512"],
     "verl's data.max_prompt_length has no rlpost counterpart (rlpost never cuts a prompt): drop it"),
    (["--actor_learning_rate", "1e-6"], "--actor_learning_rate: not an rlpost option; rlpost takes section.key=value; "
                                        "did you mean trainer.lr=1e-6? (OpenRLHF's"),
    (["rollout.group_sise=4"], "rollout.group_sise: unknown key; did you mean rollout.group_size? (expected one of"),
])
def test_other_frameworks_names_get_the_rlpost_key(args, expected):
    r = cli("train", *args)
    assert r.returncode == 2 and expected in r.stderr, r.stderr


def test_a_verl_layout_recipe_and_a_trl_dict_get_the_same_answer(tmp_path):
    recipe = tmp_path / "verl.yaml"
    recipe.write_text("actor_rollout_ref:\n  rollout:\n    n: 8\n")
    with pytest.raises(config.ConfigError, match=r"actor_rollout_ref\.rollout\.n: unknown section actor_rollout_ref; "
                                                 r"did you mean rollout\.group_size=8\?"):
        config.load(recipe)
    import rlpost

    with pytest.raises(config.ConfigError, match=r"num_generations: .*did you mean rollout\.group_size=4\? \(TRL's"):
        rlpost.Trainer(model="tiny", overrides={"num_generations": 4}, output_dir=tmp_path / "r")


def test_verls_reward_function_keys_get_one_readable_hint(tmp_path):
    # verl's path and name are one rlpost setting: the hint writes it whole from the value given, and no list of
    # rlpost's sections trails after the answer
    recipe = tmp_path / "verl.yaml"
    recipe.write_text("custom_reward_function:\n  path: compute_score.py\n  name: compute_score\n")
    for source, expected in [
        (recipe, "custom_reward_function.path: unknown section custom_reward_function; did you mean "
                 "task.verifier=compute_score.py:compute_score? (verl's custom_reward_function.path: with .name, "
                 "one setting here: the file, a colon, the function; docs/coming-from.md)"),
        (["custom_reward_function.name=my_fn"], "custom_reward_function.name: unknown section custom_reward_function; "
         "did you mean task.verifier=my_reward.py:my_fn? (verl's custom_reward_function.name: with .path, one setting "
         "here: the file, a colon, the function; docs/coming-from.md)"),
    ]:
        with pytest.raises(config.ConfigError) as e:
            config.load(recipe) if source == recipe else config.load(None, source)
        assert str(e.value) == expected


def test_recipes_are_found_by_name_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no recipes/ here
    assert config.load("ppo_arith").algo.name == "ppo"
    assert config.load("ppo_arith.yaml").algo.name == "ppo"
    assert config.load("recipes/ppo_arith.yaml").algo.name == "ppo"  # the README's path, from elsewhere
    with pytest.raises(config.ConfigError,
                       match=r"recipe: file not found: nosuch \(shipped recipes, by name: .*ppo_arith"):
        config.load("nosuch")
    (tmp_path / "ppo_arith.yaml").write_text("algo:\n  name: grpo\n")  # a file of yours wins over the shipped one
    assert config.load("ppo_arith.yaml").algo.name == "grpo"


def test_the_shipped_recipes_are_the_repositorys_folder():
    # One folder: src/rlpost/shipped_recipes links to recipes/, so a recipe added there ships with nothing else to do
    from rlpost import names

    assert names.SHIPPED.resolve() == (ROOT / "recipes").resolve()
    assert names.shipped_recipes() == sorted(p.stem for p in (ROOT / "recipes").glob("*.yaml"))


@pytest.mark.slow  # builds a wheel (~8 s)
def test_a_wheel_carries_every_recipe(tmp_path):
    import shutil
    import subprocess
    import sys
    import zipfile

    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "recipes", tmp_path / "recipes")
    shutil.copytree(ROOT / "src", tmp_path / "src", symlinks=True,
                    ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                        str(tmp_path / "dist"), str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    inside = {n.rpartition("/")[2] for n in zipfile.ZipFile(wheel).namelist() if "/shipped_recipes/" in n}
    assert inside == {p.name for p in (ROOT / "recipes").glob("*.yaml")}


def test_reward_functions_by_file_and_the_hints_for_what_is_not_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_reward.py").write_text("def compute_score(*a):\n    return 1.0\n")
    (tmp_path / "rm").mkdir()
    cfg = config.load(None,
                      ["task.verifier=my_reward.py:compute_score", "task.reward_funcs=my_reward.py:compute_score"])
    # the absolute path, so `rlpost eval RUN` from another folder imports the same file
    assert cfg.task.verifier == f"{tmp_path / 'my_reward.py'}:compute_score" == cfg.task.reward_funcs
    for item, expected in [
        ("task.verifier=my_reward.py", "names no function; expected 'module:function' or 'file.py:function', "
                                       "e.g. task.verifier=my_reward.py:compute_score (verl's "
                                       "custom_reward_function.name"),
        ("task.verifier=nofile.py:compute_score", "task.verifier: no file nofile.py"),
        ("task.reward_funcs=rm",
         "rm looks like a reward model (a model folder or hub id): that goes in task.reward_model=rm"),
        ("task.reward_funcs=OpenAssistant/reward-model-deberta-v3-large-v2",
         "goes in task.reward_model="),  # TRL takes a hub id
    ]:
        with pytest.raises(config.ConfigError, match=re.escape(expected)):
            config.load(None, [item])


def test_a_datasetdict_is_told_to_pass_a_split(tmp_path):
    import datasets

    import rlpost

    ds = datasets.DatasetDict({"train": datasets.Dataset.from_list([{"prompt": "a", "answer": "1"}]),
                               "test": datasets.Dataset.from_list([{"prompt": "b", "answer": "2"}])})
    with pytest.raises(config.ConfigError, match=re.escape("a DatasetDict of splits (train, test); pass one split, "
                                                           "e.g. train_dataset=ds['train'], eval_dataset=ds['test']")):
        rlpost.Trainer(model="tiny", train_dataset=ds, output_dir=tmp_path / "r")


# Every problem of a start at once, before torch loads: the CLI in a process of its own, where sys.modules tells
_ALL_AT_ONCE = """
import sys
from rlpost.cli import main
rc = main(sys.argv[1:])
print("torch" in sys.modules, rc)
"""


def test_every_bad_key_is_named_at_once_before_torch_loads():
    import subprocess
    import sys

    args = ["train", "task.bad=1", "algo.x=2", "rollout.group_size=zz", "algo.baseline=none",
            "task.reward_funcs=no_such_module_here:f", "trainer.lr=abc"]
    r = subprocess.run([sys.executable, "-c", _ALL_AT_ONCE, *args], capture_output=True, text=True, cwd=ROOT,
                       timeout=120)
    assert r.stdout.split() == ["False", "2"], r.stderr  # torch never imported; exit 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 6 and all(line.startswith("rlpost: error: ") for line in lines), lines
    for named in ("task.bad: unknown key", "algo.x: unknown key", "rollout.group_size: expected an integer",
                  "trainer.lr: expected a finite number", "algo.baseline: algo.name=grpo does not read it (read by "
                  "reinforce)", "task.reward_funcs: no_such_module_here:f: no module 'no_such_module_here'"):
        assert sum(named in line for line in lines) == 1, (named, lines)


def test_the_table_of_algo_keys_read_before_torch_is_the_algorithms_own():
    # config_check reads each algorithm's declaration from its file, torch unloaded: the same sets as the classes'
    from rlpost import algorithms, config_check

    assert {name: algorithms.knobs_read(cls) for name, cls in algorithms.ALGORITHMS.items()} == \
        config_check.algo_knobs()


def test_the_python_trainer_names_every_bad_key_at_once():
    import rlpost

    with pytest.raises(config.ConfigError) as e:
        rlpost.Trainer(model="tiny", overrides={"task.bad": 1, "algo.x": 2, "run.steps": 0})
    assert [line.split(":")[0] for line in str(e.value).splitlines()] == ["task.bad", "algo.x", "run.steps"]


def test_micro_batch_size_is_a_cap_not_a_divisor():
    # the trainer cuts a mini-batch into ceil(mini / micro) micro-batches, the last smaller, and accumulates the
    # whole mini-batch's gradient either way (tests/roles/test_trainer.py's uneven cuts); so 7 of 128 loads, and
    # sft's pref.batch_size=8 with 3 is not refused by RL's mini-batch of 128, which it does not use
    assert config.load(None, ["trainer.micro_batch_size=7"]).derived.micro_batch_size == 7
    assert config.load(None, ["trainer.micro_batch_size=3", "pref.batch_size=8"]).trainer.micro_batch_size == 3


def test_every_cross_field_rule_broken_is_named_at_once():
    # three rules of the sizes, the KL schedule and the topology, each broken: three lines, not the first alone
    from rlpost import config_check
    from rlpost.types.errors import ConfigProblems

    with pytest.raises(ConfigProblems) as e:
        config_check.load(None, ["trainer.mini_batch_size=48", "algo.kl_target=0.1", "dist.trainer_ranks=2"],
                          on_this_machine=False)
    assert [p.split(":")[0] for p in e.value.problems] == ["trainer.mini_batch_size", "algo.kl_target",
                                                            "dist.topology"], e.value.problems
    with pytest.raises(config.ConfigError) as one:  # one rule broken: its plain one line, as before
        config.load(None, ["algo.kl_target=0.1"])
    assert not isinstance(one.value, ConfigProblems) and str(one.value).startswith("algo.kl_target: adaptive KL")


@pytest.mark.parametrize("overrides, expected", [
    (["task.name=gym", "task.ops=+"], "task.ops: applies to task.name=arithmetic, not task.name=gym"),
    (["task.name=tools", "task.env=guess"], "task.env: applies to task.name=env or agent, not task.name=tools"),
    (["task.mix=math:1,gym:1", "task.n_terms=3"], "task.n_terms: applies to task.name=arithmetic, not task.mix="),
    (["task.name=math", "task.sandbox=rlimits"], "task.sandbox: applies to task.name=code, not task.name=math"),
    (["task.max_turns=2"], "task.max_turns: applies to task.name=env, tools or agent, not task.name=arithmetic"),
    (["task.judge_mode=pairwise"], "task.judge_mode: read only with task.judge_model set"),
    (["task.length_penalty=ratio", "task.length_target=4"], "task.length_target: read only with "
                                                            "task.length_penalty=linear"),
    (["task.process_reward_coef=0.5"], "task.process_reward_coef: read only with task.process_reward_model set"),
    (["task.answer_column=solution"], "task.answer_column: read only with task.data"),
])
def test_a_task_key_the_runs_families_do_not_read_is_refused(overrides, expected):
    with pytest.raises(ConfigError) as e:
        config.load(None, overrides)
    assert str(e.value).startswith(expected) and str(e.value).endswith("remove it")


def test_task_keys_the_run_reads_are_taken():
    """The same keys where a family of the run reads them, or their feature is on."""
    for overrides in (["task.name=arithmetic", "task.ops=+"], ["task.mix=arithmetic:1,gym:1", "task.n_terms=3"],
                      ["task.name=tools", "task.max_turns=2", "task.env_args={}"],
                      ["task.name=code", "task.sandboxes=1"],
                      ["task.length_penalty=linear", "task.length_target=4", "task.length_coef=0.2"],
                      ["task.judge_model=embedded", "task.judge_mode=pairwise", "task.judge_both_orders=false"]):
        config.load(None, overrides)


def test_every_task_key_refused_at_once_with_the_rest():
    with pytest.raises(ConfigProblems) as e:
        config_check.load(None, ["task.name=gym", "task.ops=+", "task.max_a=9", "trainer.lr=abc"],
                          on_this_machine=False)
    assert sorted(p.partition(":")[0] for p in e.value.problems) == ["task.max_a", "task.ops", "trainer.lr"]


class Reads:
    """A task section that records which of its keys were read."""

    def __init__(self, task):
        self.task, self.read = task, set()

    def __getattr__(self, key):
        self.read.add(key)
        return getattr(self.task, key)


@pytest.mark.parametrize("family", ["arithmetic", "math", "gym", "tools"])
def test_the_table_of_task_keys_is_what_each_generated_familys_splits_read(family):
    """task_section.READ_BY against the code: a generated family's split builder reads the keys the table gives it
    and none of the keys the table gives only to other families."""
    pytest.importorskip("reasoning_gym") if family == "gym" else None
    from rlpost.envs import family_splits
    from rlpost.task_section import READ_BY
    task = Reads(config.load(None, [f"task.name={family}", "task.n_train=4", "task.n_heldout=2"]).task)
    family_splits(task, family)
    mine = {k for k, readers in READ_BY.items() if family in readers}
    others = set(READ_BY) - mine
    assert not task.read & others, f"{family} reads {sorted(task.read & others)}, which READ_BY gives other families"
    generator_keys = {k for k in mine if k in ("ops", "min_a", "max_a", "min_b", "max_b", "n_terms", "min_terms",
                                                 "prompt", "gym_name", "gym_config")}
    assert generator_keys <= task.read, f"{family} does not read {sorted(generator_keys - task.read)}"


def test_task_on_bad_row_skip_skips_a_prompt_longer_than_the_context(tmp_path, capsys):
    from rlpost.envs import build_task

    data = tmp_path / "rows.jsonl"
    rows = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(20)]
    rows[3]["prompt"] = "7 " * 300  # past the tiny model's 256-token context
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = ["model.name=tiny", "task.name=dataset", f"task.data={data}", "task.n_heldout=4", "task.seed=1"]
    with pytest.raises(ConfigError, match=r"rows.jsonl:4: the prompt is longer .* \(or task.on_bad_row=skip skips"):
        cfg = config.load(None, common)
        build.preflight(cfg, build_task(cfg.task))
    cfg = config.load(None, [*common, "task.on_bad_row=skip"])
    task = build_task(cfg.task)
    build.preflight(cfg, task)
    build.preflight(cfg, task)  # the CLI checks, then train() checks again: the row is counted once
    assert task.skipped_rows == 1 and len(task.train) + len(task.heldout) == 19
    assert not any(r["prompt"].startswith("7 7") for r in task.train + task.heldout)
    assert "skipped 1 rows whose prompt is longer than the model's context" in capsys.readouterr().err


def test_task_eval_data_alone_is_a_whole_file_to_evaluate_and_nothing_to_train(tmp_path):
    from rlpost.envs import build_task

    data = tmp_path / "test.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n"
                            for i in range(250)))
    cfg = config.load(None, ["model.name=tiny", "task.name=math", f"task.eval_data={data}",
                             "task.prompt_column=question"])
    task = build_task(cfg.task)
    assert task.train == [] and len(task.heldout) == 250  # every row, not a tenth, not the default 200
    capped = config.load(None, ["task.name=dataset", f"task.eval_data={data}", "task.prompt_column=question",
                                "task.n_heldout=7"])
    assert len(build_task(capped.task).heldout) == 7
    with pytest.raises(ConfigError, match=r"^task.data: task.eval_data alone is held-out rows to evaluate"):
        build.preflight(cfg, task)  # train, rsft, online dpo: nothing to train on
    for family in (["task.name=arithmetic"], ["task.name=env", "task.env=guess"]):
        with pytest.raises(ConfigError, match=r"^task.eval_data: (alone it is the held-out rows|task.name=arithmetic)"):
            config.load(None, [*family, f"task.eval_data={data}"])
