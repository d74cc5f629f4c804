"""The OpenMP wait policy rlpost sets on import (src/rlpost/__init__.py), before torch loads, and
that a user's own setting wins."""

import json
import os
import subprocess
import sys

import pytest

KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def env_after_import(**given: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in KEYS} | given
    code = "import json, os, rlpost; print(json.dumps({k: os.environ.get(k) for k in %r}))" % (KEYS,)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize("given, want", [
    ({}, {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "1000"}),  # the default: spin ~10 us, then sleep
    ({"OMP_WAIT_POLICY": "ACTIVE"}, {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": None}),  # no count under it
    ({"GOMP_SPINCOUNT": "50"}, {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "50"}),
])
def test_import_sets_the_wait_policy_unless_the_user_did(given, want):
    assert env_after_import(**given) == want
