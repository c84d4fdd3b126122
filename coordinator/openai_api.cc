#include "coordinator/openai_api.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/random_id.h"
#include "proto/wire_mode.h"
#include "scd/v1/inference.grpc.pb.h"
#include "serving/checked_inference.h"

namespace scd::coordinator {
namespace {

using Json = nlohmann::json;

std::string Dump(const Json& json) {
  return json.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// A request refused before any call: OpenAI's invalid_request_error, naming the parameter.
absl::Status Invalid(const std::string& param, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat(param, ": ", message));
}

// The error a stream carries when the node ended it before its Finished, not because the client
// left: its coordinator went away or drained past its grace (UNAVAILABLE, or CANCELLED by the
// server). A gRPC client resumes such a stream through another coordinator with its Started's
// resume token; an OpenAI stream cannot, so its error says what a client can do instead.
std::string BrokenStreamMessage(const grpc::Status& status) {
  std::string message = status.error_message().empty() ? "the stream ended before it finished"
                                                       : status.error_message();
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
      status.error_code() == grpc::StatusCode::CANCELLED) {
    absl::StrAppend(&message,
                    "; an OpenAI stream cannot be resumed: send the request again (a client of "
                    "the gRPC API, scd.v1.Inference/Generate, resumes it through another "
                    "coordinator with its Started event's resume_token)");
  }
  return message;
}

HttpResponse ErrorResponse(int http_status, const std::string& message) {
  const char* type = http_status == 401   ? "authentication_error"
                     : http_status == 429 ? "rate_limit_exceeded"
                     : http_status >= 500 ? "server_error"
                                          : "invalid_request_error";
  return HttpResponse::Json(http_status, OpenAiErrorJson(message, type, http_status));
}

// What the client asked, as the node's GenerateRequest plus the OpenAI-only parts.
struct ParsedRequest {
  v1::GenerateRequest request;
  bool chat = false;
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;  // per-token logprobs in the answer
  std::string model;
};

template <typename T>
absl::StatusOr<std::optional<T>> Field(const Json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return std::optional<T>();
  try {
    if constexpr (std::is_same_v<T, bool>) {
      if (!it->is_boolean()) return Invalid(name, "expected true or false");
    } else if constexpr (std::is_arithmetic_v<T>) {
      if (!it->is_number()) return Invalid(name, "expected a number");
      if (std::is_integral_v<T> && !it->is_number_integer() && !it->is_number_unsigned()) {
        return Invalid(name, "expected an integer");
      }
      if (std::is_unsigned_v<T> && it->is_number_integer() && it->get<int64_t>() < 0) {
        return Invalid(name, "must not be negative");
      }
      if (std::is_integral_v<T> && it->is_number_unsigned() &&
          it->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<T>::max())) {
        return Invalid(name, "too large");
      }
    } else if (!it->is_string()) {
      return Invalid(name, "expected a string");
    }
    return std::optional<T>(it->get<T>());
  } catch (const Json::exception&) {
    return Invalid(name, "has the wrong type");
  }
}

#define SCD_FIELD(var, T, body, name)                                 \
  absl::StatusOr<std::optional<T>> var##_or = Field<T>(body, name);   \
  if (!var##_or.ok()) return var##_or.status();                       \
  const std::optional<T>& var = *var##_or

absl::Status ParseStrings(const Json& body, const char* name,
                          google::protobuf::RepeatedPtrField<std::string>* out) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return absl::OkStatus();
  if (it->is_string()) {
    *out->Add() = it->get<std::string>();
    return absl::OkStatus();
  }
  if (!it->is_array()) return Invalid(name, "expected a string or a list of strings");
  for (const Json& item : *it) {
    if (!item.is_string()) return Invalid(name, "expected a string or a list of strings");
    *out->Add() = item.get<std::string>();
  }
  return absl::OkStatus();
}

