"""Every algorithm of the registry under the same checks (issue 22), against an independent
implementation written here from the papers' equations, one token at a time in plain Python:

- advantages, loss values and d loss / d log pi (and d loss / d V for PPO's critic), on a batch with
  completions of different lengths, a hole in the mask (a tool's observation tokens) and garbage
  in every masked position;
- asymmetric clip epsilons, with tokens (sequences, for GSPO) whose ratio lies between 1 + eps_low
  and 1 + eps_high, or between 1 - eps_high and 1 - eps_low, so a swap of the two is seen;
- each aggregator, and the KL-in-loss term aggregated like the policy loss;
- micro-batch x accumulation: the rows cut into micro-batches give the whole batch's loss and gradient;
- resume: an algorithm rebuilt from its saved state gives what the running one gives;
- one line per algorithm stating its paper's convention, each checked by its own test (``PAPER``).

A new algorithm in ``ALGORITHMS`` fails ``test_every_algorithm_is_covered`` until it is added here.
"""

import math

import pytest
import torch
from helpers import algorithm, objective, rl_batch, tiny_cfg

from rlpost import algorithms
from rlpost.algorithms import ALGORITHMS, core

t = torch.tensor
K, MAX_NEW = 2, 6
EPS_LOW, EPS_HIGH = 0.1, 0.3  # token ratio range [0.9, 1.3]; swapped it would be [0.7, 1.1]
SEQ_EPS_LOW, SEQ_EPS_HIGH = 0.02, 0.06  # GSPO's sequence ratio range [0.98, 1.06]
GAMMA, LAM, KL_COEF, VALUE_CLIP, VF_COEF, DECAY = 0.9, 0.8, 0.1, 0.1, 0.5, 0.5

# Two groups of two. Row 0 has 5 loss tokens, row 1 has 2, row 2 has 3 with a 2-token hole (a tool's
# observation), row 3 has 3.
MASK = t([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 1, 1], [1, 1, 1, 0, 0]]).bool()
REWARD = t([1.0, 0.0, 0.5, 0.0])
G = 7.0  # garbage in masked positions: no loss may read it
OLD = t([[-1.0, -2.0, -0.5, -1.5, -0.7], [-0.3, -1.2, G, G, G], [-0.9, G, G, -1.1, -0.4], [-2.2, -0.6, -1.0, G, G]])
# log pi - log pi_old. Ratios: e^.25 = 1.284 and e^.2 = 1.221 (inside [0.9, 1.3], clipped at 1.1 if the
# epsilons were swapped), e^-.2 = 0.819 and e^-.15 = 0.861 (below 0.9), e^.5 = 1.65 and e^.3 = 1.35 (above 1.3).
DELTA = t([[0.0, 0.25, -0.2, 0.5, -0.05], [0.15, -0.5, 0.0, 0.0, 0.0], [-0.15, 0.0, 0.0, 0.2, 0.05],
           [0.3, -0.08, 0.1, 0.0, 0.0]])
REF = t([[-1.2, -1.7, -0.5, -2.0, -0.6], [-0.5, -1.0, -G, -G, -G], [-0.8, -G, -G, -1.3, -0.5],
         [-2.0, -0.9, -1.1, -G, -G]])
OLD_VALUES = t([[0.1, 0.3, -0.2, 0.4, 0.5], [0.2, -0.1, G, G, G], [0.0, G, G, 0.6, 0.2], [-0.3, 0.1, 0.4, G, G]])
VALUES = OLD_VALUES + t([[0.05, -0.3, 0.2, 0.0, -0.15], [0.5, 0.02, 0, 0, 0], [-0.2, 0, 0, 0.08, 0.3],
                         [0.0, -0.5, 0.07, 0, 0]])

