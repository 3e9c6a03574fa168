//! `-o` for a mount: the engine's switches (passed to `VolumeOptions`), the
//! kernel's standard mount options, and the adapter's own few.

use std::path::{Path, PathBuf};
use std::time::Duration;

use libc::c_ulong;

use foliofs::options::{parse_size, AtimePolicy, OPTION_KEYS};
use foliofs::{Error, Result, VolumeOptions};
use fuser::{Config, MountOption, SessionACL};

/// The mount-level keys with one-line descriptions (the engine's keys are in
/// `foliofs::options::OPTION_KEYS`); the error for an unknown key lists both.
pub const MOUNT_OPTION_KEYS: &[(&str, &str)] = &[
    (
        "page_cache",
        "engine (every open is FOPEN_DIRECT_IO: the engine's cache is the only one) | kernel \
         (buffered opens use the kernel's page cache too) | writeback (the kernel's page cache \
         also holds buffered writes and writes them back later) (default engine)",
    ),
    (
        "opens",
        "kernel (opendir, and with page_cache=kernel or writeback open too, stays in the kernel: \
         FUSE no-opendir and no-open) | daemon (every open reaches the daemon, which refuses a \
         writable open of an immutable or append-only file there) (default kernel)",
    ),
    (
        "transport",
        "uring (FUSE over io_uring: per-CPU queues, one system call per request) | dev \
         (read/write on /dev/fuse) (default uring where the kernel offers it, else dev)",
    ),
    ("uring_depth", "io_uring entries (requests in flight) per CPU queue, 1..1024 (default 64)"),
    (
        "ring_sched",
        "idle (a ring thread submits a lone reply, and waits after a hand-off, at SCHED_IDLE, \
         so its caller wakes on the CPU that answered) | other (default idle where the daemon \
         can return from SCHED_IDLE, e.g. as root)",
    ),
    (
        "fuse_threads",
        "threads serving kernel requests, 1..256, split over the CPU queues with io_uring \
         (default 16 on /dev/fuse, two per CPU queue with io_uring)",
    ),
    (
        "attr_timeout",
        "seconds the kernel may cache attributes and names; changes it does not make are \
         invalidated (default 3600)",
    ),
    ("max_write", "largest write request the kernel sends, 4k..16M (default 1M)"),
    (
        "max_background",
        "asynchronous requests (direct I/O, readahead, writeback) the kernel holds for the \
         mount before a program submitting more waits, 1..65535; capped by the kernel without \
         CAP_SYS_ADMIN (default 4096)",
    ),
    ("allow_other", "let every user access the mount"),
    ("allow_root", "let root access the mount too"),
    ("default_permissions", "the kernel checks permissions from mode bits (default on)"),
    ("no_default_permissions", "do not ask the kernel to check permissions"),
    ("auto_unmount", "unmount when the daemon exits (needs allow_other or allow_root)"),
    ("fsname", "the source shown in /proc/mounts (default the image path)"),
    ("subtype", "the type suffix shown in /proc/mounts (default foliofs)"),
    ("log", "a file the daemon appends its log to (default syslog, or stderr with -f)"),
    (
        "norecovery",
        "with ro only, as XFS: the device is not written; the journal is read in memory, as \
         every read-only mount does",
    ),
    (
        "dev, nodev, suid, nosuid, exec, noexec, sync, async, dirsync, atime, noatime, diratime, \
         nodiratime, relatime, norelatime, strictatime, nostrictatime, lazytime, nolazytime, \
         iversion, noiversion, symfollow, nosymfollow",
        "as mount(8); passed to the kernel (nodev and nosuid by default)",
    ),
];

/// A standard mount(8) flag: the MS_* bits it sets and the ones it clears.
struct StandardFlag {
    name: &'static str,
    set: c_ulong,
    clear: c_ulong,
}

const fn standard_flag(name: &'static str, set: c_ulong, clear: c_ulong) -> StandardFlag {
    StandardFlag { name, set, clear }
}

