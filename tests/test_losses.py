"""Policy losses: hand-computed PPO / GSPO values and gradients, masking, dual clip, KL, entropy."""

from __future__ import annotations

import math

import pytest
import torch

from drmas_trainer.losses import agg_loss, kl_penalty, masked_mean, policy_loss

LN = math.log


def leaf(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, requires_grad=True)


def grad_of(loss: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    (g,) = torch.autograd.grad(loss, x)
    return g


# ------------------------------------------------------------------------------------------------
# PPO
# ------------------------------------------------------------------------------------------------
#
# row 0, A = +1, ratios r = [1.5, 0.5, 1.1]:
#   l1 = -r            = [-1.5, -0.5, -1.1]
#   l2 = -clip(r, .8, 1.2) = [-1.2, -0.8, -1.1]
#   max(l1, l2)        = [-1.2, -0.5, -1.1]      clip active (l2 > l1) on token 0 only
# row 1, A = -1, ratios r = [1.5, 0.5, 5.0]:
#   l1 = r             = [1.5, 0.5, 5.0]
#   l2 = clip(r)       = [1.2, 0.8, 1.2]
#   max(l1, l2)        = [1.5, 0.8, 5.0]         clip active on token 1
#   dual clip: min(., -A * 3 = 3) = [1.5, 0.8, 3.0]   dual clip active on token 2
# token-mean = (-1.2 - 0.5 - 1.1 + 1.5 + 0.8 + 3.0) / 6 = 2.5 / 6 = 0.41667
# gradient d loss / d logp_t = (1/6) * (-A * r_t) on unclipped tokens, 0 on clipped ones:
#   row 0: [0, -0.5/6, -1.1/6]     row 1: [1.5/6, 0, 0]
PPO_RATIOS = [[1.5, 0.5, 1.1], [1.5, 0.5, 5.0]]
PPO_ADV = torch.tensor([1.0, -1.0])
PPO_OLD = torch.full((2, 3), -1.0)


def ppo_logp() -> torch.Tensor:
    return leaf([[-1.0 + LN(r) for r in row] for row in PPO_RATIOS])


def test_ppo_hand_computed_value_and_gradient():
    logp = ppo_logp()
    loss, met = policy_loss(logp, PPO_OLD, PPO_ADV, torch.ones(2, 3, dtype=torch.bool))
    assert loss.item() == pytest.approx(2.5 / 6, rel=1e-6)
    assert met["pg_loss"] == pytest.approx(2.5 / 6, rel=1e-6)
    assert met["pg_clipfrac"] == pytest.approx(2 / 6)
    assert met["pg_clipfrac_lower"] == pytest.approx(1 / 6)
    assert met["ratio_max"] == pytest.approx(5.0, rel=1e-6)
    assert met["ratio_mean"] == pytest.approx(sum(PPO_RATIOS[0] + PPO_RATIOS[1]) / 6, rel=1e-6)
    # approx KL to old = mean(old - logp) = -mean(log r)
    assert met["ppo_kl"] == pytest.approx(-sum(LN(r) for row in PPO_RATIOS for r in row) / 6, rel=1e-5)
    want = torch.tensor([[0.0, -0.5 / 6, -1.1 / 6], [1.5 / 6, 0.0, 0.0]])
    assert torch.allclose(grad_of(loss, logp), want, atol=1e-6)


def test_dual_clip_engages_only_for_negative_advantages():
    # large ratio r = 5, A = -2: plain PPO loss = -A * r = 10, dual clip caps it at -A * 3 = 6
    logp = leaf([[LN(5.0)]])
    old = torch.zeros(1, 1)
    mask = torch.ones(1, 1, dtype=torch.bool)
    loss, met = policy_loss(logp, old, torch.tensor([-2.0]), mask)
    assert loss.item() == pytest.approx(6.0, rel=1e-6)
    assert met["pg_clipfrac_lower"] == 1.0
    assert grad_of(loss, logp).item() == 0.0  # capped: constant in logp
    loss_off, met_off = policy_loss(logp, old, torch.tensor([-2.0]), mask, dual_clip=None)
    assert loss_off.item() == pytest.approx(10.0, rel=1e-6) and met_off["pg_clipfrac_lower"] == 0.0
    assert grad_of(loss_off, logp).item() == pytest.approx(10.0, rel=1e-6)  # d(-A e^x)/dx = 2 * 5
    # A > 0 with the same ratio: clipped at 1 + 0.2, no dual clip: loss = -2 * 1.2
    loss_pos, met_pos = policy_loss(logp, old, torch.tensor([2.0]), mask)
    assert loss_pos.item() == pytest.approx(-2.4, rel=1e-6) and met_pos["pg_clipfrac_lower"] == 0.0
    with pytest.raises(ValueError):
        policy_loss(logp, old, torch.tensor([1.0]), mask, dual_clip=0.5)


def test_aggregations_hand_computed():
    # per-token losses with ratio 1 are just -A: row 0 A=1 over 3 tokens, row 1 A=-2 over 1 token,
    # row 2 has no valid token.
    logp = leaf([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]], dtype=torch.bool)
    adv = torch.tensor([1.0, -2.0, 7.0])
    old = torch.zeros(3, 3)
    # token-mean: (-1 - 1 - 1 + 2) / 4 = -0.25
    assert policy_loss(logp, old, adv, mask, agg="token-mean")[0].item() == pytest.approx(-0.25)
    # seq-mean-token-sum: rows -3 and +2, empty row excluded -> (-3 + 2) / 2 = -0.5
    assert policy_loss(logp, old, adv, mask, agg="seq-mean-token-sum")[0].item() == pytest.approx(-0.5)
    # seq-mean-token-mean: rows -1 and +2 -> 0.5
    assert policy_loss(logp, old, adv, mask, agg="seq-mean-token-mean")[0].item() == pytest.approx(0.5)
    with pytest.raises(ValueError):
        policy_loss(logp, old, adv, mask, agg="sum")