PAPER = {
    "reinforce": "Williams 1992: loss = -(r - b) log pi(y) on every token; b is a moving average of EARLIER batches' "
                 "rewards",
    "ppo": "Schulman 2017 Eq. 7 + GAE (2016) Eq. 16: A_t = sum_l (gamma lambda)^l delta_{t+l} over the policy's own "
           "tokens; KL(pi_old || pi_ref) is a per-token reward; value loss 0.5 max((V - R)^2, (V_clip - R)^2)",
    "reinforce_pp": "Hu 2025 Eq. 6-7: r_t = -beta KL_t (+ score on the last token), A_t = sum_{s >= t} r_s, "
                    "normalised over all tokens of the batch; PPO's clipped surrogate",
    "grpo": "Shao 2024 Sec. 4.1.2: A_i = (r_i - mean(r)) / std(r) over the G completions of one prompt "
            "(unbiased std, as TRL and verl), KL (k3) to the reference in the loss",
    "rloo": "Ahmadian 2024 Eq. 3: A_i = r_i - 1/(k - 1) sum_{j != i} r_j, no division by std",
    "dapo": "Yu 2025 Eq. 8-10: eps_low 0.2, eps_high 0.28, loss summed over all tokens / total tokens of the batch",
    "dr_grpo": "Liu 2025 Sec. 3.1: A_i = r_i - mean(r) (no /std), loss summed over tokens / (G * max_new_tokens) (no "
               "/|o_i|)",
    "gspo": "Zheng 2025 Eq. 5-7: s_i = (pi(y_i) / pi_old(y_i))^(1/|y_i|), loss -1/G sum_i min(s_i A_i, clip(s_i) A_i), "
            "eps 3e-4 / 4e-4",
    "cispo": "MiniMax 2025 Eq. 4: loss -sum sg(clip(r_t, 1 - eps_low, 1 + eps_high)) A log pi(y_t) / sum |o_i|",
    "distill": "Agarwal 2024 (reverse KL, on-policy): A_t = -(log pi_old(y_t) - log pi_teacher(y_t)) per token, "
               "PPO's clipped surrogate; no verifier reward",
}


def cfg_for(name: str, agg: str = "token_mean", *extra: str):
    kl = [] if ALGORITHMS[name].traits.kl == "none" else [f"algo.kl_coef={KL_COEF}"]
    kl += ["algo.teacher=tiny"] if ALGORITHMS[name].traits.teacher else []  # REF holds the teacher's log-probs
    knobs = [f"algo.loss_agg={agg}", f"algo.clip_eps_low={EPS_LOW}", f"algo.clip_eps_high={EPS_HIGH}",
             f"algo.dapo_clip_eps_high={EPS_HIGH}", f"algo.cispo_eps_low={EPS_LOW}",
             f"algo.seq_clip_eps_low={SEQ_EPS_LOW}",
             f"algo.seq_clip_eps_high={SEQ_EPS_HIGH}", f"algo.gamma={GAMMA}", f"algo.lam={LAM}",
             f"algo.value_clip={VALUE_CLIP}", f"algo.vf_coef={VF_COEF}", f"algo.baseline_decay={DECAY}", *extra]
    reads = {n: algorithms.knobs_read(cls) for n, cls in ALGORITHMS.items()}
    others = set().union(*reads.values()) - reads[name]  # what train refuses: another algorithm's keys
    knobs = [k for k in knobs if k[5:].partition("=")[0] not in others]
    return tiny_cfg(f"algo.name={name}", f"rollout.group_size={K}", f"rollout.max_new_tokens={MAX_NEW}", *kl, *knobs)


def batch():
    return rl_batch(MASK, reward=REWARD.clone(), old_logp=OLD.clone(), sampler_logp=OLD.clone(), ref_logp=REF.clone(),
                    old_values=OLD_VALUES.clone(), group_ids=t([0, 0, 1, 1]))


# --- the independent implementation: one token at a time, from the equations ------------------


def rows():
    """Per row, the columns of its loss tokens."""
    return [[c for c in range(MASK.shape[1]) if MASK[i, c]] for i in range(len(MASK))]


def agg_weights(agg: str) -> list[dict]:
    """Per row, {column: weight of that token's loss in the aggregate}."""
    R = rows()
    n_tok, B = sum(len(r) for r in R), len(R)
    w = {"token_mean": lambda r: 1 / n_tok, "seq_mean_token_mean": lambda r: 1 / (B * len(r)),
         "seq_mean_token_sum": lambda r: 1 / B, "const_norm": lambda r: 1 / (B * MAX_NEW)}[agg]
    return [{c: w(r) for c in r} for r in R]


def group_adv(name: str) -> list[float]:
    out = []
    for i, r in enumerate(REWARD.tolist()):
        g = REWARD.tolist()[i // K * K: i // K * K + K]
        mean = sum(g) / K
        std = math.sqrt(sum((x - mean) ** 2 for x in g) / (K - 1))
        if name == "rloo":
            out.append(r - (sum(g) - r) / (K - 1))
        elif name == "dr_grpo":
            out.append(r - mean)
        elif name == "reinforce":
            out.append(r)  # first batch: no earlier batch, no baseline
        else:
            out.append((r - mean) / (std + 1e-6))
    return out


def whiten(adv: list[dict]) -> list[dict]:
    vals = [v for row in adv for v in row.values()]
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))
    return [{c: (v - mean) / (std + 1e-6) for c, v in row.items()} for row in adv]


