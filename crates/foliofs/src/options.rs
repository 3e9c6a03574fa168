//! Volume options: every policy switch of the engine, settable from
//! `Volume::open`, `mount -o` and `bench -o` by the same `key=value` names.

use crate::dev::{DevOptions, EngineKind, FuaMode};
use crate::error::{Error, Result};

/// Every option key with a one-line description; the error for an unknown
/// key lists these.
pub const OPTION_KEYS: &[(&str, &str)] = &[
    ("engine", "I/O backend: sync | threads | uring (default uring)"),
    (
        "dio_unaligned",
        "sub-block direct writes: overwrite (concurrent when they only overwrite) | exclusive \
         (each runs alone) (default overwrite)",
    ),
    ("fua", "durable writes: native (RWF_DSYNC) | emulate (write + flush) (default native)"),
    ("direct", "open the backing file with O_DIRECT: on | off (default on)"),
    ("ro", "read-only: refuse every change (flag; also ro=on|off, and rw for off)"),
    ("commit_interval_ms", "background journal commit interval, 0 = only on fsync (default 5000)"),
    ("io_threads", "worker threads of the threads engine, 1..256 (default 8)"),
    (
        "dirty",
        "dirty tracking in a folio: block (write back only the dirty blocks) | folio (the whole \
         folio, the old behaviour) (default block)",
    ),
    (
        "folio_max",
        "largest folio of the cache, a power of two from 1k to 64M, at least the block size \
         (default 2M)",
    ),
    ("cache_bytes", "memory of the folio cache, at least 1M (default a quarter of RAM)"),
    (
        "inode_cache_bytes",
        "memory the inodes keep after a checkpoint on a volume whose metadata is in an index \
         (format 3); the rest are read again when used (default 256M)",
    ),
    (
        "dirty_background_bytes",
        "dirty cache above which the flusher starts writing back (default cache_bytes / 10)",
    ),
    (
        "dirty_bytes",
        "dirty cache above which writers wait for writeback; past halfway from \
         dirty_background_bytes they are paced to the writeback bandwidth \
         (default cache_bytes / 5)",
    ),
    (
        "writeback_interval_ms",
        "how often the flusher writes back files dirty for dirty_expire_ms, 0 = only on demand \
         (default 1000)",
    ),
    (
        "dirty_expire_ms",
        "how long data may stay dirty before the flusher writes its file back (default 5000)",
    ),
    (
        "atime",
        "when reads update the access time: relatime (when older than mtime or ctime, or a day \
         old) | strictatime (every read) | noatime (default relatime)",
    ),
    ("nodiratime", "listing a directory leaves its access time alone: on | off (default off)"),
    (
        "discard",
        "tell the device which blocks are free (TRIM / punched holes) once their freeing is \
         durable: on | off, or nodiscard (default off)",
    ),
];

/// When a read advances the access time, as the mount options of the same
/// names on ext4. Updates stay in memory until the inode's next record, an
/// fsync or a checkpoint (as lazytime), so no read costs a journal write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AtimePolicy {
    /// When the access time is not after the last modification or change,
    /// or is a day old: programs that compare atime with mtime (mail
    /// readers, tmp cleaners) keep working at a fraction of the updates.
    #[default]
    Relatime,
    /// On every read.
    Strict,
    /// Never.
    NoAtime,
}

impl std::str::FromStr for AtimePolicy {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "relatime" => Ok(Self::Relatime),
            "strictatime" | "strict" => Ok(Self::Strict),
            "noatime" | "off" => Ok(Self::NoAtime),
            other => Err(format!("atime must be relatime, strictatime or noatime, not {other:?}")),
        }
    }
}

/// How a folio records what is dirty.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DirtyMode {
    /// One dirty bit per block: writeback writes only the blocks written
    /// (iomap since the seed 001 patch).
    #[default]
    Block,
    /// The whole folio is dirty: writeback writes every uptodate block of it
    /// (the behaviour before the seed 001 patch).
    Folio,
}

impl std::str::FromStr for DirtyMode {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "block" => Ok(Self::Block),
            "folio" => Ok(Self::Folio),
            other => Err(format!("dirty must be block or folio, not {other:?}")),
        }
    }
}

/// Locking of direct writes that are not aligned to the file-system block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DioUnaligned {
    /// Every sub-block write runs alone, after in-flight direct I/O drains
    /// (the kernel's behaviour before the seed 000 patch).
    Exclusive,
    /// A sub-block write that only overwrites written blocks inside EOF runs
    /// concurrently under the shared lock; only writes that must zero part of
    /// a block run alone.
    #[default]
    Overwrite,
}

impl std::str::FromStr for DioUnaligned {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "exclusive" => Ok(Self::Exclusive),
            "overwrite" => Ok(Self::Overwrite),
            other => Err(format!("dio_unaligned must be overwrite or exclusive, not {other:?}")),
        }
    }
}

