#include "bench/soak_client.h"

#include <grpcpp/grpcpp.h>

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/grpc_tls.h"
#include "proto/grpc_util.h"
#include "proto/inference_client.h"
#include "proto/wire_mode.h"
#include "scd/v1/inference.grpc.pb.h"

namespace scd::bench {
namespace {

// One channel per coordinator address, shared by the requests sent there (as a client library
// keeps one); an abandoning request gets its own connection.
std::shared_ptr<grpc::Channel> ChannelTo(const std::string& address, bool own) {
  if (own) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    return NewGrpcChannel(address, args);
  }
  static std::mutex mu;
  static auto* channels = new std::map<std::string, std::shared_ptr<grpc::Channel>>();
  std::lock_guard<std::mutex> lock(mu);
  std::shared_ptr<grpc::Channel>& channel = (*channels)[address];
  if (channel == nullptr) channel = NewGrpcChannel(address);
  return channel;
}

// Takes a request's events as they arrive, from one call or, once a fan-out's targets resume
// each alone, from several at once: its record is read and written under its lock only.
class StreamChecker {
 public:
  StreamChecker(SoakRecord* record) : record_(record), tokens_(record->spec.targets.size()) {
    for (const std::string& t : record->spec.targets) {
      record->streams.emplace_back().target = t;
      last_token_.push_back(absl::InfinitePast());
      gap_open_.push_back(false);
    }
  }

  void Take(const v1::GenerateEvent& e, absl::Time now) {
    std::lock_guard<std::mutex> lock(mu_);
    const int i = IndexOf(e.target());
    if (i < 0) {
      Violation(absl::StrCat("an event for target '", e.target(), "', which was not asked"));
      return;
    }
    SoakStream& s = record_->streams[static_cast<size_t>(i)];
    if (s.terminals > 0) {
      Violation(absl::StrCat(s.target, ": an event after its terminal event"));
      return;
    }
    if (e.has_started()) {
      if (++s.started > 1) Violation(absl::StrCat(s.target, ": a second Started"));
      if (e.started().request_id() != record_->spec.request_id) {
        Violation(
            absl::StrCat(s.target, ": Started names request '", e.started().request_id(), "'"));
      }
      s.mode = s.started_mode = RanModeName(e.started());
      s.had_token = !e.started().resume_token().empty();
      if (s.had_token) tokens_[static_cast<size_t>(i)] = e.started().resume_token();
    } else if (s.started == 0 && !e.has_error()) {
      Violation(absl::StrCat(s.target, ": an event before Started"));
    }
    if (e.has_token()) {
      const double at = absl::ToDoubleSeconds(now - record_->sent);
      if (s.ttft_s < 0 && e.token().ids_size() > 0) s.ttft_s = at;
      if (last_token_[static_cast<size_t>(i)] != absl::InfinitePast()) {
        s.itl_s.push_back(absl::ToDoubleSeconds(now - last_token_[static_cast<size_t>(i)]));
      }
      if (gap_open_[static_cast<size_t>(i)] && e.token().ids_size() > 0) {
        gap_open_[static_cast<size_t>(i)] = false;
        if (last_token_[static_cast<size_t>(i)] != absl::InfinitePast()) {
          s.move_gap_s.push_back(absl::ToDoubleSeconds(now - last_token_[static_cast<size_t>(i)]));
        }
      }
      last_token_[static_cast<size_t>(i)] = now;
      for (int32_t id : e.token().ids()) s.ids.push_back(id);
    } else if (e.has_moved()) {
      ++s.moves;
      s.resumes += e.moved().resumed() ? 1 : 0;
      gap_open_[static_cast<size_t>(i)] = true;
      if (e.moved().tokens_so_far() != s.ids.size()) {
        Violation(absl::StrCat(s.target, ": Moved says ", e.moved().tokens_so_far(),
                               " tokens so far; ", s.ids.size(), " arrived"));
      }
    } else if (e.has_finished()) {
      ++s.terminals;
      s.finished = true;
      s.reason = e.finished().reason();
      s.mode = RanModeName(e.finished());
      s.lowered = e.finished().lowered_layers_size() > 0;
      s.producer_cached = e.finished().producer_cached_tokens();
      s.consumer_cached = e.finished().consumer_cached_tokens();
      s.payload_bytes = e.finished().payload_bytes();
      if (static_cast<int64_t>(e.finished().output_tokens()) !=
          static_cast<int64_t>(s.ids.size())) {
        Violation(absl::StrCat(s.target, ": Finished counts ", e.finished().output_tokens(),
                               " tokens; ", s.ids.size(), " arrived"));
      }
    } else if (e.has_error()) {
      ++s.terminals;
      s.code = e.error().code();
      s.error = e.error().message();
    }
  }

  // A slow reader is ready to read again at `now`, after its pause: the gaps it measures from the
  // last token (ITL, a move's gap) run from here, not from the token's arrival.
  void Ready(absl::Time now) {
    std::lock_guard<std::mutex> lock(mu_);
    for (absl::Time& t : last_token_) {
      if (t != absl::InfinitePast()) t = now;
    }
  }

