// One request of `scd-bench soak` (bench/soak.h) as a client sees it: sent to a coordinator,
// streamed event by event (or cancelled, or abandoned: reading stops and the call's own deadline
// ends it), resumed through another live coordinator when its coordinator goes away mid-stream
// (GenerateRequest.resume_token: each target whose Started carried a token, alone, at most
// kSoakResumes times; a fan-out's targets at once), and checked as it ends -- per target exactly
// one Started before its tokens and exactly one terminal event after them, events only for the
// targets asked, the request id echoed (an Error may come without Started: a fan-out's target
// refused before it started while another did), a greedy stream's tokens equal to its reference
// (bench/soak_workload.h). What the terminal status means (explained by a fault or not) is judged
// later against the fault schedule (bench/soak_check.h). Thread-safety: RunSoakRequest is
// reentrant; a SoakCanceller is thread-safe.
#ifndef SCD_BENCH_SOAK_CLIENT_H_
#define SCD_BENCH_SOAK_CLIENT_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "bench/soak_workload.h"

namespace grpc {
class ClientContext;
}

namespace scd::bench {

// Cancels gRPC calls at given times from one thread (a request's own thread is blocked reading).
class SoakCanceller {
 public:
  SoakCanceller();
  ~SoakCanceller();
  // TryCancel on `context` at `when` unless Remove(`context`) came first.
  void Add(grpc::ClientContext* context, absl::Time when);
  // After it returns the context is never touched again.
  void Remove(grpc::ClientContext* context);

 private:
  void Loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::multimap<absl::Time, grpc::ClientContext*> due_;  // guarded by mu_
  bool stop_ = false;                                    // guarded by mu_
  std::thread thread_;
};

// One target's stream.
struct SoakStream {
  std::string target;
  int started = 0, terminals = 0;
  bool finished = false;
  int code = 0;  // google.rpc code of its Error, or of the call when it had no terminal event
  std::string error;
  std::string reason;        // Finished.reason
  std::string mode;          // Finished.mode (Started's when it did not finish)
  std::string started_mode;  // Started.mode (a fallback finishes in local)
  bool lowered = false;      // Finished.lowered_layers not empty
  // Finished: prompt positions served from the producer's and the consumer's prefix caches,
  // code bytes received.
  uint32_t producer_cached = 0, consumer_cached = 0;
  uint64_t payload_bytes = 0;
  std::vector<int32_t> ids;
  double ttft_s = -1;         // sent -> first token
  std::vector<double> itl_s;  // between token events
  // Moved events (the stream went on at another replica), and per move the time from the last
  // token before it to the first after it (the gap the move left).
  int moves = 0;
  std::vector<double> move_gap_s;
  int resumes = 0;         // of the moves, resumes through another coordinator (Moved.resumed)
  bool had_token = false;  // its Started carried a resume token
  // Greedy, finished: the reference check (compared false when no reference or lowered ranks).
  bool compared = false;
  TokenVerdict tokens;
};

struct SoakRecord {
  SoakRequestSpec spec;
  std::string coordinator;               // address sent to
  std::vector<std::string> resumed_via;  // the coordinators it was resumed through, in order
  // Why a stream's last broken call (IsResumableBreak, its coordinator gone) was not resumed:
  // "" when it was, or when no call broke; else "no resume token" (no Started yet), "client
  // action", "no other live coordinator", "resumes used up" (per stream), "past its deadline".
  std::string resume_blocked;
  absl::Time sent, ended;
  int rpc_code = 0;
  std::string rpc_error;
  bool client_ended = false;        // cancelled or abandoned before every terminal event arrived
  std::vector<SoakStream> streams;  // in spec.targets order
  std::vector<std::string> violations;  // broken per-request invariants, as found
};

// The live coordinators' addresses now: where a stream whose coordinator went away resumes.
using LiveCoordinators = std::function<std::vector<std::string>()>;
inline constexpr int kSoakResumes = 2;  // resumes per stream at most

// Sends `spec` to `coordinator` and follows it to its end, resuming through the first address of
// `live()` other than the broken call's (null `live`: never). `references` and `tie`: the greedy
// check (bench/soak_workload.h).
SoakRecord RunSoakRequest(const SoakRequestSpec& spec, const std::vector<std::string>& prompts,
                          const std::string& coordinator, const SoakReferences& references,
                          double tie, SoakCanceller& canceller,
                          const LiveCoordinators& live = nullptr);

}  // namespace scd::bench

#endif  // SCD_BENCH_SOAK_CLIENT_H_
