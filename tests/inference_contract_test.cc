// The public API's names are a contract (issue 8: "keep them"): this test reads the compiled
// descriptors of scd.v1.Inference and its messages and fails when a name, number, type or
// streaming kind changes. Adding fields keeps it green; renaming or renumbering does not.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "google/protobuf/descriptor.h"
#include "proto/request_validation.h"
#include "scd/v1/inference.pb.h"
#include "scd/v1/registry.pb.h"

namespace scd {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

struct Field {
  const char* name;
  int number;
  FieldDescriptor::Type type;
  bool repeated;
};

void ExpectFields(const Descriptor* message, const std::vector<Field>& fields) {
  ASSERT_NE(message, nullptr);
  for (const Field& expected : fields) {
    const FieldDescriptor* field = message->FindFieldByName(expected.name);
    ASSERT_NE(field, nullptr) << message->full_name() << "." << expected.name << " is missing";
    EXPECT_EQ(field->number(), expected.number) << field->full_name();
    EXPECT_EQ(field->type(), expected.type) << field->full_name();
    EXPECT_EQ(field->is_repeated(), expected.repeated) << field->full_name();
  }
}

constexpr auto kString = FieldDescriptor::TYPE_STRING;
constexpr auto kInt32 = FieldDescriptor::TYPE_INT32;
constexpr auto kUint32 = FieldDescriptor::TYPE_UINT32;
constexpr auto kUint64 = FieldDescriptor::TYPE_UINT64;
constexpr auto kFloat = FieldDescriptor::TYPE_FLOAT;
constexpr auto kDouble = FieldDescriptor::TYPE_DOUBLE;
constexpr auto kBool = FieldDescriptor::TYPE_BOOL;
constexpr auto kMessage = FieldDescriptor::TYPE_MESSAGE;
constexpr auto kBytes = FieldDescriptor::TYPE_BYTES;

TEST(InferenceContractTest, GenerateRequestFields) {
  ExpectFields(v1::GenerateRequest::descriptor(), {{"prompt", 1, kString, false},
                                                   {"prompt_ids", 2, kInt32, true},
                                                   {"targets", 3, kString, true},
                                                   {"mode", 4, kString, false},
                                                   {"max_tokens", 5, kUint32, false},
                                                   {"temperature", 6, kFloat, false},
                                                   {"top_p", 7, kFloat, false},
                                                   {"top_k", 8, kUint32, false},
                                                   {"seed", 9, kUint64, false},
                                                   {"stop", 10, kString, true},
                                                   {"deadline_ms", 11, kUint32, false},
                                                   {"request_id", 12, kString, false},
                                                   {"allow_local_fallback", 13, kBool, false},
                                                   {"logprobs", 14, kUint32, false},
                                                   {"cache_salt", 15, kString, false},
                                                   {"max_kl", 16, kDouble, false},
                                                   {"ttft_slo_ms", 17, kUint32, false},
                                                   {"migration_limit", 20, kUint32, false},
                                                   {"resume_token", 21, kBytes, false},
                                                   {"resume_received_ids", 22, kInt32, true}});
  EXPECT_TRUE(v1::GenerateRequest::descriptor()->FindFieldByName("migration_limit")->has_presence())
      << "unset (the coordinator's limit) must differ from 0 (never move)";
  EXPECT_TRUE(
      v1::GenerateRequest::descriptor()->FindFieldByName("allow_local_fallback")->has_presence())
      << "unset (fall back: a producer's death ends no request) must differ from false (forbid)";
  v1::GenerateRequest request;
  EXPECT_TRUE(LocalFallbackAllowed(request));
  request.set_allow_local_fallback(false);
  EXPECT_FALSE(LocalFallbackAllowed(request));
  request.set_allow_local_fallback(true);
  EXPECT_TRUE(LocalFallbackAllowed(request));
}

// Five events a client sees, and the control plane's sixth (transfer_lost: a consumer's notice to
// its coordinator, which consumes it; never on the public stream -- takeover_test checks that).
TEST(InferenceContractTest, GenerateEventIsATargetAndOneOfFiveEventsPlusTheControlPlanes) {
  const Descriptor* event = v1::GenerateEvent::descriptor();
  ExpectFields(event, {{"target", 1, kString, false},
                       {"started", 2, kMessage, false},
                       {"token", 3, kMessage, false},
                       {"finished", 4, kMessage, false},
                       {"error", 5, kMessage, false},
                       {"moved", 6, kMessage, false},
                       {"transfer_lost", 7, kMessage, false}});
  ASSERT_EQ(event->oneof_decl_count(), 1);
  const auto* oneof = event->oneof_decl(0);
  EXPECT_EQ(oneof->name(), "event");
  std::vector<std::string> members;
  for (int i = 0; i < oneof->field_count(); ++i) members.push_back(oneof->field(i)->name());
  EXPECT_EQ(members, (std::vector<std::string>{"started", "token", "finished", "error", "moved",
                                               "transfer_lost"}));
  EXPECT_EQ(event->FindFieldByName("started")->message_type(), v1::Started::descriptor());
  EXPECT_EQ(event->FindFieldByName("token")->message_type(), v1::TokenDelta::descriptor());
  EXPECT_EQ(event->FindFieldByName("finished")->message_type(), v1::Finished::descriptor());
  EXPECT_EQ(event->FindFieldByName("error")->message_type(), v1::Error::descriptor());
  EXPECT_EQ(event->FindFieldByName("moved")->message_type(), v1::Moved::descriptor());
}

TEST(InferenceContractTest, EventBodies) {
  ExpectFields(v1::Started::descriptor(), {{"request_id", 1, kString, false},
                                           {"producer", 2, kString, false},
                                           {"consumer", 3, kString, false},
                                           {"mode", 4, kString, false},
                                           {"mode_reason", 5, kString, false},
                                           {"expected_payload_bytes", 6, kUint64, false},
                                           {"consumer_cached_tokens", 7, kUint32, false},
                                           {"producer_cached_tokens", 8, kUint32, false},
                                           {"point", 9, kMessage, false},
                                           {"expected_kl", 10, kDouble, false},
                                           {"resume_token", 13, kBytes, false}});
  ExpectFields(v1::Moved::descriptor(), {{"tokens_so_far", 1, kUint32, false},
                                         {"from_node", 2, kString, false},
                                         {"to_node", 3, kString, false},
                                         {"reason", 4, kString, false},
                                         {"moves", 5, kUint32, false},
                                         {"resumed", 6, kBool, false}});
  ExpectFields(v1::CodePoint::descriptor(), {{"code_dtype", 1, kString, false},
                                             {"rank_k", 2, kUint32, true},
                                             {"rank_v", 3, kUint32, true},
                                             {"rank_h", 4, kUint32, true}});
  ExpectFields(v1::TokenDelta::descriptor(), {{"text", 1, kString, false},
                                              {"ids", 2, kInt32, true},
                                              {"logprobs", 3, kMessage, true}});
  ExpectFields(v1::TokenLogprobs::descriptor(), {{"id", 1, kInt32, false},
                                                 {"logprob", 2, kFloat, false},
                                                 {"top", 3, kMessage, true}});
  ExpectFields(v1::TopLogprob::descriptor(),
               {{"id", 1, kInt32, false}, {"logprob", 2, kFloat, false}});
  ExpectFields(v1::Finished::descriptor(), {{"reason", 1, kString, false},
                                            {"prompt_tokens", 2, kUint32, false},
                                            {"output_tokens", 3, kUint32, false},
                                            {"payload_bytes", 4, kUint64, false},
                                            {"timings", 5, kMessage, false},
                                            {"mode", 6, kString, false},
                                            {"mode_reason", 7, kString, false},
                                            {"link", 8, kMessage, false},
                                            {"predicted_ttft_us", 11, kUint64, false},
                                            {"moves", 14, kUint32, false},
                                            {"takeovers", 16, kUint32, false}});
  ExpectFields(v1::LinkShape::descriptor(),
               {{"gbps", 1, kDouble, false}, {"latency_us", 2, kDouble, false}});
  ExpectFields(v1::Timings::descriptor(), {{"queue", 1, kUint64, false},
                                           {"prefill", 2, kUint64, false},
                                           {"encode", 3, kUint64, false},
                                           {"transfer", 4, kUint64, false},
                                           {"rebuild", 5, kUint64, false},
                                           {"patch", 6, kUint64, false},
                                           {"first_decode", 7, kUint64, false},
                                           {"ttft", 8, kUint64, false},
                                           {"total", 9, kUint64, false},
                                           {"last_rebuild", 10, kUint64, false}});
  ExpectFields(v1::Error::descriptor(),
               {{"code", 1, kInt32, false}, {"message", 2, kString, false}});
}

TEST(InferenceContractTest, Services) {
  const auto* inference = v1::GenerateRequest::descriptor()->file()->FindServiceByName("Inference");
  ASSERT_NE(inference, nullptr);
  EXPECT_EQ(inference->full_name(), "scd.v1.Inference");
  const auto* generate = inference->FindMethodByName("Generate");
  ASSERT_NE(generate, nullptr);
  EXPECT_FALSE(generate->client_streaming());
  EXPECT_TRUE(generate->server_streaming());
  EXPECT_EQ(generate->input_type(), v1::GenerateRequest::descriptor());
  EXPECT_EQ(generate->output_type(), v1::GenerateEvent::descriptor());
  EXPECT_NE(inference->FindMethodByName("ListModels"), nullptr);
  EXPECT_NE(inference->FindMethodByName("Health"), nullptr);

  const auto* registry = v1::RegisterRequest::descriptor()->file()->FindServiceByName("Registry");
  ASSERT_NE(registry, nullptr);
  for (const char* method : {"Register", "Heartbeat", "Deregister"}) {
    EXPECT_NE(registry->FindMethodByName(method), nullptr) << method;
  }
}

}  // namespace
}  // namespace scd
