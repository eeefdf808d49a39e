// Tensor views, copies and factories against element-by-element expectations computed here
// from the index arithmetic (row-major offsets), not from the implementation under test.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <cstdint>
#include <numeric>

#include "core/random.h"
#include "core/tensor.h"

using namespace tessera;

namespace {

// A [2, 3, 4] tensor holding 0..23 in row-major order.
Tensor iota_234() {
  std::vector<float> v(24);
  std::iota(v.begin(), v.end(), 0.0f);
  return Tensor::from_vector(v, {2, 3, 4});
}

template <class Fn>
void expect_error(ErrorCode code, Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    BOOST_TEST(static_cast<int>(e.code()) == static_cast<int>(code), e.what());
    return;
  }
  BOOST_FAIL("expected an error");
}

}  // namespace

BOOST_AUTO_TEST_SUITE(tensor)

BOOST_AUTO_TEST_CASE(dtype_names_and_sizes) {
  const std::pair<DType, std::pair<const char*, size_t>> table[] = {
      {DType::F32, {"F32", 4}}, {DType::F16, {"F16", 2}}, {DType::BF16, {"BF16", 2}},
      {DType::F64, {"F64", 8}}, {DType::I64, {"I64", 8}}, {DType::I32, {"I32", 4}},
      {DType::U8, {"U8", 1}},   {DType::I8, {"I8", 1}},   {DType::Bool, {"BOOL", 1}}};
  for (const auto& [t, expect] : table) {
    BOOST_TEST(std::string(dtype_safetensors_name(t)) == expect.first);
    BOOST_TEST(dtype_size(t) == expect.second);
    BOOST_TEST((parse_dtype(dtype_name(t)).value() == t));
    BOOST_TEST((parse_dtype(expect.first).value() == t));
  }
  BOOST_TEST(!parse_dtype("F8_E4M3").has_value());
  BOOST_TEST(!parse_dtype("float").has_value());
}

