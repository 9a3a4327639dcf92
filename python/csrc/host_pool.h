// Host memory the PyTorch plug-in hands to torch as tensors and takes back when torch lets go of them
// (python/gradscale/torch/_functions.py, new_like): the rounded copies of layer inputs and outputs and
// the rounded gradients a training step makes on the CPU. glibc returns freed memory at the top of its heap
// to the system once more than a threshold lies free there, and faults the pages in again when they are next
// used; blocks of the same sizes taken again every step from this pool are faulted in once.
//
// Blocks of 64 KiB and more are mapped from the system directly (mmap), outside malloc's heap: the pool
// keeps them, so they neither fault again nor move the top of the heap that torch's own allocations
// share. Smaller ones come from aligned_alloc.
//
// A block goes back to its free list when the last tensor on it is gone (views, saved tensors, `.grad`
// included): torch calls the deleter of the DLPack tensor it was made from (core.cpp). `trim()`, once a
// step, releases the blocks that stayed free since the last trim (each size's low-water mark of free
// blocks), so the pool holds at most about one step's peak of what it handed out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#if defined(__unix__)
#include <sys/mman.h>
#endif

namespace gradscale {

class HostPool {
 public:
  // Blocks are aligned as torch aligns its own CPU allocations.
  static constexpr std::size_t kAlignment = 64;

  HostPool() = default;
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;
  // Blocks of this size and more are mapped (mmap) rather than allocated.
  static constexpr std::size_t kMapped = std::size_t{64} << 10;

  ~HostPool() {
    for (auto& entry : sizes_)
      for (void* p : entry.second.free) release(p, entry.first);
  }

  // A block of at least `bytes` bytes (bytes > 0): a free one of that size, or a new one.
  void* take(std::size_t bytes) {
    if (bytes == 0 || bytes > std::numeric_limits<std::size_t>::max() - kAlignment) throw std::bad_alloc();
    const std::size_t size = rounded(bytes);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      SizeClass& c = sizes_[size];
      ++c.out;
      ++taken_;
      if (!c.free.empty()) {
        void* p = c.free.back();
        c.free.pop_back();
        if (c.free.size() < c.low_water) c.low_water = c.free.size();
        ++reused_;
        return p;
      }
      c.low_water = 0;
    }
    void* p = allocate(size);
    std::lock_guard<std::mutex> lock(mutex_);
    if (p == nullptr) {
      --sizes_[size].out;
      throw std::bad_alloc();
    }
    held_ += size;
    return p;
  }

  // Returns a block from take(bytes) (from any thread: torch frees tensors where their last user is).
  // Never throws: torch calls it from a tensor's destructor.
  void give_back(void* p, std::size_t bytes) noexcept {
    const std::size_t size = rounded(bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = sizes_.find(size);  // found: a size with a block out is never erased
    if (it != sizes_.end()) {
      --it->second.out;
      try {
        it->second.free.push_back(p);
        return;
      } catch (...) {  // no memory for the list: the block goes back to the system
      }
    }
    release(p, size);
    held_ -= size;
  }

  // Releases, for each size, the blocks that stayed free since the last trim; returns the bytes freed.
  std::size_t trim() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::size_t released = 0;
    for (auto it = sizes_.begin(); it != sizes_.end();) {
      SizeClass& c = it->second;
      const std::size_t unused = c.low_water;
      for (std::size_t i = 0; i < unused; ++i) {
        release(c.free.back(), it->first);
        c.free.pop_back();
      }
      released += unused * it->first;
      held_ -= unused * it->first;
      c.low_water = c.free.size();
      if (c.free.empty() && c.out == 0) {
        it = sizes_.erase(it);  // no block of this size left: forget the size
        continue;
      }
      ++it;
    }
    return released;
  }

  // Bytes of the blocks the pool owns (free or out), blocks handed out, and those that were reused.
  std::size_t held_bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return held_;
  }
  std::size_t free_bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::size_t total = 0;
    for (const auto& entry : sizes_) total += entry.first * entry.second.free.size();
    return total;
  }
  std::uint64_t taken() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return taken_;
  }
  std::uint64_t reused() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return reused_;
  }

  // A block's size: `bytes` rounded up to kAlignment (aligned_alloc wants a multiple).
  static std::size_t rounded(std::size_t bytes) noexcept {
    return (bytes + kAlignment - 1) / kAlignment * kAlignment;
  }

 private:
  static void* allocate(std::size_t size) {
#if defined(__unix__)
    if (size >= kMapped) {
      void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      return p == MAP_FAILED ? nullptr : p;
    }
#endif
    return std::aligned_alloc(kAlignment, size);
  }
  static void release(void* p, std::size_t size) noexcept {
#if defined(__unix__)
    if (size >= kMapped) {
      munmap(p, size);
      return;
    }
#endif
    std::free(p);
  }

  struct SizeClass {
    std::vector<void*> free;
    std::size_t low_water = 0;  // the fewest free blocks since the last trim
    std::size_t out = 0;        // blocks handed out and not yet given back
  };
  mutable std::mutex mutex_;
  std::unordered_map<std::size_t, SizeClass> sizes_;
  std::size_t held_ = 0;
  std::uint64_t taken_ = 0;
  std::uint64_t reused_ = 0;
};

}  // namespace gradscale
