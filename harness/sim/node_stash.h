// A stash of spare nodes for a node-based ordered container (std::set / std::map), so the
// allocator models can insert and erase free-list entries millions of times without calling
// operator new: an erased node is extracted and kept, the next insert rewrites its value and
// links it back in. Iterators to other elements stay valid as usual.
#pragma once

#include <utility>
#include <vector>

namespace vf::sim {

template <class Container>
class NodeStash {
 public:
  using iterator = typename Container::iterator;
  using value_type = typename Container::value_type;

  // Inserts `value` (which must not be present) reusing a spare node when there is one.
  iterator insert(Container& c, const value_type& value) {
    if (spare_.empty()) return c.insert(value).first;
    auto node = std::move(spare_.back());
    spare_.pop_back();
    assign(node, value);
    return c.insert(std::move(node)).position;
  }

  // Erases the element at `it` and keeps its node for the next insert.
  void erase(Container& c, iterator it) { spare_.push_back(c.extract(it)); }

 private:
  using node_type = typename Container::node_type;

  // std::set nodes expose value(); std::map nodes expose key() and mapped().
  static void assign(node_type& node, const value_type& value) {
    if constexpr (requires { node.value(); }) {
      node.value() = value;
    } else {
      node.key() = value.first;
      node.mapped() = value.second;
    }
  }

  std::vector<node_type> spare_;
};

}  // namespace vf::sim