# ------------------------------------------------------------------------------------------------
# GSPO
# ------------------------------------------------------------------------------------------------
#
# row 0, A = +1, log ratios [0.1, -0.3, (masked)]: mean -0.1 -> s = e^-0.1 = 0.904837
#   l1 = -s = -0.904837, l2 = -clip(s, 1 - 3e-4, 1 + 4e-4) = -0.9997 -> max = l1 (not clipped)
# row 1, A = -0.5, log ratios [0.2, 0.4, 0.0]: mean 0.2 -> s = e^0.2 = 1.221403
#   l1 = 0.5 * s = 0.610701, l2 = 0.5 * 1.0004 = 0.5002 -> max = l1 (not clipped)
# seq-mean-token-mean = (-0.904837 + 0.610701) / 2 = -0.147068
# sequence-level gradient: d loss / d logp_t = (1/2) * (-A) * s / n_valid
#   row 0: -0.5 * 0.904837 / 2 = -0.226209 on its 2 valid tokens; row 1: 0.25 * 1.221403 / 3 = 0.101784
GSPO_LOG_RATIO = [[0.1, -0.3, 9.0], [0.2, 0.4, 0.0]]
GSPO_MASK = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
GSPO_ADV = torch.tensor([1.0, -0.5])


def test_gspo_hand_computed_value_and_gradient():
    logp = leaf(GSPO_LOG_RATIO)
    loss, met = policy_loss(logp, torch.zeros(2, 3), GSPO_ADV, GSPO_MASK, mode="gspo")
    s0, s1 = math.exp(-0.1), math.exp(0.2)
    assert loss.item() == pytest.approx((-s0 + 0.5 * s1) / 2, rel=1e-6)
    assert met["pg_clipfrac"] == 0.0
    assert met["ratio_mean"] == pytest.approx((s0 + s1) / 2, rel=1e-6)
    assert met["ratio_max"] == pytest.approx(s1, rel=1e-6)
    want = torch.tensor([[-0.5 * s0 / 2, -0.5 * s0 / 2, 0.0], [0.25 * s1 / 3] * 3])
    assert torch.allclose(grad_of(loss, logp), want, atol=1e-6)


