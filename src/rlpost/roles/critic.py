"""PPO's critic: V(prefix), a scalar head on a transformer trunk.

'separate' (verl, OpenRLHF, TRL's PPOTrainer): a copy of the policy's trunk (its decoder, without
the lm_head) plus the head; the critic learns at its own rate and cannot disturb the policy's
features. 'shared': the head reads the policy's own final hidden states, so value and policy come
out of one forward and the trunk is stored once; the value loss then also trains the trunk.

The head starts at zero, so V = 0 before the first update; a fresh head's random outputs would
otherwise make the first GAE advantages noise. The trainer owns the critic: its parameters are
a second AdamW group with ``algo.critic_lr`` and their own gradient clipping.
"""

from __future__ import annotations

import copy

from torch import Tensor, nn

from rlpost.model import device
from rlpost.model.logprobs import completion_values
from rlpost.types.batch import Rollouts


class Critic(nn.Module):
    def __init__(self, policy: nn.Module, kind: str, lr: float = 1e-5, offload: bool = False):
        """lr: its own AdamW group's (algo.critic_lr); offload: on the host between the trainer's verbs
        that use it (offload.critic)."""
        super().__init__()
        self.shared, self.lr, self.offload = kind == "shared", lr, offload
        # A shared trunk is not registered here, so critic.parameters() and state_dict() hold
        # only what the critic adds to the policy.
        self.trunk = None if self.shared else copy.deepcopy(policy.get_decoder())
        self.head = nn.Linear(policy.config.hidden_size, 1, device=device.of(policy))  # beside the trunk
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def values(self, batch: Rollouts, share_prefix: bool = True) -> Tensor:  # (B, T) float32
        """Separate critic only: a shared one gets its values from the policy's forward."""
        assert not self.shared, ("a shared critic's values come out of the policy forward "
                                 "(policy_forward's Scoring.value_head)")
        return completion_values(self.trunk, self.head, batch, share_prefix)

