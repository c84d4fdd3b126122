// The shared-prefix code cache through the whole serving path (coordinator, producer, consumers as
// gRPC servers, codes over the gRPC transport), real weights: the hard pair (stories260k ->
// llama2xs-260k) and the easy pair (stories260k -> stories260k-fables), both in scd mode. The
// reference is the same request on a stack with every cache off. Greedy tokens with a producer
// hit, a consumer hit and both equal it, for a repeated prompt and for one that extends a cached
// prefix; Started/Finished say how many prompt positions each cache served and the consumer's
// payload shrinks to the positions it lacked; a different cache_salt never hits; results stay
// equal while a small budget evicts; local mode uses the consumer's cache too; a request
// cancelled mid-prefill leaves no producer entry (and the next one computes and stores it); the
// producer's budget bounds the memory its blocks hold (malloc's count).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/change_notice.h"
#include "base/process_memory.h"
#include "producer/prefix_store.h"
#include "proto/wire_mode.h"
#include "tests/serving_stack.h"
#include "tests/test_util.h"

namespace scd {
namespace {

using Reply = testing::ServingReply;

constexpr int kMaxTokens = 10;

struct Cached {
  uint32_t producer = 0, consumer = 0;
  uint64_t payload = 0;
  std::string mode;
};

Cached CachedOf(const Reply& reply, const std::string& target) {
  Cached c;
  for (const v1::GenerateEvent& e : reply.events.at(target)) {
    if (e.has_finished()) {
      c.producer = e.finished().producer_cached_tokens();
      c.consumer = e.finished().consumer_cached_tokens();
      c.payload = e.finished().payload_bytes();
      c.mode = RanModeName(e.finished());
    }
    if (e.has_error()) ADD_FAILURE() << target << ": " << e.error().message();
  }
  return c;
}

uint32_t StartedConsumerCached(const Reply& reply, const std::string& target) {
  for (const v1::GenerateEvent& e : reply.events.at(target)) {
    if (e.has_started()) return e.started().consumer_cached_tokens();
  }
  return 0;
}

class PrefixCacheTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    producer_ = testing::Ok(LlamaModel::Load(testing::ModelDir("stories260k"), {})).release();
    tokenizer_ =
        testing::Ok(Tokenizer::FromFile(testing::ModelDir("stories260k") + "/tokenizer.json"))
            .release();
    // A long story: prompts are its first N tokens (extensions of each other) or forks of it.
    std::ifstream in(testing::SharedDir() + "/data/tinystories_valid_hf.txt");
    std::stringstream text;
    text << in.rdbuf();
    story_ = new std::vector<TokenId>(testing::Ok(tokenizer_->Encode(text.str().substr(0, 4000))));
    ASSERT_GE(story_->size(), 200u);
  }
  static void TearDownTestSuite() {
    delete story_;
    delete tokenizer_;
    delete producer_;
  }

  static std::vector<TokenId> Story(size_t n) {
    return std::vector<TokenId>(story_->begin(), story_->begin() + n);
  }
  // The story's first `shared` tokens, then `n - shared` others (a different continuation).
  static std::vector<TokenId> Fork(size_t shared, size_t n) {
    std::vector<TokenId> ids = Story(shared);
    for (size_t i = shared; i < n; ++i) ids.push_back((*story_)[i + 100]);
    return ids;
  }

  std::unique_ptr<testing::ServingStack> Stack(int64_t producer_cache, int64_t consumer_cache) {
    testing::ServingStack::Options options;
    options.producer_prefix_cache_bytes = producer_cache;
    options.consumer_prefix_cache_bytes = consumer_cache;
    auto stack = std::make_unique<testing::ServingStack>(producer_, tokenizer_, "stories260k",
                                                         options);
    for (const auto& [name, dir] : {std::pair<std::string, std::string>{"xs", "llama2xs-260k"},
                                    {"fables", "stories260k-fables"}}) {
      stack->AddConsumer(name, testing::Ok(LlamaModel::Load(testing::ModelDir(dir), {})),
                         testing::SyntheticArtifact(*producer_));
    }
    stack->Start();
    return stack;
  }

  static v1::GenerateRequest Request(const std::string& target, const std::vector<TokenId>& ids,
                                     const std::string& salt = "", const std::string& mode = "scd") {
    v1::GenerateRequest request;
    request.add_targets(target);
    SetRequestMode(*ParseRequestedMode(mode), &request);
    for (TokenId id : ids) request.add_prompt_ids(id);
    request.set_max_tokens(kMaxTokens);
    request.set_cache_salt(salt);
    return request;
  }

