#!/usr/bin/env python3
"""A minimal Python client of SCD Serve's public gRPC API (scd.v1.Inference), using stubs that
protoc generates from proto/ with proto/ as the include root:

  mkdir -p /tmp/scd_stubs
  protoc -Iproto --python_out=/tmp/scd_stubs --grpc_out=/tmp/scd_stubs \
         --plugin=protoc-gen-grpc=$(command -v grpc_python_plugin) proto/scd/v1/*.proto
  python3 proto/examples/scd_client.py --stubs /tmp/scd_stubs --address 127.0.0.1:50051 \
         --target fables --prompt "Once upon a time"

Debian: protobuf-compiler-grpc (protoc, grpc_python_plugin), python3-grpcio, python3-protobuf.
Prints the server's health, its models, then streams the completion's text to stdout and a summary
line (mode, tokens, payload bytes, time to first token) to stderr. Exit status 0 when every
target finished, 1 when the call or a target ended with an error (its gRPC status and message
printed).
"""
import argparse
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stubs", required=True, help="folder protoc wrote the stubs to")
    parser.add_argument("--address", required=True, help="HOST:PORT of a coordinator, consumer "
                        "or `scd serve --all-in-one`")
    parser.add_argument("--prompt", default="Once upon a time")
    parser.add_argument("--target", action="append", default=[],
                        help="consumer model (repeat for a fan-out); none: the server's default")
    parser.add_argument("--mode", default="auto",
                        choices=["auto", "scd", "reuse", "raw", "int4", "recompute", "local"])
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds for the whole call")
    args = parser.parse_args()

    sys.path.insert(0, args.stubs)
    import grpc
    from scd.v1 import inference_pb2, inference_pb2_grpc

    with grpc.insecure_channel(args.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        try:
            health = stub.Health(inference_pb2.HealthRequest(), timeout=args.timeout)
            print(f"health: {health.status} ({health.role}, version {health.version})",
                  file=sys.stderr)
            for model in stub.ListModels(inference_pb2.ListModelsRequest(),
                                         timeout=args.timeout).models:
                print(f"model: {model.name} ({model.role}) at {model.address}", file=sys.stderr)
            # The enum (TransferMode); the string field `mode` is deprecated.
            mode = inference_pb2.TransferMode.Value("TRANSFER_MODE_" + args.mode.upper())
            request = inference_pb2.GenerateRequest(
                prompt=args.prompt, targets=args.target, transfer_mode=mode,
                max_tokens=args.max_tokens, temperature=args.temperature)
            failed = False
            for event in stub.Generate(request, timeout=args.timeout):
                kind = event.WhichOneof("event")
                if kind == "token":
                    sys.stdout.write(event.token.text)
                    sys.stdout.flush()
                elif kind == "finished":
                    f = event.finished
                    ran = inference_pb2.TransferMode.Name(f.transfer_mode)
                    ran = ran.removeprefix("TRANSFER_MODE_").lower()
                    print(f"\n[{event.target}] {f.reason}: mode {ran}, {f.prompt_tokens} prompt + "
                          f"{f.output_tokens} output tokens, {f.payload_bytes} payload bytes, "
                          f"TTFT {f.timings.ttft / 1000:.1f} ms", file=sys.stderr)
                elif kind == "moved":  # the stream goes on at another replica: nothing lost
                    m = event.moved
                    print(f"\n[{event.target}] moved after {m.tokens_so_far} tokens: {m.reason}",
                          file=sys.stderr)
                elif kind == "error":
                    failed = True
                    print(f"\n[{event.target}] error {event.error.code}: {event.error.message}",
                          file=sys.stderr)
        except grpc.RpcError as e:
            print(f"call failed: {e.code().name}: {e.details()}", file=sys.stderr)
            return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
