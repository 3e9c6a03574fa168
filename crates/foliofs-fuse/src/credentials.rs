//! Who sent a request: the ids the kernel puts in its header, and what it
//! does not send (effective capabilities, supplementary groups, the
//! file-system ids of a caller an idmapped mount does not name), read from
//! the caller's `/proc/PID/status`. The POSIX rules that use them live in
//! the library; this module only finds the caller.

use foliofs::{Credentials, Owner, Privilege};
use fuser::Request;

/// The set-user-ID and set-group-ID mode bits.
pub(crate) const SET_ID_BITS: u32 = libc::S_ISUID | libc::S_ISGID;

pub(crate) fn owner(req: &Request) -> Owner {
    Owner { uid: req.uid(), gid: req.gid() }
}

/// FUSE_INVALID_UIDGID: with FUSE_ALLOW_IDMAP the kernel names the caller
/// (its ids mapped through the mount's idmapping) only in the requests
/// that create an inode; the others carry this in both ids.
const INVALID_ID: u32 = u32::MAX;

fn names_caller(req: &Request) -> bool {
    req.uid() != INVALID_ID && req.gid() != INVALID_ID
}

/// The ids of the caller of a request that creates nothing: the header's,
/// or where it names no caller the caller's file-system ids as its process
/// status shows them (not mapped through an idmapped mount's idmapping:
/// only the set-ID rule of a data change uses them).
pub(crate) fn caller_ids(req: &Request) -> Owner {
    if names_caller(req) {
        return owner(req);
    }
    CallerStatus::of(req).ids(req)
}

/// Set when the callers are a VM guest's processes (virtio-fs): their pids
/// name nothing on this host, so /proc is not read for them. One process
/// serves one kind of caller (`foliofs serve virtiofs` mounts nothing).
static CALLERS_IN_A_GUEST: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Callers from here on are a guest's: root (uid 0 in the header) holds
/// every capability, as on virtiofsd, and no one has supplementary groups
/// (the guest kernel checks permissions itself: virtio-fs mounts with
/// default_permissions).
pub(crate) fn callers_are_in_a_guest() {
    CALLERS_IN_A_GUEST.store(true, std::sync::atomic::Ordering::Relaxed);
}

pub(crate) const CAP_FSETID: u32 = 4;
pub(crate) const CAP_SYS_ADMIN: u32 = 21;
pub(crate) const CAP_LINUX_IMMUTABLE: u32 = 9;

/// What the kernel does not send about a caller: its effective
/// capabilities and supplementary groups, from /proc. A caller gone
/// before the lookup has neither.
pub(crate) struct CallerStatus {
    capabilities: u64,
    groups: Vec<u32>,
    /// The caller's file-system uid and gid, for requests whose header
    /// names no caller.
    fs_ids: Option<Owner>,
}

impl CallerStatus {
    pub(crate) fn of(req: &Request) -> Self {
        if CALLERS_IN_A_GUEST.load(std::sync::atomic::Ordering::Relaxed) {
            let capabilities = if req.uid() == 0 { u64::MAX } else { 0 };
            return Self { capabilities, groups: Vec::new(), fs_ids: None };
        }
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", req.pid())).unwrap_or_default();
        let field = |name: &str| status.lines().find_map(|line| line.strip_prefix(name));
        let capabilities = field("CapEff:")
            .and_then(|bits| u64::from_str_radix(bits.trim(), 16).ok())
            .unwrap_or(0);
        let groups = field("Groups:")
            .map(|list| list.split_whitespace().filter_map(|gid| gid.parse().ok()).collect())
            .unwrap_or_default();
        // "Uid:" and "Gid:" list real, effective, saved and file-system ids.
        let fs_id = |name: &str| field(name)?.split_whitespace().nth(3)?.parse().ok();
        let fs_ids = fs_id("Uid:").zip(fs_id("Gid:")).map(|(uid, gid)| Owner { uid, gid });
        Self { capabilities, groups, fs_ids }
    }

    pub(crate) fn has_capability(&self, capability: u32) -> bool {
        self.capabilities & (1 << capability) != 0
    }

    /// in_group_p: the caller's file-system gid or a supplementary group.
    pub(crate) fn in_group(&self, req: &Request, gid: u32) -> bool {
        self.ids(req).gid == gid || self.groups.contains(&gid)
    }

    /// The caller as the library's access checks take it.
    pub(crate) fn credentials(self, req: &Request) -> Credentials {
        let Owner { uid, gid } = self.ids(req);
        Credentials { uid, gid, groups: self.groups }
    }

    /// The request header's ids, or where it names no caller the caller's
    /// own file-system ids (see `caller_ids`).
    pub(crate) fn ids(&self, req: &Request) -> Owner {
        match self.fs_ids {
            Some(ids) if !names_caller(req) => ids,
            _ => owner(req),
        }
    }
}

/// Whether the process behind `req` holds CAP_SYS_ADMIN.
pub(crate) fn caller_privilege(req: &Request) -> Privilege {
    if CallerStatus::of(req).has_capability(CAP_SYS_ADMIN) {
        Privilege::SysAdmin
    } else {
        Privilege::Unprivileged
    }
}