  // Greedy tokens of the request on a stack with every cache off.
  std::vector<TokenId> Reference(const std::string& target, const std::vector<TokenId>& ids,
                                 const std::string& mode = "scd") {
    if (!reference_) reference_ = Stack(0, 0);
    Reply reply = reference_->Generate(Request(target, ids, "", mode));
    EXPECT_TRUE(reply.status.ok()) << reply.status.error_message();
    const Cached c = CachedOf(reply, target);
    EXPECT_EQ(c.producer + c.consumer, 0u);
    return reply.ids[target];
  }

  static LlamaModel* producer_;
  static Tokenizer* tokenizer_;
  static std::vector<TokenId>* story_;
  std::unique_ptr<testing::ServingStack> reference_;
};

LlamaModel* PrefixCacheTest::producer_ = nullptr;
Tokenizer* PrefixCacheTest::tokenizer_ = nullptr;
std::vector<TokenId>* PrefixCacheTest::story_ = nullptr;

// 90-token prompt: its prefix (89 positions) has 5 full blocks (80 positions).
TEST_F(PrefixCacheTest, BothCachesServeARepeatAndAnExtensionExactly) {
  auto stack = Stack(64 << 20, 64 << 20);
  for (const std::string target : {"xs", "fables"}) {
    SCOPED_TRACE(target);
    const bool first = target == "xs";
    Reply cold = stack->Generate(Request(target, Story(90)));
    ASSERT_TRUE(cold.status.ok()) << cold.status.error_message();
    const Cached c0 = CachedOf(cold, target);
    // xs runs first: both cold. fables: the producer holds the prefix already (from xs's
    // request), its own cache is cold.
    EXPECT_EQ(c0.producer, first ? 0u : 80u);
    EXPECT_EQ(c0.consumer, 0u);
    EXPECT_EQ(cold.ids[target], Reference(target, Story(90)));

    Reply repeat = stack->Generate(Request(target, Story(90)));
    const Cached c1 = CachedOf(repeat, target);
    EXPECT_EQ(c1.producer, 80u);
    EXPECT_EQ(c1.consumer, 80u);
    EXPECT_EQ(StartedConsumerCached(repeat, target), 80u);
    EXPECT_LT(c1.payload * 4, c0.payload);  // 9 positions of 89 travel
    EXPECT_EQ(repeat.ids[target], cold.ids[target]);

    // 130 tokens extending the 90: the first 5 blocks hit on both sides, the rest is computed.
    Reply longer = stack->Generate(Request(target, Story(130)));
    const Cached c2 = CachedOf(longer, target);
    EXPECT_EQ(c2.producer, first ? 80u : 128u);  // fables: xs's extension left 8 blocks
    EXPECT_EQ(c2.consumer, 80u);
    EXPECT_EQ(longer.ids[target], Reference(target, Story(130)));
  }
  const PrefixCacheCounters p = stack->producer_service().prefix_store()->blocks().Counters();
  EXPECT_EQ(p.entries, 8u);  // the 130-token prompt's 8 blocks (the 90's 5 are among them)
  EXPECT_GE(p.hits, 4u);
  EXPECT_EQ(stack->producer_service().prefill_tokens(),
            89u + 9u + 49u + 9u + 9u + 1u);  // xs: 89, 9, 49; fables: 9, 9, 1
}

TEST_F(PrefixCacheTest, ProducerHitAloneAndConsumerHitAloneAreExact) {
  for (const bool producer_side : {true, false}) {
    SCOPED_TRACE(producer_side ? "producer cache" : "consumer cache");
    auto stack = producer_side ? Stack(64 << 20, 0) : Stack(0, 64 << 20);
    for (const std::string target : {"xs", "fables"}) {
      ASSERT_TRUE(stack->Generate(Request(target, Story(100))).status.ok());
      Reply hit = stack->Generate(Request(target, Fork(80, 120)));  // shares 5 blocks
      const Cached c = CachedOf(hit, target);
      // The producer is shared: fables finds xs's whole fork (7 blocks) too.
      EXPECT_EQ(c.producer, producer_side ? (target == "xs" ? 80u : 112u) : 0u) << target;
      EXPECT_EQ(c.consumer, producer_side ? 0u : 80u) << target;
      EXPECT_EQ(hit.ids[target], Reference(target, Fork(80, 120))) << target;
    }
  }
}

