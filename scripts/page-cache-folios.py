#!/usr/bin/env python3
"""The sizes of the page-cache folios holding a file, as a histogram.

Usage (root, for /proc/kpageflags): scripts/page-cache-folios.py FILE

Maps FILE privately (reading each page maps the cached folio without
copying it; pages not cached are read in first), then looks up each
page's frame in /proc/self/pagemap and its compound-head/tail flags in
/proc/kpageflags. Used to show that Linux 6.18 caches files of a FUSE
mount in 4 KiB folios only, where ext4 uses folios up to 2 MiB
(docs/bench/history/2026-11-23-small-files-and-page-cache-modes.md).
"""
import collections
import ctypes
import mmap
import os
import struct
import sys

PAGE_BYTES = 4096
COMPOUND_HEAD, COMPOUND_TAIL = 15, 16

fd = os.open(sys.argv[1], os.O_RDONLY)
size = os.fstat(fd).st_size
pages = size // PAGE_BYTES
mapping = mmap.mmap(fd, pages * PAGE_BYTES, flags=mmap.MAP_PRIVATE,
                    prot=mmap.PROT_READ | mmap.PROT_WRITE)
address = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
for page in range(pages):
    mapping[page * PAGE_BYTES]
with open('/proc/self/pagemap', 'rb') as pagemap, open('/proc/kpageflags', 'rb') as kpageflags:
    pagemap.seek(address // PAGE_BYTES * 8)
    entries = struct.unpack(f'{pages}Q', pagemap.read(8 * pages))
    folios = collections.Counter()
    run = 0
    for entry in entries:
        if not entry >> 63:
            continue
        kpageflags.seek((entry & ((1 << 55) - 1)) * 8)
        flags = struct.unpack('Q', kpageflags.read(8))[0]
        if flags >> COMPOUND_TAIL & 1:
            run += 1
            continue
        if run:
            folios[run * PAGE_BYTES] += 1
        run = 1
    if run:
        folios[run * PAGE_BYTES] += 1
for folio_bytes, count in sorted(folios.items()):
    print(f'{folio_bytes // 1024:>6} KiB folios: {count}')
