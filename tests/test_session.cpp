// Session (runtime/session.h): the pool of plans behind the C API and the command line. Which
// plan a run gets is checked through idle_plans(), results bitwise against a Plan of its own.
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "tests/expect_error.h"
#include "io/safetensors.h"
#include "runtime/loader.h"
#include "runtime/session.h"

using namespace tessera;

namespace {

const std::string kEncoder = std::string(TESSERA_SOURCE_DIR) + "/examples/encoder/";

Model encoder() { return load_model(kEncoder + "encoder.safetensors", std::nullopt, true).model; }

// x of [1, t, 64], values that differ with t and `phase`.
Tensor input(int64_t t, float phase = 0.0f) {
  Tensor x = Tensor::empty({1, t, 64});
  float* p = x.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i)
    p[i] = std::sin(0.37f * static_cast<float>(i + t) + phase);
  return x;
}

std::map<std::string, TensorDesc> desc_of(const Tensor& x) {
  return {{"x", TensorDesc{x.shape(), x.dtype()}}};
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.contiguous().raw_data(), b.contiguous().raw_data(), a.nbytes()) == 0;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(session)

BOOST_AUTO_TEST_CASE(runs_match_a_plan_of_their_own_and_reuse_one_plan_per_shape) {
  const Session s(encoder());
  const Tensor x = SafetensorsFile::open(kEncoder + "input.safetensors").tensor("x");
  Plan own(s.model(), desc_of(x));
  const Tensor want = own.run({{"x", x}}).at(0).second.clone();

  BOOST_TEST(s.idle_plans() == 0u);
  for (int r = 0; r < 3; ++r) {
    const auto out = s.run({{"x", x}});
    BOOST_TEST_REQUIRE(out.size() == 1u);
    BOOST_TEST(out[0].first == "y");
    BOOST_TEST(same_bits(out[0].second, want));
    BOOST_TEST(s.idle_plans() == 1u);  // the same plan, back after every run
  }
  s.run({{"x", input(5)}});
  BOOST_TEST(s.idle_plans() == 2u);
  // A stored dtype is part of the key: float64 x is converted by a plan of its own.
  const auto f64 = s.run({{"x", x.to(DType::F64)}});
  BOOST_TEST(s.idle_plans() == 3u);
  BOOST_TEST(same_bits(f64[0].second, want));
}

BOOST_AUTO_TEST_CASE(outputs_are_copies_that_outlive_later_runs) {
  const Session s(encoder());
  const Tensor a = input(7), b = input(7, 1.0f);
  const Tensor ya = s.run({{"x", a}}).at(0).second;
  const Tensor kept = ya.clone();
  s.run({{"x", b}});  // same plan, its buffers overwritten
  BOOST_TEST(same_bits(ya, kept));
}

BOOST_AUTO_TEST_CASE(a_lease_holds_its_plan_until_it_ends) {
  const Session s(encoder());
  const Tensor x = input(4);
  {
    Session::Lease first = s.lease(desc_of(x));
    Session::Lease second = s.lease(desc_of(x));  // the first is out: a second plan
    BOOST_TEST(&first.plan() != &second.plan());
    BOOST_TEST(s.idle_plans() == 0u);
    const Tensor y1 = first.run({{"x", x}}).at(0).second.clone();
    BOOST_TEST(same_bits(second.run({{"x", x}}).at(0).second, y1));
    BOOST_TEST(same_bits(first.run({{"x", x}}).at(0).second, y1));  // repeated runs, one plan
    Session::Lease moved = std::move(first);  // moved-from leases return nothing
    BOOST_TEST(s.idle_plans() == 0u);
  }
  BOOST_TEST(s.idle_plans() == 2u);
  const Plan* warm = nullptr;
  {
    Session::Lease again = s.lease(desc_of(x));
    warm = &again.plan();
    BOOST_TEST(s.idle_plans() == 1u);
  }
  Session::Lease latest = s.lease(desc_of(x));  // the most recently returned first
  BOOST_TEST(&latest.plan() == warm);
}

BOOST_AUTO_TEST_CASE(the_least_recently_used_beyond_the_cap_is_dropped) {
  const Session s(encoder());
  for (int64_t t = 1; t <= static_cast<int64_t>(Session::kMaxIdlePlans) + 1; ++t)
    s.run({{"x", input(t)}});
  BOOST_TEST(s.idle_plans() == Session::kMaxIdlePlans);
  {
    Session::Lease oldest = s.lease(desc_of(input(1)));  // dropped: planned afresh
    BOOST_TEST(s.idle_plans() == Session::kMaxIdlePlans);
  }
  {
    Session::Lease kept = s.lease(desc_of(input(3)));  // still idle: taken from the pool
    BOOST_TEST(s.idle_plans() == Session::kMaxIdlePlans - 1);
  }
  s.trim();
  BOOST_TEST(s.idle_plans() == 0u);
}

BOOST_AUTO_TEST_CASE(a_failed_run_drops_its_plan) {
  const Session s(encoder());
  const Tensor x = input(4);
  {
    Session::Lease lease = s.lease(desc_of(x));
    expect_error(ErrorCode::Shape, "input x: shape [1, 5, 64] is not the planned [1, 4, 64]", [&] {
      lease.run({{"x", input(5)}});
    });
    expect_error(ErrorCode::Internal, "dropped", [&] { lease.run({{"x", x}}); });
  }
  BOOST_TEST(s.idle_plans() == 0u);
}

BOOST_AUTO_TEST_CASE(wrong_input_names_are_errors_even_with_a_warm_plan) {
  const Session s(encoder());
  const Tensor x = input(4);
  s.run({{"x", x}});
  BOOST_TEST(s.idle_plans() == 1u);
  expect_error(ErrorCode::Arg, "z is not a network input", [&] { s.run({{"x", x}, {"z", x}}); });
  expect_error(ErrorCode::Arg, "missing network input x", [&] { s.run({}); });
  expect_error(ErrorCode::Shape, "input x", [&] { s.run({{"x", Tensor::empty({1, 4, 63})}}); });
  BOOST_TEST(s.idle_plans() == 1u);
}

// 4 threads x 10 runs on one session, two shapes interleaved: every output bitwise the
// single-threaded one (the C API's concurrency test runs 8 threads through the same pool).
BOOST_AUTO_TEST_CASE(concurrent_runs_match_single_threaded_bitwise) {
  constexpr int kThreads = 4, kRuns = 10;
  const Session s(encoder());
  const Tensor inputs[2] = {input(16), input(9)};
  const Tensor reference[2] = {s.run({{"x", inputs[0]}}).at(0).second,
                               s.run({{"x", inputs[1]}}).at(0).second};
  std::vector<int> mismatches(kThreads, 0), failures(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRuns; ++r) {
        const int k = (t + r) % 2;
        try {
          if (!same_bits(s.run({{"x", inputs[k]}}).at(0).second, reference[k])) ++mismatches[t];
        } catch (const std::exception&) {
          ++failures[t];
        }
      }
    });
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    BOOST_TEST(failures[t] == 0, "thread " << t);
    BOOST_TEST(mismatches[t] == 0, "thread " << t);
  }
  BOOST_TEST(s.idle_plans() <= Session::kMaxIdlePlans);
}

BOOST_AUTO_TEST_SUITE_END()
