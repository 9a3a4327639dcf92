// Tests of the plug-in's host memory pool (python/csrc/host_pool.h): a block given back is taken again
// by the next request of its size, each size keeps its own blocks, and trim() releases exactly the
// blocks that stayed free since the last trim. (python/tests/test_host_pool.py tests the tensors torch
// makes of its blocks.)
#include <cstdint>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "python/csrc/host_pool.h"

using gradscale::HostPool;

TEST_CASE("HostPool takes a block given back again, one list per size", "[host_pool]") {
  HostPool pool;
  for (const std::size_t bytes : {std::size_t{100}, HostPool::kMapped, HostPool::kMapped * 3 + 4}) {
    void* a = pool.take(bytes);
    REQUIRE(reinterpret_cast<std::uintptr_t>(a) % HostPool::kAlignment == 0);
    std::memset(a, 0x5a, bytes);  // the whole block is writable
    pool.give_back(a, bytes);
    void* b = pool.take(bytes);
    CHECK(b == a);
    void* c = pool.take(bytes);  // a is out again: a new block
    CHECK(c != a);
    void* other = pool.take(bytes + HostPool::kAlignment);  // another size never takes a's list
    CHECK(other != a);
    CHECK(other != c);
    pool.give_back(b, bytes);
    pool.give_back(c, bytes);
    pool.give_back(other, bytes + HostPool::kAlignment);
  }
  CHECK(pool.taken() == 12);
  CHECK(pool.reused() == 3);
  CHECK(pool.free_bytes() == pool.held_bytes());
  CHECK_THROWS_AS(pool.take(0), std::bad_alloc);
}

TEST_CASE("HostPool::trim releases the blocks that stayed free since the last trim", "[host_pool]") {
  HostPool pool;
  const std::size_t size = 4096;
  std::vector<void*> blocks;
  for (int i = 0; i < 5; ++i) blocks.push_back(pool.take(size));
  for (void* p : blocks) pool.give_back(p, size);
  CHECK(pool.held_bytes() == 5 * size);
  // Every block was out since the pool began: none stayed free the whole time.
  CHECK(pool.trim() == 0);
  CHECK(pool.held_bytes() == 5 * size);
  // A step that needs three of them: two stay free throughout and are released at the next trim.
  std::vector<void*> step;
  for (int i = 0; i < 3; ++i) step.push_back(pool.take(size));
  for (void* p : step) pool.give_back(p, size);
  CHECK(pool.reused() == 3);
  CHECK(pool.trim() == 2 * size);
  CHECK(pool.held_bytes() == 3 * size);
  // A step that needs the same three again releases nothing.
  step.clear();
  for (int i = 0; i < 3; ++i) step.push_back(pool.take(size));
  for (void* p : step) pool.give_back(p, size);
  CHECK(pool.trim() == 0);
  CHECK(pool.reused() == 6);
  // Steps that need none: all of them go, then the size is forgotten.
  CHECK(pool.trim() == 3 * size);
  CHECK(pool.held_bytes() == 0);
  CHECK(pool.trim() == 0);
}

TEST_CASE("HostPool::trim keeps blocks that are out and takes them back afterwards", "[host_pool]") {
  HostPool pool;
  const std::size_t size = HostPool::kMapped;
  void* out = pool.take(size);
  CHECK(pool.trim() == 0);
  CHECK(pool.trim() == 0);  // out for two trims: never released
  CHECK(pool.held_bytes() == size);
  pool.give_back(out, size);
  CHECK(pool.trim() == 0);  // free since this trim only
  CHECK(pool.trim() == size);
  CHECK(pool.held_bytes() == 0);
}

TEST_CASE("HostPool blocks can be given back from other threads", "[host_pool]") {
  HostPool pool;
  std::vector<void*> blocks;
  for (int i = 0; i < 64; ++i) blocks.push_back(pool.take(256));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = t; i < 64; i += 4) pool.give_back(blocks[static_cast<std::size_t>(i)], 256);
    });
  for (std::thread& t : threads) t.join();
  CHECK(pool.free_bytes() == 64 * 256);
  std::set<void*> again;
  for (int i = 0; i < 64; ++i) again.insert(pool.take(256));
  CHECK(again == std::set<void*>(blocks.begin(), blocks.end()));
  for (void* p : again) pool.give_back(p, 256);
}
