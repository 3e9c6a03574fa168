//! `foliofs bench JOBFILE` / `foliofs bench --name=... --rw=...`: fio jobs
//! run in-process on a temporary image, reported as fio reports them (text,
//! or fio's JSON shape with `--output-format json`): against the engine, or
//! against its limits with `--target raw` (the same requests straight on the
//! image, no file system) and `--target memory` (plain copies); or against
//! files of any mounted file system with `--target files` (a foliofs mount,
//! ext4), through the OS as fio would, where fio is not installed.

use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use foliofs::dev::{DevStats, Device};
use foliofs::vfs::CacheStats;
use foliofs::{Volume, VolumeOptions};
use foliofs_bench::jobfile::{self, JobSpec};
use foliofs_bench::runner::Target;
use foliofs_bench::{report, runner, targets};
use indicatif::{ProgressBar, ProgressStyle};

use super::image::{BenchImage, ImageArgs};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Normal,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TargetKind {
    /// The engine: files of a fresh volume on the image.
    Engine,
    /// The image itself, no file system: the engine's limit for direct I/O.
    Raw,
    /// Memory: plain copies, the limit for cached I/O.
    Memory,
    /// Files on a mounted file system, in the job's directory= (else the
    /// current directory), reached through the OS as fio reaches them: the
    /// same jobs through a foliofs mount or on ext4 where fio is missing.
    Files,
}

#[derive(Args)]
pub struct JobArgs {
    /// What the jobs run against.
    #[arg(long, value_enum, default_value = "engine")]
    target: TargetKind,
    /// normal (fio's human output) or json (fio's JSON shape).
    #[arg(long, value_enum, default_value = "normal")]
    output_format: OutputFormat,
    #[command(flatten)]
    image: ImageArgs,
    /// A fio job file, or fio options on the command line (--name=NAME starts
    /// a job; options before it apply to all).
    #[arg(
        value_name = "JOBFILE | --OPTION=VALUE...",
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    job: Vec<String>,
}

