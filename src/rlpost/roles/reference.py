"""Reference role: a frozen copy of the starting policy, giving per-token log-probs for the KL
anchor. The loop builds it only when the algorithm asks for one (kl_coef > 0), so a run
without KL never pays its memory or its forward pass."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlpost.model import device, packed, precision
from rlpost.model.logprobs import Scoring, policy_forward
from rlpost.types.batch import Rollouts


@dataclass(frozen=True)
class Placement:
    """Where the reference's weights live. dtype: theirs (bfloat16 beside trainer.param_dtype=bfloat16);
    offload: on the host between calls (offload.reference), moved onto ``on`` (run.device) for each;
    ``on`` None: where the model is."""
    dtype: torch.dtype = torch.float32
    offload: bool = False
    on: torch.device | str | None = None


class Reference:
    def __init__(self, model: torch.nn.Module, scoring: Scoring, micro_batch_size: int, autocast_bf16: bool | None,
                 forward: str = "hf", placement: Placement = Placement()):
        """scoring: the trainer's temperature and shared prompt prefix (model/logprobs.py); forward:
        trainer.forward, which the reference follows (model/packed.py)."""
        dtype, offload, on = placement.dtype, placement.offload, placement.on
        # frozen by never being stepped; see rollout_hf.py on requires_grad
        self.model = precision.cast_params(model, dtype).eval()
        self.device = torch.device(on) if on is not None else device.of(self.model)
        self.home = device.Offloaded(self.model, self.device, offload)
        on_gpu = device.is_cuda(self.device)  # an offloaded copy waits on the host but computes here
        self.packed = packed.resolve("hf" if on_gpu else forward, self.model)
        (packed.enable if self.packed else packed.disable)(self.model)
        self.scoring, self.micro = scoring, micro_batch_size
        # bf16 autocast over the float32 copy, or plain float32 (None: what the probe chose, model/precision.py)
        self.autocast_bf16 = precision.trainer_bf16("auto") if autocast_bf16 is None else autocast_bf16

    @torch.no_grad()
    def logprobs(self, batch: Rollouts) -> Tensor:  # (B, T) float32, on the batch's device
        home, batch = batch.device, batch.to(self.device)  # computed on the model's device, returned home
        with self.home, precision.autocast(self.autocast_bf16, self.device):
            micro = [batch.select(slice(i, i + self.micro)) for i in range(0, len(batch), self.micro)]
            if self.packed:  # the layouts read back before the first forward is queued, not between forwards
                for mb in micro:
                    packed.plan_fed(mb.completion_mask)
            parts = [policy_forward(self.model, mb, self.scoring).logp for mb in micro]
        if self.packed:  # its fused weights, rebuilt per call: they never change, but need not stay resident
            packed.trunk_of(self.model).clear()
        return (torch.cat(parts) * batch.completion_mask).to(home)
