"""The packed trunk (model/packed.py) is the same function of the weights as transformers' forward:
values and gradients, in float32 exactly (to float32 rounding) and under bf16 autocast to bf16's;
with prompts once per mini-batch as leaves, with holes in the loss mask, with q/k/v biases."""

import copy

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rlpost.model import packed
from rlpost.model.logprobs import Scoring, completion_logprobs, policy_forward, prompt_prefix
from rlpost.model.packed import Attention
from rlpost.types.errors import ConfigError


def logp_and_grads(model, batch, use_packed, share=True, autocast=False):
    """Log-probs (B, T) and every parameter's gradient of sum(logp * mask), on one path."""
    (packed.enable if use_packed else packed.disable)(model)
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logp, _ = completion_logprobs(model, batch, temperature=0.9, share_prefix=share)
    (logp * batch.completion_mask).sum().backward()
    packed.disable(model)
    packed.clear_caches()
    return logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_close(a, b, atol, rtol=0.0):
    assert torch.allclose(a, b, atol=atol, rtol=rtol), (a - b).abs().max()


def assert_same_function(hf, pk, mask):
    """Two logp_and_grads results agree in float32: log-probs on the mask, and every weight's gradient
    (embedding, norms, fused projections split back apart)."""
    assert_close(hf[0][mask], pk[0][mask], atol=1e-5)
    assert hf[1].keys() == pk[1].keys()
    for name in hf[1]:
        assert_close(hf[1][name], pk[1][name], atol=1e-5)


@pytest.mark.parametrize("share", [True, False])
def test_float32_values_and_gradients_equal_transformers(tiny, batch, share):
    assert not batch.prompt_mask.all()  # left padding is exercised
    hf = logp_and_grads(tiny.model, batch, use_packed=False, share=share)
    pk = logp_and_grads(tiny.model, batch, use_packed=True, share=share)
    assert_same_function(hf, pk, batch.completion_mask)


def test_bf16_autocast_tracks_transformers(tiny, batch):
    # Both are bf16 approximations of the float32 function: the packed trunk's may be no worse than
    # transformers' own (measured: 0.0034 nats on both; worst weight gradient 1.1% of its largest
    # entry off, transformers' 1.5%)
    exact = logp_and_grads(tiny.model, batch, use_packed=False)
    hf = logp_and_grads(tiny.model, batch, use_packed=False, autocast=True)
    pk = logp_and_grads(tiny.model, batch, use_packed=True, autocast=True)
    m = batch.completion_mask
    err = lambda run: (run[0][m] - exact[0][m]).abs().max()
    grad_err = lambda run: max((run[1][n] - exact[1][n]).abs().max() / exact[1][n].abs().max() for n in exact[1])
    assert 0 < err(pk) <= 2 * err(hf) + 1e-3, (err(pk), err(hf))  # > 0: it did run in bf16
    assert grad_err(pk) <= 2 * grad_err(hf) + 1e-3, (grad_err(pk), grad_err(hf))


def test_holes_in_the_loss_mask_are_fed_but_not_scored(tiny, batch):
    # A tool episode masks its observation tokens out of the loss, but they are part of the context:
    # the packed trunk feeds every token up to a row's last loss token.
    holed = copy.copy(batch)
    holed.completion_mask = batch.completion_mask.clone()
    holed.completion_mask[:, 1] = False
    hf = logp_and_grads(tiny.model, holed, use_packed=False)
    pk = logp_and_grads(tiny.model, holed, use_packed=True)
    assert_same_function(hf, pk, holed.completion_mask)


