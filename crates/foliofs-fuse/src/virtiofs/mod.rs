//! virtio-fs: a VM guest mounts the volume (`mount -t virtiofs TAG /mnt`)
//! through QEMU's `vhost-user-fs-pci` device, with this process as the
//! vhost-user back end. The guest's FUSE requests arrive in virtqueues in
//! its memory instead of on /dev/fuse; each is copied out, decoded and
//! dispatched by the same fuser session code and the same [`FolioFs`] as a
//! mount's, and the reply is written into the request's own descriptors
//! (`chain`). Queue 0 is the hiprio queue (FORGET, INTERRUPT), the others
//! request queues; each queue has its own thread (vhost-user-backend's
//! epoll workers), and a direct I/O's reply is written by whichever thread
//! completes it. One front end at a time: the listening socket closes once
//! it connects, so a second is refused.

mod chain;

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use foliofs::Volume;
use fuser::{QueueSession, Served};
use parking_lot::Mutex;
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::Listener;
use vhost_user_backend::{VhostUserBackend, VhostUserDaemon, VringRwLock, VringT};
use virtio_bindings::bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::bindings::virtio_ring::{
    VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC,
};
use virtio_queue::QueueT;
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use crate::{FolioFs, MountOptions};

/// The most descriptors a queue may have: QEMU's `queue-size` (1,024 is
/// what virtiofsd documents) must not exceed it.
const MAX_QUEUE_SIZE: usize = 1024;

/// How `serve` ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The guest unmounted (FUSE_DESTROY) or disconnected.
    GuestLeft,
    /// [`Stopper::stop`] (SIGINT, SIGTERM).
    Stopped,
}

/// What `foliofs serve virtiofs` serves and where.
#[derive(Debug, Clone)]
pub struct VirtiofsOptions {
    /// The vhost-user socket QEMU's `-chardev socket,path=` names.
    pub socket: PathBuf,
    /// The tag offered through the device's configuration space, for front
    /// ends that ask the back end (QEMU's `vhost-user-fs-pci` has its own
    /// `tag=`).
    pub tag: Option<String>,
    /// Request queues served (each on its own thread), besides hiprio.
    pub request_queues: usize,
}

/// Ends a `serve` from another thread (a signal handler's).
#[derive(Clone, Default)]
pub struct Stopper {
    stopped: Arc<AtomicBool>,
    shutdown: Arc<Mutex<Option<vhost_user_backend::ShutdownHandle>>>,
}

impl Stopper {
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        if let Some(handle) = self.shutdown.lock().as_ref() {
            handle.shutdown();
        }
    }

    fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }
}

/// Binds the socket (an error names it when it is taken or cannot be
/// made), then serves one front end until the guest leaves or `stopper`
/// stops it. The caller closes the volume afterwards.
pub fn serve(
    volume: Arc<Volume>,
    mount_options: &MountOptions,
    options: &VirtiofsOptions,
    stopper: &Stopper,
) -> io::Result<Ended> {
    let listener = bind(&options.socket)?;
    let _remove_socket = RemoveOnDrop(options.socket.clone());
    crate::credentials::callers_are_in_a_guest();
    let fs = FolioFs::new(volume, mount_options);
    let backend = Arc::new(Backend {
        session: QueueSession::new(fs, fuser::SessionACL::All),
        memory: Mutex::new(GuestMemoryAtomic::new(GuestMemoryMmap::new())),
        event_idx: AtomicBool::new(false),
        queues: 1 + options.request_queues.max(1),
        tag: options.tag.clone(),
        guest_left: Arc::new(AtomicBool::new(false)),
        stopper: stopper.clone(),
    });
    let memory = GuestMemoryAtomic::new(GuestMemoryMmap::new());
    let mut daemon = VhostUserDaemon::new("foliofs-virtiofs".into(), Arc::clone(&backend), memory)
        .map_err(|error| io::Error::other(format!("starting the vhost-user back end: {error}")))?;
    if !wait_for_front_end(&listener, stopper)? {
        return Ok(Ended::Stopped);
    }
    let mut listener = Listener::from(listener);
    daemon
        .start(&mut listener)
        .map_err(|error| io::Error::other(format!("accepting the front end: {error}")))?;
    // Closed, so a second front end is refused while this one is served.
    drop(listener);
    tracing::info!("virtio-fs: a front end connected on {}", options.socket.display());
    *stopper.shutdown.lock() = daemon.shutdown_handle();
    if stopper.is_stopped() {
        daemon.request_shutdown();
    }
    let waited = daemon.wait();
    for handler in daemon.get_epoll_handlers() {
        handler.send_exit_event();
    }
    // Joins the queue threads; the session (and the adapter) go with the
    // back end's last reference.
    drop(daemon);
    drop(backend);
    if let Err(error) = waited {
        if !stopper.is_stopped() {
            return Err(io::Error::other(format!("serving the front end: {error}")));
        }
    }
    Ok(if stopper.is_stopped() { Ended::Stopped } else { Ended::GuestLeft })
}

fn bind(socket: &Path) -> io::Result<UnixListener> {
    let named =
        |error: io::Error| io::Error::new(error.kind(), format!("{}: {error}", socket.display()));
    if std::os::unix::net::UnixStream::connect(socket).is_ok() {
        return Err(named(io::Error::new(
            io::ErrorKind::AddrInUse,
            "another server is listening on this socket",
        )));
    }
    // A socket file no one listens on is a stale one from a server that died.
    if std::fs::symlink_metadata(socket)
        .is_ok_and(|meta| std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()))
    {
        std::fs::remove_file(socket).map_err(named)?;
    }
    UnixListener::bind(socket).map_err(named)
}

