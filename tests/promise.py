"""The input promise, as helpers the input tests share: bad input is one line naming the file and the
field, exit code 2, no traceback, nothing written; anything else is a valid result.

Also small valid documents (scenario, Hugging Face config, profile) for tests to break one field at a
time, and the hostile values they put there.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import shutil
import tempfile
import threading
from pathlib import Path

import yaml

from .conftest import REPO

TINY_CONFIG = REPO / "scenarios" / "models" / "tiny-qwen2.json"


def files_under(root: Path) -> set[str]:
    """Every file and folder under `root` (hidden ones too), relative."""
    out = set()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            out.add(str(Path(dirpath, name).relative_to(root)))
    return out


def assert_refused(res, *fragments: str) -> str:
    """Exit 2, exactly one line on stderr holding every fragment (file, field), no traceback."""
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2, f"exit {res.returncode}: {res.stderr[-2000:]}"
    assert "Traceback" not in res.stderr and len(lines) == 1, res.stderr[-2000:]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def assert_error_line(err, *fragments: str) -> str:
    line = err.line()
    assert "\n" not in line and line.strip(), repr(line)
    for fragment in fragments:
        assert fragment in line, (fragment, line)
    return line


def tiny_scenario(hf_config: str | Path = TINY_CONFIG) -> dict:
    """A scenario that simulates in milliseconds (a 4-layer model, 1 x 16 tokens)."""
    return {
        "name": "tiny",
        "model": {"hf_config": str(hf_config), "weight_dtype": "bf16", "kv_dtype": "bf16"},
        "hardware": {"gpu": "h200-sxm", "efficiency": {"layer_overhead_s": 1e-6}},
        "workload": {"batch_size": 2, "prompt_tokens": 8, "reasoning_tokens": {"dist": "uniform", "min": 8, "max": 16},
                     "seed": 1},
        "policy": {"kind": "tiered", "hbm_ratio": 0.5, "evict_ratio": 0.1, "retier_interval": 4, "recent_window": 4,
                   "sink_tokens": 2, "importance": {"gamma_shape": 0.1, "gamma_power": 0.25, "drift": 0.0}},
        "sim": {"detail": "layer", "step_stride": 1, "max_batch_limit": 4},
    }


def tiny_hf_config() -> dict:
    return json.loads(TINY_CONFIG.read_text())


def tiny_profile() -> dict:
    """A small but complete measured profile (every section the simulator reads)."""
    def curve(direction: str, memory: str) -> dict:
        return {"direction": direction, "memory": memory,
                "points": [{"size_bytes": 2**20, "time_s": 1e-4, "bytes_per_s": 1.0e10},
                           {"size_bytes": 2**24, "time_s": 1.6e-3, "bytes_per_s": 1.05e10}],
                "fit_per_copy_latency_s": 1e-5, "fit_bytes_per_s": 1.1e10}

    return {
        "schema_version": 1, "device": "cuda", "device_name": "NVIDIA H200", "machine": "test",
        "created_utc": "2025-01-01T00:00:00Z", "device_memory_bytes": 1.4e11, "device_memory_free_bytes": 1.3e11,
        "host_memory_bytes": 1.0e12, "copy_engines": 2,
        "link": {"curves": [curve(d, m) for d in ("h2d", "d2h") for m in ("pinned", "pageable")],
                 "bidirectional_h2d_bytes_per_s": 1.0e10, "bidirectional_d2h_bytes_per_s": 1.0e10,
                 "host_pack_bytes_per_s": 5.0e9},
        "compute": {"device_copy_bytes_per_s": 4.0e12, "weight_hbm_bytes_per_s": {"bf16": 4.0e12},
                    "weight_kernel_bytes_per_s_by_rows": {"bf16": [[1, 3.0e12], [8, 3.5e12]]},
                    "weight_kernels": {"bf16": "torch.mm"}, "attention_hbm_bytes_per_s": 3.0e12,
                    "attention_latency_s": 1e-5, "peak_flop_per_s": {"bf16": 8.0e14},
                    "gemm_flop_per_s_by_rows": [[1, 1.0e13], [64, 5.0e14]], "layer_overhead_s": 1e-6,
                    "kernel_launch_s": 5e-6, "step_overheads": {"none": {"layer_s": 1e-5, "step_s": 1e-4}}},
    }


def leaf_paths(tree, prefix: tuple = ()) -> list[tuple]:
    """Paths of every value in a document (mappings and lists included), the root excluded."""
    out = []
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else []
    for key, value in items:
        out.append((*prefix, key))
        out += leaf_paths(value, (*prefix, key))
    return out


def with_value(tree, path: tuple, value, *, delete: bool = False):
    """A deep copy of `tree` with the value at `path` replaced (or deleted)."""
    out = copy.deepcopy(tree)
    node = out
    for key in path[:-1]:
        node = node[key]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return out


def field_name(path: tuple) -> str:
    return ".".join(str(p) for p in path)


# Values every numeric field is given: negative, zero, NaN, infinities, huge, and the wrong type.
HOSTILE_VALUES = [0, -1, -7, 1, 3, 10**9, -(10**9), 2**63, 10**30, 0.0, -0.5, 0.5, 1.5, 1e308, -1e308, 1e-300, 5e-324,
                  math.nan, math.inf, -math.inf, True, False, None, "", "1", "abc", "1e3", ".inf", [], [1, 2], {},
                  {"a": 1}]


def dump_yaml(tree) -> str:
    return yaml.safe_dump(tree, sort_keys=False, allow_unicode=True)


def tiny_serving_scenario(hf_config: str | Path = TINY_CONFIG) -> dict:
    """A serving scenario that simulates in milliseconds: the tiny model, 12 Poisson arrivals of
    16-token prompts and 4-16-token outputs, step detail."""
    return {
        "name": "tiny-serving",
        "model": {"hf_config": str(hf_config), "weight_dtype": "bf16", "kv_dtype": "bf16"},
        "hardware": {"gpu": "h100-sxm"},
        "workload": {"prompt_tokens": 16, "reasoning_tokens": {"dist": "uniform", "min": 4, "max": 16}, "seed": 1,
                     "arrivals": {"kind": "poisson", "rate_per_s": 50.0, "requests": 12}},
        "scheduler": {"max_num_seqs": 8, "max_num_batched_tokens": 256},
        "slo": {"ttft_ms": 100, "tpot_ms": 10},
        "policy": {"kind": "full_hbm"},
        "sim": {"detail": "step"},
    }


@contextlib.contextmanager
def fifo(path: Path, payload: bytes = b"payload from a FIFO\n"):
    """A FIFO at `path` (os.mkfifo) that cannot hang the test using it; yields an Event set once
    anything opened it for reading. The code under test must refuse it by its type before opening
    it; if it opened it instead, a thread holding the write end hands it `payload` and end of file,
    so the test fails on what the code said (and on the Event) rather than blocking. On exit the
    thread, still waiting for a reader, is released by opening the read end here, through a hard
    link kept outside the test's folder (the code may have replaced `path` meanwhile)."""
    os.mkfifo(path)
    keep = Path(tempfile.mkdtemp(prefix="kvtier-fifo-")) / "fifo"
    try:
        os.link(path, keep)
    except OSError:  # another file system: `path` itself releases it
        keep = path
    opened = threading.Event()

    def feed() -> None:
        fd = os.open(keep, os.O_WRONLY)  # returns once a reader has opened the FIFO
        opened.set()
        try:
            os.write(fd, payload)
        except BrokenPipeError:
            pass
        finally:
            os.close(fd)

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    try:
        yield opened
    finally:
        reader = os.open(keep, os.O_RDONLY | os.O_NONBLOCK)  # a reader: the writer's open returns
        writer.join()
        os.close(reader)
        if keep != path:
            shutil.rmtree(keep.parent, ignore_errors=True)