// The chat prompt: the model's template, else the plain format (openai_api.h).
absl::StatusOr<std::string> ChatPrompt(const Json& body, const ChatTemplate* chat_template) {
  auto it = body.find("messages");
  if (it == body.end() || !it->is_array() || it->empty()) {
    return Invalid("messages", "required: a non-empty list of {role, content}");
  }
  std::string prompt;
  std::vector<ChatMessage> messages;
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& message = (*it)[i];
    const std::string where = absl::StrCat("messages[", i, "]");
    if (!message.is_object()) return Invalid(where, "expected an object {role, content}");
    auto role = message.find("role");
    if (role == message.end() || !role->is_string()) return Invalid(where + ".role", "required");
    static const std::map<std::string, std::string> kRoles = {
        {"system", "System"}, {"developer", "System"}, {"user", "User"},
        {"assistant", "Assistant"}};
    auto name = kRoles.find(role->get<std::string>());
    if (name == kRoles.end()) {
      return Invalid(where + ".role", "one of system, developer, user, assistant");
    }
    std::string text;
    auto content = message.find("content");
    if (content == message.end() || content->is_null()) {
      text = "";
    } else if (content->is_string()) {
      text = content->get<std::string>();
    } else if (content->is_array()) {
      for (const Json& part : *content) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string()) {
          return Invalid(where + ".content", "only text parts ({type: \"text\", text}) are served");
        }
        text += part["text"].get<std::string>();
      }
    } else {
      return Invalid(where + ".content", "expected a string or a list of text parts");
    }
    absl::StrAppend(&prompt, name->second, ": ", text, "\n");
    messages.push_back({role->get<std::string>(), text});
  }
  if (chat_template == nullptr) return prompt + "Assistant:";
  absl::StatusOr<std::string> rendered = chat_template->Render(messages);
  if (!rendered.ok()) {
    return Invalid("messages", absl::StrCat("the model's chat template: ",
                                            rendered.status().message()));
  }
  return rendered;
}

// Everything after the prompt: sampling, lengths, logprobs, streaming, the SCD extensions.
absl::Status ParseOptions(const Json& body, ParsedRequest* out) {
  ParsedRequest& parsed = *out;
  const bool chat = parsed.chat;
  v1::GenerateRequest& r = parsed.request;
  SCD_FIELD(n, int64_t, body, "n");
  if (n.value_or(1) != 1) return Invalid("n", "only 1 (fan out to several models with targets)");
  SCD_FIELD(max_tokens, uint32_t, body, "max_tokens");
  SCD_FIELD(max_completion_tokens, uint32_t, body, "max_completion_tokens");
  r.set_max_tokens(max_completion_tokens.value_or(max_tokens.value_or(chat ? 0 : 16)));
  SCD_FIELD(temperature, double, body, "temperature");
  r.set_temperature(static_cast<float>(temperature.value_or(1.0)));
  SCD_FIELD(top_p, double, body, "top_p");
  r.set_top_p(static_cast<float>(top_p.value_or(1.0)));
  SCD_FIELD(top_k, uint32_t, body, "top_k");
  r.set_top_k(top_k.value_or(0));
  SCD_FIELD(seed, uint64_t, body, "seed");
  if (seed) r.set_seed(*seed);
  if (absl::Status s = ParseStrings(body, "stop", r.mutable_stop()); !s.ok()) return s;
  if (chat) {
    SCD_FIELD(logprobs, bool, body, "logprobs");
    SCD_FIELD(top_logprobs, uint32_t, body, "top_logprobs");
    parsed.logprobs = logprobs.value_or(false);
    if (top_logprobs && !parsed.logprobs) return Invalid("top_logprobs", "needs logprobs: true");
    if (parsed.logprobs) r.set_logprobs(std::max<uint32_t>(1, top_logprobs.value_or(0)));
  } else {
    SCD_FIELD(logprobs, uint32_t, body, "logprobs");
    parsed.logprobs = logprobs.has_value();
    if (logprobs) r.set_logprobs(std::max<uint32_t>(1, *logprobs));
  }
  SCD_FIELD(stream, bool, body, "stream");
  parsed.stream = stream.value_or(false);
  if (auto options = body.find("stream_options"); options != body.end() && options->is_object()) {
    SCD_FIELD(include_usage, bool, *options, "include_usage");
    parsed.include_usage = include_usage.value_or(false);
  }
  SCD_FIELD(mode, std::string, body, "mode");  // the API's strings, read at its edge
  const absl::StatusOr<RequestedMode> requested = ParseRequestedMode(mode.value_or(""));
  if (!requested.ok()) return Invalid("mode", std::string(requested.status().message()));
  SetRequestMode(*requested, &r);
  SCD_FIELD(cache_salt, std::string, body, "cache_salt");
  r.set_cache_salt(cache_salt.value_or(""));
  SCD_FIELD(fallback, bool, body, "allow_local_fallback");
  if (fallback.has_value()) r.set_allow_local_fallback(*fallback);  // unset: allowed
  SCD_FIELD(deadline_ms, uint32_t, body, "deadline_ms");
  r.set_deadline_ms(deadline_ms.value_or(0));
  SCD_FIELD(max_kl, double, body, "max_kl");
  r.set_max_kl(max_kl.value_or(0));
  SCD_FIELD(ttft_slo_ms, uint32_t, body, "ttft_slo_ms");
  r.set_ttft_slo_ms(ttft_slo_ms.value_or(0));
  SCD_FIELD(keep_ranks, bool, body, "keep_ranks");
  r.set_keep_ranks(keep_ranks.value_or(false));
  return absl::OkStatus();
}

