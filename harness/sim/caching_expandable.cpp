// The expandable-segments device layer of the caching allocator (expandable_segments:True,
// cuda-allocators.md §1.8, §7.4). Everything above the device (rounding, pools, best fit,
// events, the retry ladder, stats) is shared with the native layer in caching.cpp.
//
// Per (stream, pool) the allocator reserves one range of virtual addresses, 1.125 x the
// device's total memory, without physical memory. Blocks cover that range: free and allocated
// blocks are mapped, the rest is `unmapped`. A miss maps physical pages, 2 MiB for the small
// pool and large_segment_size (20 MiB) for the large pool, at the lowest address where free
// mapped bytes plus unmapped VA hold the *rounded request* (not the native segment size), so the
// free tail of the segment is used before new pages are mapped and reserved grows in whole pages.
// On empty_cache / the OOM ladder every whole page inside a free block is unmapped again. Pages
// and address ranges come from the DeviceLayer (simulated or real, device_layer.h).
#include "harness/sim/caching.h"

#include <algorithm>

namespace vf::sim {

Bytes CachingAllocator::expandable_size(Index bi) const {
  const Block& b = blocks_[bi];
  const bool tail = b.next != kNone && blocks_[b.next].state == State::unmapped;
  return b.size + (tail ? blocks_[b.next].size : 0);
}

CachingAllocator::Index CachingAllocator::map_expandable(Pool& pool, StreamId stream, Bytes rounded) {
  const Index c = find_expandable_candidate(pool, stream, rounded);
  if (c == kNone) {
    last_failure_ = Failure::device;
    return kNone;
  }
  const Bytes page = segments_[blocks_[c].segment].page;

  // Walk the run of free / unmapped blocks from the candidate and collect the page runs to map:
  // the front of each unmapped block in the run, in whole pages.
  Bytes covered = 0;
  map_pieces_.clear();
  for (Index i = c; covered < rounded; i = blocks_[i].next) {
    const Block& b = blocks_[i];
    if (b.state == State::free) {
      covered += b.size;
    } else {
      const Bytes bytes = round_up(std::min(b.size, rounded - covered), page);
      map_pieces_.emplace_back(b.addr, bytes);
      covered += bytes;
    }
  }
  // All pages of one request are mapped or none: a failed request leaves no half-mapped pages
  // behind (PyTorch releases the pages of a failed map too). The blocks are updated only after
  // the device said yes.
  for (std::size_t k = 0; k < map_pieces_.size(); ++k) {
    if (device_.map_pages(map_pieces_[k].first, map_pieces_[k].second, page)) continue;
    while (k-- > 0) device_.unmap_pages(map_pieces_[k].first, map_pieces_[k].second, page);
    last_failure_ = Failure::device;
    return kNone;
  }
  Index cur = c;
  if (blocks_[cur].state == State::unmapped) cur = map_block(cur, std::min(blocks_[cur].size, rounded));
  while (blocks_[cur].size < rounded) {
    const Index next = blocks_[cur].next;  // the run alternates free -> unmapped -> ...
    cur = map_block(next, std::min(blocks_[next].size, rounded - blocks_[cur].size));
  }
  erase_free(cur);
  return cur;
}

// The lowest address, on this stream's segments of this pool, where free plus unmapped space
// holds `size`; a fresh segment when none does.
CachingAllocator::Index CachingAllocator::find_expandable_candidate(Pool& pool, StreamId stream, Bytes size) {
  auto allocatable = [&](Index i) {
    return i != kNone && (blocks_[i].state == State::free || blocks_[i].state == State::unmapped);
  };
  auto has_space = [&](Index i) {
    Bytes bytes = 0;
    while (bytes < size && allocatable(i)) {
      bytes += blocks_[i].size;
      i = blocks_[i].next;
    }
    return bytes >= size;
  };
  for (auto it = pool.unmapped.lower_bound(UnmappedKey{stream, 0, 0});
       it != pool.unmapped.end() && it->stream == stream; ++it) {
    Index c = it->block;
    const Index prev = blocks_[c].prev;
    if (prev != kNone && blocks_[prev].state == State::free) c = prev;  // grow the free tail
    if (has_space(c)) return c;
  }
  const Index fresh = new_expandable_segment(pool, stream);
  return blocks_[fresh].size >= size ? fresh : kNone;
}

CachingAllocator::Index CachingAllocator::new_expandable_segment(Pool& pool, StreamId stream) {
  const Bytes page = pool.small ? kSmallBuffer : options_.large_segment_size;
  const Bytes total = device_.spec().total;
  // VA = ceil(1.125 x total / page) pages (computed without overflowing 64 bits).
  const Bytes va_wanted = total / kExpandableVaDen * kExpandableVaNum + total % kExpandableVaDen * kExpandableVaNum / kExpandableVaDen;
  const Bytes va = std::max<Bytes>(ceil_div(va_wanted, page), 1) * page;
  const Index s = new_segment_slot();
  Segment& seg = segments_[s];
  seg.live = true;
  seg.page = page;
  seg.base = device_.reserve_va(va, kDevicePage);
  const Index bi = new_block();
  Block& b = blocks_[bi];
  b.addr = seg.base;
  b.size = va;
  b.segment = s;
  b.stream = stream;
  b.small = pool.small;
  insert_unmapped(bi);
  return bi;
}

// Maps the first `bytes` (rounded up to whole pages) of an unmapped block and merges the new
// free block with free neighbours. The device was already charged by map_expandable.
CachingAllocator::Index CachingAllocator::map_block(Index ui, Bytes bytes) {
  bytes = round_up(bytes, segments_[blocks_[ui].segment].page);
  erase_unmapped(ui);
  if (bytes < blocks_[ui].size) {
    const Index ri = new_block();  // may move blocks_: take references after it
    Block& u = blocks_[ui];
    Block& rest = blocks_[ri];
    rest.addr = u.addr + bytes;
    rest.size = u.size - bytes;
    rest.segment = u.segment;
    rest.stream = u.stream;
    rest.small = u.small;
    rest.prev = ui;
    rest.next = u.next;
    if (u.next != kNone) blocks_[u.next].prev = ri;
    u.next = ri;
    u.size = bytes;
    insert_unmapped(ri);
  }
  blocks_[ui].state = State::free;
  stats_.reserved.add(bytes);
  ++stats_.num_device_alloc;
  try_merge(ui, blocks_[ui].prev);
  try_merge(ui, blocks_[ui].next);
  insert_free(ui);
  return ui;
}

// Unmaps the whole pages inside a free block; partial pages at either end stay mapped as
// smaller free blocks.
void CachingAllocator::unmap_block(Index bi) {
  const Segment& seg = segments_[blocks_[bi].segment];
  const DeviceAddr base = seg.base;
  const Bytes page = seg.page;
  const Bytes off = blocks_[bi].addr - base;
  const Bytes end_off = off + blocks_[bi].size;
  const Bytes begin = round_up(off, page);
  const Bytes end = end_off / page * page;
  if (end <= begin) return;
  erase_free(bi);
  // new_block() may move blocks_, so references are taken after it.
  auto split_off = [&](DeviceAddr addr, Bytes size, bool before) {
    const Index ni = new_block();
    Block& n = blocks_[ni];
    Block& b = blocks_[bi];
    n.addr = addr;
    n.size = size;
    n.segment = b.segment;
    n.stream = b.stream;
    n.small = b.small;
    if (before) {
      n.prev = b.prev;
      n.next = bi;
      if (b.prev != kNone) blocks_[b.prev].next = ni;
      b.prev = ni;
    } else {
      n.prev = bi;
      n.next = b.next;
      if (b.next != kNone) blocks_[b.next].prev = ni;
      b.next = ni;
    }
    insert_free(ni);
  };
  if (begin > off) split_off(base + off, begin - off, true);
  if (end_off > end) split_off(base + end, end_off - end, false);
  const Bytes bytes = end - begin;
  blocks_[bi].addr = base + begin;
  blocks_[bi].size = bytes;
  merge_unmapped(bi, blocks_[bi].prev);
  merge_unmapped(bi, blocks_[bi].next);
  insert_unmapped(bi);
  device_.unmap_pages(base + begin, bytes, page);
  stats_.reserved.sub(bytes);
  ++stats_.num_device_free;
}

void CachingAllocator::merge_unmapped(Index dst, Index src) {
  if (src == kNone || blocks_[src].state != State::unmapped) return;
  erase_unmapped(src);
  (void)absorb(dst, src);
}

// empty_cache / OOM ladder: unmap every free page (after the device sync the caller did), and
// give back the VA of a segment that ends up entirely unmapped.
void CachingAllocator::release_pool_expandable(Pool& pool) {
  scratch_.clear();
  pool.blocks.collect(scratch_);
  for (const Index bi : scratch_) {
    unmap_block(bi);
    const Block& b = blocks_[bi];
    if (b.state == State::unmapped && b.prev == kNone && b.next == kNone) {
      erase_unmapped(bi);
      device_.release_va(b.addr, b.size);
      segments_[b.segment].live = false;
      spare_segments_.push_back(b.segment);
      recycle_block(bi);
    }
  }
}

}  // namespace vf::sim