def token_returns(name: str) -> tuple[list[dict], list[dict]]:
    """(advantages, returns) per row and loss column, for the KL-in-reward algorithms: GAE over the
    row's loss tokens only (a hole is not a step), V = 0 for REINFORCE++."""
    gamma, lam = (GAMMA, LAM) if name == "ppo" else (1.0, 1.0)
    adv, ret = [], []
    for i, cols in enumerate(rows()):
        r = [-KL_COEF * (OLD[i, c] - REF[i, c]).item() for c in cols]  # k1 on the sampled tokens
        r[-1] += REWARD[i].item()
        v = [OLD_VALUES[i, c].item() if name == "ppo" else 0.0 for c in cols]
        a, nxt_a, nxt_v = [0.0] * len(cols), 0.0, 0.0
        for j in reversed(range(len(cols))):
            delta = r[j] + gamma * nxt_v - v[j]
            a[j] = nxt_a = delta + gamma * lam * nxt_a
            nxt_v = v[j]
        adv.append(dict(zip(cols, a)))
        ret.append({c: a[j] + v[j] for j, c in enumerate(cols)})
    return whiten(adv), ret


def expected_advantages(name: str) -> tuple[list[dict], list[dict] | None]:
    if name in ("ppo", "reinforce_pp"):
        adv, ret = token_returns(name)
        return adv, (ret if name == "ppo" else None)  # only PPO's critic has a regression target
    if name == "distill":
        return [{c: -(OLD[i, c] - REF[i, c]).item() for c in cols} for i, cols in enumerate(rows())], None
    seq = group_adv(name)
    return [{c: seq[i] for c in cols} for i, cols in enumerate(rows())], None


def clipped(delta: float, adv: float, lo: float, hi: float) -> tuple[float, float]:
    """-min(r A, clip(r) A) and its derivative in log pi: r A if the min takes the unclipped branch, else 0."""
    r = math.exp(delta)
    unclipped, clip = r * adv, min(max(r, 1 - lo), 1 + hi) * adv
    return (-unclipped, -unclipped) if unclipped <= clip else (-clip, 0.0)


def expected_loss(name: str, agg: str, adv: list[dict], ret: list[dict] | None):
    """(loss, d loss / d log pi (B, T), d loss / d V (B, T) or None) by the paper's equations."""
    fixed = ALGORITHMS[name].traits.fixed_aggregator
    w = agg_weights(fixed if fixed in ("token_mean", "const_norm") else agg)
    logp = OLD + DELTA
    loss, g_logp, g_v = 0.0, torch.zeros_like(OLD), torch.zeros_like(OLD)
    for i, cols in enumerate(rows()):
        if name == "gspo":  # one ratio per sequence, the mean over the mini-batch's sequences
            s = math.exp(sum(DELTA[i, c].item() for c in cols) / len(cols))
            lo, hi = 1 - SEQ_EPS_LOW, 1 + SEQ_EPS_HIGH
            a = adv[i][cols[0]]
            val, d = clipped(math.log(s), a, SEQ_EPS_LOW, SEQ_EPS_HIGH)
            loss += val / len(MASK)
            for c in cols:
                g_logp[i, c] += d / len(cols) / len(MASK)
            assert lo < 1 < hi
            continue
        for c in cols:
            a, dl = adv[i][c], DELTA[i, c].item()
            if name == "reinforce":
                val, d = -a * logp[i, c].item(), -a
            elif name == "cispo":
                weight = min(max(math.exp(dl), 1 - EPS_LOW), 1 + EPS_HIGH)  # no gradient through it
                val, d = -weight * a * logp[i, c].item(), -weight * a
            else:
                val, d = clipped(dl, a, EPS_LOW, EPS_HIGH)
            loss += w[i][c] * val
            g_logp[i, c] += w[i][c] * d
            if name == "ppo":  # + vf_coef * 0.5 max((V - R)^2, (V_clip - R)^2)
                v, v_old, R = VALUES[i, c].item(), OLD_VALUES[i, c].item(), ret[i][c]
                v_clip = v_old + min(max(v - v_old, -VALUE_CLIP), VALUE_CLIP)
                if (v - R) ** 2 >= (v_clip - R) ** 2:
                    vf, dv = 0.5 * (v - R) ** 2, v - R
                else:
                    vf, dv = 0.5 * (v_clip - R) ** 2, (v_clip - R) * (abs(v - v_old) < VALUE_CLIP)
                loss += VF_COEF * w[i][c] * vf
                g_v[i, c] += VF_COEF * w[i][c] * dv
    if ALGORITHMS[name].traits.kl == "loss":  # + kl_coef * aggregated k3(pi, ref), like the policy loss
        kw = agg_weights("seq_mean_token_mean" if name == "gspo" else fixed if fixed else agg)
        for i, cols in enumerate(rows()):
            for c in cols:
                x = REF[i, c].item() - logp[i, c].item()  # log(ref / pi)
                loss += KL_COEF * kw[i][c] * (math.exp(x) - 1 - x)
                g_logp[i, c] += KL_COEF * kw[i][c] * (1 - math.exp(x))
    return loss, g_logp, (g_v if name == "ppo" else None)