/// Every switch of a volume, as `-o key=value` names them
/// ([`OPTION_KEYS`] describes each); [`VolumeOptions::parse`] reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeOptions {
    /// The I/O backend (`engine`).
    pub engine: EngineKind,
    /// How sub-block direct writes run (`dio_unaligned`).
    pub dio_unaligned: DioUnaligned,
    /// How a durable write reaches the device (`fua`).
    pub fua: FuaMode,
    /// Open the image with O_DIRECT (`direct`).
    pub direct: bool,
    /// Refuse every change (`ro`).
    pub read_only: bool,
    /// Background journal commit interval; 0 commits only on sync.
    pub commit_interval_ms: u64,
    /// Worker threads of the threads engine.
    pub io_threads: usize,
    /// Dirty tracking per block or per folio (`dirty`).
    pub dirty: DirtyMode,
    /// Largest folio; checked against the volume's block size at open.
    pub folio_max_bytes: u64,
    /// Memory of the folio cache.
    pub cache_bytes: u64,
    /// Memory of the inodes kept after a checkpoint (format 3).
    pub inode_cache_bytes: u64,
    /// None: a tenth of `cache_bytes`.
    pub dirty_background_bytes: Option<u64>,
    /// None: a fifth of `cache_bytes`.
    pub dirty_bytes: Option<u64>,
    /// How often the flusher writes back expired files; 0: only on demand.
    pub writeback_interval_ms: u64,
    /// Age of a file's dirty data at which the flusher's interval pass
    /// writes the file back (0: at every pass).
    pub dirty_expire_ms: u64,
    /// When reads advance the access time.
    pub atime: AtimePolicy,
    /// Directories' access times are never updated (on top of `atime`).
    pub nodiratime: bool,
    /// Freed blocks are discarded on the device (as ext4's `discard`).
    pub discard: bool,
}

impl Default for VolumeOptions {
    fn default() -> Self {
        Self {
            engine: EngineKind::Uring,
            dio_unaligned: DioUnaligned::Overwrite,
            fua: FuaMode::Native,
            direct: true,
            read_only: false,
            commit_interval_ms: 5000,
            io_threads: 8,
            dirty: DirtyMode::Block,
            folio_max_bytes: 2 << 20,
            cache_bytes: default_cache_bytes(),
            inode_cache_bytes: 256 << 20,
            dirty_background_bytes: None,
            dirty_bytes: None,
            writeback_interval_ms: 1000,
            dirty_expire_ms: 5000,
            atime: AtimePolicy::Relatime,
            nodiratime: false,
            discard: false,
        }
    }
}

/// A quarter of physical memory, at least 64 MiB.
fn default_cache_bytes() -> u64 {
    (crate::dev::physical_memory_bytes() / 4).max(64 << 20)
}

impl VolumeOptions {
    /// Parses a comma-separated list such as `engine=sync,fua=emulate,ro`.
    pub fn parse(list: &str) -> Result<Self> {
        let mut options = Self::default();
        options.apply_list(list)?;
        Ok(options)
    }

    /// Sets each `key=value` (or flag) of a comma-separated list, in order;
    /// fails on the first unknown key or bad value, naming it.
    pub fn apply_list(&mut self, list: &str) -> Result<()> {
        for item in list.split(',').map(str::trim).filter(|item| !item.is_empty()) {
            match item.split_once('=') {
                Some((key, value)) => self.set(key.trim(), value.trim())?,
                None => self.set(item, "on")?,
            }
        }
        Ok(())
    }

