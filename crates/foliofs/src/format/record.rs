//! Logical metadata records: the journal's redo log and the checkpoint's
//! content are both sequences of these.
//!
//! Every record *sets* state (absolute values, never deltas), so applying a
//! record twice gives the same state as applying it once; replay relies on it.

use super::codec::{Reader, Writer};
use super::{
    FormatError, NAME_BYTES_MAX, SYMLINK_BYTES_MAX, XATTR_NAME_BYTES_MAX, XATTR_VALUE_BYTES_MAX,
};

const WHAT: &str = "metadata record";

/// Seconds and nanoseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp {
    /// Whole seconds (negative before 1970).
    pub secs: i64,
    /// Nanoseconds within the second, below 1,000,000,000.
    pub nanos: u32,
}

impl Timestamp {
    /// The system clock's time now.
    pub fn now() -> Self {
        let since_epoch =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        Self { secs: since_epoch.as_secs() as i64, nanos: since_epoch.subsec_nanos() }
    }

    fn encode(&self, writer: &mut Writer) {
        writer.i64(self.secs);
        writer.u32(self.nanos);
    }

    fn decode(reader: &mut Reader<'_>) -> Result<Self, FormatError> {
        let secs = reader.i64()?;
        let nanos = reader.u32()?;
        if nanos >= 1_000_000_000 {
            return Err(FormatError::invalid(WHAT, "timestamp", format!("{nanos} ns")));
        }
        Ok(Self { secs, nanos })
    }
}

/// What an inode is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InodeKind {
    /// A regular file.
    File = 1,
    /// A directory.
    Dir = 2,
    /// A symbolic link.
    Symlink = 3,
    /// Special files: no content on the volume. Device nodes carry their
    /// device number in a `DeviceSet` record; the kernel opens all four.
    Fifo = 4,
    /// A Unix socket.
    Socket = 5,
    /// A character device node.
    CharDevice = 6,
    /// A block device node.
    BlockDevice = 7,
}

impl InodeKind {
    fn decode(value: u8) -> Result<Self, FormatError> {
        match value {
            1 => Ok(Self::File),
            2 => Ok(Self::Dir),
            3 => Ok(Self::Symlink),
            4 => Ok(Self::Fifo),
            5 => Ok(Self::Socket),
            6 => Ok(Self::CharDevice),
            7 => Ok(Self::BlockDevice),
            other => Err(FormatError::invalid(WHAT, "inode kind", other.to_string())),
        }
    }

    /// A FIFO, socket or device node.
    pub fn is_special(self) -> bool {
        matches!(self, Self::Fifo | Self::Socket | Self::CharDevice | Self::BlockDevice)
    }

    /// A character or block device node.
    pub fn is_device(self) -> bool {
        matches!(self, Self::CharDevice | Self::BlockDevice)
    }
}

/// State of a mapped extent on disk. Holes are the absence of an extent and
/// delayed allocations never reach the disk, so only these two are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExtentState {
    /// Allocated, but reads return zeros: the data write has not completed.
    Unwritten = 1,
    Written = 2,
}

impl ExtentState {
    fn decode(value: u8) -> Result<Self, FormatError> {
        match value {
            1 => Ok(Self::Unwritten),
            2 => Ok(Self::Written),
            other => Err(FormatError::invalid(WHAT, "extent state", other.to_string())),
        }
    }
}

/// The persistent attributes of an inode, logged whole on every change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InodeAttrs {
    pub kind: InodeKind,
    /// Permission bits (07777); the file type is `kind`.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    /// The size on disk: never covers blocks whose data write has not completed.
    pub size: u64,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    /// For directories, the parent directory (the root is its own parent); 0 otherwise.
    pub parent: u64,
}

impl InodeAttrs {
    fn encode(&self, writer: &mut Writer) {
        writer.u8(self.kind as u8);
        writer.u32(self.mode);
        writer.u32(self.uid);
        writer.u32(self.gid);
        writer.u32(self.nlink);
        writer.u64(self.size);
        self.atime.encode(writer);
        self.mtime.encode(writer);
        self.ctime.encode(writer);
        writer.u64(self.parent);
    }

