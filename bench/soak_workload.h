// What `scd-bench soak` asks (bench/soak.h): a pool of prompts in groups that share a prefix
// (so prefix caches hit, under several tenants' salts), a seeded draw of mixed requests -- modes
// local, raw, scd and auto, fan-outs, greedy and sampled, a few forbidding the local fallback
// (the rest leave it unset, which allows it: a producer's death then reaches no client), some
// read slowly (a client pacing its reads keeps its stream open for a second or so, so that
// faults meet streams mid-decode), some cancelled or abandoned by the client, some with a short
// deadline -- and the reference each greedy stream is held to: the same prompt served alone,
// fault-free, by a second path (an all-in-one server: in-process transport, no prefix cache), per
// target and mode. Thread-safety: SoakRequestDraw and the references are read-only after
// construction.
#ifndef SCD_BENCH_SOAK_WORKLOAD_H_
#define SCD_BENCH_SOAK_WORKLOAD_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "scd/v1/inference.pb.h"

namespace scd::bench {

// `groups` x `per_group` prompts: group g's prompts begin with the same few sentences of `file`
// (one line each) and end each with its own line.
absl::StatusOr<std::vector<std::string>> SoakPrompts(const std::string& file, int groups,
                                                     int per_group);

enum class ClientAction { kNone, kCancel, kAbandon };
const char* ClientActionName(ClientAction action);

struct SoakRequestSpec {
  int64_t index = 0;
  std::string request_id;
  int prompt = 0;  // into the pool
  std::vector<std::string> targets;
  std::string mode;  // local | raw | scd | auto
  std::string salt;
  bool greedy = true;
  uint64_t seed = 0;  // sampled requests
  bool forbid_fallback = false;  // allow_local_fallback = false (else unset: allowed)
  uint32_t max_tokens = 16;
  uint32_t deadline_ms = 0;
  bool short_deadline = false;
  ClientAction action = ClientAction::kNone;
  absl::Duration action_after;  // cancel: after sending; abandon: reading stops after this
  absl::Duration read_pace;     // a slow reader's wait after each token event (0: none)
};

// The mix, as fractions of all requests.
struct SoakMix {
  std::vector<std::string> targets;  // routing names; a fan-out asks all of them
  std::vector<std::string> salts = {"", "tenant-a", "tenant-b"};
  double fanout = 0.15, sampled = 0.2, forbid_fallback = 0.1, cancel = 0.05, abandon = 0.03,
         short_deadline = 0.05, slow_read = 0.25;
  // A slow reader's wait after each token event: uniform in [min, max].
  absl::Duration min_read_pace = absl::Milliseconds(10), max_read_pace = absl::Milliseconds(40);
  int min_tokens = 8, max_tokens = 40;
  uint32_t deadline_ms = 20000;  // every request's; short ones 50-400 ms
};

// Request `index` of the run: a pure function of (mix, prompts, seed, index).
SoakRequestSpec DrawSoakRequest(const SoakMix& mix, int prompts, uint64_t seed, int64_t index);
v1::GenerateRequest ToGenerateRequest(const SoakRequestSpec& spec,
                                      const std::vector<std::string>& prompts);

// A stream served alone: its token ids and, per id, the gap between the top two
// log-probabilities (a near-tie where it is small), and how it ended.
struct SoakReference {
  std::vector<int32_t> ids;
  std::vector<double> gaps;
  std::string reason;  // stop | length
  std::string mode;    // the mode it was served in
};

class SoakReferences {
 public:
  // Serves every (prompt, target, mode) alone through `server` (greedy, `max_tokens`,
  // logprobs 2), one at a time; `on_progress(done, total)`. The first failure's status.
  static absl::StatusOr<SoakReferences> Compute(const std::string& server,
                                                const std::vector<std::string>& prompts,
                                                const std::vector<std::string>& targets,
                                                const std::vector<std::string>& modes,
                                                uint32_t max_tokens,
                                                const std::function<void(int, int)>& on_progress);
  // Null when that combination was not computed.
  const SoakReference* Find(int prompt, const std::string& target, const std::string& mode) const;
  size_t size() const { return refs_.size(); }

 private:
  std::map<std::tuple<int, std::string, std::string>, SoakReference> refs_;
};

// A greedy stream against its reference: equal ids up to where the served stream ended (fewer
// for a smaller max_tokens; an EOS only where the reference has it), or parting from it only at
// a near-tie of the reference (its top-two gap <= `tie`): then the rest is not comparable.
struct TokenVerdict {
  bool ok = true;
  int parted_at = -1;  // where the ids first differ (-1: nowhere)
  bool near_tie = false;
  std::string why;  // when not ok
};
TokenVerdict CompareWithReference(const std::vector<int32_t>& served, const std::string& reason,
                                  const SoakReference& reference, double tie);

// The bound a batched step's logits may differ by from a lone one's (tests/batching_test.cc
// derives it): 50 x float32 epsilon x max(hidden, intermediate) x layers of the model at `dir`
// (its config.json).
absl::StatusOr<double> NearTieBound(const std::string& model_dir);

}  // namespace scd::bench

#endif  // SCD_BENCH_SOAK_WORKLOAD_H_
