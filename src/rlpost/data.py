"""The prompt stream: an endless, resumable walk over training rows, reshuffled every epoch.

Its whole state is (epoch, position), saved in every checkpoint, so a resumed run draws exactly
the prompts the uninterrupted run would have drawn.
"""

from __future__ import annotations

import random


class PromptStream:
    def __init__(self, rows: list[dict], batch_size: int, seed: int):
        if not rows:
            raise ValueError("the training split is empty")
        self.rows, self.batch_size, self.seed = rows, batch_size, seed
        self.epoch, self.pos = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(len(self.rows)))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)  # one fixed order per epoch
        return order

    def next(self) -> list[dict]:
        out = []
        while len(out) < self.batch_size:
            if self.pos == len(self.rows):
                self.epoch, self.pos = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            out.append(self.rows[self._order[self.pos]])
            self.pos += 1
        return out

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
        self._order = self._permutation(self.epoch)