def test_prompts_once_as_leaves_give_the_same_gradient(tiny, batch):
    # The trainer's path: the mini-batch's prompts run once, micro-batches take rows from them, and
    # the prompts' gradient goes back once at the end (Prefix.backward).
    def run(use_packed):
        (packed.enable if use_packed else packed.disable)(tiny.model)
        tiny.model.zero_grad()
        prefix = prompt_prefix(tiny.model, batch)
        for idx in (torch.tensor([0, 5, 9, 2]), torch.tensor([1, 3, 4, 6, 7, 8, 10, 11])):
            mb = batch.select(idx)
            out = policy_forward(tiny.model, mb, Scoring(0.9), prefix=prefix.take(idx, mb.prompt_ids.shape[1]))
            (out.logp * mb.completion_mask).sum().backward()
        prefix.backward()
        packed.disable(tiny.model)
        packed.clear_caches()
        return {n: p.grad.clone() for n, p in tiny.model.named_parameters()}

    hf, pk = run(False), run(True)
    for name in hf:
        assert_close(hf[name], pk[name], atol=1e-5)


def test_qwen2_biases(batch):
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(cfg)
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            torch.nn.init.normal_(p, std=0.5)  # zeros at init would not test them
    hf = logp_and_grads(model, batch, use_packed=False)
    pk = logp_and_grads(model, batch, use_packed=True)
    assert any("q_proj.bias" in n for n in pk[1])
    assert_same_function(hf, pk, batch.completion_mask)


def test_long_rows_take_sdpa_and_still_equal_transformers(tiny, batch, monkeypatch):
    # Past SAVED_BYTES a layer (long rows) attention is SDPA's, which keeps no (T, L) tensor
    # (packed.attention); values and gradients are still transformers' (float32), and under bf16
    # autocast no further from float32 than transformers' own
    calls = []
    monkeypatch.setattr(packed, "SAVED_BYTES", 0)
    monkeypatch.setattr(packed.Attention, "apply", lambda *a: calls.append(a))
    hf = logp_and_grads(tiny.model, batch, use_packed=False)
    pk = logp_and_grads(tiny.model, batch, use_packed=True)
    m = batch.completion_mask
    assert_same_function(hf, pk, m)
    hf16 = logp_and_grads(tiny.model, batch, use_packed=False, autocast=True)
    pk16 = logp_and_grads(tiny.model, batch, use_packed=True, autocast=True)
    err = lambda run: (run[0][m] - hf[0][m]).abs().max()
    assert 0 < err(pk16) <= 2 * err(hf16) + 1e-3
    assert not calls  # the kept-probabilities Attention never ran


def test_attention_backward_matches_autograd():
    # Hand-written backward against autograd through the same forward, in float64.
    torch.manual_seed(0)
    b, nkv, g, T, L, hd = 2, 2, 3, 4, 6, 8
    q = torch.randn(b, nkv, g * T, hd, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(b, nkv, L, hd, dtype=torch.float64, requires_grad=True) for _ in range(2))
    allow = torch.rand(b, T, L) > 0.3
    allow[..., 0] = True
    mask = torch.zeros(b, 1, 1, T, L, dtype=torch.float64).masked_fill_(~allow[:, None, None], float("-inf"))
    do = torch.randn(b, nkv, g * T, hd, dtype=torch.float64)

    def reference(q, k, v):
        s = (q @ k.transpose(-1, -2)).view(b, nkv, g, T, L) * 0.3 + mask
        return s.softmax(-1).view(b, nkv, g * T, L) @ v

    got = torch.autograd.grad(Attention.apply(q, k, v, mask, 0.3), (q, k, v), do)
    want = torch.autograd.grad(reference(q, k, v), (q, k, v), do)
    for a, w in zip(got, want):
        assert_close(a, w, atol=1e-10)


def test_sdpa_with_kv_heads_expanded_equals_gqa_and_the_written_out_attention():
    # The GPU's path (packed.attention on CUDA: SDPA with each kv head copied to its query heads, the
    # memory-efficient kernel's layout) is the same function as SDPA's own GQA and ``Attention``, in
    # values and gradients (float64; rows with masked columns)
    torch.manual_seed(0)
    b, nkv, g, T, L, hd = 2, 2, 3, 4, 6, 8
    q = torch.randn(b, nkv, g * T, hd, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(b, nkv, L, hd, dtype=torch.float64, requires_grad=True) for _ in range(2))
    allow = torch.rand(b, T, L) > 0.3
    allow[..., 0] = True
    mask = torch.zeros(b, 1, 1, T, L, dtype=torch.float64).masked_fill_(~allow[:, None, None], float("-inf"))
    do = torch.randn(b, nkv, g * T, hd, dtype=torch.float64)
    runs = [Attention.apply(q, k, v, mask, 0.3), packed.sdpa(q, k, v, mask, 0.3, expand_kv=False),
            packed.sdpa(q, k, v, mask, 0.3, expand_kv=True)]
    grads = [torch.autograd.grad(o, (q, k, v), do) for o in runs]
    for o, gr in zip(runs[1:], grads[1:]):
        assert_close(o, runs[0], atol=1e-10)
        for a, w in zip(gr, grads[0]):
            assert_close(a, w, atol=1e-10)


