// libFuzzer target: transfer frames as the gRPC backend receives them from a peer (the
// Reassembler: hand-decoded CodeChunk and CodeChunkPiece messages around their payload bytes,
// every other frame through protobuf). The input is a sequence of messages, each prefixed by a
// 2-byte little-endian length.
#include <grpcpp/support/byte_buffer.h>

#include <cstdint>

#include "transport/grpc/chunk_codec.h"
#include "transport/receive_pool.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static auto pool = scd::transport::ReceivePool::Create({});
  scd::transport::grpc_internal::Reassembler reassembler(pool);
  size_t at = 0;
  while (at + 2 <= size) {
    const size_t length = data[at] | (static_cast<size_t>(data[at + 1]) << 8);
    at += 2;
    const size_t take = length < size - at ? length : size - at;
    grpc::Slice slice(data + at, take);
    grpc::ByteBuffer message(&slice, 1);
    at += take;
    auto frame = reassembler.Take(message);
    if (!frame.ok()) reassembler.Reset();
  }
  return 0;
}
