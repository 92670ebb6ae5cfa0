"""One construct for the bookkeeping of every inference request, whichever way it runs (`Inference`).

REST, gRPC on the event loop or in its thread, the lean gRPC way, streams and dynamic batches: each request is held
by one `Inference` from the moment its model version is leased to its record. Entering holds the model version
(it is not unloaded meanwhile) and tells the observers the request started; leaving releases it and tells them
how it ended, exactly once, as a success or as the failure the exception it left with means (`errors.failure`).
The instance held is `Inference.model`: the one the request found, or the one that replaced it in a reload since
(`ModelRepository.acquire`); a request that runs in a gRPC thread runs that one.
"""

from __future__ import annotations

import time
from types import TracebackType

from ..errors import failure
from ..model import Model
from ..observe.events import InferenceRecord, Observers, Timer
from .repository import ModelRepository

__all__ = ["Inference"]


class Inference:
    """`with Inference(repository, observers, model, timer) as run:` one inference request of `model` (from
    `repository.get`), timed by `timer`.

    On the general ways the timer times the phases; before leaving, the request says its batch size
    (`run.batch_size`) and whether it ran the model by itself (`run.alone`: its run is reported with it; the
    batcher reports the runs of batches). The lean way (`lean`) gives `start` (its first moment on
    `time.perf_counter_ns`'s clock) and notes the moments it reaches (`queued`, `formed` for its dynamic batch,
    `started`, `ended`, and `answered` when its answer was ready before it leaves, which it may do once the answer
    is sent: `Observers.recording`) instead, and says its batch size and whether it ran alone too; its timer may be
    None (see `Observers.request_started`).

    A plain class with slots and no generator: every request pays for it.
    """

    __slots__ = ("_observers", "_repository", "alone", "answered", "batch_size", "ended", "formed", "model",
                 "queued", "request_id", "start", "started", "timer")

    def __init__(self, repository: ModelRepository, observers: Observers, model: Model, timer: Timer | None,
                 request_id: str = "", start: int = 0) -> None:
        if timer is None and not start:
            raise TypeError("an inference is timed by a timer, or by the moments the lean way notes from `start`")
        model = repository.acquire(model)
        self._repository = repository
        self._observers = observers
        self.model = model
        self.timer = timer
        self.request_id = request_id
        self.batch_size = 1
        self.alone = True
        self.start = start
        self.queued = self.formed = self.started = self.ended = self.answered = 0
        observers.request_started(timer, model.name, model.version)

    def __enter__(self) -> Inference:
        return self

    def model_started(self, moment: int) -> None:
        """The lean way's model started at `moment` (told as it happens, by a worker thread, say)."""
        self.started = moment

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        model, observers, timer = self.model, self._observers, self.timer
        self._repository.release(model)
        if timer is not None and not self.start:  # a general way: its timer's record
            if exc is not None:
                observers.request_finished(timer.record(model.name, model.version, 1, failure(exc)))
            elif self.alone:
                observers.request_ran_alone(timer.record(model.name, model.version, self.batch_size))
            else:
                observers.request_finished(timer.record(model.name, model.version, self.batch_size))
        elif exc is None and self.alone and self.batch_size == 1:  # the lean way: its moments
            observers.ran_alone(timer, model.name, model.version, self.request_id, self.start, self.queued,
                                self.started, self.ended, self.answered or time.perf_counter_ns())
        elif exc is None and not self.alone:  # the lean way, a request of a dynamic batch: its moments
            observers.ran_in_batch(timer, model.name, model.version, self.request_id, self.start, self.queued,
                                   self.formed, self.started, self.ended, self.answered or time.perf_counter_ns(),
                                   self.batch_size)
        else:  # the lean way's failure, or a request of a batch of rows: its record
            record = InferenceRecord.from_marks(
                model.name, model.version, self.request_id, None if exc is None else failure(exc), self.start,
                self.queued, self.started, self.ended, self.answered or time.perf_counter_ns(), timer,
                1 if exc is not None else self.batch_size, self.formed,
            )
            if exc is None and self.alone:
                observers.request_ran_alone(record)
            else:
                observers.request_finished(record)
