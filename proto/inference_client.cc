#include "proto/inference_client.h"

#include <grpcpp/grpcpp.h>

#include <cstdlib>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "base/grpc_tls.h"
#include "proto/grpc_util.h"
#include "scd/v1/inference.grpc.pb.h"

namespace scd {
namespace {

std::unique_ptr<v1::Inference::Stub> Stub(const std::string& server) {
  return v1::Inference::NewStub(NewGrpcChannel(server));
}

// $SCD_API_TOKEN, when set, as the bearer token (as OpenAI's clients read OPENAI_API_KEY).
void AttachApiToken(grpc::ClientContext* context) {
  const char* token = std::getenv("SCD_API_TOKEN");
  if (token != nullptr && *token != '\0') {
    context->AddMetadata("authorization", std::string("Bearer ") + token);
  }
}

}  // namespace

absl::Status StreamGenerate(const std::string& server, const v1::GenerateRequest& request,
                            absl::Duration timeout,
                            const std::function<void(const v1::GenerateEvent&)>& on_event) {
  auto stub = Stub(server);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  AttachApiToken(&context);
  auto reader = stub->Generate(&context, request);
  v1::GenerateEvent event;
  while (reader->Read(&event)) on_event(event);
  return FromGrpcStatus(reader->Finish());
}

bool IsResumableBreak(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsCancelled(status) || absl::IsAborted(status) ||
         absl::IsUnknown(status);
}

v1::GenerateRequest ResumeRequest(const v1::GenerateRequest& request, const std::string& token,
                                  const std::vector<int32_t>& received) {
  v1::GenerateRequest next = request;
  next.set_resume_token(token);
  next.clear_resume_received_ids();
  for (int32_t id : received) next.add_resume_received_ids(id);
  return next;
}

namespace {

// What a client holds of one target's stream for its resume.
struct TargetResume {
  std::string token;              // its Started's resume token
  std::vector<int32_t> received;  // output ids so far
  bool ended = false;             // its Finished or Error came
};

// One resuming request's state: each target's, and the events handed on one at a time.
class ResumingStreams {
 public:
  ResumingStreams(const std::vector<std::string>& servers, const v1::GenerateRequest& request,
                  absl::Time deadline,
                  const std::function<void(const v1::GenerateEvent&)>& on_event, GenerateCall call)
      : servers_(servers),
        request_(request),
        deadline_(deadline),
        on_event_(on_event),
        call_(std::move(call)) {}

  absl::Status Call(size_t server, const v1::GenerateRequest& request) {
    return call_(servers_[server], request, deadline_ - absl::Now(),
                 [this](const v1::GenerateEvent& event) { Take(event); });
  }

  // The targets a call that broke left open with a token to resume them (in the request's
  // order); *lost: some target left open without one (no Started yet).
  std::vector<std::string> Resumable(bool* lost) {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> open;
    *lost = false;
    for (const std::string& target : request_.targets()) {
      const TargetResume& t = targets_[target];
      if (t.ended) continue;
      if (t.token.empty()) {
        *lost = true;
      } else {
        open.push_back(target);
      }
    }
    return open;
  }

  // Resumes `target`, whose call broke with `status`, alone through the servers after the
  // first (in order, wrapping; at most servers.size() times): its last call's status.
  absl::Status Resume(const std::string& target, absl::Status status) {
    size_t server = 0;
    for (size_t tries = 0; tries < servers_.size() && absl::Now() < deadline_; ++tries) {
      server = (server + 1) % servers_.size();
      v1::GenerateRequest next;
      {
        absl::MutexLock lock(&mu_);
        const TargetResume& t = targets_[target];
        next = ResumeRequest(request_, t.token, t.received);
        ++resumes_;
      }
      status = Call(server, next);
      absl::MutexLock lock(&mu_);
      if (!IsResumableBreak(status) || targets_[target].ended) break;
    }
    return status;
  }

  int resumes() {
    absl::MutexLock lock(&mu_);
    return resumes_;
  }

 private:
  void Take(const v1::GenerateEvent& event) {
    absl::MutexLock lock(&mu_);
    TargetResume& t = targets_[event.target()];
    if (event.has_started()) t.token = event.started().resume_token();
    if (event.has_token()) {
      t.received.insert(t.received.end(), event.token().ids().begin(), event.token().ids().end());
    }
    if (event.has_finished() || event.has_error()) t.ended = true;
    on_event_(event);
  }

  const std::vector<std::string>& servers_;
  const v1::GenerateRequest& request_;
  const absl::Time deadline_;
  const std::function<void(const v1::GenerateEvent&)>& on_event_;
  const GenerateCall call_;
  absl::Mutex mu_;
  std::map<std::string, TargetResume> targets_ ABSL_GUARDED_BY(mu_);
  int resumes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

absl::Status StreamGenerateResuming(const std::vector<std::string>& servers,
                                    const v1::GenerateRequest& request, absl::Duration timeout,
                                    const std::function<void(const v1::GenerateEvent&)>& on_event,
                                    int* resumes, const GenerateCall& call) {
  if (servers.empty()) return absl::InvalidArgumentError("no server to send the request to");
  ResumingStreams streams(servers, request, absl::Now() + timeout, on_event,
                          call ? call : GenerateCall(StreamGenerate));
  const absl::Status status = streams.Call(0, request);
  bool lost = false;
  const std::vector<std::string> open =
      IsResumableBreak(status) ? streams.Resumable(&lost) : std::vector<std::string>();
  // Each open target alone, a fan-out's at once (a thread each).
  std::vector<absl::Status> ended(open.size());
  if (open.size() == 1) {
    ended[0] = streams.Resume(open[0], status);
  } else {
    std::vector<std::thread> resuming;
    for (size_t i = 0; i < open.size(); ++i) {
      resuming.emplace_back([&, i] { ended[i] = streams.Resume(open[i], status); });
    }
    for (std::thread& t : resuming) t.join();
  }
  if (resumes != nullptr) *resumes = streams.resumes();
  if (open.empty() || lost) return status;
  for (const absl::Status& s : ended) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::ModelInfo>> ListModels(const std::string& server,
                                                      absl::Duration timeout) {
  auto stub = Stub(server);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  AttachApiToken(&context);
  v1::ListModelsResponse response;
  const grpc::Status status = stub->ListModels(&context, v1::ListModelsRequest(), &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return std::vector<v1::ModelInfo>(response.models().begin(), response.models().end());
}

}  // namespace scd
