// A non-owning reference to a callable, for callbacks on hot paths: std::function copies a
// capturing lambda larger than its small buffer to the heap, once per call of the function that
// takes it (aimdo's allocation hooks took one per simulated malloc).
// The referenced callable must outlive the CallableRef; pass it down, never store it.
#pragma once

#include <memory>
#include <type_traits>
#include <utility>

namespace vf {

template <class Signature>
class CallableRef;

template <class R, class... Args>
class CallableRef<R(Args...)> {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, CallableRef> &&
                                              std::is_invocable_r_v<R, F&, Args...>>>
  CallableRef(F&& f) noexcept  // NOLINT(google-explicit-constructor): passed like a lambda
      : obj_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* o, Args... args) -> R { return (*static_cast<std::remove_reference_t<F>*>(o))(std::forward<Args>(args)...); }) {}

  R operator()(Args... args) const { return call_(obj_, std::forward<Args>(args)...); }

 private:
  void* obj_;
  R (*call_)(void*, Args...);
};

}  // namespace vf
