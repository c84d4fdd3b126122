#!/usr/bin/env python3
"""A client of grpc.health.v1 -- what Kubernetes' gRPC probes and grpc-health-probe ask -- through
python3-grpcio, its two messages encoded by hand (no stubs: a generated `grpc.health.v1` package
would shadow grpcio's own `grpc`).

  grpc_health_check.py check HOST:PORT [--service S]
      Check once: prints SERVING, NOT_SERVING or the error code; exit 0 only on SERVING.
  grpc_health_check.py follow HOST:PORT [--service S] [--deadline SECONDS]
      Watches from before the server listens until after it stops, watching again whenever a
      stream ends or the port refuses (a fresh channel each time: no reconnection backoff hides
      a short phase). Prints each change of what it sees, a line each: REFUSED (nothing answers),
      a status (NOT_SERVING, SERVING, ...), END <CODE> (the stream ended). Stops at the first
      REFUSED after it saw SERVING (exit 0), or at the deadline (exit 1).
"""
import argparse
import sys
import time

import grpc

STATUSES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}
CHECK = "/grpc.health.v1.Health/Check"
WATCH = "/grpc.health.v1.Health/Watch"


def request(service):
    """HealthCheckRequest{service}: field 1, length-delimited."""
    data = service.encode()
    if not data:
        return b""
    assert len(data) < 128
    return bytes([0x0A, len(data)]) + data


def status_of(response):
    """HealthCheckResponse.status: field 1, a varint (absent: 0)."""
    if not response:
        return STATUSES[0]
    assert response[0] == 0x08, response
    return STATUSES.get(response[1], str(response[1]))


def channel(address):
    # Its own subchannel: one a refused earlier channel left in backoff is not reused.
    return grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])


def status(address, service, timeout):
    """One Check: the status it answers, or the error's code name."""
    with channel(address) as ch:
        call = ch.unary_unary(CHECK, request_serializer=None, response_deserializer=None)
        try:
            return status_of(call(request(service), timeout=timeout))
        except grpc.RpcError as error:
            return error.code().name


def check(address, service):
    answer = status(address, service, 10)
    print(answer)
    return 0 if answer == "SERVING" else 1


def follow(address, service, deadline_s):
    seen = []

    def saw(what):
        if not seen or seen[-1] != what:
            seen.append(what)
            print(what, flush=True)

    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        got_any = False
        with channel(address) as ch:
            watch = ch.unary_stream(WATCH, request_serializer=None, response_deserializer=None)
            try:
                for response in watch(request(service), timeout=max(0.1, end - time.monotonic())):
                    got_any = True
                    saw(status_of(response))
                saw("END OK")
            except grpc.RpcError as error:
                if got_any:
                    saw("END " + error.code().name)
                elif error.code() == grpc.StatusCode.UNAVAILABLE:
                    saw("REFUSED")
                    if "SERVING" in seen:
                        return 0
                else:
                    saw("END " + error.code().name)
        # paces: the attempts to connect and watch again, 20 ms apart
        time.sleep(0.02)
    return 1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("action", choices=["check", "follow"])
    parser.add_argument("address")
    parser.add_argument("--service", default="")
    parser.add_argument("--deadline", type=float, default=60.0)
    args = parser.parse_args()
    if args.action == "check":
        return check(args.address, args.service)
    return follow(args.address, args.service, args.deadline)


if __name__ == "__main__":
    sys.exit(main())
