"""``deepspeed.runtime.config_utils.DeepSpeedConfigModel``: DeepSpeed's pydantic base of config
sections, for scripts that define sections of their own on it. Imported only when a script asks for
it (pydantic is not one of this package's dependencies)."""
from __future__ import annotations

import logging

from pydantic import BaseModel, ConfigDict

_log = logging.getLogger("dslaunch.zero")   # the engine's logger (engine/log.py)


class DeepSpeedConfigModel(BaseModel):
    """A config section as DeepSpeed reads one: ``"auto"`` values fall back to the default (the Hugging
    Face convention), unknown keys are refused, and a field declared with ``deprecated=True`` (and
    ``new_param=``) in its ``json_schema_extra`` warns and moves its value to the new field."""

    model_config = ConfigDict(validate_default=True, validate_assignment=True, use_enum_values=True,
                              populate_by_name=True, extra="forbid", arbitrary_types_allowed=True,
                              protected_namespaces=())

    def __init__(self, strict: bool = False, **data):
        if not strict:
            data = {key: value for key, value in data.items() if value != "auto" or key == "replace_method"}
        super().__init__(**data)
        for name, field in type(self).model_fields.items():
            extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
            if extra.get("deprecated") and name in self.model_fields_set:
                self._move_deprecated(name, extra)

    def _move_deprecated(self, name: str, extra: dict) -> None:
        new = extra.get("new_param", "")
        _log.warning("Config parameter %s is deprecated%s", name, f" use {new} instead" if new else "")
        if new and extra.get("set_new_param", True):
            convert = extra.get("new_param_fn", lambda value: value)
            setattr(self, new, convert(getattr(self, name)))


def get_config_default(config, field_name: str):
    """The default of a field of a DeepSpeedConfigModel class (or instance)."""
    fields = config.model_fields
    if field_name not in fields:
        raise AssertionError(f"'{field_name}' is not a field in {config}")
    if fields[field_name].is_required():
        raise AssertionError(f"'{field_name}' is a required field and does not have a default value")
    return fields[field_name].get_default()