    fn decode(reader: &mut Reader<'_>) -> Result<Self, FormatError> {
        let attrs = Self {
            kind: InodeKind::decode(reader.u8()?)?,
            mode: reader.u32()?,
            uid: reader.u32()?,
            gid: reader.u32()?,
            nlink: reader.u32()?,
            size: reader.u64()?,
            atime: Timestamp::decode(reader)?,
            mtime: Timestamp::decode(reader)?,
            ctime: Timestamp::decode(reader)?,
            parent: reader.u64()?,
        };
        if attrs.mode & !0o7777 != 0 {
            return Err(FormatError::invalid(WHAT, "mode", format!("{:#o}", attrs.mode)));
        }
        Ok(attrs)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// Creates the inode if it does not exist, otherwise replaces its attributes.
    InodeSet {
        ino: u64,
        attrs: InodeAttrs,
    },
    /// Removes the inode and everything it maps.
    InodeFree {
        ino: u64,
    },
    /// Sets a symlink's target.
    SymlinkSet {
        ino: u64,
        target: Vec<u8>,
    },
    /// Adds (or replaces) a directory entry.
    DirAdd {
        dir: u64,
        name: Vec<u8>,
        ino: u64,
    },
    DirRemove {
        dir: u64,
        name: Vec<u8>,
    },
    /// Maps file blocks `[file_block, file_block + block_count)` to device
    /// blocks starting at `dev_block`, replacing whatever was mapped there.
    ExtentMap {
        ino: u64,
        file_block: u64,
        dev_block: u64,
        block_count: u64,
        state: ExtentState,
    },
    /// Turns file blocks back into a hole, freeing what was mapped.
    ExtentUnmap {
        ino: u64,
        file_block: u64,
        block_count: u64,
    },
    /// Creates or replaces one extended attribute (the name includes its
    /// namespace prefix, as in `user.comment`).
    XattrSet {
        ino: u64,
        name: Vec<u8>,
        value: Vec<u8>,
    },
    XattrRemove {
        ino: u64,
        name: Vec<u8>,
    },
    /// Sets a character or block device's number (Linux's 32-bit `dev_t`
    /// encoding, as `st_rdev`).
    DeviceSet {
        ino: u64,
        rdev: u32,
    },
    /// Sets an inode's attribute flags (chattr): `INODE_FLAG_*` bits only.
    FlagsSet {
        ino: u64,
        flags: u32,
    },
    /// Sets how many file blocks map each of device blocks
    /// `[dev_block, dev_block + block_count)`: 2 or more for blocks that
    /// clones share, 1 for blocks no longer shared (format version 2).
    SharedSet {
        dev_block: u64,
        block_count: u64,
        refs: u32,
    },
}

/// chattr +i: no change to the inode, its data, its names or (for a
/// directory) its entries. The values are those of FS_IMMUTABLE_FL and
/// the other FS_IOC_GETFLAGS bits, so the flags pass through unchanged.
pub const INODE_FLAG_IMMUTABLE: u32 = 0x10;
/// chattr +a: data only appended; no truncation, unlinking or renaming
/// (for a directory: entries only added).
pub const INODE_FLAG_APPEND: u32 = 0x20;
/// chattr +d: kept (dump(8) reads it), no effect on the volume.
pub const INODE_FLAG_NODUMP: u32 = 0x40;
/// chattr +A: reads leave the access time alone.
pub const INODE_FLAG_NOATIME: u32 = 0x80;
/// Every flag an inode may carry.
pub const INODE_FLAGS_KNOWN: u32 =
    INODE_FLAG_IMMUTABLE | INODE_FLAG_APPEND | INODE_FLAG_NODUMP | INODE_FLAG_NOATIME;

/// Encoded size of a `SharedSet` record.
pub const SHARED_SET_RECORD_BYTES: usize = 21;

const TAG_INODE_SET: u8 = 1;
const TAG_INODE_FREE: u8 = 2;
const TAG_SYMLINK_SET: u8 = 3;
const TAG_DIR_ADD: u8 = 4;
const TAG_DIR_REMOVE: u8 = 5;
const TAG_EXTENT_MAP: u8 = 6;
const TAG_EXTENT_UNMAP: u8 = 7;
const TAG_XATTR_SET: u8 = 8;
const TAG_XATTR_REMOVE: u8 = 9;
const TAG_DEVICE_SET: u8 = 10;
const TAG_FLAGS_SET: u8 = 11;
const TAG_SHARED_SET: u8 = 12;

impl Record {
    pub fn encode(&self, writer: &mut Writer) {
        let start = writer.len();
        self.encode_fields(writer);
        // The journal budgets its space with the bound: a record past it
        // could overrun a group.
        let written = writer.len() - start;
        debug_assert!(
            written <= self.encoded_bytes_max(),
            "{written} bytes encoded, over the bound of {}: {self:?}",
            self.encoded_bytes_max()
        );
    }

