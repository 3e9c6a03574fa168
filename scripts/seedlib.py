"""Shared by the seed scripts: running foliofs and fio, kernel ext4 and XFS
peers on loop devices (--direct-io=on) over files on the same disk, medians
of interleaved repetitions, and warming this machine's memory."""
import json, os, statistics, subprocess, sys, tempfile

FOLIOFS = "./target/release/foliofs"


def sh(command, **kwargs):
    return subprocess.run(command, check=True, capture_output=True, text=True, **kwargs).stdout


def lay_out(path, size_bytes):
    sh(["dd", "if=/dev/zero", f"of={path}", "bs=4M", f"count={size_bytes >> 22}", "oflag=direct", "status=none"])


def warm_memory(fraction=0.7):
    """Touches most free memory once: on a VM whose host backs guest memory
    lazily, the first touch of a page costs far more than a memcpy, and the
    first process to fill a cache would pay it."""
    with open("/proc/meminfo") as meminfo:
        free_kib = next(int(line.split()[1]) for line in meminfo if line.startswith("MemAvailable"))
    size = int(free_kib * 1024 * fraction) & ~4095
    sh([sys.executable, "-c", f"import mmap\nm=mmap.mmap(-1,{size})\nfor i in range(0,{size},4096): m[i]=1"])


class Peers:
    """A raw backing file and kernel ext4 and XFS on loop devices, set up once."""

    def __init__(self, size_bytes, raw_file=True):
        self.dir = tempfile.mkdtemp(dir=".", prefix="seed-peers-")
        self.raw = os.path.join(self.dir, "raw.img")
        if raw_file:
            lay_out(self.raw, size_bytes)
        self.mounts = {}
        for fs in ("ext4", "xfs"):
            backing = os.path.join(self.dir, f"{fs}.img")
            lay_out(backing, size_bytes + (512 << 20))
            loop = sh(["losetup", "--direct-io=on", "-f", "--show", backing]).strip()
            sh(["mkfs.ext4", "-q", "-F", loop] if fs == "ext4" else ["mkfs.xfs", "-q", "-f", loop])
            mount = os.path.join(self.dir, f"mnt-{fs}")
            os.mkdir(mount)
            sh(["mount", loop, mount])
            self.mounts[fs] = (loop, mount)

    def loop_bytes_written(self, fs):
        loop = os.path.basename(self.mounts[fs][0])
        with open(f"/sys/block/{loop}/stat") as stat:
            return int(stat.read().split()[6]) * 512

    def close(self):
        for loop, mount in self.mounts.values():
            subprocess.run(["umount", mount])
            subprocess.run(["losetup", "-d", loop])
        subprocess.run(["rm", "-rf", self.dir])


class Sysctl:
    """Sets /proc/sys/vm values for a block of runs and restores them."""

    def __init__(self, values):
        self.values = values

    def __enter__(self):
        self.saved = {}
        for key, value in self.values.items():
            path = f"/proc/sys/vm/{key}"
            with open(path) as current:
                self.saved[key] = current.read().strip()
            with open(path, "w") as target:
                target.write(str(value))

    def __exit__(self, *exc):
        for key, value in self.saved.items():
            with open(f"/proc/sys/vm/{key}", "w") as target:
                target.write(value)


# The seed 004 author's setting for the write-cache tests: no writeback at all.
NO_WRITEBACK = {"dirty_writeback_centisecs": 0, "dirty_background_ratio": 100, "dirty_ratio": 100}


def fio_json(args):
    return json.loads(sh(["fio", "--output-format=json", "--group_reporting", "--thread"] + args))["jobs"][0]


def median_of(runs, key="iops"):
    return statistics.median(run[key] for run in runs)


def run_rows(rows, reps):
    """rows: list of (label, thunk). Runs every row once per rep, interleaved."""
    results = {label: [] for label, _ in rows}
    for rep in range(reps):
        for label, thunk in rows:
            results[label].append(thunk())
            print(f"  rep {rep + 1} {label}: {results[label][-1]['iops']:.0f} IOPS", file=sys.stderr)
    return results
