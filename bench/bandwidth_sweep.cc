#include "bench/bandwidth_sweep.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/grpc_tls.h"
#include "base/timer.h"
#include "bench/timings_json.h"
#include "codec/ttft_model.h"
#include "proto/inference_client.h"
#include "proto/wire_mode.h"
#include "scd/v1/registry.grpc.pb.h"

namespace scd::bench {
namespace {

constexpr double kRatioLimit = 1.15;  // the acceptance band of issue 16





// Link `index` at `gbps`, every other one unshaped; index -1: all unshaped.
absl::Status SetShape(const SweepOptions& o, int index, double gbps) {
  for (int i = 0; i < static_cast<int>(o.links.size()); ++i) {
    if (i == index) continue;
    const SweepOptions::Link& link = o.links[static_cast<size_t>(i)];
    absl::Status s = link.set ? link.set(INFINITY, 0) : SetCoordinatorShape(o, INFINITY);
    if (!s.ok()) return s;
  }
  if (index < 0) return absl::OkStatus();
  const SweepOptions::Link& link = o.links[static_cast<size_t>(index)];
  return link.set ? link.set(gbps, o.latency_us) : SetCoordinatorShape(o, gbps);
}

// The previous request on the link: when it ended and what it sent.
struct LinkUse {
  absl::Time last_end = absl::InfinitePast();
  double last_payload_bytes = 0;
};

// Waits until a shaped link's token bucket is full again, as each request's bound assumes (its
// first `burst_bytes` pass at once): the previous request's payload, and the one frame of debt the
// bucket allows, refill at the rate within (burst + payload) / rate of its end. Without the wait a
// slow cell's request found the bucket drained by the one before it (raw's 90 KB at 0.01 Gbit/s
// left scd's next 20 KB 2-5 ms of refill on the hard pair: TTFT / bound 1.5-1.9 for that cell
// alone).
void AwaitFullBucket(const SweepOptions& o, double gbps, const LinkUse* link) {
  if (!std::isfinite(gbps) || gbps <= 0) return;
  const double refill_s = (o.burst_bytes + link->last_payload_bytes) / (gbps * 1e9 / 8);
  const absl::Time full = link->last_end + absl::Seconds(refill_s);
  // paces: a bucket refills with time; no event says it is full.
  if (full > absl::Now()) absl::SleepFor(full - absl::Now());
}

double Agreement(const std::vector<int32_t>& reference, const std::vector<int32_t>& ids, size_t n) {
  n = std::min(n, reference.size());
  if (n == 0) return 0;
  size_t same = 0;
  for (size_t i = 0; i < n; ++i) same += i < ids.size() && ids[i] == reference[i];
  return static_cast<double>(same) / static_cast<double>(n);
}

// KL(local || mode) over the local top-k; a token the mode's top-k lacks gets the mode's lowest
// listed logprob (at least its true value, so its term is a lower bound).
double FirstTokenKl(const v1::TokenLogprobs& local, const v1::TokenLogprobs& mode) {
  if (local.top_size() == 0 || mode.top_size() == 0) return -1;
  std::map<int32_t, double> theirs;
  double floor = 0;
  for (const v1::TopLogprob& t : mode.top()) {
    theirs[t.id()] = t.logprob();
    floor = std::min(floor, static_cast<double>(t.logprob()));
  }
  double kl = 0;
  for (const v1::TopLogprob& t : local.top()) {
    auto it = theirs.find(t.id());
    const double q = it == theirs.end() ? floor : it->second;
    kl += std::exp(static_cast<double>(t.logprob())) * (t.logprob() - q);
  }
  return std::max(kl, 0.0);
}

nlohmann::json MsList(const std::vector<double>& us) {
  nlohmann::json out = nlohmann::json::array();
  for (double v : us) out.push_back(v / 1e3);
  return out;
}

// Keeps the faster of `*slot` (0: none yet) and `value`.
void KeepMin(double* slot, uint64_t value) {
  const double v = static_cast<double>(value);
  if (*slot == 0 || v < *slot) *slot = v;
}

// Keeps, stage by stage, the fastest of `a` and a transfer's timings `t`.
void KeepFastest(const v1::Timings& t, StagesAlone* a) {
  KeepMin(&a->prefill_us, t.prefill());
  KeepMin(&a->last_rebuild_us, t.last_rebuild());
  KeepMin(&a->rebuild_us, t.rebuild());
  KeepMin(&a->decode_us, t.first_decode());
  auto keep_each = [](std::vector<double>* slots, const auto& values, bool zero_is_none) {
    if (slots->size() < static_cast<size_t>(values.size())) {
      slots->resize(static_cast<size_t>(values.size()), 0);
    }
    for (int i = 0; i < values.size(); ++i) {
      const double v = static_cast<double>(values[i]);
      double& slot = (*slots)[static_cast<size_t>(i)];
      if (slot == 0 || (v < slot && (v > 0 || !zero_is_none))) slot = v;
    }
  };
  keep_each(&a->layer_codes_us, t.layer_codes(), false);
  keep_each(&a->layer_rebuild_us, t.layer_rebuild(), true);
}

// The stage holding most of a record's excess over its bound.
std::string ExcessStage(const SweepRecord& r) {
  const v1::Timings& t = r.timings;
  const double prefill = static_cast<double>(t.prefill());
  std::vector<std::pair<double, std::string>> excess = {
      {static_cast<double>(t.queue()), "queue"},
      {prefill - r.alone.prefill_us, "prefill"},
      {static_cast<double>(t.last_rebuild()) - r.alone.last_rebuild_us, "last_rebuild"},
      {static_cast<double>(t.rebuild()) - r.alone.rebuild_us, "rebuild"},
      {static_cast<double>(t.first_decode()) - r.alone.decode_us, "first_decode"},
  };
  if (r.mode_used != "local") {
    // What the measured stages do not explain: the transfer not hidden behind the prefill.
    TtftInputs own;  // the pipeline term on this record's own per-layer times
    own.latency_us = r.latency_us;
    own.layer_codes_us.assign(t.layer_codes().begin(), t.layer_codes().end());
    own.layer_rebuild_us.assign(t.layer_rebuild().begin(), t.layer_rebuild().end());
    const double explained =
        static_cast<double>(t.queue()) +
        std::max({prefill, r.transfer_bound_us + static_cast<double>(t.last_rebuild()),
                  static_cast<double>(t.rebuild()), PipelineUs(own)}) +
        static_cast<double>(t.first_decode());
    excess.push_back({static_cast<double>(t.ttft()) - explained, "transfer"});
  }
  return std::max_element(excess.begin(), excess.end())->second;
}

}  // namespace

bool IsAutoMode(const std::string& mode) { return mode == "auto" || mode == "auto-keep"; }

std::string ChoiceText(const v1::Started& started, const v1::Finished& finished) {
  if (RanMode(finished) != TransferMode::kScd || !started.has_point()) {
    return RanModeName(finished);
  }
  const v1::CodePoint& p = started.point();
  auto ranks = [](const auto& r) { return absl::StrJoin(r, ","); };
  return absl::StrCat("scd ", p.code_dtype(), " K ", ranks(p.rank_k()), " V ", ranks(p.rank_v()),
                      " H ", ranks(p.rank_h()));
}

SweepReply SendSweepRequest(const SweepOptions& o, const std::string& consumer,
                            const std::string& mode, const BenchPrompt& prompt,
                            double scd_max_kl) {
  v1::GenerateRequest request;
  if (prompt.ids.empty()) {
    request.set_prompt(prompt.text);
  } else {
    for (int32_t id : prompt.ids) request.add_prompt_ids(id);
  }
  request.add_targets(consumer);
  // auto-keep: auto's choice sent at its ranks, however the link does (no adaptation).
  const bool automatic = mode == "auto" || mode == "auto-keep";
  SetRequestModeName(automatic ? "auto" : mode, &request);
  if (automatic) {
    request.set_max_kl(o.max_kl);
    request.set_ttft_slo_ms(o.ttft_slo_ms);
    request.set_keep_ranks(mode == "auto-keep");
  } else if (mode == "scd" && scd_max_kl > 0) {
    request.set_max_kl(scd_max_kl);
  }
  request.set_max_tokens(static_cast<uint32_t>(o.max_tokens));
  if (o.fidelity) request.set_logprobs(static_cast<uint32_t>(o.logprobs));
  SweepReply reply;
  const absl::Time sent = absl::Now();
  reply.status =
      StreamGenerate(o.server, request, absl::Seconds(600), [&](const v1::GenerateEvent& e) {
        if (e.has_token()) {
          if (reply.ids.empty() && e.token().ids_size() > 0) {
            reply.client_ttft_us = absl::ToDoubleMicroseconds(absl::Now() - sent);
            if (e.token().logprobs_size() > 0) reply.first = e.token().logprobs(0);
          }
          reply.ids.insert(reply.ids.end(), e.token().ids().begin(), e.token().ids().end());
        } else if (e.has_started()) {
          reply.started = e.started();
        } else if (e.has_finished()) {
          reply.finished = true;
          reply.f = e.finished();
        } else if (e.has_error()) {
          reply.error = absl::StrCat("code ", e.error().code(), ": ", e.error().message());
        }
      });
  if (!reply.status.ok() && reply.error.empty()) reply.error = reply.status.ToString();
  if (reply.status.ok() && !reply.finished && reply.error.empty()) {
    reply.error = "the stream ended without Finished";
  }
  return reply;
}

absl::Status SetLinkShapeAt(const std::string& control, const std::string& secret, double gbps,
                            double latency_us, bool unannounced) {
  auto stub = v1::Registry::NewStub(NewGrpcChannel(control));
  grpc::ClientContext context;
  context.AddMetadata("x-scd-cluster-secret", secret);
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::SetLinkShapeRequest request;
  request.mutable_shape()->set_gbps(std::isfinite(gbps) ? gbps : 0);
  request.mutable_shape()->set_latency_us(latency_us);
  request.set_unannounced(unannounced);
  v1::SetLinkShapeResponse response;
  const grpc::Status status = stub->SetLinkShape(&context, request, &response);
  if (!status.ok()) {
    return absl::Status(
        static_cast<absl::StatusCode>(status.error_code()),
        absl::StrCat("Registry.SetLinkShape at ", control, ": ", status.error_message()));
  }
  for (const v1::ProducerLink& p : response.producers()) {
    if (p.code() != 0) {
      return absl::UnavailableError(
          absl::StrCat("producer ", p.name(), " did not take the link shape: ", p.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status SetCoordinatorShape(const SweepOptions& o, double gbps, bool unannounced) {
  return SetLinkShapeAt(o.control, o.secret, gbps, o.latency_us, unannounced);
}

absl::Status ValidateSweepModes(const std::vector<std::string>& modes) {
  static const std::set<std::string> kModes = {"local", "raw", "int4",     "recompute",
                                               "reuse", "scd", "auto", "auto-keep"};
  if (modes.empty()) return absl::InvalidArgumentError("--modes: none given");
  for (const std::string& m : modes) {
    if (!kModes.count(m)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--modes: unknown mode '", m,
          "' (local, raw, int4, recompute, reuse, scd, auto, auto-keep)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<SweepResult> RunBandwidthSweep(const SweepOptions& o) {
  if (o.server.empty() || o.control.empty()) {
    return absl::InvalidArgumentError("the sweep needs the server and its control address");
  }
  if (o.consumers.empty() || o.modes.empty() || o.bandwidths_gbps.empty() || o.prompts.empty()) {
    return absl::InvalidArgumentError("the sweep needs consumers, modes, bandwidths and prompts");
  }
  if (absl::Status s = ValidateSweepModes(o.modes); !s.ok()) return s;
  for (double b : o.bandwidths_gbps) {
    if (!(b > 0)) return absl::InvalidArgumentError("--bandwidths: every value must be > 0");
  }
  const int n_prompts = static_cast<int>(o.prompts.size());
  int code_modes = 0;
  for (const std::string& m : o.modes) code_modes += m != "local" && !IsAutoMode(m);
  const int total =
      static_cast<int>(o.consumers.size()) *
      (n_prompts * (1 + code_modes) * std::max(1, o.alone_repeats) +
       static_cast<int>(o.bandwidths_gbps.size() * o.modes.size() * o.links.size()) * n_prompts);
  int done = 0;
  auto progress = [&](const std::string& what) {
    if (o.on_progress) o.on_progress(done, total, what);
    ++done;
  };

  SweepResult result;
  double prefill_tokens = 0, prefill_s = 0;
  for (const std::string& consumer : o.consumers) {
    // Stages alone, unshaped: the consumer's own prefill (also the quality reference), then each
    // code mode's producer prefill, last rebuild and decode step.
    if (absl::Status s = SetShape(o, -1, INFINITY); !s.ok()) return s;
    std::vector<SweepReply> reference(static_cast<size_t>(n_prompts));
    std::map<std::pair<std::string, int>, StagesAlone> alone;
    // The fastest of the repeats, stage by stage.
    for (int rep = 0; rep < o.alone_repeats; ++rep) {
      for (int p = 0; p < n_prompts; ++p) {
        progress(absl::StrCat(consumer, " local (own prefill alone)"));
        SweepReply r = SendSweepRequest(o, consumer, "local", o.prompts[p]);
        if (!r.finished) {
          return absl::FailedPreconditionError(
              absl::StrCat("the reference (local) request on ", consumer, " failed: ", r.error));
        }
        KeepMin(&alone[{"local", p}].prefill_us, r.f.timings().prefill());
        if (rep == 0) reference[p] = std::move(r);
      }
      for (const std::string& mode : o.modes) {
        if (mode == "local" || IsAutoMode(mode)) continue;  // auto: its choices' own cells
        for (int p = 0; p < n_prompts; ++p) {
          progress(absl::StrCat(consumer, " ", mode, " (stages alone)"));
          const SweepReply r = SendSweepRequest(o, consumer, mode, o.prompts[p]);
          if (!r.finished) continue;  // the cells say why
          KeepFastest(r.f.timings(), &alone[{mode, p}]);
          if (r.f.timings().prefill() > 0) {
            prefill_tokens += static_cast<double>(r.f.prompt_tokens());
            prefill_s += static_cast<double>(r.f.timings().prefill()) / 1e6;
          }
        }
      }
    }
    // The sweep proper, prompt by prompt over every bandwidth: a slow phase of a shared machine
    // falls on every bandwidth's cells alike instead of on one bandwidth's.
    LinkUse link;
    for (int p = 0; p < n_prompts; ++p) {
      for (double gbps : o.bandwidths_gbps) {
        for (int li = 0; li < static_cast<int>(o.links.size()); ++li) {
          if (absl::Status s = SetShape(o, li, gbps); !s.ok()) return s;
          for (const std::string& mode : o.modes) {
            progress(absl::StrCat(consumer, " ", mode, " at ", RateText(gbps), " Gbit/s (",
                                  o.links[static_cast<size_t>(li)].name, ")"));
            AwaitFullBucket(o, gbps, &link);
            const SweepReply r = SendSweepRequest(o, consumer, mode, o.prompts[p]);
            link.last_end = absl::Now();
            link.last_payload_bytes = r.finished ? static_cast<double>(r.f.payload_bytes()) : 0;
            SweepRecord rec;
            rec.consumer = consumer;
            rec.mode = mode;
            rec.bandwidth_gbps = gbps;
            rec.latency_us = o.latency_us;
            rec.link = o.links[static_cast<size_t>(li)].name;
            rec.prompt = p;
            rec.ok = r.finished;
            rec.error = r.error;
            rec.ids = r.ids;
            rec.client_ttft_us = r.client_ttft_us;
            if (r.finished) {
              rec.mode_used = RanModeName(r.f);
              rec.mode_reason = r.f.mode_reason();
              rec.prompt_tokens = r.f.prompt_tokens();
              rec.output_tokens = r.f.output_tokens();
              rec.payload_bytes = r.f.payload_bytes();
              rec.shaper_gbps = r.f.link().gbps();
              rec.timings = r.f.timings();
              rec.predicted_ttft_us = static_cast<double>(r.f.predicted_ttft_us());
              rec.choice = ChoiceText(r.started, r.f);
              // Each stage alone: the fastest seen for this mode and prompt, in the stage runs or
              // in any cell (an unshaped link lets the rebuild queue behind the prefill, so a slow
              // link's cells are where the last layer's rebuild shows alone).
              const std::string key_mode = rec.mode_used == "local" ? "local"
                                           : IsAutoMode(mode)        ? "auto " + rec.choice
                                                                     : mode;
              StagesAlone& a = alone[{key_mode, p}];
              if (rec.mode_used == "local") {
                KeepMin(&a.prefill_us, rec.timings.prefill());
              } else {
                KeepFastest(rec.timings, &a);
                rec.transfer_bound_us = TransferUs(static_cast<double>(rec.payload_bytes),
                                                   o.burst_bytes, gbps * 1e9 / 8, o.latency_us);
              }
              if (o.fidelity) {
                rec.agreement = Agreement(reference[p].ids, r.ids, 32);
                rec.first_kl = FirstTokenKl(reference[p].first, r.first);
              }
            }
            result.records.push_back(std::move(rec));
          }
        }
      }
    }
    if (absl::Status s = SetShape(o, -1, INFINITY); !s.ok()) return s;
    // Bounds once every measurement of the consumer is in.
    for (SweepRecord& rec : result.records) {
      if (rec.consumer != consumer || !rec.ok) continue;
      rec.alone = alone[{rec.mode_used == "local" ? "local"
                         : IsAutoMode(rec.mode)   ? "auto " + rec.choice
                                                  : rec.mode,
                         rec.prompt}];
      // The TTFT model auto mode predicts with (codec/ttft_model.h), on the stages alone.
      TtftInputs stages;
      stages.transfer = rec.mode_used != "local";
      stages.prefill_us = rec.alone.prefill_us;  // local: its first token included
      if (stages.transfer) {
        stages.payload_bytes = static_cast<double>(rec.payload_bytes);
        stages.burst_bytes = o.burst_bytes;
        stages.goodput_bytes_per_s = rec.bandwidth_gbps * 1e9 / 8;
        stages.latency_us = o.latency_us;
        stages.rebuild_us = rec.alone.rebuild_us;
        stages.last_rebuild_us = rec.alone.last_rebuild_us;
        stages.decode_us = rec.alone.decode_us;
        stages.layer_codes_us = rec.alone.layer_codes_us;
        stages.layer_rebuild_us = rec.alone.layer_rebuild_us;
        rec.pipeline_us = PipelineUs(stages);
      }
      rec.bound_us = PredictTtft(stages).total_us;
      rec.ratio = rec.bound_us > 0 ? static_cast<double>(rec.timings.ttft()) / rec.bound_us : 0;
      if (rec.ratio > kRatioLimit) rec.excess_stage = ExcessStage(rec);
    }
  }
  result.prefill_tokens_per_s = prefill_s > 0 ? prefill_tokens / prefill_s : 0;
  return result;
}

std::string SweepJsonl(const SweepResult& result) {
  std::string out;
  for (const SweepRecord& r : result.records) {
    const v1::Timings& t = r.timings;
    nlohmann::json j = {
        {"consumer", r.consumer},
        {"mode", r.mode},
        {"mode_used", r.mode_used},
        {"mode_reason", r.mode_reason},
        {"choice", r.choice},
        {"predicted_ttft_ms", r.predicted_ttft_us / 1e3},
        {"bandwidth_gbps", std::isfinite(r.bandwidth_gbps) ? nlohmann::json(r.bandwidth_gbps)
                                                           : nlohmann::json("inf")},
        {"latency_us", r.latency_us},
        {"link", r.link},
        {"shaper_gbps", r.shaper_gbps},
        {"prompt", r.prompt},
        {"ok", r.ok},
        {"error", r.error},
        {"prompt_tokens", r.prompt_tokens},
        {"output_tokens", r.output_tokens},
        {"payload_bytes", r.payload_bytes},
        {"ttft_ms", t.ttft() / 1e3},
        {"client_ttft_ms", r.client_ttft_us / 1e3},
        {"timings_ms", TimingsJson(t)},
        {"alone_ms",
         {{"prefill", r.alone.prefill_us / 1e3},
          {"last_rebuild", r.alone.last_rebuild_us / 1e3},
          {"rebuild", r.alone.rebuild_us / 1e3},
          {"decode", r.alone.decode_us / 1e3},
          {"layer_codes", MsList(r.alone.layer_codes_us)},
          {"layer_rebuild", MsList(r.alone.layer_rebuild_us)}}},
        {"pipeline_ms", r.pipeline_us / 1e3},
        {"transfer_bound_ms", r.transfer_bound_us / 1e3},
        {"bound_ms", r.bound_us / 1e3},
        {"ratio", r.ratio},
        {"excess_stage", r.excess_stage},
        {"agreement", r.agreement},
        {"first_kl", r.first_kl},
    };
    absl::StrAppend(&out, j.dump(), "\n");
  }
  return out;
}

std::string SweepSummaryCsv(const SweepResult& result) {
  // Cells in first-seen order.
  std::vector<std::tuple<std::string, std::string, double>> order;
  std::map<std::tuple<std::string, std::string, double>, std::vector<const SweepRecord*>> cells;
  for (const SweepRecord& r : result.records) {
    const auto key = std::make_tuple(r.consumer, r.mode, r.bandwidth_gbps);
    if (!cells.count(key)) order.push_back(key);
    cells[key].push_back(&r);
  }
  std::string out =
      "consumer,mode,mode_used,bandwidth_gbps,requests,failed,prompt_tokens,payload_bytes,"
      "bytes_per_token,ttft_ms,bound_ms,ratio,max_ratio,prefill_alone_ms,transfer_bound_ms,"
      "last_rebuild_alone_ms,decode_alone_ms,excess_stage,agreement,first_kl,predicted_ttft_ms,"
      "predicted_within_25pct,choices\n";
  for (const auto& key : order) {
    const auto& rs = cells[key];
    std::vector<double> ttft, bound, ratio, bytes, tokens, prefill, transfer, rebuild, decode,
        agreement, kl, predicted;
    int failed = 0, within = 0;
    std::map<std::string, int> choices;
    std::map<std::string, int> excess;
    std::string used;
    for (const SweepRecord* r : rs) {
      if (!r->ok) {
        ++failed;
        continue;
      }
      used = r->mode_used;
      ++choices[r->choice];
      if (r->predicted_ttft_us > 0) {
        predicted.push_back(r->predicted_ttft_us / 1e3);
        const double actual = static_cast<double>(r->timings.ttft());
        within += std::abs(r->predicted_ttft_us - actual) <= 0.25 * actual;
      }
      ttft.push_back(r->timings.ttft() / 1e3);
      bound.push_back(r->bound_us / 1e3);
      ratio.push_back(r->ratio);
      bytes.push_back(static_cast<double>(r->payload_bytes));
      tokens.push_back(static_cast<double>(r->prompt_tokens));
      prefill.push_back(r->alone.prefill_us / 1e3);
      transfer.push_back(r->transfer_bound_us / 1e3);
      rebuild.push_back(r->alone.last_rebuild_us / 1e3);
      decode.push_back(r->alone.decode_us / 1e3);
      if (r->agreement >= 0) agreement.push_back(r->agreement);
      if (r->first_kl >= 0) kl.push_back(r->first_kl);
      if (!r->excess_stage.empty()) ++excess[r->excess_stage];
    }
    std::string stage;
    int most = 0;
    for (const auto& [name, count] : excess) {
      if (count > most) stage = name, most = count;
    }
    const double max_ratio = ratio.empty() ? 0 : *std::max_element(ratio.begin(), ratio.end());
    const double tok = Median(tokens);
    absl::StrAppendFormat(
        &out,
        "%s,%s,%s,%s,%d,%d,%.0f,%.0f,%.1f,%.3f,%.3f,%.4f,%.4f,%.3f,%.3f,%.3f,%.3f,%s,%s,%s,%s,%s,"
        "\"%s\"\n",
        std::get<0>(key), std::get<1>(key), used, RateText(std::get<2>(key)),
        static_cast<int>(rs.size()), failed, tok, Median(bytes), tok > 0 ? Median(bytes) / tok : 0,
        Median(ttft), Median(bound), Median(ratio), max_ratio, Median(prefill), Median(transfer),
        Median(rebuild), Median(decode), stage,
        agreement.empty() ? "" : absl::StrFormat("%.4f", Median(agreement)),
        kl.empty() ? "" : absl::StrFormat("%.5f", Median(kl)),
        predicted.empty() ? "" : absl::StrFormat("%.3f", Median(predicted)),
        predicted.empty() ? ""
                          : absl::StrFormat("%.3f", static_cast<double>(within) /
                                                        static_cast<double>(predicted.size())),
        absl::StrJoin(choices, "; ", absl::PairFormatter(": ")));
  }
  return out;
}

std::string RateText(double rate) {
  return std::isfinite(rate) ? absl::StrFormat("%g", rate) : "inf";
}

std::string LinkComparisonCsv(const SweepResult& shaper, const SweepResult& netns) {
  using Cell = std::tuple<std::string, std::string, double>;
  auto medians = [](const SweepResult& r) {
    std::map<Cell, std::vector<double>> cells;
    for (const SweepRecord& rec : r.records) {
      if (rec.ok)
        cells[{rec.consumer, rec.mode, rec.bandwidth_gbps}].push_back(rec.timings.ttft() / 1e3);
    }
    std::map<Cell, double> out;
    for (auto& [key, v] : cells) out[key] = Median(std::move(v));
    return out;
  };
  const std::map<Cell, double> a = medians(shaper), b = medians(netns);
  std::string csv = "consumer,mode,bandwidth_gbps,shaper_ttft_ms,netns_ttft_ms,netns_vs_shaper\n";
  for (const auto& [key, ttft] : a) {
    auto it = b.find(key);
    if (it == b.end()) continue;
    absl::StrAppendFormat(&csv, "%s,%s,%s,%.3f,%.3f,%+.1f%%\n", std::get<0>(key), std::get<1>(key),
                          RateText(std::get<2>(key)), ttft, it->second,
                          ttft > 0 ? 100 * (it->second / ttft - 1) : 0);
  }
  return csv;
}

}  // namespace scd::bench