pub fn run(
    args: &JobArgs,
    options: &VolumeOptions,
    options_text: &str,
) -> anyhow::Result<ExitCode> {
    let (output_format, job) = take_output_format(&args.job)?;
    let output_format = output_format.unwrap_or(args.output_format);
    let specs = parse(&job)?;
    let data_bytes: u64 = specs
        .iter()
        .map(|spec| {
            let files = if spec.filename.is_some() { 1 } else { u64::from(spec.numjobs) };
            spec.size_bytes * files
        })
        .sum();
    let image_bytes = data_bytes + data_bytes / 8 + (256 << 20);
    let progress = Progress::start(&specs);
    let mut pacing = None;
    let report = match args.target {
        TargetKind::Engine => {
            let image = BenchImage::create(&args.image, image_bytes, options)?;
            let volume = Volume::open(image.path(), options)?;
            let report = runner::run(&volume, &specs)?;
            pacing = pacing_line(&volume.cache_stats());
            volume.close()?;
            report
        }
        TargetKind::Raw => {
            if args.image.named() {
                bail!(
                    "--target raw writes over the whole image; it runs only on a temporary image"
                );
            }
            let image = BenchImage::create(&args.image, image_bytes, options)?;
            let device = Arc::new(Device::open(image.path(), &options.dev_options())?);
            let targets = per_instance(&specs, |spec| {
                targets::raw_regions(&device, spec)
                    .into_iter()
                    .map(|region| Box::new(region) as Box<dyn Target>)
                    .collect()
            });
            runner::run_targets(&specs, targets, &|| device.stats())?
        }
        TargetKind::Memory => {
            let targets = per_instance(&specs, |spec| {
                targets::memory_regions(spec)
                    .into_iter()
                    .map(|region| Box::new(region) as Box<dyn Target>)
                    .collect()
            });
            runner::run_targets(&specs, targets, &DevStats::default)?
        }
        TargetKind::Files => {
            if args.image.named() {
                bail!("--target files runs on the job's files (directory=, filename=), not on an image");
            }
            let mut targets = Vec::new();
            for (spec_index, spec) in specs.iter().enumerate() {
                let regions = targets::file_regions(spec, &options.dev_options())
                    .with_context(|| format!("job {:?}", spec.name))?;
                targets.extend(regions.into_iter().enumerate().map(|(index, region)| {
                    (spec_index, index as u32, Box::new(region) as Box<dyn Target>)
                }));
            }
            // What reaches the file system's own device is not visible from
            // here: no device counters.
            runner::run_targets(&specs, targets, &DevStats::default)?
        }
    };
    drop(progress);
    match output_format {
        OutputFormat::Normal => {
            print!("{}", report::to_text(&report));
            if let Some(pacing) = pacing {
                println!("{pacing}");
            }
        }
        OutputFormat::Json => {
            println!("{}", serde_json::to_string_pretty(&report::to_json(&report, options_text))?)
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What dirty throttling did while the engine ran (ramp included), when it
/// measured writeback at all.
fn pacing_line(cache: &CacheStats) -> Option<String> {
    let bandwidth = cache.write_bandwidth_bytes_per_s?;
    Some(format!(
        "Cache: writeback measured at {} MiB/s; buffered writers paced {} times, {} ms in all",
        bandwidth >> 20,
        cache.throttle_pauses,
        cache.throttle_pause_ns_total / 1_000_000
    ))
}

/// A progress bar on a terminal (indicatif draws nothing otherwise): the
/// planned time when every job is time based, else a spinner.
struct Progress {
    bar: ProgressBar,
    ticker: Option<std::thread::JoinHandle<()>>,
    done: Arc<AtomicBool>,
}

impl Progress {
    fn start(specs: &[JobSpec]) -> Self {
        let planned = specs
            .iter()
            .map(|spec| spec.time_based.then(|| spec.ramp_time + spec.runtime.unwrap_or_default()))
            .collect::<Option<Vec<_>>>()
            .and_then(|times| times.into_iter().max());
        let bar = match planned {
            Some(planned) => {
                let bar = ProgressBar::new(planned.as_millis() as u64);
                bar.set_style(
                    ProgressStyle::with_template("{bar:40} {elapsed}/{msg}")
                        .expect("valid template"),
                );
                bar.set_message(format!("{:.0?}", planned));
                bar
            }
            None => ProgressBar::new_spinner(),
        };
        let done = Arc::new(AtomicBool::new(false));
        let ticker = {
            let (bar, done) = (bar.clone(), Arc::clone(&done));
            let started = Instant::now();
            std::thread::Builder::new()
                .name("bench-progress".into())
                .spawn(move || {
                    while !done.load(Ordering::Relaxed) {
                        bar.set_position(started.elapsed().as_millis() as u64);
                        bar.tick();
                        std::thread::sleep(Duration::from_millis(200));
                    }
                })
                .ok()
        };
        Self { bar, ticker, done }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
        if let Some(ticker) = self.ticker.take() {
            let _ = ticker.join();
        }
        self.bar.finish_and_clear();
    }
}

/// Every instance of every job with its target, as `run_targets` takes them.
fn per_instance(
    specs: &[JobSpec],
    targets_of: impl Fn(&JobSpec) -> Vec<Box<dyn Target>>,
) -> Vec<(usize, u32, Box<dyn Target>)> {
    specs
        .iter()
        .enumerate()
        .flat_map(|(spec_index, spec)| {
            targets_of(spec)
                .into_iter()
                .enumerate()
                .map(move |(index, target)| (spec_index, index as u32, target))
        })
        .collect()
}

/// Takes `--output-format` out of the job arguments: fio accepts its own
/// options anywhere among the job options and after the job file, so
/// `foliofs bench --name=t --rw=read --output-format=json` must work too.
/// Returns the last format given there (as fio, the last one wins).
fn take_output_format(job: &[String]) -> anyhow::Result<(Option<OutputFormat>, Vec<String>)> {
    const OPTION: &str = "--output-format";
    let mut format = None;
    let mut rest = Vec::with_capacity(job.len());
    let mut arguments = job.iter();
    while let Some(argument) = arguments.next() {
        let value = match argument.strip_prefix(OPTION) {
            Some("") => match arguments.next() {
                Some(value) => value.as_str(),
                None => bail!("{OPTION} needs a value: normal or json"),
            },
            Some(value) => match value.strip_prefix('=') {
                Some(value) => value,
                None => {
                    rest.push(argument.clone());
                    continue;
                }
            },
            None => {
                rest.push(argument.clone());
                continue;
            }
        };
        let parsed = OutputFormat::from_str(value, true)
            .map_err(|_| anyhow::anyhow!("{OPTION}={value:?}: expected normal or json"))?;
        format = Some(parsed);
    }
    Ok((format, rest))
}

fn parse(job: &[String]) -> anyhow::Result<Vec<JobSpec>> {
    let Some(first) = job.first() else {
        bail!("give a fio job file or fio options (e.g. --name=test --rw=randread --size=1G)");
    };
    if first.starts_with("--") {
        return Ok(jobfile::parse_command_line(job)?);
    }
    if job.len() > 1 {
        bail!(
            "unexpected {:?} after the job file {first:?}: put foliofs bench options \
             (--image, --target, ...) before the job file",
            &job[1..]
        );
    }
    let text = std::fs::read_to_string(first).with_context(|| format!("read job file {first}"))?;
    Ok(jobfile::parse_job_file(&text, first)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(arguments: &[&str]) -> Vec<String> {
        arguments.iter().map(|argument| (*argument).to_owned()).collect()
    }

    #[test]
    fn output_format_is_taken_from_anywhere_among_the_job_options() {
        for (arguments, format, rest) in [
            (
                &["--name=t", "--output-format=json", "--rw=read"][..],
                Some(OutputFormat::Json),
                &["--name=t", "--rw=read"][..],
            ),
            (
                &["--name=t", "--rw=read", "--output-format", "json"],
                Some(OutputFormat::Json),
                &["--name=t", "--rw=read"],
            ),
            (&["job.fio", "--output-format=normal"], Some(OutputFormat::Normal), &["job.fio"]),
            (&["--name=t", "--output-format-x=1"], None, &["--name=t", "--output-format-x=1"]),
        ] {
            let (taken, left) = take_output_format(&strings(arguments)).unwrap();
            assert_eq!(taken, format, "{arguments:?}");
            assert_eq!(left, strings(rest), "{arguments:?}");
        }
        let error = take_output_format(&strings(&["--output-format=xml"])).unwrap_err();
        assert!(error.to_string().contains("expected normal or json"), "{error}");
        let error = take_output_format(&strings(&["--name=t", "--output-format"])).unwrap_err();
        assert!(error.to_string().contains("needs a value"), "{error}");
    }
}
