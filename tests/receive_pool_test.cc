// ReceivePool: buffers by power-of-two class, reused after release, registered once through the
// hooks and unregistered at Shutdown; the caps; a Payload outliving the pool's owner.
#include "transport/receive_pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>

namespace scd::transport {
namespace {

TEST(ReceivePoolTest, ReusesReleasedBuffersOfTheSameClass) {
  std::shared_ptr<ReceivePool> pool = ReceivePool::Create({});
  uint8_t* first = nullptr;
  {
    Payload p = pool->Get(100000, &first);  // class 128 KiB
    EXPECT_EQ(p.size(), 100000u);
    std::memset(first, 7, 100000);
  }
  EXPECT_EQ(pool->idle_bytes(), size_t{128} << 10);
  uint8_t* second = nullptr;
  Payload again = pool->Get(120000, &second);
  EXPECT_EQ(second, first);  // the same buffer, faulted in once
  EXPECT_EQ(pool->idle_bytes(), 0u);
  uint8_t* other = nullptr;
  Payload bigger = pool->Get(200000, &other);  // class 256 KiB: another buffer
  EXPECT_NE(other, first);
  EXPECT_EQ(pool->mapped_bytes(), size_t{384} << 10);
}

TEST(ReceivePoolTest, SmallAndHugeRequestsGetPlainCountedBuffers) {
  ReceivePool::Options options;
  options.min_pooled_bytes = size_t{256} << 10;
  std::shared_ptr<ReceivePool> pool = ReceivePool::Create(options);
  const int64_t live = LiveTransportBuffers();
  uint8_t* small = nullptr;
  Payload a = pool->Get(1000, &small);
  uint8_t* huge = nullptr;
  Payload b = pool->Get((size_t{64} << 20) + 1, &huge);  // above the largest class
  EXPECT_EQ(pool->mapped_bytes(), 0u);
  EXPECT_EQ(LiveTransportBuffers(), live + 2);
}

TEST(ReceivePoolTest, CapsOnMappedAndIdleBytes) {
  ReceivePool::Options options;
  options.max_mapped_bytes = size_t{1} << 20;
  options.max_idle_bytes = size_t{512} << 10;
  std::shared_ptr<ReceivePool> pool = ReceivePool::Create(options);
  ReceivePool::Buffer* a = pool->Take(size_t{512} << 10);
  ReceivePool::Buffer* b = pool->Take(size_t{512} << 10);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(pool->Take(64 << 10), nullptr);  // at the mapped cap
  pool->Give(a);
  pool->Give(b);  // beyond the idle cap: unmapped
  EXPECT_EQ(pool->idle_bytes(), size_t{512} << 10);
  EXPECT_EQ(pool->mapped_bytes(), size_t{512} << 10);
}

TEST(ReceivePoolTest, RegistersEachBufferOnceAndUnregistersAtShutdown) {
  std::set<void*> registered;
  int unregistered = 0;
  ReceivePool::Options options;
  int handle_counter = 0;
  options.register_memory = [&](void* data, size_t bytes) -> void* {
    EXPECT_GE(bytes, ReceivePool::kMinClassBytes);
    registered.insert(data);
    return reinterpret_cast<void*>(static_cast<uintptr_t>(++handle_counter));
  };
  options.unregister_memory = [&](void*) { ++unregistered; };
  std::shared_ptr<ReceivePool> pool = ReceivePool::Create(options);
  ReceivePool::Buffer* a = pool->Take(70000);
  ASSERT_NE(a, nullptr);
  EXPECT_NE(a->registration, nullptr);
  Payload held = pool->Wrap(a, 70000);
  for (int i = 0; i < 3; ++i) {
    ReceivePool::Buffer* b = pool->Take(70000);  // a is in use: a second buffer, then reused
    pool->Give(b);
  }
  EXPECT_EQ(registered.size(), 2u);
  pool->Shutdown();
  EXPECT_EQ(unregistered, 2);
  EXPECT_EQ(pool->Take(70000), nullptr);
  held.Reset();  // returned after Shutdown: unmapped, not unregistered again
  EXPECT_EQ(unregistered, 2);
  EXPECT_EQ(pool->mapped_bytes(), 0u);
}

TEST(ReceivePoolTest, APayloadKeepsItsPoolAlive) {
  uint8_t* bytes = nullptr;
  Payload p;
  {
    std::shared_ptr<ReceivePool> pool = ReceivePool::Create({});
    p = pool->Get(1 << 20, &bytes);
  }
  std::memset(bytes, 1, 1 << 20);  // still mapped
  p.Reset();
}

}  // namespace
}  // namespace scd::transport
