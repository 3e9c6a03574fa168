//! `bench metadata`'s loop through the operating system: each of N threads
//! creates files in a directory of its own, writes each, fsyncs it (unless
//! told not to) and closes it, as the in-process loop does with the
//! library's calls. The same loop runs on the kernel's ext4 and XFS and on
//! foliofs through its mount, so the three are measured with one workload.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::latency::Latencies;

/// What every job does.
#[derive(Debug, Clone, Copy)]
pub struct CreateLoop {
    pub jobs: u64,
    pub files_per_job: u64,
    pub file_bytes: usize,
    /// fsync each file before closing it.
    pub fsync: bool,
}

impl CreateLoop {
    pub fn files(&self) -> u64 {
        self.jobs * self.files_per_job
    }

    /// A kernel peer's backing file: room for the data twice over and for
    /// a block of metadata per file, and at least what mkfs.xfs accepts
    /// (300 MiB).
    pub fn peer_bytes(&self) -> u64 {
        let data_bytes = self.files() * self.file_bytes as u64;
        (2 * data_bytes + self.files() * 4096 + (256 << 20)).max(512 << 20)
    }

    /// Inodes a peer needs: the files, the jobs' directories, and spare.
    pub fn peer_inodes(&self) -> u64 {
        self.files() + self.jobs + 1024
    }
}

/// One run of the loop.
pub struct CreateRun {
    /// Each file's create + write (+ fsync) + close.
    pub latencies: Latencies,
    /// From the first job's start to the last one's end.
    pub elapsed: Duration,
}

impl CreateRun {
    /// Files per second, all jobs together.
    pub fn rate(&self) -> f64 {
        self.latencies.count() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Runs `work` in `base` (an existing directory of a mounted file system):
/// job `j` creates `base/job{j}` and its files `f0`, `f1`, ... in it.
pub fn run_on_path(base: &Path, work: &CreateLoop) -> anyhow::Result<CreateRun> {
    let data = vec![0xABu8; work.file_bytes];
    let started = Instant::now();
    let results: Vec<anyhow::Result<Latencies>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..work.jobs)
            .map(|job| {
                let dir = base.join(format!("job{job}"));
                let data = &data;
                scope.spawn(move || create_files(&dir, work.files_per_job, data, work.fsync))
            })
            .collect();
        workers
            .into_iter()
            .map(|worker| {
                worker.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a create job panicked")))
            })
            .collect()
    });
    let elapsed = started.elapsed();
    let mut latencies = Latencies::new();
    for result in results {
        latencies.merge(&result?);
    }
    Ok(CreateRun { latencies, elapsed })
}

fn create_files(dir: &PathBuf, files: u64, data: &[u8], fsync: bool) -> anyhow::Result<Latencies> {
    std::fs::create_dir(dir).with_context(|| format!("mkdir {}", dir.display()))?;
    let mut latencies = Latencies::new();
    for index in 0..files {
        let path = dir.join(format!("f{index}"));
        let started = Instant::now();
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .with_context(|| format!("create {}", path.display()))?;
        file.write_all(data).with_context(|| format!("write {}", path.display()))?;
        if fsync {
            file.sync_all().with_context(|| format!("fsync {}", path.display()))?;
        }
        drop(file);
        latencies.record(started.elapsed());
    }
    Ok(latencies)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_job_creates_its_files_in_its_own_directory() {
        let dir = tempfile::tempdir().unwrap();
        let work = CreateLoop { jobs: 2, files_per_job: 3, file_bytes: 1000, fsync: true };
        let run = run_on_path(dir.path(), &work).unwrap();
        assert_eq!(run.latencies.count(), 6);
        assert!(run.rate() > 0.0);
        for job in 0..2 {
            let job_dir = dir.path().join(format!("job{job}"));
            let mut names: Vec<String> = std::fs::read_dir(&job_dir)
                .unwrap()
                .map(|entry| entry.unwrap().file_name().into_string().unwrap())
                .collect();
            names.sort();
            assert_eq!(names, ["f0", "f1", "f2"]);
            for name in &names {
                let contents = std::fs::read(job_dir.join(name)).unwrap();
                assert_eq!(contents, vec![0xAB; 1000]);
            }
        }
        // A second run in the same place finds the directories taken and
        // says where.
        let error = run_on_path(dir.path(), &work).err().expect("the directories exist");
        assert!(format!("{error:#}").contains("mkdir "), "{error:#}");
    }

    #[test]
    fn a_peer_has_room_for_the_files_and_what_xfs_needs() {
        let small = CreateLoop { jobs: 1, files_per_job: 10, file_bytes: 1024, fsync: false };
        assert_eq!(small.peer_bytes(), 512 << 20);
        let large = CreateLoop { jobs: 2, files_per_job: 100_000, file_bytes: 4096, fsync: false };
        assert!(large.peer_bytes() >= 2 * 200_000 * 4096 + 200_000 * 4096);
        assert_eq!(large.peer_inodes(), 200_000 + 2 + 1024);
    }
}
