#!/usr/bin/env python3
"""Per-call cost of the foliofs Python module's path calls beside os's own.

Times `Volume.stat`, `Volume.exists` and `Volume.readlink` on a small
directory of a fresh volume, and `os.stat`, `os.path.exists` and
`os.readlink` on the same names in a host temporary directory (cached by the
kernel after the first call), and prints microseconds a call (the best of
--repeat rounds of --calls calls each, in the calling thread's CPU time, so
that a busy machine changes the figures less). Run by hand, not a test,
with the module as users install it (a release build):

    python3 -m venv /tmp/bench-venv
    /tmp/bench-venv/bin/pip install crates/foliofs-py
    /tmp/bench-venv/bin/python scripts/python-bench.py

(scripts/python-tests.sh's target/python-tests/venv holds a dev-profile
build, at opt-level 1: slower on the library's side of each call.)
"""

import argparse
import os
import tempfile
import time
import timeit

import foliofs

FILES = 16


def per_call_us(call, argument, calls, repeat):
    # The calling thread's CPU time (user and system): other processes on a
    # busy machine do not count, the library's own background threads
    # neither.
    timer = timeit.Timer(
        "call(argument)",
        globals={"call": call, "argument": argument},
        timer=time.thread_time,
    )
    return min(timer.repeat(repeat=repeat, number=calls)) / calls * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=200_000, help="calls a round")
    parser.add_argument("--repeat", type=int, default=5, help="rounds; the best counts")
    parser.add_argument("--options", default=None, help="volume options (mount -o)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        image = os.path.join(tmp, "vol.img")
        host = os.path.join(tmp, "host")
        foliofs.mkfs(image, 64 << 20)
        os.mkdir(host)
        with foliofs.Volume(image, args.options) as volume:
            # A small directory: a few files and a symlink, on both sides.
            volume.mkdir("/d")
            for index in range(FILES):
                with volume.open(f"/d/f{index}", "wb") as f:
                    f.write(b"x" * 100)
                with open(os.path.join(host, f"f{index}"), "wb") as f:
                    f.write(b"x" * 100)
            name = f"f{FILES // 2}"
            rows = [
                ("stat", volume.stat, f"/d/{name}", os.stat, os.path.join(host, name)),
                ("exists", volume.exists, f"/d/{name}", os.path.exists, os.path.join(host, name)),
            ]
            if hasattr(volume, "symlink"):  # not in modules built before it was
                volume.symlink("f0", "/d/link")
                os.symlink("f0", os.path.join(host, "link"))
                link = os.path.join(host, "link")
                rows.append(("readlink", volume.readlink, "/d/link", os.readlink, link))
            print(f"per call, us of CPU (best of {args.repeat} x {args.calls:,} calls)")
            print(f"{'call':<10} {'foliofs':>9} {'os':>9} {'ratio':>7}")
            for label, ours, our_path, theirs, their_path in rows:
                assert ours(our_path) is not None and theirs(their_path) is not None
                mine = per_call_us(ours, our_path, args.calls, args.repeat)
                host_us = per_call_us(theirs, their_path, args.calls, args.repeat)
                print(f"{label:<10} {mine:>9.3f} {host_us:>9.3f} {mine / host_us:>7.2f}")


if __name__ == "__main__":
    main()
