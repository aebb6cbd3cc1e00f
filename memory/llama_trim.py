"""The Llama cut down to what the text stage uses: without its last LLAMA_SKIP_LAYERS decoder layers and its final
norm, and (weights in files) with a token embedding that reads only the rows of the tokens it is given.

The text stage takes the hidden state three from the end (`hidden_states[-3]`, pipeline/text.py): the last two
layers and the norm are computed and thrown away, and of the 128320 x 4096 token embedding (1.05 GB in float16) it
needs the rows of the ~350 tokens of a templated prompt. Dropping the layers changes no bit: the output of the last
kept layer is the very tensor transformers records as that hidden state (its output hook captures each decoder
layer's output), and the layers before it compute exactly as before. Reading embedding rows gives the same values as
the full table: a lookup copies rows, and the rows are converted to the model's dtype as the chunk loader converts a
whole tensor (memory/chunk.py).

`trim_llama` runs before the host pack is made (memory/loader.py `prepare`, pipeline/tiny.py), so the dropped layers
and the embedding are no chunks: never read from disk, never in host RAM, never in a host or residency plan.
"""
from __future__ import annotations

import logging

import torch
from torch import nn

from memory.hostpack import _ATTR as PACK_ATTR
from memory.weightfiles import TensorSource, WeightFiles

log = logging.getLogger(__name__)

EMBED_NAME = "embed_tokens.weight"
LLAMA_SKIP_LAYERS = 2          # the text stage takes hidden_states[-(2 + 1)] (pipeline/text.py)
TRIMMED_ATTR = "steadyframe_trimmed"     # set on a Llama without its last LLAMA_SKIP_LAYERS layers and final norm


class FileEmbedding(nn.Module):
    """A token embedding with no parameters: the rows of the tokens asked for, read from the weight file.

    Each distinct token is read once (consecutive ids in one read), converted to `dtype` on the CPU exactly as the
    chunk loader converts a tensor whose file dtype differs (same dtype: the raw bytes), and the result is put on the
    ids' device. `bytes_read` counts the bytes read from the file, for the logs and the tests.
    """

    def __init__(self, source: TensorSource, dtype: torch.dtype):
        super().__init__()
        if len(source.shape) != 2:
            raise ValueError(f"{source.name}: an embedding table has two dimensions, not {source.shape}")
        self.source = source
        self.weight_dtype = dtype
        self.num_embeddings, self.embedding_dim = source.shape
        self.bytes_read = 0

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, dtype={self.weight_dtype}, from {self.source.file.path}"

    def _read_rows(self, ids: list[int]) -> torch.Tensor:
        """The rows of the sorted distinct `ids`, in the file's dtype, on the CPU."""
        src = self.source
        row = self.embedding_dim * src.dtype.itemsize
        raw = torch.empty((len(ids), row), dtype=torch.uint8)
        start = 0
        for i in range(1, len(ids) + 1):             # one pread per run of consecutive ids
            if i == len(ids) or ids[i] != ids[i - 1] + 1:
                src.file.read_into(raw[start:i].view(-1), src.offset + ids[start] * row, threads=1)
                start = i
        self.bytes_read += raw.numel()
        return raw.view(src.dtype).view(len(ids), self.embedding_dim)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        ids = input_ids.detach().to("cpu", torch.int64)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.num_embeddings):
            raise IndexError(f"token id out of range: the embedding has {self.num_embeddings} rows")
        unique, inverse = torch.unique(ids, sorted=True, return_inverse=True)
        rows = self._read_rows(unique.tolist())
        if rows.dtype != self.weight_dtype:
            rows = rows.to(self.weight_dtype)
        device = input_ids.device
        return rows.to(device)[inverse.to(device)]


def trim_llama(model: nn.Module, rows_from_files: WeightFiles | None = None) -> nn.Module:
    """Drop the last LLAMA_SKIP_LAYERS decoder layers and the final norm of a transformers `LlamaModel` (in place);
    with `rows_from_files` (the model's weight files), also replace its embedding by a `FileEmbedding`.

    The model's `last_hidden_state` is then the hidden state pipeline/text.py `encode_llama` takes. Call it before the
    model's host pack exists: the pack is made of the modules the model has then. A model trimmed already is left as
    it is."""
    if getattr(model, TRIMMED_ATTR, False):
        return model
    n = len(model.layers)
    if n <= LLAMA_SKIP_LAYERS:
        raise ValueError(f"{type(model).__name__}: {n} decoder layer(s); the text stage needs more than "
                         f"{LLAMA_SKIP_LAYERS}")
    if PACK_ATTR in model.__dict__:
        raise RuntimeError(f"{type(model).__name__}: trim it before its host pack is made")
    model.layers = nn.ModuleList(model.layers[:n - LLAMA_SKIP_LAYERS])
    model.config.num_hidden_layers = n - LLAMA_SKIP_LAYERS
    model.norm = nn.Identity()
    if rows_from_files is not None:
        src = rows_from_files.tensors.get(EMBED_NAME)
        table = model.embed_tokens.weight
        if src is None or tuple(src.shape) != tuple(table.shape):
            raise ValueError(f"{rows_from_files.folder}: {EMBED_NAME} is not in the files with shape "
                             f"{tuple(table.shape)}")
        model.embed_tokens = FileEmbedding(src, table.dtype)
    setattr(model, TRIMMED_ATTR, True)
    log.debug("%s: trimmed to %d decoder layers%s", type(model).__name__, n - LLAMA_SKIP_LAYERS,
              ", embedding rows read from the files" if rows_from_files is not None else "")
    return model
