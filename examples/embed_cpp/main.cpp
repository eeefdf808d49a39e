// Embedding tessera in a C++ program through tessera.hpp (RAII handles, exceptions): load a
// model once, run it from several threads at once, check that every thread got the same bits,
// and print a checksum of the output.
//
//   c++ -std=c++17 main.cpp $(pkg-config --cflags --libs tessera) -o embed_cpp
//   ./embed_cpp MODEL.safetensors INPUT.safetensors [EXPECTED.safetensors]
//
// INPUT holds one tensor per model input, by input name; with EXPECTED the largest difference
// from it is printed and must be at most 1e-4. The checksum line matches examples/embed_c's.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <tessera/tessera.hpp>
#include <thread>
#include <vector>

namespace {

// FNV-1a over the bytes: equal only for bitwise equal outputs.
uint64_t fnv1a(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 14695981039346656037ull;
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

std::string declared(const tessera::ValueInfo& v) {
  std::string s = "[";
  for (size_t a = 0; a < v.shape.size(); ++a)
    s += (a ? ", " : "") +
         (v.shape[a].size >= 0 ? std::to_string(v.shape[a].size) : v.shape[a].symbol);
  return s + "]";
}

int run(int argc, char** argv) {
  std::printf("tessera %s\n", tessera::version().c_str());
  const tessera::Model model = tessera::Model::load(argv[1]);

  std::vector<tessera::Tensor> inputs;
  for (const tessera::ValueInfo& in : model.inputs()) {
    std::printf("input %s %s %s\n", in.name.c_str(), declared(in).c_str(),
                tessera_dtype_name(in.dtype));
    inputs.push_back(tessera::Tensor::read(argv[2], in.name));
  }
  std::vector<const tessera::Tensor*> in_ptrs;
  for (const tessera::Tensor& t : inputs) in_ptrs.push_back(&t);

  // One model, kThreads threads, kRuns runs each: every run borrows its own workspace.
  constexpr int kThreads = 4, kRuns = 10;
  std::vector<std::vector<uint64_t>> sums(kThreads);
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      try {
        for (int r = 0; r < kRuns; ++r)
          for (const tessera::Tensor& y : model.run(in_ptrs))
            sums[t].push_back(fnv1a(y.data(), y.nbytes()));
      } catch (const tessera::Error& e) {
        errors[t] = e.what();
      }
    });
  for (std::thread& th : threads) th.join();
  for (const std::string& e : errors)
    if (!e.empty()) throw tessera::Error(TESSERA_E_INTERNAL, e);

  const std::vector<tessera::Tensor> outputs = model.run(in_ptrs);
  const std::vector<tessera::ValueInfo> out_info = model.outputs();
  int status = 0;
  for (size_t k = 0; k < outputs.size(); ++k) {
    const tessera::Tensor& y = outputs[k];
    const uint64_t h = fnv1a(y.data(), y.nbytes());
    for (const std::vector<uint64_t>& s : sums)
      for (size_t r = k; r < s.size(); r += outputs.size())
        if (s[r] != h) {
          std::fprintf(stderr, "embed_cpp: a concurrent run's %s differs\n",
                       out_info[k].name.c_str());
          return 1;
        }
    std::string shape;
    for (int64_t d : y.shape()) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
    std::printf("output %s [%s] %s checksum fnv1a=%016" PRIx64, out_info[k].name.c_str(),
                shape.c_str(), tessera_dtype_name(y.dtype()), h);
    if (y.dtype() != TESSERA_F32) {  // a mask passed through
      std::printf("\n");
      continue;
    }
    const float* v = y.data<float>();
    double sum = 0.0;
    for (int64_t i = 0; i < y.numel(); ++i) sum += v[i];
    std::printf(" sum=%.6f\n", sum);
    if (argc == 4) {
      const tessera::Tensor expected = tessera::Tensor::read(argv[3], out_info[k].name);
      double worst = INFINITY;
      if (expected.dtype() == TESSERA_F32 && expected.numel() == y.numel()) {
        const float* e = expected.data<float>();
        worst = 0.0;
        for (int64_t i = 0; i < y.numel(); ++i)
          worst = std::max(worst, std::fabs(static_cast<double>(v[i]) - e[i]));
      }
      std::printf("output %s: max |difference| from %s = %.3g\n", out_info[k].name.c_str(), argv[3],
                  worst);
      if (!(worst <= 1e-4)) status = 1;
    }
  }
  std::printf("%d threads x %d runs: every output identical\n", kThreads, kRuns);
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4) {
    std::fprintf(stderr, "usage: %s MODEL.safetensors INPUT.safetensors [EXPECTED.safetensors]\n",
                 argv[0]);
    return 2;
  }
  try {
    return run(argc, argv);
  } catch (const tessera::Error& e) {
    std::fprintf(stderr, "embed_cpp: %s\n", e.what());
    return 1;
  }
}