absl::StatusOr<ParsedRequest> Parse(const std::string& text, bool chat,
                                     const ChatTemplate* chat_template) {
  Json body;
  try {
    body = Json::parse(text);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("the body is not JSON: ", e.what()));
  }
  if (!body.is_object()) return absl::InvalidArgumentError("the body must be a JSON object");
  ParsedRequest parsed;
  parsed.chat = chat;
  v1::GenerateRequest& r = parsed.request;
  SCD_FIELD(model, std::string, body, "model");
  if (absl::Status s = ParseStrings(body, "targets", r.mutable_targets()); !s.ok()) return s;
  if (r.targets().empty()) {
    if (!model || model->empty()) return Invalid("model", "required (the consumer model's name)");
    *r.add_targets() = *model;
  }
  parsed.model = model ? *model : r.targets(0);
  if (chat) {
    absl::StatusOr<std::string> prompt = ChatPrompt(body, chat_template);
    if (!prompt.ok()) return prompt.status();
    r.set_prompt(*prompt);
  } else {
    auto prompt = body.find("prompt");
    if (prompt == body.end() || prompt->is_null()) return Invalid("prompt", "required");
    if (prompt->is_string()) {
      r.set_prompt(prompt->get<std::string>());
    } else if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) {
      r.set_prompt((*prompt)[0].get<std::string>());
    } else if (prompt->is_array() && !prompt->empty() &&
               std::all_of(prompt->begin(), prompt->end(),
                           [](const Json& id) { return id.is_number_integer(); })) {
      for (const Json& id : *prompt) {
        const int64_t value = id.get<int64_t>();
        if (value < 0 || value > std::numeric_limits<int32_t>::max()) {
          return Invalid("prompt", "token ids must be in [0, 2^31)");
        }
        r.add_prompt_ids(static_cast<int32_t>(value));
      }
    } else {
      return Invalid("prompt", "one string, or one list of token ids (one prompt per request)");
    }
    SCD_FIELD(echo, bool, body, "echo");
    if (echo.value_or(false)) return Invalid("echo", "not supported");
  }
  if (absl::Status options = ParseOptions(body, &parsed); !options.ok()) return options;
  return parsed;
}

// What the node's CheckedInferenceService judges the HTTP client by: its bearer token and its
// address. False when the Authorization header cannot travel as gRPC metadata (not printable
// ASCII): refused like a wrong token.
bool AttachClient(const HttpRequest& http, grpc::ClientContext* context) {
  const std::string authorization = http.Header("Authorization");
  for (unsigned char c : authorization) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  if (!authorization.empty()) context->AddMetadata("authorization", authorization);
  if (!http.remote_addr.empty()) context->AddMetadata(kClientMetadata, http.remote_addr);
  return true;
}

