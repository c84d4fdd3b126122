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
printed). --address may list a deployment's coordinators (HOST:PORT,HOST:PORT): a stream whose
coordinator goes away is resumed through the next with the Started's resume token and the token
ids received so far (GenerateRequest.resume_token), and goes on where it stopped; a fan-out's
targets each resume alone with their own token.
"""
import argparse
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stubs", required=True, help="folder protoc wrote the stubs to")
    parser.add_argument("--address", required=True, help="HOST:PORT of a coordinator, consumer "
                        "or `scd serve --all-in-one`; several coordinators comma-separated")
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

    addresses = [a for a in args.address.split(",") if a]
    with grpc.insecure_channel(addresses[0]) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        try:
            health = stub.Health(inference_pb2.HealthRequest(), timeout=args.timeout)
            print(f"health: {health.status} ({health.role}, version {health.version})",
                  file=sys.stderr)
            for model in stub.ListModels(inference_pb2.ListModelsRequest(),
                                         timeout=args.timeout).models:
                print(f"model: {model.name} ({model.role}) at {model.address}", file=sys.stderr)
        except grpc.RpcError as e:
            print(f"call failed: {e.code().name}: {e.details()}", file=sys.stderr)
            return 1
    # The enum (TransferMode); the string field `mode` is deprecated.
    mode = inference_pb2.TransferMode.Value("TRANSFER_MODE_" + args.mode.upper())
    request = inference_pb2.GenerateRequest(
        prompt=args.prompt, targets=args.target, transfer_mode=mode,
        max_tokens=args.max_tokens, temperature=args.temperature)
    # Per target: its Started's resume token, the ids received, whether it ended.
    state = {"targets": {}, "failed": False}
    broken = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.ABORTED,
              grpc.StatusCode.UNKNOWN)
    code = call(grpc, addresses[0], request, args.timeout, state, inference_pb2, inference_pb2_grpc)
    if code is None:
        return 1 if state["failed"] else 0
    if code not in broken:
        return 1
    # Each target left open resumes alone (a fan-out's one after another here), with its own
    # token, through the next coordinators.
    for target in list(request.targets) or list(state["targets"]):
        t = state["targets"].get(target)
        if t is None or t["ended"]:
            continue
        if not t["token"]:
            return 1  # it broke before its Started: nothing resumes it
        for attempt in range(1, len(addresses) + 1):
            address = addresses[attempt % len(addresses)]
            resume = inference_pb2.GenerateRequest()
            resume.CopyFrom(request)
            resume.resume_token = t["token"]
            resume.resume_received_ids.extend(t["received"])
            print(f"\nresuming {target or 'the stream'} through {address} after "
                  f"{len(t['received'])} tokens", file=sys.stderr)
            code = call(grpc, address, resume, args.timeout, state, inference_pb2, inference_pb2_grpc)
            if code is None or code not in broken or t["ended"]:
                break
        if not t["ended"]:
            return 1
    return 1 if state["failed"] else 0


def call(grpc, address, request, timeout, state, inference_pb2, inference_pb2_grpc):
    """One Generate call; None when it ended OK, else its gRPC status code."""
    with grpc.insecure_channel(address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        try:
            for event in stub.Generate(request, timeout=timeout):
                show(event, state, inference_pb2)
            return None
        except grpc.RpcError as e:
            print(f"\ncall failed: {e.code().name}: {e.details()}", file=sys.stderr)
            return e.code()


def show(event, state, inference_pb2):
    """Prints one event and notes what a resume needs."""
    kind = event.WhichOneof("event")
    t = state["targets"].setdefault(event.target,
                                    {"token": b"", "received": [], "ended": False})
    if kind == "started":
        t["token"] = event.started.resume_token
    elif kind == "token":
        t["received"].extend(event.token.ids)
        sys.stdout.write(event.token.text)
        sys.stdout.flush()
    elif kind == "finished":
        t["ended"] = True
        f = event.finished
        ran = inference_pb2.TransferMode.Name(f.transfer_mode)
        ran = ran.removeprefix("TRANSFER_MODE_").lower()
        print(f"\n[{event.target}] {f.reason}: mode {ran}, {f.prompt_tokens} prompt + "
              f"{f.output_tokens} output tokens, {f.payload_bytes} payload bytes, "
              f"TTFT {f.timings.ttft / 1000:.1f} ms", file=sys.stderr)
    elif kind == "moved":  # the stream goes on at another replica: nothing lost
        m = event.moved
        how = "resumed" if m.resumed else "moved"
        print(f"\n[{event.target}] {how} after {m.tokens_so_far} tokens: {m.reason}",
              file=sys.stderr)
    elif kind == "error":
        t["ended"] = True
        state["failed"] = True
        print(f"\n[{event.target}] error {event.error.code}: {event.error.message}",
              file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
