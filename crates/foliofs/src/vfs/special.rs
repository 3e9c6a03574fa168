//! Special files: FIFOs, unix sockets and character and block device nodes.
//! The volume stores only their attributes and, for devices, the device
//! number; the kernel opens them (pipes, sockets, drivers), never the volume.
//! Device nodes on a mount stay unusable under `nodev`, the default.

use crate::error::{Error, Result};
use crate::format::InodeKind;

use super::attr::{Attr, Owner};
use super::inodes::Inodes;

impl Inodes<'_> {
    /// Creates a node of `kind` named `name` in `parent` (mknod(2)): a
    /// regular file, FIFO, socket or device node. `rdev` is kept for device
    /// nodes only (Linux's `dev_t` encoding, as `makedev` makes it).
    pub fn mknod(
        &self,
        parent: u64,
        name: &[u8],
        kind: InodeKind,
        mode: u32,
        rdev: u32,
        owner: Owner,
    ) -> Result<Attr> {
        let _writing = self.volume.shared.write_gate.start_write();
        match kind {
            InodeKind::File => return self.create(parent, name, mode, owner),
            InodeKind::Dir | InodeKind::Symlink => {
                return Err(Error::invalid(format!(
                    "mknod makes regular files, FIFOs, sockets and devices, not {kind:?}"
                )))
            }
            InodeKind::Fifo
            | InodeKind::Socket
            | InodeKind::CharDevice
            | InodeKind::BlockDevice => {}
        }
        let rdev = if kind.is_device() { rdev } else { 0 };
        self.make_node(parent, name, kind, mode, owner, None, rdev)
    }
}