def sequence_level_gspo(logp, old, adv, mask, lo=3e-4, hi=4e-4):
    """GSPO written directly at sequence level (independent of the token-level trick)."""
    m = mask.float()
    s = torch.exp(((logp - old) * m).sum(-1) / m.sum(-1))
    per_row = torch.maximum(-adv * s, -adv * s.clamp(1 - lo, 1 + hi))
    return per_row.mean()


def test_gspo_equals_the_sequence_level_objective():
    g = torch.Generator().manual_seed(1)
    old = torch.randn(6, 9, generator=g)
    # per-row shifts of the log ratio: some rows inside the tiny clip range, some out, both sides
    shift = torch.tensor([-1e-3, -1e-4, 0.0, 1e-4, 1e-3, 5e-2])[:, None]
    base = old + shift + 1e-5 * torch.randn(6, 9, generator=g)
    mask = torch.rand(6, 9, generator=g) < 0.7
    mask[:, 0] = True
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, -2.0, 1.5])
    a = base.clone().requires_grad_(True)
    b = base.clone().requires_grad_(True)
    loss, met = policy_loss(a, old, adv, mask, mode="gspo")
    ref = sequence_level_gspo(b, old, adv, mask)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5, abs=1e-7)
    assert 0.0 < met["pg_clipfrac"] < 1.0  # both regimes present
    assert torch.allclose(grad_of(loss, a), grad_of(ref, b), atol=1e-6)


def test_gspo_default_clip_range_and_override():
    # one token, log ratio 0.001 -> s = 1.0010005; A = 1
    logp = leaf([[0.001]])
    old, mask, adv = torch.zeros(1, 1), torch.ones(1, 1, dtype=torch.bool), torch.tensor([1.0])
    loss, met = policy_loss(logp, old, adv, mask, mode="gspo")
    assert loss.item() == pytest.approx(-(1 + 4e-4), rel=1e-6)  # clipped at 1 + 4e-4
    assert met["pg_clipfrac"] == 1.0
    loss_wide, _ = policy_loss(logp, old, adv, mask, mode="gspo", clip_high=0.2)
    assert loss_wide.item() == pytest.approx(-math.exp(0.001), rel=1e-6)
    # PPO with the same inputs uses 0.2: not clipped
    assert policy_loss(logp, old, adv, mask)[0].item() == pytest.approx(-math.exp(0.001), rel=1e-6)
    # lower side: log ratio -0.001, A = -1 -> clipped at 1 - 3e-4: loss = 1 * (1 - 3e-4)
    low = leaf([[-0.001]])
    assert policy_loss(low, old, torch.tensor([-1.0]), mask, mode="gspo")[0].item() == pytest.approx(1 - 3e-4, rel=1e-6)


# ------------------------------------------------------------------------------------------------
# masking, empty rows, gradients
# ------------------------------------------------------------------------------------------------


def random_inputs(seed: int = 0, b: int = 4, t: int = 7):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g) * 3
    logp = old + 0.3 * torch.randn(b, t, generator=g)
    mask = torch.rand(b, t, generator=g) < 0.7
    mask[:, 0] = True
    mask[:, -1] = False  # the perturbed position
    adv_tok = torch.randn(b, t, generator=g)
    adv_row = torch.randn(b, generator=g)
    entropy = torch.rand(b, t, generator=g)
    ref = old + 0.1 * torch.randn(b, t, generator=g)
    return logp, old, adv_row, adv_tok, mask, entropy, ref


CONFIGS = [
    dict(mode="ppo"),
    dict(mode="ppo", agg="seq-mean-token-sum"),
    dict(mode="ppo", agg="seq-mean-token-mean", dual_clip=None),
    dict(mode="gspo"),
    dict(mode="gspo", agg="token-mean"),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(str(v) for v in c.values()))
