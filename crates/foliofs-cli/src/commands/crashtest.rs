//! `foliofs crashtest`: seeded random workloads on the fault-injecting
//! in-memory device, crashed at every durability point and checked against
//! a model (the work is `foliofs_check::crashtest`; this parses and prints).

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use clap::Args;
use foliofs_check::crashtest::{run_one, CrashOptions, Stats};
use foliofs_check::workload::WorkloadConfig;

#[derive(Args)]
pub struct CrashtestArgs {
    /// First workload's seed (workload i uses seed + i); default: from the clock.
    #[arg(long)]
    seed: Option<u64>,
    /// Workloads per block size.
    #[arg(long, default_value_t = 20)]
    workloads: u64,
    /// Operations per thread in each workload.
    #[arg(long, default_value_t = 40)]
    ops: usize,
    /// Block sizes, comma separated (1024, 4096, 65536) or "all".
    #[arg(long, default_value = "4096")]
    block_size: String,
    /// Threads per workload, each in its own directory.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Random mixtures of kept, lost and torn volatile writes per crash point.
    #[arg(long, default_value_t = 2)]
    variants: usize,
    /// Run for this many seconds per block size instead of a fixed number of workloads.
    #[arg(long)]
    time: Option<u64>,
    /// Workloads checked at once.
    #[arg(long, default_value_t = 1)]
    jobs: usize,
    /// Report a failure without shrinking its op list.
    #[arg(long)]
    no_shrink: bool,
    /// Reach the in-memory device through the engine's NBD client and an
    /// in-process server that reorders requests as far as the protocol
    /// allows; crash images are cut from what the server carried out.
    #[arg(long)]
    over_nbd: bool,
    /// Volumes of format 3, their metadata in a paged index (blocks of
    /// 4 KiB or more; 1 KiB ones stay format 2).
    #[arg(long)]
    metadata_index: bool,
}

pub fn parse_block_sizes(list: &str) -> anyhow::Result<Vec<u32>> {
    if list == "all" {
        return Ok(vec![1024, 4096, 65536]);
    }
    list.split(',')
        .map(|item| {
            let bytes = foliofs::options::parse_size(item.trim())?;
            anyhow::ensure!(
                bytes.is_power_of_two() && (1024..=65536).contains(&bytes),
                "block size {item} is not a power of two from 1024 to 65536"
            );
            Ok(bytes as u32)
        })
        .collect()
}

pub fn seed_or_clock(seed: Option<u64>) -> u64 {
    seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |elapsed| elapsed.as_nanos() as u64 % 1_000_000_007)
    })
}

/// The `-o` list, checked, for the tools to apply over their quiet defaults.
pub fn tool_options(list: &str, block_sizes: &[u32]) -> anyhow::Result<&'static str> {
    let options = foliofs_check::options_with(list)?;
    if let Some(block_bytes) =
        block_sizes.iter().find(|&&block_bytes| options.folio_max_bytes < u64::from(block_bytes))
    {
        anyhow::bail!(
            "folio_max={} is smaller than the block size {block_bytes}",
            options.folio_max_bytes
        );
    }
    Ok(Box::leak(list.to_string().into_boxed_str()))
}

/// `-o` applies over the tool's defaults (no background committer or
/// flusher interval, a 64 MiB cache), e.g. `-o dirty=folio,fua=emulate`.
pub fn run(args: &CrashtestArgs, options: &str) -> anyhow::Result<ExitCode> {
    let block_sizes = parse_block_sizes(&args.block_size)?;
    let options_list = tool_options(options, &block_sizes)?;
    anyhow::ensure!(
        args.threads >= 1 && args.ops >= 1 && args.jobs >= 1,
        "threads, ops and jobs must be at least 1"
    );
    let seed = seed_or_clock(args.seed);
    let options = CrashOptions {
        variants: args.variants,
        shrink: !args.no_shrink,
        ..CrashOptions::default()
    };
    let started = Instant::now();
    let mut total = Stats::default();
    let mut failed = false;
    for block_bytes in block_sizes {
        println!(
            "crashtest: block size {block_bytes}, seed {seed}, {} threads x {} ops, {}{}",
            args.threads,
            args.ops,
            match args.time {
                Some(seconds) => format!("for {seconds} s"),
                None => format!("{} workloads", args.workloads),
            },
            if options_list.is_empty() { String::new() } else { format!(", -o {options_list}") }
        );
        let block_started = Instant::now();
        let deadline = args.time.map(|seconds| block_started + Duration::from_secs(seconds));
        let next = AtomicU64::new(0);
        let stop = AtomicBool::new(false);
        let stats = Mutex::new(Stats::default());
        let mut last_report = Instant::now();
        let report = Mutex::new(&mut last_report);
        std::thread::scope(|scope| {
            for _ in 0..args.jobs {
                scope.spawn(|| loop {
                    if stop.load(Ordering::Relaxed)
                        || deadline.is_some_and(|deadline| Instant::now() >= deadline)
                    {
                        return;
                    }
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    if deadline.is_none() && index >= args.workloads {
                        return;
                    }
                    let config = WorkloadConfig {
                        options: options_list,
                        over_nbd: args.over_nbd,
                        metadata_index: args.metadata_index && block_bytes >= 4096,
                        ..WorkloadConfig::new(
                            seed.wrapping_add(index),
                            block_bytes,
                            args.threads,
                            args.ops,
                        )
                    };
                    let mut own = Stats::default();
                    let result = run_one(config, &options, &mut own);
                    let mut stats = stats.lock().expect("stats");
                    stats.add(&own);
                    if let Err(failure) = result {
                        stop.store(true, Ordering::Relaxed);
                        println!("{failure}");
                        return;
                    }
                    let mut last = report.lock().expect("report");
                    if last.elapsed() >= Duration::from_secs(10) {
                        **last = Instant::now();
                        eprintln!("  {}", line(&stats, block_started.elapsed()));
                    }
                });
            }
        });
        let stats = stats.into_inner().expect("stats");
        println!("  block size {block_bytes}: {}", line(&stats, block_started.elapsed()));
        total.add(&stats);
        if stats.violations > 0 {
            failed = true;
            break;
        }
    }
    println!("crashtest total: {}", line(&total, started.elapsed()));
    Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

fn line(stats: &Stats, elapsed: Duration) -> String {
    let links = if stats.links_dropped > 0 {
        format!(", {} NBD links dropped", stats.links_dropped)
    } else {
        String::new()
    };
    format!(
        "{} workloads, {} ops, {} crash points explored, {} images checked, {} violations{links} \
         ({:.1} s)",
        stats.workloads,
        stats.ops,
        stats.crash_points,
        stats.images,
        stats.violations,
        elapsed.as_secs_f64()
    )
}
