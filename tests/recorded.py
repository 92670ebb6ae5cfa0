"""An observer that keeps what the data plane tells it, for the tests that check what was counted in process
(`Recorder`: the records of every request and every model execution, in order)."""

from __future__ import annotations

from oip.server.observe.events import ExecutionRecord, InferenceRecord, Observer


class Recorder(Observer):
    """Keeps every request's record and every execution's record the observers are told of."""

    def __init__(self) -> None:
        self.requests: list[InferenceRecord] = []
        self.executions: list[ExecutionRecord] = []

    def request_finished(self, record: InferenceRecord) -> None:
        self.requests.append(record)

    def execution_finished(self, record: ExecutionRecord) -> None:
        self.executions.append(record)