def as_tensor(per_row: list[dict]) -> torch.Tensor:
    out = torch.zeros_like(OLD)
    for i, row in enumerate(per_row):
        for c, v in row.items():
            out[i, c] = v
    return out


def run_loss(algo, b, logp=None, values=None):
    logp = (OLD + DELTA).requires_grad_() if logp is None else logp
    values = VALUES.clone().requires_grad_() if values is None else values
    extra = {"values": values} if algo.traits.needs_values else {}
    loss, metrics = algo.loss(logp, b, **extra)
    loss.backward()
    return loss, metrics, logp.grad, values.grad


# --- the checks ------------------------------------------------------------------------------


def test_every_algorithm_is_covered():
    assert set(PAPER) == set(ALGORITHMS)
    for name in ALGORITHMS:
        assert f"test_paper_{name}" in globals(), name


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "const_norm"])
@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_values_and_gradients_match_the_equations(name, agg):
    algo = algorithm(cfg_for(name, agg))
    b = batch()
    out = algo.advantages(b)
    adv, ret = expected_advantages(name)
    assert torch.allclose(out.tokens, as_tensor(adv), atol=1e-5), out.tokens
    assert (out.tokens[~MASK] == 0).all()
    if ret is not None:
        assert torch.allclose(out.returns * MASK, as_tensor(ret), atol=1e-5)
    b.advantages, b.returns = out.tokens, out.returns
    loss, _, g_logp, g_v = run_loss(algo, b)
    want, want_g, want_gv = expected_loss(name, agg, adv, ret)
    assert math.isclose(loss.item(), want, rel_tol=1e-5, abs_tol=1e-6), (loss.item(), want)
    assert torch.allclose(g_logp, want_g, atol=1e-6), (g_logp, want_g)
    if want_gv is not None:
        assert torch.allclose(g_v, want_gv, atol=1e-6), (g_v, want_gv)


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_swapped_clip_epsilons_change_the_loss(name):
    # The batch has ratios between the two ranges, so eps_low and eps_high are told apart.
    algo = algorithm(cfg_for(name))
    swapped = algorithm(cfg_for(name, "token_mean", f"algo.clip_eps_low={EPS_HIGH}", f"algo.clip_eps_high={EPS_LOW}",
                                f"algo.dapo_clip_eps_high={EPS_LOW}", f"algo.cispo_eps_low={EPS_HIGH}",
                                f"algo.seq_clip_eps_low={SEQ_EPS_HIGH}", f"algo.seq_clip_eps_high={SEQ_EPS_LOW}"))
    b = batch()
    b.advantages, b.returns = algo.advantages(b).tokens, algo.advantages(batch()).returns
    if name == "reinforce":  # no ratio, nothing to clip
        assert run_loss(algo, b)[0].item() == run_loss(swapped, b)[0].item()
        return
    one, two = run_loss(algo, b), run_loss(swapped, b)
    assert abs(one[0].item() - two[0].item()) > 1e-4 or not torch.allclose(one[2], two[2], atol=1e-5)