BOOST_AUTO_TEST_CASE(half_conversions_known_values) {
  // Bit patterns from IEEE 754 binary16 / bfloat16 tables.
  BOOST_TEST(float_to_half(1.0f) == 0x3c00);
  BOOST_TEST(float_to_half(-2.0f) == 0xc000);
  BOOST_TEST(float_to_half(65504.0f) == 0x7bff);
  BOOST_TEST(float_to_half(65520.0f) == 0x7c00);  // rounds to inf
  BOOST_TEST(float_to_half(std::ldexp(1.0f, -24)) == 0x0001);  // smallest subnormal
  BOOST_TEST(float_to_half(std::ldexp(1.0f, -25)) == 0x0000);  // tie to even: 0
  BOOST_TEST(float_to_half(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);  // tie to even
  BOOST_TEST(float_to_half(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);
  BOOST_TEST(half_to_float(0x3555) == 0.333251953125f);
  BOOST_TEST(half_to_float(0x0001) == std::ldexp(1.0f, -24));
  BOOST_TEST(std::isnan(half_to_float(float_to_half(NAN))));
  BOOST_TEST(std::isinf(half_to_float(0xfc00)));
  BOOST_TEST(float_to_bfloat16(1.0f) == 0x3f80);
  BOOST_TEST(float_to_bfloat16(1.00390625f) == 0x3f80);  // tie (1 + 2^-8) to even
  BOOST_TEST(float_to_bfloat16(1.01171875f) == 0x3f82);  // tie (1 + 3*2^-8) to even
  BOOST_TEST(bfloat16_to_float(0x4049) == 3.140625f);
  BOOST_TEST(std::isnan(bfloat16_to_float(float_to_bfloat16(NAN))));
  // Every finite half round-trips exactly through float.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;
    BOOST_REQUIRE(float_to_half(half_to_float(static_cast<uint16_t>(h))) == h);
  }
}

BOOST_AUTO_TEST_CASE(factories) {
  Tensor z = Tensor::zeros({3, 5});
  BOOST_TEST(z.numel() == 15);
  BOOST_TEST(z.is_contiguous());
  BOOST_TEST(reinterpret_cast<uintptr_t>(z.raw_data()) % 64 == 0);
  for (double v : z.to_double_vector()) BOOST_TEST(v == 0.0);
  Tensor f = Tensor::full({2, 2}, 2.5, DType::F64);
  for (double v : f.to_double_vector()) BOOST_TEST(v == 2.5);
  Tensor b = Tensor::full({4}, 1, DType::Bool);
  BOOST_TEST(b.at<bool>({3}) == true);
  Tensor scalar = Tensor::full({}, 7.0);
  BOOST_TEST(scalar.numel() == 1);
  BOOST_TEST(scalar.item({}) == 7.0);
  Tensor empty0 = Tensor::empty({0, 4});
  BOOST_TEST(empty0.numel() == 0);
  expect_error(ErrorCode::Shape, [] { Tensor::empty({-1, 2}); });
  expect_error(ErrorCode::Shape, [] { Tensor::empty({int64_t{1} << 40, int64_t{1} << 40}); });
  // Zero elements however large the other dims: valid, and its strides do not overflow (UBSan).
  Tensor huge_empty = Tensor::empty({0, int64_t{1} << 40, int64_t{1} << 40});
  BOOST_TEST(huge_empty.numel() == 0);
  BOOST_TEST(huge_empty.reshape({int64_t{1} << 40, 0, int64_t{1} << 40}).numel() == 0);
  expect_error(ErrorCode::DType, [] { Tensor::zeros({2}).data<double>(); });
}

BOOST_AUTO_TEST_CASE(random_is_seeded_and_distributed) {
  Generator g1(42), g2(42), g3(43);
  Tensor a = Tensor::randn({4096}, g1), b = Tensor::randn({4096}, g2),
         c = Tensor::randn({4096}, g3);
  const auto va = a.to_double_vector(), vb = b.to_double_vector(), vc = c.to_double_vector();
  BOOST_TEST((va == vb));
  BOOST_TEST((va != vc));
  double mean = 0, sq = 0;
  for (double v : va) mean += v;
  mean /= va.size();
  for (double v : va) sq += (v - mean) * (v - mean);
  const double sd = std::sqrt(sq / va.size());
  // 4096 draws: the sample mean has sd 1/64, the sample sd about 0.011.
  BOOST_TEST(std::abs(mean) < 0.06);
  BOOST_TEST(std::abs(sd - 1.0) < 0.05);
  Generator g4(1);
  Tensor u = Tensor::rand({4096}, g4, -2.0, 3.0);
  double lo = 1e9, hi = -1e9;
  for (double v : u.to_double_vector()) lo = std::min(lo, v), hi = std::max(hi, v);
  BOOST_TEST(lo >= -2.0);
  BOOST_TEST(hi < 3.0);
  BOOST_TEST(lo < -1.9);
  BOOST_TEST(hi > 2.9);
}

BOOST_AUTO_TEST_CASE(transpose_permute_select_narrow) {
  Tensor t = iota_234();
  Tensor tr = t.transpose(0, 2);  // [4, 3, 2]
  BOOST_TEST((tr.shape() == Shape({4, 3, 2})));
  BOOST_TEST(!tr.is_contiguous());
  BOOST_TEST((tr.storage() == t.storage()));
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 2; ++k) BOOST_TEST(tr.at<float>({i, j, k}) == k * 12 + j * 4 + i);
  Tensor p = t.permute({1, 2, 0});  // [3, 4, 2]
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 4; ++j)
      for (int64_t k = 0; k < 2; ++k) BOOST_TEST(p.at<float>({i, j, k}) == k * 12 + i * 4 + j);
  Tensor s = t.select(1, 2);  // [2, 4]: t[:, 2, :]
  BOOST_TEST((s.shape() == Shape({2, 4})));
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t k = 0; k < 4; ++k) BOOST_TEST(s.at<float>({i, k}) == i * 12 + 8 + k);
  Tensor s_neg = t.select(-1, -1);  // t[:, :, 3]
  BOOST_TEST(s_neg.at<float>({1, 2}) == 23.0f);
  Tensor n = t.narrow(2, 1, 2);  // t[:, :, 1:3]
  BOOST_TEST((n.shape() == Shape({2, 3, 2})));
  BOOST_TEST(n.at<float>({1, 1, 1}) == 12 + 4 + 2);
  Tensor sl = t.slice(2, 0, 4, 2);  // t[:, :, ::2]
  BOOST_TEST((sl.shape() == Shape({2, 3, 2})));
  BOOST_TEST(sl.at<float>({1, 2, 1}) == 12 + 8 + 2);
  expect_error(ErrorCode::Shape, [&] { t.narrow(0, 1, 2); });
  expect_error(ErrorCode::Shape, [&] { t.select(3, 0); });
  expect_error(ErrorCode::Shape, [&] { t.permute({0, 0, 1}); });
  expect_error(ErrorCode::Shape, [&] { t.at<float>({2, 0, 0}); });
}

