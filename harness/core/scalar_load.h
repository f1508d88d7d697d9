// scalar_load: a field read into a general register, never merged with a neighbouring field's
// read into one vector load.
//
// gcc reads two adjacent 8-byte fields used together (a block's address and size) with one
// 16-byte load. Where the two were just written one by one (a merge or a split stores them with
// two 8-byte stores a few instructions before), that load cannot be forwarded from the store
// buffer and waits until both stores reach the cache: about a dozen cycles, on every free that
// merges in the caching model. The empty asm statement takes the value as a register operand,
// so the read stays an 8-byte load that forwards from its store; it emits no instruction.
#pragma once

#include <type_traits>

namespace vf {

template <class T>
[[gnu::always_inline]] inline T scalar_load(const T& field) {
  static_assert((std::is_integral_v<T> || std::is_enum_v<T>) && sizeof(T) <= sizeof(void*),
                "scalar_load is for a field that fits a general register");
  T value = field;
  asm("" : "+r"(value));
  return value;
}

}  // namespace vf
