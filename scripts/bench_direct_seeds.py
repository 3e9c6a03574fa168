#!/usr/bin/env python3
"""Seeds 000, 002 and 003 side by side: foliofs in-process, the same I/O
backend straight on the image file (--raw), fio on the raw backing file, and
fio on kernel ext4 and XFS on loop devices (--direct-io=on) over files on the
same disk. Each configuration runs REPS times, interleaved; the table shows
medians. Run as root from the repository root after `cargo build --release`.

    scripts/bench_direct_seeds.py [--runtime 10] [--reps 3] [--size 1G] [--seeds 000,002,003]
"""
import argparse, os, re, sys

from seedlib import FOLIOFS, Peers, fio_json, lay_out, median_of, run_rows, sh


def foliofs(options, rw, bs, iodepth, numjobs, size, runtime, dsync=False, raw=False):
    command = [FOLIOFS, "-o", options, "bench", "direct", "--rw", rw, "--bs", bs,
               "--iodepth", str(iodepth), "--numjobs", str(numjobs), "--size", size,
               "--runtime", f"{runtime}s"]
    if dsync:
        command.append("--dsync")
    if raw:
        command.append("--raw")
    out = sh(command)
    iops = float(re.search(r"IOPS=(\d+)", out).group(1))
    per_io = re.search(r"requests/io=([\d.]+) \(writes ([\d.]+), reads ([\d.]+), flushes ([\d.]+), fua ([\d.]+)\)", out)
    p99 = float(re.search(r"p99=([\d.]+)", out).group(1))
    return {"iops": iops, "requests_per_io": float(per_io.group(1)), "flushes_per_io": float(per_io.group(4)),
            "fua_per_io": float(per_io.group(5)), "p99_us": p99}


def fio(filename, rw, bs, iodepth, numjobs, size, runtime, dsync=False):
    args = [f"--name=seed", f"--filename={filename}", "--ioengine=io_uring", "--direct=1",
            f"--rw={rw}", f"--bs={bs}", f"--iodepth={iodepth}", f"--numjobs={numjobs}",
            f"--size={size}", f"--runtime={runtime}", "--time_based"]
    if dsync:
        args.append("--sync=dsync")
    job = fio_json(args)
    side = job["write"] if "write" in rw else job["read"]
    return {"iops": side["iops"], "p99_us": side["clat_ns"]["percentile"].get("99.000000", 0) / 1000}


class DirectPeers(Peers):
    """The raw file, and a preallocated fio file on each kernel file system."""

    def __init__(self, size_bytes):
        super().__init__(size_bytes)
        self.files = {}
        for fs, (_, mount) in self.mounts.items():
            target = os.path.join(mount, "fio")
            lay_out(target, size_bytes)
            self.files[fs] = target


def seed_000(args, peers):
    shape = dict(rw="write", bs="2k", iodepth=256, numjobs=8, size=args.size, runtime=args.runtime)
    rows = [
        ("foliofs dio_unaligned=overwrite", lambda: foliofs("dio_unaligned=overwrite", **shape)),
        ("foliofs dio_unaligned=exclusive", lambda: foliofs("dio_unaligned=exclusive", **shape)),
        ("raw backing file (foliofs --raw)", lambda: foliofs("", raw=True, **shape)),
        ("raw backing file (fio io_uring)", lambda: fio(peers.raw, **shape)),
        ("kernel ext4 on loop (fio)", lambda: fio(peers.files["ext4"], **shape)),
        ("kernel XFS on loop (fio)", lambda: fio(peers.files["xfs"], **shape)),
    ]
    results = run_rows(rows, args.reps)
    base = median_of(results["foliofs dio_unaligned=overwrite"])
    print("\n### Seed 000: 2 KiB direct overwrites, 4 KiB blocks, 8 jobs x iodepth 256\n")
    print("| configuration | IOPS | p99 | overwrite / this |")
    print("|---|---|---|---|")
    for label, _ in rows:
        median = median_of(results[label])
        print(f"| {label} | {median:,.0f} | {median_of(results[label], 'p99_us'):,.0f} us | {base / median:.2f} |")


def seed_002(args, peers):
    print("\n### Seed 002: 4k/16k direct reads and writes, 1 job x iodepth 64\n")
    print("| workload | foliofs | raw (--raw) | raw (fio) | ext4 (fio) | XFS (fio) | foliofs / raw | foliofs / ext4 | foliofs / XFS |")
    print("|---|---|---|---|---|---|---|---|---|")
    for rw in ("randread", "randwrite"):
        for bs in ("4k", "16k"):
            shape = dict(rw=rw, bs=bs, iodepth=64, numjobs=1, size=args.size, runtime=args.runtime)
            rows = [
                ("foliofs", lambda shape=shape: foliofs("", **shape)),
                ("raw", lambda shape=shape: foliofs("", raw=True, **shape)),
                ("fio", lambda shape=shape: fio(peers.raw, **shape)),
                ("ext4", lambda shape=shape: fio(peers.files["ext4"], **shape)),
                ("xfs", lambda shape=shape: fio(peers.files["xfs"], **shape)),
            ]
            results = run_rows(rows, args.reps)
            m = {label: median_of(results[label]) for label, _ in rows}
            print(f"| {rw} {bs} | {m['foliofs']:,.0f} | {m['raw']:,.0f} | {m['fio']:,.0f} | {m['ext4']:,.0f} | "
                  f"{m['xfs']:,.0f} | {m['foliofs'] / m['raw']:.2f} | {m['foliofs'] / m['ext4']:.2f} | "
                  f"{m['foliofs'] / m['xfs']:.2f} |")


def seed_003(args, peers):
    print("\n### Seed 003: 4 KiB O_DSYNC direct writes (fio sync=1)\n")
    print("| shape | fua=native IOPS | requests/write | fua=emulate IOPS | requests/write | native / emulate |")
    print("|---|---|---|---|---|---|")
    for iodepth, numjobs in ((1, 1), (1, 16), (16, 1)):
        shape = dict(rw="randwrite", bs="4k", iodepth=iodepth, numjobs=numjobs, size=args.size,
                     runtime=args.runtime, dsync=True)
        rows = [
            ("native", lambda shape=shape: foliofs("fua=native", **shape)),
            ("emulate", lambda shape=shape: foliofs("fua=emulate", **shape)),
        ]
        results = run_rows(rows, args.reps)
        native, emulate = median_of(results["native"]), median_of(results["emulate"])
        print(f"| iodepth={iodepth} numjobs={numjobs} | {native:,.0f} | {median_of(results['native'], 'requests_per_io'):.2f} | "
              f"{emulate:,.0f} | {median_of(results['emulate'], 'requests_per_io'):.2f} | {native / emulate:.2f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runtime", type=int, default=10)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--size", default="1G")
    parser.add_argument("--seeds", default="000,002,003")
    args = parser.parse_args()
    size_bytes = int(args.size[:-1]) << {"M": 20, "G": 30}[args.size[-1]]
    seeds = args.seeds.split(",")
    peers = DirectPeers(size_bytes) if {"000", "002"} & set(seeds) else None
    try:
        for seed in seeds:
            {"000": seed_000, "002": seed_002, "003": seed_003}[seed](args, peers)
    finally:
        if peers:
            peers.close()


if __name__ == "__main__":
    main()
