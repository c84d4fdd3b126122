// OpenAiHttpHandler: the OpenAI-compatible HTTP API of the coordinator and the all-in-one server
// (vLLM's and llama.cpp's server's conventions), a thin translation onto the node's own public
// gRPC API (an in-process channel to its CheckedInferenceService: the same validation, routing,
// limits and metrics as a gRPC client gets):
//   POST /v1/completions        prompt (a string, or one list of token ids), max_tokens (16),
//                               temperature (1), top_p, seed, stop (a string or a list), n (1
//                               only), logprobs (0..20: top alternatives per token), stream, echo
//                               (false only), stream_options.include_usage; answers text_completion
//   POST /v1/chat/completions   messages [{role, content: a string or [{type: "text", text}]}]
//                               in the plain chat format below, logprobs (bool) + top_logprobs,
//                               max_tokens / max_completion_tokens; answers chat.completion
//   GET  /v1/models             the consumer models (targets) the node routes to
//   GET  /health, /metrics      passed on to `fallback`
// SCD extensions (request body): "targets": [names] (a fan-out from one prefill: choices[i] is
// targets[i]'s; without it, "model" names the target), "mode" (auto | scd | reuse | raw | int4 |
// recompute | local), "top_k", "cache_salt", "allow_local_fallback", "deadline_ms", "max_kl"
// (scd's quality budget: GenerateRequest.max_kl). Every choice
// also carries "scd": {mode, mode_reason, payload_bytes, ttft_ms, producer_cached_tokens,
// consumer_cached_tokens} (streamed: on its last chunk).
// Chat prompts: the serving model's chat template (tokenizer_config.json's, rendered as
// transformers does: tokenizer/chat_template.h) with add_generation_prompt; for models without
// one (the ones in ../shared), the plain format: each message as "<Role>: <content>\n" (System,
// User, Assistant), then "Assistant:" — the model continues there. A template's
// raise_exception (roles out of order, ...) is a 400 with its message.
// Streaming: Server-Sent Events, one `data: {chunk}` per token event, ending `data: [DONE]`; an
// error after the stream began is sent as `data: {"error": ...}` before [DONE] (where the node
// ended the stream -- its coordinator went away or drained past its grace -- the message says
// that an OpenAI stream cannot be resumed and that a gRPC client resumes it). A client that
// disconnects, or reads too slowly for the server's limits, cancels the request. No request holds
// a thread: the node's Generate is a gRPC callback reactor that reads its next event only when
// the client's stream has room (back-pressure from the HTTP connection). Errors: OpenAI's shape
// {"error": {message, type, param, code}} with the HTTP status of the gRPC code (400 invalid, 401
// unauthenticated, 404 unknown model, 429 full, 503 unavailable, 504 deadline).
//
// One concept in a long file: openai_api.cc (about 650 lines) is one API's translation both
// ways -- request JSON to GenerateRequest, the events to completion and chat JSON, streamed and
// not -- where each endpoint's two directions change together.
//
// Thread-safety: thread-safe; a request starts on the HTTP server's thread that took it and goes
// on in gRPC's callbacks.
#ifndef SCD_COORDINATOR_OPENAI_API_H_
#define SCD_COORDINATOR_OPENAI_API_H_

#include <memory>
#include <string>

#include "base/http_server.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace grpc {
class Channel;
}

namespace scd::coordinator {

class OpenAiHttpHandler : public HttpHandler {
 public:
  // `channel`: to the node's public scd.v1.Inference. `tokenizer` (may be null; not owned,
  // outlives the handler): token strings in logprobs (else "token_id:N"). `fallback` answers
  // what this does not (/health, /metrics).
  // `chat_template` (may be null: the plain format; not owned, outlives the handler).
  OpenAiHttpHandler(std::shared_ptr<grpc::Channel> channel, const Tokenizer* tokenizer,
                    std::shared_ptr<HttpHandler> fallback,
                    const ChatTemplate* chat_template = nullptr);
  bool Handle(const HttpRequest& request, const std::shared_ptr<HttpReply>& reply) override;

 private:
  class Impl;
  std::shared_ptr<Impl> impl_;
  std::shared_ptr<HttpHandler> fallback_;
};

// The HTTP status OpenAI's API uses for a gRPC status code.
int HttpStatusOfGrpcCode(int grpc_code);

}  // namespace scd::coordinator

#endif  // SCD_COORDINATOR_OPENAI_API_H_
