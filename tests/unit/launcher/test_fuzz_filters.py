"""-i/--include and -e/--exclude under generated specs: a subset of the pool, or a FilterError naming the option.

Specs are built from DeepSpeed's `host[:slot,slot][@host...]` and mutated: unknown hosts and
slots, empty parts, stray ':' and ',', unicode digits, huge numbers, whitespace.
"""
from hypothesis import example, given, strategies as st

from launcher.errors import FilterError
from launcher.planning.filters import apply_counts, apply_include_exclude
from tests.helpers.fuzz import FUZZ, record

HOSTS = ["w0", "w1", "gpu-2", "10.0.0.3"]

pools = st.lists(st.sampled_from(HOSTS), min_size=1, max_size=4, unique=True).flatmap(
    lambda names: st.fixed_dictionaries({n: st.integers(1, 8).map(lambda k: list(range(k))) for n in names}))
slot_items = st.one_of(st.integers(0, 9).map(str), st.sampled_from(["", " 1", "-1", "x", "\u00b2", "\u0661", "1.0",
                                                                      "9" * 30, "0x1"]))
host_parts = st.one_of(st.sampled_from(HOSTS), st.sampled_from(["", " ", "w9", "w0 ", "W0", "w0:", "ü"]),
                       st.text(max_size=3))


@st.composite
def node_specs(draw):
    name = draw(host_parts)
    if draw(st.booleans()):
        return name
    return name + draw(st.sampled_from([":", "::", ":"])) + ",".join(draw(st.lists(slot_items, min_size=1, max_size=3)))


specs = st.one_of(st.lists(node_specs(), min_size=1, max_size=4).map("@".join),
                  st.text(alphabet="w01:@, ", max_size=10), st.text(max_size=8))


@FUZZ
@given(pools, specs, st.booleans(), st.booleans())
@example({"w0": [0, 1]}, "w0:\u00b2", True, True)     # int('²') raised ValueError
@example({"w0": [0, 1]}, "w0:" + "9" * 5000, True, True)   # so did int() of 5000 digits
def test_a_filter_gives_a_subset_or_names_the_option(pool, spec, include, from_hostfile):
    option = "--include" if include else "--exclude"
    try:
        result = apply_include_exclude(pool, spec if include else None, None if include else spec, from_hostfile)
    except FilterError as error:
        record("include_exclude", error)
        assert error.message.startswith(option), error.message
        return
    record("include_exclude")
    assert result, "a filter left nothing but raised no error"
    assert list(result) == [h for h in pool if h in result]          # hostfile order is kept
    for host, slots in result.items():
        assert slots and set(slots) <= set(pool[host]) and slots == sorted(set(slots))


counts = st.one_of(st.none(), st.integers(-3, 10), st.integers(-2**64, 2**64))


@FUZZ
@given(pools, counts, counts)
def test_counts_give_the_first_nodes_and_slots_or_name_the_flag(pool, num_nodes, num_gpus):
    try:
        result = apply_counts(pool, num_nodes, num_gpus)
    except FilterError as error:
        record("num_nodes_gpus", error)
        assert error.message.startswith(("--num_nodes", "--num_gpus")), error.message
        return
    record("num_nodes_gpus")
    assert list(result) == list(pool)[:num_nodes or len(pool)]
    assert all(slots == pool[host][:num_gpus or len(pool[host])] for host, slots in result.items())