    fn encode_fields(&self, writer: &mut Writer) {
        match self {
            Record::InodeSet { ino, attrs } => {
                writer.u8(TAG_INODE_SET);
                writer.u64(*ino);
                attrs.encode(writer);
            }
            Record::InodeFree { ino } => {
                writer.u8(TAG_INODE_FREE);
                writer.u64(*ino);
            }
            Record::SymlinkSet { ino, target } => {
                writer.u8(TAG_SYMLINK_SET);
                writer.u64(*ino);
                writer.bytes16(target);
            }
            Record::DirAdd { dir, name, ino } => {
                writer.u8(TAG_DIR_ADD);
                writer.u64(*dir);
                writer.bytes16(name);
                writer.u64(*ino);
            }
            Record::DirRemove { dir, name } => {
                writer.u8(TAG_DIR_REMOVE);
                writer.u64(*dir);
                writer.bytes16(name);
            }
            Record::ExtentMap { ino, file_block, dev_block, block_count, state } => {
                writer.u8(TAG_EXTENT_MAP);
                writer.u64(*ino);
                writer.u64(*file_block);
                writer.u64(*dev_block);
                writer.u64(*block_count);
                writer.u8(*state as u8);
            }
            Record::ExtentUnmap { ino, file_block, block_count } => {
                writer.u8(TAG_EXTENT_UNMAP);
                writer.u64(*ino);
                writer.u64(*file_block);
                writer.u64(*block_count);
            }
            Record::XattrSet { ino, name, value } => {
                writer.u8(TAG_XATTR_SET);
                writer.u64(*ino);
                writer.bytes16(name);
                let length = u32::try_from(value.len()).expect("xattr value bounded by callers");
                writer.u32(length);
                writer.raw(value);
            }
            Record::XattrRemove { ino, name } => {
                writer.u8(TAG_XATTR_REMOVE);
                writer.u64(*ino);
                writer.bytes16(name);
            }
            Record::DeviceSet { ino, rdev } => {
                writer.u8(TAG_DEVICE_SET);
                writer.u64(*ino);
                writer.u32(*rdev);
            }
            Record::FlagsSet { ino, flags } => {
                writer.u8(TAG_FLAGS_SET);
                writer.u64(*ino);
                writer.u32(*flags);
            }
            Record::SharedSet { dev_block, block_count, refs } => {
                writer.u8(TAG_SHARED_SET);
                writer.u64(*dev_block);
                writer.u64(*block_count);
                writer.u32(*refs);
            }
        }
    }

