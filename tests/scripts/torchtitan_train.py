"""torchtitan's llama3 debug model trained on CPU from a ferry dataset through ``FerryDataLoader``.

Run by ``tests/integration/test_integration_torchtitan.py`` under ``torchrun`` (gloo). torchtitan's own
Trainer, checkpointer (DCP) and data-loader protocol do the work; what this script adds is
only what CPU training needs in torchtitan 0.3.0 with torch 2.13 (each marked ``CPU:``):

* torchtitan picks ``device_type = "cuda"`` when no accelerator is present and calls
  ``torch.cuda`` functions; a stand-in device module for the CPU is put in its place;
* FlexAttention has no backward on CPU and varlen is flash-attention (CUDA), so the attention
  kernel is ``ScaledDotProductAttention`` (plain causal; torchtitan still gets ``positions``);
* FSDP2's reduce-scatter uses ``PREMUL_SUM``, which gloo lacks: data parallelism is
  ``data_parallel_replicate_degree`` (all-reduce) with the ``partial_dtensor`` backend;
* torchtitan calls ``torch.distributed.set_timeout``, which torch 2.13 does not have yet;
* torchtitan imports triton at import time (kernels for MoE and fused ops, which the debug
  model never runs); CUDA builds of torch bring triton, the CPU build does not: where it is
  missing, those torchtitan modules (and only they) are replaced by stand-ins.

Every rank appends, per batch it delivers, ``{"start", "rank", "world_size", "input"}`` to
``<out>/stream-<tag>-rank<r>.jsonl`` (``start``: the stream position of the global batch);
rank 0 writes the final parameters to ``<out>/params-<tag>.pt``.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import re
import signal
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed.distributed_c10d as c10d


class _Anything:
    """CPU: stands for every name of a stubbed kernel module (decorators, dtypes, functions)."""

    def __getattr__(self, name: str) -> _Anything:
        return _any_name(name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _Anything()


def _any_name(name: str) -> _Anything:
    if name.startswith("__"):  # inspect and pickle ask modules for __file__ & co.: they have none
        raise AttributeError(name)
    return _Anything()


class _TritonKernelStubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """CPU: torchtitan modules that import triton (GPU kernels for MoE, fused ops; the debug model
    runs none of them) are replaced by stand-ins, so torchtitan imports without triton, which the
    CPU build of torch lacks. torch itself still finds no triton."""

    _IMPORTS_TRITON = re.compile(rb"^\s*(import|from) triton\b", re.MULTILINE)

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if not name.startswith("torchtitan."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            return None
        with open(spec.origin, "rb") as f:
            if not self._IMPORTS_TRITON.search(f.read()):
                return None
        return importlib.machinery.ModuleSpec(name, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__getattr__ = _any_name  # type: ignore[method-assign]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


if importlib.util.find_spec("triton") is None:
    sys.meta_path.insert(0, _TritonKernelStubs())

import torchtitan.tools.utils as titan_utils  # noqa: E402

# CPU: before any torchtitan module copies device_type / device_module at its import.
_CPU = types.SimpleNamespace(
    set_device=lambda device: None,
    device_count=lambda: 1,
    current_device=lambda: 0,
    synchronize=lambda *args: None,
    get_device_name=lambda device=None: "cpu",
    get_device_properties=lambda device=None: types.SimpleNamespace(name="cpu", total_memory=2**30),
    reset_peak_memory_stats=lambda *args: None,
    empty_cache=lambda: None,
    memory_stats=lambda *args: {},
)
titan_utils.device_type, titan_utils.device_module = "cpu", _CPU
if not hasattr(torch.distributed, "set_timeout"):  # CPU (torch 2.13): the private equivalent

    def _set_timeout(timeout: timedelta, group: Any = None) -> None:
        c10d._set_pg_timeout(timeout, group)

    torch.distributed.set_timeout = _set_timeout  # type: ignore[attr-defined]

from torch.distributed.tensor import DTensor  # noqa: E402
from torchtitan.components.tokenizer import BaseTokenizer  # noqa: E402
from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention  # noqa: E402
from torchtitan.models.llama3.config_registry import llama3_debugmodel  # noqa: E402
from torchtitan.tools.logging import init_logger  # noqa: E402
from torchtitan.trainer import Trainer  # noqa: E402

from ferry.client.integrations.torchtitan import FerryDataLoader  # noqa: E402


class PretokenizedData(BaseTokenizer):
    """The dataset is tokenized already: torchtitan's Trainer still builds a tokenizer, this one."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseTokenizer.Config):
        vocab_size: int = 2048

    def __init__(self, config: Config, *, tokenizer_path: str = "") -> None:
        super().__init__()
        self.vocab_size = config.vocab_size

    def encode(self, *args: Any, **kwargs: Any) -> list[int]:
        raise NotImplementedError("pre-tokenized data")

    def decode(self, *args: Any, **kwargs: Any) -> str:
        raise NotImplementedError("pre-tokenized data")

    def get_vocab_size(self) -> int:
        return self.vocab_size


