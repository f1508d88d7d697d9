// vf::CallableRef (harness/core/callable_ref.h): it calls the referenced callable itself, not a
// copy, and forwards arguments and results.
#include <gtest/gtest.h>

#include <string>

#include "harness/core/callable_ref.h"

namespace vf {
namespace {

int apply(CallableRef<int(int)> f, int x) { return f(x); }

TEST(CallableRef, CallsTheReferencedLambdaAndSeesItsStateChange) {
  int calls = 0;
  int offset = 10;
  auto add = [&calls, &offset](int x) {
    ++calls;
    return x + offset;
  };
  EXPECT_EQ(apply(add, 5), 15);
  offset = 100;
  EXPECT_EQ(apply(add, 5), 105);
  EXPECT_EQ(calls, 2);
}

TEST(CallableRef, AMutableCallableKeepsItsStateAcrossCallsThroughTheReference) {
  // A std::function taking the lambda by value would count in its own copy; the reference counts
  // in the caller's object.
  auto counter = [n = 0]() mutable { return ++n; };
  CallableRef<int()> ref(counter);
  EXPECT_EQ(ref(), 1);
  EXPECT_EQ(ref(), 2);
  EXPECT_EQ(counter(), 3);
}

TEST(CallableRef, ForwardsReferenceArgumentsWithoutCopying) {
  std::string s = "vbar";
  auto append = [](std::string& out) { out += "-page"; };
  CallableRef<void(std::string&)> ref(append);
  ref(s);
  EXPECT_EQ(s, "vbar-page");
}

}  // namespace
}  // namespace vf