    pub fn decode(reader: &mut Reader<'_>) -> Result<Self, FormatError> {
        let tag = reader.u8()?;
        let record = match tag {
            TAG_INODE_SET => {
                Record::InodeSet { ino: decode_ino(reader)?, attrs: InodeAttrs::decode(reader)? }
            }
            TAG_INODE_FREE => Record::InodeFree { ino: decode_ino(reader)? },
            TAG_SYMLINK_SET => {
                let ino = decode_ino(reader)?;
                let target = reader.bytes16()?;
                if target.is_empty() || target.len() > SYMLINK_BYTES_MAX || target.contains(&0) {
                    return Err(FormatError::invalid(WHAT, "symlink target", "bad length or NUL"));
                }
                Record::SymlinkSet { ino, target: target.to_vec() }
            }
            TAG_DIR_ADD => {
                let dir = decode_ino(reader)?;
                let name = decode_name(reader)?;
                Record::DirAdd { dir, name, ino: decode_ino(reader)? }
            }
            TAG_DIR_REMOVE => {
                Record::DirRemove { dir: decode_ino(reader)?, name: decode_name(reader)? }
            }
            TAG_EXTENT_MAP => {
                let ino = decode_ino(reader)?;
                let file_block = reader.u64()?;
                let dev_block = reader.u64()?;
                let block_count = decode_block_count(reader, file_block)?;
                if dev_block.checked_add(block_count).is_none() {
                    return Err(FormatError::invalid(WHAT, "dev_block", "extent overflows"));
                }
                let state = ExtentState::decode(reader.u8()?)?;
                Record::ExtentMap { ino, file_block, dev_block, block_count, state }
            }
            TAG_EXTENT_UNMAP => {
                let ino = decode_ino(reader)?;
                let file_block = reader.u64()?;
                let block_count = decode_block_count(reader, file_block)?;
                Record::ExtentUnmap { ino, file_block, block_count }
            }
            TAG_XATTR_SET => {
                let ino = decode_ino(reader)?;
                let name = decode_xattr_name(reader)?;
                let length = reader.u32()? as usize;
                if length > XATTR_VALUE_BYTES_MAX {
                    return Err(FormatError::invalid(
                        WHAT,
                        "xattr value",
                        format!("{length} bytes"),
                    ));
                }
                Record::XattrSet { ino, name, value: reader.take(length)?.to_vec() }
            }
            TAG_XATTR_REMOVE => {
                Record::XattrRemove { ino: decode_ino(reader)?, name: decode_xattr_name(reader)? }
            }
            TAG_DEVICE_SET => Record::DeviceSet { ino: decode_ino(reader)?, rdev: reader.u32()? },
            TAG_FLAGS_SET => {
                let ino = decode_ino(reader)?;
                let flags = reader.u32()?;
                if flags & !INODE_FLAGS_KNOWN != 0 {
                    return Err(FormatError::invalid(WHAT, "inode flags", format!("{flags:#x}")));
                }
                Record::FlagsSet { ino, flags }
            }
            TAG_SHARED_SET => {
                let dev_block = reader.u64()?;
                let block_count = decode_block_count(reader, dev_block)?;
                let refs = reader.u32()?;
                if refs == 0 {
                    return Err(FormatError::invalid(WHAT, "refs", "0"));
                }
                Record::SharedSet { dev_block, block_count, refs }
            }
            other => return Err(FormatError::invalid(WHAT, "tag", other.to_string())),
        };
        Ok(record)
    }

