"""A verifier whose module takes a while to import (like reasoning-gym or math-verify)."""

import time

time.sleep(1.5)


def score(completion, row):
    return 1.0, {}
