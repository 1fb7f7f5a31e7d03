"""speclite's CPU kernels (int4, int8 W8A8, bf16/f16) on every ISA path the machine runs, against
float64 math of the same quantization; rows independent of the batch; the integer products the same
on every path; and the quantized linears wired to them."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from conftest import torch_threads

from speclite.kernels import cpu_build, cpu_gemm, cpu_layer_ops, linear
from speclite.quant.int4 import Int4Weight
from speclite.model.decoder import Linear, project
from speclite.quant.linear import Int4Linear, Int8Linear


def _cpu_has_avx2() -> bool:
    try:
        flags = set(next(l for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("flags")).split())
    except (OSError, StopIteration):
        return False
    return {"avx2", "fma", "f16c"} <= flags


needs_kernels = pytest.mark.skipif(not cpu_gemm.available(), reason="no AVX2 CPU or no C++ compiler here")
SHAPES = [(1, 37, 96), (5, 64, 200), (9, 300, 896), (3, 5, 33), (2, 130, 4864), (37, 203, 200)]


def half_gemm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The dense kernel on one weight."""
    return cpu_gemm.matmul(x, cpu_gemm.dense_matrices([w]))


def quantize_reference(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernels' activation quantization in torch float32: per block d = max|x| / 127 and
    q = round(x * (127 / max|x|)), half to even; returns q [M, K] and d per value [M, K]."""
    m, k = x.shape
    kp = -(-k // block) * block
    xp = torch.nn.functional.pad(x.float(), (0, kp - k)).view(m, -1, block)
    amax = xp.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    q = torch.round(xp * inv)
    return q.reshape(m, kp)[:, :k], (amax / 127).expand_as(xp).reshape(m, kp)[:, :k]


def random_int4(n, k, group, seed):
    g = torch.Generator().manual_seed(seed)
    groups = -(-k // group)
    q = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=g)
    scales = (torch.rand(groups, n, generator=g) * 0.1 + 0.01).half()
    zeros = torch.randint(0, 16, (groups, n), dtype=torch.uint8, generator=g)
    return q, scales, zeros


def int4_reference(x, q, scales, zeros, group):
    xq, dx = quantize_reference(x, 32)
    gi = torch.arange(q.shape[1]) // group
    w = (q.double() - zeros.double().t()[:, gi]) * scales.double().t()[:, gi]
    return (xq.double() * dx.double()) @ w.t()


def int8_reference(x, w, scale):
    xq, dx = quantize_reference(x, x.shape[1])
    return (xq.double() @ w.double().t()) * dx.double()[:, :1] * scale.double()


def bf16_dot_products(isa) -> bool:
    """Whether this ISA path multiplies bf16 weights in vdpbf16ps (Zen 4's avx512 path, built where the
    CPU has AVX-512 BF16): with bf16 activations, and with a drafter's (loose) fp32 ones rounded."""
    return (isa == "avx512" and "-DSPECLITE_ZEN4" in cpu_build.vendor_flags()
            and "-mavx512bf16" in cpu_build.path_flags(isa))


def close(y, reference, tol=1e-5):
    return ((y.double() - reference).abs().max() / reference.abs().max()).item() < tol


AVX512_FLAGS = "avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni"


@pytest.mark.parametrize("vendor,flags,paths,defines,bf16", [
    ("AuthenticAMD", "avx2 fma f16c", ["avx2"], ("-DSPECLITE_AMD",), False),
    ("AuthenticAMD", AVX512_FLAGS, ["avx512", "avx2"], ("-DSPECLITE_AMD", "-DSPECLITE_ZEN4"), False),
    ("AuthenticAMD", AVX512_FLAGS + " avx512_bf16", ["avx512", "avx2"], ("-DSPECLITE_AMD", "-DSPECLITE_ZEN4"), True),
    ("GenuineIntel", AVX512_FLAGS + " amx_tile amx_int8 amx_bf16", ["amx", "avx512", "avx2"], (), False),
    ("GenuineIntel", AVX512_FLAGS + " avx512_bf16 amx_tile amx_int8 amx_bf16", ["amx", "avx512", "avx2"], (), True),
    ("GenuineIntel", AVX512_FLAGS + " amx_tile", ["avx512", "avx2"], (), False),  # tiles without int8
    ("GenuineIntel", AVX512_FLAGS + " amx_tile amx_int8", ["avx512", "avx2"], (), False),  # without bf16
    ("GenuineIntel", "avx2 fma f16c avx512f avx512bw avx512vl", ["avx2"], (), False),  # AVX-512 without VNNI
    ("GenuineIntel", "avx fma f16c", [], (), False),
])
def test_isa_paths_and_vendor_defines_follow_cpuinfo(monkeypatch, vendor, flags, paths, defines, bf16):
    """The paths a CPU runs, the maker's defines, and AVX-512 BF16 compiled into the AVX-512 paths
    (never the avx2 one) where the CPU has it."""
    if cpu_build.platform.machine() not in ("x86_64", "AMD64") or os.environ.get("SPECLITE_CPU_KERNELS", "1") == "0":
        pytest.skip("no x86 kernels here")
    lines = {"vendor_id": f"vendor_id\t: {vendor}", "flags": f"flags\t\t: fpu {flags}"}
    monkeypatch.setattr(cpu_build, "_cpu_line", lambda key: lines[key].encode())
    assert cpu_build.runnable() == paths
    assert cpu_build.vendor_flags() == defines
    for path in paths:
        assert cpu_build.path_flags(path)[: len(cpu_build.ISAS[path][1])] == cpu_build.ISAS[path][1]
        assert ("-mavx512bf16" in cpu_build.path_flags(path)) == (bf16 and path != "avx2")


def _load_with_a_compiler_lacking(monkeypatch, flag: str, path: str) -> tuple[list, types.SimpleNamespace]:
    """cpu_build.load for ISA path `path` where every build with `flag` fails: the flags of each
    build tried, and the library loaded (a stand-in holding its flags)."""
    built = []

    def library(source, flags):
        built.append(flags)
        return None if flag in flags else types.SimpleNamespace(flags=flags)

    monkeypatch.setattr(cpu_build, "library", library)
    monkeypatch.setattr(cpu_build, "_loaded", {})
    monkeypatch.setenv("SPECLITE_CPU_ISA", path)
    cpu_build.isa.cache_clear()
    try:
        return built, cpu_build.load("kernels.cpp", {})
    finally:
        monkeypatch.delenv("SPECLITE_CPU_ISA")
        cpu_build.isa.cache_clear()


def test_a_path_whose_build_fails_gives_way_to_the_next(monkeypatch):
    if "amx" not in cpu_build.runnable():
        pytest.skip("no AMX here")
    built, lib = _load_with_a_compiler_lacking(monkeypatch, "-mamx-tile", "amx")
    assert len(built) == 2 and "-mavx512vnni" in lib.flags and "-mamx-tile" not in lib.flags


def test_a_compiler_without_avx512_bf16_keeps_the_avx512_path(monkeypatch):
    if cpu_build.platform.machine() not in ("x86_64", "AMD64") or os.environ.get("SPECLITE_CPU_KERNELS", "1") == "0":
        pytest.skip("no x86 kernels here")
    lines = {"vendor_id": "vendor_id\t: AuthenticAMD", "flags": f"flags\t\t: fpu {AVX512_FLAGS} avx512_bf16"}
    monkeypatch.setattr(cpu_build, "_cpu_line", lambda key: lines[key].encode())
    built, lib = _load_with_a_compiler_lacking(monkeypatch, "-mavx512bf16", "avx512")
    assert len(built) == 2 and "-mavx512vnni" in lib.flags and "-mavx512bf16" not in lib.flags


def test_kernels_build_where_the_cpu_and_compiler_allow():
    if _cpu_has_avx2() and os.environ.get("SPECLITE_CPU_KERNELS", "1") != "0":
        import shutil
        if shutil.which("g++"):
            assert cpu_gemm.available()


@needs_kernels
def test_every_isa_path_of_this_cpu_builds(isa):
    assert cpu_build.isa() == isa
    assert cpu_gemm.available() and cpu_layer_ops.available()


@needs_kernels
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_int4_equals_float64_math_of_the_same_quantization(isa, m, n, k, group):
    torch.manual_seed(m * n + k + group)
    x = torch.randn(m, k)
    q, scales, zeros = random_int4(n, k, group, seed=k + group)
    y = cpu_gemm.matmul(x, cpu_gemm.int4_matrices([cpu_gemm.pack_int4(q, scales, zeros, group)], [n], k, group))
    assert y.dtype == torch.float32 and y.shape == (m, n)
    assert close(y, int4_reference(x, q, scales, zeros, group))


@needs_kernels
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_int8_equals_float64_math_of_the_same_quantization(isa, m, n, k):
    torch.manual_seed(m + n * k)
    x = torch.randn(m, k)
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8)
    scale = torch.rand(n) * 0.01 + 1e-3
    y = cpu_gemm.matmul(x, cpu_gemm.int8_matrices([cpu_gemm.pack_int8(w)], [scale], k))
    assert close(y, int8_reference(x, w, scale))