// One target's answer as it accumulates.
struct Choice {
  int index = 0;
  std::string text;
  bool started_chat = false;  // the role delta was streamed
  std::optional<v1::Finished> finished;
  std::optional<v1::Error> error;
  Json logprobs = Json::array();  // chat: content entries; completions: rows
};

}  // namespace

int HttpStatusOfGrpcCode(int code) {
  switch (static_cast<grpc::StatusCode>(code)) {
    case grpc::StatusCode::OK: return 200;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::OUT_OF_RANGE:
    case grpc::StatusCode::FAILED_PRECONDITION: return 400;
    case grpc::StatusCode::UNAUTHENTICATED: return 401;
    case grpc::StatusCode::PERMISSION_DENIED: return 403;
    case grpc::StatusCode::NOT_FOUND: return 404;
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return 429;
    case grpc::StatusCode::CANCELLED: return 499;
    case grpc::StatusCode::UNAVAILABLE: return 503;
    case grpc::StatusCode::DEADLINE_EXCEEDED: return 504;
    default: return 500;
  }
}

class OpenAiHttpHandler::Impl : public std::enable_shared_from_this<OpenAiHttpHandler::Impl> {
 public:
  Impl(std::shared_ptr<grpc::Channel> channel, const Tokenizer* tokenizer,
       const ChatTemplate* chat_template)
      : stub_(v1::Inference::NewStub(std::move(channel))),
        tokenizer_(tokenizer),
        chat_template_(chat_template) {}

  // GET /v1/models: the node's ListModels, answered when it returns (no thread waits).
  void Models(const HttpRequest& http, const std::shared_ptr<HttpReply>& reply) {
    struct Listing {
      grpc::ClientContext context;
      v1::ListModelsRequest request;
      v1::ListModelsResponse response;
    };
    auto listing = std::make_shared<Listing>();
    if (!AttachClient(http, &listing->context)) {
      return reply->Send(ErrorResponse(401, "malformed Authorization"));
    }
    listing->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    stub_->async()->ListModels(
        &listing->context, &listing->request, &listing->response,
        [listing, reply](grpc::Status status) {
          if (!status.ok()) {
            return reply->Send(
                ErrorResponse(HttpStatusOfGrpcCode(status.error_code()), status.error_message()));
          }
          reply->Send(HttpResponse::Json(200, ModelList(listing->response)));
        });
  }

  static std::string ModelList(const v1::ListModelsResponse& models) {
    Json data = Json::array();
    std::vector<std::string> seen;
    for (const v1::ModelInfo& model : models.models()) {
      if (model.role() != "consumer" ||
          std::find(seen.begin(), seen.end(), model.name()) != seen.end()) {
        continue;
      }
      seen.push_back(model.name());
      data.push_back({{"id", model.name()}, {"object", "model"}, {"created", 0},
                      {"owned_by", "scd-serve"}, {"root", model.name()}, {"parent", nullptr}});
    }
    return Dump({{"object", "list"}, {"data", data}});
  }

  void Generate(const HttpRequest& http, const std::shared_ptr<HttpReply>& reply, bool chat) {
    absl::StatusOr<ParsedRequest> parsed = Parse(http.body, chat, chat_template_);
    if (!parsed.ok()) {
      return reply->Send(ErrorResponse(400, std::string(parsed.status().message())));
    }
    auto call = std::make_shared<Call>(shared_from_this(), *std::move(parsed), reply);
    if (!AttachClient(http, &call->context)) {
      return reply->Send(ErrorResponse(401, "malformed Authorization header"));
    }
    call->Begin(call);
  }

