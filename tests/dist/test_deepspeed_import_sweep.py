"""Every ``deepspeed.X`` that integrations and DeepSpeed's examples import works under the shim, or says it is not built.

tests/data/deepspeed_imports.txt lists what transformers, accelerate and DeepSpeedExamples' training
scripts take from DeepSpeed (scripts/list_deepspeed_imports.py, checked against a real DeepSpeed
0.19.8), with the names issue 30 found broken. Under ``dslaunch --as-deepspeed`` each must resolve or
raise our NotSupportedError naming the feature -- never a bare ModuleNotFoundError or AttributeError --
and every module must import: a feature that is not built fails where it is used, not where it is
imported (DeepSpeed's CIFAR-10 tutorial imports ``deepspeed.moe.utils`` whether or not it uses MoE).
"""
from __future__ import annotations

import importlib.metadata

import pytest

from tests.helpers.recorded import DEEPSPEED_VERSION
from tests.helpers.world import REPO, check, run_world

WORKER = REPO / "tests" / "dist" / "workers" / "import_sweep_worker.py"
NAMES_FILE = REPO / "tests" / "data" / "deepspeed_imports.txt"


@pytest.fixture(scope="module")
def sweep():
    (result,) = check(run_world(WORKER, 1, timeout=240, launcher_args=("--as-deepspeed", "--no_local_rank")))
    records = result.records()
    names = {r["name"]: r for r in records if "name" in r}
    facts = {r["fact"]: r for r in records if "fact" in r}
    return names, facts


def listed() -> list[str]:
    return [line.split("#")[0].strip() for line in NAMES_FILE.read_text().splitlines() if line.split("#")[0].strip()]


def test_every_listed_name_was_tried(sweep):
    names, facts = sweep
    assert sorted(names) == sorted(listed()) and len(facts) == 5


def test_no_name_fails_with_anything_but_not_supported(sweep):
    names, _ = sweep
    broken = [f"{name}: {r['error']}" for name, r in sorted(names.items()) if r["outcome"] == "broken"]
    assert not broken, f"{len(broken)} of {len(names)} names broken under the shim:\n" + "\n".join(broken)


def test_every_module_imports(sweep):
    names, _ = sweep
    refused = [f"{name}: {r['error']}" for name, r in sorted(names.items()) if ":" not in name and r["outcome"] != "ok"]
    assert not refused, "modules that do not import:\n" + "\n".join(refused)


def test_not_supported_names_the_feature(sweep):
    names, _ = sweep
    for name, r in names.items():
        if r["outcome"] == "not_supported":
            assert len(r["error"]) > len("NotSupportedError: ") + 10, f"{name}: {r['error']}"


def test_deepspeed_package_metadata_and_version_are_those_we_match(sweep):
    _, facts = sweep
    assert facts["metadata_version"]["value"] == DEEPSPEED_VERSION, facts["metadata_version"]
    assert facts["module_version"]["value"] == DEEPSPEED_VERSION, facts["module_version"]
    assert facts["transformers_is_deepspeed_available"]["value"] is True, facts["transformers_is_deepspeed_available"]
    assert facts["accelerate_is_deepspeed_available"]["value"] is True, facts["accelerate_is_deepspeed_available"]


def test_without_the_shim_there_is_no_deepspeed_package():
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("deepspeed")


def test_a_mixture_of_experts_layer_is_built_through_deepspeed_moe(sweep):
    _, facts = sweep
    built = facts["moe_layer_built"]
    assert built["outcome"] == "ok", built
