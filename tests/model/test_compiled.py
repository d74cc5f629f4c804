"""trainer.compile's machinery (model/compiled.py): the row ladder, the padding, the cache folder, auto's
choice, the eager fallback when compiling fails, and the ladder bounding the graphs a run compiles.
The compiled update's numbers against the eager one are tests/roles/test_trainer_compiled.py's."""

import os
import subprocess
import sys

import pytest
import torch

from rlpost.model import compiled


def test_ladder_hand_worked():
    assert [compiled.bucket(n) for n in (0, 1, 16, 17, 20, 21, 33, 40, 41, 57, 64, 65, 100, 1000)] == \
        [16, 16, 16, 20, 20, 24, 40, 40, 48, 64, 64, 80, 112, 1024]


def test_ladder_rounds_up_by_at_most_a_fifth_and_is_monotone():
    rungs = [compiled.bucket(n) for n in range(1, 5000)]
    assert all(r >= n for n, r in zip(range(1, 5000), rungs))
    assert rungs == sorted(rungs)
    assert all((r - n) / r <= 0.2 for n, r in zip(range(17, 5000), rungs))
    assert len(set(rungs)) == 34  # 16, then 20..4096 four rungs an octave, then 5120: a bounded count of shapes
    assert all(compiled.bucket(r) == r for r in set(rungs))  # a rung is its own bucket


def test_pad_rows_appends_zeros_and_leaves_none_and_full_tensors():
    t = torch.arange(6.0).view(3, 2)
    p = compiled.pad_rows(t, 5)
    assert p.shape == (5, 2) and torch.equal(p[:3], t) and p[3:].abs().sum() == 0
    assert compiled.pad_rows(t, 3) is t
    a, b = compiled.pad_rows((t, None), 4)
    assert a.shape == (4, 2) and b is None


def test_signature_is_by_shape_not_identity():
    a, b = torch.zeros(4, 3), torch.ones(4, 3)
    assert compiled.signature((a, None, 1.5)) == compiled.signature((b, None, 1.5))
    assert compiled.signature(a) != compiled.signature(torch.zeros(5, 3))
    assert compiled.signature(a) != compiled.signature(a.bfloat16())


def test_auto_is_on_for_cuda_off_for_the_cpu_and_says_so(capsys, monkeypatch):
    from rlpost import console

    monkeypatch.setattr(console, "_said", set())
    assert compiled.resolve("auto", cuda=True) is True
    assert compiled.resolve("auto", cuda=False) is False
    assert compiled.resolve("auto", cuda=False) is False  # a second trainer of the run: not said again
    out = capsys.readouterr().err.strip().splitlines()
    assert len(out) == 2 and "trainer.compile=auto: on" in out[0] and "trainer.compile=auto: off" in out[1]
    assert compiled.resolve("on", cuda=False) is True and compiled.resolve("off", cuda=True) is False
    assert capsys.readouterr().err == ""  # an explicit choice is not announced
    with pytest.raises(ValueError, match="trainer.compile='yes'"):
        compiled.resolve("yes", cuda=False)


def test_cache_under_rlpost_unless_the_user_set_one(monkeypatch, tmp_path):
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("RLPOST_CACHE", str(tmp_path))
    monkeypatch.setattr(compiled, "_USER_CACHE", None)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())  # what inductor's import leaves
    ours = tmp_path / "inductor" / compiled.kernel_kind()
    assert compiled.cache_dir() == str(ours) == os.environ["TORCHINDUCTOR_CACHE_DIR"]
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert compiled.cache_dir() == str(tmp_path / "mine")
    # inductor imported before rlpost: the variable already held its default when compiled.py read it
    monkeypatch.setattr(compiled, "_USER_CACHE", default_cache_dir())
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    assert compiled.cache_dir() == str(ours)


@pytest.mark.parametrize("capability", ["avx2", "default"])  # both at or below every kind
def test_the_cache_keeps_each_cpu_kind_apart(capability):
    # A graph cached at AVX-512 width and loaded by a process under ATEN_CPU_CAPABILITY=avx2 (how an AVX2-only
    # machine is played on this one, and what a home shared by two kinds of machine does) segfaulted: each
    # kind has its own folder. Run in a child, as the capability is read once a process.
    code = "from rlpost.model import compiled; print(compiled.kernel_kind())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "ATEN_CPU_CAPABILITY": capability})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("-" + capability) and out.stdout.strip().startswith("torch")


def _row_fn(x, w, spec):
    scale, shift = spec
    return torch.nn.functional.silu(x @ w) * scale + shift


def test_a_failed_compilation_runs_eagerly_and_says_so_once(monkeypatch, capsys):
    def broken(cuda):
        def backend(gm, example_inputs):
            raise RuntimeError("no C++ compiler here\nsecond line")
        return backend

    monkeypatch.setattr(compiled, "_backend", broken)
    monkeypatch.setattr(compiled, "_compiled", {})
    step = compiled.Step(cuda=False)
    f = step.wrap(_row_fn, rows=(0,))
    x, w = torch.randn(5, 3), torch.randn(3, 4)
    for _ in range(3):
        assert torch.equal(f(x, w, (2.0, 1.0)), _row_fn(x, w, (2.0, 1.0)))
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1, said  # said once, however many calls follow
    assert said[0].startswith("rlpost: trainer.compile: compilation failed (BackendCompilerFailed")
    assert said[0].endswith("the update runs eagerly")
    assert step.failed is not None and not step.graphs
    step.report()
    assert capsys.readouterr().err == ""  # no compile-cost line after a failure


@pytest.mark.slow
def test_the_ladder_bounds_the_graphs_over_varying_lengths():
    # 32 different row counts (33..64) meet four rungs (40, 48, 56, 64): four graphs, by our count and by
    # dynamo's, and a second pass over the same lengths compiles nothing more
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    step = compiled.Step(cuda=False)
    f = step.wrap(_row_fn, rows=(0,))
    w = torch.randn(3, 4, requires_grad=True)
    before = counters["stats"]["unique_graphs"]
    for _ in range(2):
        for n in range(33, 65):
            x = torch.randn(n, 3, requires_grad=True)
            out = f(x, w, (2.0, 1.0))
            assert out.shape == (n, 4)
            out.sum().backward()
            assert torch.allclose(x.grad, torch.autograd.grad(_row_fn(x, w, (2.0, 1.0)).sum(), x)[0], atol=1e-6)
    assert {k[2][0][0][0] for k in step.graphs} == {40, 48, 56, 64}
    assert len(step.graphs) == 4 and counters["stats"]["unique_graphs"] - before == 4
    assert step.compile_s > 0