def test_attention_scores_are_not_rounded_to_bf16():
    # bf16 q and k with large scores (|s| ~ 10): rounding the scores to bf16 before the softmax, as
    # eager attention does, was 0.058 off the float64 answer here; float32 scores 0.011 (p's cast
    # for p @ v and the bf16 output remain). Rounded scores cost a learning test its run (module doc).
    torch.manual_seed(0)
    b, nkv, g, T, L, hd = 2, 2, 3, 8, 12, 64
    q, k = (torch.randn(b, nkv, n, hd).mul(3).bfloat16() for n in (g * T, L))
    v = torch.randn(b, nkv, L, hd).bfloat16()
    s = (q.double() @ k.double().transpose(-1, -2)).view(b, nkv, g, T, L) * hd**-0.5
    want = s.softmax(-1).view(b, nkv, g * T, L) @ v.double()
    got = Attention.apply(q, k, v, torch.zeros(b, 1, 1, T, L), hd**-0.5)
    assert got.dtype == torch.bfloat16 and (got.double() - want).abs().max() < 0.025


def test_resolve_says_why_not():
    assert packed.resolve("hf", object()) is False
    with pytest.raises(ConfigError, match="trainer.forward=packed does not apply to activation checkpointing"):
        packed.resolve("packed", object(), checkpointing=True)
    assert packed.resolve("auto", torch.nn.Linear(2, 2)) is False  # not a Llama: transformers' forward


def test_cuda_attention_takes_the_memory_efficient_kernel_where_it_can(monkeypatch):
    # On CUDA the trainer's SDPA is held to the memory-efficient kernel when that kernel takes the inputs
    # (cuDNN's, torch's first choice on Hopper, builds a graph per new shape); otherwise torch chooses.
    # No GPU here: the decision is read with torch's own check stubbed, and on the CPU nothing is held.
    q = torch.randn(2, 4, 8, 16)
    bias = torch.zeros(2, 1, 8, 8)
    assert isinstance(packed.kernels(q, q, q, bias, gqa=False), type(packed.nullcontext()))  # the CPU: torch's
    seen = {}

    class FakeCuda(torch.Tensor):
        is_cuda = True

    def can_use(params, debug):
        seen["asked"] = True
        return seen["answer"]

    monkeypatch.setattr(torch.backends.cuda, "can_use_efficient_attention", can_use)
    monkeypatch.setattr(torch.backends.cuda, "SDPAParams", lambda *a: a)
    fake = q.as_subclass(FakeCuda)
    seen["answer"] = False
    assert isinstance(packed.kernels(fake, q, q, bias, gqa=False), type(packed.nullcontext())) and seen["asked"]
    seen["answer"] = True
    held = packed.kernels(fake, q, q, bias, gqa=False)
    assert not isinstance(held, type(packed.nullcontext()))
    with held:  # inside, SDPA may use the memory-efficient kernel alone
        assert torch._C._get_mem_efficient_sdp_enabled() and not torch._C._get_cudnn_sdp_enabled()
        assert not torch._C._get_flash_sdp_enabled() and not torch._C._get_math_sdp_enabled()
    assert torch._C._get_cudnn_sdp_enabled()  # and after it, torch's choice again

    def older_torch(*args):  # SDPAParams took 6 arguments before enable_gqa
        raise TypeError("__init__(): incompatible constructor arguments")

    monkeypatch.setattr(torch.backends.cuda, "SDPAParams", older_torch)
    assert isinstance(packed.kernels(fake, q, q, bias, gqa=False), type(packed.nullcontext()))  # torch's choice


