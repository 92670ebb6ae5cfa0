"""Problems found in a spec, collected and reported together, each naming its file."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Problem:
    file: str
    where: str
    message: str

    def __str__(self) -> str:
        place = f"{self.file}: {self.where}" if self.where else self.file
        return f"{place}: {self.message}"


class SpecError(Exception):
    """The spec could not be loaded; `problems` says every reason found."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class Problems:
    """A collector: loaders add to it and go on, so that one run reports everything."""

    def __init__(self) -> None:
        self.items: list[Problem] = []

    def add(self, file: str, where: str, message: str) -> None:
        self.items.append(Problem(file, where, message))

    def __bool__(self) -> bool:
        return bool(self.items)

    def raise_if_any(self) -> None:
        if self.items:
            raise SpecError(list(self.items))
