//! The foliofs laboratory: fio job files and command lines parsed
//! (`jobfile`), run in-process against the engine (`runner`) or its limits
//! (`targets`: the raw device, memory), reported as fio does, in text or
//! fio's JSON shape (`report`); and the seed experiments (`seeds`) beside the
//! kernel's ext4 and XFS (`peers`) and on qemu-nbd (`nbd`), with tables, JSON
//! and charts (`chart`) that quote each seed's own posted figures (`posted`);
//! the metadata loops through the OS (`creates`, `tree`); and metadata at
//! scale, files by the million in children of its own (`scale`,
//! `scale_worker`).

pub mod chart;
pub mod cpu;
pub mod creates;
pub mod index;
pub mod jobfile;
pub mod latency;
pub mod nbd;
pub mod peers;
pub mod posted;
pub mod report;
pub mod results;
pub mod runner;
pub mod scale;
pub mod scale_worker;
pub mod seeds;
pub mod targets;
pub mod tree;
