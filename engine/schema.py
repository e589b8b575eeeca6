"""The one strict base of every settings model (project files, data sets, cluster
profiles): unknown fields are errors, a boolean is never read as a number, and a number
is finite."""
from __future__ import annotations

import json
from types import UnionType
from typing import Annotated, Any, Union, get_origin

from pydantic import BaseModel, ConfigDict, model_validator


def _wants_number(annotation: Any) -> bool:
    """int or float, bare, Optional or Annotated (bool is an int to Python, not to a user)."""
    if annotation in (int, float):
        return True
    return any(_wants_number(a) for a in getattr(annotation, "__args__", ()) if a is not type(None)) \
        and get_origin(annotation) in (Union, Annotated, tuple, UnionType)


class Strict(BaseModel):
    # inf and NaN are no setting's value (the run spec refuses them too, runtime/spec.py _num):
    # `weight_decay: Infinity` is "must be a finite number" on load, not a traceback at train
    model_config = ConfigDict(extra="forbid", strict=False, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, data: Any) -> Any:
        """`lr: true` is refused, not read as 1.0 (pydantic's lax mode takes a bool as a number)."""
        if isinstance(data, dict):
            for name, v in data.items():
                if isinstance(v, bool) or (isinstance(v, (list, tuple)) and any(isinstance(x, bool) for x in v)):
                    field = cls.model_fields.get(name) if isinstance(name, str) else None
                    if field is not None and _wants_number(field.annotation):
                        raise ValueError(f"{name} must be {'numbers' if isinstance(v, (list, tuple)) else 'a number'}, "
                                         f"not {json.dumps(v)}")
        return data
