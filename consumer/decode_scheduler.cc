#include "consumer/decode_scheduler.h"

#include <ATen/ATen.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/change_notice.h"
#include "base/exception_guard.h"
#include "base/release_clock.h"
#include "base/thread_name.h"
#include "consumer/step_plan.h"
#include "model/skinny_gemm.h"
#include "serving/serving_metrics.h"

namespace scd::consumer {

struct DecodeScheduler::Sequence {
  explicit Sequence(SequenceRequest r, const LlamaModel& model)
      : req(std::move(r)),
        state(model.config(), req.options),
        workspace(model.NewWorkspace(static_cast<int64_t>(req.prompt.size()) +
                                     req.options.max_tokens)),
        prompt_next(req.cache.length()) {}

  bool decoding() const { return input.has_value(); }
  bool prefilling() const { return !input.has_value() && !req.first_logits.defined(); }

  SequenceRequest req;
  GenerationState state;
  DecodeWorkspace workspace;
  int64_t prompt_next;            // the next prompt position to run while prefilling
  std::optional<TokenId> input;   // decoding: the token to run next
  absl::Time joined = absl::InfinitePast();
  absl::Time first_token = absl::InfinitePast();
  absl::Duration prefill = absl::ZeroDuration();
  bool sampled = false;  // its first logits were sampled
  bool ended = false;
};

namespace {

// This thread `nice` steps nicer than it is (a no-op elsewhere than Linux, or for 0).
void LowerThreadPriority(int nice) {
#ifdef __linux__
  if (nice <= 0) return;
  const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
  errno = 0;
  const int now = ::getpriority(PRIO_PROCESS, tid);
  if (errno == 0 && ::setpriority(PRIO_PROCESS, tid, std::min(19, now + nice)) != 0) {
    spdlog::warn("the decode scheduler's thread keeps its priority: setpriority: {}",
                 std::strerror(errno));
  }
#else
  (void)nice;
#endif
}

}  // namespace

DecodeScheduler::DecodeScheduler(const LlamaModel& model, SchedulerOptions options)
    : model_(model),
      options_(options),
      clock_(options.clock != nullptr ? options.clock : Clock::Real()),
      limits_{options.max_batched_tokens, model.config().num_layers, kSkinnyMaxRows},
      pacer_(options.step_slack, kSkinnyMaxRows),
      step_log_(options.step_log_interval, clock_->Now()) {
  thread_ = std::thread([this] {
    NameThisThread("scd-decode");
    Loop();
  });
}

DecodeScheduler::~DecodeScheduler() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

absl::Status DecodeScheduler::Submit(SequenceRequest request) {
  if (request.sink == nullptr) return absl::InvalidArgumentError("a sequence needs a sink");
  const GenerationOptions& o = request.options;
  if (absl::Status valid = o.sampling.Validate(); !valid.ok()) return valid;
  if (o.max_tokens < 0 || o.top_logprobs < 0) {
    return absl::InvalidArgumentError("max_tokens and top_logprobs must be >= 0");
  }
  const int64_t prompt = static_cast<int64_t>(request.prompt.size());
  const int64_t cached = request.cache.length();
  if (prompt == 0) return absl::InvalidArgumentError("a sequence needs a prompt");
  if (prompt > model_.config().max_position_embeddings) {
    return absl::OutOfRangeError(absl::StrCat("prompt of ", prompt,
                                              " tokens exceeds max_position_embeddings (",
                                              model_.config().max_position_embeddings, ")"));
  }
  if (!request.cache.uniform() || request.cache.num_layers() != model_.config().num_layers) {
    return absl::InvalidArgumentError("the sequence's cache is not uniform or not this model's");
  }
  if (request.first_logits.defined()) {
    if (cached != prompt || request.first_logits.numel() != model_.config().vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "with the last prompt token's logits the cache must hold all ", prompt,
          " prompt positions; it holds ", cached));
    }
  } else if (cached >= prompt) {
    return absl::InvalidArgumentError(
        absl::StrCat("the cache holds ", cached, " of ", prompt,
                     " prompt positions; at least the last must still run to get logits"));
  }
  if (request.prompt_logits_from.has_value() &&
      (request.first_logits.defined() || *request.prompt_logits_from < cached ||
       *request.prompt_logits_from >= prompt)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt logits from position ", *request.prompt_logits_from,
        ": not a position a prefill chunk runs (the cache holds ", cached, " of ", prompt, ")"));
  }
  auto seq = GuardExceptions("DecodeScheduler::Submit",
                             [&]() -> absl::StatusOr<std::unique_ptr<Sequence>> {
                               return std::make_unique<Sequence>(std::move(request), model_);
                             });
  if (!seq.ok()) return seq.status();
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError("the consumer's scheduler is stopping");
  incoming_.push_back(*std::move(seq));
  return absl::OkStatus();
}

