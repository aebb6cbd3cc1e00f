"""Run in a child process by tests/test_host_loading.py: a Llama read from its files in place, through one text
stage with its weights in the files, then kept in RAM, then given back; prints the RSS at each point (JSON).

    python -m tests.host_rss_child <folder with the saved Llama>
"""
from __future__ import annotations

import json
import sys


def main(folder: str) -> None:
    import rocm

    rocm.configure_host_heap()
    import torch
    from transformers import LlamaModel

    from configs.memory import MEMORY
    from memory.hostbudget import process_overhead, rss_breakdown
    from memory.hostpack import HostPack
    from memory.hostplan import StageUse
    from memory.loader import load_from_files
    from memory.manager import MemoryManager
    from pipeline.text import encode_llama
    from pipeline.tiny import build_llama_tokenizer

    out: dict = {}

    def snap(label: str) -> None:
        rocm.trim(label, host=True)
        out[label] = rss_breakdown()

    # two stages, each with a model of the same size: a budget with room for one stage's model at a time keeps
    # both in the files (a CPU stage reads its model into a buffer for the stage)
    stages = [StageUse("text encoders", ("text_encoder",), "job"), StageUse("other", ("other",), "job")]
    tokenizer = build_llama_tokenizer()
    snap("start")
    model = load_from_files(LlamaModel, folder, torch.float32)
    other = load_from_files(LlamaModel, folder, torch.float32)
    pack = HostPack.of(model)
    out["model_bytes"] = pack.nbytes
    snap("loaded")
    overhead = process_overhead(0)
    tight = (overhead + MEMORY.host_reserve_gb * 2**30 + pack.nbytes + (1 << 16)) / 2**30
    models = {"text_encoder": model, "other": other}
    files = MemoryManager(device="cpu", host_ram_gb=tight, host_overhead=overhead)
    files.arrange_host(models, stages)
    out["homes_tight"] = files.host_plan.as_dict()["homes"]["text_encoder"]
    snap("arranged in the files")
    with files.stage("text encoders", text_encoder=model):
        encode_llama(tokenizer, model, "a cat on a windowsill", 5, "cpu")
        out["in the stage"] = rss_breakdown()
    snap("after the stage")
    roomy = MemoryManager(device="cpu", host_ram_gb=64, host_overhead=overhead)
    roomy.arrange_host({"text_encoder": model}, stages[:1])
    out["homes_roomy"] = roomy.host_plan.as_dict()["homes"]["text_encoder"]
    snap("kept in RAM")
    files.arrange_host(models, stages)
    snap("given back")
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