  // The resume token of stream `i`'s Started; "" when none came (with the lock held).
  const std::string& token(size_t i) const { return tokens_[i]; }

  // Runs `f` with the record's lock held.
  template <typename F>
  auto Locked(F f) {
    std::lock_guard<std::mutex> lock(mu_);
    return f();
  }

  // The request's calls ended: the request's status is `rpc`, and stream i's last call ended
  // with `ended[i]`, whose code a stream without a terminal event takes.
  void End(const grpc::Status& rpc, const std::vector<grpc::Status>& ended) {
    std::lock_guard<std::mutex> lock(mu_);
    record_->rpc_code = static_cast<int>(rpc.error_code());
    record_->rpc_error = rpc.error_message();
    for (size_t i = 0; i < record_->streams.size(); ++i) {
      SoakStream& s = record_->streams[i];
      if (s.terminals > 0) continue;
      if (ended[i].ok()) {
        Violation(absl::StrCat(s.target, ": the call ended OK without its terminal event"));
      }
      s.code = static_cast<int>(ended[i].error_code());
      s.error = ended[i].error_message();
    }
  }

 private:
  int IndexOf(const std::string& target) const {
    for (size_t i = 0; i < record_->streams.size(); ++i) {
      if (record_->streams[i].target == target) return static_cast<int>(i);
    }
    return -1;
  }
  void Violation(std::string what) { record_->violations.push_back(std::move(what)); }

  std::mutex mu_;
  SoakRecord* record_;               // guarded by mu_
  std::vector<std::string> tokens_;  // per stream; never logged
  std::vector<absl::Time> last_token_;
  std::vector<bool> gap_open_;  // moved, no token since
};

void CheckTokens(SoakRecord& record, const SoakReferences& references, double tie) {
  if (!record.spec.greedy) return;
  for (SoakStream& s : record.streams) {
    if (!s.finished || s.lowered) continue;
    // A move prefills the prompt and the tokens so far locally: a stream that began from codes
    // continues from the consumer's own cache, which its reference does not describe.
    if (s.moves > 0 && s.started_mode != "local") continue;
    const SoakReference* ref = references.Find(record.spec.prompt, s.target, s.mode);
    if (ref == nullptr) continue;
    s.compared = true;
    s.tokens = CompareWithReference(s.ids, s.reason, *ref, tie);
  }
}

// One call of the request to `server`, its events taken by `checker` until it ends (or, for an
// abandoning client, until reading stops); its status.
grpc::Status FollowCall(const SoakRequestSpec& spec, const v1::GenerateRequest& request,
                        const std::string& server, absl::Time sent, absl::Time deadline,
                        StreamChecker& checker, SoakCanceller& canceller) {
  const bool abandon = spec.action == ClientAction::kAbandon;
  auto stub = v1::Inference::NewStub(ChannelTo(server, abandon));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  if (spec.action == ClientAction::kCancel) canceller.Add(&context, sent + spec.action_after);
  auto reader = stub->Generate(&context, request);
  v1::GenerateEvent event;
  bool stopped_reading = false;
  while (reader->Read(&event)) {
    const absl::Time now = absl::Now();
    checker.Take(event, now);
    if (event.has_token() && spec.read_pace > absl::ZeroDuration()) {
      absl::SleepFor(spec.read_pace);
      checker.Ready(absl::Now());
    }
    if (abandon && now - sent >= spec.action_after) {
      stopped_reading = true;
      absl::SleepFor(deadline + absl::Milliseconds(200) - absl::Now());
      break;
    }
  }
  if (stopped_reading) context.TryCancel();  // what is left unread goes with the call
  const grpc::Status status = reader->Finish();
  canceller.Remove(&context);
  return status;
}

// Where stream `s` of `record`, whose last call (to `server`) ended with `status` after
// `resumes` resumes of it, resumes: "" when it does not (with `*blocked` saying why, where the
// call broke before the stream's end).
std::string NextCoordinator(const SoakRecord& record, const SoakStream& s, int resumes,
                            const grpc::Status& status, const std::string& server,
                            const LiveCoordinators& live, absl::Time deadline,
                            std::string* blocked) {
  blocked->clear();
  if (live == nullptr || s.terminals > 0 || !IsResumableBreak(FromGrpcStatus(status))) return "";
  if (record.spec.action != ClientAction::kNone) {
    *blocked = "client action";
  } else if (!s.had_token) {
    *blocked = "no resume token";
  } else if (resumes >= kSoakResumes) {
    *blocked = "resumes used up";
  } else if (absl::Now() >= deadline) {
    *blocked = "past its deadline";
  } else {
    for (const std::string& c : live()) {
      if (c != server) return c;
    }
    *blocked = "no other live coordinator";
  }
  return "";
}

// Resumes stream `i` of `record`, whose call to `server` broke with `status`, alone through the
// next live coordinators until it ends or cannot resume; its last call's status.
grpc::Status ResumeStream(size_t i, grpc::Status status, std::string server,
                          const v1::GenerateRequest& request, absl::Time deadline,
                          const LiveCoordinators& live, SoakRecord& record, StreamChecker& checker,
                          SoakCanceller& canceller) {
  for (int resumes = 0;; ++resumes) {
    v1::GenerateRequest resume;
    const std::string next = checker.Locked([&] {
      std::string blocked;
      std::string to = NextCoordinator(record, record.streams[i], resumes, status, server, live,
                                       deadline, &blocked);
      if (!blocked.empty()) record.resume_blocked = blocked;
      if (to.empty()) return to;
      record.resumed_via.push_back(to);
      resume = ResumeRequest(request, checker.token(i), record.streams[i].ids);
      return to;
    });
    if (next.empty()) return status;
    server = next;
    status = FollowCall(record.spec, resume, server, record.sent, deadline, checker, canceller);
  }
}

}  // namespace