@pytest.mark.parametrize("per_token_adv", [False, True])
@pytest.mark.parametrize("junk", [50.0, -1e4, float("inf"), float("nan")])
def test_masked_token_changes_nothing(cfg, per_token_adv, junk):
    logp0, old0, adv_row, adv_tok, mask, entropy0, ref0 = random_inputs()

    def run(perturb: bool):
        logp, old, entropy, ref = logp0.clone(), old0.clone(), entropy0.clone(), ref0.clone()
        adv = adv_tok.clone() if per_token_adv else adv_row
        if perturb:
            for x in (logp, old, entropy, ref) + ((adv,) if per_token_adv else ()):
                x[:, -1] = junk
        logp.requires_grad_(True)
        ent = entropy.requires_grad_(True)
        loss, met = policy_loss(logp, old, adv, mask, entropy=ent, entropy_coef=0.01, ref_logp=ref, kl_coef=0.1, **cfg)
        gl, ge = torch.autograd.grad(loss, (logp, ent))
        return loss.detach(), met, gl, ge

    loss_a, met_a, gl_a, ge_a = run(False)
    loss_b, met_b, gl_b, ge_b = run(True)
    assert torch.equal(loss_a, loss_b)
    assert torch.equal(gl_a, gl_b) and torch.equal(ge_a, ge_b)
    assert met_a == met_b
    assert torch.isfinite(gl_a).all() and gl_a.abs().sum() > 0


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(str(v) for v in c.values()))
def test_rows_without_valid_tokens_do_not_give_nan(cfg):
    logp, old, adv_row, _, mask, entropy, ref = random_inputs(seed=3)
    mask[1] = False  # one empty row
    x = logp.clone().requires_grad_(True)
    loss, met = policy_loss(x, old, adv_row, mask, entropy=entropy, entropy_coef=0.01, ref_logp=ref, kl_coef=0.1, **cfg)
    g = grad_of(loss, x)
    assert torch.isfinite(loss) and torch.isfinite(g).all() and all(math.isfinite(v) for v in met.values())
    assert g[1].abs().sum() == 0 and g.abs().sum() > 0
    # dropping the empty row changes nothing
    keep = torch.tensor([0, 2, 3])
    y = logp[keep].clone().requires_grad_(True)
    loss2, met2 = policy_loss(y, old[keep], adv_row[keep], mask[keep], entropy=entropy[keep], entropy_coef=0.01, ref_logp=ref[keep], kl_coef=0.1, **cfg)
    assert loss2.item() == pytest.approx(loss.item(), rel=1e-6)
    assert torch.allclose(grad_of(loss2, y), g[keep], atol=1e-7)
    # a batch with no valid token at all: loss 0, zero grads, neutral metrics
    z = logp.clone().requires_grad_(True)
    loss0, met0 = policy_loss(z, old, adv_row, torch.zeros_like(mask), **cfg)
    assert loss0.item() == 0.0 and torch.equal(grad_of(loss0, z), torch.zeros_like(z))
    assert met0["ratio_mean"] == 1.0 and met0["ratio_max"] == 1.0 and met0["pg_clipfrac"] == 0.0


@pytest.mark.parametrize("mode", ["ppo", "gspo"])
def test_gradients_flow(mode):
    logp, old, adv_row, _, mask, entropy, _ = random_inputs(seed=5)
    x = logp.clone().requires_grad_(True)
    e = entropy.clone().requires_grad_(True)
    loss, _ = policy_loss(x, old, adv_row, mask, mode=mode, clip_low=0.2, clip_high=0.2, entropy=e, entropy_coef=0.01)
    loss.backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    assert torch.isfinite(e.grad).all() and e.grad.abs().sum() > 0
    assert (x.grad[~mask] == 0).all() and (e.grad[~mask] == 0).all()


def test_bf16_logp_is_upcast():
    logp, old, adv_row, _, mask, _, _ = random_inputs(seed=6)
    x = logp.to(torch.bfloat16).requires_grad_(True)
    loss, _ = policy_loss(x, old, adv_row, mask)
    loss.backward()
    assert loss.dtype == torch.float32 and x.grad.dtype == torch.bfloat16 and torch.isfinite(x.grad).all()


# ------------------------------------------------------------------------------------------------
# entropy, KL, helpers, errors
# ------------------------------------------------------------------------------------------------


