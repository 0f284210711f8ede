#!/usr/bin/env python3
"""Writes the seed corpus for the fuzz targets (tests/fuzz/corpus/<target>/), built from the
format specifications with the standard library only. Re-run after changing a seed."""
import json
import pathlib
import struct

HERE = pathlib.Path(__file__).resolve().parent


def safetensors(tensors, metadata=None):
    """tensors: list of (name, dtype, shape, data bytes), laid out in the given order."""
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, payload in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def npy(descr, shape, payload, version=1):
    shape_text = "(" + ", ".join(str(n) for n in shape) + ("," if len(shape) == 1 else "") + ")"
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape_text)
    length_format = "<H" if version == 1 else "<I"
    prefix = 6 + 2 + struct.calcsize(length_format)
    header += " " * (63 - (prefix + len(header)) % 64) + "\n"
    return (b"\x93NUMPY" + bytes([version, 0]) + struct.pack(length_format, len(header))
            + header.encode() + payload)


def main():
    seeds = {
        "safetensors": {
            "empty": safetensors([]),
            "two_tensors": safetensors(
                [("w", "F32", [2, 3], struct.pack("<6f", 1, 2, 3, 4, 5, 6)),
                 ("b", "U8", [3], b"\x01\x02\x03")], {"format": "pt"}),
            "every_dtype": safetensors(
                [("i64", "I64", [1], struct.pack("<q", -1)),
                 ("f32", "F32", [1], struct.pack("<f", 0.5)),
                 ("i32", "I32", [1], struct.pack("<i", 7)),
                 ("bf16", "BF16", [1], b"\x80\x3f"),
                 ("f16", "F16", [1], b"\x00\x3c"),
                 ("u8", "U8", [1], b"\xff"),
                 ("i8", "I8", [1], b"\x80"),
                 ("e4m3", "F8_E4M3", [1], b"\x38"),
                 ("e8m0", "F8_E8M0", [1], b"\x7f"),
                 ("bool", "BOOL", [1], b"\x01")]),
            "zero_size": safetensors([("z", "F32", [0, 4], b""), ("s", "I32", [], b"\x05\0\0\0")]),
        },
        "npy": {
            "f32_2x3": npy("<f4", [2, 3], struct.pack("<6f", 1, 2, 3, 4, 5, 6)),
            "u8_scalar": npy("|u1", [], b"\x2a"),
            "i64_v2": npy("<i8", [2], struct.pack("<2q", 1, -1), version=2),
            "f16_empty_v3": npy("<f2", [0, 3], b"", version=3),
            "i32_vector": npy("<i4", [4], struct.pack("<4i", 1, 2, 3, 4)),
        },
    }
    for target, files in seeds.items():
        folder = HERE / "corpus" / target
        folder.mkdir(parents=True, exist_ok=True)
        for name, content in files.items():
            (folder / name).write_bytes(content)


if __name__ == "__main__":
    main()