BOOST_AUTO_TEST_CASE(view_reshape_contiguous) {
  Tensor t = iota_234();
  Tensor v = t.view({6, -1});
  BOOST_TEST((v.shape() == Shape({6, 4})));
  BOOST_TEST((v.storage() == t.storage()));
  BOOST_TEST(v.at<float>({5, 3}) == 23.0f);
  // A transposed tensor cannot be viewed flat; reshape copies instead.
  Tensor tr = t.transpose(1, 2);  // [2, 4, 3]
  expect_error(ErrorCode::Shape, [&] { tr.view({24}); });
  Tensor flat = tr.reshape({24});
  BOOST_TEST((flat.storage() != t.storage()));
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 4; ++j)
      for (int64_t k = 0; k < 3; ++k)
        BOOST_TEST(flat.at<float>({i * 12 + j * 3 + k}) == i * 12 + k * 4 + j);
  // Merging dims that stay contiguous after a narrow on the leading dim is still a view.
  Tensor n = t.narrow(0, 1, 1).view({12});
  BOOST_TEST(n.at<float>({0}) == 12.0f);
  // Splitting a transposed dim is a view.
  Tensor split = tr.view({2, 2, 2, 3});
  BOOST_TEST((split.storage() == t.storage()));
  BOOST_TEST(split.at<float>({1, 1, 0, 2}) == 12 + 2 * 4 + 2);
  Tensor c = tr.contiguous();
  BOOST_TEST(c.is_contiguous());
  BOOST_TEST((c.to_double_vector() == tr.to_double_vector()));
  BOOST_TEST((t.contiguous().storage() == t.storage()));
  expect_error(ErrorCode::Shape, [&] { t.view({5, 5}); });
  expect_error(ErrorCode::Shape, [&] { t.view({-1, -1}); });
}

BOOST_AUTO_TEST_CASE(unsqueeze_squeeze_expand) {
  Tensor t = iota_234();
  Tensor u = t.unsqueeze(1);
  BOOST_TEST((u.shape() == Shape({2, 1, 3, 4})));
  BOOST_TEST(u.is_contiguous());
  BOOST_TEST((t.unsqueeze(-1).shape() == Shape({2, 3, 4, 1})));
  BOOST_TEST((u.squeeze(1).shape() == Shape({2, 3, 4})));
  BOOST_TEST((u.squeeze(0).shape() == Shape({2, 1, 3, 4})));
  BOOST_TEST((u.unsqueeze(0).squeeze().shape() == Shape({2, 3, 4})));
  Tensor row = Tensor::from_vector(std::vector<float>{1, 2, 3}, {1, 3});
  Tensor e = row.expand({4, -1});
  BOOST_TEST((e.shape() == Shape({4, 3})));
  BOOST_TEST(e.stride(0) == 0);
  BOOST_TEST(e.at<float>({3, 2}) == 3.0f);
  Tensor e3 = row.expand({2, 4, 3});
  BOOST_TEST(e3.at<float>({1, 3, 1}) == 2.0f);
  Tensor ec = e.contiguous();
  BOOST_TEST(ec.is_contiguous());
  BOOST_TEST(ec.at<float>({2, 0}) == 1.0f);
  expect_error(ErrorCode::Shape, [&] { row.expand({4, 2}); });
  expect_error(ErrorCode::Shape, [&] { t.unsqueeze(5); });
}