@needs_kernels
@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_dense_equals_float64_math(isa, m, n, k, wdtype):
    torch.manual_seed(m + n + k)
    x = torch.randn(m, k)
    w = torch.randn(n, k).to(wdtype)
    assert close(half_gemm(x, w), x.double() @ w.double().t())


@needs_kernels
@pytest.mark.parametrize("m,n,k", SHAPES + [(4, 20, 31), (2, 9, 65)])
def test_bf16_weights_and_activations_equal_float64_math_before_rounding(isa, m, n, k):
    # The activations widened to fp32 (exact), fp32 FMAs, or on Zen 4 vdpbf16ps (K even; exact products,
    # fp32 sums of pairs): an odd K's last bf16 pair is padded.
    torch.manual_seed(m * k + n)
    x, w = torch.randn(m, k).to(torch.bfloat16), torch.randn(n, k).to(torch.bfloat16)
    y = half_gemm(x, w)
    assert y.dtype == torch.bfloat16
    reference, magnitude = x.double() @ w.double().t(), x.double().abs() @ w.double().abs().t()
    # One bf16 rounding of the result, plus fp32 accumulation (far below 2^-12 of the terms' sum).
    assert ((y.double() - reference).abs() <= reference.abs() * 2 ** -8 + magnitude * 2 ** -12).all()


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,n,k", [(1, 37, 96), (3, 200, 128), (9, 300, 896), (17, 64, 256), (40, 4864, 64),
                                   (5, 64, 200), (2, 9, 65), (13, 50, 130), (4, 300, 66)])