/// Waits until a front end connects (true) or `stopper` stops (false).
fn wait_for_front_end(listener: &UnixListener, stopper: &Stopper) -> io::Result<bool> {
    let mut poll = libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    while !stopper.is_stopped() {
        // SAFETY: one valid pollfd, for the call's duration.
        let ready = unsafe { libc::poll(&mut poll, 1, 100) };
        if ready > 0 {
            return Ok(true);
        }
        if ready < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(false)
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

struct Backend {
    session: QueueSession<FolioFs>,
    memory: Mutex<GuestMemoryAtomic<GuestMemoryMmap>>,
    event_idx: AtomicBool,
    queues: usize,
    tag: Option<String>,
    guest_left: Arc<AtomicBool>,
    stopper: Stopper,
}

/// virtio-fs's configuration space: the tag (36 bytes, NUL-padded) and the
/// number of request queues.
const TAG_BYTES: usize = 36;

impl Backend {
    /// Serves every request the guest made available on `vring`.
    fn serve_queue(&self, vring: &VringRwLock) -> io::Result<()> {
        let memory = self.memory.lock().memory();
        loop {
            if self.event_idx.load(Ordering::Relaxed) {
                vring.disable_notification().map_err(io::Error::other)?;
            }
            while let Some(chain) = next_chain(vring, &memory) {
                let head = chain.head_index();
                let mut readable = Vec::new();
                let mut writable = Vec::new();
                for descriptor in chain {
                    let buffer = (descriptor.addr(), descriptor.len());
                    if descriptor.is_write_only() {
                        writable.push(buffer);
                    } else {
                        readable.push(buffer);
                    }
                }
                let used = vring.clone();
                let complete = Box::new(move |written: u32| return_chain(&used, head, written));
                let served =
                    chain::serve(&self.session, memory.clone(), &readable, writable, complete);
                if served == Served::Destroyed {
                    // The guest unmounted: nothing more will come that
                    // the volume should take.
                    self.guest_left.store(true, Ordering::SeqCst);
                }
            }
            if !self.event_idx.load(Ordering::Relaxed)
                || !vring.enable_notification().map_err(io::Error::other)?
            {
                return Ok(());
            }
        }
    }
}

fn next_chain(
    vring: &VringRwLock,
    memory: &vm_memory::GuestMemoryLoadGuard<GuestMemoryMmap>,
) -> Option<virtio_queue::DescriptorChain<vm_memory::GuestMemoryLoadGuard<GuestMemoryMmap>>> {
    let mut state = vring.get_mut();
    state.get_queue_mut().pop_descriptor_chain(memory.clone())
}

/// Puts a served chain on the used ring and interrupts the guest if it
/// asked to be.
fn return_chain(vring: &VringRwLock, head: u16, written: u32) {
    if let Err(error) = vring.add_used(head, written) {
        tracing::warn!("virtio-fs: returning a request's buffers: {error}");
        return;
    }
    match vring.needs_notification() {
        Ok(false) => {}
        _ => {
            if let Err(error) = vring.signal_used_queue() {
                tracing::warn!("virtio-fs: interrupting the guest: {error}");
            }
        }
    }
}

impl VhostUserBackend for Backend {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        self.queues
    }

    fn max_queue_size(&self) -> usize {
        MAX_QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        (1 << VIRTIO_F_VERSION_1)
            | (1 << VIRTIO_RING_F_INDIRECT_DESC)
            | (1 << VIRTIO_RING_F_EVENT_IDX)
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        let mut features = VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS;
        if self.tag.is_some() {
            features |= VhostUserProtocolFeatures::CONFIG;
        }
        features
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let mut config = [0u8; TAG_BYTES + 4];
        if let Some(tag) = &self.tag {
            let bytes = tag.as_bytes();
            let length = bytes.len().min(TAG_BYTES);
            config[..length].copy_from_slice(&bytes[..length]);
        }
        let request_queues = (self.queues - 1) as u32;
        config[TAG_BYTES..].copy_from_slice(&request_queues.to_le_bytes());
        let start = (offset as usize).min(config.len());
        let end = start.saturating_add(size as usize).min(config.len());
        config[start..end].to_vec()
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Relaxed);
    }

    fn update_memory(&self, memory: GuestMemoryAtomic<GuestMemoryMmap>) -> io::Result<()> {
        *self.memory.lock() = memory;
        Ok(())
    }

    /// One thread per queue.
    fn queues_per_thread(&self) -> Vec<u64> {
        (0..self.queues).map(|queue| 1u64 << queue).collect()
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        new_event_consumer_and_notifier(EventFlag::NONBLOCK).ok()
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[VringRwLock],
        _thread_id: usize,
    ) -> io::Result<()> {
        if evset != EventSet::IN {
            return Err(io::Error::other(format!("unexpected events {evset:?}")));
        }
        let Some(vring) = vrings.get(usize::from(device_event)) else {
            return Err(io::Error::other(format!("an event for queue {device_event}")));
        };
        self.serve_queue(vring)?;
        if self.guest_left.load(Ordering::SeqCst) {
            // Ends `daemon.wait()`: the volume closes now, while QEMU
            // may keep the VM running.
            if let Some(handle) = self.stopper.shutdown.lock().as_ref() {
                handle.shutdown();
            }
        }
        Ok(())
    }
}
