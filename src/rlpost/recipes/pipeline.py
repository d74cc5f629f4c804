"""`rlpost pipeline RECIPE`: SFT -> (RM) -> DPO -> RL in one command, each stage starting from the
previous policy stage's model folder, with one table of held-out metrics at the end.

A pipeline recipe is YAML:

    name: my-pipeline           # run folder runs/<name>/, one sub-folder per stage
    base: [model.name=embedded, task.ops=+]          # overrides every stage shares (a stage's own win over them)
    stages:
      - {name: sft, kind: sft, overrides: [pref.epochs=1]}
      - {name: rm,  kind: rm}                        # trains a reward model; the policy chain skips it
      - {name: dpo, kind: dpo, overrides: [pref.loss=dpo, pref.beta=0.1]}
      - {name: rl,  kind: rl, recipe: recipes/grpo_arith.yaml, reward_model: rm}   # RLHF with the rm stage

``kind`` is sft | rsft | rm | dpo | rl (rsft: rejection-sampling SFT on the policy's own accepted
samples, recipes/rsft.py). An rl stage with ``teacher: <stage name>`` and algo.name=distill
distils from that earlier stage's model (on-policy distillation, algorithms/distill.py). An rl stage trains on the
task's verifier, or on a reward model stage's output with ``reward_model: <stage name>``. After every policy stage the
held-out accuracy of the task (greedy, the same verifier and rows as ``rlpost eval``) is measured, so the table
shows what each stage added. The command line's overrides (``rlpost pipeline RECIPE k=v``) come
last, after a stage's own, so they hold for every stage. A stage that already finished (its
summary.json exists) is not run again: re-running the command after a crash continues with the
next stage (an rl stage from its newest intact checkpoint). A finished stage whose config would now
differ (other overrides, an edited recipe) is refused, naming the keys, rather than reused as if
it had been trained with them. The pipeline's folder and each stage's are claimed (locked) while they
run (observe/runfolder.py): a second pipeline on the same folder is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlpost import config, machine
from rlpost.config_check import refuse_ignored
from rlpost.console import say
from rlpost.model import checkpoint, export
from rlpost.observe import runfolder
from rlpost.recipes.evaluate import model_accuracy
from rlpost.recipes.offline import train_offline
from rlpost.recipes import round_state
from rlpost.recipes.offline_args import in_rounds, refuse_unread_loss_knobs, refuse_unread_rows
from rlpost.recipes.online import run_online_dpo
from rlpost.recipes.rl import train
from rlpost.recipes.rsft import run_rsft
from rlpost.runconfig import load_run
from rlpost.types import folders
from rlpost.types.errors import DataError, writing
from rlpost.types.schema import ListOf, MapOf, Where, check

KINDS = ("sft", "rsft", "rm", "dpo", "rl")
COMMAND = {"sft": "sft", "rsft": "rsft", "rm": "rm", "dpo": "dpo", "rl": "train"}  # the command a stage's kind runs as


def read_pipeline(path: str | Path) -> dict:
    tree = config.read_yaml(path)
    stages = tree.get("stages")
    if not isinstance(stages, list) or not stages:
        raise config.ConfigError(f"{path}: stages: expected a non-empty list of stages")
    for i, st in enumerate(stages):
        where = f"{path}: stages[{i}]"
        if not isinstance(st, dict) or st.get("kind") not in KINDS:
            raise config.ConfigError(f"{where}.kind: expected one of {', '.join(KINDS)}")
        st.setdefault("name", f"{i}-{st['kind']}")
        if not isinstance(st.get("overrides", []), list):
            raise config.ConfigError(f"{where}.overrides: expected a list of key=value strings")
    names = [st["name"] for st in stages]
    for st in stages:
        rm = st.get("reward_model")
        if rm is not None and (rm not in names or next(s for s in stages if s["name"] == rm)["kind"] != "rm"):
            raise config.ConfigError(f"{path}: stage {st['name']}.reward_model: expected the name of an earlier rm "
                                     f"stage, got {rm!r}")
        teacher = st.get("teacher")
        earlier = names[: names.index(st["name"])]
        if teacher is not None and (teacher not in earlier
                                    or next(s for s in stages if s["name"] == teacher)["kind"] == "rm"):
            raise config.ConfigError(f"{path}: stage {st['name']}.teacher: expected the name of an earlier policy "
                                     f"stage, got {teacher!r}")
    return tree


def stage_config(tree: dict, st: dict, model: str, outputs: dict, run_dir: Path) -> config.Config:
    """The stage's config: its recipe, then the base, its own overrides and the command line's (the
    later wins), then what the chain decides (the model it starts from, its folder)."""
    overrides = [*tree.get("base", []), *st.get("overrides", []), *tree.get("command_line", []),
                 f"model.name={model}", f"run.out_dir={run_dir}", f"run.name={st['name']}"]
    if st.get("reward_model"):
        overrides.append(f"task.reward_model={outputs[st['reward_model']]}")
    if st.get("teacher"):  # on-policy distillation from an earlier stage's model (algo.name=distill)
        overrides.append(f"algo.teacher={outputs[st['teacher']]}")
    return config.load(st.get("recipe"), overrides)


def train_stage(cfg: config.Config, run_dir: Path, kind: str, resume: bool = False) -> dict:
    """`rlpost sft|rsft|rm|dpo` and a pipeline stage: rejection-sampling SFT (recipes/rsft.py); online
    DPO when kind='dpo' and pref.online_rounds > 0 (recipes/online.py); else training on fixed rows
    (``resume``: from the newest intact checkpoint)."""
    if kind == "rsft":
        return run_rsft(cfg, run_dir, resume)
    if kind == "dpo" and cfg.pref.online_rounds > 0:
        return run_online_dpo(cfg, run_dir, resume)
    return train_offline(cfg, run_dir, kind, resume=resume)


def resume_point(cfg: config.Config, folder: Path, kind: str) -> str | None:
    """Where a run cut short in ``folder`` goes on from, in words: its newest intact checkpoint (rl, sft, rm,
    offline dpo), or what RUN/rounds.json records (rsft, online DPO: recipes/round_state.py); None when
    it has nothing to go on from."""
    if in_rounds(cfg, kind):
        state = round_state.read(folder, "rsft" if kind == "rsft" else "online_dpo")
        return None if state is None else round_state.point(state)
    ckpt = checkpoint.newest_intact(folder)
    return None if ckpt is None else ckpt.name


def run_pipeline(recipe: str | Path, overrides: list[str] = ()) -> list[dict]:
    """Run every stage; ``overrides`` (``rlpost pipeline RECIPE k=v ...``) apply to every stage, after
    the recipe's base and the stage's own overrides, so they win over both."""
    tree = read_pipeline(recipe)
    tree["command_line"] = list(overrides)
    shared = [*tree.get("base", []), *tree["command_line"]]  # run.out_dir there wins over the recipe's out_dir
    out_dir = next((o.split("=", 1)[1] for o in reversed(shared) if o.startswith("run.out_dir=")), None)
    run_dir = Path(out_dir or tree.get("out_dir", "runs")) / tree.get("name", Path(recipe).stem)
    check_stages(tree, run_dir)
    with runfolder.claim(run_dir, "reuse", kind="pipeline", key="name"):
        return _run_stages(tree, run_dir)


def check_stages(tree: dict, run_dir: Path) -> None:
    """Every stage's config loads and this machine can run it, before the pipeline's folder is
    claimed (a mistake in the last stage's overrides is found before the first stage trains)."""
    shared = [*tree.get("base", []), *tree.get("command_line", [])]
    base = next((o.split("=", 1)[1] for o in reversed(shared) if o.startswith("model.name=")), "embedded")
    outputs = {st["name"]: base for st in tree["stages"]}  # the earlier stages' models, not trained yet
    for st in tree["stages"]:
        try:  # a stage's own overrides as its command's (the shared base is each stage's to read in part)
            own = [o.split("=", 1)[0] for o in st.get("overrides", [])]
            refuse_ignored(COMMAND[st["kind"]], own)
            cfg = machine.check(stage_config(tree, st, base, outputs, run_dir))
            refuse_unread_rows(cfg, st["kind"], own)
            refuse_unread_loss_knobs(cfg, st["kind"], own)
        except config.ConfigError as e:
            raise config.ConfigError(f"stage {st['name']}: {e}") from None


def _run_stages(tree: dict, run_dir: Path) -> list[dict]:
    shared = [*tree.get("base", []), *tree.get("command_line", [])]
    model = next((o.split("=", 1)[1] for o in reversed(shared) if o.startswith("model.name=")), "embedded")
    first = config.load(None, shared)
    rows = [{"stage": "start", "kind": "-", "heldout_accuracy": model_accuracy(first, model), "other": ""}]
    outputs: dict[str, str] = {}
    for st in tree["stages"]:
        cfg = stage_config(tree, st, model, outputs, run_dir)
        sdir = run_dir / st["name"]
        say(f"stage {st['name']} ({st['kind']}) from {model}")
        if (sdir / "summary.json").exists():
            if changed := changed_keys(sdir, cfg):
                raise config.ConfigError(f"stage {st['name']}: finished under other settings "
                                         f"({'; '.join(changed[:4])}); remove {sdir} (and the stages after it) to "
                                         "train it again with these, or give the pipeline another name")
            summary = read_summary(sdir / "summary.json", st["kind"])
        else:
            summary = run_stage(cfg, sdir, st["kind"])
        # an rl stage of an older rlpost: no model/ yet
        out = summary.get("model") or str(export.write_model(sdir, cfg.model, cfg.run.seed))
        outputs[st["name"]] = out
        other = _stage_metric(st["kind"], summary)
        if st["kind"] == "rm":
            rows.append({"stage": st["name"], "kind": "rm", "heldout_accuracy": None, "other": other})
            continue
        model = out
        rows.append({"stage": st["name"], "kind": st["kind"], "heldout_accuracy": model_accuracy(cfg, model),
                     "other": other})
    text = stage_table(rows)
    with writing(run_dir / "pipeline.json"):
        (run_dir / "pipeline.json").write_text(json.dumps(rows, indent=1))
    print(text)
    return rows


def changed_keys(sdir: Path, cfg: config.Config) -> list[str]:
    """'section.key: old -> new' for every key where `cfg` differs from the config the stage in
    `sdir` ran under (its config.yaml and any resume's)."""
    old = config.to_dict(load_run(sdir)[0])
    new = config.to_dict(cfg)
    return [f"{section}.{key}: {old[section].get(key)!r} -> {value!r}" for section, keys in new.items()
            if isinstance(keys, dict) for key, value in keys.items() if old.get(section, {}).get(key) != value]


def run_stage(cfg: config.Config, sdir: Path, kind: str) -> dict:
    """One stage in its folder; a stage cut short earlier resumes (``resume_point``: its newest intact
    checkpoint, or a run in rounds from its last round) when the pipeline asks for what a resume may change."""
    with runfolder.claim(sdir, "reuse", key=f"stage {sdir.name}") as rf:
        if kind != "rl":
            folders.mark(sdir, "run", command=kind)  # `rlpost train --resume` refuses it (runfolder.made_by)
        point = resume_point(cfg, sdir, kind)
        resume = point is not None
        if resume:  # the settings it stopped under, but for what a resume may change (one line naming the key)
            try:
                config.resume_changes(load_run(sdir)[0], cfg)
            except config.ConfigError as e:
                raise config.ConfigError(f"stage {sdir.name}: cut short under other settings: {e}; or remove "
                                         f"{sdir} to train it again") from None
            say(f"stage {sdir.name}: cut short before, resuming from {point}")
        else:
            rf.write_config(cfg)
        return train(cfg, sdir, resume=resume) if kind == "rl" else train_stage(cfg, sdir, kind, resume)


NUMBERS = MapOf((float, type(None)))
SUMMARY = {  # what the table reads of a finished stage's summary.json, by kind
    "sft": {"heldout_before": {"sft/nll": float}, "heldout_after": {"sft/nll": float}},
    "rm": {"heldout_before": NUMBERS, "heldout_after": NUMBERS},
    "dpo": Where(lambda s: isinstance(s.get("rounds"), list) or (isinstance(s.get("loss"), str) and isinstance(
        s.get("heldout_before"), dict) and isinstance(s.get("heldout_after"), dict)),
                 "online rounds, or a loss and its metrics"),
    "rsft": {"rounds": ListOf(dict)},
    "rl": {"reward_mean_first": (float, type(None)), "reward_mean_last": (float, type(None))},
}


def read_summary(path: Path, kind: str) -> dict:
    """A finished stage's summary.json, checked (types/schema.py): one line naming the file and field."""
    try:
        summary = json.loads(path.read_text())
    except (ValueError, OSError) as e:
        raise DataError(f"{path}: not readable JSON ({type(e).__name__}); remove the stage's folder to run it "
                        "again") from None
    check(summary, {"model?": str}, str(path))
    return check(summary, SUMMARY[kind], str(path))


def _stage_metric(kind: str, s: dict) -> str:
    if kind == "rm":
        return (f"pairwise accuracy {s['heldout_before'].get('rm/accuracy', 0):.3f} -> "
                f"{s['heldout_after'].get('rm/accuracy', 0):.3f}")
    if kind == "dpo" and "rounds" in s:
        return (f"online DPO: {len(s['rounds']) - 1} rounds, pairs per round "
                f"{[r.get('online/pairs') for r in s['rounds'][1:]]}")
    if kind == "dpo":
        return (f"{s['loss']}: reward accuracy {s['heldout_before'].get('rewards/accuracy', 0):.3f} -> "
                f"{s['heldout_after'].get('rewards/accuracy', 0):.3f}, margin "
                f"{s['heldout_after'].get('rewards/margin', 0):+.3f}")
    if kind == "rsft":
        return (f"rejection-sampling SFT: {len(s['rounds']) - 1} rounds, rows per round "
                f"{[r.get('rsft/rows') for r in s['rounds'][1:]]}")
    if kind == "sft":
        return f"held-out NLL/token {s['heldout_before']['sft/nll']:.3f} -> {s['heldout_after']['sft/nll']:.3f}"
    if s["reward_mean_first"] is None:
        return "no training step"
    return f"train reward {s['reward_mean_first']:.3f} -> {s['reward_mean_last']:.3f}"


def stage_table(rows: list[dict]) -> str:
    lines = [f"{'stage':12s}{'kind':6s}{'held-out acc':>14s}   other held-out metrics"]
    for r in rows:
        acc = "" if r["heldout_accuracy"] is None else f"{r['heldout_accuracy']:.3f}"
        lines.append(f"{r['stage']:12s}{r['kind']:6s}{acc:>14s}   {r['other']}")
    return "\n".join(lines)
