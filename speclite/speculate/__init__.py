"""Speculation methods: proposers, verifiers, the k schedule, and the registry naming them.

Importing this package registers the built-in methods; a new method's module is imported here.
"""

from speclite.speculate import draft_model, eagle3, hybrid, medusa, mtp, naive, pard, prompt_lookup, suffix  # noqa: F401  (they register themselves)
from speclite.speculate import dflash  # noqa: F401  (registered last: the end of the --sp-type list)
from speclite.speculate.base import Proposal, Proposer, RequestContext
from speclite.speculate.registry import (METHODS, BuildContext, Method, Option, build_proposer, get_method,
                                         method_names, method_options, normalize_method, register)

__all__ = ["METHODS", "BuildContext", "Method", "Option", "Proposal", "Proposer", "RequestContext", "build_proposer",
           "get_method", "method_names", "method_options", "normalize_method", "register"]
