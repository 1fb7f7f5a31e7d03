"""The kernels a decode step and a verification would launch on a GPU, counted on a machine without one.

The decoder runs on CPU tensors with its GPU routes switched on (the C kernels off, speclite's Triton
kernels, the GEMMs' included, run by Triton's interpreter): every Triton launch is counted by name,
and every torch op the decoder itself dispatches that is a kernel on a GPU (views and allocations are
not) by a dispatch mode. torch's own composite ops count once here (a GPU may launch several for one:
SDPA's math backend, for instance). A small model of the config's family (two layers, narrow widths)
is enough: the counts are per layer and per step.

    python benchmarks/gpu_launches.py [--config qwen2.5-7b] [--quant none|fp8-block|w8a8|int4]
"""

import argparse
import collections
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

# Ops that launch nothing on a GPU: views, metadata and allocation.
FREE = {"to", "promote_types", "view", "_unsafe_view", "reshape", "t", "transpose", "unsqueeze", "squeeze", "expand",
        "slice", "select", "as_strided", "split", "split_with_sizes", "detach", "alias", "_reshape_alias", "narrow",
        "permute", "chunk", "empty", "empty_like", "empty_strided", "lift_fresh", "_local_scalar_dense"}


class Launches(TorchDispatchMode):
    """Counts the torch ops dispatched while no Triton kernel runs (the interpreter's own ops are not
    the decoder's) and, through count_triton, the Triton launches."""

    def __init__(self):
        super().__init__()
        self.counts, self.inside = collections.Counter(), False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in FREE and not self.inside:
            self.counts["torch " + name] += 1
        return func(*args, **(kwargs or {}))

    def count_triton(self):
        import triton.runtime.interpreter as interpreter

        run, mode = interpreter.InterpretedFunction.run, self

        def counted(fn, *args, **kwargs):
            mode.counts["triton " + fn.fn.__name__] += 1
            mode.inside = True
            try:
                return run(fn, *args, **kwargs)
            finally:
                mode.inside = False

        interpreter.InterpretedFunction.run = counted


def small_model(config: str, quant: str):
    """Two narrow layers of the config's family, quantized at load as `--quant` would on a GPU (its
    modules' kernel paths, here on CPU tensors), q/k/v and gate/up joined as on a GPU."""
    from speclite.model.decoder import join_projections
    from speclite.quant import linear
    from speclite.quant.quantize import quantize_model
    from speclite.synthetic import narrow_transformer

    model = narrow_transformer(config, num_hidden_layers=2, hidden_size=256, intermediate_size=512,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=128, vocab_size=512)
    if quant != "none":
        linear.use_kernels = lambda device, kernels=None: True
        quantize_model(model, quant, group_size=64)
    join_projections(model)
    return model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="qwen2.5-7b", help="a bundled config's family (synthetic.py)")
    parser.add_argument("--quant", default="none", choices=["none", "fp8-block", "w8a8", "int4"])
    args = parser.parse_args()
    from speclite.kernels import cpu_gemm, cpu_layer_ops, fp8_block, gpu_layer_ops, int8, w4a16

    cpu_layer_ops.takes = cpu_gemm.takes = lambda x: False  # the C kernels off: the GPU routes
    gpu_layer_ops.takes = lambda x: True
    for module in (fp8_block, int8, w4a16):  # the quantized GEMMs' Triton kernels, not their torch references
        module.use_triton = lambda x: True
    fp8_block.fp8_dot_supported = lambda x: True
    import speclite.kernels as kernels
    from speclite.kernels import dense_triton, tuning

    cpu_linear = kernels.linear

    def gpu_linear(x, weight, bias=None):  # kernels.linear's GPU route: decode and verification rows in Triton
        if x.dim() == 2 and x.shape[0] <= tuning.GEMV_ROWS and weight.dtype == x.dtype:
            return dense_triton.dense_gemm(x, weight, bias)
        return cpu_linear(x, weight, bias)

    kernels.linear = gpu_linear
    model = small_model(args.config, args.quant)
    layers = model.args.num_layers
    cache = model.new_cache(512)
    mode = Launches()
    mode.count_triton()
    with torch.inference_mode():
        model.step(torch.arange(5), cache)  # a prompt
        for label, t in (("one-row CUDA-graph step", 1), ("5-row CUDA-graph verification", 5)):
            slots = torch.arange(cache.length, cache.length + t)
            tokens, tree = torch.arange(t), torch.ones(t, t, dtype=torch.bool).tril()
            mode.counts.clear()
            with mode:
                model.forward_static(tokens, slots, slots, tree, cache, span=256)
            report(label, mode.counts, layers)
        tokens = torch.arange(1)
        mode.counts.clear()
        with mode:
            model.step(tokens, cache)
        report("one-row dynamic step", mode.counts, layers)
    return 0


def report(label: str, counts: collections.Counter, layers: int) -> None:
    total = sum(counts.values())
    print(f"{label}: {total} kernels ({layers} layers)")
    for name, n in sorted(counts.items()):
        print(f"  {n:3d}  {name}")


if __name__ == "__main__":
    sys.exit(main())
