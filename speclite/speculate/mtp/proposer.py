"""`mtp`: a multi-token-prediction module drafts a chain from the target's final states.

The drafting is EAGLE-3's (speclite.speculate.eagle3.proposer): one module-cache entry per
committed position p pairs the target's state at p with the token at p + 1, drafts feed the
module's own output state forward, and the draft entries are dropped on the next observe. Only
the state differs: the target's final normed hidden state (what its lm_head reads), which is what
vLLM and SGLang hand their MTP modules and what MiMo's modelling feeds its first MTP layer.
"""

from __future__ import annotations

import torch

from speclite.model.step import Step, Wants
from speclite.speculate.eagle3.proposer import Eagle3Proposer


class MTPProposer(Eagle3Proposer):
    name = "mtp"

    def _wants(self) -> Wants:
        return Wants(final=True)

    def _states(self, step: Step) -> torch.Tensor:
        return step.final

    def _kernel_states(self) -> tuple:
        return None, []  # greedy_run's C loop hands the module the target's final normed states
