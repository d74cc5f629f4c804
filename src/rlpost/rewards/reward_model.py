"""A learned reward model in the verifier's seat (RLHF): ``score(batch)`` like VerifierRunner's.

The model is what ``rlpost rm`` writes: a transformers folder (the LM whose trunk was trained)
plus ``value_head.safetensors``; the score of a completion is the head's output at its last
token (EOS). It reads the batch's token ids directly, so it must share the policy's tokenizer
(true for every stage of ``rlpost pipeline``, which starts all stages from one base model).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from rlpost.algorithms.preference import rm_scores
from rlpost.model import precision
from rlpost.model.load import load_policy
from rlpost.model.logprobs import completion_values
from rlpost.roles.critic import Critic
from rlpost.types.batch import Rollouts
from rlpost.types.errors import ConfigError


class RewardModelScorer:
    def __init__(self, folder: str, micro_batch_size: int = 32, autocast_bf16: bool | None = None):
        """autocast_bf16: score under bf16 autocast; None = what the probe chose (model/precision.py)."""
        head_file = Path(folder) / "value_head.safetensors"
        if not head_file.exists():
            raise ConfigError(f"task.reward_model: {folder} has no value_head.safetensors; is it the model folder of an `rlpost rm` run?")
        lm = load_policy(folder).model.float().eval()
        self.rm = Critic(lm, "shared")
        self.rm.head.load_state_dict(load_file(head_file))
        self.trunk, self.micro = lm.get_decoder(), micro_batch_size
        self.autocast_bf16 = precision.trainer_bf16("auto") if autocast_bf16 is None else autocast_bf16

    @torch.no_grad()
    def score(self, batch: Rollouts) -> tuple[torch.Tensor, list[dict], dict]:
        """Rewards (B,) float32, infos, metrics: the same contract as the verifier's."""
        t0 = time.perf_counter()
        parts = []
        with precision.autocast(self.autocast_bf16):
            for i in range(0, len(batch), self.micro):
                mb = batch.select(slice(i, i + self.micro))
                parts.append(rm_scores(completion_values(self.trunk, self.rm.head, mb), mb.completion_mask))
        scores = torch.cat(parts).float()  # (B,)
        infos = [{"rm_score": s} for s in scores.tolist()]
        return scores, infos, {"timing_s/verifier_per_call": (time.perf_counter() - t0) / max(1, len(batch))}

    def close(self) -> None:
        pass