// The atime flags reach the kernel and /proc/mounts, and also set the
// engine's access-time policy (`set_atime_policy`): FUSE inodes are
// S_NOATIME, so the kernel leaves access times to the daemon.
const STANDARD_FLAGS: &[StandardFlag] = &[
    standard_flag("dev", 0, libc::MS_NODEV),
    standard_flag("nodev", libc::MS_NODEV, 0),
    standard_flag("suid", 0, libc::MS_NOSUID),
    standard_flag("nosuid", libc::MS_NOSUID, 0),
    standard_flag("exec", 0, libc::MS_NOEXEC),
    standard_flag("noexec", libc::MS_NOEXEC, 0),
    standard_flag("sync", libc::MS_SYNCHRONOUS, 0),
    standard_flag("async", 0, libc::MS_SYNCHRONOUS),
    standard_flag("dirsync", libc::MS_DIRSYNC, 0),
    standard_flag("atime", 0, libc::MS_NOATIME),
    standard_flag("noatime", libc::MS_NOATIME, 0),
    standard_flag("diratime", 0, libc::MS_NODIRATIME),
    standard_flag("nodiratime", libc::MS_NODIRATIME, 0),
    standard_flag("relatime", libc::MS_RELATIME, libc::MS_STRICTATIME),
    standard_flag("norelatime", 0, libc::MS_RELATIME),
    standard_flag("strictatime", libc::MS_STRICTATIME, libc::MS_RELATIME | libc::MS_NOATIME),
    standard_flag("nostrictatime", 0, libc::MS_STRICTATIME),
    standard_flag("lazytime", libc::MS_LAZYTIME, 0),
    standard_flag("nolazytime", 0, libc::MS_LAZYTIME),
    // Accepted and passed on; the kernel clears SB_I_VERSION for FUSE.
    standard_flag("iversion", libc::MS_I_VERSION, 0),
    standard_flag("noiversion", 0, libc::MS_I_VERSION),
    standard_flag("symfollow", 0, libc::MS_NOSYMFOLLOW),
    standard_flag("nosymfollow", libc::MS_NOSYMFOLLOW, 0),
];

/// What a mount gets without asking: no device nodes, no setuid (as
/// fusermount3 and mount.fuse3 do).
const DEFAULT_MOUNT_FLAGS: c_ulong = libc::MS_NODEV | libc::MS_NOSUID;

/// Threads reading /dev/fuse unless `fuse_threads` says.
const DEFAULT_FUSE_THREADS: usize = 16;
/// Ring threads per CPU queue with io_uring unless `fuse_threads` says: at
/// iodepth 64 through the mount, two per queue ran 4 KiB direct random
/// reads 15% and writes 38% faster than eight (16 over 2 CPUs), seed 000
/// 33% faster, while a cache-missing buffered reader at 8 jobs lost 11%.
const DEFAULT_RING_THREADS_PER_QUEUE: usize = 2;
const DEFAULT_ATTR_TIMEOUT_SECONDS: u64 = 3600;

const DEFAULT_URING_DEPTH: u16 = 64;
/// Asynchronous requests in the kernel's hands at once. A program that
/// submits one more waits in the kernel until one ends, and is woken for
/// each: seed 000 (8 jobs at iodepth 256, 2,048 direct writes in flight)
/// ran 63-72k IOPS through the mount with 256 and 94-104k with 4,096 on the
/// 2-vCPU VM (docs/bench/history/2026-11-28-mount-max-background.md).
/// Requests beyond the ring entries wait in the kernel's queue, which costs
/// the daemon nothing.
const DEFAULT_MAX_BACKGROUND: u16 = 4096;

/// How requests travel between the kernel and the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// FUSE over io_uring where the kernel offers it (Linux 6.14+ with
    /// `enable_uring`), else /dev/fuse.
    #[default]
    Uring,
    /// read(2) and write(2) on /dev/fuse.
    Dev,
}

