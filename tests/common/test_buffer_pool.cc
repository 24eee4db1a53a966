#include "common/buffer_pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <thread>
#include <vector>

using namespace pskv;

TEST(BufferPool, ReleasedBuffersAreReused) {
  BufferPool pool(4);
  char* first;
  {
    auto a = pool.Get(1 << 20);
    first = a.get();
    std::memset(a.get(), 1, 1 << 20);  // the whole size is usable
  }
  auto b = pool.Get(1 << 20);
  EXPECT_EQ(b.get(), first);
  auto c = pool.Get(1 << 20);  // the pooled one is taken: a new one
  EXPECT_NE(c.get(), first);
}

TEST(BufferPool, ABufferServesRequestsOfAtLeastHalfItsSize) {
  BufferPool pool(4);
  char* big;
  {
    auto a = pool.Get(1000);
    big = a.get();
  }
  {
    auto small = pool.Get(100);  // far smaller: not given the big buffer
    EXPECT_NE(small.get(), big);
  }
  {
    auto bigger = pool.Get(1001);  // bigger than any pooled buffer
    EXPECT_NE(bigger.get(), big);
  }
  auto half = pool.Get(500);
  EXPECT_EQ(half.get(), big);
}

TEST(BufferPool, KeepsAtMostMaxFreeBuffersAndTheBiggest) {
  BufferPool pool(2);
  std::vector<std::shared_ptr<char>> out;
  for (size_t n : {100, 200, 300}) out.push_back(pool.Get(n));
  std::set<char*> kept = {out[1].get(), out[2].get()};
  out.clear();  // three come back, two are kept: 200 and 300
  auto a = pool.Get(300), b = pool.Get(150);
  EXPECT_TRUE(kept.count(a.get()));
  EXPECT_TRUE(kept.count(b.get()));
}

TEST(BufferPool, BuffersAboveTheKeepLimitAreNotPooled) {
  BufferPool pool(4, 1000);
  pool.Get(1000).reset();
  EXPECT_EQ(pool.free_count(), 1u);
  pool.Get(2000).reset();  // freed, not kept
  EXPECT_EQ(pool.free_count(), 1u);
}

TEST(BufferPool, BuffersMayOutliveThePoolAndMoveBetweenThreads) {
  std::shared_ptr<char> kept;
  {
    BufferPool pool(2);
    kept = pool.Get(64);
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t)
      ts.emplace_back([&pool] {
        for (int i = 0; i < 1000; ++i) {
          auto b = pool.Get(static_cast<size_t>(64 + i % 64));
          b.get()[0] = 1;
        }
      });
    for (auto& t : ts) t.join();
  }
  kept.get()[63] = 2;  // still valid; freed when released (ASan checks both)
  kept.reset();
}
