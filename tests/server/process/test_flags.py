"""`python -m oip serve`'s flags refuse values the server cannot honour, at parse time: one line naming the flag
and the value, exit 2, before anything loads (`oip.server.process.main.build_parser`)."""

from __future__ import annotations

import pytest
from oip.server.process.main import build_parser, settings_from_args


@pytest.mark.parametrize(("flag", "value", "words"), [
    ("--graceful-shutdown-seconds", "-1", "must be a number of seconds >= 0, got -1"),
    ("--graceful-shutdown-seconds", "nan", "must be a number of seconds >= 0, got nan"),
    ("--graceful-shutdown-seconds", "inf", "must be a number of seconds >= 0, got inf"),
    ("--graceful-shutdown-seconds", "soon", "not a number: 'soon'"),
    ("--shutdown-delay-seconds", "-5", "must be a number of seconds >= 0, got -5"),
    ("--grpc-threads", "0", "must be positive, got 0"),
    ("--grpc-max-connection-age", "0", "must be from 1 to 2147483647, got 0"),
    ("--grpc-http2-max-ping-strikes", "-1", "must be from 0 to 2147483647, got -1"),
    ("--grpc-keepalive-time", str(2**31), f"must be from 1 to 2147483647, got {2**31}"),
    ("--grpc-keepalive-permit-without-calls", "maybe", "not true or false: 'maybe'"),
    ("--http-port", "70000", "port 70000 is out of range 0-65535"),
    ("--http-header-timeout", "0", "must be a positive number of seconds, got 0"),
    ("--metrics-buckets", "x", "not a list of numbers: 'x'"),
])
def test_a_value_the_server_cannot_honour_is_refused(flag: str, value: str, words: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["--model-repository", ".", flag, value])
    assert exited.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"argument {flag}: {words}" in error, error


@pytest.mark.parametrize("value", ["0", "2.5", "30"])
def test_a_graceful_shutdown_of_zero_or_more_seconds_is_taken(value: str) -> None:
    args = build_parser().parse_args(["--model-repository", ".", "--graceful-shutdown-seconds", value])
    assert settings_from_args(args).graceful_shutdown_seconds == float(value)


def test_the_grpc_connection_flags_become_grpcs_arguments() -> None:
    """Triton's flag names, grpc's argument names and values (milliseconds, counts, 0 or 1); none given, none set."""
    args = build_parser().parse_args(["--model-repository", ".", "--grpc-max-connection-age", "60000",
                                      "--grpc-keepalive-permit-without-calls=true",
                                      "--grpc-http2-min-recv-ping-interval-without-data", "10000"])
    assert dict(settings_from_args(args).grpc_options) == {
        "grpc.max_connection_age_ms": 60000, "grpc.keepalive_permit_without_calls": 1,
        "grpc.http2.min_ping_interval_without_data_ms": 10000}
    assert settings_from_args(build_parser().parse_args(["--model-repository", "."])).grpc_options == ()
