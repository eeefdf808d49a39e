// tessera-compare ACTUAL.safetensors EXPECTED.safetensors [--atol A] [--rtol R]
//                 [--labels LABELS.safetensors]
//
// Compares every tensor of EXPECTED with the tensor of the same name in ACTUAL, in float64:
// prints the shape, the max absolute difference and the max |expected| of each, then the overall
// max absolute difference. Exit 0 when the files hold the same names and shapes and every element
// has |actual - expected| <= atol + rtol * |expected|; 1 when they differ; 2 when a file cannot be
// read or the arguments are wrong (an error line as tessera prints it). With --labels (one int
// tensor `labels` [N]), each [N, C] tensor is also read as classifier logits: it prints the
// accuracy of ACTUAL's argmax against the labels, and how many of its predictions equal
// EXPECTED's argmax; any disagreement fails (exit 1). A developer tool for the
// example (scripts/run_example.sh), not part of the tessera command-line contract.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cxxopts.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"

namespace {

double parse_tolerance(const std::string& opt, const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !(v >= 0.0) || std::isinf(v))
    tessera::fail(tessera::ErrorCode::Arg, "tessera-compare",
                  "--" + opt + ": '" + text + "' is not a finite number >= 0");
  return v;
}

int compare(int argc, char** argv) {
  cxxopts::Options options("tessera-compare",
                           "Compare the tensors of ACTUAL with those of EXPECTED.");
  // clang-format off
  options.add_options()
      ("actual", "", cxxopts::value<std::string>())
      ("expected", "", cxxopts::value<std::string>())
      ("atol", "Absolute tolerance (default 1e-4)", cxxopts::value<std::string>(), "A")
      ("rtol", "Relative tolerance (default 0)", cxxopts::value<std::string>(), "R")
      ("labels", "True classes: also compare argmax predictions", cxxopts::value<std::string>(),
       "LABELS.safetensors")
      ("h,help", "Print this help");
  // clang-format on
  options.parse_positional({"actual", "expected"});
  options.positional_help("ACTUAL.safetensors EXPECTED.safetensors");
  cxxopts::ParseResult args;
  try {
    args = options.parse(argc, argv);
  } catch (const cxxopts::exceptions::exception& e) {
    tessera::fail(tessera::ErrorCode::Arg, "tessera-compare", e.what());
  }
  if (args.count("help")) {
    std::fputs(options.help().c_str(), stdout);
    return 0;
  }
  if (!args.count("actual") || !args.count("expected") || !args.unmatched().empty())
    tessera::fail(tessera::ErrorCode::Arg, "tessera-compare",
                  "expected two files: ACTUAL.safetensors EXPECTED.safetensors");
  const double atol =
      args.count("atol") ? parse_tolerance("atol", args["atol"].as<std::string>()) : 1e-4;
  const double rtol =
      args.count("rtol") ? parse_tolerance("rtol", args["rtol"].as<std::string>()) : 0.0;

  const auto actual = tessera::SafetensorsFile::open(args["actual"].as<std::string>());
  const auto expected = tessera::SafetensorsFile::open(args["expected"].as<std::string>());
  bool ok = true;
  double worst = 0.0;
  for (const std::string& name : expected.names()) {
    if (!actual.contains(name)) {
      std::printf("%s: missing from %s\n", name.c_str(), actual.path().c_str());
      ok = false;
      continue;
    }
    const tessera::Tensor e = expected.tensor(name);
    const tessera::Tensor a = actual.tensor(name);
    if (a.shape() != e.shape()) {
      std::printf("%s: shape %s, expected %s\n", name.c_str(), a.shape_str().c_str(),
                  e.shape_str().c_str());
      ok = false;
      continue;
    }
    const std::vector<double> av = a.to_double_vector(), ev = e.to_double_vector();
    double max_diff = 0.0, max_ref = 0.0;
    bool within = true;
    for (size_t i = 0; i < ev.size(); ++i) {
      const double d = std::abs(av[i] - ev[i]);
      // A NaN difference is never within tolerance (written so that NaN fails).
      if (!(d <= atol + rtol * std::abs(ev[i]))) within = false;
      max_diff = std::isnan(d) ? d : std::max(max_diff, d);
      max_ref = std::max(max_ref, std::abs(ev[i]));
    }
    std::printf("%s: shape %s, max abs diff %.3g, max |expected| %.3g (%s)\n", name.c_str(),
                e.shape_str().c_str(), max_diff, max_ref, within ? "ok" : "MISMATCH");
    ok = ok && within;
    worst = std::isnan(max_diff) ? max_diff : std::max(worst, max_diff);
  }
  if (args.count("labels")) {
    const auto labels_file = tessera::SafetensorsFile::open(args["labels"].as<std::string>());
    const std::vector<double> labels = labels_file.tensor("labels").to_double_vector();
    for (const std::string& name : expected.names()) {
      if (!actual.contains(name)) continue;
      const tessera::Tensor e = expected.tensor(name), a = actual.tensor(name);
      if (a.shape() != e.shape() || e.dim() != 2 ||
          e.size(0) != static_cast<int64_t>(labels.size()) || e.size(1) < 1) {
        std::printf("%s: not [%zu, classes] logits\n", name.c_str(), labels.size());
        ok = false;
        continue;
      }
      const int64_t rows = e.size(0), classes = e.size(1);
      const std::vector<double> av = a.to_double_vector(), ev = e.to_double_vector();
      // The lowest index among equal maxima, as torch.argmax.
      auto argmax = [classes](const std::vector<double>& v, int64_t r) {
        int64_t best = 0;
        for (int64_t c = 1; c < classes; ++c)
          if (v[static_cast<size_t>(r * classes + c)] > v[static_cast<size_t>(r * classes + best)])
            best = c;
        return best;
      };
      int64_t correct = 0, agree = 0;
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t mine = argmax(av, r);
        correct += mine == static_cast<int64_t>(labels[static_cast<size_t>(r)]);
        agree += mine == argmax(ev, r);
      }
      std::printf(
          "%s: accuracy %.4f (%lld/%lld correct); predictions equal to the expected "
          "ones: %lld/%lld\n",
          name.c_str(), rows ? static_cast<double>(correct) / static_cast<double>(rows) : 0.0,
          static_cast<long long>(correct), static_cast<long long>(rows),
          static_cast<long long>(agree), static_cast<long long>(rows));
      ok = ok && agree == rows;
    }
  }
  for (const std::string& name : actual.names())
    if (!expected.contains(name)) {
      std::printf("%s: not in %s\n", name.c_str(), expected.path().c_str());
      ok = false;
    }
  std::printf("max abs difference: %.3g (tolerance: atol %.3g + rtol %.3g * |expected|): %s\n",
              worst, atol, rtol, ok ? "match" : "MISMATCH");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return compare(argc, argv);
  } catch (const tessera::Error& e) {
    std::fprintf(stderr, "tessera-compare: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera-compare: error: E_INTERNAL: %s\n", e.what());
    return 2;
  }
}
