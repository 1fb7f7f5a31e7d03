// The AVX2 matrix products of gemm.h as one C entry point: one thread team per call.
#include "gemm.h"

extern "C" {

// y [M, n] = x [M, k] @ [W_0; W_1; ...]^T (+ bias) for the matrices `mt` describes (gemm.h).
void speclite_matmul(const void *x, int dt, const Matrices *mt, void *y, int M, int threads) {
    Scratch &sc = scratch;  // the caller's: the team shares it
    reserve(sc, *mt, M);
#pragma omp parallel num_threads(threads)
    matmul_team(*mt, x, dt, M, y, sc);
}

}  // extern "C"
