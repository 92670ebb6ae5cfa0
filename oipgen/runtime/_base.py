"""The base class of every model in `models`."""

from typing import Any

from pydantic import BaseModel, ConfigDict


class OipModel(BaseModel):
    """A protocol body. Dumps leave out fields that are None, as the protocol omits absent fields."""

    model_config = ConfigDict(protected_namespaces=(), populate_by_name=True)

    def model_dump(self, **kwargs: Any) -> dict[str, Any]:
        kwargs.setdefault("exclude_none", True)
        return super().model_dump(**kwargs)

    def model_dump_json(self, **kwargs: Any) -> str:
        kwargs.setdefault("exclude_none", True)
        return super().model_dump_json(**kwargs)
