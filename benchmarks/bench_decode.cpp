// Incremental decoding's memory-bound parts against the machine's read bandwidth, measured in the
// same run: a decode step reads every cached key and value once (decode_attention_f32) and every
// weight once (a matrix-vector product per projection), so its floor is bytes / bandwidth.
//
//   bench_decode [--threads N] [--mb M] [--json]
//
// 1. Read bandwidth: N threads each summing its share of a buffer of M MiB (default 512, many
//    times the L3), best of 5 passes, GB/s.
// 2. The decode attention kernel, one thread: one query row of one head against a cache of S
//    keys (head_dim = v_head_dim = 64, K transposed, V row-major), in blocks of 512 keys merged
//    by log-sum-exp, for S = 128 .. 8192 and a cache of 12 heads x S (the block touches each
//    head's K and V once): GB/s of K and V read, and that as % of the one-thread bandwidth.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "backends/cpu/cpu_device.h"
#include "benchmarks/read_bandwidth.h"
#include "core/attention_tile.h"
#include "core/kernels.h"

using tessera::bench::read_bandwidth_gbs;
using tessera::bench::steady_now_s;

int main(int argc, char** argv) {
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  size_t mb = 512;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) {
      threads = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--mb" && i + 1 < argc) {
      mb = static_cast<size_t>(std::max(16, std::atoi(argv[++i])));
    } else if (a == "--json") {
      json = true;
    } else {
      std::fprintf(stderr, "usage: %s [--threads N] [--mb M] [--json]\n", argv[0]);
      return 2;
    }
  }
  const tessera::Device& dev = tessera::cpu_device();
  const tessera::KernelTable& k = dev.kernels();
  std::vector<float> buf(mb * 1024 * 256, 1.0f);  // touched: first touch is not what we time
  const double bw1 = read_bandwidth_gbs(buf, 1), bwn = read_bandwidth_gbs(buf, threads);
  if (json)
    std::printf("{\"read_gbs_1\":%.2f,\"read_gbs_%d\":%.2f,\"simd_target\":\"%s\"}\n", bw1, threads,
                bwn, dev.simd_target());
  else
    std::printf("bench_decode: target %s; read bandwidth %.1f GB/s on 1 thread, %.1f GB/s on %d "
                "(%zu MiB buffer)\n",
                dev.simd_target(), bw1, bwn, threads, mb);

  constexpr int64_t kHeads = 12, kDim = 64, kBlock = 512;
  for (const int64_t S : {128, 512, 1024, 4096, 8192}) {
    // Per head: K transposed [64][S], V [S][64]; all heads' caches laid out one after another.
    std::vector<float> kt(static_cast<size_t>(kHeads * kDim * S)), v(kt.size());
    for (size_t i = 0; i < kt.size(); ++i) {
      kt[i] = 0.01f * static_cast<float>(i % 97);
      v[i] = 0.02f * static_cast<float>(i % 89);
    }
    std::vector<float> q(kDim, 0.1f), out(kDim), o(static_cast<size_t>((S / kBlock + 1) * kDim)),
        m(static_cast<size_t>(S / kBlock + 1)), l(m.size());
    float* scores = static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>(kBlock) * 4));
    const auto step = [&] {
      for (int64_t h = 0; h < kHeads; ++h) {
        const int64_t blocks = (S + kBlock - 1) / kBlock;
        for (int64_t b = 0; b < blocks; ++b) {
          tessera::DecodeAttentionBlock db;
          db.head_dim = kDim;
          db.v_head_dim = kDim;
          db.key_begin = b * kBlock;
          db.key_end = std::min(S, (b + 1) * kBlock);
          db.scale = 0.125f;
          db.q = q.data();
          db.kt = kt.data() + h * kDim * S;
          db.kt_stride = S;
          db.v = v.data() + h * kDim * S;
          db.v_stride = kDim;
          db.scores = scores;
          db.o = o.data() + b * kDim;
          db.m = &m[static_cast<size_t>(b)];
          db.l = &l[static_cast<size_t>(b)];
          k.decode_attention_block_f32(db);
        }
        k.decode_attention_merge_f32(blocks, kDim, m.data(), l.data(), o.data(), kDim, out.data());
      }
    };
    step();
    const int reps = static_cast<int>(std::clamp<int64_t>(200000 / S, 5, 2000));
    double best = 1e30;
    for (int r = 0; r < 5; ++r) {
      const double t0 = steady_now_s();
      for (int i = 0; i < reps; ++i) step();
      best = std::min(best, (steady_now_s() - t0) / reps);
    }
    std::free(scores);
    const double bytes = 2.0 * kHeads * kDim * S * 4, gbs = bytes / best * 1e-9;
    if (json)
      std::printf("{\"context\":%ld,\"heads\":%ld,\"us\":%.2f,\"gbs\":%.2f,\"read_gbs_1\":%.2f}\n",
                  static_cast<long>(S), static_cast<long>(kHeads), best * 1e6, gbs, bw1);
    else
      std::printf("decode attention, context %5ld, 12 heads x 64: %8.1f us  %6.1f GB/s of K+V "
                  "(%3.0f%% of one thread's read bandwidth; K+V %.1f MiB)\n",
                  static_cast<long>(S), best * 1e6, gbs, 100.0 * gbs / bw1, bytes / 1048576.0);
  }
  return 0;
}