/// How the kernel's page cache takes part in buffered I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PageCacheUse {
    /// FOPEN_DIRECT_IO on every open: reads and writes reach the engine as
    /// they were issued, and its folio cache is the only cache.
    #[default]
    Engine,
    /// Buffered opens go through the kernel's page cache (write-through)
    /// and keep it across opens (FOPEN_KEEP_CACHE): reads of cached pages
    /// never cross into the daemon. The daemon invalidates the kernel's
    /// pages when the data changes by a path the kernel did not see (a
    /// library user of the volume, direct writes). Dropping the cache at
    /// each open instead measured slower for every cached read and bought
    /// nothing the invalidation does not give.
    Kernel,
    /// As `Kernel`, and buffered writes stay in the kernel's page cache
    /// (FUSE_WRITEBACK_CACHE) until it writes them back, in large requests
    /// that take the engine's buffered path; the kernel owns the size and
    /// times of open files and sends them. fsync, fdatasync and O_DSYNC
    /// write back first, then ask the engine for durability. The FUSE
    /// device's dirty limits are relaxed at mount (the `bdi` module).
    Writeback,
}

#[derive(Debug, Clone)]
pub struct MountOptions {
    pub volume: VolumeOptions,
    pub page_cache: PageCacheUse,
    /// Opens and closes of directories stay in the kernel (FUSE
    /// no-opendir), and of files too (FUSE no-open) where the kernel's page
    /// cache serves the data (`page_cache` kernel or writeback);
    /// `opens=daemon` turns both off.
    pub zero_message_opens: bool,
    pub transport: Transport,
    pub uring_depth: u16,
    /// An io_uring ring thread submits a single reply at SCHED_IDLE:
    /// `ring_sched`.
    pub ring_sched_idle: bool,
    /// Serving threads, as given; `None`: the defaults above.
    pub fuse_threads: Option<usize>,
    pub attr_timeout: Duration,
    pub max_write_bytes: u32,
    /// FUSE's `max_background`; the congestion threshold is three quarters
    /// of it.
    pub max_background: u16,
    pub default_permissions: bool,
    pub allow_other: bool,
    pub allow_root: bool,
    pub auto_unmount: bool,
    pub fsname: Option<String>,
    pub subtype: String,
    /// Where the daemon appends its log.
    pub log: Option<PathBuf>,
    /// The MS_* flags for mount(2), from the standard options (MS_RDONLY
    /// comes from `volume.read_only`).
    pub mount_flags: c_ulong,
    /// The standard options as given, for fusermount3 when mount(2) is not
    /// ours to call.
    pub standard_options: Vec<&'static str>,
}

impl Default for MountOptions {
    fn default() -> Self {
        Self {
            volume: VolumeOptions::default(),
            page_cache: PageCacheUse::Engine,
            zero_message_opens: true,
            transport: Transport::Uring,
            uring_depth: DEFAULT_URING_DEPTH,
            // A round trip is one switch on one CPU instead of a cross-CPU
            // wake-up: 4 KiB cached psync reads through the mount took 35-40
            // us with SCHED_OTHER commits and 6-7 us with SCHED_IDLE ones on
            // the 2-vCPU VM (docs/bench/history/2026-11-27-mount-ring-sched.md).
            ring_sched_idle: true,
            // A thread waits out each request's device I/O, so the threads,
            // not the CPUs, bound the queue depth the device sees: on 2 CPUs,
            // 4k random direct writes at iodepth 64 ran 12.1k IOPS with 2
            // threads, 43.3k with 16 and 29.7k with 64.
            fuse_threads: None,
            // Long: every change the kernel does not make itself is
            // invalidated (the invalidate module). It bounds only a change
            // the engine would make on its own, unasked; st_blocks is not
            // one (it counts delayed allocation already).
            attr_timeout: Duration::from_secs(DEFAULT_ATTR_TIMEOUT_SECONDS),
            max_write_bytes: 1 << 20,
            max_background: DEFAULT_MAX_BACKGROUND,
            default_permissions: true,
            allow_other: false,
            allow_root: false,
            auto_unmount: false,
            fsname: None,
            subtype: "foliofs".into(),
            log: None,
            mount_flags: DEFAULT_MOUNT_FLAGS,
            standard_options: Vec::new(),
        }
    }
}

