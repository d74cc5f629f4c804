"""The two-level inverse-CDF draw (roles/sampling.py) samples exactly softmax(z) and records its log-prob."""

import torch

from rlpost.roles import sampling


def test_draw_frequencies_and_log_probs(monkeypatch):
    # 7 tokens in blocks of 3 (the last block padded): every block boundary and the padding are crossed
    monkeypatch.setattr(sampling, "BLOCK", 3)
    z = torch.tensor([[2.0, 1.0, 0.0, -1.0, 3.0, 0.5, -2.0]]).repeat(60000, 1)
    torch.manual_seed(0)
    tok, lp = sampling.draw(z)
    want = z[0].softmax(-1)
    freq = torch.bincount(tok, minlength=7).float() / len(tok)
    assert tok.max() < 7 and (freq - want).abs().max() < 0.006
    assert torch.allclose(lp, z[0].log_softmax(-1)[tok], atol=1e-6)


def test_a_certain_token_is_always_drawn_and_rows_are_independent():
    z = torch.full((4, 5000), -1e4)
    z[torch.arange(4), torch.tensor([0, 1023, 1024, 4999])] = 0.0  # block edges of the default BLOCK
    tok, lp = sampling.draw(z)
    assert tok.tolist() == [0, 1023, 1024, 4999] and torch.allclose(lp, torch.zeros(4))


def test_the_uniform_maps_to_the_same_token_as_the_whole_row_cdf():
    # Same uniform, same inverse CDF: the two-level search lands where a search over the full
    # cumulative sum does, away from float ties at block edges.
    torch.manual_seed(1)
    z = torch.randn(64, 3000) * 3
    torch.manual_seed(2)
    tok, _ = sampling.draw(z)
    torch.manual_seed(2)
    e = (z - z.amax(-1, keepdim=True)).exp()
    u = torch.rand(64, 1) * e.sum(-1, keepdim=True)
    full = torch.searchsorted(e.cumsum(-1), u, right=True)[:, 0]
    assert (tok == full).float().mean() >= 0.98


def test_uniforms_are_lowbias32_by_hand_and_follow_row_and_token_not_position():
    # mul32 and mix against Python's unbounded integers (lowbias32: xor-shift 16, * 0x7feb352d,
    # xor-shift 15, * 0x846ca68b, xor-shift 16, all mod 2^32), on values near 2^32 where int64 would overflow.
    def lowbias32(v):
        v ^= v >> 16
        v = v * 0x7FEB352D % 2**32
        v ^= v >> 15
        v = v * 0x846CA68B % 2**32
        return v ^ (v >> 16)

    x = torch.tensor([0, 1, 12345, 2**31 - 1, 2**31, 2**32 - 1])
    assert sampling.mix(x).tolist() == [lowbias32(v) for v in x.tolist()]
    assert sampling.mul32(x, 0x9E3779B9).tolist() == [v * 0x9E3779B9 % 2**32 for v in x.tolist()]
    key = torch.tensor([3, 4])
    rows, t = torch.arange(2000) % 50, torch.arange(2000) // 50
    u = sampling.uniforms(key, rows, t)
    assert u.min() >= 0 and u.max() < 1 and len(u.unique()) == 2000
    perm = torch.randperm(2000, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sampling.uniforms(key, rows[perm], t[perm]), u[perm])  # a function of (row, t), not of where
    assert not torch.equal(sampling.uniforms(torch.tensor([3, 5]), rows, t), u)  # another key, other uniforms
    counts = torch.histc(u, 10, 0, 1)  # 200 expected in each tenth; sd 13.4
    assert (counts - 200).abs().max() < 60