void DecodeScheduler::RunBetweenSteps(int64_t rows, int layers, RebuildPacing::Piece work,
                                      std::function<void(absl::Status)> done) {
  if (rows <= 0) return done(absl::OkStatus());
  auto item = std::make_unique<Work>();
  item->rows = rows;
  item->layers = layers;
  item->fn = std::move(work);
  item->done = std::move(done);
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      work_.push_back(std::move(item));
      return;
    }
  }
  item->done(absl::UnavailableError("the consumer's scheduler is stopping"));
}

DecodeScheduler::Stats DecodeScheduler::stats() const {
  absl::MutexLock lock(&mu_);
  Stats stats = stats_;
  stats.pending_work = static_cast<int64_t>(work_.size());
  stats.running += static_cast<int64_t>(incoming_.size());
  return stats;
}

void DecodeScheduler::Loop() {
  LowerThreadPriority(options_.nice);
  std::list<std::unique_ptr<Sequence>> running;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !incoming_.empty() || !work_.empty() || !running.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) break;
      const absl::Time now = clock_->Now();
      while (!incoming_.empty()) {
        incoming_.front()->joined = now;
        running.push_back(std::move(incoming_.front()));
        incoming_.pop_front();
      }
    }
    Step(running);
  }
  // Stopping: every sequence ends and every waiting piece fails.
  std::deque<std::unique_ptr<Sequence>> incoming;
  std::deque<std::unique_ptr<Work>> waiting;
  {
    absl::MutexLock lock(&mu_);
    incoming.swap(incoming_);
    waiting.swap(work_);
  }
  for (auto& work : waiting)
    work->done(absl::UnavailableError("the consumer's scheduler is stopping"));
  const absl::Status stopped = absl::UnavailableError("the consumer is shutting down");
  for (auto& seq : incoming) {
    End(*seq, stopped, FinishReason::kNone);
    running.push_back(std::move(seq));
  }
  for (auto& seq : running) End(*seq, stopped, FinishReason::kNone);
  Settle(running, Batch());
}

void DecodeScheduler::End(Sequence& seq, absl::Status status, FinishReason reason) {
  if (seq.ended) return;
  seq.ended = true;
  SequenceEnd end;
  end.status = std::move(status);
  end.finish_reason = reason;
  end.output_tokens = static_cast<int64_t>(seq.state.output_ids().size());
  end.joined = seq.joined;
  end.first_token = seq.first_token;
  end.prefill = seq.prefill;
  ends_.emplace_back(seq.req.sink, std::move(end));
}

void DecodeScheduler::Settle(std::list<std::unique_ptr<Sequence>>& running, const Batch& batch) {
  running.remove_if([](const auto& seq) { return seq->ended; });
  Publish(running, batch);
  std::vector<std::pair<SequenceSink*, SequenceEnd>> ends;
  ends.swap(ends_);
  for (auto& [sink, end] : ends) sink->Ended(end);
}

void DecodeScheduler::RunPieces(const StepPlan& plan, const std::vector<Work*>& queued) {
  const int64_t layers = model_.config().num_layers;
  for (const StepPlan::Piece& piece : plan.pieces) {  // in order: a later transfer waits
    Work* work = queued[piece.work];
    const int64_t n = piece.rows;
    const absl::Time start = clock_->Now();
    absl::Status status =
        GuardExceptions("rebuild piece", [&] { return work->fn(work->next_row, n); });
    const double took = absl::ToDoubleSeconds(clock_->Now() - start);
    work->next_row += n;
    if (work->layers > 0) {
      rebuild_price_.Observe(took, n, work->layers);
      // Every decoding sequence waits for the piece: its whole time is their ITL.
      if (plan.decodes > 0) {
        rebuild_itl_.Add(took, static_cast<double>(n) * work->layers / static_cast<double>(layers));
      }
    }
    if (status.ok() && work->next_row < work->rows) break;  // its next rows in a later step
    std::unique_ptr<Work> finished;
    {
      absl::MutexLock lock(&mu_);
      finished = std::move(work_.front());  // `work` is the front: earlier ones are done
      work_.pop_front();
    }
    const bool failed = !status.ok();
    finished->done(std::move(status));
    if (failed) break;  // the plan's later pieces counted on this one's rows
  }
}

