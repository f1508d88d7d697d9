// Where a generated case gets its randomness: one small interface, "draw an integer in [lo, hi]",
// with several drivers. A seeded PRNG drives campaigns; RapidCheck drives properties (each draw
// is a gen::inRange, so RapidCheck shrinks the choices); libFuzzer's FuzzedDataProvider drives
// fuzz targets. The sequence of draws is recorded, so a case can be replayed from its choices.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace vf {

class Choices {
 public:
  virtual ~Choices() = default;
  // An integer in [lo, hi], both inclusive (lo <= hi).
  std::uint64_t draw(std::uint64_t lo, std::uint64_t hi) {
    const std::uint64_t v = lo == hi ? lo : draw_impl(lo, hi);
    recorded_.push_back(v);
    return v;
  }
  bool chance(std::uint64_t numerator, std::uint64_t denominator) { return draw(1, denominator) <= numerator; }
  template <typename T>
  const T& pick(std::span<const T> items) {
    return items[draw(0, items.size() - 1)];
  }
  const std::vector<std::uint64_t>& recorded() const { return recorded_; }

 protected:
  virtual std::uint64_t draw_impl(std::uint64_t lo, std::uint64_t hi) = 0;

 private:
  std::vector<std::uint64_t> recorded_;
};

// splitmix64: the seed expander every case seed goes through (campaign seed + case index).
constexpr std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// xoshiro256** seeded through splitmix64; unbiased bounded draws (Lemire's method).
class PrngChoices final : public Choices {
 public:
  explicit PrngChoices(std::uint64_t seed);
  std::uint64_t next();

 protected:
  std::uint64_t draw_impl(std::uint64_t lo, std::uint64_t hi) override;

 private:
  std::uint64_t s_[4];
};

// Replays a recorded sequence; a value out of the asked range is clamped into it, and draws past
// the end return lo (the simplest choice), so any sequence is a valid case.
class ReplayChoices final : public Choices {
 public:
  explicit ReplayChoices(std::vector<std::uint64_t> values) : values_(std::move(values)) {}

 protected:
  std::uint64_t draw_impl(std::uint64_t lo, std::uint64_t hi) override;

 private:
  std::vector<std::uint64_t> values_;
  std::size_t pos_ = 0;
};

}  // namespace vf
