// proto/request_validation.h: every bound inference.proto states, at and one past its edge, and
// the code and field each refusal names.
#include "proto/request_validation.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "proto/wire_mode.h"

namespace scd {
namespace {

using ::testing::HasSubstr;

v1::GenerateRequest Valid() {
  v1::GenerateRequest request;
  request.set_prompt("Once upon a time");
  request.add_targets("xs");
  return request;
}

struct Case {
  const char* name;
  std::function<void(v1::GenerateRequest*)> change;
  absl::StatusCode code;  // kOk: accepted (the bound itself)
  const char* field;
};

TEST(RequestValidationTest, EveryBoundAtAndPastItsEdge) {
  const RequestLimits limits;
  const std::vector<Case> cases = {
      {"valid", [](auto*) {}, absl::StatusCode::kOk, ""},
      {"ids instead of text", [](auto* r) { r->clear_prompt(), r->add_prompt_ids(5); },
       absl::StatusCode::kOk, ""},
      {"both", [](auto* r) { r->add_prompt_ids(5); }, absl::StatusCode::kInvalidArgument,
       "prompt and prompt_ids"},
      {"neither", [](auto* r) { r->clear_prompt(); }, absl::StatusCode::kInvalidArgument, "prompt"},
      {"negative id", [](auto* r) { r->clear_prompt(), r->add_prompt_ids(-3); },
       absl::StatusCode::kInvalidArgument, "prompt_ids[0]"},
      {"prompt at 1 MiB", [](auto* r) { r->set_prompt(std::string(1 << 20, 'a')); },
       absl::StatusCode::kOk, ""},
      {"prompt past 1 MiB", [](auto* r) { r->set_prompt(std::string((1 << 20) + 1, 'a')); },
       absl::StatusCode::kOutOfRange, "prompt"},
      {"bad UTF-8 prompt", [](auto* r) { r->set_prompt("a\xffz"); },
       absl::StatusCode::kInvalidArgument, "prompt: not valid UTF-8"},
      {"no target", [](auto* r) { r->clear_targets(); }, absl::StatusCode::kInvalidArgument,
       "targets"},
      {"16 targets",
       [](auto* r) {
         for (int i = 1; i < 16; ++i) r->add_targets("t" + std::to_string(i));
       },
       absl::StatusCode::kOk, ""},
      {"17 targets",
       [](auto* r) {
         for (int i = 1; i < 17; ++i) r->add_targets("t" + std::to_string(i));
       },
       absl::StatusCode::kOutOfRange, "targets"},
      {"twice", [](auto* r) { r->add_targets("xs"); }, absl::StatusCode::kInvalidArgument,
       "targets[1]"},
      {"empty target", [](auto* r) { r->set_targets(0, ""); }, absl::StatusCode::kInvalidArgument,
       "targets[0]"},
      {"target of 129 bytes", [](auto* r) { r->set_targets(0, std::string(129, 't')); },
       absl::StatusCode::kOutOfRange, "targets[0]"},
      {"unknown mode", [](auto* r) { SetRequestModeName("telepathy", r); },
       absl::StatusCode::kInvalidArgument, "mode"},
      {"unknown transfer_mode",
       [](auto* r) { r->set_transfer_mode(static_cast<v1::TransferMode>(8)); },
       absl::StatusCode::kInvalidArgument, "transfer_mode: 8 is not a TransferMode"},
      {"transfer_mode and mode disagree",
       [](auto* r) {
         SetRequestMode(TransferMode::kScd, r);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
         r->set_mode("raw");
#pragma GCC diagnostic pop
       },
       absl::StatusCode::kInvalidArgument, "disagree"},
      {"max_kl with transfer_mode raw",
       [](auto* r) { r->set_max_kl(0.02), SetRequestMode(TransferMode::kRaw, r); },
       absl::StatusCode::kInvalidArgument, "needs mode auto or scd, not raw"},
      {"every mode", [](auto* r) { SetRequestModeName("recompute", r); }, absl::StatusCode::kOk,
       ""},
      {"max_tokens at 2^20", [](auto* r) { r->set_max_tokens(1 << 20); }, absl::StatusCode::kOk,
       ""},
      {"max_tokens 2^31", [](auto* r) { r->set_max_tokens(1u << 31); },
       absl::StatusCode::kOutOfRange, "max_tokens"},
      {"temperature 100", [](auto* r) { r->set_temperature(100); }, absl::StatusCode::kOk, ""},
      {"temperature -0.5", [](auto* r) { r->set_temperature(-0.5f); },
       absl::StatusCode::kOutOfRange, "temperature"},
      {"temperature NaN", [](auto* r) { r->set_temperature(std::nanf("")); },
       absl::StatusCode::kOutOfRange, "temperature"},
      {"top_p 1", [](auto* r) { r->set_top_p(1); }, absl::StatusCode::kOk, ""},
      {"top_p -1", [](auto* r) { r->set_top_p(-1); }, absl::StatusCode::kOutOfRange, "top_p"},
      {"top_p NaN", [](auto* r) { r->set_top_p(std::nanf("")); }, absl::StatusCode::kOutOfRange,
       "top_p"},
      {"top_p 5", [](auto* r) { r->set_top_p(5); }, absl::StatusCode::kOutOfRange, "top_p"},
      {"top_k 2^31", [](auto* r) { r->set_top_k(1u << 31); }, absl::StatusCode::kOutOfRange,
       "top_k"},
      {"16 stops",
       [](auto* r) {
         for (int i = 0; i < 16; ++i) r->add_stop(std::string(256, 's'));
       },
       absl::StatusCode::kOk, ""},
      {"17 stops",
       [](auto* r) {
         for (int i = 0; i < 17; ++i) r->add_stop("s");
       },
       absl::StatusCode::kOutOfRange, "stop"},
      {"stop of 257 bytes", [](auto* r) { r->add_stop(std::string(257, 's')); },
       absl::StatusCode::kOutOfRange, "stop[0]"},
      {"empty stop", [](auto* r) { r->add_stop(""); }, absl::StatusCode::kInvalidArgument,
       "stop[0]"},
      {"cache_salt of 256 bytes", [](auto* r) { r->set_cache_salt(std::string(256, 'c')); },
       absl::StatusCode::kOk, ""},
      {"cache_salt of 257 bytes", [](auto* r) { r->set_cache_salt(std::string(257, 'c')); },
       absl::StatusCode::kOutOfRange, "cache_salt"},
      {"cache_salt not UTF-8", [](auto* r) { r->set_cache_salt("tenant-\xff"); },
       absl::StatusCode::kInvalidArgument, "cache_salt"},
      {"deadline past an hour", [](auto* r) { r->set_deadline_ms(3600 * 1000 + 1); },
       absl::StatusCode::kOutOfRange, "deadline_ms"},
      {"max_kl at 10", [](auto* r) { r->set_max_kl(10); }, absl::StatusCode::kOk, ""},
      {"max_kl with scd", [](auto* r) { r->set_max_kl(0.02), SetRequestModeName("scd", r); },
       absl::StatusCode::kOk, ""},
      {"max_kl past 10", [](auto* r) { r->set_max_kl(10.001); }, absl::StatusCode::kOutOfRange,
       "max_kl"},
      {"negative max_kl", [](auto* r) { r->set_max_kl(-0.01); }, absl::StatusCode::kOutOfRange,
       "max_kl"},
      {"NaN max_kl", [](auto* r) { r->set_max_kl(std::nan("")); }, absl::StatusCode::kOutOfRange,
       "max_kl"},
      {"max_kl with raw", [](auto* r) { r->set_max_kl(0.02), SetRequestModeName("raw", r); },
       absl::StatusCode::kInvalidArgument, "max_kl: a quality budget"},
      {"max_kl 0 with raw", [](auto* r) { r->set_max_kl(0), SetRequestModeName("raw", r); },
       absl::StatusCode::kOk, ""},
      {"ttft_slo_ms of an hour", [](auto* r) { r->set_ttft_slo_ms(3600 * 1000); },
       absl::StatusCode::kOk, ""},
      {"ttft_slo_ms past an hour", [](auto* r) { r->set_ttft_slo_ms(3600 * 1000 + 1); },
       absl::StatusCode::kOutOfRange, "ttft_slo_ms"},
      {"ttft_slo_ms with auto",
       [](auto* r) { r->set_ttft_slo_ms(500), SetRequestModeName("auto", r); },
       absl::StatusCode::kOk, ""},
      {"ttft_slo_ms with scd",
       [](auto* r) { r->set_ttft_slo_ms(500), SetRequestModeName("scd", r); },
       absl::StatusCode::kInvalidArgument, "ttft_slo_ms: a time-to-first-token objective"},
      {"keep_ranks with auto",
       [](auto* r) { r->set_keep_ranks(true), SetRequestModeName("auto", r); },
       absl::StatusCode::kOk, ""},
      {"keep_ranks with scd",
       [](auto* r) { r->set_keep_ranks(true), SetRequestModeName("scd", r); },
       absl::StatusCode::kInvalidArgument, "keep_ranks: only auto"},
      {"request_id of 128", [](auto* r) { r->set_request_id(std::string(128, 'r')); },
       absl::StatusCode::kOk, ""},
      {"request_id of 129", [](auto* r) { r->set_request_id(std::string(129, 'r')); },
       absl::StatusCode::kInvalidArgument, "request_id"},
      {"request_id with a newline", [](auto* r) { r->set_request_id("a\n[error] b"); },
       absl::StatusCode::kInvalidArgument, "request_id"},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest request = Valid();
    c.change(&request);
    const absl::Status status = ValidateGenerateRequest(request, limits);
    EXPECT_EQ(status.code(), c.code) << c.name << ": " << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.field)) << c.name;
    EXPECT_LT(status.message().size(), 300u) << c.name;  // the client's bytes never come back
    EXPECT_EQ(status.message().find('\n'), std::string::npos) << c.name;
  }
}

TEST(RequestValidationTest, AConsumerCalledDirectlyNeedsNoTarget) {
  v1::GenerateRequest request = Valid();
  request.clear_targets();
  EXPECT_TRUE(ValidateGenerateRequest(request, RequestLimits(), /*require_target=*/false).ok());
}

}  // namespace
}  // namespace scd