StepState DecodeScheduler::ViewOf(const std::vector<Sequence*>& running,
                                  std::vector<Work*>* queued) const {
  StepState state;
  state.now = clock_->Now();
  state.rebuild_row_layer_s = rebuild_price_.RowLayerSeconds();
  for (const Sequence* seq : running) {
    PlannedSequence planned;
    planned.decoding = seq->decoding();
    if (seq->prefilling()) {
      planned.prompt_left = static_cast<int64_t>(seq->req.prompt.size()) - seq->prompt_next;
    }
    planned.cancelled = seq->req.cancelled != nullptr && seq->req.cancelled->load();
    planned.deadline = seq->req.deadline;
    state.sequences.push_back(planned);
  }
  {
    absl::MutexLock lock(&mu_);
    queued->clear();
    for (const auto& work : work_) queued->push_back(work.get());
  }
  for (const Work* work : *queued) state.work.push_back({work->rows - work->next_row, work->layers});
  return state;
}

void DecodeScheduler::Step(std::list<std::unique_ptr<Sequence>>& running) {
  std::vector<Sequence*> members;
  for (auto& seq : running) members.push_back(seq.get());
  std::vector<Work*> queued;
  const StepPlan plan = PlanStep(ViewOf(members, &queued), pacer_, limits_);
  // Leaves: cancelled and expired sequences, told now, not after this step's forward.
  for (const StepPlan::Leave& leave : plan.leaves) {
    Sequence& seq = *members[leave.sequence];
    if (leave.why == StepLeave::kCancelled) {
      End(seq, absl::CancelledError("cancelled"), FinishReason::kCancelled);
    } else {
      End(seq, absl::DeadlineExceededError("the request's deadline passed"), FinishReason::kNone);
    }
  }
  if (!ends_.empty()) Settle(running, Batch());  // the leaving sequences are gone from here on
  const absl::Time start = clock_->Now();
  RunPieces(plan, queued);
  const absl::Time pieces_end = clock_->Now();
  if (plan.decodes > 0 && !plan.decodes_only) last_chunk_budget_ = plan.chunk_budget;
  // Sequences that joined with their first logits (rebuilt caches) need no forward: their first
  // token goes before this step's forward, not after it (they decode from the next step on).
  // `running`, not `members`: the leaves settled above are gone from it.
  for (auto& seq : running) {
    if (seq->ended || seq->sampled || !seq->req.first_logits.defined()) continue;
    seq->req.sink->PromptDone(seq->req.cache);
    Pick(*seq, seq->req.first_logits);
  }

  Batch batch = BatchOf(plan, members);
  std::vector<at::Tensor> logits;
  if (!batch.inputs.empty()) {
    const absl::Time start = clock_->Now();
    absl::StatusOr<std::vector<at::Tensor>> out = model_.ForwardBatch(batch.inputs);
    const double took = absl::ToDoubleSeconds(clock_->Now() - start);
    if (!out.ok()) {
      for (Sequence* seq : batch.members) End(*seq, out.status(), FinishReason::kNone);
      Settle(running, batch);
      return;
    }
    logits = *std::move(out);
    Learn(batch, took, plan.chunk_allowed);
  }
  Account(plan, start, pieces_end, static_cast<int64_t>(running.size()));
  for (size_t i = 0; i < batch.members.size(); ++i) {
    Sequence& seq = *batch.members[i];
    at::Tensor next = logits[i];
    if (batch.chunk[i] > 0) {
      seq.prompt_next += batch.chunk[i];
      if (!PromptChunkRan(seq, &next)) continue;  // more chunks to come, or it ended
    }
    Pick(seq, next);
  }
  Settle(running, batch);
}

void DecodeScheduler::Publish(const std::list<std::unique_ptr<Sequence>>& running,
                              const Batch& batch) {
  absl::MutexLock lock(&mu_);
  if (!batch.inputs.empty()) ++stats_.steps;
  stats_.max_batch =
      std::max<int64_t>(stats_.max_batch, static_cast<int64_t>(batch.inputs.size()));
  if (static_cast<int64_t>(running.size()) < stats_.running) NoteRelease();
  if (static_cast<int64_t>(running.size()) > stats_.running) NoteChange();
  stats_.running = static_cast<int64_t>(running.size());
  stats_.decoding = 0;
  for (const auto& seq : running) stats_.decoding += seq->decoding();
  stats_.decode_step_ms = pacer_.DecodeStepEstimate(stats_.decoding) * 1e3;
  stats_.chunk_tokens = last_chunk_budget_;
  stats_.local_itl_us_per_token = pacer_.local_itl().UsPerToken();
  stats_.rebuild_itl_us_per_token = rebuild_itl_.UsPerToken();
  stats_.busy_prefill_us_per_token = busy_prefill_.UsPerToken();
}

