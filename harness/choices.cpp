#include "harness/choices.h"

namespace vf {

namespace {
__extension__ typedef unsigned __int128 u128;  // GCC/Clang extension; -Wpedantic-clean
constexpr std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

PrngChoices::PrngChoices(std::uint64_t seed) {
  std::uint64_t x = seed;
  for (std::uint64_t& s : s_) {
    x = splitmix64(x);
    s = x;
  }
}

std::uint64_t PrngChoices::next() {
  const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const std::uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

std::uint64_t PrngChoices::draw_impl(std::uint64_t lo, std::uint64_t hi) {
  const std::uint64_t span = hi - lo;
  if (span == ~std::uint64_t{0}) return next();
  const std::uint64_t range = span + 1;
  // Lemire's multiply-shift with rejection: uniform without division in the common case.
  u128 m = static_cast<u128>(next()) * range;
  std::uint64_t low = static_cast<std::uint64_t>(m);
  if (low < range) {
    const std::uint64_t threshold = (0 - range) % range;
    while (low < threshold) {
      m = static_cast<u128>(next()) * range;
      low = static_cast<std::uint64_t>(m);
    }
  }
  return lo + static_cast<std::uint64_t>(m >> 64);
}

std::uint64_t ReplayChoices::draw_impl(std::uint64_t lo, std::uint64_t hi) {
  if (pos_ >= values_.size()) return lo;
  const std::uint64_t v = values_[pos_++];
  return v < lo ? lo : (v > hi ? hi : v);
}

}  // namespace vf
