// A target's prompt prefix before its codes arrive: the part the consumer's prefix cache holds
// (loaded into the target's cache, under the route's scope: caches of different codes never mix)
// and what the producer's plan will send for the rest, as this consumer expects it
// (TargetRun in consumer/request_runner.cc; a takeover's session sends the plan's chunks of its
// layers only, codec/code_encoder.h ChunksFromLayer).
// Thread-safety: functions of their arguments; the prefix cache locks itself.
#ifndef SCD_CONSUMER_TARGET_PREFIX_H_
#define SCD_CONSUMER_TARGET_PREFIX_H_

#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "codec/code_encoder.h"
#include "consumer/request_runner.h"

namespace scd::consumer {

// What the producer's plan sends for this route and prefix, as this consumer expects it (same
// architecture on both sides: the consumer's config makes the producer's plan).
struct ExpectedTransfer {
  TransferPlan plan;
  const Artifact* artifact = nullptr;  // for modes that need one
  std::vector<PlannedChunk> chunks;
};

// Loads the prefix cache's part of the prompt's prefix (`ids` less its last token) into `cache`;
// returns the positions it held (0 with no prefix cache, or for an early prefill's transfer, whose
// codes cover the whole prefix), and the prefix's keys in *keys (for storing it once complete).
absl::StatusOr<int64_t> LoadCachedPrefix(const ConsumerModel& consumer,
                                         const v1::GenerateRequest& request,
                                         const TargetRoute& route, absl::Span<const TokenId> ids,
                                         std::optional<ConsumerPrefixCache::Keys>* keys,
                                         KvCache* cache);

// A transfer's plan for `tokens` positions (none for a local route), its payload noted in
// `started` (Started.expected_payload_bytes). FAILED_PRECONDITION: a mode that needs the pair's
// artifact without one.
absl::StatusOr<std::optional<ExpectedTransfer>> PlanFor(const ConsumerModel& consumer,
                                                        const TargetRoute& route, int64_t tokens,
                                                        v1::GenerateEvent* started);

}  // namespace scd::consumer

#endif  // SCD_CONSUMER_TARGET_PREFIX_H_