 private:
  // One request's call to the node's Generate: a reactor advanced by its events (gRPC's
  // callbacks) and by room in the client's stream; it holds no thread. It keeps itself alive
  // until its call is done (OnDone).
  class Call final : public grpc::ClientReadReactor<v1::GenerateEvent> {
   public:
    Call(std::shared_ptr<Impl> impl, ParsedRequest p, std::shared_ptr<HttpReply> reply)
        : impl(std::move(impl)),
          parsed(std::move(p)),
          id(absl::StrCat(parsed.chat ? "chatcmpl-" : "cmpl-", RandomId128())),
          created(absl::ToUnixSeconds(absl::Now())),
          reply_(std::move(reply)) {
      for (int i = 0; i < parsed.request.targets_size(); ++i) {
        choices[parsed.request.targets(i)].index = i;
      }
    }
    void Begin(std::shared_ptr<Call> self) {
      self_ = self;
      // A client that goes away (or reads too slowly) cancels every target.
      std::weak_ptr<Call> weak = self;
      reply_->OnClosed([weak] {
        if (std::shared_ptr<Call> call = weak.lock()) {
          call->client_left_ = true;
          call->context.TryCancel();
        }
      });
      impl->stub_->async()->Generate(&context, &parsed.request, this);
      StartRead(&event_);
      StartCall();
    }

   private:
    void OnReadDone(bool ok) override {
      if (!ok) return;  // the call's end: OnDone
      if (!parsed.stream) {
        Apply(event_);
        return StartRead(&event_);
      }
      if (!started_) {  // headers go out with the first event: a refusal keeps its HTTP status
        started_ = true;
        HttpResponse head;
        head.content_type = "text/event-stream";
        head.headers.emplace_back("Cache-Control", "no-cache");
        reply_->StartStream(std::move(head));
      }
      const Json chunk = Apply(event_);
      if (chunk.is_null() || reply_->Write(absl::StrCat("data: ", Dump(chunk), "\n\n"))) {
        return StartRead(&event_);
      }
      AddHold();  // the next read starts outside a reaction, once the client took enough
      reply_->OnRoom([this] {
        StartRead(&event_);
        RemoveHold();
      });
    }
    void OnDone(const grpc::Status& status) override {
      if (parsed.stream) {
        EndStream(status);
      } else {
        reply_->Send(Whole(status));
      }
      self_.reset();  // may delete this
    }
    void EndStream(const grpc::Status& status) {
      if (!started_) {
        return reply_->Send(ErrorResponse(HttpStatusOfGrpcCode(status.error_code()),
                                          status.ok() ? "no answer" : status.error_message()));
      }
      // Cancelled by the client: nobody to tell. Cancelled by the server (a drain past its
      // grace): an error, or the stream would look complete.
      if (!status.ok() && (status.error_code() != grpc::StatusCode::CANCELLED || !client_left_)) {
        reply_->Write(absl::StrCat("data: ",
                                   OpenAiErrorJson(BrokenStreamMessage(status), "server_error",
                                                   HttpStatusOfGrpcCode(status.error_code())),
                                   "\n\n"));
      }
      if (parsed.include_usage) {
        Json chunk = Chunk(Json::array());
        chunk["usage"] = Usage();
        reply_->Write(absl::StrCat("data: ", Dump(chunk), "\n\n"));
      }
      reply_->Write("data: [DONE]\n\n");
      reply_->End();
    }