    /// Upper bound of the encoded size, used to budget journal space.
    pub fn encoded_bytes_max(&self) -> usize {
        match self {
            Record::InodeSet { .. } => 1 + 8 + 61 + 8,
            Record::InodeFree { .. } => 9,
            Record::SymlinkSet { target, .. } => 11 + target.len(),
            Record::DirAdd { name, .. } => 19 + name.len(),
            Record::DirRemove { name, .. } => 11 + name.len(),
            Record::ExtentMap { .. } => 34,
            Record::ExtentUnmap { .. } => 25,
            Record::XattrSet { name, value, .. } => 15 + name.len() + value.len(),
            Record::XattrRemove { name, .. } => 11 + name.len(),
            Record::DeviceSet { .. } | Record::FlagsSet { .. } => 13,
            Record::SharedSet { .. } => SHARED_SET_RECORD_BYTES,
        }
    }
}

fn decode_ino(reader: &mut Reader<'_>) -> Result<u64, FormatError> {
    let ino = reader.u64()?;
    if ino == 0 {
        return Err(FormatError::invalid(WHAT, "inode number", "0"));
    }
    Ok(ino)
}

fn decode_block_count(reader: &mut Reader<'_>, file_block: u64) -> Result<u64, FormatError> {
    let block_count = reader.u64()?;
    if block_count == 0 || file_block.checked_add(block_count).is_none() {
        return Err(FormatError::invalid(WHAT, "block_count", block_count.to_string()));
    }
    Ok(block_count)
}

fn decode_name(reader: &mut Reader<'_>) -> Result<Vec<u8>, FormatError> {
    let name = reader.bytes16()?;
    if !is_valid_name(name) {
        return Err(FormatError::invalid(WHAT, "name", String::from_utf8_lossy(name).into_owned()));
    }
    Ok(name.to_vec())
}

fn decode_xattr_name(reader: &mut Reader<'_>) -> Result<Vec<u8>, FormatError> {
    let name = reader.bytes16()?;
    if !is_valid_xattr_name(name) {
        return Err(FormatError::invalid(
            WHAT,
            "xattr name",
            String::from_utf8_lossy(name).into_owned(),
        ));
    }
    Ok(name.to_vec())
}

/// The namespaces an extended attribute name may start with. `system.`
/// holds only the two POSIX ACL names, as on Linux.
pub const XATTR_PREFIXES: [&[u8]; 3] = [b"user.", b"trusted.", b"security."];
pub const XATTR_SYSTEM_NAMES: [&[u8]; 2] =
    [b"system.posix_acl_access", b"system.posix_acl_default"];

/// An extended attribute name as stored: 1..=255 bytes, no NUL, in a known
/// namespace with a non-empty rest.
pub fn is_valid_xattr_name(name: &[u8]) -> bool {
    name.len() <= XATTR_NAME_BYTES_MAX
        && !name.contains(&0)
        && (XATTR_SYSTEM_NAMES.contains(&name)
            || XATTR_PREFIXES
                .iter()
                .any(|prefix| name.len() > prefix.len() && name.starts_with(prefix)))
}

/// A directory entry name: 1..=255 bytes, no '/', no NUL, not "." or "..".
pub fn is_valid_name(name: &[u8]) -> bool {
    !name.is_empty()
        && name.len() <= NAME_BYTES_MAX
        && name != b"."
        && name != b".."
        && !name.iter().any(|&byte| byte == b'/' || byte == 0)
}

/// Encodes records back to back.
pub fn encode_all(records: &[Record]) -> Vec<u8> {
    let bound = records.iter().map(Record::encoded_bytes_max).sum();
    let mut writer = Writer::with_capacity(bound);
    for record in records {
        record.encode(&mut writer);
    }
    debug_assert!(writer.len() <= bound);
    writer.into_bytes()
}

/// Decodes exactly `count` records that fill `bytes`.
pub fn decode_all(bytes: &[u8], count: u32) -> Result<Vec<Record>, FormatError> {
    let mut reader = Reader::new(bytes, WHAT);
    // Each record takes at least 9 bytes, so a hostile count cannot make us
    // reserve more than the input justifies.
    let mut records = Vec::with_capacity((count as usize).min(bytes.len() / 9));
    for _ in 0..count {
        records.push(Record::decode(&mut reader)?);
    }
    if !reader.is_empty() {
        return Err(FormatError::invalid(WHAT, "count", "bytes left after the last record"));
    }
    Ok(records)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn sample_records() -> Vec<Record> {
        let attrs = InodeAttrs {
            kind: InodeKind::Dir,
            mode: 0o755,
            uid: 1000,
            gid: 100,
            nlink: 2,
            size: 0,
            atime: Timestamp { secs: 1, nanos: 2 },
            mtime: Timestamp { secs: 3, nanos: 4 },
            ctime: Timestamp { secs: -5, nanos: 999_999_999 },
            parent: 1,
        };
        vec![
            Record::InodeSet { ino: 2, attrs },
            Record::InodeFree { ino: 3 },
            Record::SymlinkSet { ino: 4, target: b"../x".to_vec() },
            Record::DirAdd { dir: 1, name: b"hello".to_vec(), ino: 2 },
            Record::DirRemove { dir: 1, name: b"bye".to_vec() },
            Record::ExtentMap {
                ino: 5,
                file_block: 10,
                dev_block: 900,
                block_count: 3,
                state: ExtentState::Unwritten,
            },
            Record::ExtentUnmap { ino: 5, file_block: 11, block_count: 1 },
            Record::XattrSet { ino: 2, name: b"user.mime".to_vec(), value: b"text/x".to_vec() },
            Record::XattrSet {
                ino: 2,
                name: b"trusted.big".to_vec(),
                value: vec![7; XATTR_VALUE_BYTES_MAX],
            },
            Record::XattrRemove { ino: 2, name: b"security.selinux".to_vec() },
            Record::DeviceSet { ino: 6, rdev: 0x0103 },
            Record::FlagsSet { ino: 6, flags: INODE_FLAG_IMMUTABLE | INODE_FLAG_NODUMP },
            Record::SharedSet { dev_block: 900, block_count: 2, refs: 3 },
        ]
    }

    #[test]
    fn shared_counts_of_zero_or_zero_blocks_are_refused() {
        let record = Record::SharedSet { dev_block: 900, block_count: 2, refs: 3 };
        let bytes = encode_all(std::slice::from_ref(&record));
        assert_eq!(bytes.len(), SHARED_SET_RECORD_BYTES);
        for (at, value) in [(9, 0u64), (1, u64::MAX)] {
            let mut hostile = bytes.clone();
            hostile[at..at + 8].copy_from_slice(&value.to_le_bytes());
            assert!(decode_all(&hostile, 1).is_err(), "u64 {value} at {at}");
        }
        let mut no_refs = bytes.clone();
        no_refs[17..21].copy_from_slice(&0u32.to_le_bytes());
        assert!(decode_all(&no_refs, 1).is_err());
    }

    #[test]
    fn round_trip_every_record() {
        let records = sample_records();
        let bytes = encode_all(&records);
        for record in &records {
            let mut writer = Writer::new();
            record.encode(&mut writer);
            assert!(writer.len() <= record.encoded_bytes_max(), "{record:?}");
        }
        assert_eq!(decode_all(&bytes, records.len() as u32).unwrap(), records);
    }

    #[test]
    fn rejects_bad_names_and_counts() {
        for name in [&b""[..], b".", b"..", b"a/b", b"a\0b"] {
            assert!(!is_valid_name(name), "{name:?}");
        }
        assert!(is_valid_name(&[b'x'; 255]));
        assert!(!is_valid_name(&[b'x'; 256]));
        let bytes = encode_all(&sample_records());
        let count = sample_records().len() as u32;
        assert!(decode_all(&bytes, count - 1).is_err(), "trailing bytes must be an error");
        assert!(decode_all(&bytes, count + 1).is_err(), "missing record must be an error");
        assert!(decode_all(&bytes, u32::MAX).is_err());
    }
}

#[cfg(test)]
mod xattr_tests {
    use super::*;

