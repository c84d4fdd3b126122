#!/usr/bin/env python3
"""Asks a server through gRPC server reflection (grpc.reflection.v1alpha, what grpcurl uses) for
its services, then for the file defining scd.v1.Inference, without any .proto file: prints the
services, one per line, then `scd.v1.Inference.<method>` for each method of the descriptor it got.

  grpc_reflection_check.py HOST:PORT

The reflection messages are encoded by hand (a few fields of reflection.proto), so the check
needs no stubs: only python3-grpcio and python3-protobuf (FileDescriptorProto).
"""
import sys

import grpc
from google.protobuf import descriptor_pb2

METHOD = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"


def varint(data, i):
    shift = value = 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, i


def fields(data):
    """(number, value) of a message's fields; LEN fields as bytes, varints as ints."""
    i = 0
    while i < len(data):
        key, i = varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(data, i)
        elif wire == 2:
            n, i = varint(data, i)
            value, i = data[i:i + n], i + n
        else:
            raise ValueError(f"unexpected wire type {wire}")
        yield number, value


def string_field(number, text):
    raw = text.encode()
    return bytes([number << 3 | 2, len(raw)]) + raw


def main():
    channel = grpc.insecure_channel(sys.argv[1])
    call = channel.stream_stream(METHOD, request_serializer=lambda b: b,
                                 response_deserializer=lambda b: b)
    # list_services = 7; file_containing_symbol = 4.
    requests = [string_field(7, ""), string_field(4, "scd.v1.Inference")]
    responses = list(call(iter(requests), timeout=30))
    services = [dict(fields(s))[1].decode()
                for number, body in fields(responses[0]) if number == 6
                for n, s in fields(body) if n == 1]
    for name in services:
        print(name)
    for number, body in fields(responses[1]):
        if number == 7:
            sys.exit(f"reflection error: {body!r}")
        if number != 4:
            continue
        for n, raw in fields(body):
            if n != 1:
                continue
            proto = descriptor_pb2.FileDescriptorProto.FromString(raw)
            for service in proto.service:
                if service.name == "Inference":
                    for method in service.method:
                        print(f"{proto.package}.{service.name}.{method.name}")


if __name__ == "__main__":
    main()