impl MountOptions {
    /// Whether `name` is one of the standard mount(8) flags.
    pub fn is_standard_flag(name: &str) -> bool {
        Self::standard_flag_bits(name).is_some()
    }

    /// The MS_* bits a standard flag sets and clears.
    pub fn standard_flag_bits(name: &str) -> Option<(c_ulong, c_ulong)> {
        STANDARD_FLAGS
            .iter()
            .find(|standard| standard.name == name)
            .map(|standard| (standard.set, standard.clear))
    }

    /// Parses a comma-separated `-o` list; a bad or unknown item is an error
    /// that names it (and, when unknown, lists every accepted key).
    pub fn parse(list: &str) -> Result<Self> {
        let mut options = Self::default();
        let mut norecovery = false;
        for item in list.split(',').map(str::trim).filter(|item| !item.is_empty()) {
            let (key, value) = match item.split_once('=') {
                Some((key, value)) => (key.trim(), Some(value.trim())),
                None => (item, None),
            };
            if (key, value) == ("norecovery", None) {
                norecovery = true;
                continue;
            }
            options.set(key, value)?;
        }
        // A read-only mount never writes the device (its journal replay
        // stays in memory): that is what norecovery asks, with ro, on XFS.
        if norecovery && !options.volume.read_only {
            return Err(Error::invalid(
                "mount option norecovery needs ro (the journal of a writable mount is replayed)",
            ));
        }
        Ok(options)
    }

    /// The engine's access-time policy after the standard flag `key` (the
    /// last flag given wins, as with mount(8)). Access times are always
    /// updated lazily, so lazytime changes nothing.
    fn set_atime_policy(&mut self, key: &str) {
        match key {
            "noatime" => self.volume.atime = AtimePolicy::NoAtime,
            "atime" if self.volume.atime == AtimePolicy::NoAtime => {
                self.volume.atime = AtimePolicy::Relatime;
            }
            "relatime" | "nostrictatime" => self.volume.atime = AtimePolicy::Relatime,
            "strictatime" | "norelatime" => self.volume.atime = AtimePolicy::Strict,
            "nodiratime" | "diratime" => self.volume.nodiratime = key == "nodiratime",
            _ => {}
        }
    }

