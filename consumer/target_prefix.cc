#include "consumer/target_prefix.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "codec/transfer_mode.h"

namespace scd::consumer {
namespace {

absl::StatusOr<ExpectedTransfer> PlanTransfer(const ConsumerModel& consumer,
                                              const TargetRoute& route, int64_t tokens) {
  const TransferMode mode = route.mode;
  if (ModeServedWithArtifact(mode) && route.artifact == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "mode ", TransferModeName(mode), " needs the pair's artifact; this consumer has none"));
  }
  ExpectedTransfer expected;
  expected.artifact = ModeServedWithArtifact(mode) ? route.artifact : nullptr;
  const ModelConfig& config = consumer.model->config();
  const TransferOptions options =
      route.point ? TransferOptions::AtPoint(*route.point, consumer.transfer_options)
                  : consumer.transfer_options;
  SCD_ASSIGN_OR_RETURN(expected.plan, TransferPlan::Make(mode, config, expected.artifact, options));
  SCD_ASSIGN_OR_RETURN(
      expected.chunks,
      CodeEncoder(expected.plan, expected.artifact, options).PlannedChunks(config, tokens));
  return expected;
}

}  // namespace

absl::StatusOr<int64_t> LoadCachedPrefix(const ConsumerModel& consumer,
                                         const v1::GenerateRequest& request,
                                         const TargetRoute& route, absl::Span<const TokenId> ids,
                                         std::optional<ConsumerPrefixCache::Keys>* keys,
                                         KvCache* cache) {
  const int64_t prefix_tokens = static_cast<int64_t>(ids.size()) - 1;
  if (consumer.prefix_cache == nullptr || prefix_tokens <= 0) return 0;
  *keys = consumer.prefix_cache->KeysFor(
      ConsumerPrefixCache::RouteScope(
          route.mode, route.producer_fingerprint,
          route.point ? absl::StrCat(route.artifact_id, "@", route.point->Describe())
                      : route.artifact_id),
      request.cache_salt(), ids.first(static_cast<size_t>(prefix_tokens)));
  // An early prefill's codes cover the whole prefix (the keys still store what is rebuilt).
  if (route.early_prefill && route.mode != TransferMode::kLocal) return 0;
  // A transfer keeps at least one position to send; local prefill runs the last token anyway.
  const int64_t most = route.mode == TransferMode::kLocal ? prefix_tokens : prefix_tokens - 1;
  return consumer.prefix_cache->Load(**keys, most, prefix_tokens, cache);
}

absl::StatusOr<std::optional<ExpectedTransfer>> PlanFor(const ConsumerModel& consumer,
                                                        const TargetRoute& route, int64_t tokens,
                                                        v1::GenerateEvent* started) {
  if (route.mode == TransferMode::kLocal) return std::nullopt;
  SCD_ASSIGN_OR_RETURN(ExpectedTransfer plan, PlanTransfer(consumer, route, tokens));
  started->mutable_started()->set_expected_payload_bytes(
      static_cast<uint64_t>(TotalBytes(plan.chunks)));
  return plan;
}

}  // namespace scd::consumer
