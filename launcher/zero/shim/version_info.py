"""``deepspeed.git_version_info``'s values under the shim: the DeepSpeed release this engine matches,
no git commit of DeepSpeed's, no compiled ops; ``torch_info`` holds DeepSpeed's "0.0" sentinel, which
tells its readers to detect the versions at run time. Torch-free."""
from launcher.zero.shim.paths import DEEPSPEED_VERSION

version = DEEPSPEED_VERSION
git_hash = "unknown"
git_branch = "unknown"
installed_ops: dict[str, bool] = {}          # this engine builds no C++/CUDA ops (deepspeed.ops.op_builder)
accelerator_name = ""
torch_info = {"version": "0.0", "bf16_support": False, "cuda_version": "0.0", "nccl_version": "0.0",
              "hip_version": "0.0"}