class RecordingLoader(FerryDataLoader):
    """``FerryDataLoader`` that writes down every batch it hands to the trainer."""

    @dataclass(kw_only=True, slots=True)
    class Config(FerryDataLoader.Config):
        record: str = ""

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        g = self.loader.global_batch_size
        with open(self.config.record, "a") as out:
            for inputs, labels in super().__iter__():
                start = self.loader.position - g  # the loader counts the batch as delivered before yielding it
                rec = {"start": start, "rank": self.dp_rank, "world_size": self.dp_world_size}
                out.write(json.dumps({**rec, "input": inputs["input"].tolist()}) + "\n")
                out.flush()
                yield inputs, labels


class StoppingTrainer(Trainer):
    """Stops after ``stop_after`` steps of a run configured for ``training.steps``, so that the
    learning-rate schedule of an interrupted run is the uninterrupted run's."""

    stop_after: int | None = None

    def should_continue_training(self) -> bool:
        stop = self.config.training.steps if self.stop_after is None else self.stop_after
        return bool(self.step < stop)


def _config(args: argparse.Namespace, world: int, rank: int) -> Trainer.Config:
    cfg = llama3_debugmodel()
    assert cfg.model_spec is not None
    # CPU: FlexAttention has no CPU backward; SDPA is torchtitan's maskless kernel
    for _fqn, _old, parent, attr in list(cfg.model_spec.model.traverse(FlexAttention.Config)):
        if isinstance(parent, list):
            parent[attr] = ScaledDotProductAttention.Config()
        else:
            setattr(parent, attr, ScaledDotProductAttention.Config())
    cfg.tokenizer = PretokenizedData.Config()
    cfg.dataloader = RecordingLoader.Config(
        dataset_path=args.data,
        seed=args.seed,
        num_workers=args.workers,
        record=str(args.out / f"stream-{args.tag}-rank{rank}.jsonl"),
    )
    cfg.dump_folder = str(args.dump)
    cfg.training.seq_len = args.seq_len
    cfg.training.local_batch_size = args.global_batch // world
    cfg.training.steps = args.steps
    cfg.training.disable_cuda_graphs = True
    cfg.validator.enable = False
    cfg.debug.seed = 0  # the same initial weights in every run
    cfg.training.mixed_precision_param = "float32"  # bf16 rounding would differ between DP degrees
    cfg.checkpoint.enable = True
    cfg.checkpoint.interval = args.stop_after or args.steps
    cfg.checkpoint.last_save_model_only = False
    # CPU: replicate (all-reduce) instead of FSDP2's PREMUL_SUM reduce-scatter, which gloo lacks
    cfg.parallelism.spmd_backend = "partial_dtensor"
    cfg.parallelism.data_parallel_shard_degree = 1
    cfg.parallelism.data_parallel_replicate_degree = world
    return cfg


def _dump_params(trainer: Trainer, path: Path, rank: int) -> None:
    params: dict[str, torch.Tensor] = {}
    for name, p in trainer.model_parts[0].named_parameters():
        full = p.full_tensor() if isinstance(p, DTensor) else p  # a collective: every rank calls it
        params[name] = full.detach().clone()
    if rank == 0:
        torch.save(params, path)


def main() -> int:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks for stacks when a run hangs
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--dump", required=True, type=Path, help="torchtitan's dump folder (holds checkpoint/)")
    ap.add_argument("--tag", required=True)
    ap.add_argument("--steps", type=int, required=True, help="total steps of the whole run")
    ap.add_argument("--stop-after", type=int, default=None, help="checkpoint after this many steps and exit")
    ap.add_argument("--global-batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--workers", type=int, default=0)
    args = ap.parse_args()

    init_logger()
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    if args.global_batch % world:
        raise SystemExit(f"global batch {args.global_batch} does not split over {world} ranks")
    StoppingTrainer.stop_after = args.stop_after
    trainer = StoppingTrainer(_config(args, world, rank))
    try:
        trainer.train()
        _dump_params(trainer, args.out / f"params-{args.tag}.pt", rank)
    finally:
        trainer.close()
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    # As in dcp_train.py: leave without destructors (gloo's teardown can deadlock at exit).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
