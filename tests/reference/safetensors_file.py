"""The safetensors writer the reference scripts share, written by hand (JSON header plus raw
bytes) so that only torch is needed."""

import json
import struct

import torch

DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.int64: "I64"}


def write_safetensors(path, tensors, sort_names=False, separators=None):
    """Write `tensors` (name -> tensor) to `path`, in sorted name order when `sort_names`, else
    in the dict's; `separators` goes to json.dumps for the header."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors) if sort_names else tensors:
        t = tensors[name].detach().contiguous().cpu()
        data = t.numpy().tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=separators).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)