TEST_F(PrefixCacheTest, ADifferentSaltNeverHits) {
  auto stack = Stack(64 << 20, 64 << 20);
  ASSERT_TRUE(stack->Generate(Request("xs", Story(90), "tenant-a")).status.ok());
  Reply other = stack->Generate(Request("xs", Story(90), "tenant-b"));
  const Cached b = CachedOf(other, "xs");
  EXPECT_EQ(b.producer, 0u);
  EXPECT_EQ(b.consumer, 0u);
  Reply unsalted = stack->Generate(Request("xs", Story(90)));
  EXPECT_EQ(CachedOf(unsalted, "xs").producer + CachedOf(unsalted, "xs").consumer, 0u);
  Reply same = stack->Generate(Request("xs", Story(90), "tenant-a"));
  EXPECT_EQ(CachedOf(same, "xs").producer, 80u);
  EXPECT_EQ(CachedOf(same, "xs").consumer, 80u);
  EXPECT_EQ(other.ids["xs"], same.ids["xs"]);
  EXPECT_EQ(same.ids["xs"], Reference("xs", Story(90)));
}

TEST_F(PrefixCacheTest, ResultsStayExactWhileASmallBudgetEvicts) {
  // Room for about 3 blocks on each side: every prompt evicts another's blocks.
  const int64_t producer_block = 5 * 2 * 4 * 16 * 8 * 4 + 2 * 16 * 64 * 4;  // K,V + patch inputs
  auto stack = Stack(3 * producer_block, 3 * 5 * 2 * 4 * 16 * 8 * 4);
  for (int round = 0; round < 2; ++round) {
    for (size_t shared : {48u, 64u, 32u}) {
      const std::vector<TokenId> prompt = Fork(shared, shared + 40);
      Reply reply = stack->Generate(Request("xs", prompt));
      ASSERT_TRUE(reply.status.ok());
      EXPECT_EQ(reply.ids["xs"], Reference("xs", prompt)) << round << " " << shared;
    }
  }
  EXPECT_GT(stack->producer_service().prefix_store()->blocks().Counters().evictions, 0u);
  EXPECT_GT(stack->consumer("xs").prefix_cache->blocks().Counters().evictions, 0u);
  EXPECT_LE(stack->consumer("xs").prefix_cache->blocks().Counters().bytes,
            static_cast<uint64_t>(3 * 5 * 2 * 4 * 16 * 8 * 4));
}

