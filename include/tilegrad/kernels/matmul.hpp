// Matrix product C = A @ B, the Triton tutorial kernel: BM x BN output tiles walked in groups
// of GroupM rows of tiles (for cache reuse), K in steps of BK, masked at the K edge, dot with
// an fp32 accumulator. Its backward is two more matrix products, da = dc @ bᵀ and db = aᵀ @ dc,
// each a kernel that transposes the tile it loads.
#pragma once

#include "tilegrad/core/types.hpp"
#include "tilegrad/grid/program.hpp"
#include "tilegrad/memory/pointer.hpp"
#include "tilegrad/memory/tensor.hpp"
#include "tilegrad/tile/creation.hpp"
#include "tilegrad/tile/dot.hpp"
#include "tilegrad/tile/elementwise.hpp"
#include "tilegrad/tile/shape_ops.hpp"

#include <algorithm>
#include <utility>

namespace tilegrad::kernels {

/// c = a @ b for a (M, K), b (K, N), c (M, N). Grid: cdiv(M, BM) * cdiv(N, BN) programs.
template <int BM, int BN, int BK, int GroupM = 8>
inline constexpr auto matmul_fwd = []<class T>(program const& p, tensor<T const> a,
                                               tensor<T const> b, tensor<T> c) {
  // b of another inner extent would be zero-padded or cut by the masks, silently. (Checked by every
  // program: one alone let the others write past a smaller output while it threw.)
  {
    expect_shape(b, {a.size(1), b.size(1)});
    expect_shape(c, {a.size(0), b.size(1)});
  }
  int const M = static_cast<int>(a.size(0)), K = static_cast<int>(a.size(1));
  int const N = static_cast<int>(b.size(1));
  // Grouped ordering: consecutive programs share rows of A and columns of B.
  int const pid = p.program_id(0);
  int const num_pid_m = cdiv(M, BM), num_pid_n = cdiv(N, BN);
  int const num_pid_in_group = GroupM * num_pid_n;
  int const group_id = pid / num_pid_in_group;
  int const first_pid_m = group_id * GroupM;
  int const group_size_m = std::min(num_pid_m - first_pid_m, GroupM);
  int const pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m;
  int const pid_n = (pid % num_pid_in_group) / group_size_m;

  // Rows and columns past the edge wrap around (% M, % N): their loads stay inside and their
  // results are masked at the store.
  auto const offs_am = (pid_m * BM + arange<0, BM>()) % M;
  auto const offs_bn = (pid_n * BN + arange<0, BN>()) % N;
  auto const offs_k = arange<0, BK>();
  auto a_ptrs = a + (col(offs_am) * a.stride(0) + row(offs_k) * a.stride(1));
  auto b_ptrs = b + (col(offs_k) * b.stride(0) + row(offs_bn) * b.stride(1));

  auto acc = zeros<fp32<T>, BM, BN>();
  for (int k = 0; k < cdiv(K, BK); ++k) {
    auto const a_tile = load(a_ptrs, row(offs_k) < K - k * BK, 0.0f);
    auto const b_tile = load(b_ptrs, col(offs_k) < K - k * BK, 0.0f);
    acc = dot(a_tile, b_tile, std::move(acc)); // accumulates in place
    a_ptrs += BK * a.stride(1);
    b_ptrs += BK * b.stride(0);
  }

  auto const offs_cm = pid_m * BM + arange<0, BM>();
  auto const offs_cn = pid_n * BN + arange<0, BN>();
  store(c + (col(offs_cm) * c.stride(0) + row(offs_cn) * c.stride(1)), acc,
        (col(offs_cm) < M) & (row(offs_cn) < N));
};

/// da = dc @ bᵀ for dc (M, N), b (K, N), da (M, K): the reduction runs over N, b's tiles are
/// loaded as (BK, BN) and transposed. Grid: (cdiv(M, BM), cdiv(K, BK)).
template <int BM, int BK, int BN>
inline constexpr auto matmul_bwd_da = []<class T>(program const& p, tensor<T const> dc,
                                                  tensor<T const> b, tensor<T> da) {
  // Operands of another shape would be zero-padded or cut by the masks, silently. (Checked by every
  // program, as matmul_fwd does.)
  {
    expect_shape(b, {b.size(0), dc.size(1)});
    expect_shape(da, {dc.size(0), b.size(0)});
  }
  int const M = static_cast<int>(dc.size(0)), N = static_cast<int>(dc.size(1));
  int const K = static_cast<int>(b.size(0));
  auto const offs_m = p.program_id(0) * BM + arange<0, BM>();
  auto const offs_k = p.program_id(1) * BK + arange<0, BK>();
  auto const offs_n = arange<0, BN>();
  auto dc_ptrs = dc + (col(offs_m) * dc.stride(0) + row(offs_n) * dc.stride(1));
  auto b_ptrs = b + (col(offs_k) * b.stride(0) + row(offs_n) * b.stride(1));
  auto acc = zeros<fp32<T>, BM, BK>();
  for (int n = 0; n < cdiv(N, BN); ++n) {
    auto const in_n = row(offs_n) < N - n * BN;
    auto const dc_tile = load(dc_ptrs, (col(offs_m) < M) & in_n, 0.0f);
    auto const b_tile = load(b_ptrs, (col(offs_k) < K) & in_n, 0.0f);
    acc = dot(dc_tile, trans(b_tile), std::move(acc));
    dc_ptrs += BN * dc.stride(1);
    b_ptrs += BN * b.stride(1);
  }
  store(da + (col(offs_m) * da.stride(0) + row(offs_k) * da.stride(1)), acc,
        (col(offs_m) < M) & (row(offs_k) < K));
};

/// db = aᵀ @ dc for a (M, K), dc (M, N), db (K, N): the reduction runs over M, a's tiles are
/// loaded as (BM, BK) and transposed. Grid: (cdiv(K, BK), cdiv(N, BN)).
template <int BK, int BN, int BM>
inline constexpr auto matmul_bwd_db = []<class T>(program const& p, tensor<T const> a,
                                                  tensor<T const> dc, tensor<T> db) {
  {
    expect_shape(dc, {a.size(0), dc.size(1)});
    expect_shape(db, {a.size(1), dc.size(1)});
  }
  int const M = static_cast<int>(a.size(0)), K = static_cast<int>(a.size(1));
  int const N = static_cast<int>(dc.size(1));
  auto const offs_k = p.program_id(0) * BK + arange<0, BK>();
  auto const offs_n = p.program_id(1) * BN + arange<0, BN>();
  auto const offs_m = arange<0, BM>();
  auto a_ptrs = a + (col(offs_m) * a.stride(0) + row(offs_k) * a.stride(1));
  auto dc_ptrs = dc + (col(offs_m) * dc.stride(0) + row(offs_n) * dc.stride(1));
  auto acc = zeros<fp32<T>, BK, BN>();
  for (int m = 0; m < cdiv(M, BM); ++m) {
    auto const in_m = col(offs_m) < M - m * BM;
    auto const a_tile = load(a_ptrs, in_m & (row(offs_k) < K), 0.0f);
    auto const dc_tile = load(dc_ptrs, in_m & (row(offs_n) < N), 0.0f);
    acc = dot(trans(a_tile), dc_tile, std::move(acc));
    a_ptrs += BM * a.stride(0);
    dc_ptrs += BM * dc.stride(0);
  }
  store(db + (col(offs_k) * db.stride(0) + row(offs_n) * db.stride(1)), acc,
        (col(offs_k) < K) & (row(offs_n) < N));
};

} // namespace tilegrad::kernels
