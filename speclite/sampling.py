"""Sampling parameters, logit warping (temperature, top-k, top-p) and inverse-CDF sampling."""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field

import torch

from speclite import kernels
from speclite.kernels import cpu_sampling
from speclite.kernels.cpu_threads import one_thread


GREEDY_BELOW = 1e-5  # a temperature below this samples the argmax: greedy decoding


@dataclass
class SamplingParams:
    max_new_tokens: int = 256
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)  # more tokens that end the answer (kept in it, as EOS)
    max_tokens: InitVar[int | None] = None  # vLLM's name for max_new_tokens, taken as it

    def __post_init__(self, max_tokens):
        from speclite.request import check_sampling  # imported here: speclite.request builds SamplingParams

        if max_tokens is not None:
            self.max_new_tokens = max_tokens
        check_sampling(self)

    @property
    def greedy(self) -> bool:
        # Below this the warp's logits / temperature overflow (NaN probabilities at 1e-38); vLLM's bound too.
        return self.temperature < GREEDY_BELOW


def warp(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities [..., V] (float32) after temperature, then top-k, then top-p.

    Target and draft distributions must both pass through this same function: rejection
    sampling is lossless only when p and q are compared after identical warping. On the CPU the
    kernels' warp (kernels.cpu_sampling: the numbers of their sampling loops), else torch's (on the
    calling thread: kernels.cpu_threads).
    """
    if cpu_sampling.takes(logits):
        return cpu_sampling.warp(logits, params.temperature, params.top_k, params.top_p)
    with one_thread(logits.device):
        return torch_warp(logits, params)


def torch_warp(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """warp in torch ops: the GPU's, and the reference of the kernels' warp."""
    logits = logits.float() / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the top token always stays).
        before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        sorted_probs = sorted_probs.masked_fill(before >= params.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, uniform: torch.Tensor) -> int:
    """Inverse-CDF draw from probs [V] with one uniform in [0, 1).

    Every sampled token in speclite (plain decode, drafts and the verifiers) is drawn by this same
    fixed-point routine from the request's generator, so the same seed gives the same text
    whichever path drew it.
    """
    if cpu_sampling.takes(probs):
        return cpu_sampling.draw(probs, float(uniform))
    with one_thread(probs.device):
        return int(kernels.sample_probs(probs, uniform))


def uniform(generator: torch.Generator) -> torch.Tensor:
    """One uniform draw in [0, 1) from the request's generator (on its device)."""
    return torch.rand((), generator=generator, device=generator.device)


def uniforms(generator: torch.Generator, n: int) -> torch.Tensor:
    """n uniform draws at once: on the CPU the very numbers of n calls of uniform() (torch draws a
    tensor's values one after the other from the same stream; tested), so a loop that samples n
    tokens in one call draws what its iterations one by one would."""
    return torch.rand(n, generator=generator, device=generator.device)


class Ahead:
    """n uniforms drawn ahead of a call that takes some of them in order: settle(used) leaves the
    generator as if only those had been drawn, so the loop's next draws are what its iterations one
    by one would draw."""

    def __init__(self, generator: torch.Generator, n: int):
        self.generator, self.state = generator, generator.get_state()
        self.values = uniforms(generator, n)

    @classmethod
    def iterations(cls, generator: torch.Generator, room: int, k: int) -> "Ahead":
        """The uniforms of up to 64 speculative iterations of k drafts (2k + 1 each: the drafts', the
        acceptances', the next token's), `room` of them at most (each brings a token)."""
        return cls(generator, min(room, 64) * (2 * k + 1))

    def settle(self, used: int) -> None:
        self.generator.set_state(self.state)
        if used:
            uniforms(self.generator, used)


def argmax(logits: torch.Tensor) -> int:
    """The index of the largest of logits [V] (the first of equals; a NaN counts as largest, as in
    torch.argmax). On the CPU through numpy where it can read the dtype: torch's dispatch costs more
    than the search, and every greedy step of the target and of a draft pays it."""
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float16, torch.float64):
        return int(logits.numpy().argmax())
    return int(torch.argmax(logits))


def row_argmaxes(logits: torch.Tensor) -> list[int]:
    """argmax of every row of logits [T, V], as argmax above (through numpy on the CPU, as there)."""
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float16, torch.float64):
        return logits.numpy().argmax(-1).tolist()
    return logits.argmax(dim=-1).tolist()


def pick(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """The target's own next token: argmax, or one inverse-CDF draw from the warped distribution."""
    if params.greedy:
        return argmax(logits)
    return sample(warp(logits, params), uniform(generator))


def make_generator(seed: int | None, device: torch.device) -> torch.Generator:
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen
