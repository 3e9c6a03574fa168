//! fio job files and command lines: `[global]` and job sections of
//! `key=value` lines, or `--key=value` / `--key value` arguments where each
//! `--name` starts a job. Sizes as fio writes them (4k, 1M, 10G; binary),
//! times as 60s, 2m, 500ms (a plain number is seconds). Every option below
//! is understood; any other is an error that names it and lists these, so a
//! job never runs differently from what its file says.

use std::time::Duration;

use thiserror::Error;

/// The options understood, as fio spells them (aliases in `canonical`).
pub const SUPPORTED_OPTIONS: &[&str] = &[
    "name",
    "filename",
    "directory",
    "size",
    "bs",
    "rw",
    "rwmixread",
    "ioengine",
    "iodepth",
    "numjobs",
    "direct",
    "sync",
    "dsync",
    "fsync",
    "fdatasync",
    "end_fsync",
    "overwrite",
    "pre_read",
    "runtime",
    "time_based",
    "ramp_time",
    "group_reporting",
    "thread",
    "norandommap",
    "randrepeat",
    "fallocate",
    "allow_file_create",
    "invalidate",
    "verify",
    "do_verify",
];

#[derive(Debug, Error, PartialEq, Eq)]
pub enum JobError {
    #[error("{place}: unknown fio option {key:?}; supported: {}", SUPPORTED_OPTIONS.join(", "))]
    UnknownOption { place: String, key: String },
    #[error("{place}: {key}={value}: {why}")]
    BadValue { place: String, key: String, value: String, why: String },
    #[error("{place}: {why}")]
    Malformed { place: String, why: String },
    #[error("job {job:?}: {why}")]
    Contradiction { job: String, why: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    Read,
    Write,
    RandRead,
    RandWrite,
    /// Sequential, mixed reads and writes.
    ReadWrite,
    RandRw,
}

impl Pattern {
    pub fn random(self) -> bool {
        matches!(self, Self::RandRead | Self::RandWrite | Self::RandRw)
    }

    pub fn reads(self) -> bool {
        !matches!(self, Self::Write | Self::RandWrite)
    }

    pub fn writes(self) -> bool {
        !matches!(self, Self::Read | Self::RandRead)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoEngine {
    Psync,
    Sync,
    Pvsync2,
    Libaio,
    IoUring,
}

impl IoEngine {
    /// Engines that keep `iodepth` requests in flight (with direct=1).
    pub fn asynchronous(self) -> bool {
        matches!(self, Self::Libaio | Self::IoUring)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    None,
    /// O_SYNC; the engine treats it as O_DSYNC plus the timestamps.
    Sync,
    Dsync,
}

/// One job, with `[global]` and command-line defaults applied.
#[derive(Debug, Clone, PartialEq)]
pub struct JobSpec {
    pub name: String,
    pub filename: Option<String>,
    pub directory: Option<String>,
    pub size_bytes: u64,
    pub block_bytes: u64,
    pub pattern: Pattern,
    /// Percent of reads in mixed patterns.
    pub read_mix_percent: u32,
    pub ioengine: IoEngine,
    pub iodepth: u32,
    pub numjobs: u32,
    pub direct: bool,
    pub sync: SyncMode,
    /// fsync / fdatasync after this many writes (0: never).
    pub fsync_every: u64,
    pub fdatasync_every: u64,
    pub end_fsync: bool,
    pub overwrite: bool,
    pub pre_read: bool,
    pub runtime: Option<Duration>,
    pub time_based: bool,
    pub ramp_time: Duration,
    pub group_reporting: bool,
    pub norandommap: bool,
    pub randrepeat: bool,
    pub allow_file_create: bool,
    /// verify=crc32c: every block written carries a checksum checked on read.
    pub verify: bool,
    pub do_verify: bool,
    /// Settings that parse but do not act as written, said out loud when the
    /// job runs (fio accepts them the same way).
    pub notes: Vec<String>,
}

impl JobSpec {
    fn defaults(name: &str) -> Self {
        Self {
            name: name.to_string(),
            filename: None,
            directory: None,
            size_bytes: 0,
            block_bytes: 4096,
            pattern: Pattern::Read,
            read_mix_percent: 50,
            ioengine: IoEngine::Psync,
            iodepth: 1,
            numjobs: 1,
            direct: false,
            sync: SyncMode::None,
            fsync_every: 0,
            fdatasync_every: 0,
            end_fsync: false,
            overwrite: false,
            pre_read: false,
            runtime: None,
            time_based: false,
            ramp_time: Duration::ZERO,
            group_reporting: false,
            norandommap: false,
            randrepeat: true,
            allow_file_create: true,
            verify: false,
            do_verify: true,
            notes: Vec::new(),
        }
    }

    /// The file job instance `index` (of `numjobs`) works on: `filename`, or
    /// fio's `name.index.0`, inside `directory` when there is one (fio
    /// prefixes an explicit `filename` with it too).
    pub fn file_of(&self, index: u32) -> String {
        let file = match &self.filename {
            Some(filename) => filename.clone(),
            None => format!("{}.{index}.0", self.name),
        };
        match &self.directory {
            Some(directory) => {
                format!("{}/{}", directory.trim_end_matches('/'), file.trim_start_matches('/'))
            }
            None => file,
        }
    }

    fn check(&mut self) -> Result<(), JobError> {
        let contradiction = |why: &str| {
            Err(JobError::Contradiction { job: self.name.clone(), why: why.to_string() })
        };
        if self.size_bytes == 0 {
            return contradiction("no size given (size=)");
        }
        if self.block_bytes == 0 || self.block_bytes > self.size_bytes {
            return contradiction("bs must be non-zero and no larger than size");
        }
        if self.time_based && self.runtime.is_none() {
            return contradiction("time_based needs a runtime");
        }
        if self.iodepth > 1 && !(self.ioengine.asynchronous() && self.direct) {
            self.notes.push(format!(
                "iodepth={} has no effect: {} does one request at a time{}",
                self.iodepth,
                format!("{:?}", self.ioengine).to_lowercase(),
                if self.ioengine.asynchronous() { " without direct=1, as in fio" } else { "" }
            ));
            self.iodepth = 1;
        }
        if self.verify && !self.pattern.writes() && !self.overwrite {
            return contradiction("verify on a read-only job has nothing to check against");
        }
        if self.read_mix_percent > 100 {
            return contradiction("rwmixread is a percentage (0..100)");
        }
        Ok(())
    }
}

/// One `key=value` as written, with where it was written.
struct Setting {
    place: String,
    key: String,
    value: String,
}

/// A job's name and its own settings.
type Section = (String, Vec<Setting>);

/// Parses a job file.
pub fn parse_job_file(text: &str, file_name: &str) -> Result<Vec<JobSpec>, JobError> {
    let mut global: Vec<Setting> = Vec::new();
    let mut jobs: Vec<Section> = Vec::new();
    let mut in_global = false;
    for (index, raw) in text.lines().enumerate() {
        let place = format!("{file_name}:{}", index + 1);
        let line = raw.split(['#', ';']).next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        if let Some(section) = line.strip_prefix('[') {
            let Some(section) = section.strip_suffix(']') else {
                return Err(JobError::Malformed {
                    place,
                    why: format!("bad section header {line:?}"),
                });
            };
            let section = section.trim();
            if section.is_empty() {
                return Err(JobError::Malformed { place, why: "empty section name".into() });
            }
            in_global = section == "global";
            if !in_global {
                jobs.push((section.to_string(), Vec::new()));
            }
            continue;
        }
        let (key, value) = match line.split_once('=') {
            Some((key, value)) => (key.trim(), value.trim()),
            None => (line, ""),
        };
        let entry =
            Setting { place: place.clone(), key: key.to_string(), value: value.to_string() };
        if in_global {
            global.push(entry);
        } else if let Some((_, options)) = jobs.last_mut() {
            options.push(entry);
        } else {
            return Err(JobError::Malformed {
                place,
                why: "option outside any section (start with [global] or [jobname])".into(),
            });
        }
    }
    build(global, jobs, file_name)
}

/// Parses fio's command-line form: `--key=value`, `--key value` or `--flag`;
/// options before the first `--name` apply to every job.
pub fn parse_command_line<S: AsRef<str>>(arguments: &[S]) -> Result<Vec<JobSpec>, JobError> {
    let mut global = Vec::new();
    let mut jobs: Vec<Section> = Vec::new();
    let mut index = 0;
    while index < arguments.len() {
        let argument = arguments[index].as_ref();
        let place = format!("argument {}", index + 1);
        let Some(option) = argument.strip_prefix("--") else {
            return Err(JobError::Malformed {
                place,
                why: format!("{argument:?} is not an option (fio options start with --)"),
            });
        };
        let (key, value) = match option.split_once('=') {
            Some((key, value)) => (key.to_string(), value.to_string()),
            None => {
                // `--key value`, unless the next word is an option or the key a flag.
                let next = arguments.get(index + 1).map(AsRef::as_ref);
                match next {
                    Some(next) if !next.starts_with("--") && !is_flag(option) => {
                        index += 1;
                        (option.to_string(), next.to_string())
                    }
                    _ => (option.to_string(), String::new()),
                }
            }
        };
        index += 1;
        if canonical(&key) == "name" {
            jobs.push((value, Vec::new()));
            continue;
        }
        let entry = Setting { place, key, value };
        match jobs.last_mut() {
            Some((_, options)) => options.push(entry),
            None => global.push(entry),
        }
    }
    if jobs.is_empty() {
        return Err(JobError::Malformed {
            place: "command line".into(),
            why: "no job: give --name=NAME (and its options)".into(),
        });
    }
    build(global, jobs, "command line")
}

/// Options that take no value on the command line.
fn is_flag(key: &str) -> bool {
    matches!(
        canonical(key),
        "time_based"
            | "group_reporting"
            | "thread"
            | "norandommap"
            | "end_fsync"
            | "overwrite"
            | "pre_read"
            | "direct"
    )
}

fn canonical(key: &str) -> &str {
    match key {
        "readwrite" => "rw",
        "blocksize" => "bs",
        "filesize" => "size",
        "dir" => "directory",
        "rwmixwrite" => "rwmixwrite",
        other => other,
    }
}

fn build(global: Vec<Setting>, jobs: Vec<Section>, source: &str) -> Result<Vec<JobSpec>, JobError> {
    if jobs.is_empty() {
        return Err(JobError::Malformed { place: source.into(), why: "no job section".into() });
    }
    jobs.into_iter()
        .map(|(name, options)| {
            let mut job = JobSpec::defaults(&name);
            for setting in global.iter().chain(options.iter()) {
                apply(&mut job, &setting.place, &setting.key, &setting.value)?;
            }
            job.check()?;
            Ok(job)
        })
        .collect()
}

fn apply(job: &mut JobSpec, place: &str, key: &str, value: &str) -> Result<(), JobError> {
    let bad = |why: &str| JobError::BadValue {
        place: place.to_string(),
        key: key.to_string(),
        value: value.to_string(),
        why: why.to_string(),
    };
    match canonical(key) {
        "name" => job.name = value.to_string(),
        "filename" => job.filename = Some(value.to_string()),
        "directory" => job.directory = Some(value.to_string()),
        "size" => job.size_bytes = parse_size(value).map_err(|why| bad(&why))?,
        "bs" => {
            if value.contains(',') {
                return Err(bad(
                    "separate read,write block sizes are not supported; give one size",
                ));
            }
            job.block_bytes = parse_size(value).map_err(|why| bad(&why))?;
        }
        "rw" => {
            job.pattern = match value {
                "read" => Pattern::Read,
                "write" => Pattern::Write,
                "randread" => Pattern::RandRead,
                "randwrite" => Pattern::RandWrite,
                "readwrite" | "rw" => Pattern::ReadWrite,
                "randrw" => Pattern::RandRw,
                _ => {
                    return Err(bad(
                        "expected read, write, randread, randwrite, readwrite/rw or randrw",
                    ))
                }
            }
        }
        "rwmixread" => job.read_mix_percent = parse_number(value).map_err(|why| bad(&why))? as u32,
        "rwmixwrite" => {
            let writes = parse_number(value).map_err(|why| bad(&why))?;
            job.read_mix_percent =
                100u64.checked_sub(writes).ok_or_else(|| bad("a percentage"))? as u32;
        }
        "ioengine" => {
            job.ioengine = match value {
                "psync" => IoEngine::Psync,
                "sync" => IoEngine::Sync,
                "pvsync2" => IoEngine::Pvsync2,
                "libaio" => IoEngine::Libaio,
                "io_uring" => IoEngine::IoUring,
                _ => return Err(bad("supported engines: psync, sync, pvsync2, libaio, io_uring")),
            }
        }
        "iodepth" => {
            job.iodepth = parse_number(value).map_err(|why| bad(&why))? as u32;
            if job.iodepth == 0 || job.iodepth > 65536 {
                return Err(bad("must be between 1 and 65536"));
            }
        }
        "numjobs" => {
            job.numjobs = parse_number(value).map_err(|why| bad(&why))? as u32;
            if job.numjobs == 0 || job.numjobs > 4096 {
                return Err(bad("must be between 1 and 4096"));
            }
        }
        "direct" => job.direct = parse_bool(value).map_err(|why| bad(&why))?,
        "sync" => {
            job.sync = match value {
                "" | "1" | "sync" => SyncMode::Sync,
                "0" | "none" => SyncMode::None,
                "dsync" => SyncMode::Dsync,
                _ => return Err(bad("expected 0, 1, none, sync or dsync")),
            }
        }
        "dsync" => {
            if parse_bool(value).map_err(|why| bad(&why))? {
                job.sync = SyncMode::Dsync;
            }
        }
        "fsync" => job.fsync_every = parse_number(value).map_err(|why| bad(&why))?,
        "fdatasync" => job.fdatasync_every = parse_number(value).map_err(|why| bad(&why))?,
        "end_fsync" => job.end_fsync = parse_bool(value).map_err(|why| bad(&why))?,
        "overwrite" => job.overwrite = parse_bool(value).map_err(|why| bad(&why))?,
        "pre_read" => job.pre_read = parse_bool(value).map_err(|why| bad(&why))?,
        "runtime" => job.runtime = Some(parse_time(value).map_err(|why| bad(&why))?),
        "time_based" => job.time_based = parse_bool(value).map_err(|why| bad(&why))?,
        "ramp_time" => job.ramp_time = parse_time(value).map_err(|why| bad(&why))?,
        "group_reporting" => job.group_reporting = parse_bool(value).map_err(|why| bad(&why))?,
        // Jobs always run as threads in-process; fio's processes would not
        // share the engine.
        "thread" => {
            parse_bool(value).map_err(|why| bad(&why))?;
        }
        "norandommap" => job.norandommap = parse_bool(value).map_err(|why| bad(&why))?,
        "randrepeat" => job.randrepeat = parse_bool(value).map_err(|why| bad(&why))?,
        "fallocate" => match value {
            "none" | "0" => {}
            _ => {
                return Err(bad("only fallocate=none is supported (files are laid out by writing)"))
            }
        },
        "allow_file_create" => {
            job.allow_file_create = parse_bool(value).map_err(|why| bad(&why))?
        }
        // fio drops the kernel's page cache of the file before a job
        // (invalidate=1, its default); in-process there is no such cache to
        // drop, and the engine's is the one measured. Accepted so one
        // command line serves both.
        "invalidate" => {
            parse_bool(value).map_err(|why| bad(&why))?;
        }
        "verify" => match value {
            "crc32c" | "crc32c-intel" => job.verify = true,
            "0" | "none" => job.verify = false,
            _ => return Err(bad("only verify=crc32c is supported")),
        },
        "do_verify" => job.do_verify = parse_bool(value).map_err(|why| bad(&why))?,
        _ => {
            return Err(JobError::UnknownOption { place: place.to_string(), key: key.to_string() })
        }
    }
    Ok(())
}

fn parse_bool(value: &str) -> Result<bool, String> {
    match value {
        "" | "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err("expected 0 or 1".into()),
    }
}

fn parse_number(value: &str) -> Result<u64, String> {
    value.parse().map_err(|_| "expected a whole number".to_string())
}

/// fio sizes: a number with an optional k/m/g/t suffix (binary; `KiB` and
/// `KB` forms too, as fio's default kb_base=1024 reads them).
pub fn parse_size(value: &str) -> Result<u64, String> {
    let text = value.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, suffix) = text.split_at(split);
    let number: u64 = digits.parse().map_err(|_| format!("bad size {text:?}"))?;
    let suffix = suffix.to_ascii_lowercase();
    let shift = match suffix.trim_end_matches("ib").trim_end_matches('b') {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        _ => return Err(format!("bad size suffix in {text:?} (use k, M, G or T)")),
    };
    number.checked_mul(1u64 << shift).ok_or_else(|| format!("size {text:?} is too large"))
}

/// fio times: `60s`, `2m`, `500ms`, `10us`, `1h`, or a plain number of seconds.
pub fn parse_time(value: &str) -> Result<Duration, String> {
    let text = value.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let number: u64 = digits.parse().map_err(|_| format!("bad time {text:?}"))?;
    Ok(match unit {
        "" | "s" => Duration::from_secs(number),
        "ms" => Duration::from_millis(number),
        "us" => Duration::from_micros(number),
        "m" => Duration::from_secs(number * 60),
        "h" => Duration::from_secs(number * 3600),
        _ => return Err(format!("bad time unit in {text:?} (use us, ms, s, m or h)")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seed 001's job file, as posted.
    const SEED_001_JOB: &str = "[global]
ioengine=psync
rw=randwrite
overwrite=1
pre_read=1
direct=0
bs=4k
size=1G
dir=./
numjobs=8
fdatasync=1
runtime=60
iodepth=64
group_reporting=1
[fio-run]
";

    fn words(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn seed_000_command_line() {
        let jobs = parse_command_line(&words(
            "--name=test --ioengine=libaio --direct=1 --group_reporting --overwrite=1 --thread \
             --size=10G --filename=/mnt/fio --readwrite=write --ramp_time=10s --runtime=60s \
             --numjobs=8 --blocksize=2k --iodepth=256 --allow_file_create=0",
        ))
        .unwrap();
        let job = &jobs[0];
        assert_eq!(job.name, "test");
        assert_eq!(
            (job.size_bytes, job.block_bytes, job.iodepth, job.numjobs),
            (10 << 30, 2048, 256, 8)
        );
        assert_eq!(
            (job.pattern, job.ioengine, job.direct),
            (Pattern::Write, IoEngine::Libaio, true)
        );
        assert_eq!(job.ramp_time, Duration::from_secs(10));
        assert!(!job.allow_file_create && job.overwrite && job.group_reporting);
        assert_eq!(job.file_of(3), "/mnt/fio");
        // fio puts an explicit filename inside directory= too.
        let words = ["--name=d", "--size=1M", "--directory=/mnt/run/", "--filename=/f"];
        let jobs = parse_command_line(&words).unwrap();
        assert_eq!(jobs[0].file_of(0), "/mnt/run/f");
    }

    #[test]
    fn seed_002_command_line_with_spaces_and_globals() {
        let jobs = parse_command_line(&words(
            "--ioengine libaio --size=2G --direct=1 --iodepth=64 --time_based=1 --thread=1 \
             --overwrite=1 --runtime=100 --name=seed --rw=randwrite --bs=16k",
        ))
        .unwrap();
        let job = &jobs[0];
        assert_eq!((job.ioengine, job.size_bytes, job.iodepth), (IoEngine::Libaio, 2 << 30, 64));
        assert!(job.time_based);
        assert_eq!(job.runtime, Some(Duration::from_secs(100)));
        assert_eq!((job.pattern, job.block_bytes), (Pattern::RandWrite, 16384));
    }

    #[test]
    fn seed_003_sync_writes() {
        let jobs = parse_command_line(&words(
            "--name=fua --ioengine=libaio --direct=1 --sync=1 --bs=4k --iodepth=16 --numjobs=1 \
             --rw=randwrite --size=1G --runtime=10 --time_based",
        ))
        .unwrap();
        assert_eq!(jobs[0].sync, SyncMode::Sync);
    }

    #[test]
    fn seed_001_job_file() {
        let jobs = parse_job_file(SEED_001_JOB, "test_randwrite.fio").unwrap();
        let job = &jobs[0];
        assert_eq!(job.name, "fio-run");
        assert_eq!((job.pattern, job.numjobs, job.fdatasync_every), (Pattern::RandWrite, 8, 1));
        assert!(job.overwrite && job.pre_read && !job.direct && job.group_reporting);
        assert_eq!(job.runtime, Some(Duration::from_secs(60)));
        assert_eq!(job.file_of(2), "./fio-run.2.0");
        // psync with iodepth=64 is what the seed ran: fio does one request at
        // a time there; the job says so rather than pretending.
        assert_eq!(job.iodepth, 1);
        assert!(job.notes[0].contains("iodepth=64 has no effect: psync"), "{:?}", job.notes);
    }

    #[test]
    fn sections_inherit_global_and_override_it() {
        let text = "; comment\n[global]\nbs=64k\nsize=1M\n\n[a]\nrw=read\n[b]\nbs=4k # inline\nrw=randrw\nrwmixread=70\n";
        let jobs = parse_job_file(text, "j.fio").unwrap();
        assert_eq!(jobs.len(), 2);
        assert_eq!((jobs[0].name.as_str(), jobs[0].block_bytes), ("a", 65536));
        assert_eq!(
            (jobs[1].block_bytes, jobs[1].pattern, jobs[1].read_mix_percent),
            (4096, Pattern::RandRw, 70)
        );
    }

    #[test]
    fn bad_input_names_what_is_wrong() {
        let cases = [
            ("[a]\nsize=12Q\n", "bad size suffix"),
            ("[a]\nsize=1M\nrw=sideways\n", "expected read, write"),
            ("[a]\nsize=1M\nioengine=posixaio\n", "supported engines"),
            ("[a]\nsize=1M\ntime_based\n", "time_based needs a runtime"),
            ("[a]\nrw=read\n", "no size given"),
            ("[a]\nsize=1M\nbs=2M\n", "no larger than size"),
            ("size=1M\n", "outside any section"),
            ("[a\nsize=1M\n", "bad section header"),
            ("[a]\nsize=1M\nruntime=5x\n", "bad time unit"),
            ("[a]\nsize=1M\nfallocate=native\n", "only fallocate=none"),
            ("[a]\nsize=1M\nverify=md5\n", "only verify=crc32c"),
            ("[a]\nsize=1M\nbs=4k,8k\n", "one size"),
        ];
        for (text, expected) in cases {
            let error = parse_job_file(text, "j.fio").unwrap_err().to_string();
            assert!(error.contains(expected), "{text:?}: {error}");
        }
        let error = parse_command_line(&words("--rw=read --size=1M")).unwrap_err().to_string();
        assert!(error.contains("no job"), "{error}");
        let error = parse_command_line(&words("--name=x --size=1M --stonewall")).unwrap_err();
        assert_eq!(
            error,
            JobError::UnknownOption { place: "argument 3".into(), key: "stonewall".into() }
        );
        assert!(error.to_string().contains("supported: name, filename, directory"), "{error}");
    }

    #[test]
    fn sizes_and_times() {
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("10G"), Ok(10 << 30));
        assert_eq!(parse_size("2KiB"), Ok(2048));
        assert!(parse_size("k").is_err());
        assert!(parse_size("99999999999999T").is_err());
        assert_eq!(parse_time("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_time("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_time("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_time("100"), Ok(Duration::from_secs(100)));
    }
}