DecodeScheduler::Batch DecodeScheduler::BatchOf(const StepPlan& plan,
                                                const std::vector<Sequence*>& members) {
  Batch batch;
  batch.decodes = plan.decodes;
  batch.prefill_tokens = plan.prefill_tokens;
  for (const StepPlan::Member& m : plan.batch) {
    Sequence* seq = members[m.sequence];
    if (m.chunk == 0) {
      batch.inputs.push_back(
          {absl::MakeConstSpan(&*seq->input, 1), &seq->req.cache, &seq->workspace, true});
    } else {
      const int64_t end = seq->prompt_next + m.chunk;
      // The prompt's last position's logits; with prompt_logits_from, every position's from
      // there that this chunk runs.
      int64_t rows = end == static_cast<int64_t>(seq->req.prompt.size()) ? 1 : 0;
      if (seq->req.prompt_logits_from.has_value()) {
        rows =
            std::max<int64_t>(rows, end - std::max(seq->prompt_next, *seq->req.prompt_logits_from));
      }
      batch.inputs.push_back(
          {absl::MakeConstSpan(seq->req.prompt)
               .subspan(static_cast<size_t>(seq->prompt_next), static_cast<size_t>(m.chunk)),
           &seq->req.cache, &seq->workspace, rows > 0, std::max<int64_t>(rows, 1)});
    }
    batch.members.push_back(seq);
    batch.chunk.push_back(m.chunk);
  }
  return batch;
}

void DecodeScheduler::Account(const StepPlan& plan, absl::Time start, absl::Time pieces_end,
                              int64_t running) {
  if (options_.step_log_interval <= absl::ZeroDuration()) return;
  if (plan.batch.empty() && plan.pieces.empty()) return;  // nothing ran
  const absl::Time now = clock_->Now();
  StepRecord step;
  step.seconds = absl::ToDoubleSeconds(now - start);
  step.decodes = plan.decodes;
  step.prompt_tokens = plan.prefill_tokens;
  for (const StepPlan::Piece& piece : plan.pieces) step.rebuild_rows += piece.rows;
  step.pieces = static_cast<int64_t>(plan.pieces.size());
  step.pieces_seconds = absl::ToDoubleSeconds(pieces_end - start);
  step.measuring = plan.decodes_only;
  step_log_.Add(step);
  if (std::optional<std::string> line = step_log_.Line(now, pacer_.aim(), running)) {
    spdlog::info("{}", *line);
  }
}

void DecodeScheduler::Learn(const Batch& plan, double took, double allowed) {
  // `plan`: the step's batch as it ran.
  // (The pacer learns the local prefill's ITL cost from the same step.)
  if (plan.decodes > 0 && plan.prefill_tokens > 0) {
    busy_prefill_.Add(took, static_cast<double>(plan.prefill_tokens));
  }
  pacer_.Observe(plan.decodes, plan.prefill_tokens, took, allowed);
  if (options_.metrics != nullptr) {
    options_.metrics->ObserveStep(static_cast<int64_t>(plan.inputs.size()),
                                  plan.decodes + plan.prefill_tokens, took);
  }
}

bool DecodeScheduler::PromptChunkRan(Sequence& seq, at::Tensor* logits) {
  const int64_t prompt = static_cast<int64_t>(seq.req.prompt.size());
  if (!logits->defined()) return false;  // nothing asked of this chunk
  if (seq.req.prompt_logits_from.has_value()) {
    const int64_t rows = logits->size(0);
    absl::Status judged = GuardExceptions("prompt logits", [&] {
      return seq.req.sink->PromptLogits(seq.prompt_next - rows, *logits);
    });
    if (!judged.ok()) {
      End(seq, std::move(judged), FinishReason::kNone);
      return false;
    }
    *logits = logits->narrow(0, rows - 1, 1);  // the last row: the next position's
  }
  if (seq.prompt_next < prompt) return false;
  seq.req.sink->PromptDone(seq.req.cache);
  return true;
}

void DecodeScheduler::Pick(Sequence& seq, const at::Tensor& logits) {
  if (!seq.sampled) {
    seq.sampled = true;
    seq.prefill = clock_->Now() - seq.joined;
  }
  std::optional<TokenId> next;
  const absl::Status failed = GuardExceptions("sampling", [&]() -> absl::Status {
    next = seq.state.Next(logits, seq.req.cache.length(),
                          [&](TokenId id, const TokenLogprobs& logprobs) {
                            if (seq.first_token == absl::InfinitePast()) {
                              seq.first_token = clock_->Now();
                            }
                            return seq.req.sink->Token(id, logprobs);
                          });
    return absl::OkStatus();
  });
  if (!failed.ok()) return End(seq, failed, FinishReason::kNone);
  if (next.has_value()) {
    seq.input = *next;
    return;
  }
  // The model running out of positions reads as length to clients (as OpenAI's API says it).
  End(seq, absl::OkStatus(),
      seq.state.finish_reason() == FinishReason::kStop ? FinishReason::kStop
                                                       : FinishReason::kLength);
}

}  // namespace scd::consumer