@pytest.mark.parametrize("cuts", [[1], [3], [1, 2, 3]])
@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_micro_batches_add_up_to_the_mini_batch(name, agg, cuts):
    algo = algorithm(cfg_for(name, agg))
    b = batch()
    out = algo.advantages(b)
    b.advantages, b.returns = out.tokens, out.returns
    whole, _, g_whole, gv_whole = run_loss(algo, b)
    logp, values = (OLD + DELTA).requires_grad_(), VALUES.clone().requires_grad_()
    total = 0.0
    bounds = [0, *cuts, len(b)]
    for lo, hi in zip(bounds, bounds[1:]):
        mb = b.select(slice(lo, hi))
        mb.norm_tokens, mb.norm_seqs = float(MASK.sum()), len(b)  # what the trainer writes
        extra = {"values": values[lo:hi]} if algo.traits.needs_values else {}
        loss, _ = algo.loss(logp[lo:hi], mb, **extra)
        loss.backward()
        total += loss.item()
    assert math.isclose(total, whole.item(), rel_tol=1e-5, abs_tol=1e-6)
    assert torch.allclose(logp.grad, g_whole, atol=1e-6)
    if algo.traits.needs_values:
        assert torch.allclose(values.grad, gv_whole, atol=1e-6)


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_masked_positions_change_nothing(name):
    # Other garbage in the masked positions (hole and padding): the same loss and gradient, and no
    # gradient reaches a masked position.
    results = []
    for garbage in (0.0, -3.0):
        algo = algorithm(cfg_for(name, "seq_mean_token_mean"))
        b = batch()
        for f in ("old_logp", "sampler_logp", "ref_logp", "old_values"):
            getattr(b, f)[~MASK] = garbage
        out = algo.advantages(b)
        b.advantages, b.returns = out.tokens, out.returns
        logp = (OLD + DELTA).masked_fill(~MASK, 2 * garbage).requires_grad_()
        values = VALUES.masked_fill(~MASK, garbage).requires_grad_()
        results.append((out.tokens, *run_loss(algo, b, logp, values)))
    (a0, l0, _, g0, v0), (a1, l1, _, g1, v1) = results
    assert torch.equal(a0, a1) and math.isclose(l0.item(), l1.item(), rel_tol=1e-6)
    assert torch.allclose(g0, g1) and (g0[~MASK] == 0).all()
    if algo.traits.needs_values:
        assert torch.allclose(v0, v1) and (v0[~MASK] == 0).all()


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_rebuilt_from_its_saved_state_an_algorithm_carries_on_unchanged(name):
    # Two steps: the running objective against one rebuilt from a checkpoint's state after step 1
    # (REINFORCE's moving baseline, the adapted KL coefficient).
    extra = [] if ALGORITHMS[name].traits.kl == "none" else ["algo.kl_target=0.01"]
    running = objective(cfg_for(name, "token_mean", *extra))
    step2 = batch()
    step2.reward = t([0.2, 0.9, 0.0, 0.7])
    adv1 = running.advantages(batch())
    running.end_step({"actor/kl": 0.05}, adv1.metrics, 4)
    rebuilt = objective(cfg_for(name, "token_mean", *extra))
    rebuilt.load_state_dict(running.state_dict())
    a, b = running.advantages(step2), rebuilt.advantages(step2)
    assert torch.equal(a.tokens, b.tokens) and running.algo.kl_coef == rebuilt.algo.kl_coef
    fresh = objective(cfg_for(name, "token_mean", *extra))
    if running.state_dict()["algo"] or extra:  # there was state to carry: without it, step 2 differs
        c = fresh.advantages(step2)
        assert not torch.equal(a.tokens, c.tokens) or fresh.algo.kl_coef != running.algo.kl_coef


def mean(xs):
    return sum(xs) / len(xs)


