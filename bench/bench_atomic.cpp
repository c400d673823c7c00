// Float atomic_add from many programs into a few shared rows (dW of a layer-norm backward, dQ of
// the atomic FlashAttention backward): tilegrad's atomic_add, which holds a lock per 4 KiB page
// and adds each run of lanes in one page as a vector, beside std::atomic_ref<float>::fetch_add per
// element (a compare-and-swap loop on x86) in the same launch. 65,536 programs each add a row of C
// ones into row (program % rows) of a (rows, C) tensor: rows = 1 is every program on one row,
// the worst case for a lock per page. Counter: elements added per second.
#include <tilegrad/tilegrad.hpp>

#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdint>
#include <stdexcept>

namespace tg = tilegrad;

namespace {

constexpr int programs = 1 << 16;

template <int C>
constexpr auto add_rows = []<class T>(tg::program const& p, tg::tensor<T> acc, int rows) {
  tg::atomic_add(acc[p.program_id(0) % rows] + tg::arange<0, C>(), T(1));
};

template <int C>
constexpr auto add_rows_cas = []<class T>(tg::program const& p, tg::tensor<T> acc, int rows) {
  T* const row = acc.data() + (p.program_id(0) % rows) * acc.stride(0);
  for (int c = 0; c < C; ++c)
    std::atomic_ref<T>(row[c]).fetch_add(T(1), std::memory_order_acq_rel);
};

template <int C, bool Cas>
void BM_atomic_rows(benchmark::State& state) {
  int const threads = static_cast<int>(state.range(0)), rows = static_cast<int>(state.range(1));
  tg::owned_tensor<float> acc({rows, C}, "acc");
  tg::launch_options const opts{.exec = tg::executor::tbb, .num_threads = threads};
  std::int64_t launches = 0;
  for (auto _ : state) {
    if constexpr (Cas)
      tg::launch(opts, programs, add_rows_cas<C>, acc.view(), rows);
    else
      tg::launch(opts, programs, add_rows<C>, acc.view(), rows);
    ++launches;
  }
  // Every launch adds programs / rows ones to each element: check one.
  if (acc.view()(0, C - 1) != static_cast<float>(launches * (programs / rows)))
    state.SkipWithError("lost an update");
  state.SetItemsProcessed(launches * programs * C);
  state.counters["threads"] = threads;
}

void args(benchmark::internal::Benchmark* b) {
  for (int t : {1, 2, 16})
    for (int rows : {1, 64})
      b->Args({t, rows});
  b->ArgNames({"threads", "rows"})->UseRealTime()->Unit(benchmark::kMillisecond);
}

} // namespace

BENCHMARK(BM_atomic_rows<64, false>)->Name("atomic_rows/tilegrad/C:64")->Apply(args);
BENCHMARK(BM_atomic_rows<64, true>)->Name("atomic_rows/atomic_ref_cas/C:64")->Apply(args);
BENCHMARK(BM_atomic_rows<1024, false>)->Name("atomic_rows/tilegrad/C:1024")->Apply(args);
BENCHMARK(BM_atomic_rows<1024, true>)->Name("atomic_rows/atomic_ref_cas/C:1024")->Apply(args);
BENCHMARK_MAIN();
