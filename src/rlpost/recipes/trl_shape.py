"""TRL's constructor shape for ``rlpost.Trainer``: ``args=GRPOConfig(...)`` (or a dict of its fields),
``peft_config=LoraConfig(...)``, ``processing_class=``, ``train(resume_from_checkpoint=...)``.

A field of ``args`` goes through the same name table as the config errors (names.FOREIGN["TRL"],
docs/coming-from.md): ``learning_rate`` becomes ``trainer.lr``, ``loss_type="dr_grpo"``
``algo.loss_agg=const_norm``. Only the fields the user set are taken: a dict's keys, or a config's
fields that differ from a fresh config of its class (so TRL's defaults, 1e-6 for the learning rate,
never replace rlpost's). A set field the table cannot map (one counted in other units, one it does
not list) is refused in one line naming the rlpost way and the docs page, every such field at once.
Nothing here imports trl or peft: their objects are read as dataclasses.
"""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path
from typing import Any

from rlpost.config import ConfigError
from rlpost.types.errors import ConfigProblems
from rlpost.names import FOREIGN, Name, rlpost_keys

TRL = {name.theirs: name for name in FOREIGN["TRL"]}
# Fields a TRL config holds for its own machinery, with nothing to say here: use_cpu is required to build a
# GRPOConfig on a machine without a bf16 GPU (rlpost picks the device by run.device), and two follow from it
# or from the clock.
IGNORED = {"use_cpu", "dataloader_pin_memory", "logging_dir"}
OPTIONS = "rlpost's own keys go in overrides= (docs/options.md)"


def args_overrides(args: Any) -> list[str]:
    """rlpost overrides for the fields of a TRL config (a GRPOConfig or another TrainingArguments, or
    a dict of their fields) that are set; ConfigError with one line per field that cannot be taken."""
    if args is None:
        return []
    out, refused = [], []
    for field, value in set_fields(args).items():
        try:
            out += taken(field, value)
        except ConfigError as e:
            refused.append(str(e))
    if refused:
        raise ConfigProblems(refused)
    return out


def set_fields(args: Any) -> dict[str, Any]:
    """The fields of ``args`` the user set: a dict's items; a dataclass's fields that differ from a
    fresh one of its class. Fields derived from a set field (TRL's generation_batch_size follows the
    batch sizes) are compared with a fresh config given the set fields of the table, so that only
    what the user wrote is named."""
    if isinstance(args, dict):
        return dict(args)
    if not dataclasses.is_dataclass(args) or isinstance(args, type):
        raise ConfigError(f"args: expected a TRL config (GRPOConfig) or a dict of its fields, got "
                          f"{type(args).__name__}; {OPTIONS}")
    names = [f.name for f in dataclasses.fields(args) if f.init and f.name not in IGNORED]
    plain = _fresh(type(args), {})
    mapped = {n: getattr(args, n) for n in names if n in TRL and getattr(args, n) != getattr(plain, n)}
    given = _fresh(type(args), mapped) if mapped else plain
    return {n: getattr(args, n) for n in names if n in mapped or getattr(args, n) != getattr(given, n)}


def _fresh(cls: type, values: dict) -> Any:
    try:
        return cls(**values, **({"use_cpu": True} if "use_cpu" in {f.name for f in dataclasses.fields(cls)} else {}))
    except Exception as e:  # noqa: BLE001 - a config class's own checks raise ValueError, TypeError, ...
        raise ConfigError(f"args: a fresh {cls.__name__} to compare with does not build ({type(e).__name__}: "
                          f"{' '.join(str(e).split())[:200]}); pass a dict of the fields you set") from None


def taken(field: str, value: Any) -> list[str]:
    """The override(s) for one set field of a TRL config; ConfigError (one line) when there is none."""
    text = _text(value)
    name: Name | None = TRL.get(field)
    if name is None:
        if field in rlpost_keys():  # a dict may name rlpost's keys as they are
            return [f"{field}={text}"]
        raise ConfigError(f"args.{field}={text}: not a TRL field docs/coming-from.md maps; {OPTIONS}")
    why = f" ({name.note})" if name.note else ""
    if not name.ours:
        raise ConfigError(f"args.{field}: no rlpost counterpart{why}; drop it (docs/coming-from.md)")
    if not name.same_value:
        raise ConfigError(f"args.{field}={text}: counted otherwise in rlpost{why}: set {name.ours} in overrides= "
                          "(docs/coming-from.md)")
    if name.values:
        if text.lower() not in name.values:
            raise ConfigError(f"args.{field}={text}: no rlpost value for it (TRL's {', '.join(name.values)} map "
                              f"to {name.ours}; docs/coming-from.md)")
        return [name.values[text.lower()]]
    if "=" in name.ours:  # a flag (use_vllm, bf16): set, it picks the value; unset, rlpost's default stands
        return [name.ours] if value else []
    return [f"{name.ours}={text}"]