def test_entropy_and_kl_terms_hand_computed():
    # one token, ratio 1, A = 0 -> pg loss 0
    # logp = ln 0.5, ref = ln 0.25: k1 = ln 2 = 0.693147; k3 = e^(-ln 2) + ln 2 - 1 = 0.193147
    logp = leaf([[LN(0.5)]])
    old, mask, adv = torch.tensor([[LN(0.5)]]), torch.ones(1, 1, dtype=torch.bool), torch.tensor([0.0])
    ref = torch.tensor([[LN(0.25)]])
    ent = torch.tensor([[2.0]])
    loss, met = policy_loss(logp, old, adv, mask, entropy=ent, entropy_coef=0.1, ref_logp=ref, kl_coef=0.5, kl_type="k1")
    assert loss.item() == pytest.approx(-0.1 * 2.0 + 0.5 * LN(2), rel=1e-6)
    assert met["entropy"] == pytest.approx(2.0) and met["kl"] == pytest.approx(LN(2), rel=1e-6)
    assert grad_of(loss, logp).item() == pytest.approx(0.5, rel=1e-6)  # d k1 / d logp = 1
    loss3, met3 = policy_loss(logp, old, adv, mask, ref_logp=ref, kl_coef=0.5)
    assert met3["kl"] == pytest.approx(0.5 + LN(2) - 1, rel=1e-5)
    assert loss3.item() == pytest.approx(0.5 * (0.5 + LN(2) - 1), rel=1e-5)
    # d k3 / d logp = 1 - exp(ref - logp) = 1 - 0.5
    assert grad_of(loss3, logp).item() == pytest.approx(0.5 * 0.5, rel=1e-5)
    assert kl_penalty(torch.tensor(0.0), torch.tensor(-1.0), "k2").item() == pytest.approx(0.5)
    with pytest.raises(ValueError):
        kl_penalty(torch.tensor(0.0), torch.tensor(0.0), "k9")


def test_masked_mean_and_agg_loss():
    x = torch.tensor([[1.0, float("nan"), 3.0], [float("inf"), 5.0, 0.0]])
    m = torch.tensor([[1, 0, 1], [0, 1, 0]])
    assert masked_mean(x, m).item() == pytest.approx(3.0)
    assert masked_mean(x, m, dim=-1).tolist() == pytest.approx([2.0, 5.0])
    assert masked_mean(x, torch.zeros_like(m)).item() == 0.0
    assert agg_loss(x, m, "seq-mean-token-sum").item() == pytest.approx((4.0 + 5.0) / 2)


def test_bad_arguments():
    logp, old, adv_row, _, mask, _, _ = random_inputs()
    with pytest.raises(ValueError, match="ppo"):
        policy_loss(logp, old, adv_row, mask, mode="grpo")
    with pytest.raises(ValueError):
        policy_loss(logp, old, adv_row[:2], mask)
    with pytest.raises(ValueError):
        policy_loss(logp, old, adv_row, mask, kl_coef=0.1)
    with pytest.raises(ValueError):
        policy_loss(logp, old, adv_row, mask, entropy_coef=0.1)
    with pytest.raises(ValueError):
        policy_loss(logp, old[:, :3], adv_row, mask)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["ppo", "gspo"])
def test_cuda_matches_cpu(mode):
    logp, old, adv_row, _, mask, entropy, ref = random_inputs(seed=8)
    kw = dict(mode=mode, entropy_coef=0.01, kl_coef=0.1)
    x = logp.clone().requires_grad_(True)
    loss, met = policy_loss(x, old, adv_row, mask, entropy=entropy, ref_logp=ref, **kw)
    xg = logp.cuda().requires_grad_(True)
    loss_g, met_g = policy_loss(xg, old.cuda(), adv_row.cuda(), mask.cuda(), entropy=entropy.cuda(), ref_logp=ref.cuda(), **kw)
    assert loss_g.item() == pytest.approx(loss.item(), rel=1e-5, abs=1e-7)
    assert torch.allclose(grad_of(loss_g, xg).cpu(), grad_of(loss, x), atol=1e-6)
    assert met_g == pytest.approx(met, rel=1e-5, abs=1e-7)
