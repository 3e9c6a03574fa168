#!/usr/bin/env python3
"""Seeds 001 and 004 and writeback throughput side by side: foliofs
in-process (`foliofs bench buffered`), fio with psync on kernel ext4 and XFS
on loop devices (--direct-io=on) over files on the same disk, and a memcpy of
the same sizes (the limit for cached I/O). Each configuration runs REPS
times, interleaved; tables show medians. Run as root from the repository
root after `cargo build --release`.

    scripts/bench_buffered_seeds.py [--runtime 5] [--reps 3] [--seeds 001,004,writeback]
"""
import argparse, os, re, shutil, sys

from seedlib import FOLIOFS, NO_WRITEBACK, Peers, Sysctl, fio_json, median_of, run_rows, sh, warm_memory


def foliofs(options, rw, bs, numjobs, size, runtime, fdatasync=0, overwrite=True, pre_read=True,
            end_fsync=False, ramp=0, memcpy=False, raw_direct=None):
    command = [FOLIOFS]
    if options:
        command += ["-o", options]
    if raw_direct:
        iodepth = raw_direct
        command += ["bench", "direct", "--raw", "--rw", rw, "--bs", bs, "--iodepth", str(iodepth),
                    "--size", size, "--runtime", f"{runtime}s"]
    else:
        command += ["bench", "buffered", "--rw", rw, "--bs", bs, "--numjobs", str(numjobs), "--size", size,
                    "--runtime", f"{runtime}s", "--fdatasync", str(fdatasync), "--ramp-time", f"{ramp}s"]
        command += [flag for flag, on in (("--overwrite", overwrite), ("--pre-read", pre_read),
                                          ("--end-fsync", end_fsync), ("--memcpy", memcpy)) if on]
    out = sh(command)
    iops = float(re.search(r"IOPS=(\d+)", out).group(1))
    mib = float(re.search(r"BW=([\d.]+)MiB/s", out).group(1))
    amplification = re.search(r"device bytes written per byte written=([\d.]+)", out)
    flushes = re.search(r"flushes ([\d.]+)\)", out)
    return {"iops": iops, "mib": mib,
            "amplification": float(amplification.group(1)) if amplification else 0.0,
            "flushes_per_io": float(flushes.group(1)) if flushes else 0.0}


def fio(peers, fs, rw, bs, numjobs, size, runtime, fdatasync=0, overwrite=True, pre_read=True, end_fsync=False,
        time_based=True):
    directory = os.path.join(peers.mounts[fs][1], "run")
    os.makedirs(directory, exist_ok=True)
    args = ["--name=seed", f"--directory={directory}", "--ioengine=psync", "--direct=0", f"--rw={rw}",
            f"--bs={bs}", f"--numjobs={numjobs}", f"--size={size}", f"--fdatasync={fdatasync}",
            f"--overwrite={int(overwrite)}", f"--pre_read={int(pre_read)}", f"--end_fsync={int(end_fsync)}",
            "--fallocate=none"]
    if time_based:
        args += [f"--runtime={runtime}", "--time_based"]
    before = peers.loop_bytes_written(fs)
    job = fio_json(args)
    written = peers.loop_bytes_written(fs) - before
    shutil.rmtree(directory)
    side = job["write"] if "write" in rw else job["read"]
    user_bytes = side["io_bytes"]
    return {"iops": side["iops"], "mib": side["bw_bytes"] / (1 << 20),
            "amplification": written / user_bytes if "write" in rw and user_bytes else 0.0}


def seed_001(args, peers):
    shape = dict(rw="randwrite", bs="4k", numjobs=8, size=args.seed_001_size, runtime=args.runtime * 2,
                 fdatasync=1)
    rows = [
        ("foliofs dirty=block", lambda: foliofs("dirty=block,folio_max=64k", **shape)),
        ("foliofs dirty=folio", lambda: foliofs("dirty=folio,folio_max=64k", **shape)),
        ("kernel ext4 (fio)", lambda: fio(peers, "ext4", **shape)),
        ("kernel XFS (fio)", lambda: fio(peers, "xfs", **shape)),
    ]
    results = run_rows(rows, args.reps)
    print(f"\n### Seed 001: 4 KiB random buffered overwrites + fdatasync, 8 jobs x {args.seed_001_size}, "
          "64 KiB folios, pre-read\n")
    print("| configuration | IOPS | MiB/s | device bytes per user byte | dirty=block / this |")
    print("|---|---|---|---|---|")
    base = median_of(results["foliofs dirty=block"])
    for label, _ in rows:
        runs = results[label]
        print(f"| {label} | {median_of(runs):,.0f} | {median_of(runs, 'mib'):,.1f} | "
              f"{median_of(runs, 'amplification'):.2f} | {base / median_of(runs):.2f} |")