    fn encoded(record: &Record) -> Vec<u8> {
        encode_all(std::slice::from_ref(record))
    }

    #[test]
    fn xattr_names_need_a_known_namespace_and_a_rest() {
        for good in
            [&b"user.x"[..], b"trusted.a.b", b"security.selinux", b"system.posix_acl_access"]
        {
            assert!(is_valid_xattr_name(good), "{good:?}");
        }
        let long = [b"user.".as_slice(), &[b'x'; 251]].concat();
        assert!(!is_valid_xattr_name(&long));
        assert!(is_valid_xattr_name(&long[..255]));
        for bad in [&b""[..], b"user.", b"user", b"os2.x", b"system.other", b"user.a\0b"] {
            assert!(!is_valid_xattr_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn hostile_xattr_records_are_errors() {
        let record = Record::XattrSet { ino: 3, name: b"user.k".to_vec(), value: b"v".to_vec() };
        let bytes = encoded(&record);
        assert_eq!(decode_all(&bytes, 1).unwrap(), vec![record]);
        // Every truncation fails cleanly.
        for cut in 0..bytes.len() {
            assert!(decode_all(&bytes[..cut], 1).is_err(), "cut at {cut}");
        }
        // A value length past the limit, or past the input, is refused
        // before anything is allocated for it.
        let value_length_at = 1 + 8 + 2 + b"user.k".len();
        for length in [u32::MAX, XATTR_VALUE_BYTES_MAX as u32 + 1, 2] {
            let mut hostile = bytes.clone();
            hostile[value_length_at..value_length_at + 4].copy_from_slice(&length.to_le_bytes());
            assert!(decode_all(&hostile, 1).is_err(), "length {length}");
        }
        let mut bad_name = bytes.clone();
        bad_name[1 + 8 + 2..1 + 8 + 2 + 4].copy_from_slice(b"os2.");
        assert!(decode_all(&bad_name, 1).is_err());
        let zero_ino = encoded(&Record::XattrRemove { ino: 0, name: b"user.k".to_vec() });
        assert!(decode_all(&zero_ino, 1).is_err());
    }
}