// The producer keeps the codes it encoded with the blocks, per encoding: a later producer hit of
// the same encoding sends them as kept (code hits, the same bytes and tokens as caches off), one
// of another encoding (raw K/V) encodes its own from the cached activations, then keeps those.
TEST_F(PrefixCacheTest, ProducerKeepsCodesPerEncoding) {
  auto stack = Stack(64 << 20, 0);  // no consumer cache: every request's prefix travels whole
  producer::ProducerPrefixStore* store = stack->producer_service().prefix_store();
  Reply cold = stack->Generate(Request("xs", Story(90)));
  ASSERT_TRUE(cold.status.ok());
  EXPECT_EQ(store->code_hit_tokens(), 0u);
  const uint64_t bytes_scd = store->blocks().Counters().bytes;

  Reply hit = stack->Generate(Request("xs", Story(90)));
  const Cached c = CachedOf(hit, "xs");
  EXPECT_EQ(c.producer, 80u);
  EXPECT_EQ(store->code_hit_tokens(), 80u);  // 5 blocks' codes sent as kept
  EXPECT_EQ(c.payload, CachedOf(cold, "xs").payload);
  EXPECT_EQ(hit.ids["xs"], Reference("xs", Story(90)));
  // fables has its own artifact (fitted for its pair): another encoding, so its first request
  // encodes from the cached activations, its second sends what the first kept.
  Reply fables = stack->Generate(Request("fables", Story(90)));
  EXPECT_EQ(CachedOf(fables, "fables").producer, 80u);
  EXPECT_EQ(store->code_hit_tokens(), 80u);
  Reply fables_again = stack->Generate(Request("fables", Story(90)));
  EXPECT_EQ(store->code_hit_tokens(), 160u);
  EXPECT_EQ(fables.ids["fables"], Reference("fables", Story(90)));
  EXPECT_EQ(fables_again.ids["fables"], fables.ids["fables"]);

  // raw: the activations hit, its codes are encoded (no code hit), then kept with the blocks.
  Reply raw = stack->Generate(Request("xs", Story(90), "", "raw"));
  EXPECT_EQ(CachedOf(raw, "xs").producer, 80u);
  EXPECT_EQ(store->code_hit_tokens(), 160u);
  EXPECT_GT(store->blocks().Counters().bytes, bytes_scd);
  Reply raw_again = stack->Generate(Request("xs", Story(100), "", "raw"));  // extends the 90
  EXPECT_EQ(store->code_hit_tokens(), 240u);
  EXPECT_EQ(raw.ids["xs"], Reference("xs", Story(90), "raw"));
  EXPECT_EQ(raw_again.ids["xs"], Reference("xs", Story(100), "raw"));
  // raw ignores the artifact: xs and fables share one encoding, so a fan-out to both encodes it
  // once (both get the same chunks) and each is sent from what the raw runs above kept.
  v1::GenerateRequest both = Request("xs", Story(100), "", "raw");
  both.add_targets("fables");
  const uint64_t before_fan_out = store->code_hit_tokens();
  Reply fan_out = stack->Generate(both);
  EXPECT_EQ(store->code_hit_tokens(), before_fan_out + 2 * 96u);  // 6 blocks, each target
  EXPECT_EQ(fan_out.ids["xs"], raw_again.ids["xs"]);
  EXPECT_EQ(fan_out.ids["fables"], Reference("fables", Story(100), "raw"));
  EXPECT_EQ(CachedOf(fan_out, "fables").payload, CachedOf(fan_out, "xs").payload);
  // int4 K/V: groups of 32 values span several positions at this head size (8), so its chunks
  // cannot be cut per block: nothing is kept, every hit encodes again, results stay exact.
  const uint64_t before_int4 = store->code_hit_tokens();
  for (int i = 0; i < 2; ++i) {
    Reply int4 = stack->Generate(Request("xs", Story(90), "", "int4"));
    EXPECT_EQ(CachedOf(int4, "xs").producer, 80u);
    EXPECT_EQ(int4.ids["xs"], Reference("xs", Story(90), "int4"));
  }
  EXPECT_EQ(store->code_hit_tokens(), before_int4);
}

// The producer's budget bounds the memory its blocks really hold: blocks with codes of three
// encodings (xs's and fables's scd, raw) kept under a 1 MiB budget, then, with everything else
// gone, the bytes malloc gets back when they are released against what the cache counted for
// them. Before blocks were counted by HeldBytes and kept compact (model/tensor_memory.h), they
// held 1.7x what was counted (1.77 MB for 1.04 counted: every tensor's ~380 bytes of objects,
// and the code chunks, reshape views, kept their base tensors too).
TEST_F(PrefixCacheTest, TheProducersBudgetBoundsWhatItsBlocksHold) {
  constexpr int64_t kBudget = int64_t{1} << 20;
  constexpr int kSalts = 40;
  auto stack = Stack(kBudget, 0);
  producer::ProducerPrefixStore* store = stack->producer_service().prefix_store();
  for (int i = 0; i < kSalts; ++i) {
    const std::string salt = absl::StrCat("tenant-", i);
    for (const auto& [target, mode] :
         {std::pair<std::string, std::string>{"xs", "scd"}, {"fables", "scd"}, {"xs", "raw"}}) {
      ASSERT_TRUE(stack->Generate(Request(target, Story(90), salt, mode)).status.ok());
    }
  }
  const PrefixCacheCounters counters = store->blocks().Counters();
  EXPECT_GT(counters.evictions, 0u);
  EXPECT_LE(counters.bytes, static_cast<uint64_t>(kBudget));
  std::vector<std::shared_ptr<const producer::ProducerBlock>> held;
  int64_t counted = 0;
  size_t with_three_encodings = 0;
  for (int i = 0; i < kSalts; ++i) {
    const auto keys = store->KeysFor(absl::StrCat("tenant-", i), Story(89));
    for (auto& block : store->Lookup(keys, keys.keys.size()).blocks) {
      counted += block->bytes();
      with_three_encodings += block->codes.size() == 3;
      held.push_back(std::move(block));
    }
  }
  EXPECT_EQ(static_cast<uint64_t>(counted), counters.bytes);  // every block the cache holds
  EXPECT_GT(with_three_encodings, 5u);
  stack.reset();
  reference_.reset();
  const int64_t before = MallocInUseBytes();
  held.clear();
  const int64_t freed = before - MallocInUseBytes();
  std::cout << "the blocks held " << freed << " bytes, the cache counted " << counted << "\n";
  EXPECT_NEAR(static_cast<double>(freed), static_cast<double>(counted), 0.1 * counted)
      << "the blocks held " << freed << " bytes, the cache counted " << counted;
}