    fn set(&mut self, key: &str, value: Option<&str>) -> Result<()> {
        let bad = |why: &str| {
            Error::invalid(format!("mount option {key}={}: {why}", value.unwrap_or("")))
        };
        let flag = |option: MountOption| -> Result<MountOption> {
            match value {
                None => Ok(option),
                Some(_) => Err(bad("takes no value")),
            }
        };
        let no_value = || flag(MountOption::RW).map(drop);
        match key {
            "page_cache" => {
                self.page_cache = match value {
                    Some("engine") => PageCacheUse::Engine,
                    Some("kernel") => PageCacheUse::Kernel,
                    Some("writeback") => PageCacheUse::Writeback,
                    _ => return Err(bad("expected engine, kernel or writeback")),
                }
            }
            "opens" => {
                self.zero_message_opens = match value {
                    Some("kernel") => true,
                    Some("daemon") => false,
                    _ => return Err(bad("expected kernel or daemon")),
                }
            }
            "transport" => {
                self.transport = match value {
                    Some("uring") => Transport::Uring,
                    Some("dev") => Transport::Dev,
                    _ => return Err(bad("expected uring or dev")),
                }
            }
            "uring_depth" => {
                let depth: u16 =
                    value.and_then(|v| v.parse().ok()).ok_or_else(|| bad("not a number"))?;
                if !(1..=1024).contains(&depth) {
                    return Err(bad("must be between 1 and 1024"));
                }
                self.uring_depth = depth;
            }
            "ring_sched" => {
                self.ring_sched_idle = match value {
                    Some("idle") => true,
                    Some("other") => false,
                    _ => return Err(bad("expected idle or other")),
                }
            }
            "fuse_threads" => {
                let threads: usize =
                    value.and_then(|v| v.parse().ok()).ok_or_else(|| bad("not a number"))?;
                if !(1..=256).contains(&threads) {
                    return Err(bad("must be between 1 and 256"));
                }
                self.fuse_threads = Some(threads);
            }
            "attr_timeout" => {
                let seconds: f64 = value
                    .and_then(|v| v.parse().ok())
                    .filter(|seconds: &f64| {
                        seconds.is_finite() && *seconds >= 0.0 && *seconds < 1e9
                    })
                    .ok_or_else(|| bad("expected seconds, e.g. 1 or 0.5"))?;
                self.attr_timeout = Duration::from_secs_f64(seconds);
            }
            "max_write" => {
                let bytes = parse_size(value.unwrap_or("")).map_err(|e| bad(&e.to_string()))?;
                if !(4096..=(16 << 20)).contains(&bytes) {
                    return Err(bad("must be between 4k and 16M"));
                }
                self.max_write_bytes = bytes as u32;
            }
            "max_background" => {
                let requests: u16 = value
                    .and_then(|v| v.parse().ok())
                    .filter(|requests| *requests > 0)
                    .ok_or_else(|| bad("expected a number of requests from 1 to 65535"))?;
                self.max_background = requests;
            }
            "allow_other" => {
                no_value()?;
                self.allow_other = true;
            }
            "allow_root" => {
                no_value()?;
                self.allow_root = true;
            }
            "default_permissions" => {
                no_value()?;
                self.default_permissions = true;
            }
            "no_default_permissions" => {
                no_value()?;
                self.default_permissions = false;
            }
            "auto_unmount" => {
                flag(MountOption::AutoUnmount)?;
                self.auto_unmount = true;
            }
            "fsname" => self.fsname = Some(value.ok_or_else(|| bad("needs a value"))?.into()),
            "subtype" => self.subtype = value.ok_or_else(|| bad("needs a value"))?.into(),
            "log" => {
                let path =
                    value.filter(|path| !path.is_empty()).ok_or_else(|| bad("needs a path"))?;
                self.log = Some(PathBuf::from(path));
            }
            "ro" | "rw" if value.is_none() => {
                self.volume.read_only = key == "ro";
            }
            // With a value, `atime` is the engine's policy (below).
            _ if STANDARD_FLAGS.iter().any(|standard| standard.name == key)
                && !(key == "atime" && value.is_some()) =>
            {
                no_value()?;
                let standard = STANDARD_FLAGS.iter().find(|standard| standard.name == key);
                let standard = standard.expect("matched");
                self.mount_flags = (self.mount_flags & !standard.clear) | standard.set;
                self.standard_options.push(standard.name);
                self.set_atime_policy(key);
            }
            "mand" => return Err(bad("mandatory locks are gone from Linux (since 5.15)")),
            // What mount(8) and fstab pass through to a helper and mean
            // nothing to the file system itself.
            "defaults" | "auto" | "noauto" | "user" | "nouser" | "users" | "owner" | "group"
            | "_netdev" | "nofail" | "nomand" | "silent" | "loud" => {}
            _ if key.starts_with("x-") => {}
            _ if OPTION_KEYS.iter().any(|(name, _)| *name == key) => {
                self.volume.set(key, value.unwrap_or("on"))?;
            }
            _ => {
                let known: Vec<&str> =
                    OPTION_KEYS.iter().chain(MOUNT_OPTION_KEYS).map(|(name, _)| *name).collect();
                return Err(Error::invalid(format!(
                    "unknown mount option {key:?}; supported: {}",
                    known.join(", ")
                )));
            }
        }
        Ok(())
    }