   public:
    // Applies an event; the chunk to stream for it (null: nothing to send).
    Json Apply(const v1::GenerateEvent& event) {
      auto it = choices.find(event.target());
      if (it == choices.end()) return nullptr;
      Choice& c = it->second;
      Json chunk_choice = {{"index", c.index}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
      if (event.has_token()) {
        const v1::TokenDelta& token = event.token();
        c.text += token.text();
        Json rows = impl->Logprobs(token, parsed.chat);
        for (Json& row : rows) c.logprobs.push_back(row);
        if (parsed.logprobs) chunk_choice["logprobs"] = impl->LogprobsObject(rows, parsed.chat);
        if (token.text().empty() && !parsed.logprobs) return nullptr;
        if (parsed.chat) {
          chunk_choice["delta"] = {{"content", token.text()}};
        } else {
          chunk_choice["text"] = token.text();
        }
      } else if (event.has_finished() || event.has_error()) {
        if (event.has_finished()) {
          c.finished = event.finished();
          chunk_choice["finish_reason"] = event.finished().reason();
          chunk_choice["scd"] = ScdInfo(event.finished());
        } else {
          c.error = event.error();
          chunk_choice["finish_reason"] = "error";
          chunk_choice["error"] = ErrorObject(event.error());
        }
        if (parsed.chat) {
          chunk_choice["delta"] = Json::object();
        } else {
          chunk_choice["text"] = "";
        }
      } else {
        return nullptr;
      }
      if (parsed.chat && !c.started_chat && chunk_choice.contains("delta")) {
        c.started_chat = true;
        chunk_choice["delta"]["role"] = "assistant";
      }
      return Chunk({chunk_choice});
    }
    Json Chunk(Json choices_json) const {
      return {{"id", id}, {"object", parsed.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created}, {"model", parsed.model}, {"choices", std::move(choices_json)}};
    }
    Json Usage() const {
      uint32_t prompt = 0, completion = 0;
      for (const auto& [name, c] : choices) {
        if (!c.finished) continue;
        prompt = std::max(prompt, c.finished->prompt_tokens());
        completion += c.finished->output_tokens();
      }
      return {{"prompt_tokens", prompt}, {"completion_tokens", completion},
              {"total_tokens", prompt + completion}};
    }
    static Json ScdInfo(const v1::Finished& f) {
      Json info = {{"mode", RanModeName(f)},
                   {"mode_reason", f.mode_reason()},
                   {"payload_bytes", f.payload_bytes()},
                   {"ttft_ms", static_cast<double>(f.timings().ttft()) / 1000.0},
                   {"producer_cached_tokens", f.producer_cached_tokens()},
                   {"consumer_cached_tokens", f.consumer_cached_tokens()}};
      if (f.predicted_ttft_us() > 0) {
        info["predicted_ttft_ms"] = static_cast<double>(f.predicted_ttft_us()) / 1000.0;
      }
      for (const v1::LoweredLayer& l : f.lowered_layers()) {
        info["lowered_layers"].push_back({{"layer", l.layer()},
                                          {"rank_k", l.rank_k()},
                                          {"rank_v", l.rank_v()},
                                          {"rank_h", l.rank_h()}});
      }
      return info;
    }
    static Json ErrorObject(const v1::Error& e) {
      const int status = HttpStatusOfGrpcCode(e.code());
      return Json::parse(OpenAiErrorJson(e.message(),
                                         status >= 500 ? "server_error" : "invalid_request_error",
                                         status))["error"];
    }

    // The whole answer once every event was read.
    HttpResponse Whole(const grpc::Status& status) {
      if (!status.ok()) {
        return ErrorResponse(HttpStatusOfGrpcCode(status.error_code()), status.error_message());
      }
      Json out = Json::array();
      const Choice* failed = nullptr;
      bool any_finished = false;
      std::vector<const Choice*> ordered(choices.size());
      for (const auto& [name, c] : choices) ordered[c.index] = &c;
      for (const Choice* c : ordered) {
        Json choice = {{"index", c->index}, {"logprobs", nullptr}};
        if (parsed.logprobs) choice["logprobs"] = impl->LogprobsObject(c->logprobs, parsed.chat);
        if (parsed.chat) {
          choice["message"] = {{"role", "assistant"}, {"content", c->text}};
        } else {
          choice["text"] = c->text;
        }
        if (c->finished) {
          any_finished = true;
          choice["finish_reason"] = c->finished->reason();
          choice["scd"] = ScdInfo(*c->finished);
        } else {
          if (failed == nullptr) failed = c;
          choice["finish_reason"] = "error";
          v1::Error error;
          error.set_code(static_cast<int>(grpc::StatusCode::INTERNAL));
          error.set_message("the target ended without a result");
          choice["error"] = ErrorObject(c->error ? *c->error : error);
        }
        out.push_back(std::move(choice));
      }
      if (!any_finished && failed != nullptr) {  // nothing to answer: the error is the answer
        return ErrorResponse(failed->error ? HttpStatusOfGrpcCode(failed->error->code()) : 500,
                             failed->error ? failed->error->message() : "no result");
      }
      Json body = {{"id", id}, {"object", parsed.chat ? "chat.completion" : "text_completion"},
                   {"created", created}, {"model", parsed.model}, {"choices", out},
                   {"usage", Usage()}};
      return HttpResponse::Json(200, Dump(body));
    }

    const std::shared_ptr<Impl> impl;  // the handler may go before the call
    const ParsedRequest parsed;
    const std::string id;
    const int64_t created;
    grpc::ClientContext context;
    std::map<std::string, Choice> choices;

   private:
    const std::shared_ptr<HttpReply> reply_;
    std::shared_ptr<Call> self_;  // until OnDone
    v1::GenerateEvent event_;
    bool started_ = false;  // the stream's head went out
    std::atomic<bool> client_left_{false};  // the HTTP exchange closed before its answer
  };

