"""A verifier module that ends its process while being imported."""

import os

os._exit(3)


def score(completion, row):
    return 1.0, {}