def seed_004(args, peers):
    print(f"\n### Seed 004: buffered read and write, cache-resident {args.seed_004_size} file, 1 job, psync, "
          "writeback off\n")
    print("| workload | foliofs | foliofs folio_max=4k | ext4 (fio) | XFS (fio) | memcpy | foliofs / ext4 | "
          "foliofs / XFS | foliofs / memcpy | large / 4k folios |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    no_writeback = "dirty_background_bytes=64G,dirty_bytes=64G,writeback_interval_ms=0"
    for rw in ("write", "read"):
        for bs in ("4k", "64k", "1M"):
            shape = dict(rw=rw, bs=bs, numjobs=1, size=args.seed_004_size, runtime=args.runtime)
            rows = [
                ("foliofs", lambda shape=shape: foliofs(no_writeback, **shape)),
                ("small", lambda shape=shape: foliofs(no_writeback + ",folio_max=4k", **shape)),
                ("ext4", lambda shape=shape: fio(peers, "ext4", **shape)),
                ("xfs", lambda shape=shape: fio(peers, "xfs", **shape)),
                ("memcpy", lambda shape=shape: foliofs("", memcpy=True, **shape)),
            ]
            with Sysctl(NO_WRITEBACK):
                results = run_rows(rows, args.reps)
            m = {label: median_of(results[label], "mib") for label, _ in rows}
            print(f"| {rw} {bs} (MiB/s) | {m['foliofs']:,.0f} | {m['small']:,.0f} | {m['ext4']:,.0f} | "
                  f"{m['xfs']:,.0f} | {m['memcpy']:,.0f} | {m['foliofs'] / m['ext4']:.2f} | "
                  f"{m['foliofs'] / m['xfs']:.2f} | {m['foliofs'] / m['memcpy']:.2f} | "
                  f"{m['foliofs'] / m['small']:.2f} |")


def writeback(args, peers):
    size = args.writeback_size
    print(f"\n### Writeback: sequential 1 MiB buffered writes over a {size} file, end_fsync, cache_bytes=1G\n")
    print("| configuration | MiB/s | vs raw 8 MiB x qd4 |")
    print("|---|---|---|")
    rows = [
        ("foliofs, time-based after a 3 s ramp", lambda: foliofs(
            "cache_bytes=1G", "write", "1M", 1, size, args.runtime, overwrite=False, pre_read=False,
            end_fsync=True, ramp=3)),
        ("foliofs, once through a new file", lambda: foliofs(
            "cache_bytes=1G", "write", "1M", 1, size, 0, overwrite=False, pre_read=False, end_fsync=True)),
        ("kernel ext4 (fio), once through", lambda: fio(
            peers, "ext4", "write", "1M", 1, size, 0, overwrite=False, pre_read=False, end_fsync=True,
            time_based=False)),
        ("kernel XFS (fio), once through", lambda: fio(
            peers, "xfs", "write", "1M", 1, size, 0, overwrite=False, pre_read=False, end_fsync=True,
            time_based=False)),
        ("raw O_DIRECT 1 MiB x qd8", lambda: foliofs("", "write", "1M", 1, size, args.runtime, raw_direct=8)),
        ("raw O_DIRECT 8 MiB x qd4", lambda: foliofs("", "write", "8M", 1, size, args.runtime, raw_direct=4)),
    ]
    results = run_rows(rows, args.reps)
    raw = median_of(results["raw O_DIRECT 8 MiB x qd4"], "mib")
    for label, _ in rows:
        mib = median_of(results[label], "mib")
        print(f"| {label} | {mib:,.0f} | {mib / raw:.2f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runtime", type=int, default=5)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seed-001-size", default="256M", help="per job (the seed used 1G)")
    parser.add_argument("--seed-004-size", default="1G")
    parser.add_argument("--writeback-size", default="4G")
    parser.add_argument("--seeds", default="001,004,writeback")
    args = parser.parse_args()
    size = lambda text: int(text[:-1]) << {"M": 20, "G": 30}[text[-1]]
    peer_bytes = max(8 * size(args.seed_001_size), size(args.seed_004_size), size(args.writeback_size))
    warm_memory()
    peers = Peers(peer_bytes + (1 << 30), raw_file=False)
    try:
        for seed in args.seeds.split(","):
            {"001": seed_001, "004": seed_004, "writeback": writeback}[seed](args, peers)
    finally:
        peers.close()


if __name__ == "__main__":
    main()