SoakCanceller::SoakCanceller() : thread_([this] { Loop(); }) {}

SoakCanceller::~SoakCanceller() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void SoakCanceller::Add(grpc::ClientContext* context, absl::Time when) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    due_.emplace(when, context);
  }
  cv_.notify_all();
}

void SoakCanceller::Remove(grpc::ClientContext* context) {
  std::lock_guard<std::mutex> lock(mu_);  // a TryCancel in progress holds it
  for (auto it = due_.begin(); it != due_.end();) {
    it = it->second == context ? due_.erase(it) : std::next(it);
  }
}

void SoakCanceller::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (due_.empty()) {
      cv_.wait(lock);
      continue;
    }
    const absl::Time next = due_.begin()->first;
    if (absl::Now() < next) {
      cv_.wait_until(lock, absl::ToChronoTime(next));
      continue;
    }
    due_.begin()->second->TryCancel();
    due_.erase(due_.begin());
  }
}

SoakRecord RunSoakRequest(const SoakRequestSpec& spec, const std::vector<std::string>& prompts,
                          const std::string& coordinator, const SoakReferences& references,
                          double tie, SoakCanceller& canceller, const LiveCoordinators& live) {
  SoakRecord record;
  record.spec = spec;
  record.coordinator = coordinator;
  StreamChecker checker(&record);
  // A client's own deadline: the request's, and then some (the server ends it first); an
  // abandoning client's call ends by its deadline soon after it stops reading.
  const absl::Duration call_deadline =
      spec.action == ClientAction::kAbandon
          ? spec.action_after + absl::Seconds(2)
          : absl::Milliseconds(spec.deadline_ms) + absl::Seconds(10);
  record.sent = absl::Now();
  const absl::Time deadline = record.sent + call_deadline;
  const v1::GenerateRequest request = ToGenerateRequest(spec, prompts);
  const grpc::Status status =
      FollowCall(spec, request, coordinator, record.sent, deadline, checker, canceller);
  // Each stream the call left without its terminal event resumes alone (a fan-out's targets at
  // once, one thread each: their tokens are their own).
  std::vector<size_t> open;
  for (size_t i = 0; i < record.streams.size(); ++i) {
    if (record.streams[i].terminals == 0) open.push_back(i);
  }
  std::vector<grpc::Status> ended(record.streams.size(), status);
  auto resume = [&](size_t i) {
    ended[i] =
        ResumeStream(i, status, coordinator, request, deadline, live, record, checker, canceller);
  };
  if (open.size() == 1) {
    resume(open[0]);
  } else {
    std::vector<std::thread> resuming;
    for (size_t i : open) resuming.emplace_back(resume, i);
    for (std::thread& t : resuming) t.join();
  }
  // The request's status: the call's when every stream ended in it, else the first resumed
  // stream's failure (OK when each ended well).
  grpc::Status rpc = status;
  if (!open.empty()) {
    rpc = grpc::Status::OK;
    for (size_t i : open) {
      if (!ended[i].ok()) {
        rpc = ended[i];
        break;
      }
    }
  }
  record.ended = absl::Now();
  const bool all_ended = [&] {
    for (const SoakStream& s : record.streams) {
      if (s.terminals == 0) return false;
    }
    return true;
  }();
  record.client_ended = spec.action != ClientAction::kNone && !all_ended;
  checker.End(rpc, ended);
  CheckTokens(record, references, tie);
  for (const SoakStream& s : record.streams) {
    if (s.compared && !s.tokens.ok) {
      record.violations.push_back(
          absl::StrCat(s.target, " (", s.mode, ", prompt ", spec.prompt, ", salt '", spec.salt,
                       "', cached: producer ", s.producer_cached, " consumer ", s.consumer_cached,
                       ", payload ", s.payload_bytes, " B): ", s.tokens.why));
    }
  }
  return record;
}

}  // namespace scd::bench
