"""How the gRPC port manages its connections, by Triton's flags (`settings.GRPC_CONNECTION`): keepalive pings and
the pings the server takes from clients, and the age of connections. Through `python -m oip serve`, seen from a
client channel's connectivity (a connection the server closes takes the channel out of READY).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc
import pytest
from oip.grpc import grpc_service_pb2 as pb
from oip.grpc import grpc_service_pb2_grpc as pb_grpc
from serving import TIMEOUT, build_repository, running

# A client that pings every second, with or without calls (tritonclient's KeepAliveOptions set so).
PINGING = [("grpc.keepalive_time_ms", 1000), ("grpc.keepalive_timeout_ms", 5000),
           ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_pings_without_data", 0)]


def states_while_idle(target: str, seconds: float, options: list[tuple[str, int]] | None = None) -> list[str]:
    """The connectivity states a channel passes through after one call, idle for `seconds`."""
    seen: list[str] = []
    lock = threading.Lock()

    def record(state: grpc.ChannelConnectivity) -> None:
        with lock:
            seen.append(state.name)

    with grpc.insecure_channel(target, options=options or []) as channel:
        assert pb_grpc.GRPCInferenceServiceStub(channel).ServerLive(pb.ServerLiveRequest(), timeout=TIMEOUT).live
        channel.subscribe(record)
        time.sleep(seconds)
        channel.unsubscribe(record)
    with lock:
        return seen


@pytest.mark.parametrize("flags", [(), ("--grpc-max-connection-age", "1000", "--grpc-max-connection-age-grace",
                                         "500")])
def test_a_connection_past_its_age_is_closed(tmp_path: Path, flags: tuple[str, ...]) -> None:
    """With `--grpc-max-connection-age`, an idle client's connection is closed past its age (its channel leaves
    READY), so that clients reconnect and spread over new replicas; without it, it stays."""
    repository = build_repository(tmp_path / "models", only=("simple",))
    with running(repository, tmp_path, *flags, ready=("simple",)) as server:
        states = states_while_idle(server.target, 4.0)
    assert states[0] == "READY", states
    assert (len(states) > 1) is bool(flags), states


@pytest.mark.parametrize("flags", [(), ("--grpc-keepalive-permit-without-calls", "true",
                                         "--grpc-http2-min-recv-ping-interval-without-data", "500")])
def test_clients_that_ping_while_idle_are_taken_when_the_flags_say_so(tmp_path: Path,
                                                                      flags: tuple[str, ...]) -> None:
    """A client that pings every second on an idle connection: by grpc's defaults (and Triton's) the server counts
    the pings as strikes and closes the connection (too_many_pings); with the flags that allow them, it stays."""
    repository = build_repository(tmp_path / "models", only=("simple",))
    with running(repository, tmp_path, *flags, ready=("simple",)) as server:
        states = states_while_idle(server.target, 6.0, PINGING)
    assert states[0] == "READY", states
    assert (len(states) > 1) is not bool(flags), states