def expected_metrics(name: str, adv: list[dict], ret: list[dict] | None) -> tuple[dict, dict]:
    """(advantage metrics, loss metrics): every key the algorithm reports, with its value."""
    R, logp = rows(), OLD + DELTA
    toks = [(i, c) for i, cols in enumerate(R) for c in cols]
    seq = [adv[i][cols[0]] for i, cols in enumerate(R)]
    kl_on = ALGORITHMS[name].traits.kl != "none"
    if ALGORITHMS[name].traits.group_baseline:  # one metric set for every group method (grpo.group_advantages)
        stds = [REWARD[g * K:(g + 1) * K].std().item() for g in range(len(R) // K)]
        adv_m = {"critic/advantages/mean": mean(seq), "critic/advantages/max": max(seq),
                 "critic/advantages/min": min(seq), "reward/group_std": mean(stds),
                 "reward/zero_std_frac": mean([s == 0 for s in stds])}
    elif name == "reinforce":
        adv_m = {"critic/baseline": 0.0}
    elif name in ("ppo", "reinforce_pp"):
        kl = mean([(OLD[i, c] - REF[i, c]).item() for i, c in toks])
        adv_m = {"critic/kl": kl, "critic/kl_coef": KL_COEF, "critic/kl_bound_frac": 0.0}  # no token near k3's bound
        if name == "reinforce_pp":
            adv_m["critic/advantages/max"] = max(adv[i][c] for i, c in toks)
        else:
            rets, vals = [ret[i][c] for i, c in toks], [OLD_VALUES[i, c].item() for i, c in toks]
            var = lambda xs: mean([(x - mean(xs)) ** 2 for x in xs])
            adv_m.update({"critic/advantages/mean": mean([adv[i][c] for i, c in toks]),
                          "critic/returns/mean": mean(rets), "critic/values/mean": mean(vals),
                          "critic/explained_variance": 1 - var([r - v for r, v in zip(rets, vals)]) / var(rets)})
    elif name == "distill":
        kl_toks = [(OLD[i, c] - REF[i, c]).item() for i, c in toks]
        adv_m = {"distill/reverse_kl": mean(kl_toks), "critic/advantages/mean": -mean(kl_toks)}
    else:
        adv_m = {"critic/advantages/mean": mean(seq)}
    kl_tok = [math.exp(REF[i, c].item() - logp[i, c].item()) - 1 - (REF[i, c].item() - logp[i, c].item())
              for i, c in toks]
    if name == "gspo":
        s = [math.exp(mean([DELTA[i, c].item() for c in cols])) for i, cols in enumerate(R)]
        per = [clipped(math.log(s[i]), seq[i], SEQ_EPS_LOW, SEQ_EPS_HIGH)[0] for i in range(len(R))]
        loss_m = {"actor/pg_loss": mean(per), "actor/seq_ratio_max": max(s),
                  "actor/pg_clipfrac": mean([p != -x * a for p, x, a in zip(per, s, seq)])}
    else:
        r = [math.exp(DELTA[i, c].item()) for i, c in toks]
        a = [adv[i][c] for i, c in toks]
        if name == "reinforce":
            per = [-ai * logp[i, c].item() for ai, (i, c) in zip(a, toks)]
            loss_m = {"actor/pg_loss": mean(per)}
        elif name == "cispo":
            w = [min(max(x, 1 - EPS_LOW), 1 + EPS_HIGH) for x in r]
            per = [-wi * ai * logp[i, c].item() for wi, ai, (i, c) in zip(w, a, toks)]
            loss_m = {"actor/pg_loss": mean(per), "actor/is_weight_clipfrac": mean([wi != x for wi, x in zip(w, r)])}
        else:
            per = [clipped(math.log(x), ai, EPS_LOW, EPS_HIGH)[0] for x, ai in zip(r, a)]
            loss_m = {"actor/pg_loss": mean(per),
                      "actor/pg_clipfrac": mean([p != -x * ai for p, x, ai in zip(per, r, a)]),
                      "actor/ppo_kl": -mean([DELTA[i, c].item() for i, c in toks]), "actor/ratio_max": max(r)}
        if name == "ppo":
            vf, vclip = [], []
            for i, c in toks:
                v, v_old, R_ = VALUES[i, c].item(), OLD_VALUES[i, c].item(), ret[i][c]
                v_c = v_old + min(max(v - v_old, -VALUE_CLIP), VALUE_CLIP)
                vf.append(0.5 * max((v - R_) ** 2, (v_c - R_) ** 2))
                vclip.append((v_c - R_) ** 2 > (v - R_) ** 2)
            del loss_m["actor/ratio_max"]  # a metric of the GRPO family's loss only
            loss_m.update({"critic/vf_loss": mean(vf), "critic/vf_clipfrac": mean(vclip),
                           "critic/vpred_mean": mean([VALUES[i, c].item() for i, c in toks])})
    if kl_on and ALGORITHMS[name].traits.kl == "loss":
        loss_m["actor/kl"] = mean(kl_tok)
        loss_m["actor/kl_bound_frac"] = mean([k >= 10.0 for k in kl_tok])  # 0 here: every |log r| is small
    return adv_m, loss_m


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_metrics_are_the_values_they_name(name):
    algo = algorithm(cfg_for(name))
    b = batch()
    out = algo.advantages(b)
    adv, ret = expected_advantages(name)
    b.advantages, b.returns = out.tokens, out.returns
    _, loss_metrics, _, _ = run_loss(algo, b)
    want_adv, want_loss = expected_metrics(name, adv, ret)
    for got, want in ((out.metrics, want_adv), (loss_metrics, want_loss)):
        assert set(got) == set(want)
        for k, v in want.items():
            assert math.isclose(got[k], v, rel_tol=1e-4, abs_tol=1e-5), (k, got[k], v)


# --- the papers' conventions, one test each --------------------------------------------------


def one_group(name: str, rewards: list[float], *extra: str):
    algo = algorithm(cfg_for(name, "token_mean", f"rollout.group_size={len(rewards)}", *extra))
    mask = torch.ones(len(rewards), 1, dtype=torch.bool)
    return algo, algo.advantages(rl_batch(mask, reward=t(rewards), old_logp=torch.zeros(len(rewards), 1),
                                          ref_logp=torch.zeros(len(rewards), 1))).tokens[:, 0]


def test_paper_reinforce():
    algo = algorithm(cfg_for("reinforce"))
    # batch 1 rewards [1, 0, 0.5, 0]: no earlier batch, A = r; then b = mean = 0.375
    first = algo.advantages(batch()).tokens[:, 0]
    assert torch.allclose(first, REWARD) and algo.b == 0.375
    # batch 2 rewards [1, 1, 1, 1]: A = 1 - 0.375 = 0.625 (not 1 - its own mean = 0); then b = .5 * .375 + .5 * 1
    b2 = batch()
    b2.reward = torch.ones(4)
    assert torch.allclose(algo.advantages(b2).tokens[:, 0], torch.full((4,), 0.625)) and algo.b == 0.6875
    # loss = -A log pi: one token, A = 2, log pi = -0.5 -> loss 1.0, d/dlogp = -2
    logp = t([[-0.5]], requires_grad=True)
    loss, _ = algo.loss(logp, rl_batch(t([[True]]), advantages=t([[2.0]])))
    loss.backward()
    assert loss.item() == 1.0 and logp.grad.item() == -2.0


def test_paper_ppo():
    # GAE across a hole: the row [a, hole, b] gives the advantages of the row [a, b].
    ppo = algorithm(cfg_for("ppo", "token_mean", "algo.kl_coef=0", "algo.whiten_advantages=false"))
    mk = lambda mask, values: rl_batch(t([mask]), reward=t([1.0]), old_logp=torch.zeros(1, len(mask)),
                                       old_values=t([values]))
    holed = ppo.advantages(mk([True, False, False, True], [0.5, 9.0, 9.0, 0.2])).tokens
    plain = ppo.advantages(mk([True, True], [0.5, 0.2])).tokens
    # by hand, gamma .9, lambda .8: delta_1 = 1 - .2 = .8; delta_0 = 0 + .9 * .2 - .5 = -.32;
    # A_1 = .8, A_0 = -.32 + .72 * .8 = .256
    assert torch.allclose(plain, t([[0.256, 0.8]])) and torch.allclose(holed, t([[0.256, 0.0, 0.0, 0.8]]))


def test_paper_reinforce_pp():
    # one row of 2 tokens, score 1, KL_t = log pi_old - log pi_ref = [.5, -1], beta .1 (k1, in the reward):
    # r = [-.05, 1 + .1] -> returns to go [1.05, 1.1]; a second row of 1 token, score 0, KL 0 -> [0]
    # whitened over the 3 tokens: mean 2.15 / 3 = .71667, population variance
    # (.33333^2 + .38333^2 + .71667^2) / 3 = .25722, std .50717 -> [.6572, .7558, -1.4131]
    algo = algorithm(cfg_for("reinforce_pp"))
    b = rl_batch(t([[True, True], [True, False]]), reward=t([1.0, 0.0]), old_logp=t([[-1.0, -2.0], [-1.0, 0.0]]),
                 ref_logp=t([[-1.5, -1.0], [-1.0, 0.0]]))
    rtg = torch.tensor([1.05, 1.1, 0.0])
    white = (rtg - rtg.mean()) / (rtg.var(unbiased=False).sqrt() + 1e-6)
    assert torch.allclose(algo.advantages(b).tokens[b.completion_mask], white, atol=1e-5)
    assert torch.allclose(white, t([0.6572, 0.7558, -1.4131]), atol=1e-4)


def test_paper_grpo():
    # [1, 0, 0, 1]: mean .5, unbiased std sqrt(4 * .25 / 3) = .57735 -> +-.86603
    _, adv = one_group("grpo", [1.0, 0.0, 0.0, 1.0])
    assert torch.allclose(adv, t([0.86603, -0.86603, -0.86603, 0.86603]), atol=1e-4)


def test_paper_rloo():
    # [3, 1, 2]: 3 - (1 + 2) / 2 = 1.5; 1 - (3 + 2) / 2 = -1.5; 2 - (3 + 1) / 2 = 0
    _, adv = one_group("rloo", [3.0, 1.0, 2.0])
    assert torch.allclose(adv, t([1.5, -1.5, 0.0]))


def test_paper_dapo():
    dapo = algorithm(tiny_cfg("algo.name=dapo", "algo.loss_agg=seq_mean_token_mean"))
    assert (dapo.clip_eps_low, dapo.clip_eps_high) == (0.2, 0.28)
    # token-level: rows of 2 and 1 tokens, A = 1, 1 | -2, ratio 1: (-1 - 1 + 2) / 3 = 0 (a per-sequence
    # mean would give (-1 + 2) / 2 = .5)
    loss, _ = dapo.loss(torch.zeros(2, 2), rl_batch(t([[True, True], [True, False]]), old_logp=torch.zeros(2, 2),
                                                      advantages=t([[1.0, 1.0], [-2.0, 0.0]])))
    assert loss.item() == 0.0


def test_paper_dr_grpo():
    algo, adv = one_group("dr_grpo", [3.0, 1.0])
    assert torch.allclose(adv, t([1.0, -1.0]))  # no /std
    # 2 rows of 1 and 3 tokens, ratio 1, A = 1: sum -4 / (2 * max_new_tokens 6) = -1/3, whatever the lengths
    loss, _ = algo.loss(torch.zeros(2, 3), rl_batch(t([[True, False, False], [True, True, True]]),
                                                    old_logp=torch.zeros(2, 3), ref_logp=torch.zeros(2, 3),
                                                    advantages=t([[1.0, 0, 0], [1.0, 1.0, 1.0]])))
    assert math.isclose(loss.item(), -1 / 3, rel_tol=1e-6)


def test_paper_gspo():
    gspo = algorithm(tiny_cfg("algo.name=gspo"))
    assert (gspo.clip_eps_low, gspo.clip_eps_high) == (3e-4, 4e-4)
    # one sequence of 2 tokens with log-ratios .0001, .0003: s = exp(.0002) = 1.0002 (inside the range), A = 1
    # loss = -s = -1.0002; d loss / d logp_t = -s / |y| = -.5001 on each token
    logp = t([[0.0001, 0.0003]], requires_grad=True)
    loss, _ = gspo.loss(logp, rl_batch(t([[True, True]]), old_logp=torch.zeros(1, 2), advantages=t([[1.0, 1.0]])))
    loss.backward()
    assert math.isclose(loss.item(), -math.exp(0.0002), rel_tol=1e-6)
    assert torch.allclose(logp.grad, torch.full((1, 2), -math.exp(0.0002) / 2))


def test_paper_cispo():
    # one token, ratio e^.25 = 1.284 inside [0.9, 1.3] (eps .1 / .3), A = 1, log pi = -.75:
    # loss = -1.284 * 1 * -.75 = .963; d/dlogp = -1.284 (the weight is a constant: no 1.284 * -.75 term)
    cispo = algorithm(cfg_for("cispo", "token_mean", "algo.kl_coef=0"))
    logp = t([[-0.75]], requires_grad=True)
    loss, _ = cispo.loss(logp, rl_batch(t([[True]]), old_logp=t([[-1.0]]), advantages=t([[1.0]])))
    loss.backward()
    assert math.isclose(loss.item(), math.exp(0.25) * 0.75, rel_tol=1e-6)
    assert math.isclose(logp.grad.item(), -math.exp(0.25), rel_tol=1e-6)


def test_paper_distill():
    # two tokens: student log pi_old [-1, -2], teacher [-1.5, -0.5] -> reverse-KL samples [.5, -1.5],
    # advantages [-.5, 1.5] (the teacher likes token 2 more than the student does: push it up).
    # At ratio 1 the loss is -mean(A) = -(−.5 + 1.5) / 2 = -.5; d loss / d log pi = -A / 2 = [.25, -.75].
    distill = algorithm(cfg_for("distill"))
    b = rl_batch(t([[True, True]]), old_logp=t([[-1.0, -2.0]]), ref_logp=t([[-1.5, -0.5]]), reward=t([1.0]))
    out = distill.advantages(b)
    assert torch.allclose(out.tokens, t([[-0.5, 1.5]])) and math.isclose(out.metrics["distill/reverse_kl"], -0.5)
    b.advantages = out.tokens
    logp = t([[-1.0, -2.0]], requires_grad=True)
    loss, _ = distill.loss(logp, b)
    loss.backward()
    assert math.isclose(loss.item(), -0.5, rel_tol=1e-6) and torch.allclose(logp.grad, t([[0.25, -0.75]]))


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_rewards_near_float32_max_give_finite_advantages(name):
    """A finite float32 reward near the format's max (3.4e38) squares to inf inside a float32 std: every
    group's advantages came out NaN and every update was skipped. The statistics run in float64 now, so
    a method that divides by a std gives the same advantages at any reward scale, and one that does not
    gives them scaled, finite while they fit float32. PPO's value baseline and REINFORCE++'s per-token KL
    reward (~0.1) vanish beside 1e38, so those two are held to finiteness only."""
    scale = 1e38
    algo, big = algorithm(cfg_for(name)), algorithm(cfg_for(name))
    small_b, big_b = batch(), batch()
    big_b.reward = REWARD * scale
    want, got = algo.advantages(small_b).tokens, big.advantages(big_b).tokens
    assert torch.isfinite(got).all(), (name, got)
    if name not in ("ppo", "reinforce_pp"):
        same = torch.allclose(got, want, rtol=1e-4, atol=1e-5)
        scaled = torch.allclose(got / scale, want, rtol=1e-4, atol=1e-5)
        assert same or scaled, (name, got, want)
