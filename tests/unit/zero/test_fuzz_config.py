"""The config loader under generated configs: a ZeroConfig, or a ConfigError naming the source and the key.

Configs are drawn from the schema itself (every section and key, with values of the right kind)
and then mutated: wrong types, unknown and misspelt keys, null, "auto", NaN and infinities, huge
and negative numbers, sections that are not mappings, non-string YAML keys. Files are the same
dicts written as JSON or YAML, plus raw bytes (bad UTF-8, deep nesting, truncated text).
"""
import dataclasses
import json
import math

import yaml
from hypothesis import example, given, strategies as st

from launcher.errors import DslaunchError
from launcher.zero.config.checks import check_without_model
from launcher.zero.config.load import load_config, named_by
from launcher.zero.config.schema import ACCEPTED_UNSUPPORTED, NamedConfig, ZeroConfig
from tests.helpers.fuzz import FUZZ, fewer, record

SOURCE = "config dict passed to initialize"
ANY = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([2**70, -2**70, 10**400, 1e308]),
                st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(["auto", "", "x", "cpu", "fp16"]),
                st.just([]), st.just({}), st.just({"x": 1}))


def good_value(meta):
    kind = meta["kind"]
    if "choices" in meta:
        return st.sampled_from(meta["choices"])
    if kind == "bool":
        return st.booleans()
    if kind == "int":
        return st.integers(int(meta.get("min", 0)), int(meta.get("max", 64)))
    if kind == "float":
        return st.floats(meta.get("min", 0.0), meta.get("max", 10.0))
    if kind == "str":
        return st.sampled_from(["a", "/tmp/x"])
    if kind == "dict":
        return st.just({})
    return ANY


def section(cls, depth=0):
    """A mapping of some of `cls`'s keys: mostly good values, some mutated, some unknown keys."""
    fields = [f for f in dataclasses.fields(cls) if f.metadata.get("kind") != "internal"]
    entries = []
    for f in fields:
        meta = f.metadata
        if meta.get("kind") == "section":
            sub = meta["section"]
            good = named() if sub is NamedConfig else (section(sub, depth + 1) if depth < 2 else st.just({}))
        else:
            good = good_value(meta)
        entries.append(st.tuples(st.just(f.name), st.one_of(good, good, good, ANY)))
    unknown = st.tuples(st.sampled_from(["bogus", "stagee", "zero_optimisation", "1", "train_batch"]), ANY)
    return st.lists(st.one_of(*entries, unknown), max_size=6).map(dict)


def named():
    return st.fixed_dictionaries({"type": st.sampled_from(["Adam", "AdamW", "Lamb", "SGD", "WarmupLR", "lion",
                                                           "", "adamw", "Nope"]) | ANY},
                                 optional={"params": st.dictionaries(st.sampled_from(["lr", "betas", "eps",
                                                                                      "warmup_num_steps", "bogus",
                                                                                      "max_grad_norm"]),
                                                                     ANY, max_size=3) | ANY,
                                           "typo": ANY})


configs = st.one_of(section(ZeroConfig),
                    section(ZeroConfig).flatmap(lambda d: st.sampled_from(ACCEPTED_UNSUPPORTED).map(
                        lambda k: {**d, k: {}})))


def check_error(error, source):
    assert isinstance(error, DslaunchError), type(error)
    assert error.message.startswith(source), error.message
    assert len(error.message) > len(source) + 2, error.message


@FUZZ
@given(configs, st.one_of(st.none(), st.integers(1, 16)))
@example({"train_batch_size": 10**400}, None)                # math.isfinite raised OverflowError
@example({"optimizer": {1: 2, "type": "Adam"}}, None)        # sorted() of int and str keys raised TypeError
@example({"optimizer": {1: 2}}, None)                        # difflib of an int key raised TypeError
@example({"gradient_clipping": 10**400}, None)               # float(10**400) raised OverflowError
@example({"scheduler": {"type": "Adam"}}, None)              # the section checks did not name the source
def test_a_config_dict_loads_or_names_the_key(raw, world_size):
    try:
        config = load_config(raw, world_size=world_size)
        with named_by(raw):   # as initialize checks the sections (launcher/zero/assembly/initialize.py)
            check_without_model(config)
    except DslaunchError as error:
        record("config_dict", error)
        check_error(error, SOURCE)
        return
    record("config_dict")
    assert isinstance(config, ZeroConfig)
    if world_size is not None:
        assert config.train_batch_size == (config.train_micro_batch_size_per_gpu
                                           * config.gradient_accumulation_steps * world_size)


def as_text(raw, kind):
    if kind == "yaml":
        return yaml.safe_dump(raw, allow_unicode=True)
    return json.dumps(raw)


texts = st.one_of(
    st.tuples(configs, st.sampled_from(["json", "yaml"])).map(lambda pair: (as_text(*pair).encode(), pair[1])),
    st.tuples(st.sampled_from([b"\xff\xfe{}", b"{", b"[]", b"null", b"", b"\xef\xbb\xbf{}", b"[" * 5000,
                               b'{"train_batch_size": 1' + b"0" * 5000 + b"}", b"a: [1, 2\n", b"? [1, 2]\n: 3\n",
                               b"optimizer:\n  1: x\n", b"a: &a [*a]\n", b"x: !!python/name:os.system\n",
                               b'{"fp16": {"enabled": NaN}}', b"train_batch_size: .inf\n"]),
              st.sampled_from(["json", "yaml"])),
    st.tuples(st.binary(max_size=20), st.sampled_from(["json", "yaml"])))


@fewer(2)
@given(texts)
@example((b"\xff{}", "json"))                  # UnicodeDecodeError
@example((b"[" * 100000, "json"))              # RecursionError from json.loads
@example((b"[" * 10000, "yaml"))               # RecursionError from yaml.safe_load
@example((b'{"train_batch_size": 1' + b"0" * 5000 + b"}", "json"))   # ValueError: int of over 4300 digits
def test_a_config_file_loads_or_names_the_file(tmp_path_factory, text_and_kind):
    text, kind = text_and_kind
    path = tmp_path_factory.mktemp("cfg") / f"ds.{kind}"
    path.write_bytes(text)
    try:
        config = load_config(str(path))
        with named_by(str(path)):
            check_without_model(config)
    except DslaunchError as error:
        record(f"config_{kind}", error)
        assert str(path) in error.message, error.message
        return
    record(f"config_{kind}")
    assert isinstance(config, ZeroConfig) and not math.isnan(config.gradient_clipping)