    /// Sets one option; an unknown key or a bad value is an error naming it.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let bad = |why: String| Error::invalid(format!("option {key}={value}: {why}"));
        match key {
            "engine" => self.engine = value.parse().map_err(bad)?,
            "dio_unaligned" => self.dio_unaligned = value.parse().map_err(bad)?,
            "fua" => self.fua = value.parse().map_err(bad)?,
            "direct" => self.direct = parse_switch(value).map_err(bad)?,
            "ro" | "read_only" => self.read_only = parse_switch(value).map_err(bad)?,
            "rw" => self.read_only = !parse_switch(value).map_err(bad)?,
            "commit_interval_ms" => {
                self.commit_interval_ms = value.parse().map_err(|_| bad("not a number".into()))?
            }
            "io_threads" => {
                let threads: usize = value.parse().map_err(|_| bad("not a number".into()))?;
                if !(1..=256).contains(&threads) {
                    return Err(bad("must be between 1 and 256".into()));
                }
                self.io_threads = threads;
            }
            "dirty" => self.dirty = value.parse().map_err(bad)?,
            "folio_max" => {
                let bytes = parse_size(value).map_err(|error| bad(error.to_string()))?;
                if !bytes.is_power_of_two() || !(1024..=(64 << 20)).contains(&bytes) {
                    return Err(bad("must be a power of two between 1k and 64M".into()));
                }
                self.folio_max_bytes = bytes;
            }
            "cache_bytes" => {
                let bytes = parse_size(value).map_err(|error| bad(error.to_string()))?;
                if bytes < (1 << 20) {
                    return Err(bad("must be at least 1M".into()));
                }
                self.cache_bytes = bytes;
            }
            "inode_cache_bytes" => {
                self.inode_cache_bytes =
                    parse_size(value).map_err(|error| bad(error.to_string()))?
            }
            "dirty_background_bytes" => {
                self.dirty_background_bytes =
                    Some(parse_size(value).map_err(|error| bad(error.to_string()))?)
            }
            "dirty_bytes" => {
                self.dirty_bytes = Some(parse_size(value).map_err(|error| bad(error.to_string()))?)
            }
            "writeback_interval_ms" => {
                self.writeback_interval_ms =
                    value.parse().map_err(|_| bad("not a number".into()))?
            }
            "dirty_expire_ms" => {
                self.dirty_expire_ms = value.parse().map_err(|_| bad("not a number".into()))?
            }
            "atime" => self.atime = value.parse().map_err(bad)?,
            "nodiratime" => self.nodiratime = parse_switch(value).map_err(bad)?,
            "discard" => self.discard = parse_switch(value).map_err(bad)?,
            "nodiscard" => self.discard = !parse_switch(value).map_err(bad)?,
            _ => {
                let known: Vec<&str> = OPTION_KEYS.iter().map(|(name, _)| *name).collect();
                return Err(Error::invalid(format!(
                    "unknown option {key:?}; supported: {}",
                    known.join(", ")
                )));
            }
        }
        Ok(())
    }

    /// Dirty cache above which the background flusher writes back.
    pub fn dirty_background_limit_bytes(&self) -> u64 {
        self.dirty_background_bytes.unwrap_or(self.cache_bytes / 10)
    }

    /// Dirty cache above which writers wait for writeback before returning
    /// (and below which, from the freerun ceiling, they are paced).
    pub fn dirty_limit_bytes(&self) -> u64 {
        self.dirty_bytes.unwrap_or(self.cache_bytes / 5)
    }

    /// What the device layer takes from these options (the workspace's
    /// tools open devices with it; `DevOptions` is theirs only).
    #[cfg(feature = "internals")]
    #[doc(hidden)]
    pub fn dev_options(&self) -> DevOptions {
        self.device_options()
    }

    /// What the device layer takes from these options.
    #[cfg(not(feature = "internals"))]
    pub(crate) fn dev_options(&self) -> DevOptions {
        self.device_options()
    }

    fn device_options(&self) -> DevOptions {
        DevOptions {
            engine: self.engine,
            fua: self.fua,
            direct: self.direct,
            read_only: self.read_only,
            worker_threads: self.io_threads,
            ..DevOptions::default()
        }
    }
}

fn parse_switch(value: &str) -> Result<bool, String> {
    match value {
        "on" | "1" | "true" | "yes" => Ok(true),
        "off" | "0" | "false" | "no" => Ok(false),
        other => Err(format!("expected on or off, not {other:?}")),
    }
}

/// Parses sizes like `4096`, `64k`, `4M`, `10G`, `1T` (binary multiples).
pub fn parse_size(text: &str) -> Result<u64> {
    let text = text.trim();
    let bad = || {
        Error::invalid(format!(
            "bad size {text:?}: expected a number with an optional k/M/G/T suffix"
        ))
    };
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, suffix) = text.split_at(split);
    let number: u64 = digits.parse().map_err(|_| bad())?;
    let shift = match suffix.to_ascii_lowercase().trim_end_matches("ib").trim_end_matches('b') {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        _ => return Err(bad()),
    };
    number.checked_mul(1u64 << shift).ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lists_flags_and_rejects_unknown_keys() {
        let options =
            VolumeOptions::parse("engine=sync, fua=emulate,ro,commit_interval_ms=0").unwrap();
        assert_eq!(options.engine, EngineKind::Sync);
        assert_eq!(options.fua, FuaMode::Emulate);
        assert!(options.read_only);
        assert_eq!(options.commit_interval_ms, 0);
        let error = VolumeOptions::parse("engine=sync,bogus=1").unwrap_err();
        assert!(error.to_string().contains("unknown option \"bogus\""), "{error}");
        assert!(error.to_string().contains("engine"), "lists the supported keys: {error}");
        let cache = VolumeOptions::parse("dirty=folio,folio_max=64k,cache_bytes=256M").unwrap();
        assert_eq!(cache.dirty, DirtyMode::Folio);
        assert_eq!(cache.folio_max_bytes, 64 << 10);
        assert_eq!(cache.dirty_limit_bytes(), (256 << 20) / 5);
        let error = VolumeOptions::parse("folio_max=48k").unwrap_err();
        assert!(error.to_string().contains("power of two"), "{error}");
        let error = VolumeOptions::parse("dirty=page").unwrap_err();
        assert!(error.to_string().contains("dirty=page"), "{error}");
        let error = VolumeOptions::parse("fua=sometimes").unwrap_err();
        assert!(error.to_string().contains("fua=sometimes"), "{error}");
        assert_eq!(error.errno(), libc::EINVAL);
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64k").unwrap(), 65536);
        assert_eq!(parse_size("4G").unwrap(), 4 << 30);
        assert_eq!(parse_size("2MiB").unwrap(), 2 << 20);
        assert!(parse_size("4X").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999999999999T").is_err());
    }
}
