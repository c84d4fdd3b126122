// The other process of transport_process_test: a sender or a receiver of one transfer session,
// driven by flags, reporting on stdout, one line per event, so the test can kill it at a known
// point (kill -9, SIGSTOP) or cut its network and read how it ended:
//   LISTENING <address>             (receiver, once it listens)
//   CHUNK <index>                   (each chunk sent / received)
//   RESULT <state> <ms since the last chunk> <status message>
//
//   --role=send|recv --backend=grpc|ucx|inproc --address=HOST:PORT --chunks=N --chunk-bytes=B
//   --interval-ms=M (pause between chunks: sender pacing or a slow receiver)
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "transport/session_acceptor.h"
#include "transport/transfer_session.h"

namespace scd::transport {
namespace {

void Say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

int Report(const SessionCore& session, absl::Time last_chunk) {
  Say(absl::StrCat("RESULT ", absl::StrReplaceAll(SessionStateName(session.state()), {{" ", "_"}}),
                   " ", absl::ToInt64Milliseconds(absl::Now() - last_chunk), " ",
                   session.status().ToString()));
  return session.state() == SessionState::kCompleted ? 0 : 1;
}

int Send(Transport& transport, const std::map<std::string, std::string>& flags) {
  auto link = transport.Connect(flags.at("address"), absl::Seconds(10));
  if (!link.ok()) {
    Say(absl::StrCat("RESULT connect_failed 0 ", link.status().ToString()));
    return 2;
  }
  auto connection = TransferConnection::Create(*std::move(link), {});
  v1::TransferHeader header;
  header.set_request_id("peer-send");
  auto session = connection->StartSession(header, absl::Seconds(600));
  if (!session.ok()) return 2;
  const std::string block(std::stoul(flags.at("chunk-bytes")), 'p');
  absl::Time last = absl::Now();
  const int chunks = std::stoi(flags.at("chunks"));
  for (int i = 0; i < chunks; ++i) {
    if (!(*session)->SendChunk(v1::CodeChunk(), Payload::Copy(block.data(), block.size())).ok()) {
      break;
    }
    last = absl::Now();
    Say(absl::StrCat("CHUNK ", i));
    // paces: the peer process sends at --interval-ms (the scenario)
    absl::SleepFor(absl::Milliseconds(std::stoi(flags.at("interval-ms"))));
  }
  (*session)->Finish().IgnoreError();
  return Report(**session, last);
}

int Receive(Transport& transport, const std::map<std::string, std::string>& flags) {
  auto listener = transport.Listen(flags.at("address"));
  if (!listener.ok()) {
    Say(absl::StrCat("RESULT listen_failed 0 ", listener.status().ToString()));
    return 2;
  }
  SessionAcceptor acceptor(*std::move(listener), {});
  Say(absl::StrCat("LISTENING ", acceptor.address()));
  auto session = acceptor.Accept(absl::Seconds(60));
  if (!session.ok()) {
    Say(absl::StrCat("RESULT accept_failed 0 ", session.status().ToString()));
    return 2;
  }
  absl::Time last = absl::Now();
  for (int i = 0;; ++i) {
    auto chunk = (*session)->Next(absl::Seconds(600));
    if (!chunk.ok() || !chunk->has_value()) break;
    last = absl::Now();
    Say(absl::StrCat("CHUNK ", i));
    // paces: the peer process sends at --interval-ms (the scenario)
    absl::SleepFor(absl::Milliseconds(std::stoi(flags.at("interval-ms"))));
  }
  return Report(**session, last);
}

}  // namespace
}  // namespace scd::transport

int main(int argc, char** argv) {
  std::map<std::string, std::string> flags = {{"backend", "grpc"},        {"chunks", "1000"},
                                              {"chunk-bytes", "65536"},   {"interval-ms", "0"},
                                              {"address", "127.0.0.1:0"}, {"role", "recv"}};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) {
      std::fprintf(stderr, "transport_test_peer: bad argument '%s' (want --key=value)\n", argv[i]);
      return 2;
    }
    flags[arg.substr(2, eq - 2)] = arg.substr(eq + 1);
  }
  scd::transport::TransportOptions options;
  options.backend = flags["backend"];
  auto transport = scd::transport::CreateTransport(options);
  if (!transport.ok()) {
    std::fprintf(stderr, "transport_test_peer: %s\n", transport.status().ToString().c_str());
    return 2;
  }
  return flags["role"] == "send" ? scd::transport::Send(**transport, flags)
                                 : scd::transport::Receive(**transport, flags);
}