def test_a_drafters_products_are_bf16_on_amx_and_zen4_and_exact_elsewhere(isa, dtype, m, n, k):
    """Loose matrices (a drafter's): products of the activations rounded to bf16 (fp32 sums) on the
    amx path where K is a multiple of 32 and a row is short or the matrix cached, and on Zen 4's
    avx512 path (vdpbf16ps, built in where the CPU has AVX-512 BF16) where K is even; everywhere
    else the products of the activations as they are, bit for bit."""
    torch.manual_seed(m * n + k)
    x, w = torch.randn(m, k).to(dtype), torch.randn(n, k).to(torch.bfloat16)
    exact = cpu_gemm.matmul(x, cpu_gemm.dense_matrices([w]))
    loose = cpu_gemm.matmul(x, cpu_gemm.dense_matrices([w], loose=True))
    dot = bf16_dot_products(isa) and k % 2 == 0
    tiles = (isa == "amx" and k % 32 == 0 and (m >= 4 or n * k * 2 <= 2 << 20)) or dot
    if not tiles:
        assert torch.equal(loose, exact)
        return
    if dot and dtype == torch.bfloat16:  # bf16 activations take vdpbf16ps there, a drafter's or not
        assert torch.equal(loose, exact)
    rounded = x.to(torch.bfloat16).double() @ w.double().t()
    if dtype == torch.bfloat16:  # one rounding of the result
        assert close(loose, rounded, 2 ** -8)
    else:  # the activations' rounding shows, and nothing else
        assert close(loose, rounded) and not close(loose, x.double() @ w.double().t())