def gpu_branch(monkeypatch):
    """Run the trunk's GPU kernels (fused RMSNorm, SiluMul, the mask cast once) on the CPU, with
    attention as CUDA runs it (SDPA, each kv head copied to its query heads)."""
    monkeypatch.setattr(packed, "on_gpu", lambda x: True)
    monkeypatch.setattr(packed, "attention", lambda q, k, v, m, sc: packed.sdpa(q, k, v, m, sc, expand_kv=True))


def test_gpu_branch_is_the_same_function(tiny, batch, monkeypatch):
    # float32: the GPU branch's values and gradients equal transformers' (rms_norm with the weight is
    # the same float32 arithmetic); under bf16 autocast it tracks the float32 function as the CPU
    # branch does
    calls = []
    real = torch.nn.functional.rms_norm
    monkeypatch.setattr(torch.nn.functional, "rms_norm", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    exact = logp_and_grads(tiny.model, batch, use_packed=False)
    cpu = logp_and_grads(tiny.model, batch, use_packed=True, autocast=True)
    assert not calls  # the CPU branch writes the norm out
    gpu_branch(monkeypatch)
    assert_same_function(exact, logp_and_grads(tiny.model, batch, use_packed=True), batch.completion_mask)
    layers = len(tiny.model.model.layers)
    assert len(calls) == 2 * (2 * layers + 1)  # every norm, prompts and completions, with its weight
    assert all(w is not None for w in calls)
    gpu = logp_and_grads(tiny.model, batch, use_packed=True, autocast=True)
    m = batch.completion_mask
    err = lambda run: (run[0][m] - exact[0][m]).abs().max()
    grad_err = lambda run: max((run[1][n] - exact[1][n]).abs().max() / exact[1][n].abs().max() for n in exact[1])
    assert 0 < err(gpu) <= 1.5 * err(cpu) + 1e-4, (err(gpu), err(cpu))
    assert grad_err(gpu) <= 1.5 * grad_err(cpu) + 1e-4, (grad_err(gpu), grad_err(cpu))


def test_silu_mul_equals_autograd_to_the_bit():
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        gate, up = (torch.randn(37, 24).mul(3).to(dtype).requires_grad_() for _ in range(2))
        g = torch.randn(37, 24).to(dtype)
        want = torch.nn.functional.silu(gate) * up
        got = packed.SiluMul.apply(gate, up)
        assert torch.equal(got, want)
        for a, w in zip(torch.autograd.grad(got, (gate, up), g), torch.autograd.grad(want, (gate, up), g)):
            assert torch.equal(a, w)


def saved_bytes(model, batch):
    """Bytes of the tensors one forward keeps for its backward (bf16 autocast), weights left out."""
    seen = {}

    def keep(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logp, _ = completion_logprobs(model, batch, temperature=0.9)
    logp.sum().backward()
    packed.clear_caches()
    return sum(n for ptr, n in seen.items() if ptr not in weights)


def test_gpu_branch_keeps_less_than_transformers_for_the_backward(tiny, batch, monkeypatch):
    # SiluMul keeps gate and up, not silu(gate): one (tokens, intermediate) bf16 tensor a layer fewer
    # than transformers' MLP keeps. (The fused norm's saving, the float32 normalised x, is CUDA's
    # kernel's: torch writes rms_norm out on the CPU, so it does not show here.)
    packed.disable(tiny.model)
    hf = saved_bytes(tiny.model, batch)
    gpu_branch(monkeypatch)
    packed.enable(tiny.model)
    try:
        gpu = saved_bytes(tiny.model, batch)
    finally:
        packed.disable(tiny.model)
    c = tiny.model.config
    tokens = int(batch.completion_mask.sum())  # at least this many positions run the MLP
    assert gpu <= hf - c.num_hidden_layers * tokens * c.intermediate_size * 2, (gpu, hf)