def _text(value: Any) -> str:
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, (list, tuple, set, frozenset)):
        return ",".join(sorted(map(str, value)) if isinstance(value, (set, frozenset)) else map(str, value))
    return str(value).lower() if isinstance(value, bool) else str(value)


# LoraConfig's fields that say what it is rather than how to train, and their values that rlpost trains
LORA_META = {"peft_type": None, "task_type": ("CAUSAL_LM", None), "base_model_name_or_path": None, "revision": None,
             "inference_mode": (False,)}  # None: any value
LORA_KEYS = {"r": "model.lora_r", "lora_alpha": "model.lora_alpha", "lora_dropout": "model.lora_dropout",
             "target_modules": "model.lora_targets"}


def peft_overrides(peft: Any) -> list[str]:
    """model.lora_* from peft's LoraConfig (``target_modules=None``, peft's choice per architecture,
    leaves rlpost's all-linear); ConfigError, one line per field rlpost does not train with."""
    if peft is None:
        return []
    kind = _text(getattr(peft, "peft_type", None))
    if not dataclasses.is_dataclass(peft) or kind != "LORA":
        raise ConfigError(f"peft_config: a {type(peft).__name__}{f' ({kind})' if kind != 'None' else ''}; rlpost "
                          "trains LoRA adapters: LoraConfig(...), or model.lora_r, model.lora_alpha and "
                          "model.lora_targets in overrides= (docs/options.md)")
    fresh = type(peft)()
    out, refused = [], []
    for f in dataclasses.fields(peft):
        value = getattr(peft, f.name)
        if f.name in LORA_KEYS:
            if value is not None:
                out.append(f"{LORA_KEYS[f.name]}={_text(value)}")
        elif f.name in LORA_META:
            allowed = LORA_META[f.name]
            if allowed is not None and _text(value) not in map(_text, allowed):
                refused.append(f"peft_config.{f.name}={_text(value)}: rlpost trains a causal LM's adapters "
                               f"({f.name} {' or '.join(map(_text, allowed))}; docs/options.md)")
        elif f.init and value != getattr(fresh, f.name):
            refused.append(f"peft_config.{f.name}={_text(value)}: not a LoRA setting rlpost takes; leave it at peft's "
                           "default (rlpost's: model.lora_r, lora_alpha, lora_dropout, lora_targets; docs/options.md)")
    if refused:
        raise ConfigProblems(refused)
    return out


def check_processing_class(tokenizer: Any, ours: Any, model: str) -> None:
    """TRL's processing_class: accepted when it is the model's own tokenizer (the same vocabulary, and
    no chat template of its own that differs), which rlpost loads from the model anyway."""
    if tokenizer is None:
        return
    if not hasattr(tokenizer, "get_vocab"):
        raise ConfigError(f"processing_class: a {type(tokenizer).__name__}, not a tokenizer; rlpost uses the "
                          f"model's own tokenizer ({model}): leave processing_class out (docs/python.md)")
    template = getattr(tokenizer, "chat_template", None)
    if tokenizer.get_vocab() != ours.get_vocab() or (template and template != ours.chat_template):
        what = "vocabulary" if tokenizer.get_vocab() != ours.get_vocab() else "chat template"
        raise ConfigError(f"processing_class: not {model}'s own tokenizer (its {what} differs); rlpost tokenizes with "
                          "the model folder's tokenizer: save yours into that folder with save_pretrained, or leave "
                          "processing_class out (docs/python.md)")


def resume_target(value: Any, run_dir: Path, newest: Path | None) -> bool:
    """TRL's train(resume_from_checkpoint=...): True, or this run's folder or its newest checkpoint ->
    resume this run; None/False -> a new run; anything else is one line with the rlpost way."""
    if value is None or value is False:
        return False
    if value is True:
        return True
    if not isinstance(value, (str, Path)):
        raise ConfigError(f"resume_from_checkpoint: expected True or a path, got {type(value).__name__}")
    path = Path(value).resolve()
    if path == run_dir or (newest is not None and path == newest.resolve()):
        return True
    if run_dir in path.parents:
        raise ConfigError(f"resume_from_checkpoint: {value} is not this run's newest checkpoint "
                          f"({newest.name if newest else 'none yet'}); rlpost resumes from the newest, and `rlpost "
                          "export RUN --step N` writes an older step's model (docs/python.md)")
    raise ConfigError(f"resume_from_checkpoint: {value} is not this Trainer's output_dir ({run_dir}); rlpost resumes "
                      f"the run in output_dir: pass output_dir={str(value)!r} and resume_from_checkpoint=True "
                      "(docs/python.md)")