def test_drafting_marks_a_proposers_own_modules_not_the_targets():
    shared, own, target_only = Linear(8, 8), Linear(8, 8), Linear(8, 8)
    target, drafter = torch.nn.Sequential(target_only, shared), torch.nn.Sequential(own, shared)
    cpu_gemm.drafting([drafter], target)
    assert getattr(own, "speclite_drafts", False)
    assert not hasattr(shared, "speclite_drafts") and not hasattr(target_only, "speclite_drafts")
    if cpu_gemm.available():
        x = torch.randn(3, 8)
        own.to(torch.bfloat16), shared.to(torch.bfloat16)
        with torch.no_grad():
            assert cpu_gemm.module_matrices(x, [own]).loose
            assert not cpu_gemm.module_matrices(x, [shared]).loose
            assert not cpu_gemm.module_matrices(x, [own, shared]).loose  # one exact part: the call is exact


def _calls(x, n, k):
    """Each kernel on activations x, weights fixed by (n, k)."""
    q, scales, zeros = random_int4(n, k, 64, seed=1)
    packed = cpu_gemm.pack_int4(q, scales, zeros, 64)
    g = torch.Generator().manual_seed(2)
    w8 = cpu_gemm.pack_int8(torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g))
    scale = torch.rand(n, generator=g) * 0.01
    wh = torch.randn(n, k, generator=g).to(torch.bfloat16)
    return {"int4": cpu_gemm.matmul(x, cpu_gemm.int4_matrices([packed], [n], k, 64)),
            "int8": cpu_gemm.matmul(x, cpu_gemm.int8_matrices([w8], [scale], k)), "bf16": half_gemm(x, wh)}


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("k", [448, 200, 201])  # 201: bf16 panels end in a padded pair
def test_a_row_alone_equals_that_row_in_a_batch_bit_for_bit(isa, dtype, k):
    torch.manual_seed(3)
    n = 203
    x = torch.randn(41, k).to(dtype)  # more than one row chunk, rows not a multiple of the tile
    batch = _calls(x, n, k)
    for i in (0, 5, 9, 32, 40):
        alone = _calls(x[i:i + 1], n, k)
        for name in batch:
            assert alone[name].dtype == dtype
            assert torch.equal(alone[name][0], batch[name][i]), (name, i)
    # Short verifications have tiles of their own (two and three rows; rows left over after bigger tiles).
    for i, rows in ((0, 2), (7, 2), (39, 2), (20, 3), (0, 5), (11, 6), (30, 7)):
        few = _calls(x[i:i + rows], n, k)
        for name in batch:
            assert torch.equal(few[name], batch[name][i:i + rows]), (name, i, rows)
    with torch_threads(1):
        single = _calls(x[:9], n, k)
    for name in batch:  # the thread split does not change the arithmetic either
        assert torch.equal(single[name], batch[name][:9]), name


