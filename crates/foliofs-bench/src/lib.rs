//! The foliofs laboratory: fio job files and command lines parsed
//! (`jobfile`), run in-process against the engine (`runner`), reported as
//! fio does, in text or fio's JSON shape (`report`).

pub mod jobfile;
pub mod latency;
pub mod report;
pub mod runner;
