#!/usr/bin/python3
"""ctest nccl_symbols: weft's libnccl.so.2 has NCCL's whole host API.

Usage: check_symbols.py NCCL_H LIBRARY [NM] [READELF]

Every function nccl.h declares (a return type of ncclResult_t or const char*,
name nccl* or pncclX) must be a defined dynamic symbol of LIBRARY, and so must
its pncclX alias (NCCL exports both: a profiler interposes ncclX and calls
pncclX). The SONAME must be libnccl.so.2, so programs linked with -lnccl
against it need libnccl.so.2 as the real NCCL's do. Fails naming every
missing symbol.
"""
import re
import subprocess
import sys


def declared_functions(header_text):
    # Comments out, then every "ncclResult_t name(" / "const char* name(".
    text = re.sub(r"/\*.*?\*/", " ", header_text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    pat = re.compile(r"(?:ncclResult_t|const\s+char\s*\*)\s*(p?nccl[A-Za-z0-9_]*)\s*\(")
    return sorted(set(pat.findall(text)))


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    header, lib = sys.argv[1], sys.argv[2]
    nm = sys.argv[3] if len(sys.argv) > 3 else "nm"
    readelf = sys.argv[4] if len(sys.argv) > 4 else "readelf"
    with open(header) as f:
        names = declared_functions(f.read())
    base = sorted({n[1:] if n.startswith("pnccl") else n for n in names})
    if len(base) < 30:
        print(f"FAIL: only {len(base)} functions parsed from {header}: the parser is broken")
        return 1
    wanted = sorted(set(base) | {"p" + n for n in base})

    out = subprocess.run([nm, "-D", "--defined-only", lib], capture_output=True, text=True)
    if out.returncode != 0:
        print(f"FAIL: {nm} -D --defined-only {lib}: {out.stderr.strip()}")
        return 1
    defined = set()
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] in "TtWwiV":
            defined.add(parts[2].split("@")[0])
    missing = [n for n in wanted if n not in defined]

    ok = True
    print(f"{len(base)} functions declared in {header}; {len(wanted)} symbols wanted (with pnccl aliases)")
    if missing:
        ok = False
        print(f"FAIL: {len(missing)} symbols missing from {lib}:")
        for n in missing:
            print(f"  missing: {n}")

    out = subprocess.run([readelf, "-d", lib], capture_output=True, text=True)
    m = re.search(r"\(SONAME\)\s+Library soname: \[([^\]]*)\]", out.stdout)
    soname = m.group(1) if m else None
    if soname != "libnccl.so.2":
        ok = False
        print(f"FAIL: SONAME of {lib}: expected libnccl.so.2, got {soname}")
    else:
        print("SONAME libnccl.so.2")
    if ok:
        print("all symbols present")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