@needs_kernels
def test_a_linear_takes_any_leading_dims_through_the_kernels(isa):
    """A single state [H] (a Medusa head's input) and stacked rows [n, T, H] go through the same
    kernel as the rows [M, H]: the same numbers bit for bit, not torch's fallback."""
    torch.manual_seed(4)
    lin = Linear(96, 72, bias=True).to(torch.bfloat16)
    x = torch.randn(3, 5, 96).to(torch.bfloat16)
    with torch.inference_mode():
        rows = lin(x.reshape(15, 96)).reshape(3, 5, 72)
        assert torch.equal(lin(x), rows)
        assert torch.equal(lin(x[1, 2]), rows[1, 2])


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_activations_are_widened_and_outputs_rounded_like_torch(isa, dtype):
    """Half-precision activations multiply as their fp32 values would, the result rounded, but for bf16
    ones meeting bf16 weights on Zen 4 (vdpbf16ps: the same exact products, summed in pairs; their
    bounds are test_bf16_weights_and_activations_equal_float64_math_before_rounding's)."""
    torch.manual_seed(4)
    x = torch.randn(3, 200).to(dtype)
    wide, narrow = _calls(x.float(), 70, 200), _calls(x, 70, 200)
    for name in wide:
        if name == "bf16" and dtype == torch.bfloat16 and bf16_dot_products(isa):
            continue
        assert torch.equal(narrow[name], wide[name].to(dtype)), name