TEST_F(PrefixCacheTest, LocalModeUsesTheConsumersCache) {
  auto stack = Stack(0, 64 << 20);
  ASSERT_TRUE(stack->Generate(Request("fables", Story(90), "", "local")).status.ok());
  Reply warm = stack->Generate(Request("fables", Story(100), "", "local"));
  EXPECT_EQ(CachedOf(warm, "fables").consumer, 80u);
  EXPECT_EQ(CachedOf(warm, "fables").mode, "local");
  EXPECT_EQ(warm.ids["fables"], Reference("fables", Story(100), "local"));
}

}  // namespace
}  // namespace scd

namespace scd {
namespace {

// A prefill long enough to cancel in the middle: SmolLM2-135M's shape, dummy weights, 6 layers,
// a 1024-token prompt (about a second here), raw codes between identical weights.
TEST(PrefixCacheCancelTest, ARequestCancelledMidPrefillLeavesNoEntry) {
  auto model = [] {
    return testing::Ok(LlamaModel::DummyFromConfig(
        testing::SharedDir() + "/configs/smollm2-135m.json", 1, 6, {}));
  };
  std::unique_ptr<LlamaModel> producer = model();
  testing::ServingStack::Options options;
  options.producer_prefix_cache_bytes = int64_t{256} << 20;
  options.consumer_prefix_cache_bytes = int64_t{256} << 20;
  testing::ServingStack stack(producer.get(), nullptr, "smol", options);
  stack.AddConsumer("smol-copy", model(), std::nullopt);
  stack.Start();
  v1::GenerateRequest request;
  request.add_targets("smol-copy");
  SetRequestMode(*ParseRequestedMode("raw"), &request);
  for (int i = 0; i < 1024; ++i) request.add_prompt_ids((i * 7919) % 49152);
  request.set_max_tokens(2);

  // Cancelled by the client while the producer runs its forward pass.
  const absl::Time start = absl::Now();
  {
    grpc::ClientContext context;
    auto reader = stack.stub().Generate(&context, request);
    // Started comes once the consumer admitted it; the producer's prefill begins right after.
    v1::GenerateEvent event;
    ASSERT_TRUE(reader->Read(&event));
    ASSERT_TRUE(event.has_started());
    ASSERT_TRUE(AwaitChange([&] { return stack.producer_service().running() > 0; },
                            absl::Now() + absl::Seconds(30)))
        << "the producer's prefill never started";
    context.TryCancel();
    while (reader->Read(&event)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  // Wait for the producer to see it (its pass over, whatever it stores stored) before looking at
  // its cache.
  ASSERT_TRUE(AwaitChange(
      [&] {
        return stack.producer_service().open_sessions() == 0 &&
               stack.producer_service().running() == 0;
      },
      absl::Now() + absl::Seconds(30)));
  const absl::Duration cancelled_after = absl::Now() - start;
  const PrefixCacheCounters cancelled =
      stack.producer_service().prefix_store()->blocks().Counters();
  EXPECT_EQ(cancelled.entries, 0u) << "after " << cancelled_after;
  EXPECT_EQ(cancelled.inserted, 0u);
  EXPECT_EQ(stack.producer_service().prefill_tokens(), 0u);  // the pass was cut short
  EXPECT_EQ(stack.consumer("smol-copy").prefix_cache->blocks().Counters().entries, 0u);

  // The same request, not cancelled: computes the whole prefix and stores its 63 blocks.
  testing::ServingReply done = stack.Generate(request);
  ASSERT_TRUE(done.status.ok()) << done.status.error_message();
  const PrefixCacheCounters stored = stack.producer_service().prefix_store()->blocks().Counters();
  EXPECT_EQ(stored.entries, 1023u / 16);
  EXPECT_EQ(stack.producer_service().prefill_tokens(), 1023u);  // the cancelled pass: not counted
  EXPECT_EQ(stack.consumer("smol-copy").prefix_cache->blocks().Counters().entries, 1023u / 16);
}

}  // namespace
}  // namespace scd
