#!/usr/bin/env python3
"""Writes a safetensors file with the Python standard library only (struct + json), as an
independent writer for typegrad's reader. The values are simple formulas the C++ test recomputes,
all exactly representable in their dtypes."""
import json
import struct
import sys

def bf16(x):
    # x is exactly representable in bf16: the high half of its float32 bits.
    return struct.pack("<I", struct.unpack("<I", struct.pack("<f", x))[0])[2:]

tensors = [
    ("fc1.W", "F32", [2, 3], struct.pack("<6f", *[i * 0.25 - 3 for i in range(6)])),
    ("fc1.b", "F64", [3], struct.pack("<3d", *[1.0 / (i + 1) for i in range(3)])),
    ("half", "F16", [4], struct.pack("<4e", 0.5, -2.0, 65504.0, 0.333251953125)),
    ("brain", "BF16", [2], bf16(1.5) + bf16(-0.15625)),
]
header, data = {"__metadata__": {"format": "pt"}}, b""
for name, dtype, shape, raw in tensors:
    header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
    data += raw
text = json.dumps(header).encode()
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + data)