BOOST_AUTO_TEST_CASE(clone_and_dtype_conversion) {
  Tensor t = iota_234();
  Tensor c = t.clone();
  c.set_item({0, 0, 0}, 100.0);
  BOOST_TEST(t.at<float>({0, 0, 0}) == 0.0f);
  Tensor h = t.to(DType::F16);
  Tensor b = t.transpose(0, 1).to(DType::BF16);  // strided source
  Tensor d = t.to(DType::F64);
  Tensor i = t.to(DType::I32);
  for (int64_t x = 0; x < 2; ++x)
    for (int64_t y = 0; y < 3; ++y)
      for (int64_t z = 0; z < 4; ++z) {
        const double want = x * 12 + y * 4 + z;  // small integers: exact in every dtype
        BOOST_TEST(h.item({x, y, z}) == want);
        BOOST_TEST(b.item({y, x, z}) == want);
        BOOST_TEST(d.at<double>({x, y, z}) == want);
        BOOST_TEST(i.at<int32_t>({x, y, z}) == want);
      }
  // F16/BF16 -> F32 goes through the vector kernels on contiguous data.
  Generator g(7);
  Tensor r = Tensor::randn({1000}, g);
  Tensor rh = r.to(DType::F16), rb = r.to(DType::BF16);
  const auto vr = r.to_double_vector(), vh = rh.to(DType::F32).to_double_vector(),
             vb = rb.to(DType::F32).to_double_vector();
  for (size_t k = 0; k < vr.size(); ++k) {
    BOOST_TEST(vh[k] == half_to_float(float_to_half(static_cast<float>(vr[k]))));
    BOOST_TEST(vb[k] == bfloat16_to_float(float_to_bfloat16(static_cast<float>(vr[k]))));
  }
}

BOOST_AUTO_TEST_CASE(wrap_keeps_owner_alive) {
  auto buffer = std::make_shared<std::vector<float>>(std::vector<float>{1, 2, 3, 4, 5, 6});
  std::weak_ptr<std::vector<float>> weak = buffer;
  Tensor view;
  {
    Tensor w = Tensor::wrap(buffer->data(), {2, 3}, DType::F32, buffer);
    buffer.reset();
    view = w.transpose(0, 1);
  }
  BOOST_TEST(!weak.expired());
  BOOST_TEST(view.at<float>({2, 1}) == 6.0f);
  view = Tensor();
  BOOST_TEST(weak.expired());
}

// A factory given an allocator takes its memory from it and gives it back to it; borrowed
// storage has none.
BOOST_AUTO_TEST_CASE(factories_allocate_from_the_given_allocator) {
  struct Counting final : Allocator {
    int live = 0, zeroed = 0;
    void* allocate(size_t bytes) override {
      ++live;
      return host_allocator().allocate(bytes);
    }
    void* allocate_zeroed(size_t bytes) override {
      ++live, ++zeroed;
      return host_allocator().allocate_zeroed(bytes);
    }
    void deallocate(void* p) noexcept override {
      --live;
      host_allocator().deallocate(p);
    }
  } counting;
  {
    const Tensor z = Tensor::zeros({3, 5}, DType::F32, counting);
    const Tensor f = Tensor::full({2}, 1.5, DType::F64, counting);
    const Tensor v = Tensor::from_vector<int32_t>({1, 2, 3}, {3}, counting);
    BOOST_TEST(counting.live == 3);
    BOOST_TEST(counting.zeroed == 1);
    BOOST_TEST(z.storage()->allocator() == &counting);
    BOOST_TEST(z.item({2, 4}) == 0.0);
    BOOST_TEST(f.item({1}) == 1.5);
    BOOST_TEST(v.item({2}) == 3.0);
    BOOST_TEST(Tensor::empty({2}).storage()->allocator() == &host_allocator());
    float data[2] = {1, 2};
    BOOST_TEST(Tensor::wrap(data, {2}, DType::F32, nullptr).storage()->allocator() == nullptr);
  }
  BOOST_TEST(counting.live == 0);
}

BOOST_AUTO_TEST_CASE(large_blocks_are_reused) {
  // Blocks >= 1 MiB are cached on free so repeated forwards do not fault in fresh pages.
  Allocator& host = host_allocator();
  const size_t bytes = size_t{6} << 20;
  void* a = host.allocate(bytes);
  BOOST_TEST(reinterpret_cast<uintptr_t>(a) % 64 == 0);
  std::memset(a, 1, bytes);
  host.deallocate(a);
  void* b = host.allocate(bytes - 4096);  // a slightly smaller request reuses the block
  BOOST_TEST(a == b);
  void* c = host.allocate(bytes);  // the block is taken: a fresh one
  BOOST_TEST(c != b);
  std::memset(c, 2, bytes);
  host.deallocate(b);
  host.deallocate(c);
  void* d = host.allocate(size_t{64} << 20);  // nothing cached that large: fresh
  BOOST_TEST(d != a);
  BOOST_TEST(d != c);
  host.deallocate(d);
}

BOOST_AUTO_TEST_SUITE_END()
