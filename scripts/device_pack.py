#!/usr/bin/env python3
"""Packs what a lent GPU wrote into the few files a device call brings back.

A device call returns at most 8 files of at most 16 MiB each (64 MiB together), no deeper
than two folders. This packs files (paths relative to --root, in the order given: most
wanted first) into xz-compressed tar archives NAME.tar.xz, NAME-2.tar.xz, ... under --out,
each under --max-bytes, and stops before --out would hold more than --max-files files or
--max-total bytes; whatever does not fit is named on stdout, never dropped silently.
Unpack at the repository root with `tar -xJf NAME.tar.xz`.

    python3 scripts/device_pack.py --root WORK --out "$OUT" --name gpu-check fixtures/gpu-check
"""

import argparse
import io
import lzma
import os
import sys
import tarfile

MIB = 1 << 20


def files_under(root, paths):
    """Every file under each of `paths` (relative to `root`), in the order given, each
    folder's files sorted; a path that does not exist is reported."""
    out = []
    for p in paths:
        full = os.path.join(root, p)
        if os.path.isfile(full):
            out.append(p)
        elif os.path.isdir(full):
            for dirpath, dirnames, filenames in os.walk(full):
                dirnames.sort()
                for f in sorted(filenames):
                    out.append(os.path.relpath(os.path.join(dirpath, f), root))
        else:
            print(f"pack: {p}: nothing there", file=sys.stderr)
    return out


def packed_size(root, names):
    """The size of `names` as one xz-compressed tar archive, and its bytes (xz's level 3:
    on memory snapshots it packs as small as level 6, four times faster)."""
    buf = io.BytesIO()
    with lzma.open(buf, "wb", preset=3) as xz, tarfile.open(fileobj=xz, mode="w") as tar:
        for n in names:
            tar.add(os.path.join(root, n), arcname=n)
    data = buf.getvalue()
    return len(data), data


def existing(out):
    """The files already in `out` and their bytes together."""
    names = [n for n in os.listdir(out) if os.path.isfile(os.path.join(out, n))]
    return len(names), sum(os.path.getsize(os.path.join(out, n)) for n in names)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True, help="the folder the paths are relative to")
    ap.add_argument("--out", required=True, help="where the archives are written ($OUT)")
    ap.add_argument("--name", required=True, help="the archives' name")
    ap.add_argument("--max-bytes", type=int, default=15 * MIB,
                    help="the largest archive (default 15 MiB, under the call's 16 MiB)")
    ap.add_argument("--max-files", type=int, default=7,
                    help="the most files --out may hold (default 7: one is kept for the log)")
    ap.add_argument("--max-total", type=int, default=60 * MIB,
                    help="the most bytes --out may hold together (default 60 MiB of 64)")
    ap.add_argument("paths", nargs="+")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    pending = files_under(args.root, args.paths)
    if not pending:
        print(f"pack {args.name}: no files", file=sys.stderr)
        return 1
    # each file's size compressed alone: one pass over everything
    alone = {n: packed_size(args.root, [n])[0] for n in pending}
    part = 1
    left_out = []
    while pending:
        count, total = existing(args.out)
        room = min(args.max_bytes, args.max_total - total)
        if count >= args.max_files or room <= 0:
            left_out = pending
            break
        # the longest prefix of `pending` whose files, each compressed alone, fit in
        # `room`; packed together they are about as small, checked once and shrunk if not
        group, total_alone = [], 0
        for n in pending:
            total_alone += alone[n]
            if total_alone > room and group:
                break
            group.append(n)
        data = b""
        while group:
            size, data = packed_size(args.root, group)
            if size <= room:
                break
            group = group[:-1]
        if not group:
            left_out.append(pending.pop(0))
            continue
        name = args.name if part == 1 else f"{args.name}-{part}"
        # written whole, then renamed: a call cut short brings back no half archive
        path = os.path.join(args.out, f"{name}.tar.xz")
        with open(path + ".part", "wb") as f:
            f.write(data)
        os.replace(path + ".part", path)
        print(f"pack {name}.tar.xz: {len(group)} files, {len(data)} B")
        pending = pending[len(group):]
        part += 1
    for n in left_out:
        print(f"pack {args.name}: LEFT OUT {n} (no room in what the call brings back)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
