// Whether this test binary runs under AddressSanitizer (gcc defines __SANITIZE_ADDRESS__, clang
// answers __has_feature): suites that time things or allocate heavily scale their budgets by it.
#pragma once

namespace vf::test {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

}  // namespace vf::test
