// Modes on the wire (proto/wire_mode.h): every codec mode and auto through the enum and back; the
// deprecated string fields read only when the enum is unset, and counted when they are; a request
// whose enum this build does not know, or whose enum and string disagree, refused; events and
// control messages carry both fields (a peer of the last release reads the string), requests the
// enum alone.
#include "proto/wire_mode.h"

#include <gtest/gtest.h>

namespace scd {
namespace {

// The deprecated fields are what these tests put on the wire, as a client of the last release.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

TEST(WireModeTest, EveryModeAndAutoGoThroughTheEnumAndBackUnparsed) {
  const int64_t parsed = ModeNamesParsed();
  for (TransferMode mode : kAllTransferModes) {
    v1::GenerateRequest request;
    SetRequestMode(mode, &request);
    EXPECT_EQ(request.mode(), "");
    EXPECT_EQ(v1::TransferMode_Name(request.transfer_mode()),
              "TRANSFER_MODE_" + [&] {
                std::string upper = TransferModeName(mode);
                for (char& c : upper) c = static_cast<char>(std::toupper(c));
                return upper;
              }());
    EXPECT_EQ(*RequestModeOf(request), RequestedMode(mode));

    v1::Finished finished;
    SetRanMode(mode, &finished);
    EXPECT_EQ(finished.mode(), TransferModeName(mode));  // for clients of the last release
    EXPECT_EQ(RanMode(finished, TransferMode::kScd == mode ? TransferMode::kLocal
                                                           : TransferMode::kScd),
              mode);
    v1::DecodeRequest decode;
    SetTargetMode(mode, &decode);
    EXPECT_EQ(decode.mode(), TransferModeName(mode));
    EXPECT_EQ(*TargetModeOf(decode), mode);
  }
  v1::GenerateRequest request;
  EXPECT_TRUE(RequestModeOf(request)->is_auto());  // nothing set: auto
  SetRequestMode(RequestedMode::Auto(), &request);
  EXPECT_EQ(request.transfer_mode(), v1::TRANSFER_MODE_AUTO);
  EXPECT_TRUE(RequestModeOf(request)->is_auto());
  EXPECT_EQ(ModeNamesParsed(), parsed) << "a mode name was parsed where the enum was set";
}

TEST(WireModeTest, TheDeprecatedStringIsReadWhenTheEnumIsUnsetAndCounted) {
  v1::GenerateRequest request;
  request.set_mode("scd");
  const int64_t parsed = ModeNamesParsed();
  EXPECT_EQ(*RequestModeOf(request), RequestedMode(TransferMode::kScd));
  EXPECT_EQ(ModeNamesParsed(), parsed + 1);
  request.set_mode("auto");
  EXPECT_TRUE(RequestModeOf(request)->is_auto());
  // Both, naming the same mode: fine.
  request.set_mode("raw");
  request.set_transfer_mode(v1::TRANSFER_MODE_RAW);
  EXPECT_EQ(*RequestModeOf(request), RequestedMode(TransferMode::kRaw));
  // An event of a peer of the last release: the string alone.
  v1::Started started;
  started.set_mode("recompute");
  EXPECT_EQ(RanMode(started), TransferMode::kRecompute);
  v1::PrefillTarget target;
  target.set_mode("int4");
  EXPECT_EQ(*TargetModeOf(target), TransferMode::kInt4);
}

TEST(WireModeTest, UnknownOrDisagreeingModesAreRefused) {
  v1::GenerateRequest request;
  request.set_transfer_mode(static_cast<v1::TransferMode>(42));  // a newer client's
  absl::StatusOr<RequestedMode> mode = RequestModeOf(request);
  ASSERT_FALSE(mode.ok());
  EXPECT_EQ(mode.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(mode.status().message().find("transfer_mode: 42"), std::string::npos)
      << mode.status();

  request.set_transfer_mode(v1::TRANSFER_MODE_SCD);
  request.set_mode("raw");
  mode = RequestModeOf(request);
  ASSERT_FALSE(mode.ok());
  EXPECT_NE(mode.status().message().find("disagree"), std::string::npos) << mode.status();
  request.set_mode("auto");  // auto and scd disagree too
  EXPECT_FALSE(RequestModeOf(request).ok());

  request.clear_transfer_mode();
  request.set_mode("telepathy");
  mode = RequestModeOf(request);
  ASSERT_FALSE(mode.ok());
  EXPECT_NE(mode.status().message().find("telepathy"), std::string::npos) << mode.status();

  // A client's unknown name travels as the string, for the server to refuse by name.
  v1::GenerateRequest edge;
  SetRequestModeName("telepathy", &edge);
  EXPECT_EQ(edge.transfer_mode(), v1::TRANSFER_MODE_UNSPECIFIED);
  EXPECT_EQ(edge.mode(), "telepathy");
  SetRequestModeName("", &edge);
  EXPECT_EQ(edge.transfer_mode(), v1::TRANSFER_MODE_AUTO);
  EXPECT_EQ(edge.mode(), "");

  // A routed target is resolved: AUTO refused; nothing set is local (as before the enum).
  v1::DecodeRequest decode;
  EXPECT_EQ(*TargetModeOf(decode), TransferMode::kLocal);
  decode.set_transfer_mode(v1::TRANSFER_MODE_AUTO);
  EXPECT_FALSE(TargetModeOf(decode).ok());

  // An event naming a mode this build does not know reads as the fallback given.
  v1::Finished finished;
  finished.set_transfer_mode(static_cast<v1::TransferMode>(42));
  EXPECT_EQ(RanMode(finished, TransferMode::kRaw), TransferMode::kRaw);
  finished.clear_transfer_mode();
  finished.set_mode("hologram");
  EXPECT_EQ(RanMode(finished, TransferMode::kRaw), TransferMode::kRaw);
}

}  // namespace
}  // namespace scd