  std::string TokenText(int32_t id) const {
    if (tokenizer_ == nullptr) return absl::StrCat("token_id:", id);
    return tokenizer_->Decode({static_cast<TokenId>(id)});
  }
  static Json Bytes(const std::string& text) {
    Json bytes = Json::array();
    for (unsigned char c : text) bytes.push_back(static_cast<int>(c));
    return bytes;
  }
  // One row per generated token: chat {token, logprob, bytes, top_logprobs: [...]};
  // completions {token, logprob, top: {token: logprob}}.
  Json Logprobs(const v1::TokenDelta& delta, bool chat) const {
    Json rows = Json::array();
    for (const v1::TokenLogprobs& lp : delta.logprobs()) {
      const std::string token = TokenText(lp.id());
      if (chat) {
        Json top = Json::array();
        for (const v1::TopLogprob& t : lp.top()) {
          const std::string text = TokenText(t.id());
          top.push_back({{"token", text}, {"logprob", t.logprob()}, {"bytes", Bytes(text)}});
        }
        rows.push_back({{"token", token}, {"logprob", lp.logprob()}, {"bytes", Bytes(token)},
                        {"top_logprobs", top}});
      } else {
        Json top = Json::object();
        for (const v1::TopLogprob& t : lp.top()) {
          const std::string text = TokenText(t.id());
          if (!top.contains(text)) top[text] = t.logprob();
        }
        rows.push_back({{"token", token}, {"logprob", lp.logprob()}, {"top", top}});
      }
    }
    return rows;
  }
  static Json LogprobsObject(const Json& rows, bool chat) {
    if (chat) return {{"content", rows}};
    Json tokens = Json::array(), token_logprobs = Json::array(), top = Json::array(),
         offsets = Json::array();
    size_t offset = 0;
    for (const Json& row : rows) {
      tokens.push_back(row["token"]);
      token_logprobs.push_back(row["logprob"]);
      top.push_back(row["top"]);
      offsets.push_back(offset);
      offset += row["token"].get<std::string>().size();
    }
    return {{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top},
            {"text_offset", offsets}};
  }

  std::unique_ptr<v1::Inference::Stub> stub_;
  const Tokenizer* const tokenizer_;
  const ChatTemplate* const chat_template_;
};

OpenAiHttpHandler::OpenAiHttpHandler(std::shared_ptr<grpc::Channel> channel,
                                     const Tokenizer* tokenizer,
                                     std::shared_ptr<HttpHandler> fallback,
                                     const ChatTemplate* chat_template)
    : impl_(std::make_shared<Impl>(std::move(channel), tokenizer, chat_template)),
      fallback_(std::move(fallback)) {}

bool OpenAiHttpHandler::Handle(const HttpRequest& request,
                               const std::shared_ptr<HttpReply>& reply) {
  const bool get = request.method == "GET";
  const bool post = request.method == "POST";
  if (request.path == "/v1/models" || request.path == "/models") {
    if (!get) return reply->Send(ErrorResponse(405, "use GET")), true;
    impl_->Models(request, reply);
    return true;
  }
  for (const auto& [path, chat] : {std::pair<const char*, bool>{"/v1/completions", false},
                                   std::pair<const char*, bool>{"/v1/chat/completions", true}}) {
    if (request.path != path) continue;
    if (!post) return reply->Send(ErrorResponse(405, "use POST")), true;
    impl_->Generate(request, reply, chat);
    return true;
  }
  return fallback_ != nullptr && fallback_->Handle(request, reply);
}

}  // namespace scd::coordinator
