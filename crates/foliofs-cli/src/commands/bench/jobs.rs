//! `foliofs bench JOBFILE` / `foliofs bench --name=... --rw=...`: fio jobs
//! run in-process against the engine on a temporary image, reported as fio
//! reports them (text, or fio's JSON shape with `--output-format json`).

use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use foliofs::{Volume, VolumeOptions};
use foliofs_bench::jobfile::{self, JobSpec};
use foliofs_bench::{report, runner};

use super::image::{BenchImage, ImageArgs};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Normal,
    Json,
}

#[derive(Args)]
pub struct JobArgs {
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
    let specs = parse(&args.job)?;
    let data_bytes: u64 = specs
        .iter()
        .map(|spec| {
            let files = if spec.filename.is_some() { 1 } else { u64::from(spec.numjobs) };
            spec.size_bytes * files
        })
        .sum();
    let image_bytes = data_bytes + data_bytes / 8 + (256 << 20);
    let image = BenchImage::create(&args.image, image_bytes, options)?;
    let volume = Volume::open(image.path(), options)?;
    let report = runner::run(&volume, &specs)?;
    volume.close()?;
    match args.output_format {
        OutputFormat::Normal => print!("{}", report::to_text(&report)),
        OutputFormat::Json => {
            println!("{}", serde_json::to_string_pretty(&report::to_json(&report, options_text))?)
        }
    }
    Ok(ExitCode::SUCCESS)
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
             (--output-format, --image, ...) before the job file",
            &job[1..]
        );
    }
    let text = std::fs::read_to_string(first).with_context(|| format!("read job file {first}"))?;
    Ok(jobfile::parse_job_file(&text, first)?)
}