    /// The session configuration handed to fuser.
    pub(crate) fn fuse_config(&self, image: &Path) -> Config {
        let mut config = Config::default();
        let fsname = self.fsname.clone().unwrap_or_else(|| image.display().to_string());
        config.mount_options.push(MountOption::FSName(fsname));
        config.mount_options.push(MountOption::Subtype(self.subtype.clone()));
        config.mount_options.push(if self.volume.read_only {
            MountOption::RO
        } else {
            MountOption::RW
        });
        if self.default_permissions {
            config.mount_options.push(MountOption::DefaultPermissions);
        }
        if self.auto_unmount {
            config.mount_options.push(MountOption::AutoUnmount);
        }
        config.mount_options.extend(
            self.standard_options.iter().map(|name| MountOption::CUSTOM((*name).to_string())),
        );
        config.acl = if self.allow_other {
            SessionACL::All
        } else if self.allow_root {
            SessionACL::RootAndOwner
        } else {
            SessionACL::Owner
        };
        config.n_threads = Some(self.fuse_threads.unwrap_or(DEFAULT_FUSE_THREADS));
        // Each thread reads from its own clone of /dev/fuse, so the kernel
        // spreads requests over the threads instead of waking all of them.
        config.clone_fd = true;
        if self.transport == Transport::Uring {
            // The serving threads are spread over the CPU queues, so a
            // handler that waits (a buffered read missing the cache) holds
            // only its own thread's entries.
            config.io_uring_queue_depth = Some(self.uring_depth);
            config.io_uring_sched_idle = self.ring_sched_idle;
            config.io_uring_threads_per_queue =
                self.fuse_threads.is_none().then_some(DEFAULT_RING_THREADS_PER_QUEUE);
        }
        config
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transport_and_its_depth_parse_and_reach_the_session_config() {
        let options = MountOptions::parse("transport=dev").unwrap();
        assert_eq!(options.transport, Transport::Dev);
        assert_eq!(options.fuse_config(Path::new("/img")).io_uring_queue_depth, None);
        let options = MountOptions::parse("uring_depth=16,fuse_threads=4").unwrap();
        assert_eq!(options.transport, Transport::Uring);
        let config = options.fuse_config(Path::new("/img"));
        assert_eq!(config.io_uring_queue_depth, Some(16));
        assert_eq!(config.n_threads, Some(4));
        assert_eq!(
            config.io_uring_threads_per_queue, None,
            "a number given is split over the queues"
        );
        let config = MountOptions::parse("").unwrap().fuse_config(Path::new("/img"));
        assert_eq!(config.n_threads, Some(DEFAULT_FUSE_THREADS));
        assert_eq!(config.io_uring_threads_per_queue, Some(DEFAULT_RING_THREADS_PER_QUEUE));
        let bad = MountOptions::parse("transport=tcp").unwrap_err().to_string();
        assert!(bad.contains("transport=tcp") && bad.contains("uring or dev"), "{bad}");
        assert!(MountOptions::parse("uring_depth=0").is_err());
        assert_eq!(MountOptions::parse("").unwrap().max_background, DEFAULT_MAX_BACKGROUND);
        assert_eq!(MountOptions::parse("max_background=64").unwrap().max_background, 64);
        for bad in ["max_background=0", "max_background=65536", "max_background"] {
            let error = MountOptions::parse(bad).unwrap_err().to_string();
            assert!(error.contains(bad) && error.contains("1 to 65535"), "{error}");
        }
        assert!(config.io_uring_sched_idle, "SCHED_IDLE ring threads are the default");
        let options = MountOptions::parse("ring_sched=other").unwrap();
        assert!(!options.fuse_config(Path::new("/img")).io_uring_sched_idle);
        let bad = MountOptions::parse("ring_sched=fifo").unwrap_err().to_string();
        assert!(bad.contains("ring_sched=fifo") && bad.contains("idle or other"), "{bad}");
    }

    #[test]
    fn norecovery_is_accepted_with_ro_only() {
        assert!(MountOptions::parse("ro,norecovery").unwrap().volume.read_only);
        assert!(MountOptions::parse("norecovery,ro").unwrap().volume.read_only);
        let refused = MountOptions::parse("norecovery").unwrap_err().to_string();
        assert!(refused.contains("norecovery needs ro"), "{refused}");
        assert!(MountOptions::parse("ro,norecovery=1").is_err());
    }

    #[test]
    fn engine_switches_and_mount_options_mix_in_one_list() {
        let options = MountOptions::parse(
            "dirty=folio,fua=emulate,page_cache=kernel,fuse_threads=3,allow_other,noatime,ro",
        )
        .unwrap();
        assert_eq!(options.volume.dirty, foliofs::options::DirtyMode::Folio);
        assert_eq!(options.volume.fua, foliofs::dev::FuaMode::Emulate);
        assert!(options.volume.read_only);
        assert_eq!(options.page_cache, PageCacheUse::Kernel);
        let writeback = MountOptions::parse("page_cache=writeback").unwrap();
        assert_eq!(writeback.page_cache, PageCacheUse::Writeback);
        assert_eq!(writeback.attr_timeout, Duration::from_secs(3600));
        assert_eq!(options.fuse_threads, Some(3));
        assert!(options.allow_other);
        assert_eq!(options.standard_options, ["noatime"]);
        assert_eq!(options.mount_flags, libc::MS_NODEV | libc::MS_NOSUID | libc::MS_NOATIME);
        let config = options.fuse_config(Path::new("/img"));
        assert_eq!(config.acl, SessionACL::All);
        assert!(config.mount_options.contains(&MountOption::RO));
        assert!(config.mount_options.contains(&MountOption::DefaultPermissions));
    }

    #[test]
    fn unknown_and_bad_options_name_the_problem() {
        let unknown = MountOptions::parse("dirty=block,bogus=1").unwrap_err().to_string();
        assert!(unknown.contains("\"bogus\""), "{unknown}");
        assert!(unknown.contains("page_cache") && unknown.contains("folio_max"), "{unknown}");
        let bad = MountOptions::parse("page_cache=disk").unwrap_err().to_string();
        assert!(
            bad.contains("page_cache=disk") && bad.contains("engine, kernel or writeback"),
            "{bad}"
        );
        let bad_engine = MountOptions::parse("folio_max=3k").unwrap_err().to_string();
        assert!(bad_engine.contains("folio_max=3k"), "{bad_engine}");
        assert!(MountOptions::parse("allow_other=yes").is_err());
        assert!(MountOptions::parse("max_write=1k").is_err());
        assert!(MountOptions::parse("nodiratime=1").is_err());
        let mand = MountOptions::parse("mand").unwrap_err().to_string();
        assert!(mand.contains("mandatory locks"), "{mand}");
    }

    #[test]
    fn standard_flags_set_and_clear_their_bits_in_order() {
        let options = MountOptions::parse(
            "suid,dev,nodiratime,lazytime,nosymfollow,iversion,strictatime,relatime,log=/x.log",
        )
        .unwrap();
        assert_eq!(
            options.mount_flags,
            libc::MS_NODIRATIME
                | libc::MS_LAZYTIME
                | libc::MS_NOSYMFOLLOW
                | libc::MS_I_VERSION
                | libc::MS_RELATIME
        );
        assert_eq!(options.log.as_deref(), Some(Path::new("/x.log")));
        let defaults = MountOptions::parse("").unwrap();
        assert_eq!(defaults.mount_flags, libc::MS_NODEV | libc::MS_NOSUID);
        assert!(MountOptions::parse("log=").is_err());
    }

    #[test]
    fn access_time_options_set_the_library_policy() {
        let policy = |list: &str| {
            let options = MountOptions::parse(list).unwrap();
            (options.volume.atime, options.volume.nodiratime)
        };
        assert_eq!(policy(""), (AtimePolicy::Relatime, false));
        assert_eq!(policy("noatime"), (AtimePolicy::NoAtime, false));
        assert_eq!(policy("strictatime,nodiratime,lazytime"), (AtimePolicy::Strict, true));
        assert_eq!(policy("noatime,relatime"), (AtimePolicy::Relatime, false));
        assert_eq!(policy("atime=strictatime"), (AtimePolicy::Strict, false));
        assert!(MountOptions::parse("nodiratime=1").is_err());
    }
}
