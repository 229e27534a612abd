"""A chunked cross-entropy over the LM head: the [B, T, V] logits never exist whole (issue 30).

`chunked_lm_loss(hidden, weight, mask, tokens)` is the same next-token loss as `model.lm_loss` on
`hidden @ weight.T (+ mask)`, computed `CHUNK_TOKENS` rows at a time. The forward of each chunk also
computes that chunk's gradients, as Liger's fused linear cross-entropy does: d(logits) = softmax −
one-hot is known as soon as the chunk's log-sum-exp is, so the chunk's logits are used once and freed,
and backward only scales the two stored gradients (d hidden [N, C], d weight [V, C] in fp32) by the
incoming gradient: no logits are recomputed. The loss is a mean, so the stored gradients are exact for
any upstream scale (GradScaler's, the micro-step division).

Precision follows autocast as the plain path does: the GEMMs run in autocast's dtype, the softmax and
the loss in fp32; the weight gradient is accumulated over chunks in fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trainlab.gpt.shape import CHUNK_TOKENS

IGNORE = -100
# Tokens per chunk: 4096 × 50304 fp32 logits are 0.8 GiB of temporaries instead of 3.1 GiB per 16K
# tokens for the whole logits and their gradient; big enough that each chunk's GEMMs fill an H100.


def shifted_targets(tokens: torch.Tensor) -> torch.Tensor:
    """Next-token targets [B, T], the last position ignored (as `model.lm_loss`)."""
    targets = torch.full_like(tokens, IGNORE)
    targets[:, :-1] = tokens[:, 1:]
    return targets


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, mask, targets, chunk, dtype):
        n_valid = (targets != IGNORE).sum().clamp_min(1)
        scale = 1.0 / n_valid.to(torch.float32)
        w = weight.to(dtype)
        b = None if mask is None else mask.to(dtype)
        grad_h = torch.empty_like(hidden)
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if weight.requires_grad else None
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk):
            h = hidden[start : start + chunk].to(dtype)
            t = targets[start : start + chunk]
            logits = F.linear(h, w, b).float()  # [n, V] fp32 (no copy when dtype is fp32)
            lse = torch.logsumexp(logits, dim=-1)
            valid = t != IGNORE
            idx = t.clamp_min(0)
            picked = logits.gather(1, idx[:, None]).squeeze(1)
            total += ((lse - picked) * valid).sum()
            g = logits.sub_(lse[:, None]).exp_()  # softmax, in place of the logits
            g[torch.arange(g.shape[0], device=g.device), idx] -= 1.0
            g.mul_((valid.to(torch.float32) * scale)[:, None])
            g = g.to(dtype)
            grad_h[start : start + chunk] = (g @ w).to(hidden.dtype)
            if grad_w is not None:
                grad_w += (g.t() @ h).float()
        ctx.save_for_backward(grad_h, grad_w)
        ctx.weight_dtype = weight.dtype
        return total * scale

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w = ctx.saved_tensors
        gw = None if grad_w is None else (grad_w * grad_out).to(ctx.weight_dtype)
        return grad_h * grad_out.to(grad_h.dtype), gw, None, None, None, None


def chunked_lm_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    mask: torch.Tensor | None,
    tokens: torch.Tensor,
    chunk: int = CHUNK_TOKENS,
) -> torch.Tensor:
    """Mean next-token cross-entropy of `hidden` [B, T, C] under the LM head `weight` [V, C] (+ `mask`
    [V], -inf on padding columns), `chunk` tokens at a time. Under autocast the GEMMs run in its dtype."""
    dev = hidden.device.type
    dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else hidden.dtype
    C = hidden.shape[-1]
    with torch.autocast(dev, enabled=False):
        return _LinearCrossEntropy.apply(
            hidden.reshape(-1, C), weight, mask, shifted_targets(tokens).reshape(-1), chunk, dtype
        )