@needs_kernels
@pytest.mark.skipif(len(cpu_build.runnable()) < 2, reason="one ISA path on this CPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_integer_products_are_the_same_on_every_isa_path(dtype):
    # Their dot products are exact integers (vpdpbusd on AVX-512, maddubs on AVX2) and the float
    # epilogue is the same: a model quantized to int4 or w8a8 decodes the same tokens on either path.
    torch.manual_seed(12)
    x = torch.randn(7, 456).to(dtype)
    outputs = []
    for path in cpu_build.runnable():
        os.environ["SPECLITE_CPU_ISA"] = path
        cpu_build.isa.cache_clear()
        try:
            outputs.append(_calls(x, 77, 456))
        finally:
            del os.environ["SPECLITE_CPU_ISA"]
            cpu_build.isa.cache_clear()
    for name in ("int4", "int8"):
        assert all(torch.equal(out[name], outputs[0][name]) for out in outputs), name


@needs_kernels
@pytest.mark.skipif(len(cpu_build.runnable()) < 2, reason="one ISA path on this CPU")
def test_dense_products_of_fp32_activations_are_the_same_on_every_isa_path():
    # Each output is one fp32 sum over K in order on every path (gemm.h, Dense), the weights widened
    # exactly: so a float32 weight narrowed to its bf16 values (model.narrow) multiplies bit for bit
    # as before, on AVX2 too. K odd: bf16's panels end in a padded pair.
    torch.manual_seed(13)
    x = torch.randn(7, 203)
    bf16 = torch.randn(77, 203).to(torch.bfloat16)
    weights = {"fp32": torch.randn(77, 203), "bf16": bf16, "f16": torch.randn(77, 203).to(torch.float16),
               "bf16 values in fp32": bf16.float()}
    outputs = []
    for path in cpu_build.runnable():
        os.environ["SPECLITE_CPU_ISA"] = path
        cpu_build.isa.cache_clear()
        try:
            outputs.append({name: half_gemm(x, w) for name, w in weights.items()})
        finally:
            del os.environ["SPECLITE_CPU_ISA"]
            cpu_build.isa.cache_clear()
    for name in weights:
        assert all(torch.equal(out[name], outputs[0][name]) for out in outputs), name
    assert torch.equal(outputs[0]["bf16"], outputs[0]["bf16 values in fp32"])
    assert close(outputs[0]["fp32"], x.double() @ weights["fp32"].double().t())


def test_dense_panels_hold_each_weight_once_in_the_kernel_order():
    """pack_dense's layout, read back by index: 16 columns a panel (zero columns past N), fp32 and
    f16 one value of K at a time, bf16 pairs of consecutive values (a zero past an odd K)."""
    torch.manual_seed(14)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        w = torch.randn(37, 11).to(dtype)
        p = cpu_gemm.pack_dense(w)
        for n, k in ((0, 0), (15, 10), (16, 3), (36, 7), (20, 9)):
            got = p[n // 16, k // 2, n % 16, k % 2] if dtype == torch.bfloat16 else p[n // 16, k, n % 16]
            assert got == w[n, k], (dtype, n, k)
        assert p.shape[0] == 3 and (p[2, :, 37 - 32:] == 0).all()
        if dtype == torch.bfloat16:
            assert p.shape[1:] == (6, 16, 2) and (p[:, 5, :, 1] == 0).all()
        strided = torch.randn(16, 32).to(dtype).t()  # a transposed view, N = 32 and K = 16: nothing to pad
        assert torch.equal(cpu_gemm.pack_dense(strided), cpu_gemm.pack_dense(strided.contiguous()))


@needs_kernels
def test_int4_linear_runs_the_kernel_with_act_order_groups():
    torch.manual_seed(5)
    n, k, group = 48, 256, 64
    q, scales, zeros = random_int4(n, k, group, seed=2)
    g_idx = (torch.randperm(k) % (k // group)).to(torch.int32)  # act-order: groups scattered over K
    layer = Int4Linear(Int4Weight(q, zeros, scales, g_idx, group), None, torch.float32, "cpu")
    assert layer.path == "cpu_int4"
    x = torch.randn(2, 3, k)
    perm = torch.argsort(g_idx.long(), stable=True)
    xs = x.reshape(-1, k)[:, perm]
    expected = int4_reference(xs, q[:, perm], scales, zeros, group)
    assert close(layer(x).reshape(-1, n), expected)


@needs_kernels
def test_int8_linear_quantizes_activations_per_token():
    torch.manual_seed(6)
    n, k = 40, 100
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8)
    scale = torch.rand(n, 1) * 0.01
    bias = torch.randn(n)
    layer = Int8Linear(w, scale, bias, torch.float32, "cpu")
    assert layer.path == "cpu_w8a8"
    x = torch.randn(4, k)
    assert close(layer(x) - bias, int8_reference(x, w, scale.reshape(n)))


@needs_kernels
def test_dense_linear_takes_the_kernel_for_half_weights_and_torch_for_float32(isa):
    torch.manual_seed(7)
    w, b = torch.randn(90, 100, dtype=torch.bfloat16), torch.randn(90, dtype=torch.bfloat16)
    x = torch.randn(5, 100, dtype=torch.bfloat16)
    assert torch.equal(linear(x, w, b), half_gemm(x, w) + b)
    wf, xf = w.float(), x.float()
    assert torch.equal(linear(xf, wf), torch.nn.functional.linear(xf, wf))


def _paths_in_subprocess(**env) -> list[str]:
    code = "from speclite.kernels import cpu_build, cpu_gemm; print(cpu_build.isa(), cpu_gemm.available())"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env})
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


@needs_kernels
def test_the_best_isa_path_runs_the_avx2_one_can_be_forced_and_everything_switched_off(tmp_path):
    # The session's kernel cache (the `isa` fixture builds every path there anyway: a fresh one would
    # compile them all again, minutes); an empty one where no compiler must mean no kernels.
    best = cpu_build.runnable()[0]
    assert _paths_in_subprocess() == [best, "True"]
    assert _paths_in_subprocess(SPECLITE_CPU_ISA="avx2") == ["avx2", "True"]
    assert _paths_in_subprocess(SPECLITE_CPU_ISA="nonsense") == [best, "True"]
    assert _paths_in_subprocess(SPECLITE_CPU_KERNELS="0") == ["None", "False"]
    assert _paths_in_subprocess(SPECLITE_CACHE_DIR=str(tmp_path), CXX="false") == [best, "False"]


@needs_kernels
def test_joined_int4_projections_equal_each_linear_alone_bit_for_bit(isa):
    # q, k and v (or gate and up) in one kernel call: the same numbers as three calls, biases included.
    torch.manual_seed(8)
    k, group = 224, 32
    layers, weights = [], []
    for i, (n, bias) in enumerate([(96, True), (40, False), (40, True)]):  # 40: a partial 8-column group
        q, scales, zeros = random_int4(n, k, group, seed=20 + i)
        weights.append((q, scales, zeros))
        g_idx = (torch.arange(k) // group).to(torch.int32)
        layers.append(Int4Linear(Int4Weight(q, zeros, scales, g_idx, group), torch.randn(n) if bias else None,
                                 torch.bfloat16, "cpu"))
    for m in (1, 4, 7):
        x = torch.randn(m, k).to(torch.bfloat16)
        joint = project(x, *layers)
        assert joint.shape == (m, 176)
        for y, layer, (q, scales, zeros) in zip(joint.split([96, 40, 40], dim=-1), layers, weights):
            assert torch.equal(y, layer(x))
            bias = 0 if layer.bias is None else layer.bias.double()
            assert close(y.double() - bias, int4_reference(x.float(), q, scales, zeros, group), 1e-2)


@needs_kernels
def test_joined_int8_projections_equal_each_linear_alone_bit_for_bit(isa):
    torch.manual_seed(10)
    k = 200
    layers, weights = [], []
    for n, bias in [(64, True), (30, False), (35, True)]:
        w, scale = torch.randint(-128, 128, (n, k), dtype=torch.int8), torch.rand(n) * 0.01 + 1e-3
        weights.append((w, scale))
        layers.append(Int8Linear(w, scale, torch.randn(n) if bias else None, torch.bfloat16, "cpu"))
    for m in (1, 6):
        x = torch.randn(m, k).to(torch.bfloat16)
        joint = project(x, *layers)
        assert joint.shape == (m, 129)
        for y, layer, (w, scale) in zip(joint.split([64, 30, 35], dim=-1), layers, weights):
            assert torch.equal(y, layer(x))
            bias = 0 if layer.bias is None else layer.bias.double()
            assert close(y.double() - bias, int8_reference(x.float(), w, scale), 1e-2)


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_joined_dense_projections_equal_each_linear_alone_bit_for_bit(isa, dtype):
    torch.manual_seed(9)
    # Frozen, as the loader leaves weights (a weight that wants a gradient keeps torch's op).
    layers = [Linear(200, n, bias=bias).to(dtype).requires_grad_(False) for n, bias in [(64, True), (31, False), (33, True)]]
    for m in (1, 5):
        x = torch.randn(m, 200).to(dtype)
        joint = project(x, *layers)
        assert joint.shape == (m, 128)
        for y, layer in zip(joint.split([64, 31, 33], dim=-1), layers):
            assert torch.equal(y, layer(x))
            assert close(y - (0 if layer.bias is None else layer.bias), x.double() @ layer.weight.double().t(), 1e-2)


@needs_kernels
def test_a_replaced_weight_or_module_is_multiplied_not_the_cached_one():
    # Kernel arguments are built once per set of weights; loading or quantizing replaces them.
    torch.manual_seed(11)
    layers = [Linear(64, 32).requires_grad_(False) for _ in range(2)]
    x = torch.randn(3, 64)
    first = project(x, *layers)
    layers[1].weight = torch.nn.Parameter(torch.randn(32, 64), requires_grad=False)
    y = project(x, *layers)
    assert torch.equal(y[:, :32], first[:, :32]) and not torch.equal(y[:, 32:], first[:, 32:])
    assert close(y[:, 32:] - layers[1].bias, x.double() @ layers[1].weight.double().t())
    layers[0] = Linear(64, 32).requires_grad_(False)
    assert close(project(x, *layers)[:, :32] - layers[0].bias, x.double() @ layers[0].weight.double().t())
