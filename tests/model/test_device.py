"""run.device (model/device.py): resolved once, CPU runs unchanged, CUDA refused in one line where
there is none. No test here needs a GPU; on a machine with one, torch.cuda.is_available is
patched so the same cases run."""

import json
from dataclasses import replace

import pytest
import torch
from helpers import TINY, cli, make_batch, tiny_cfg

from rlpost.model import device, precision
from rlpost.model.load import load_policy
from rlpost.types.errors import ConfigError


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_auto_is_the_host_without_cuda(no_cuda):
    assert device.resolve("auto") == "cpu" and device.resolve("cpu") == "cpu"


def test_cuda_without_cuda_is_a_config_error_naming_the_key(no_cuda):
    with pytest.raises(ConfigError, match=r"^run\.device=cuda: torch\.cuda\.is_available\(\) is False"):
        device.resolve("cuda")


def test_cuda_without_cuda_exits_2_with_one_line_through_the_cli(no_cuda, tmp_path):
    r = cli("train", *TINY, "run.device=cuda", f"run.out_dir={tmp_path}")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "run.device=cuda" in lines[0], r.stderr
    assert not any(tmp_path.iterdir())  # refused before a run folder exists


def test_auto_engine_on_cuda_is_vllm_where_installed_said_in_one_line(monkeypatch, capsys):
    from rlpost import build
    from rlpost.roles import engine

    cfg = tiny_cfg("model.name=embedded", "run.device=cpu")
    on_cuda = replace(cfg, run=replace(cfg.run, device="cuda"))  # resolved already; nothing runs there
    monkeypatch.setattr(engine, "vllm_installed", lambda: True)
    assert build.resolve_engine(on_cuda).rollout.engine == "vllm"
    assert "rollout.engine=auto on cuda: vLLM (installed)" in capsys.readouterr().err
    for other in (cfg, replace(on_cuda, rollout=replace(cfg.rollout, top_p=0.9)),  # the host; top-p
                  replace(on_cuda, rollout=replace(cfg.rollout, engine="fast"))):  # asked for the own engine
        assert build.resolve_engine(other).rollout.engine == other.rollout.engine
    monkeypatch.setattr(engine, "vllm_installed", lambda: False)
    assert build.resolve_engine(on_cuda).rollout.engine == "auto"  # the model decides: roles/engine.py


def test_run_device_cpu_trains_and_reports_no_gpu_memory(no_cuda, tmp_path):
    r = cli("train", *TINY, "run.device=cpu", "run.steps=1", f"run.out_dir={tmp_path}", "run.name=cpu")
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads((tmp_path / "cpu" / "summary.json").read_text())
    step = json.loads((tmp_path / "cpu" / "metrics.jsonl").read_text().splitlines()[0])
    assert summary["peak_rss_gb"] > 0 and "perf/max_memory_allocated_gb" not in summary  # CUDA only
    assert "perf/max_memory_allocated_gb" not in step and step["perf/throughput"] > 0


def test_a_batch_moves_whole_and_the_host_copy_is_free():
    batch = make_batch(load_policy("tiny"))
    assert batch.to("cpu") is batch  # already there: nothing copied
    moved = batch.to("meta")  # a device with no data: every tensor field goes, lists stay
    assert all(getattr(moved, f).device.type == "meta" for f in ("prompt_ids", "completion_mask", "sampler_logp",
                                                                 "group_ids", "truncated"))
    assert moved.rows is batch.rows and moved.device.type == "meta"


def test_autocast_and_roles_follow_the_model_not_a_literal():
    model = load_policy("tiny").model
    assert device.of(model) == torch.device("cpu")
    with precision.autocast(True, device.of(model)):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert device.max_memory_allocated_gb() == {} or torch.cuda.is_initialized()
