"""rlpost leaves OpenMP's wait policy as the user has it (src/rlpost/__init__.py): importing it sets
neither variable, and a user's own setting reaches torch unchanged. Contention is the thread
count's job (model/cores.py; tests/model/test_cores.py)."""

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


@pytest.mark.parametrize("given", [{}, {"OMP_WAIT_POLICY": "PASSIVE"}, {"GOMP_SPINCOUNT": "50"}])
def test_import_leaves_the_wait_policy_alone(given):
    assert env_after_import(**given) == {k: given.get(k) for k in KEYS}
