#include "coordinator/route_choice.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/log_text.h"
#include "base/status_macros.h"
#include "coordinator/auto_choice.h"

namespace scd::coordinator {
namespace {

using Node = RegisteredNode;

const Node* PickConsumer(const RoutingView& v, const std::string& name, const PrefixHint* hint,
                         const MoveConstraint* move) {
  const Node* best = nullptr;
  double best_cost = 0;
  for (const auto& [id, node] : v.nodes) {
    if (node.info.role() != v1::NODE_ROLE_CONSUMER || !Routable(node, v.now, v.options.lease))
      continue;
    if (move != nullptr && move->exclude_nodes.count(id) > 0) continue;
    const bool serves = std::any_of(
        node.info.models().begin(), node.info.models().end(), [&](const v1::ModelEntry& m) {
          return m.name() == name &&
                 (move == nullptr || m.fingerprint() == move->consumer_fingerprint);
        });
    if (!serves) continue;
    const double cost = RoutingCost(node, hint, v.options.prefix_load_weight);
    if (best == nullptr || cost < best_cost || (cost == best_cost && Load(node) < Load(*best))) {
      best = &node;
      best_cost = cost;
    }
  }
  return best;
}

// What one target's resolution knows of its producer -> consumer pair.
struct TargetPair {
  const v1::ModelEntry* source = nullptr;       // the producer's model
  const v1::ArtifactEntry* artifact = nullptr;  // the consumer's artifact for the pair, if any
  const Frontier* frontier = nullptr;           // the artifact's frontier, if any
  const FrontierPoint* within = nullptr;        // its cheapest point within max_kl, if any
  bool identical = false;                       // the same weights on both sides
  std::string text;                             // "producer -> target", for reasons
  double max_kl = 0;
  // Auto has choices to weigh: a frontier's points, or the raw cache between identical weights.
  bool choosable() const { return frontier != nullptr || (identical && artifact == nullptr); }
  std::string budget() const { return absl::StrFormat("max_kl %g", max_kl); }  // reasons only
};

AutoInputs InputsFor(const RoutingView& v, const Node& consumer, const Node& producer,
                     const PrefixHint* hint) {
  AutoInputs in;
  if (hint != nullptr) {
    in.prompt_tokens = static_cast<double>(hint->prompt_tokens);
    in.consumer_cached_tokens = static_cast<double>(Matched(consumer, hint) * hint->block_tokens);
    in.producer_cached_tokens = static_cast<double>(Matched(producer, hint) * hint->block_tokens);
  }
  in.consumer = consumer.speeds;
  in.producer = producer.speeds;
  // Ahead of a local prefill: those waiting for admission and the local prefills routed there
  // and still running (they share the consumer's compute).
  in.consumer_queue = static_cast<double>(consumer.queued_requests + consumer.prefilling.size());
  // Ahead of the producer's prefill: the transfers routed to it whose first token has not come
  // (once decoding, the request no longer needs it), at most the prefills it said were running
  // at its last heartbeat and those routed since (a transfer past its prefill may still wait for
  // the consumer's rebuild: the producer is done with it).
  in.producer_queue = static_cast<double>(std::min<uint64_t>(
      producer.prefilling.size(), uint64_t{producer.active_requests} + producer.routed_since_beat));
  in.consumer_decoding = static_cast<double>(consumer.decoding);
  const LinkBook::Link link = v.links.For(producer.id, consumer.id, v.now);
  in.goodput_bytes_per_s = link.goodput_bytes_per_s;
  in.latency_us = link.latency_us;
  in.link = link.how;
  return in;
}

absl::Status ResolveExplicit(const RoutingView& v, const Node& consumer, const TargetPair& pair,
                             TransferMode mode, RouteTarget* target) {
  const std::string name = TransferModeName(mode);
  if (ModeServedWithArtifact(mode) && pair.artifact == nullptr) {
    std::vector<std::string> held;
    for (const v1::ArtifactEntry& a : consumer.info.artifacts()) {
      held.push_back(
          absl::StrCat(a.id(), " (producer ", ShortFingerprint(a.producer_fingerprint()), ")"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("mode ", name, " needs a translator artifact for ", pair.text,
                     " (producer fingerprint ", ShortFingerprint(pair.source->fingerprint()),
                     "); the consumer holds ", held.empty() ? "none" : absl::StrJoin(held, ", ")));
  }
  target->mode = mode;
  target->mode_reason = "requested";
  // Raw or int4 caches, and reuse's translated ones, are the producer's own keys and values: only
  // faithful between identical weights (scd's aligners and recompute are not limited so).
  const bool crosses_weights =
      !pair.identical &&
      (mode == TransferMode::kRaw || mode == TransferMode::kInt4 || mode == TransferMode::kReuse);
  if (crosses_weights) {
    if (v.options.strict_modes) {
      return absl::FailedPreconditionError(absl::StrCat(
          "mode ", name, " cannot serve ", pair.text,
          " faithfully: the weights differ (this coordinator runs with --strict-modes; use scd, "
          "recompute, local or auto)"));
    }
    target->mode_reason =
        absl::StrCat("requested; the weights differ (", pair.text, "): quality degraded");
  }
  if (pair.artifact != nullptr && ModeServedWithArtifact(mode)) {
    target->artifact_id = pair.artifact->id();
  }
  if (mode != TransferMode::kScd || pair.max_kl <= 0) return absl::OkStatus();
  const Frontier* frontier = pair.frontier;
  if (pair.within == nullptr) {
    return absl::FailedPreconditionError(
        frontier == nullptr
            ? absl::StrCat("max_kl: artifact ", pair.artifact->id(), " for ", pair.text,
                           " has no frontier to choose a point within ", pair.budget())
            : absl::StrCat("max_kl: no point of artifact ", pair.artifact->id(), "'s frontier for ",
                           pair.text, " is within ", pair.budget(),
                           " (the best: ", PointText(*frontier, *frontier->BestQuality()),
                           "); raise it, or use mode auto to prefill locally"));
  }
  target->point = *pair.within;
  target->mode_reason =
      absl::StrCat("requested; frontier point ", PointText(*frontier, *pair.within),
                   ": the cheapest within ", pair.budget());
  return absl::OkStatus();
}

void ResolveAutoUnpredicted(const TargetPair& pair, double ttft_slo_ms, RouteTarget* target) {
  const Frontier* frontier = pair.frontier;
  const v1::ArtifactEntry* artifact = pair.artifact;
  if (artifact != nullptr && pair.max_kl > 0 && pair.within == nullptr) {
    target->mode = TransferMode::kLocal;
    target->mode_reason =
        frontier == nullptr
            ? absl::StrCat("artifact ", artifact->id(), " for ", pair.text,
                           " has no frontier to meet ", pair.budget(), ": local prefill")
            : absl::StrCat("no point of artifact ", artifact->id(), "'s frontier for ", pair.text,
                           " is within ", pair.budget(),
                           " (the best: ", PointText(*frontier, *frontier->BestQuality()),
                           "): local prefill");
  } else if (artifact != nullptr) {
    target->mode = TransferMode::kScd;
    target->mode_reason = absl::StrCat("artifact ", artifact->id(), " for ", pair.text);
    target->artifact_id = artifact->id();
    if (frontier != nullptr) {
      const FrontierPoint& p =
          pair.within != nullptr ? *pair.within : frontier->points[frontier->recommended];
      target->point = p;
      absl::StrAppend(&target->mode_reason, ", frontier point ", PointText(*frontier, p),
                      pair.within != nullptr ? absl::StrCat(": the cheapest within ", pair.budget())
                                             : ": the recommended one");
    }
  } else if (pair.identical) {
    target->mode = TransferMode::kRaw;
    target->mode_reason = absl::StrCat("identical weights (", pair.text, "), no artifact needed");
  } else {
    target->mode = TransferMode::kLocal;
    target->mode_reason = absl::StrCat("no artifact for ", pair.text, ": local prefill");
  }
  if (ttft_slo_ms > 0) {  // reached only without a prediction
    absl::StrAppend(&target->mode_reason, "; ttft_slo_ms ", ttft_slo_ms, " not weighed: ",
                    pair.choosable() ? "no node's prefill speed is measured yet"
                                     : "no frontier to choose from");
  }
}

bool ResolveAutoPredicted(const RoutingView& v, const Node& consumer, const Node& producer,
                          const TargetPair& pair, const RouteAsk& ask, RouteTarget* target) {
  const PrefixHint* hint = ask.hint;
  const double ttft_slo_ms = ask.ttft_slo_ms;
  // With the nodes' speeds measured: the choice predicted to reach the first token soonest.
  const AutoInputs inputs = hint != nullptr && hint->prompt_tokens > 0
                                ? InputsFor(v, consumer, producer, hint)
                                : AutoInputs();
  if (!CanPredict(inputs)) return false;
  const Frontier* frontier = pair.frontier;
  const std::vector<AutoCandidate> candidates =
      AutoCandidates(inputs, frontier, static_cast<double>(consumer.info.kv_bytes_per_token()));
  const double budget_kl = pair.max_kl > 0       ? pair.max_kl
                           : frontier != nullptr ? frontier->points[frontier->recommended].kl
                                                 : 0;
  const std::string budget = pair.max_kl > 0 ? pair.budget()
                             : frontier != nullptr
                                 ? absl::StrFormat("the recommended point's KL %.4g", budget_kl)
                                 : std::string("exact caches (identical weights)");
  // What auto chose before it had a cost model: the cheapest point within max_kl, else the
  // recommended one (local when no point is within max_kl), or the raw cache.
  size_t incumbent = 1;
  if (frontier != nullptr) {
    incumbent = pair.max_kl > 0
                    ? (pair.within != nullptr ? 1 + (pair.within - frontier->points.data()) : 0)
                    : 1 + static_cast<size_t>(frontier->recommended);
  }
  const AutoChoice choice = ChooseAuto(candidates, budget_kl, budget, ttft_slo_ms * 1e3, incumbent);
  const AutoCandidate& chosen = candidates[choice.chosen];
  target->mode = chosen.mode;
  target->point = chosen.point;
  target->predicted_ttft_us = chosen.predicted.total_us;
  if (chosen.mode == TransferMode::kScd) {
    target->artifact_id = pair.artifact->id();
    // Adapt only over a link known to be limited (shaped or measured): with none known, a
    // transfer later than predicted is the nodes' compute, which lower ranks do not speed up.
    if (inputs.goodput_bytes_per_s > 0) {
      target->deliver_by_us = DeliverByUs(chosen.predicted, ttft_slo_ms * 1e3);
      target->planned_goodput_bytes_per_s = inputs.goodput_bytes_per_s;
    }
  }
  target->mode_reason = absl::StrCat(choice.reason, " (", pair.text, ", link ", inputs.link, ")");
  return true;
}

absl::StatusOr<RouteTarget> ResolveTarget(const RoutingView& v, const Node& consumer,
                                          const std::string& name, const Node* producer,
                                          const RouteAsk& ask) {
  const RequestedMode mode = ask.mode;
  const double max_kl = ask.max_kl;
  RouteTarget target;
  target.target = name;
  target.consumer_node = consumer.id;
  target.consumer_address = consumer.info.address();
  target.transfer_address = consumer.info.transfer_address();
  for (const v1::ModelEntry& model : consumer.info.models()) {
    if (model.name() == name) target.consumer_fingerprint = model.fingerprint();
  }
  if (mode.Is(TransferMode::kLocal)) {
    target.mode = TransferMode::kLocal;
    target.mode_reason = "requested";
    return target;
  }
  if (producer == nullptr) {
    if (!mode.is_auto() && !ask.local_fallback) {
      return absl::UnavailableError(
          absl::StrCat("mode ", RequestedModeName(mode),
                       " needs a producer and none is live (registered producers are out of "
                       "routing while their calls fail or their leases lapse)"));
    }
    target.mode = TransferMode::kLocal;
    target.mode_reason = mode.is_auto() ? "no live producer: local prefill"
                                        : absl::StrCat("fallback: no live producer for mode ",
                                                       RequestedModeName(mode), ": local prefill");
    return target;
  }
  TargetPair pair;
  pair.source = &producer->info.models(0);
  for (const v1::ArtifactEntry& held : consumer.info.artifacts()) {
    if (held.producer_fingerprint() == pair.source->fingerprint() &&
        held.consumer_fingerprint() == target.consumer_fingerprint) {
      pair.artifact = &held;
    }
  }
  pair.identical = pair.source->fingerprint() == target.consumer_fingerprint;
  pair.text = absl::StrCat(pair.source->name(), " -> ", name);
  if (pair.artifact != nullptr) {
    auto it = consumer.frontiers.find(pair.artifact->id());
    if (it != consumer.frontiers.end()) pair.frontier = &it->second;
  }
  pair.max_kl = max_kl;
  pair.within =
      pair.frontier != nullptr && max_kl > 0 ? pair.frontier->CheapestWithin(max_kl) : nullptr;
  if (!mode.is_auto()) {
    SCD_RETURN_IF_ERROR(ResolveExplicit(v, consumer, pair, mode.mode(), &target));
    return target;
  }
  if (!pair.choosable() ||
      !ResolveAutoPredicted(v, consumer, *producer, pair, ask, &target)) {
    ResolveAutoUnpredicted(pair, ask.ttft_slo_ms, &target);
  }
  return target;
}

absl::StatusOr<std::vector<const Node*>> PickConsumers(const RoutingView& v,
                                                       const std::vector<std::string>& targets,
                                                       const PrefixHint* hint,
                                                       const MoveConstraint* move) {
  std::vector<const Node*> consumers;
  for (const std::string& name : targets) {
    const Node* consumer = PickConsumer(v, name, hint, move);
    if (consumer != nullptr) {
      consumers.push_back(consumer);
      continue;
    }
    if (move != nullptr) {
      return absl::UnavailableError(
          absl::StrCat("target '", ForLog(name), "' has no other live replica with its weights"));
    }
    if (v.known_targets.count(name) > 0) {
      return absl::UnavailableError(
          absl::StrCat("target '", ForLog(name),
                       "' has no live consumer right now (its nodes stopped "
                       "heartbeating or are draining); retry later"));
    }
    std::set<std::string> known;
    for (const auto& [id, node] : v.nodes) {
      if (node.info.role() != v1::NODE_ROLE_CONSUMER || !Routable(node, v.now, v.options.lease))
        continue;
      for (const v1::ModelEntry& m : node.info.models()) known.insert(m.name());
    }
    return absl::NotFoundError(absl::StrCat("unknown target '", ForLog(name), "'; known targets: ",
                                            known.empty() ? "none" : absl::StrJoin(known, ", ")));
  }
  return consumers;
}

}  // namespace

absl::StatusOr<Route> ChooseRoute(const RoutingView& v, const RouteAsk& ask,
                                  std::atomic<uint64_t>* route_ids) {
  const std::vector<std::string>& targets = ask.targets;
  const PrefixHint* hint = ask.hint;
  absl::StatusOr<std::vector<const Node*>> picked = PickConsumers(v, targets, hint, ask.move);
  if (!picked.ok()) return picked.status();
  const std::vector<const Node*>& consumers = *picked;

  // Candidate producers, cheapest first (the longest cached run of the prompt's prefix against
  // load, at capacity last); nullptr (no producer) when none is live.
  // Each producer's cost and load computed once (not in every comparison of the sort).
  struct Ranked {
    const Node* node;
    double cost, load;
  };
  std::vector<Ranked> ranked;
  for (const auto& [id, node] : v.nodes) {
    if (node.info.role() == v1::NODE_ROLE_PRODUCER && Routable(node, v.now, v.options.lease)) {
      ranked.push_back({&node, RoutingCost(node, hint, v.options.prefix_load_weight), Load(node)});
    }
  }
  std::stable_sort(ranked.begin(), ranked.end(), [](const Ranked& a, const Ranked& b) {
    return a.cost != b.cost ? a.cost < b.cost : a.load < b.load;
  });
  std::vector<const Node*> producers;
  for (const Ranked& r : ranked) producers.push_back(r.node);
  if (producers.empty()) producers.push_back(nullptr);

  // The first (least loaded) producer that can serve every target, preferring, for auto, the one
  // that sends codes to the most targets (fewest local prefills).
  std::optional<Route> best;
  int best_score = -1;
  absl::Status first_error;
  for (const Node* producer : producers) {
    Route route;
    route.routed_at = v.now;
    route.id = route_ids->fetch_add(1) + 1;
    int score = 0;
    absl::Status error;
    for (size_t i = 0; i < targets.size(); ++i) {
      absl::StatusOr<RouteTarget> target =
          ResolveTarget(v, *consumers[i], targets[i], producer, ask);
      if (!target.ok()) {
        error = target.status();
        break;
      }
      score += target->mode != TransferMode::kLocal;
      if (hint != nullptr) {
        target->kv_bytes =
            hint->kv_positions * static_cast<int64_t>(consumers[i]->info.kv_bytes_per_token());
        target->consumer_cached_tokens =
            static_cast<uint32_t>(Matched(*consumers[i], hint) * hint->block_tokens);
      }
      route.targets.push_back(*std::move(target));
    }
    if (!error.ok()) {
      if (first_error.ok()) first_error = error;
      continue;
    }
    if (score > best_score) {
      if (producer != nullptr && score > 0) {
        route.producer_node = producer->id;
        route.producer_address = producer->info.address();
        route.producer_name = producer->info.models(0).name();
        route.producer_fingerprint = producer->info.models(0).fingerprint();
        if (hint != nullptr) {
          route.producer_cached_tokens =
              static_cast<uint32_t>(Matched(*producer, hint) * hint->block_tokens);
        }
      }
      best = std::move(route);
      best_score = score;
      // Every target gets codes: no later producer scores more, and a tie keeps this one.
      if (static_cast<size_t>(best_score) == targets.size()) break;
    }
  }
  if (!best.has_value()) return first_error;
  return *std::move(best);
}

absl::StatusOr<TakeoverCandidate> ChooseTakeoverProducer(const RoutingView& v,
                                                         const std::string& consumer_node,
                                                         const std::string& fingerprint,
                                                         const std::set<std::string>& exclude) {
  const Node* best = nullptr;
  for (const auto& [id, node] : v.nodes) {
    if (node.info.role() != v1::NODE_ROLE_PRODUCER || !Routable(node, v.now, v.options.lease) ||
        exclude.count(id) > 0 || node.info.models_size() == 0 ||
        node.info.models(0).fingerprint() != fingerprint) {
      continue;
    }
    if (best == nullptr || Load(node) < Load(*best)) best = &node;
  }
  if (best == nullptr) {
    return absl::UnavailableError(absl::StrCat("no other live producer of the model (fingerprint ",
                                               ShortFingerprint(fingerprint), ")"));
  }
  TakeoverCandidate candidate;
  candidate.node_id = best->id;
  candidate.address = best->info.address();
  candidate.name = best->info.models(0).name();
  auto consumer = v.nodes.find(consumer_node);
  if (consumer != v.nodes.end()) {
    candidate.inputs = InputsFor(v, consumer->second, *best, nullptr);
  } else {
    candidate.inputs.producer = best->speeds;
  }
  return candidate;
}

}  // namespace scd::coordinator
