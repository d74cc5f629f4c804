"""A learned reward model in the verifier's seat (RLHF): ``score(batch)`` like VerifierRunner's.

``task.reward_model`` names one of two kinds (``load_reward_model`` tells them apart):

* what ``rlpost rm`` writes: a transformers folder (the LM whose trunk was trained) plus
  ``value_head.safetensors``; the score of a completion is the head's output at its last token
  (EOS). It reads the batch's token ids directly, so it must share the policy's tokenizer (true for
  every stage of ``rlpost pipeline``, which starts all stages from one base model).
* a Hugging Face sequence-classification reward model (``*ForSequenceClassification`` with one
  label, as TRL's RewardTrainer and most published RMs are): the conversation (prompt messages,
  then the completion as the assistant turn) is rendered with the RM's own chat template and
  tokenizer, so it need not share the policy's; the score is its single logit.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForSequenceClassification

from rlpost.algorithms.preference import rm_scores
from rlpost.model import precision
from rlpost.model.device import CPU, Offloaded
from rlpost.model.load import load_policy, load_tokenizer, resolve
from rlpost.model.logprobs import completion_values
from rlpost.roles.critic import Critic
from rlpost.types.batch import Rollouts
from rlpost.types.errors import ConfigError


def load_reward_model(spec: str, micro_batch_size: int = 32, autocast_bf16: bool | None = None,
                      device: torch.device | str = CPU, offload: bool = False):
    """The scorer for ``task.reward_model``: an ``rlpost rm`` folder (or run folder) or an HF
    sequence-classification model (folder or hub id), on ``device`` (run.device, resolved); with
    ``offload`` (offload.reward_model) its weights wait on the host between scoring calls.
    autocast_bf16: None = what the probe chose."""
    folder = resolve(spec)  # a run folder -> its model/
    if (Path(folder) / "value_head.safetensors").exists():
        return RewardModelScorer(folder, micro_batch_size, autocast_bf16, device, offload)
    try:
        archs = AutoConfig.from_pretrained(folder).architectures or []
    except (OSError, ValueError) as e:
        raise ConfigError(f"task.reward_model: cannot read the model config of {spec!r} "
                          f"({str(e).splitlines()[0]})") from None
    if any(a.endswith("ForSequenceClassification") for a in archs):
        return SequenceClassifierScorer(folder, micro_batch_size, autocast_bf16, device, offload)
    raise ConfigError(f"task.reward_model: {spec} is neither an `rlpost rm` model folder (value_head.safetensors) "
                      "nor a *ForSequenceClassification reward model (its architectures: "
                      f"{', '.join(archs) or 'none'})")


class SequenceClassifierScorer:
    """An HF ``*ForSequenceClassification`` reward model (one label) scoring whole conversations."""

    def __init__(self, folder: str, micro_batch_size: int = 32, autocast_bf16: bool | None = None,
                 device: torch.device | str = CPU, offload: bool = False):
        self.tok = load_tokenizer(folder)  # a pad token and a chat template (the plain one if it has none)
        self.model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32).eval()
        self.device = torch.device(device)
        self.home = Offloaded(self.model, self.device, offload)  # on the device, or on the host between calls
        if self.model.config.num_labels != 1:
            raise ConfigError(f"task.reward_model: {folder} has {self.model.config.num_labels} labels; a reward model "
                              "has 1")
        if self.model.config.pad_token_id is None:  # it finds each row's last token by the pad id
            self.model.config.pad_token_id = self.tok.pad_token_id
        self.micro = micro_batch_size
        self.autocast_bf16 = precision.trainer_bf16("auto") if autocast_bf16 is None else autocast_bf16

    def texts(self, batch: Rollouts) -> list[str]:
        """Each completion as the assistant turn after its prompt, in the RM's own chat template."""
        return [self.tok.apply_chat_template([*row["messages"], {"role": "assistant", "content": completion}],
                                             tokenize=False)
                for row, completion in zip(batch.rows, batch.completions)]

    @torch.no_grad()
    def score(self, batch: Rollouts) -> tuple[torch.Tensor, list[dict], dict]:
        """Rewards (B,) float32, infos, metrics: the same contract as the verifier's."""
        t0 = time.perf_counter()
        texts = self.texts(batch)
        parts = []
        with self.home, precision.autocast(self.autocast_bf16, self.device):
            for i in range(0, len(texts), self.micro):
                # the template already holds any BOS; left padding: the model finds the last real token by the pad id
                enc = self.tok(texts[i:i + self.micro], return_tensors="pt", padding=True, add_special_tokens=False)
                parts.append(self.model(**enc.to(self.device)).logits[:, 0].float())  # (micro,)
        scores = torch.cat(parts).to(batch.device)  # (B,) where the verifier's rewards are
        infos = [{"rm_score": s} for s in scores.tolist()]
        return scores, infos, {"timing_s/verifier_per_call": (time.perf_counter() - t0) / max(1, len(batch))}

    def close(self) -> None:
        pass


class RewardModelScorer:
    def __init__(self, folder: str, micro_batch_size: int = 32, autocast_bf16: bool | None = None,
                 device: torch.device | str = CPU, offload: bool = False):
        """autocast_bf16: score under bf16 autocast; None = what the probe chose (model/precision.py)."""
        head_file = Path(folder) / "value_head.safetensors"
        if not head_file.exists():
            raise ConfigError(f"task.reward_model: {folder} has no value_head.safetensors; is it the model folder of "
                              "an `rlpost rm` run?")
        lm = load_policy(folder).model.float().eval()
        self.device = torch.device(device)
        self.rm = Critic(lm, "shared")
        self.rm.head.load_state_dict(load_file(head_file))
        self.home = Offloaded(torch.nn.ModuleList([lm, self.rm]), self.device, offload)  # trunk and head together
        self.trunk, self.micro = lm.get_decoder(), micro_batch_size
        self.autocast_bf16 = precision.trainer_bf16("auto") if autocast_bf16 is None else autocast_bf16

    @torch.no_grad()
    def score(self, batch: Rollouts) -> tuple[torch.Tensor, list[dict], dict]:
        """Rewards (B,) float32, infos, metrics: the same contract as the verifier's."""
        t0 = time.perf_counter()
        parts, home, batch = [], batch.device, batch.to(self.device)
        with self.home, precision.autocast(self.autocast_bf16, self.device):
            for i in range(0, len(batch), self.micro):
                mb = batch.select(slice(i, i + self.micro))
                parts.append(rm_scores(completion_values(self.trunk, self.rm.head, mb), mb.completion_mask))
        scores = torch.cat(parts).float().to(home)  # (B,) where the verifier's rewards are
        infos = [{"rm_score": s} for s in scores.tolist()]
        return scores, infos, {"timing_s/verifier_per_call": (time.perf_counter() - t0) / max(1, len(batch))}

    def close(self) -> None:
        pass
