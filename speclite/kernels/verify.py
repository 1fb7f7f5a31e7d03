"""Speculative verification of one sequence: rejection sampling (Leviathan et al.; a Triton kernel
on a GPU) and greedy (torch's ops everywhere).

Sampling by inverse CDF is done on fixed-point masses (each probability as an int64 count of
2**-32 units): integer prefix sums are exact in any order, so the torch path and the Triton
kernel (which scans in blocks) pick the same token for the same uniform. The resolution is
finer than the fp32 uniform's own 2**-24 grid, and unlike an fp32 cumsum a small-probability
token late in the vocabulary keeps its mass.
"""

from typing import Optional

import torch

from .dispatch import use_triton

MASS_ONE = 2.0**32  # fixed-point unit for probabilities
UNIFORM_ONE = 2.0**24  # fp32 uniforms in [0, 1) are read as multiples of 2**-24
UNIFORM_BITS = 24


def _as_uniform(u, device) -> torch.Tensor:
    return torch.as_tensor(u, dtype=torch.float32, device=device).reshape(())


def sample_fixed_point(mass: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse CDF over int64 masses [V]: the first index whose prefix sum exceeds u * total."""
    total = mass.sum()
    threshold = ((u * UNIFORM_ONE).to(torch.int64) * total) >> UNIFORM_BITS
    return (mass.cumsum(0) <= threshold).sum().clamp(max=mass.numel() - 1)


def sample_probs(probs: torch.Tensor, uniform) -> torch.Tensor:
    """One inverse-CDF draw from probs [V] (any non-negative weights) on the fixed-point grid."""
    mass = (probs.float() * MASS_ONE).to(torch.int64)
    return sample_fixed_point(mass, _as_uniform(uniform, probs.device))


def verify_rejection_torch(draft_tokens: torch.Tensor, draft_probs: Optional[torch.Tensor], target_probs: torch.Tensor,
                           uniforms: torch.Tensor, residual_uniform) -> tuple:
    """Reference and CPU path; no host synchronisation, so it also suits CUDA graphs."""
    k = draft_tokens.numel()
    device = target_probs.device
    positions = torch.arange(k, device=device)
    p_draft = target_probs[positions, draft_tokens]
    q_draft = draft_probs[positions, draft_tokens].float() if draft_probs is not None else torch.ones_like(p_draft)
    # u < min(1, p/q) written without the division, identically in both paths.
    accepted = uniforms.float() * q_draft < p_draft.float()
    n = accepted.to(torch.int64).cumprod(0).sum()

    p_row = target_probs[n].float()
    if k == 0:
        residual = p_row
    else:
        n_draft = n.clamp(max=k - 1)  # row n == k has no draft: the residual is unused then
        if draft_probs is not None:
            q_row = draft_probs[n_draft].float()
        else:
            q_row = torch.nn.functional.one_hot(draft_tokens[n_draft], p_row.numel()).to(p_row.dtype)
        residual = torch.clamp(p_row - q_row, min=0.0)
    p_mass = (p_row * MASS_ONE).to(torch.int64)
    r_mass = (residual * MASS_ONE).to(torch.int64)
    # All-zero residual (p == q numerically): sample p itself, as at the bonus position.
    use_residual = (n < k) & (r_mass.sum() > 0)
    mass = torch.where(use_residual, r_mass, p_mass)
    return n, sample_fixed_point(mass, _as_uniform(residual_uniform, device))


def verify_rejection(draft_tokens: torch.Tensor, draft_probs: Optional[torch.Tensor], target_probs: torch.Tensor,
                     uniforms: torch.Tensor, residual_uniform) -> tuple:
    """(num_accepted, next_token) as int64 0-dim tensors.

    Accept draft i while uniforms[i] < min(1, p_i(x_i) / q_i(x_i)); at the first rejection n sample
    the correction from norm(max(0, p_n - q_n)) with residual_uniform, or the bonus token from
    target_probs[k] when all k are accepted. draft_probs None means a one-hot (deterministic) draft.
    """
    if use_triton(target_probs):
        from . import verify_triton

        return verify_triton.verify_rejection(draft_tokens, draft_probs, target_probs, uniforms, residual_uniform)
    return verify_rejection_torch(draft_tokens, draft_probs, target_probs, uniforms, residual_uniform)


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> tuple:
    """(num_accepted, next_token) as int64 0-dim tensors: accept while draft == argmax (lowest index
    on ties). torch's ops on every device: its argmax spreads the rows over the GPU, where a
    one-program Triton kernel took 0.18-1.5 ms on an H200 against torch's 0.05 (RESULTS.md, GPU)."""
    k = draft_tokens.numel()
    best = target_logits.argmax(dim=-1)
    n = (draft_tokens == best[:k]).to(torch.int64).cumprod(0).sum()
    return n, best[n]
