#!/usr/bin/env python3
"""Compares the SASS of two builds kernel by kernel, for refactors that must not change the code
the GPU runs (docs/DEVELOPING.md, "Kernel changes").

    scripts/sass_diff.py OLD NEW [--rename OLD_NS=NEW_NS ...]

OLD and NEW are build folders (their libmxq.a or libmxq.so is read: the objects the library
links, not stale ones a folder may still hold) or files of `cuobjdump -sass` output. Kernels are matched by demangled name (after the renames, e.g. mxq::moe::cuda=mxq::moe::gpu
when a namespace moved); instructions are compared without addresses and encodings. Prints one line
per kernel: same, DIFFERENT (with the instruction counts), only-old or only-new; exits 1 when any
kernel differs or is missing. Needs cuobjdump and c++filt on PATH (cuobjdump: the CUDA toolkit, or
the nvidia-cuda-cuobjdump wheel).
"""
import argparse
import pathlib
import re
import subprocess
import sys

FUNCTION = re.compile(r"^\s*Function : (\S+)")
INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s*(.*?)\s*;?\s*(/\*.*\*/)?\s*$")


def sass_text(source: pathlib.Path) -> str:
    if source.is_file() and source.suffix not in (".a", ".so"):
        return source.read_text()
    library = source
    if source.is_dir():
        found = [source / name for name in ("libmxq.a", "libmxq.so") if (source / name).exists()]
        if not found:
            sys.exit(f"sass_diff: no libmxq.a or libmxq.so in {source}")
        library = found[0]
    return subprocess.run(["cuobjdump", "-sass", str(library)], check=True, capture_output=True,
                          text=True).stdout


def kernels(text: str, renames: list[tuple[str, str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    name = None
    for line in text.splitlines():
        m = FUNCTION.match(line)
        if m:
            name = m.group(1)
            out[name] = []
            continue
        m = INSTRUCTION.match(line)
        if name is not None and m and m.group(1):
            out[name].append(m.group(1))
    mangled = list(out)
    demangled = subprocess.run(["c++filt"], input="\n".join(mangled), check=True,
                               capture_output=True, text=True).stdout.splitlines()
    result = {}
    for raw, pretty in zip(mangled, demangled):
        for old, new in renames:
            pretty = pretty.replace(old, new)
        # Branch targets are addresses: keep the instruction, drop the number.
        result[pretty] = [re.sub(r"0x[0-9a-f]+", "0x?", i) for i in out[raw]]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", type=pathlib.Path)
    parser.add_argument("new", type=pathlib.Path)
    parser.add_argument("--rename", action="append", default=[], metavar="OLD=NEW",
                        help="namespace or name renamed between the builds (repeatable)")
    args = parser.parse_args()
    renames = [tuple(r.split("=", 1)) for r in args.rename]
    old = kernels(sass_text(args.old), renames)
    new = kernels(sass_text(args.new), renames)
    bad = 0
    for name in sorted(set(old) | set(new)):
        if name not in new:
            print(f"only-old   {name}")
            bad += 1
        elif name not in old:
            print(f"only-new   {name}")
            bad += 1
        elif old[name] == new[name]:
            print(f"same       {name} ({len(old[name])} instructions)")
        else:
            print(f"DIFFERENT  {name} ({len(old[name])} -> {len(new[name])} instructions)")
            bad += 1
    print(f"sass_diff: {len(set(old) & set(new))} kernels in both, {bad} differ or are missing")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
